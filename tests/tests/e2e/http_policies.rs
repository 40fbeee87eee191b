//! WebAssembly policies behind the HTTP side: line protocol and remote write go through the
//! same ingest policies as SDK writes (refused points reported as a partial write, the rest
//! stored), `/v1/query` runs a query policy pushed down to the owners, and `/metrics` counts
//! every policy's calls. Needs the guest components (`guest/build.sh`).

use timeshard_formats::remote_write::{self, Label, Sample, TimeSeries, WriteRequest};
use timeshard_policy::Kind;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::http_client::{HttpClient, encode};
use timeshard_testkit::policies::PolicySection;

use crate::NODE;

const TOKEN: &str = "policy-token-0123456789abcdef";
const T: i64 = 1_700_000_000; // seconds
const SEC: i64 = 1_000_000_000;

/// The value of the sample of `name` whose labels include every one of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        labels.iter().all(|want| set.split(',').any(|have| have == *want)).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_writes_pass_ingest_policies_and_query_policies_answer_over_http() -> anyhow::Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(3, NODE);
    options.classes =
        vec![timeshard_node::config::ClassConfig { name: "all".into(), rf: 3, w: 2, r: 2, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    let mut section = PolicySection::new(dir.path(), &crate::guest_dir())?;
    section.module("pmu-validate", "pmu-validate", Kind::Ingest, &[("min", "-60"), ("max", "60")])?;
    section.module("rms", "rms", Kind::Query, &[])?;
    section.bind("pmu", Some("pmu-validate"), &["rms"]);
    options.policy = section.config()?;
    let cluster = LocalCluster::start_converged(options).await?;
    let mut writer = HttpClient::connect(cluster.http_addr(0).unwrap(), Some(TOKEN)).await?;
    let mut reader = HttpClient::connect(cluster.http_addr(1).unwrap(), Some(TOKEN)).await?;

    // Line protocol: one minute at 1 Hz, two values outside [-60, 60].
    let value = |i: i64| if i == 10 || i == 40 { 99.0 } else { (i % 7) as f64 - 3.0 };
    let body: String = (0..60).map(|i| format!("pmu.phase,bus=1,site=atl value={} {}\n", value(i), T + i)).collect();
    let a = writer.post("/write?precision=s", body).await?;
    assert_eq!(a.status, 400, "{}", a.text());
    let err = a.json()?["error"].as_str().unwrap().to_string();
    assert!(err.starts_with("partial write: point 99@") && err.ends_with("dropped=2"), "{err}");
    assert!(err.contains("refused by an ingest policy") && err.contains("outside"), "{err}");
    assert!(!err.contains("line 0"), "refusals of points carry no line number: {err}");

    // The same policy behind remote write.
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![
                Label { name: "__name__".into(), value: "pmu_freq".into() },
                Label { name: "bus".into(), value: "1".into() },
            ],
            samples: vec![Sample { value: 50.0, timestamp: T * 1000 }, Sample { value: 1e6, timestamp: T * 1000 + 1 }],
        }],
    };
    let a = writer.post("/api/v1/write", remote_write::encode(&req)).await?;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("refused by an ingest policy") && a.text().contains("dropped=1"), "{}", a.text());

    // Exactly the valid points were stored, through either protocol.
    let series = encode("pmu.phase{bus=1,site=atl}");
    let a = reader.get(&format!("/v1/read?series={series}&start={}&end={}", T * SEC, (T + 60) * SEC)).await?;
    let points = a.read_points()?;
    let kept: Vec<i64> = (0..60).filter(|&i| value(i).abs() <= 60.0).collect();
    assert_eq!(points.len(), kept.len(), "{}", a.text());
    assert!(points.iter().all(|p| p["value"].as_f64().unwrap().abs() <= 60.0), "{}", a.text());
    let a = reader.get(&format!("/v1/read?series={}&start=0&end={}", encode("pmu_freq{bus=1}"), (T + 1) * SEC)).await?;
    assert_eq!(a.read_points()?, [serde_json::json!({"ts": T * SEC, "value": 50.0, "event": 0})]);

    // RMS pushed down to the owners equals RMS of the stored points.
    let a =
        reader.get(&format!("/v1/query?series={series}&policy=rms&start={}&end={}", T * SEC, (T + 60) * SEC)).await?;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json()?;
    let expected = (kept.iter().map(|&i| value(i) * value(i)).sum::<f64>() / kept.len() as f64).sqrt();
    assert_eq!((v["policy"].as_str(), v["version"].as_str()), (Some("rms"), Some("1.0.0")), "{v}");
    assert_eq!(v["values"]["count"], kept.len() as f64, "{v}");
    assert!((v["values"]["rms"].as_f64().unwrap() - expected).abs() < 1e-9, "{v} vs {expected}");
    // A policy that is not installed is a clear 400.
    let a = reader.get(&format!("/v1/query?series={series}&policy=median&start=0&end={}", T * SEC)).await?;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("median"), "{}", a.text());

    // /metrics counts the calls of each policy on the node that ran them.
    let text = writer.get("/metrics").await?.text();
    let labels = ["policy=\"pmu-validate\"", "version=\"1.0.0\"", "kind=\"ingest\""];
    assert!(sample(&text, "timeshard_policy_calls_total", &labels).is_some_and(|n| n >= 2.0), "{text}");
    assert_eq!(sample(&text, "timeshard_policy_traps_total", &labels), Some(0.0), "{text}");
    assert_eq!(sample(&text, "timeshard_policy_timeouts_total", &labels), Some(0.0), "{text}");
    assert!(sample(&text, "timeshard_policy_call_seconds_total", &labels).is_some_and(|s| s > 0.0), "{text}");
    let mut rms_calls = 0.0;
    for i in 0..3 {
        let mut c = HttpClient::connect(cluster.http_addr(i).unwrap(), Some(TOKEN)).await?;
        let text = c.get("/metrics").await?.text();
        rms_calls +=
            sample(&text, "timeshard_policy_calls_total", &["policy=\"rms\"", "kind=\"query\""]).unwrap_or(0.0);
    }
    assert!(rms_calls >= 1.0, "the owners ran rms");

    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

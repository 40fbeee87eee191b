//! WebAssembly policies on a cluster of node processes: an ingest policy runs on the node that
//! receives a write, before replication; query policies run on the owners of each quantum and
//! their partial results are merged. Needs the guest components (`guest/build.sh`).

use timeshard_policy::{Kind, signing};
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Point, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};
use timeshard_testkit::policies::{PolicySection, TEST_DEADLINE_MS};

use crate::NODE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_query_policies_run_across_the_cluster() -> anyhow::Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(4, NODE);
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules)?;
    let mut section = PolicySection::new(&modules, &crate::guest_dir())?;
    section.module("pmu-validate", "pmu-validate", Kind::Ingest, &[("min", "-60"), ("max", "60")])?;
    let rms = section.module("rms", "rms", Kind::Query, &[])?;
    section.module("threshold-crossings", "threshold-crossings", Kind::Query, &[])?;
    // A module whose signature does not match its bytes: refused, the rest still load.
    let tampered = modules.join("tampered.wasm");
    std::fs::copy(&rms, &tampered)?;
    std::fs::copy(signing::signature_path(&rms), signing::signature_path(&tampered))?;
    let mut bytes = std::fs::read(&tampered)?;
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&tampered, bytes)?;
    section.load("tampered", Kind::Query, &tampered, &[], Some(TEST_DEADLINE_MS));
    section.bind("pmu.", Some("pmu-validate"), &["rms", "threshold-crossings"]);
    options.policy = section.config()?;
    let cluster = LocalCluster::start_converged(options).await?;
    let log = std::fs::read_to_string(cluster.log(0))?;
    assert!(log.contains("tampered") && log.contains("not loaded"), "the tampered module is reported:\n{log}");

    // Two minutes of PMU data with a few bad values sprinkled in.
    let series = datasets::pmu_series(3);
    let mut points: Vec<Point> = datasets::pmu(3).take(7_200).collect();
    for i in [10, 700, 3_000] {
        points[i].value = f64::NAN;
    }
    points[5_000].value = f64::INFINITY;
    points[6_000].value = 99.0; // outside [-60, 60]
    let writer = cluster.client(0).await?;
    let ack = writer.write(&series, &points).await?;
    assert_eq!(ack.rejected, 5);
    assert_eq!(ack.points, 7_195);
    assert!(ack.rejections.iter().any(|r| r.reason.contains("NaN")), "{:?}", ack.rejections);
    assert!(ack.rejections.iter().any(|r| r.reason.contains("outside")), "{:?}", ack.rejections);

    let good: Vec<Point> = points.iter().copied().filter(|p| p.value.is_finite() && p.value.abs() <= 60.0).collect();
    let reader = cluster.client(2).await?;
    let range = TimeRange::new(T0 + 5_000_000_000, T0 + 100_000_000_000)?;
    let stored = reader.read(&series, range).await?;
    let expected: Vec<Point> = good.iter().copied().filter(|p| range.contains(p.ts)).collect();
    assert_eq!(stored, expected, "exactly the valid points were stored");

    // RMS pushed down to the owners equals RMS over the stored points.
    let out = reader.query(&series, range, "rms", &[]).await?;
    let value = |name: &str| out.values.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let local = (expected.iter().map(|p| p.value * p.value).sum::<f64>() / expected.len() as f64).sqrt();
    assert_eq!(value("count"), Some(expected.len() as f64));
    let rms_value = value("rms").expect("an rms value");
    assert!((rms_value - local).abs() < 1e-9 * local, "rms {rms_value} vs {local}");
    assert_eq!((out.policy.as_str(), out.version.as_str()), ("rms", "1.0.0"));

    // Crossings of 25.0, including those between quanta, match a scan of the stored points.
    let out = reader.query(&series, range, "threshold-crossings", &[("threshold", "25")]).await?;
    let local: Vec<i64> =
        expected.windows(2).filter(|w| (w[0].value >= 25.0) != (w[1].value >= 25.0)).map(|w| w[1].ts).collect();
    let found: Vec<i64> = out.points.iter().map(|p| p.ts).collect();
    assert!(!local.is_empty());
    assert_eq!(found, local);

    // Refusals are typed: a policy that is not installed, and a missing parameter.
    let err = reader.query(&series, range, "tampered", &[]).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Policy), "{err}");
    let err = reader.query(&series, range, "threshold-crossings", &[]).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Policy), "{err}");
    assert!(err.to_string().contains("threshold"), "{err}");
    // Series without a binding get no ingest policy: a NaN is stored as sent.
    let other = "lab.temp{room=1}".parse()?;
    let ack = writer.write(&other, &[Point::new(T0, f64::NAN)]).await?;
    assert_eq!((ack.points, ack.rejected), (1, 0));

    assert_eq!(cluster.shutdown().await?, 4);
    Ok(())
}

/// An ingest policy that loops forever is stopped at its deadline: its writer gets a typed
/// refusal, and the node keeps answering everyone else meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_policy_is_stopped_while_the_node_keeps_serving() -> anyhow::Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes =
        vec![timeshard_node::config::ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    // The section's deadline (no module of its own): the one the loop must be stopped at.
    let mut section = PolicySection::new(dir.path(), &crate::guest_dir())?;
    let looping = section.sign("hostile-loop", "spin", Kind::Ingest)?;
    section.setting("deadline_ms = 50").load("spin", Kind::Ingest, &looping, &[], None).bind(
        "hostile.",
        Some("spin"),
        &[],
    );
    options.policy = section.config()?;
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    let hostile = "hostile.loop".parse()?;
    let calm = "calm.series".parse()?;

    let stuck = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut errors = Vec::new();
            for i in 0..10 {
                errors.push(client.write(&hostile, &[Point::new(T0 + i, 1.0)]).await.unwrap_err());
            }
            errors
        })
    };
    // Meanwhile the node answers writes and reads of other series.
    for i in 0..100 {
        let p = Point::new(T0 + i, i as f64);
        client.write(&calm, &[p]).await?;
        assert_eq!(client.read(&calm, TimeRange::new(p.ts, p.ts + 1)?).await?, vec![p]);
    }
    for e in stuck.await? {
        assert_eq!(e.code(), Some(ErrorCode::Rejected), "{e}");
        assert!(e.to_string().contains("deadline"), "{e}");
    }
    let range = TimeRange::new(T0, T0 + 100)?;
    let err = client.read(&"hostile.loop".parse()?, range).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownSeries), "nothing of the refused batches was stored: {err}");
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

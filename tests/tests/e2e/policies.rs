//! WebAssembly policies on a cluster of node processes: an ingest policy runs on the node that
//! receives a write, before replication; query policies run on the owners of each quantum and
//! their partial results are merged. Needs the guest components (`guest/build.sh`).

use std::path::{Path, PathBuf};

use timeshard_policy::{Kind, PolicyRef, signing};
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Point, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

/// Copies built guest `name` into `dir` and signs it with `key` as `name@1.0.0` of `kind`.
fn signed_guest(dir: &Path, key: &Path, name: &str, kind: Kind) -> PathBuf {
    signed_guest_as(dir, key, name, name, kind)
}

/// Copies built guest `guest` into `dir` and signs it with `key` as `name@1.0.0` of `kind`.
fn signed_guest_as(dir: &Path, key: &Path, guest: &str, name: &str, kind: Kind) -> PathBuf {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest");
    let built = timeshard_policy::guest_artifact(&guests, guest).expect("guest built by guest/build.sh");
    let copy = dir.join(built.file_name().unwrap());
    std::fs::copy(&built, &copy).unwrap();
    let identity = signing::Identity::new(PolicyRef::new(name, "1.0.0").unwrap(), kind);
    signing::sign_file(key, &copy, &identity).unwrap();
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_query_policies_run_across_the_cluster() -> anyhow::Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(4, NODE);
    let key_file = dir.path().join("policy.key");
    let key = signing::generate_keypair()?;
    key.write(&key_file)?;
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules)?;
    let validate = signed_guest(&modules, &key_file, "pmu-validate", Kind::Ingest);
    let rms = signed_guest(&modules, &key_file, "rms", Kind::Query);
    let crossings = signed_guest(&modules, &key_file, "threshold-crossings", Kind::Query);
    // A module whose signature does not match its bytes: refused, the rest still load.
    let tampered = modules.join("tampered.wasm");
    std::fs::copy(&rms, &tampered)?;
    std::fs::copy(signing::signature_path(&rms), signing::signature_path(&tampered))?;
    let mut bytes = std::fs::read(&tampered)?;
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&tampered, bytes)?;

    options.policy = toml::from_str(&format!(
        r#"
        trusted_keys = ["{public}"]

        [[modules]]
        name = "pmu-validate"
        version = "1.0.0"
        kind = "ingest"
        wasm = "{validate}"
        config = {{ min = "-60", max = "60" }}

        [[modules]]
        name = "rms"
        version = "1.0.0"
        kind = "query"
        wasm = "{rms}"

        [[modules]]
        name = "threshold-crossings"
        version = "1.0.0"
        kind = "query"
        wasm = "{crossings}"

        [[modules]]
        name = "tampered"
        version = "1.0.0"
        kind = "query"
        wasm = "{tampered}"

        [[bindings]]
        select = {{ metric_prefix = "pmu." }}
        ingest = "pmu-validate"
        query = ["rms", "threshold-crossings"]
        "#,
        public = key.public().to_text().trim(),
        validate = validate.display(),
        rms = rms.display(),
        crossings = crossings.display(),
        tampered = tampered.display(),
    ))?;
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
    let key_file = dir.path().join("policy.key");
    let key = signing::generate_keypair()?;
    key.write(&key_file)?;
    let looping = signed_guest_as(dir.path(), &key_file, "hostile-loop", "spin", Kind::Ingest);
    options.policy = toml::from_str(&format!(
        r#"
        trusted_keys = ["{}"]
        deadline_ms = 50
        [[modules]]
        name = "spin"
        version = "1.0.0"
        kind = "ingest"
        wasm = "{}"
        [[bindings]]
        select = {{ metric_prefix = "hostile." }}
        ingest = "spin"
        "#,
        key.public().to_text().trim(),
        looping.display()
    ))?;
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

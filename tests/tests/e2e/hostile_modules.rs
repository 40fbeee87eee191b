//! Damaged policy modules on a node process: a component cut in half, one with bytes flipped,
//! made-up bytes and an empty file, each correctly signed (so the node gets past the signature
//! to the bytes). The node starts, logs each module it could not load by name, answers queries
//! of those with a typed policy error, runs the good module beside them, and never panics.
//! Needs the guest components (`guest/build.sh`).

use anyhow::{Result, ensure};
use timeshard_node::config::ClassConfig;
use timeshard_policy::Kind;
use timeshard_proto::TimeRange;
use timeshard_proto::wire::ErrorCode;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};
use timeshard_testkit::policies::{PolicySection, TEST_DEADLINE_MS};

use crate::NODE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_modules_are_refused_by_name_and_the_good_one_runs() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules)?;
    let mut section = PolicySection::new(&modules, &crate::guest_dir())?;
    let rms = section.module("rms", "rms", Kind::Query, &[])?;
    let good = std::fs::read(&rms)?;
    let mut flipped = good.clone();
    for at in (good.len() / 8..good.len()).step_by(good.len() / 8) {
        flipped[at] ^= 0x5a;
    }
    let made_up: Vec<u8> =
        b"\0asm\x0d\0\x01\0".iter().copied().chain((0..4096u32).map(|i| (i * 7919 % 251) as u8)).collect();
    let damaged: [(&str, Vec<u8>); 4] =
        [("cut", good[..good.len() / 2].to_vec()), ("flipped", flipped), ("made-up", made_up), ("empty", Vec::new())];
    for (name, bytes) in &damaged {
        let path = section.sign_bytes(bytes, name, Kind::Query)?;
        section.load(name, Kind::Query, &path, &[], Some(TEST_DEADLINE_MS));
    }
    let names: Vec<&str> = damaged.iter().map(|(n, _)| *n).collect();
    // Bindings naming a module that is not installed are refused whole (no series would get
    // its policies): the damaged ones stay unbound.
    section.bind("pmu.", None, &["rms"]);
    options.policy = section.config()?;
    let cluster = LocalCluster::start_converged(options).await?;

    let log = std::fs::read_to_string(cluster.log(0))?;
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("policy not loaded")).collect();
    for name in ["cut", "made-up", "empty"] {
        // Named, with what was wrong with its bytes.
        ensure!(
            refused.iter().any(|l| l.contains(&format!("{name}@1.0.0 is not a valid WebAssembly component"))),
            "{name} is reported as not loaded:\n{log}"
        );
    }

    let series = datasets::pmu_series(1);
    let points: Vec<_> = datasets::pmu(1).take(600).collect();
    let client = cluster.client(0).await?;
    client.write(&series, &points).await?;
    let range = TimeRange::new(T0, T0 + 3_600_000_000_000)?;
    let out = client.query(&series, range, "rms", &[]).await?;
    let count = out.values.iter().find(|(n, _)| n == "count").map(|(_, v)| *v);
    ensure!(count == Some(600.0), "the good module runs beside the damaged ones: {:?}", out.values);
    for name in &names {
        let loaded = !refused.iter().any(|l| l.contains(name));
        match client.query(&series, range, name, &[]).await {
            // A flip that leaves a valid component may load and run (or fail as it runs).
            Ok(_) => ensure!(loaded, "{name} was reported not loaded, yet it ran"),
            Err(e) => ensure!(e.code() == Some(ErrorCode::Policy), "{name}: {e}"),
        }
    }
    ensure!(client.read(&series, range).await? == points, "the node keeps serving");
    let log = std::fs::read_to_string(cluster.log(0))?;
    ensure!(!log.contains("panicked"), "the node panicked:\n{log}");
    println!(
        "{} of {} damaged modules refused at start, by name; the good one runs",
        names.iter().filter(|n| refused.iter().any(|l| l.contains(*n))).count(),
        names.len()
    );
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

//! Graceful leave: 6 node processes at RF 3, W 2, R 2 hold fixed historical data and take live
//! timestamps through node 0. `timeshard node leave --config` makes node 4 leave: it hands
//! every block off, exits cleanly, and afterwards every block is on exactly its owners among
//! the 5 nodes left and every acknowledged point reads back, point by point. Nobody else may
//! make a node leave.

use std::time::{Duration, Instant};

use timeshard_node::NodeConfig;
use timeshard_node::config::ClassConfig;
use timeshard_proto::wire::ErrorCode;
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::ledger::{self, Ledger, LiveWriter};

use crate::NODE;

const NODES: usize = 6;
const LEAVER: usize = 4;

fn classes() -> Vec<ClassConfig> {
    vec![ClassConfig { name: "all".into(), quantum: Duration::from_secs(2), ..ClassConfig::default() }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_node_hands_every_block_off_before_it_exits() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    options.classes = classes();
    let class_table = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    let mut cluster = LocalCluster::start_converged(options).await?;

    let mut history = Ledger::default();
    let client = cluster.client(0).await?;
    for bus in 0..6 {
        let points: Vec<_> = datasets::pmu_points(bus, 0, 3_000).collect();
        client.write_batch(vec![SeriesPoints { series: datasets::pmu_series(bus), points: points.clone() }]).await?;
        history.ack(&datasets::pmu_series(bus), &points);
    }
    // Nobody but the node itself may make it leave: not a client, not another node.
    let refused = cluster.client(LEAVER).await?.leave().await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Forbidden), "{refused}");
    client.close().await;
    let writer = LiveWriter::start(cluster.client(0).await?, "grid.freq", 4);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = cluster.status(LEAVER).await?;
    println!("node {LEAVER} holds data; its WAL is {} bytes", held.wal_bytes);

    let started = Instant::now();
    let out = tokio::process::Command::new(NODE)
        .args(["node", "leave", "--config"])
        .arg(cluster.config(LEAVER))
        .arg("--node")
        .arg(cluster.addr(LEAVER).to_string())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), out).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "leave failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("left the cluster"), "{stdout}");
    let exit = cluster.wait_exit(LEAVER, Duration::from_secs(30)).await?;
    assert!(exit.success(), "the node exited with {exit}");
    println!("node {LEAVER} left and exited {:.1} s after the leave began", started.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (live, ok, failed) = writer.stop().await?;
    println!("live batches ok {ok}, failed {failed}");

    let placement = loop {
        let p = ledger::placement(&cluster, &class_table).await?;
        if p.is_exact() {
            break p;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "not settled after the leave: {}", p.summary());
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!("{} blocks on exactly their owners among the {} nodes left", placement.blocks, NODES - 1);
    let mut acked = history;
    acked.merge(live);
    for reader in [0, 2] {
        let client = cluster.client(reader).await?;
        let read = acked.missing_through(&client).await?;
        client.close().await;
        assert_eq!(read.missing, 0, "through node {reader}: {read:?}");
        println!("all {} acknowledged points read back through node {reader}", read.checked);
    }
    assert_eq!(cluster.shutdown().await?, NODES - 1);
    Ok(())
}

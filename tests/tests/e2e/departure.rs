//! Departure: 6 node processes at RF 3, W 2, R 2 (`gone_after` 8 s) hold fixed historical data
//! and take live timestamps through node 0. Node 3 is killed for good. Once the others see it
//! gone, the next closest nodes own its blocks and pull them: within `gone_after` plus the
//! catch-up delay plus the transfer, every block is on exactly its 3 owners among the 5 nodes
//! left (RF restored), and every acknowledged point reads back, point by point. When it comes
//! back on its old data directory, handoff and anti-entropy put every block on exactly its
//! owners among all 6 again.

use std::time::{Duration, Instant};

use timeshard_node::NodeConfig;
use timeshard_node::config::ClassConfig;
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::ledger::{self, Ledger, LiveWriter};

use crate::NODE;

const NODES: usize = 6;
const DEPARTED: usize = 3;
const GONE_AFTER: Duration = Duration::from_secs(8);
/// Beyond `gone_after`: the catch-up delay (3 s), a round, and the transfer.
const TRANSFER_WITHIN: Duration = Duration::from_secs(30);

fn classes() -> Vec<ClassConfig> {
    vec![ClassConfig { name: "all".into(), quantum: Duration::from_secs(2), ..ClassConfig::default() }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rf_is_restored_after_a_node_is_gone_for_good() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    options.classes = classes();
    options.membership.gone_after = GONE_AFTER;
    let class_table = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    let mut cluster = LocalCluster::start_converged(options).await?;

    let mut history = Ledger::default();
    let client = cluster.client(0).await?;
    for bus in 0..6 {
        let points: Vec<_> = datasets::pmu_points(bus, 0, 3_000).collect();
        client.write_batch(vec![SeriesPoints { series: datasets::pmu_series(bus), points: points.clone() }]).await?;
        history.ack(&datasets::pmu_series(bus), &points);
    }
    client.close().await;
    let writer = LiveWriter::start(cluster.client(0).await?, "grid.freq", 4);
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.kill(DEPARTED).await?;
    let killed = Instant::now();
    println!("killed node {DEPARTED} for good");

    // Every acknowledged point stays readable while the others notice and restore RF.
    let mut checked = 0;
    while killed.elapsed() < GONE_AFTER + Duration::from_secs(4) {
        let mut acked = history.clone();
        acked.merge(writer.snapshot());
        let client = cluster.client(1).await?;
        let read = acked.missing_through(&client).await?;
        client.close().await;
        assert_eq!(read.missing, 0, "{:?} after the kill: {read:?}", killed.elapsed());
        checked += read.checked;
    }
    let (live, ok, failed) = writer.stop().await?;
    println!("{checked} point checks while node {DEPARTED} went away, none missing; live ok {ok}, failed {failed}");

    let placement = loop {
        let p = ledger::placement(&cluster, &class_table).await?;
        if p.is_exact() {
            break p;
        }
        assert!(
            killed.elapsed() < GONE_AFTER + TRANSFER_WITHIN,
            "RF not restored {:?} after the kill: {}",
            killed.elapsed(),
            p.summary()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let (mut fetched, mut repairs) = (0, 0);
    for i in (0..NODES).filter(|&i| i != DEPARTED) {
        let s = cluster.status(i).await?.repair;
        fetched += s.bytes_fetched;
        repairs += s.read_repairs_sent;
    }
    println!(
        "RF restored {:.1} s after the kill ({GONE_AFTER:?} to be gone): {} blocks on exactly 3 owners; {fetched} \
         bytes fetched by anti-entropy (the rest came by read repair: {} sent)",
        killed.elapsed().as_secs_f64(),
        placement.blocks,
        repairs
    );
    assert!(fetched + repairs > 0);
    let mut acked = history;
    acked.merge(live);
    for reader in [0, 5] {
        let client = cluster.client(reader).await?;
        let read = acked.missing_through(&client).await?;
        client.close().await;
        assert_eq!(read.missing, 0, "through node {reader}: {read:?}");
        println!("all {} acknowledged points read back through node {reader}", read.checked);
    }

    // It comes back on its old data directory: handoff and anti-entropy reconcile, and every
    // block is on exactly its owners among all 6 again.
    cluster.restart(DEPARTED).await?;
    let back = Instant::now();
    let placement = loop {
        let p = ledger::placement(&cluster, &class_table).await?;
        if p.is_exact() {
            break p;
        }
        assert!(back.elapsed() < Duration::from_secs(60), "not reconciled after the return: {}", p.summary());
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!(
        "node {DEPARTED} came back: {} blocks on exactly their owners among {NODES} after {:.1} s",
        placement.blocks,
        back.elapsed().as_secs_f64()
    );
    let client = cluster.client(DEPARTED).await?;
    let read = acked.missing_through(&client).await?;
    client.close().await;
    assert_eq!(read.missing, 0, "through node {DEPARTED}: {read:?}");
    assert_eq!(cluster.shutdown().await?, NODES);
    Ok(())
}

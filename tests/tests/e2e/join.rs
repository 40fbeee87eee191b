//! Rebalancing on join: 5 node processes at RF 3, W 2, R 2 hold fixed historical data (PMU,
//! 2023) and take live timestamps (near now) through node 0 while 5 more nodes join. Every
//! acknowledged point reads back at R = 2, point by point, through new and old nodes, while
//! the data moves and afterwards; once the cluster has settled, every block is on exactly its
//! RF owners, with equal digests.

use std::time::{Duration, Instant};

use timeshard_node::NodeConfig;
use timeshard_node::config::ClassConfig;
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::ledger::{self, Ledger, LiveWriter};

use crate::NODE;

const FIRST: usize = 5;
const JOINING: usize = 5;
const BUSES: u32 = 8;
/// 60 Hz samples per bus: 100 s, 50 blocks of 2 s each.
const SAMPLES: usize = 6_000;
/// How long after the joins the cluster must hold every block on exactly its owners.
const SETTLE_WITHIN: Duration = Duration::from_secs(90);

fn classes() -> Vec<ClassConfig> {
    let class = |name: &str, prefix: &str| ClassConfig {
        name: name.into(),
        metric_prefix: prefix.into(),
        quantum: Duration::from_secs(2),
        ..ClassConfig::default()
    };
    vec![class("pmu", "pmu."), class("grid", "grid.")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_point_stays_readable_while_five_nodes_join_five() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(FIRST, NODE);
    options.classes = classes();
    let class_table = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    let mut cluster = LocalCluster::start_converged(options).await?;

    // Historical data, acknowledged before the joins.
    let mut history = Ledger::default();
    let client = cluster.client(0).await?;
    for first in (0..SAMPLES).step_by(1_500) {
        let batch: Vec<SeriesPoints> = (0..BUSES)
            .map(|b| SeriesPoints {
                series: datasets::pmu_series(b),
                points: datasets::pmu_points(b, first as u64, 1_500).collect(),
            })
            .collect();
        client.write_batch(batch.clone()).await?;
        for b in &batch {
            history.ack(&b.series, &b.points);
        }
    }
    client.close().await;
    let writer = LiveWriter::start(cluster.client(0).await?, "grid.freq", 6);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let joined = Instant::now();
    let new = cluster.add_nodes(JOINING).await?;
    println!("{} nodes joined {} holding {} historical points", new.len(), FIRST, history.points());

    // While the data moves: every acknowledged point, through a new node and an old one.
    let mut checks = 0;
    let mut checked = 0;
    while joined.elapsed() < Duration::from_secs(20) {
        let mut acked = history.clone();
        acked.merge(writer.snapshot());
        for reader in [new[checks % new.len()], checks % FIRST] {
            let client = cluster.client(reader).await?;
            let read = acked.missing_through(&client).await?;
            client.close().await;
            assert_eq!(
                read.missing,
                0,
                "{} s after the joins, {} of {} acknowledged points missing through node {reader}: {:?}",
                joined.elapsed().as_secs(),
                read.missing,
                read.checked,
                read.examples
            );
            checked += read.checked;
        }
        checks += 1;
    }
    let (live, ok, failed) = writer.stop().await?;
    println!(
        "during rebalancing: {checks} rounds of reads, {checked} points checked, none missing; live batches ok {ok}, \
         failed {failed}"
    );
    assert!(ok > 0, "no live write succeeded");

    // The cluster settles: every node caught up, every block on exactly its owners.
    let placement = loop {
        let mut settled = true;
        for i in 0..cluster.len() {
            let s = cluster.status(i).await?;
            settled &= s.repair.settled && s.repair.handoff_pending == 0;
        }
        let placement = ledger::placement(&cluster, &class_table).await?;
        if settled && placement.is_exact() {
            break placement;
        }
        assert!(
            joined.elapsed() < SETTLE_WITHIN,
            "not settled {SETTLE_WITHIN:?} after the joins: {}",
            placement.summary()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!(
        "{} blocks on exactly their owners {:.1} s after the joins",
        placement.blocks,
        joined.elapsed().as_secs_f64()
    );

    // Afterwards: every acknowledged point through every new node and two old ones.
    let mut acked = history;
    acked.merge(live);
    for reader in new.iter().copied().chain([0, 3]) {
        let client = cluster.client(reader).await?;
        let read = acked.missing_through(&client).await?;
        client.close().await;
        assert_eq!(read.missing, 0, "through node {reader}: {read:?}");
        println!("all {} acknowledged points read back through node {reader}", read.checked);
    }
    let mut moved = 0;
    for i in 0..cluster.len() {
        let s = cluster.status(i).await?;
        moved += s.repair.blocks_fetched + s.repair.handoff_blocks_pushed;
    }
    println!("blocks fetched or pushed by repair: {moved}");
    assert!(moved > 0);
    assert_eq!(cluster.shutdown().await?, FIRST + JOINING, "every node exits cleanly");
    Ok(())
}

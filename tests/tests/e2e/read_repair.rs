//! Read repair: 6 node processes at RF 3, W 2, R 3, with hints turned off (every hint is
//! dropped) and anti-entropy rounds too rare to matter. Node 5 is cut off from node 0 while
//! fixed historical data and live timestamps are written through node 0, so node 5 misses
//! every write to the blocks it owns. Reading everything back through node 1 (which asks all
//! three owners) returns every acknowledged point, and writes what node 5 lacked back to it:
//! afterwards node 5 holds every acknowledged point of its blocks, point by point.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use timeshard_node::NodeConfig;
use timeshard_node::config::ClassConfig;
use timeshard_proto::placement::{owners, placement_id};
use timeshard_proto::{Point, PointKey, Quantum, QuantumLen, SeriesKey};
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::inspect::Inspector;
use timeshard_testkit::ledger::{Ledger, LiveWriter};

use crate::NODE;

const NODES: usize = 6;
const STALE: usize = 5;
const QUANTUM: Duration = Duration::from_secs(2);

fn classes() -> Vec<ClassConfig> {
    vec![ClassConfig { name: "all".into(), quantum: QUANTUM, r: 3, ..ClassConfig::default() }]
}

/// Acknowledged points of `ledger` in blocks that `node` owns, by block.
fn owned_by(
    cluster: &LocalCluster,
    node: usize,
    ledger: &BTreeMap<SeriesKey, Vec<Point>>,
) -> anyhow::Result<BTreeMap<(SeriesKey, Quantum), Vec<Point>>> {
    let classes = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    let len = QuantumLen::new(QUANTUM.as_nanos() as i64)?;
    let members = cluster.contacts();
    let mut out: BTreeMap<(SeriesKey, Quantum), Vec<Point>> = BTreeMap::new();
    for (series, points) in ledger {
        for p in points {
            let q = len.quantum_of(p.ts);
            if owners(&members, &placement_id(series, &q, &classes), 3).iter().any(|c| c.id == cluster.id(node)) {
                out.entry((series.clone(), q)).or_default().push(*p);
            }
        }
    }
    Ok(out)
}

/// Acknowledged points node `node` lacks of the blocks it owns.
async fn lacking(
    cluster: &LocalCluster,
    node: usize,
    blocks: &BTreeMap<(SeriesKey, Quantum), Vec<Point>>,
) -> anyhow::Result<usize> {
    let mut inspector = Inspector::new(cluster).await?;
    let mut missing = 0;
    for ((series, q), points) in blocks {
        let held: HashSet<PointKey> =
            inspector.block(cluster.addr(node), series, *q).await?.iter().map(Point::key).collect();
        missing += points.iter().filter(|p| !held.contains(&p.key())).count();
    }
    inspector.close().await;
    Ok(missing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_write_back_what_a_replica_missed() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    options.classes = classes();
    options.fault_injection = true;
    options.hints.max_bytes = 1;
    options.repair.anti_entropy_interval = Duration::from_secs(3600);
    let cluster = LocalCluster::start_converged(options).await?;
    cluster.wait_settled(Duration::from_secs(30)).await?;

    cluster.partition(&[&[0], &[STALE]])?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writer = LiveWriter::start(cluster.client(0).await?, "grid.freq", 4);
    let mut ledger = Ledger::default();
    let client = cluster.client(0).await?;
    for bus in 0..6 {
        let points: Vec<Point> = datasets::pmu_points(bus, 0, 2_400).collect();
        client.write_batch(vec![SeriesPoints { series: datasets::pmu_series(bus), points: points.clone() }]).await?;
        ledger.ack(&datasets::pmu_series(bus), &points);
    }
    client.close().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (live, ok, _) = writer.stop().await?;
    assert!(ok > 0);
    ledger.merge(live);
    cluster.heal()?;
    let dropped = cluster.status(0).await?.hints_dropped;
    assert!(dropped > 0, "node 0 kept its hints for node {STALE}");

    // Node 5 owns some of what was written, and has none of it.
    let blocks = owned_by(&cluster, STALE, ledger.acked())?;
    let owned: usize = blocks.values().map(Vec::len).sum();
    let before = lacking(&cluster, STALE, &blocks).await?;
    println!("node {STALE} owns {} blocks ({owned} points) and lacks {before} points of them", blocks.len());
    assert!(before > 0 && before == owned, "node {STALE} was not cut off from the writes");

    let client = cluster.client(1).await?;
    let read = ledger.missing_through(&client).await?;
    client.close().await;
    assert_eq!(read.missing, 0, "{read:?}");
    println!("all {} acknowledged points read back through node 1 at R = 3", read.checked);

    // The read wrote back what node 5 lacked.
    let started = Instant::now();
    loop {
        let left = lacking(&cluster, STALE, &blocks).await?;
        if left == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "node {STALE} still lacks {left} points");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let status = cluster.status(1).await?;
    println!(
        "node {STALE} holds all {owned} points {:?} after the read; read repairs sent {}, dropped {}",
        started.elapsed(),
        status.repair.read_repairs_sent,
        status.repair.read_repairs_dropped
    );
    assert!(status.repair.read_repairs_sent > 0);
    assert_eq!(cluster.status(STALE).await?.repair.blocks_fetched, 0, "anti-entropy did not run");
    assert_eq!(cluster.shutdown().await?, NODES);
    Ok(())
}

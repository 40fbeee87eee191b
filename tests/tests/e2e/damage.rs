//! Anti-entropy after damage below a node: 5 node processes at RF 3 hold fixed historical data
//! and live timestamps. Node 2 is stopped, and on its data directory (with the store engine
//! itself, below the node) a tenth of its blocks are deleted and a thirteenth lose half their
//! points. Restarted, node 2 restores every block from its peers (every owner holds every block
//! again, with equal digests), and the bytes it fetched are close to the size of the damaged
//! blocks, far from the size of its store. Every acknowledged point reads back through it.
//! And a block a read found damaged (a flipped bit) is dropped and fetched again.

use std::time::{Duration, Instant};

use timeshard_clock::now_ns;
use timeshard_node::NodeConfig;
use timeshard_node::config::ClassConfig;
use timeshard_proto::Point;
use timeshard_proto::wire::{self, BlockPoints};
use timeshard_sdk::SeriesPoints;
use timeshard_store::{DiskConfig, DiskStore, Store};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::inspect::Inspector;
use timeshard_testkit::ledger::{self, Ledger, LiveWriter};

use crate::NODE;

const NODES: usize = 5;
const DAMAGED: usize = 2;
const RESTORE_WITHIN: Duration = Duration::from_secs(30);

fn classes() -> Vec<ClassConfig> {
    vec![ClassConfig { name: "all".into(), quantum: Duration::from_secs(2), ..ClassConfig::default() }]
}

/// Deletes every 10th block of the store in `dir` and halves every 13th of the rest; returns the
/// bytes of the damaged blocks (whole, encoded as a peer sends them, framing and request left
/// out) and of the whole store.
fn damage(dir: &std::path::Path) -> anyhow::Result<(u64, u64, usize)> {
    let store = DiskStore::open(dir, DiskConfig::default())?;
    while store.maintain(now_ns())?.more {}
    let mut blocks = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_blocks(after, 1_000)?;
        blocks.extend(page.blocks);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let (mut damaged, mut total, mut n) = (0u64, 0u64, 0);
    for (i, b) in blocks.iter().enumerate() {
        let points = store.read_block(&b.series, b.quantum.start, None, usize::MAX)?.points;
        let block = BlockPoints { series: b.series.clone(), quantum: b.quantum, points: points.clone() };
        let bytes = wire::frame_bytes(&block) - wire::HEADER_BYTES as u64;
        total += bytes;
        if i % 10 != 0 && i % 13 != 0 {
            continue;
        }
        // The store may be settling a block's digest (after its restart); such a block is left.
        if !store.drop_block(&b.series, b.quantum.start, b.digest)? {
            continue;
        }
        // A block of one point loses it whole.
        if i % 10 != 0 && points.len() > 1 {
            let half: Vec<_> = points.iter().step_by(2).copied().collect();
            store.write(&[BlockPoints { series: b.series.clone(), quantum: b.quantum, points: half }])?;
        }
        damaged += bytes;
        n += 1;
    }
    anyhow::ensure!(n > blocks.len() / 20, "only {n} of {} blocks could be damaged", blocks.len());
    Ok((damaged, total, n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_entropy_restores_damaged_blocks_streaming_about_what_differed() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    options.classes = classes();
    let class_table = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    let mut cluster = LocalCluster::start_converged(options).await?;

    let mut acked = Ledger::default();
    let client = cluster.client(0).await?;
    for bus in 0..8 {
        let points: Vec<_> = datasets::pmu_points(bus, 0, 6_000).collect();
        client.write_batch(vec![SeriesPoints { series: datasets::pmu_series(bus), points: points.clone() }]).await?;
        acked.ack(&datasets::pmu_series(bus), &points);
    }
    client.close().await;
    let writer = LiveWriter::start(cluster.client(0).await?, "grid.freq", 4);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (live, _, _) = writer.stop().await?;
    acked.merge(live);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ledger::placement(&cluster, &class_table).await?.is_exact() {
        anyhow::ensure!(Instant::now() < deadline, "replicas did not agree before the damage");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    assert!(cluster.terminate(DAMAGED).await?, "node {DAMAGED} stops cleanly");
    let (damaged, total, blocks) = damage(&cluster.data_dir(DAMAGED).join("store"))?;
    println!("damaged {blocks} blocks of node {DAMAGED}: {damaged} of its {total} bytes");
    let before = ledger::placement(&cluster, &class_table).await?;
    cluster.restart(DAMAGED).await?;
    let restarted = Instant::now();
    let placement = loop {
        let p = ledger::placement(&cluster, &class_table).await?;
        if p.is_exact() {
            break p;
        }
        assert!(restarted.elapsed() < RESTORE_WITHIN, "not restored: {} (before: {})", p.summary(), before.summary());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let s = cluster.status(DAMAGED).await?.repair;
    println!(
        "{} blocks agree on every owner again {:.1} s after the restart; node {DAMAGED} fetched {} blocks, {} bytes \
         ({:.2} x the damaged bytes, {:.1} % of its store), compared with {} bytes",
        placement.blocks,
        restarted.elapsed().as_secs_f64(),
        s.blocks_fetched,
        s.bytes_fetched,
        s.bytes_fetched as f64 / damaged as f64,
        100.0 * s.bytes_fetched as f64 / total as f64,
        s.compare_bytes
    );
    assert!(s.bytes_fetched >= damaged, "the damaged blocks come back whole");
    // Counted in bytes on the wire (requests included), about 1.02x here; the 28-byte bound per
    // point that repair counted in before made it about 1.55x.
    assert!(s.bytes_fetched <= damaged + damaged / 4 + (8 << 10), "fetched far more than what differed");
    // The damage itself is 15-30 % of the store (blocks differ in size); a repair that resent
    // everything would fetch the whole store.
    assert!(damaged < total / 2, "the test damaged {damaged} of {total} bytes");
    assert!(s.bytes_fetched < total / 2, "fetched {} of a {total}-byte store: a full resend", s.bytes_fetched);

    let client = cluster.client(DAMAGED).await?;
    let read = acked.missing_through(&client).await?;
    client.close().await;
    assert_eq!(read.missing, 0, "{read:?}");
    println!("all {} acknowledged points read back through node {DAMAGED}", read.checked);
    assert_eq!(cluster.shutdown().await?, NODES);
    Ok(())
}

/// A bit flipped inside one sealed block of one replica (3 node processes, RF 3): the node
/// serves that block as damaged, and once a read has found it, the node drops its copy and
/// fetches it again from the other owners (issue 24: its digest in memory still matched
/// theirs, so anti-entropy alone never did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_a_read_found_damaged_is_fetched_again_from_a_replica() -> anyhow::Result<()> {
    const SEC: i64 = 1_000_000_000;
    const QUANTUM: i64 = 60 * SEC;
    let class = || ClassConfig {
        name: "all".into(),
        rf: 3,
        w: 2,
        r: 2,
        quantum: Duration::from_secs(60),
        ..ClassConfig::default()
    };
    let (mut options, _dir) = ClusterOptions::for_tests(3, NODE);
    options.classes = vec![class()];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let len = timeshard_proto::QuantumLen::new(QUANTUM)?;
    // 8 historical series of 10 one-minute blocks, 12 points each.
    let series = |i: usize| -> timeshard_proto::SeriesKey { format!("disk.rep{{n={i}}}").parse().expect("valid key") };
    let mut written = std::collections::BTreeMap::new();
    let client = cluster.client(0).await?;
    for i in 0..8 {
        let start = datasets::T0 - datasets::T0 % QUANTUM;
        let points: Vec<Point> =
            (0..120).map(|k| Point::new(start + k * 5 * SEC, (i * 1000 + k as usize) as f64)).collect();
        for p in &points {
            written.entry((i, len.quantum_of(p.ts))).or_insert_with(Vec::new).push(*p);
        }
        client.write_batch(vec![SeriesPoints { series: series(i), points }]).await?;
    }
    client.close().await;
    // W = 2: node 2's copies may still be on the way.
    let addr = cluster.contacts()[DAMAGED].addr;
    let mut inspector = Inspector::new(&cluster).await?;
    let deadline = Instant::now() + RESTORE_WITHIN;
    for ((i, q), points) in &written {
        while inspector.block(addr, &series(*i), *q).await.ok().as_ref() != Some(points) {
            assert!(Instant::now() < deadline, "node {DAMAGED} never held series {i} at {}", q.start);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    inspector.close().await;

    // Node 2's copies sealed into block segments, then a bit flipped a third into the largest.
    assert!(cluster.terminate(DAMAGED).await?, "node {DAMAGED} stops cleanly");
    let store_dir = cluster.data_dir(DAMAGED).join("store");
    {
        let store = DiskStore::open(&store_dir, DiskConfig::default())?;
        while store.maintain(now_ns())?.more {}
        anyhow::ensure!(store.stats().sealed_blocks >= written.len() as u64, "{:?}", store.stats());
    }
    let segments = std::fs::read_dir(store_dir.join("blocks"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"));
    let seg = segments.max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).expect("a block segment");
    let mut bytes = std::fs::read(&seg)?;
    let at = bytes.len() / 3;
    bytes[at] ^= 0x5a;
    std::fs::write(&seg, bytes)?;
    cluster.restart(DAMAGED).await?;

    // Ask node 2 for each of its blocks, as a peer does: the damaged one fails.
    let mut inspector = Inspector::new(&cluster).await?;
    let mut failed = Vec::new();
    for ((i, q), points) in &written {
        match inspector.block(addr, &series(*i), *q).await {
            Ok(got) => assert_eq!(&got, points, "an intact block of series {i} at {}", q.start),
            Err(e) => failed.push(format!("series {i} at {}: {e:#}", q.start)),
        }
    }
    println!("a bit flipped at {at} of {} damaged {} block(s): {failed:#?}", seg.display(), failed.len());
    assert!(!failed.is_empty() && failed.len() <= 2, "one flipped bit damages one block (or two): {failed:#?}");

    // Within a few anti-entropy rounds, node 2 holds every block whole again.
    let found = Instant::now();
    loop {
        let mut differ = 0;
        for ((i, q), points) in &written {
            if inspector.block(addr, &series(*i), *q).await.ok().as_ref() != Some(points) {
                differ += 1;
            }
        }
        if differ == 0 {
            break;
        }
        assert!(found.elapsed() < RESTORE_WITHIN, "{differ} block(s) of node {DAMAGED} still damaged or missing");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(cluster.log(DAMAGED))?;
    assert!(log.contains("dropped a damaged copy of a block"), "node {DAMAGED} says what it did");
    println!(
        "node {DAMAGED} fetched its damaged block(s) again {:.1} s after a read found them",
        found.elapsed().as_secs_f64()
    );
    inspector.close().await;
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

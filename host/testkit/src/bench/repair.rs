//! `timeshard bench repair`: data following membership, on node processes. One cluster goes
//! through four scenarios in turn, then a single node ingests live data:
//!
//! 1. rebalancing: 5 nodes hold `pmu` history (and take live timestamps); 5 more join; time
//!    until every node is settled and every block is on exactly its owners, and the bytes
//!    repair moved meanwhile (`rebalance_mb_per_s`);
//! 2. idle anti-entropy: nothing to repair, the bytes of comparisons per node and second
//!    (`anti_entropy_idle_bytes_per_s_per_node`);
//! 3. departure: a node killed for good; from the moment the others see it gone until every
//!    block is on 3 owners again, per GB fetched (`restore_rf_s_per_gb`);
//! 4. hint replay: a node killed while points are written, then restarted; points hinted per
//!    second of replay until the coordinator holds no hint (`hint_replay_points_per_s`);
//! 5. one node (RF 1) ingesting live timestamps for `live_secs`: its write-ahead log then
//!    (`wal_bytes_after_10min_live`);
//! 6. simulated, no node processes ([`super::repair_sim`]): idle anti-entropy of 10 nodes at
//!    1 k to 1 M blocks per node
//!    (`anti_entropy_idle_bytes_per_s_per_node_at_1m_blocks_simulated`).
//!
//! `restore_points` more history before the departure makes the restore move more data
//! without making the rebalance larger.
//!
//! After each cluster scenario every acknowledged point is read back one by one;
//! `lost_acked_points` counts those missing (it must be 0).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_node::config::{ClassConfig, DhtConfig, MembershipConfig, NodeConfig, RepairConfig};
use timeshard_proto::placement::{owners, placement_id};
use timeshard_proto::{Classes, Point, QuantumLen, SeriesKey};
use timeshard_sdk::{Client, NodeStatus, SeriesPoints};

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::datasets;
use crate::ledger::{self, Ledger, LiveWriter};
use crate::stats::round3;

/// What `bench repair` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct RepairOptions {
    /// Nodes holding the data before the joins.
    pub nodes: usize,
    /// Nodes joining them.
    pub joining: usize,
    /// Historical `pmu` points loaded before the joins.
    pub points: usize,
    /// Further historical `pmu` points loaded after the joins, before the departure: a larger
    /// restore without a larger rebalance.
    pub restore_points: usize,
    /// Seconds of the idle anti-entropy measurement.
    pub idle_secs: u64,
    /// `[repair] anti_entropy_interval` of the nodes.
    pub anti_entropy_interval: Duration,
    /// `[membership] gone_after` of the nodes.
    pub gone_after: Duration,
    /// Seconds of writes while a node is down, for the hint replay (it must stay well below
    /// `gone_after`, or the node is gone instead of down).
    pub hint_secs: u64,
    /// Seconds of live ingest on one node before its log is measured.
    pub live_secs: u64,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            nodes: 5,
            joining: 5,
            points: 2_000_000,
            restore_points: 0,
            idle_secs: 150,
            anti_entropy_interval: Duration::from_secs(60),
            gone_after: Duration::from_secs(30),
            hint_secs: 10,
            live_secs: 600,
            dir: None,
        }
    }
}

impl RepairOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> RepairOptions {
        RepairOptions {
            nodes: 3,
            joining: 2,
            points: 24_000,
            restore_points: 8_000,
            idle_secs: 4,
            anti_entropy_interval: Duration::from_secs(2),
            gone_after: Duration::from_secs(8),
            hint_secs: 1,
            live_secs: 3,
            dir: None,
        }
    }
}

/// How long a scenario may take to settle before the benchmark gives up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(900);
const BUSES: u32 = 8;
const HISTORY_BATCH: usize = 5_000;
/// Blocks per node of the simulated idle anti-entropy rounds; the last is the figure at 1 M.
const SIMULATED_BLOCKS_PER_NODE: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

fn classes() -> Vec<ClassConfig> {
    vec![
        ClassConfig { name: "all".into(), ..ClassConfig::default() },
        ClassConfig { name: "live".into(), metric_prefix: "live.".into(), rf: 1, w: 1, r: 1, ..ClassConfig::default() },
    ]
}

/// Runs the benchmark on node processes of `binary` and returns its JSON document; prints a
/// line per figure as it goes.
pub async fn run(binary: &Path, args: &RepairOptions) -> Result<serde_json::Value> {
    if args.nodes < 3 || args.joining == 0 {
        bail!("the benchmark needs at least 3 nodes (RF 3) and 1 joining");
    }
    let dir = WorkDir::new("repair", args.dir.as_deref());
    measure(binary, dir.path(), args).await
}

fn cluster_options(binary: &Path, dir: PathBuf, nodes: usize, args: &RepairOptions) -> ClusterOptions {
    let mut options = ClusterOptions::new(nodes, dir, binary);
    options.classes = classes();
    options.log = "warn".into();
    options.dht = DhtConfig {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(6),
        ..DhtConfig::default()
    };
    options.membership = MembershipConfig {
        gossip_interval: Duration::from_millis(200),
        suspect_after: Duration::from_secs(3),
        gone_after: args.gone_after,
        ..MembershipConfig::default()
    };
    options.repair = RepairConfig {
        anti_entropy_interval: args.anti_entropy_interval,
        settle_for: Duration::from_secs(5),
        catch_up_delay: Duration::from_secs(3),
        ..RepairConfig::default()
    };
    options
}

/// Totals of repair counters over the running nodes.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    fetched: u64,
    pushed: u64,
    compared: u64,
}

async fn totals(cluster: &LocalCluster) -> Result<(Totals, Vec<NodeStatus>)> {
    let mut t = Totals::default();
    let mut statuses = Vec::new();
    for i in (0..cluster.len()).filter(|&i| cluster.is_running(i)) {
        let s = cluster.status(i).await?;
        t.fetched += s.repair.bytes_fetched;
        t.pushed += s.repair.handoff_bytes_pushed;
        t.compared += s.repair.compare_bytes;
        statuses.push(s);
    }
    Ok((t, statuses))
}

/// Waits until every running node is settled with no handoff pending and every block is on
/// exactly its owners; returns the number of blocks.
async fn wait_exact(cluster: &LocalCluster, classes: &Classes) -> Result<usize> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let (_, statuses) = totals(cluster).await?;
        if statuses.iter().all(|s| s.repair.settled && s.repair.handoff_pending == 0) {
            let p = ledger::placement(cluster, classes).await?;
            if p.is_exact() {
                return Ok(p.blocks);
            }
            if Instant::now() > deadline {
                bail!("the cluster did not settle within {SETTLE_TIMEOUT:?}: {}", p.summary());
            }
        } else if Instant::now() > deadline {
            bail!("nodes not settled within {SETTLE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Acknowledged points of `ledger` missing when read through `client`.
async fn lost(ledger: &Ledger, client: &Client, what: &str) -> Result<u64> {
    let read = ledger.missing_through(client).await?;
    println!("{what}: {} acknowledged points read back, {} missing", read.checked, read.missing);
    Ok(read.missing as u64)
}

/// Writes `pmu` samples `first..first + per_bus` of every bus through `client`.
async fn load(client: &Client, first: usize, per_bus: usize, ledger: &mut Ledger) -> Result<()> {
    let mut at = first;
    while at < first + per_bus {
        let n = HISTORY_BATCH.min(first + per_bus - at);
        let batch: Vec<SeriesPoints> = (0..BUSES)
            .map(|b| SeriesPoints {
                series: datasets::pmu_series(b),
                points: datasets::pmu_points(b, at as u64, n).collect(),
            })
            .collect();
        client.write_batch(batch.clone()).await.context("loading history")?;
        for b in &batch {
            ledger.ack(&b.series, &b.points);
        }
        at += n;
    }
    Ok(())
}

async fn measure(binary: &Path, dir: &Path, args: &RepairOptions) -> Result<serde_json::Value> {
    let class_table = NodeConfig { classes: classes(), ..NodeConfig::default() }.class_table()?;
    eprintln!("starting {} node processes in {}", args.nodes, dir.display());
    let mut cluster =
        LocalCluster::start_converged(cluster_options(binary, dir.join("cluster"), args.nodes, args)).await?;
    let result = scenarios(&mut cluster, &class_table, args).await;
    let clean = cluster.shutdown().await?;
    let mut report = result?;
    if clean != report["nodes"].as_u64().unwrap_or(0) as usize {
        eprintln!("warning: only {clean} nodes exited cleanly");
    }
    let (wal, rate) = live_wal(binary, &dir.join("live"), args).await?;
    report["wal_bytes_after_10min_live"] = json!(wal);
    report["live_secs"] = json!(args.live_secs);
    report["live_points_per_s"] = json!(rate.round() as u64);
    // The node-process run reaches a few thousand blocks per node; the sans-IO trees show
    // idle comparison at up to a million.
    let interval_s = args.anti_entropy_interval.as_secs_f64();
    let simulated = super::repair_sim::idle_figures(args.nodes + args.joining, &SIMULATED_BLOCKS_PER_NODE, interval_s);
    report["anti_entropy_idle_bytes_per_s_per_node_at_1m_blocks_simulated"] =
        simulated["rounds"][SIMULATED_BLOCKS_PER_NODE.len() - 1]["bytes_per_s_per_node"].clone();
    report["anti_entropy_idle_simulated"] = simulated;
    Ok(report)
}

async fn scenarios(cluster: &mut LocalCluster, classes: &Classes, args: &RepairOptions) -> Result<serde_json::Value> {
    let writer = cluster.client(0).await?;
    let floor = Floor::measure(cluster.dir(), &writer).await?;
    println!("{}", floor.summary());
    let mut lost_points = 0;

    // 1. Rebalancing on join.
    let per_bus = args.points / BUSES as usize;
    let mut acked = Ledger::default();
    load(&writer, 0, per_bus, &mut acked).await?;
    cluster.wait_settled(SETTLE_TIMEOUT).await?;
    println!("{} history points on {} nodes", acked.points(), args.nodes);
    let live = LiveWriter::start(cluster.client(0).await?, "grid.freq", 4);
    let (before, _) = totals(cluster).await?;
    let started = Instant::now();
    let new = cluster.add_nodes(args.joining).await?;
    let blocks = wait_exact(cluster, classes).await?;
    let rebalance_s = started.elapsed().as_secs_f64();
    let (after, _) = totals(cluster).await?;
    let moved = (after.fetched + after.pushed).saturating_sub(before.fetched + before.pushed);
    let rebalance_mb_per_s = moved as f64 / 1e6 / rebalance_s;
    println!(
        "rebalance: {} nodes joined {}; {blocks} blocks on exactly their owners after {rebalance_s:.1} s, {} MB moved = \
         {rebalance_mb_per_s:.1} MB/s",
        args.joining,
        args.nodes,
        moved / 1_000_000
    );
    let (live_acked, _, _) = live.stop().await?;
    acked.merge(live_acked);
    wait_exact(cluster, classes).await?;
    let reader = cluster.client(new[0]).await?;
    lost_points += lost(&acked, &reader, "after rebalancing, through a new node").await?;
    reader.close().await;

    // 2. Idle anti-entropy.
    let (before, statuses) = totals(cluster).await?;
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let (after, _) = totals(cluster).await?;
    let nodes = statuses.len();
    let idle = (after.compared + after.fetched).saturating_sub(before.compared + before.fetched) as f64
        / args.idle_secs as f64
        / nodes as f64;
    let blocks_per_node = ledger::placement(cluster, classes).await?.blocks * 3 / nodes;
    println!(
        "idle anti-entropy: {idle:.0} bytes/s per node ({nodes} nodes, about {blocks_per_node} blocks each, rounds every \
         {:?})",
        args.anti_entropy_interval
    );

    // 3. Departure: a node killed for good, after more history if asked.
    let extra_per_bus = args.restore_points / BUSES as usize;
    if extra_per_bus > 0 {
        let t = Instant::now();
        let mut extra = Ledger::default();
        load(&writer, per_bus, extra_per_bus, &mut extra).await?;
        let load_s = t.elapsed().as_secs_f64();
        println!(
            "{} more history points on {nodes} nodes before the departure ({load_s:.1} s, {:.0} points/s)",
            extra.points(),
            extra.points() as f64 / load_s
        );
        acked.merge(extra);
        wait_exact(cluster, classes).await?;
    }
    let departed = 1;
    let (before, _) = totals(cluster).await?;
    cluster.kill(departed).await?;
    let deadline = Instant::now() + args.gone_after + SETTLE_TIMEOUT;
    while cluster.status(0).await?.members_gone == 0 {
        anyhow::ensure!(Instant::now() < deadline, "node {departed} never became gone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = Instant::now();
    wait_exact(cluster, classes).await?;
    let restore_s = gone.elapsed().as_secs_f64();
    let (after, _) = totals(cluster).await?;
    let restored = after.fetched.saturating_sub(before.fetched).max(1);
    let restore_rf_s_per_gb = restore_s / (restored as f64 / 1e9);
    println!(
        "departure: RF restored {restore_s:.1} s after the node was seen gone; {} MB fetched = {:.1} MB/s, {:.1} s per GB",
        restored / 1_000_000,
        restored as f64 / 1e6 / restore_s,
        restore_rf_s_per_gb
    );
    lost_points += lost(&acked, &writer, "after the departure").await?;

    // 4. Hint replay.
    let down = 2;
    cluster.kill(down).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut hinted = Ledger::default();
    let t = Instant::now();
    let mut first = per_bus + extra_per_bus;
    while t.elapsed() < Duration::from_secs(args.hint_secs) {
        load(&writer, first, HISTORY_BATCH, &mut hinted).await?;
        first += HISTORY_BATCH;
    }
    let members: Vec<_> = (0..cluster.len()).filter(|&i| i != departed).map(|i| cluster.contacts()[i]).collect();
    let len = QuantumLen::DEFAULT;
    let down_id = cluster.id(down);
    let hinted_points: usize = hinted
        .acked()
        .iter()
        .map(|(s, points): (&SeriesKey, &Vec<Point>)| {
            points
                .iter()
                .filter(|p| {
                    let id = placement_id(s, &len.quantum_of(p.ts), classes);
                    owners(&members, &id, 3).iter().any(|c| c.id == down_id)
                })
                .count()
        })
        .sum();
    cluster.restart(down).await?;
    let replay = Instant::now();
    loop {
        let s = cluster.status(0).await?;
        if s.hints_pending == 0 {
            break;
        }
        anyhow::ensure!(replay.elapsed() < SETTLE_TIMEOUT, "hints never replayed: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replay_s = replay.elapsed().as_secs_f64();
    let hint_replay_points_per_s = hinted_points as f64 / replay_s;
    println!(
        "hints: {hinted_points} points hinted, replayed in {replay_s:.2} s = {hint_replay_points_per_s:.0} points/s"
    );
    acked.merge(hinted);
    wait_exact(cluster, classes).await?;
    lost_points += lost(&acked, &writer, "after the hint replay").await?;
    writer.close().await;
    println!("lost acknowledged points: {lost_points}");

    Ok(json!({
        "restore_rf_s_per_gb": round3(restore_rf_s_per_gb),
        "rebalance_mb_per_s": round3(rebalance_mb_per_s),
        "anti_entropy_idle_bytes_per_s_per_node": round3(idle),
        "hint_replay_points_per_s": hint_replay_points_per_s.round() as u64,
        "lost_acked_points": lost_points,
        "nodes": args.nodes + args.joining - 1,
        "history_points": args.points,
        "restore_history_points": args.restore_points,
        "rebalance": {"nodes": args.nodes, "joining": args.joining, "seconds": round3(rebalance_s), "bytes": moved,
                      "blocks": blocks},
        "anti_entropy_idle": {"seconds": args.idle_secs, "interval_s": args.anti_entropy_interval.as_secs_f64(),
                              "blocks_per_node": blocks_per_node},
        "restore": {"seconds_after_gone": round3(restore_s), "bytes": restored,
                    "gone_after_s": args.gone_after.as_secs_f64()},
        "hints": {"points": hinted_points, "seconds": round3(replay_s)},
        "floor": floor,
    }))
}

/// One node (RF 1) ingesting live timestamps for `live_secs`: its write-ahead log bytes then,
/// and the ingest rate.
async fn live_wal(binary: &Path, dir: &Path, args: &RepairOptions) -> Result<(u64, f64)> {
    let cluster = LocalCluster::start_converged(cluster_options(binary, dir.to_path_buf(), 1, args)).await?;
    let client = cluster.client(0).await?;
    let keys: Vec<SeriesKey> = (0..20).map(|i| format!("live.freq{{feeder={i}}}").parse()).collect::<Result<_, _>>()?;
    let started = Instant::now();
    let mut points = 0u64;
    let mut last = 0i64;
    while started.elapsed() < Duration::from_secs(args.live_secs) {
        let now = timeshard_clock::now_ns();
        let base = now.max(last + 1);
        last = base + 499 * 20_000;
        let batch: Vec<SeriesPoints> = keys
            .iter()
            .map(|k| SeriesPoints {
                series: k.clone(),
                points: (0..500).map(|j| Point::new(base + j * 20_000, j as f64)).collect(),
            })
            .collect();
        points += client.write_batch(batch).await?.points;
    }
    let rate = points as f64 / started.elapsed().as_secs_f64();
    let wal = cluster.status(0).await?.wal_bytes;
    println!("live: {points} points in {} s ({rate:.0} points/s) on one node; WAL {wal} bytes", args.live_secs);
    client.close().await;
    cluster.shutdown().await?;
    Ok((wal, rate))
}

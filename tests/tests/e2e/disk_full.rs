//! A node whose disk fills under live ingest: its data directory on a 64 MiB tmpfs, 40 MiB of it
//! taken by another file. Writes are refused saying why, reads go on, every acknowledged point
//! reads back, also after a SIGKILL while full and a restart on the full disk, and writes are
//! taken again once space is freed. Mounting needs root, as the tests run in CI. A store
//! limited by `[store] max_bytes` refuses writes at its limit, before the disk fills, and takes
//! them again when SIGHUP raises it. And one replica of three on a full disk: the others take
//! the writes and keep hints, and it catches up from them once space is freed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use timeshard_clock::now_ns;
use timeshard_node::config::{ByteSize, ClassConfig};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::{Client, SeriesPoints};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;

const FS_MIB: u64 = 64;
const BALLAST_MIB: usize = 40;
const SERIES: usize = 10;
const PER_SERIES: usize = 2_000;
/// Points 50 µs apart from two minutes ago: live data (open quanta), never in the future
/// before the disk fills (at most 1,000 batches, 100 ms of each series per batch).
const STEP_NS: i64 = 50_000;
const MAX_BATCHES: usize = 1_000;
/// `[store] max_bytes` of the second scenario.
const MAX_STORE_MIB: u64 = 8;

/// A tmpfs mounted at a directory for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// A `mib` MiB tmpfs at `dir` with `ballast_mib` of it taken by a file, whose path is
    /// returned (remove it to free the space).
    fn with_ballast(dir: &Path, mib: u64, ballast_mib: usize) -> anyhow::Result<(Tmpfs, PathBuf)> {
        let fs = Tmpfs::mount(dir, mib)?;
        let ballast = dir.join("ballast");
        std::fs::write(&ballast, vec![0x5a; ballast_mib << 20])?;
        Ok((fs, ballast))
    }

    fn mount(dir: &Path, mib: u64) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        let status =
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(dir).status()?;
        ensure!(status.success(), "mounting a {mib} MiB tmpfs at {} failed: this test needs root", dir.display());
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// splitmix64 bits as values: incompressible, so the disk fills in seconds.
fn value(seed: &mut u64) -> f64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 1000.0
}

/// Ingest into one node, in batches of incompressible points, until a write is refused: what
/// was acknowledged, and the one refused batch (a refused write may have stored part of itself;
/// retrying is safe).
pub(crate) struct Ingest {
    pub keys: Vec<SeriesKey>,
    pub acked: Vec<Vec<Point>>,
    pub refused: Vec<Vec<Point>>,
    /// The next batch's first timestamp.
    pub t: i64,
    step: i64,
    seed: u64,
}

impl Ingest {
    /// Live data: from two minutes ago, 50 µs apart.
    pub fn new(metric: &str) -> anyhow::Result<Ingest> {
        Ingest::at(metric, now_ns() - 120_000_000_000, STEP_NS)
    }

    /// Points `step` apart from `t`.
    pub fn at(metric: &str, t: i64, step: i64) -> anyhow::Result<Ingest> {
        let keys = (0..SERIES)
            .map(|i| SeriesKey::new(metric, [("sensor", format!("s{i}").as_str())]))
            .collect::<Result<_, _>>()?;
        let (acked, refused) = (vec![Vec::new(); SERIES], vec![Vec::new(); SERIES]);
        Ok(Ingest { keys, acked, refused, t, step, seed: 7 })
    }

    pub fn batch(&mut self) -> Vec<SeriesPoints> {
        let (first, step) = (self.t, self.step);
        self.t += PER_SERIES as i64 * step;
        let seed = &mut self.seed;
        self.keys
            .iter()
            .map(|k| SeriesPoints {
                series: k.clone(),
                points: (0..PER_SERIES as i64).map(|j| Point::new(first + j * step, value(seed))).collect(),
            })
            .collect()
    }

    /// Writes `n` batches, each of which must be acknowledged.
    pub async fn write(&mut self, client: &Client, n: usize) -> anyhow::Result<()> {
        for _ in 0..n {
            let b = self.batch();
            client.write_batch(b.clone()).await?;
            b.into_iter().enumerate().for_each(|(i, s)| self.acked[i].extend(s.points));
        }
        Ok(())
    }

    /// Writes one more batch, retrying it every 50 ms (writes are idempotent) until it is taken,
    /// for up to `within`; returns how long that took and how many tries.
    pub async fn write_once_taken(&mut self, client: &Client, within: Duration) -> anyhow::Result<(Duration, u32)> {
        let started = Instant::now();
        let b = self.batch();
        let mut tries = 0;
        loop {
            tries += 1;
            match client.write_batch(b.clone()).await {
                Ok(_) => break,
                Err(e) => ensure!(started.elapsed() < within, "writes still refused after {within:?}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        b.into_iter().enumerate().for_each(|(i, s)| self.acked[i].extend(s.points));
        Ok((started.elapsed(), tries))
    }

    /// Writes batches until one is refused; returns why.
    pub async fn until_refused(&mut self, client: &Client) -> anyhow::Result<timeshard_sdk::Error> {
        for _ in 0..MAX_BATCHES {
            let b = self.batch();
            match client.write_batch(b.clone()).await {
                Ok(_) => b.into_iter().enumerate().for_each(|(i, s)| self.acked[i].extend(s.points)),
                Err(e) => {
                    b.into_iter().enumerate().for_each(|(i, s)| self.refused[i].extend(s.points));
                    let points: usize = self.acked.iter().map(Vec::len).sum();
                    println!("refused after {points} acknowledged points: {e}");
                    ensure!(points > 0, "nothing was written before the first refusal");
                    ensure!(self.t < now_ns(), "the data stayed live, not in the future");
                    return Ok(e);
                }
            }
        }
        anyhow::bail!("{MAX_BATCHES} batches and no refusal")
    }

    /// Every acknowledged point reads back from `client`, and nothing else but points of the
    /// refused batch.
    pub async fn check(&self, client: &Client) -> anyhow::Result<()> {
        let index = |points: &[Point]| points.iter().map(|p| (p.ts, p.value.to_bits())).collect::<HashSet<_>>();
        for (i, key) in self.keys.iter().enumerate() {
            let range = TimeRange::new(self.acked[i][0].ts, now_ns())?;
            let got = index(&client.read(key, range).await?);
            let (written, maybe) = (index(&self.acked[i]), index(&self.refused[i]));
            ensure!(got.iter().all(|p| written.contains(p) || maybe.contains(p)), "{key}: points never written");
            let missing = written.difference(&got).count();
            ensure!(missing == 0, "{key}: {missing} of {} acknowledged points are missing", written.len());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fills_its_disk_refuses_clearly_and_loses_nothing() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    // The node's data directory (its store and log) on the small filesystem; its config, keys
    // and log file stay outside, as on a device with a separate data partition.
    let data = options.dir.join("node-0").join("data");
    let (_tmpfs, ballast) = Tmpfs::with_ballast(&data, FS_MIB, BALLAST_MIB)?;
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    let mut ingest = Ingest::new("disk.full")?;
    let text = ingest.until_refused(&client).await?.to_string();
    ensure!(text.contains("No space left") && text.contains("retrying is safe"), "the refusal says why: {text}");

    // Full: writes are still refused the same way, reads go on, /metrics shows the disk.
    ensure!(client.write_batch(ingest.batch()).await.is_err(), "a write fit on a full disk");
    ingest.check(&client).await?;
    let available = cluster.metric(0, "timeshard_disk_available_bytes").await?.context("disk in /metrics")?;
    ensure!(available < (4 << 20) as f64, "{available} bytes shown available on the full disk");

    // Killed while full, and restarted on the full disk: still everything acknowledged.
    client.close().await;
    cluster.kill(0).await?;
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let started = Instant::now();
    ingest.check(&client).await?;
    println!("restarted on the full disk, every acknowledged point read back in {:?}", started.elapsed());

    // Space freed: writes are taken again, and everything reads back.
    std::fs::remove_file(&ballast)?;
    let (took, tries) = ingest.write_once_taken(&client, Duration::from_secs(30)).await?;
    println!("a write taken {took:?} after space was freed (try {tries})");
    ingest.check(&client).await?;
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// `[store] max_bytes` keeps the store off the rest of the disk: past it writes are refused
/// saying so, before the filesystem is full, and what was acknowledged stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_at_its_max_bytes_refuses_writes_and_keeps_what_it_acknowledged() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.store.max_bytes = Some(ByteSize(MAX_STORE_MIB << 20));
    options.store.maintenance_interval = Duration::from_millis(200);
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    let mut ingest = Ingest::new("store.limit")?;
    let text = ingest.until_refused(&client).await?.to_string();
    ensure!(text.contains("[store] max_bytes") && text.contains("retrying is safe"), "the refusal says why: {text}");
    let held = cluster.metric(0, "timeshard_store_log_size_bytes").await?.context("log size")?
        + cluster.metric(0, "timeshard_store_size_bytes").await?.context("store size")?;
    // Measured every 200 ms: the limit may be passed by what arrived in between, not by much.
    ensure!(held < ((2 * MAX_STORE_MIB) << 20) as f64, "the store holds {held} bytes, limit {MAX_STORE_MIB} MiB");
    ensure!(client.write_batch(ingest.batch()).await.is_err(), "a write taken past the limit");
    ingest.check(&client).await?;

    // A higher limit in the file applies on SIGHUP: writes are taken again.
    cluster.edit_config(0, |c| c.store.max_bytes = Some(ByteSize((4 * MAX_STORE_MIB) << 20)))?;
    cluster.reload(0)?;
    ingest.write_once_taken(&client, Duration::from_secs(30)).await?;
    ingest.check(&client).await?;
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// Points written while one replica's disk is full: the other two acknowledge them (W = 2), the
/// coordinators keep hints for it, and it stays up, refuses what it cannot store, restarts on
/// the full disk after a SIGKILL, and once space is freed takes the hints until it holds every
/// acknowledged point on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_full_disk_catches_up_from_hints_once_space_is_freed() -> anyhow::Result<()> {
    const FS_MIB: u64 = 128;
    const BALLAST_MIB: usize = 108;
    let (mut options, _dir) = ClusterOptions::for_tests(3, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 3, w: 2, r: 1, ..Default::default() }];
    let data = options.dir.join("node-2").join("data");
    let (_tmpfs, ballast) = Tmpfs::with_ballast(&data, FS_MIB, BALLAST_MIB)?;
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // Three times what node 2 has room for, all acknowledged by nodes 0 and 1.
    let mut ingest = Ingest::new("disk.replica")?;
    ingest.write(&client, 100).await?;
    let available = cluster.metric(2, "timeshard_disk_available_bytes").await?.context("disk of node 2")?;
    ensure!(available < (2 << 20) as f64, "node 2 still has {available} bytes: its disk never filled");
    let hints = cluster.metric(0, "timeshard_hints_pending").await?.unwrap_or(0.0)
        + cluster.metric(1, "timeshard_hints_pending").await?.unwrap_or(0.0);
    ensure!(hints > 0.0, "no hints kept for the full replica");
    println!("node 2 full ({available} bytes left), {hints} hints held for it");

    // Killed while full, restarted on the full disk: it comes back up, and two anti-entropy
    // intervals (5 s: its rounds try to fetch what it lacks and cannot store it) and its
    // maintenance passes later it is still up.
    cluster.kill(2).await?;
    cluster.restart(2).await?;
    ensure!(cluster.is_running(2), "node 2 did not restart on its full disk");
    tokio::time::sleep(Duration::from_secs(12)).await;
    ensure!(cluster.is_running(2), "node 2 stopped while full");
    ensure!(cluster.metric(2, "timeshard_disk_available_bytes").await?.is_some(), "node 2 answers /metrics");
    // Reads go on through it, from its peers.
    ingest.check(&cluster.client(2).await?).await?;

    // Space freed: the hints drain into it.
    std::fs::remove_file(&ballast)?;
    let started = Instant::now();
    loop {
        let pending = cluster.metric(0, "timeshard_hints_pending").await?.unwrap_or(0.0)
            + cluster.metric(1, "timeshard_hints_pending").await?.unwrap_or(0.0);
        if pending == 0.0 {
            break;
        }
        ensure!(started.elapsed() < Duration::from_secs(180), "{pending} hints still pending after 180 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("hints delivered {:?} after space was freed", started.elapsed());
    client.close().await;

    // Node 2 alone holds every acknowledged point (R = 1, the others killed).
    cluster.kill(0).await?;
    cluster.kill(1).await?;
    let alone = cluster.client(2).await?;
    ingest.check(&alone).await?;
    alone.close().await;
    cluster.restart(0).await?;
    cluster.restart(1).await?;
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

/// The archive export of a node whose disk is full. History waits while the archive is away;
/// the disk fills with live data; then the archive comes back: export rounds run on the full
/// disk (the drop horizon they record before dropping hot copies may not fit, and such a round
/// fails and keeps the hot data), the node stays up, and once space is freed the history is
/// archived and dropped from the hot store, every point reads back, and the archive holds no
/// row twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_export_of_a_node_with_a_full_disk_loses_and_repeats_nothing() -> anyhow::Result<()> {
    use crate::tier_support::{DAY, Moto, MotoTier, SEC, archived_class, duckdb, points, total, wait_reports, write};
    let mut moto = Moto::reserve();
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![
        ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() },
        archived_class("history", "hist.", 1),
    ];
    options.tier = moto.tier("timeshard");
    let data = options.dir.join("node-0").join("data");
    let (_tmpfs, ballast) = Tmpfs::with_ballast(&data, FS_MIB, BALLAST_MIB)?;
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // Two days old: due for export at once, but the archive is away.
    let now = now_ns();
    let history: Vec<(SeriesKey, Vec<Point>)> = (0..3)
        .map(|s| {
            (format!("hist.level{{tank={s}}}").parse().unwrap(), points(s, now - 3 * DAY, now - 2 * DAY, 10 * SEC))
        })
        .collect();
    for (s, p) in &history {
        write(&client, s, p).await?;
    }
    let mut ingest = Ingest::new("disk.fill")?;
    ingest.until_refused(&client).await?;

    // The archive comes back to a node with a full disk.
    moto.start("timeshard")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(cluster.is_running(0), "the node stopped exporting on a full disk");
    let range = TimeRange::new(now - 4 * DAY, now)?;
    for (s, p) in &history {
        ensure!(client.read(s, range).await? == *p, "{s} changed on the full disk");
    }

    // Space freed: everything is archived and dropped from the hot store, once.
    std::fs::remove_file(&ballast)?;
    let blocks: u64 = history
        .iter()
        .map(|(_, p)| p.iter().map(|x| x.ts.div_euclid(60 * SEC)).collect::<HashSet<_>>().len() as u64)
        .sum();
    wait_reports(&cluster, &[0], Duration::from_secs(120), "history archived and dropped", |r| {
        total(r, "history", |c| c.dropped_blocks) == blocks
    })
    .await?;
    for (s, p) in &history {
        ensure!(client.read(s, range).await? == *p, "{s} read back from the archive differs");
    }
    ingest.check(&client).await?;
    let copy = dir.path().join("archive-copy");
    crate::quotas::download(moto.port, "timeshard", &copy)?;
    let db = duckdb(&copy.join("archive"))?;
    let rows: i64 = db.groups.iter().filter_map(|g| g["count"].as_i64()).sum();
    let written: usize = history.iter().map(|(_, p)| p.len()).sum();
    ensure!(rows as usize == written && db.duplicates_all == 0, "{rows} rows for {written} points: {db:?}");
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

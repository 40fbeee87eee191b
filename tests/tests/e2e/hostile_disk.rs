//! Damaged files at a node's restart, on one node process (one replica, so no peer can hide the
//! damage): a bit flipped in a write-ahead log segment and in a block segment, then a truncated
//! log segment and a truncated block segment. Each time the node starts, its log names the
//! damaged file, every block and point the damage did not touch reads back exactly, a damaged
//! block's read fails with an error naming its segment file, and the node never panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;
use timeshard_node::config::ClassConfig;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::{Client, SeriesPoints};
use timeshard_store::{DiskConfig, DiskStore, Store};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::T0;

use crate::NODE;

const SEC: i64 = 1_000_000_000;
const QUANTUM: i64 = 60 * SEC;
/// Historical series, each with points in `QUANTA` quanta, sealed into blocks.
const SERIES: usize = 12;
const QUANTA: i64 = 20;
/// Points written one per request (one log record each) before a kill.
const LIVE: usize = 200;

fn hist(i: usize) -> SeriesKey {
    format!("disk.hist{{n={i}}}").parse().expect("valid key")
}

/// What was written to the historical series, by (series, quantum start).
type Blocks = BTreeMap<(usize, i64), Vec<Point>>;

fn historical() -> Blocks {
    let mut blocks = Blocks::new();
    for i in 0..SERIES {
        for q in 0..QUANTA {
            // Quanta start at multiples of their length.
            let start = T0 - T0 % QUANTUM + q * QUANTUM;
            let points = (0..12).map(|k| Point::new(start + k * 5 * SEC, (i as i64 * 1000 + q * 12 + k) as f64));
            blocks.insert((i, start), points.collect());
        }
    }
    blocks
}

/// The files of `dir` ending in `ext`, sorted by name (segments are numbered).
fn files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    Ok(out)
}

/// The newest log segment of `store` and its length, if it has one.
fn newest_log(store: &Path) -> Result<Option<(PathBuf, u64)>> {
    let Some(newest) = files(&store.join("wal"), "wal")?.pop() else { return Ok(None) };
    let len = std::fs::metadata(&newest)?.len();
    Ok(Some((newest, len)))
}

/// Where the records appended since `before` (the newest segment then) lie: in the newest
/// segment now, from `start` to `end`.
fn appended(store: &Path, before: &Option<(PathBuf, u64)>) -> Result<(PathBuf, u64, u64)> {
    let (newest, len) = newest_log(store)?.context("no log segment")?;
    let start = match before {
        Some((path, len)) if *path == newest => *len,
        _ => 0,
    };
    Ok((newest, start, len))
}

fn largest(dir: &Path, ext: &str) -> Result<PathBuf> {
    files(dir, ext)?
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .with_context(|| format!("no .{ext} file in {}", dir.display()))
}

fn flip(path: &Path, at: u64) -> Result<()> {
    let mut bytes = std::fs::read(path)?;
    bytes[at as usize] ^= 0x5a;
    Ok(std::fs::write(path, bytes)?)
}

fn truncate(path: &Path, to: u64) -> Result<()> {
    Ok(std::fs::OpenOptions::new().write(true).open(path)?.set_len(to)?)
}

/// What the node logged since `from` bytes into its log.
fn logged_since(cluster: &LocalCluster, from: usize) -> String {
    let log = std::fs::read_to_string(cluster.log(0)).unwrap_or_default();
    log.get(from..).unwrap_or_default().to_string()
}

/// Writes `LIVE` points to `series`, one request each, at live timestamps.
async fn live(client: &Client, series: &SeriesKey) -> Result<Vec<Point>> {
    let start = now_ns();
    let mut written = Vec::new();
    for k in 0..LIVE {
        let p = Point::new(start + k as i64 * 1_000_000, k as f64);
        client.write_batch(vec![SeriesPoints { series: series.clone(), points: vec![p] }]).await?;
        written.push(p);
    }
    Ok(written)
}

/// Reads every historical block on its own: each is either exactly what was written or an error
/// naming a block segment file. Returns the blocks that failed.
async fn check_blocks(client: &Client, blocks: &Blocks) -> Result<Vec<String>> {
    let mut failed = Vec::new();
    for ((i, start), want) in blocks {
        match client.read(&hist(*i), TimeRange::new(*start, start + QUANTUM)?).await {
            Ok(got) => {
                ensure!(&got == want, "{} at {start}: {} points read, {} written", hist(*i), got.len(), want.len())
            }
            Err(e) => {
                let msg = e.to_string();
                ensure!(msg.contains("blocks/") && msg.contains(".seg"), "{} at {start}: {msg}", hist(*i));
                failed.push(msg);
            }
        }
    }
    Ok(failed)
}

/// `got` is `written` but for at most `lost` points, and some were lost.
fn lost_some(what: &str, got: &[Point], written: &[Point], lost: usize) -> Result<()> {
    ensure!(got.iter().all(|p| written.contains(p)), "{what}: a point read back was never written");
    ensure!(
        got.len() < written.len() && got.len() + lost >= written.len(),
        "{what}: {} of {} points read back",
        got.len(),
        written.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_log_and_block_segments_are_reported_and_the_rest_is_served() -> Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig {
        name: "all".into(),
        rf: 1,
        w: 1,
        r: 1,
        quantum: Duration::from_nanos(QUANTUM as u64),
        ..Default::default()
    }];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let store_dir = cluster.data_dir(0).join("store");
    let blocks = historical();
    let client = cluster.client(0).await?;
    let batch: Vec<SeriesPoints> = (0..SERIES)
        .map(|i| SeriesPoints {
            series: hist(i),
            points: blocks.iter().filter(|((s, _), _)| *s == i).flat_map(|(_, p)| p.iter().copied()).collect(),
        })
        .collect();
    client.write_batch(batch).await?;
    client.close().await;
    assert!(cluster.terminate(0).await?, "the node stops cleanly");
    // Seal the history into block segments with the store engine itself, below the node.
    {
        let store = DiskStore::open(&store_dir, DiskConfig::default())?;
        while store.maintain(now_ns())?.more {}
        ensure!(store.stats().sealed_blocks >= (SERIES as u64) * QUANTA as u64, "{:?}", store.stats());
    }

    // 1. Bit flips: in the middle of the log records of a live series, and a quarter into the
    // block segment.
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let before = newest_log(&store_dir)?;
    let live1: SeriesKey = "disk.live{n=1}".parse()?;
    let written1 = live(&client, &live1).await?;
    cluster.kill(0).await?;
    let (wal, start, end) = appended(&store_dir, &before)?;
    flip(&wal, start + (end - start) / 2)?;
    let seg = largest(&store_dir.join("blocks"), "seg")?;
    let seg_len = std::fs::metadata(&seg)?.len();
    flip(&seg, seg_len / 4)?;
    let wal_name = format!("wal/{}", wal.file_name().unwrap().to_string_lossy());
    let seg_name = format!("blocks/{}", seg.file_name().unwrap().to_string_lossy());

    let log_from = std::fs::metadata(cluster.log(0))?.len() as usize;
    cluster.restart(0).await?;
    let logged = logged_since(&cluster, log_from);
    ensure!(
        logged.lines().any(|l| l.contains(&wal_name) && l.contains("damaged bytes")),
        "the node's log names the damaged {wal_name}:\n{logged}"
    );
    let client = cluster.client(0).await?;
    let all = TimeRange::new(written1[0].ts, written1[LIVE - 1].ts + 1)?;
    let got1 = client.read(&live1, all).await?;
    lost_some("a bit flipped in the log", &got1, &written1, 3)?;
    let failed = check_blocks(&client, &blocks).await?;
    ensure!(failed.len() == 1, "a bit flipped in {seg_name} at {} damages one block: {failed:#?}", seg_len / 4);
    ensure!(failed.iter().all(|m| m.contains(&seg_name) && m.contains("damaged")), "{failed:#?}");
    println!(
        "bit flips: {wal_name} lost {} of {LIVE} log records and was reported; {seg_name} failed {} of {} blocks, \
         naming the file; everything else read back",
        LIVE - got1.len(),
        failed.len(),
        blocks.len()
    );

    // 2. Truncations: the log segment two thirds into the records of another live series, and
    // the largest block segment at three quarters.
    let before = newest_log(&store_dir)?;
    let live2: SeriesKey = "disk.live{n=2}".parse()?;
    let written2 = live(&client, &live2).await?;
    cluster.kill(0).await?;
    let (wal, start, end) = appended(&store_dir, &before)?;
    truncate(&wal, start + (end - start) * 2 / 3)?;
    let seg = largest(&store_dir.join("blocks"), "seg")?;
    let seg_len = std::fs::metadata(&seg)?.len();
    truncate(&seg, seg_len * 3 / 4)?;
    let seg_name = format!("blocks/{}", seg.file_name().unwrap().to_string_lossy());

    let log_from = std::fs::metadata(cluster.log(0))?.len() as usize;
    cluster.restart(0).await?;
    let logged = logged_since(&cluster, log_from);
    ensure!(
        logged.lines().any(|l| l.contains(&seg_name) && l.contains("past the end")),
        "the node's log names the truncated {seg_name}:\n{logged}"
    );
    let client = cluster.client(0).await?;
    let got2 = client.read(&live2, TimeRange::new(written2[0].ts, written2[LIVE - 1].ts + 1)?).await?;
    // A cut log keeps the records before the cut: a prefix of what was written.
    lost_some("a truncated log", &got2, &written2, LIVE * 2 / 3)?;
    ensure!(got2[..] == written2[..got2.len()], "a truncated log keeps a prefix of its records");
    ensure!(client.read(&live1, all).await? == got1, "the first live series is unchanged");
    let failed = check_blocks(&client, &blocks).await?;
    ensure!(failed.len() > blocks.len() / 8, "a quarter of {seg_name} cut, {} blocks failed", failed.len());
    ensure!(failed.len() < blocks.len(), "every block failed");
    println!(
        "truncations: the log kept {} of {LIVE} records; {seg_name} cut at 3/4: {} of {} blocks fail naming a \
         segment, the others read back",
        got2.len(),
        failed.len(),
        blocks.len()
    );
    client.close().await;
    let log = logged_since(&cluster, 0);
    ensure!(!log.contains("panicked"), "the node panicked:\n{log}");
    assert_eq!(cluster.shutdown().await?, 1, "the node ran to the end");
    Ok(())
}

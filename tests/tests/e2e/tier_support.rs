//! What the cold-tier tests share: archived classes, data around the hot window, reference
//! window aggregates from raw points, waiting for the nodes' export rounds to settle, DuckDB
//! over a local archive, and moto's S3 server.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use timeshard_node::config::{ClassConfig, TierConfig};
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::{ArchiveReport, Client, WindowStats};
use timeshard_testkit::cluster::LocalCluster;
use timeshard_testkit::policies::PolicySection;

pub const SEC: i64 = 1_000_000_000;
pub const MIN: i64 = 60 * SEC;
pub const HOUR: i64 = 3600 * SEC;
pub const DAY: i64 = 86_400 * SEC;

/// An archived class (1-minute quanta, hot for a day by event time) of `rf` replicas, all
/// written (W = RF) so replicas agree, read from one.
pub fn archived_class(name: &str, prefix: &str, rf: u8) -> ClassConfig {
    ClassConfig {
        name: name.into(),
        metric_prefix: prefix.into(),
        quantum: Duration::from_secs(60),
        rf,
        w: rf,
        r: 1,
        archive: true,
        hot: Some(Duration::from_secs(86_400)),
        ..Default::default()
    }
}

/// A tier on `url` with rounds every second and short listing TTL and cleanup grace.
pub fn quick_tier(url: &str) -> TierConfig {
    TierConfig {
        url: url.into(),
        interval: Duration::from_secs(1),
        listing_ttl: Duration::from_secs(1),
        cleanup_grace: Duration::from_secs(2),
        max_backoff: Duration::from_secs(2),
        ..TierConfig::default()
    }
}

/// A point of series `s` every `step` in `[from, to)` (aligned to `step`), with values of 3
/// decimals that differ per series and time.
pub fn points(s: u64, from: i64, to: i64, step: i64) -> Vec<Point> {
    let first = from - from.rem_euclid(step) + step;
    (0..)
        .map(|k| first + k * step)
        .take_while(|&ts| ts < to)
        .map(|ts| {
            let k = (ts / step) as u64;
            let v = ((k.wrapping_mul(7919) ^ s.wrapping_mul(104_729)) % 100_000) as f64 / 1000.0 - 50.0;
            Point::new(ts, v)
        })
        .collect()
}

/// Writes `points` of `series` in batches.
/// Retries a chunk refused as `Overloaded` (the node past its memory budget: retryable, and
/// writes are idempotent), as a client should, for up to [`OVERLOADED_RETRY`]. A debug build's
/// node runs close to its resident ceiling, and one fresh-clone run saw a chunk refused so.
pub async fn write(client: &Client, series: &SeriesKey, points: &[Point]) -> Result<()> {
    for chunk in points.chunks(20_000) {
        let started = Instant::now();
        loop {
            match client.write(series, chunk).await {
                Ok(_) => break,
                Err(e) if e.code() == Some(ErrorCode::Overloaded) && started.elapsed() < OVERLOADED_RETRY => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("writing {series}")),
            }
        }
    }
    Ok(())
}

/// How long [`write`] retries a chunk the node refuses as overloaded.
const OVERLOADED_RETRY: Duration = Duration::from_secs(60);

/// Window aggregates of `points` (sorted) over `range`, computed directly: the reference.
pub fn reference(points: &[Point], range: TimeRange, width: i64) -> Vec<WindowStats> {
    let mut out: Vec<WindowStats> = Vec::new();
    for p in points.iter().filter(|p| range.contains(p.ts)) {
        let w = p.ts.div_euclid(width);
        match out.last_mut() {
            Some(last) if last.start.div_euclid(width) == w => {
                last.count += 1;
                last.min = last.min.min(p.value);
                last.max = last.max.max(p.value);
                last.sum += p.value;
                (last.last, last.last_ts) = (p.value, p.ts);
            }
            _ => out.push(WindowStats {
                start: (w * width).max(range.start()),
                end: ((w + 1) * width).min(range.end()),
                count: 1,
                min: p.value,
                max: p.value,
                sum: p.value,
                first: p.value,
                first_ts: p.ts,
                last: p.value,
                last_ts: p.ts,
                digest: 0,
            }),
        }
    }
    out
}

/// Checks timeshard's windows against the reference, every field (sums within rounding).
pub fn assert_windows(got: &[WindowStats], want: &[WindowStats], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: window count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(
            (g.start, g.end, g.count, g.min, g.max, g.first, g.first_ts, g.last, g.last_ts),
            (w.start, w.end, w.count, w.min, w.max, w.first, w.first_ts, w.last, w.last_ts),
            "{context}: window at {}",
            w.start
        );
        assert!((g.sum - w.sum).abs() <= 1e-9 * w.sum.abs().max(1.0) * w.count as f64, "{context}: sum at {}", w.start);
    }
}

/// The archive reports of nodes `nodes`.
pub async fn reports(cluster: &LocalCluster, nodes: &[usize]) -> Result<Vec<ArchiveReport>> {
    let mut out = Vec::new();
    for &i in nodes {
        let client = cluster.client(i).await?;
        out.push(client.archive_status().await?);
        client.close().await;
    }
    Ok(out)
}

/// Sums a class's per-node counter over reports.
pub fn total(reports: &[ArchiveReport], class: &str, field: impl Fn(&timeshard_sdk::ArchiveClassReport) -> u64) -> u64 {
    reports.iter().flat_map(|r| r.classes.iter().filter(|c| c.class == class)).map(field).sum()
}

/// Polls the reports of `nodes` until `done` holds of them (up to `timeout`).
pub async fn wait_reports(
    cluster: &LocalCluster,
    nodes: &[usize],
    timeout: Duration,
    what: &str,
    done: impl Fn(&[ArchiveReport]) -> bool,
) -> Result<Vec<ArchiveReport>> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = reports(cluster, nodes).await?;
        if done(&r) {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}; the nodes report {r:#?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Policies with the `rms` query policy (guest/build.sh builds it) bound to `prefix`, signed
/// with a key made in `dir`.
pub fn rms_policy(dir: &Path, prefix: &str) -> Result<timeshard_policy::Config> {
    let mut section = PolicySection::new(dir, &crate::guest_dir())?;
    section.module("rms", "rms", timeshard_policy::Kind::Query, &[])?;
    section.bind(prefix, None, &["rms"]);
    section.config()
}

/// RMS and count of the finite values of `points` in `range`.
pub fn rms(points: &[Point], range: TimeRange) -> (f64, f64) {
    let (mut sq, mut n) = (0.0, 0.0);
    for p in points.iter().filter(|p| range.contains(p.ts) && p.value.is_finite()) {
        sq += p.value * p.value;
        n += 1.0;
    }
    ((sq / n).sqrt(), n)
}

/// What DuckDB finds in a local archive.
#[derive(Debug)]
pub struct DuckDb {
    /// Per series and UTC day of the committed points files: count, sum, min and max (the bits
    /// of the doubles, as `min_bits` and `max_bits`), first and last timestamp.
    pub groups: Vec<serde_json::Value>,
    /// Rows seen twice: in the committed files, and in every points file (a glob).
    pub duplicates_committed: i64,
    pub duplicates_all: i64,
    /// Rows of all points files.
    pub rows_all: i64,
    /// Block parts in the manifests, distinct blocks they name, and parts of late data.
    pub parts: i64,
    pub blocks: i64,
    pub late_parts: i64,
}

const DUCKDB_SCRIPT: &str = r#"
import glob, json, struct, sys
try:
    import duckdb
except ImportError:
    sys.exit("duckdb is not installed: run `pip install duckdb` (scripts/test does)")
root = sys.argv[1]
# A slow query would print a progress bar into the JSON on standard output.
duckdb.execute("SET enable_progress_bar = false")
# Every node's folder (node=<id>/manifests/...), and a legacy layout's at the top.
manifests = sorted(glob.glob(f"{root}/**/manifests/**/*.parquet", recursive=True))
committed = [m.replace("/manifests/", "/points/") for m in manifests]
out = {"groups": [], "duplicates_committed": 0, "duplicates_all": 0, "rows_all": 0, "parts": 0, "blocks": 0,
       "late_parts": 0}
if committed:
    files = "[" + ", ".join(f"'{f}'" for f in committed) + "]"
    for r in duckdb.sql(f"""
        SELECT series_key, strftime(timezone('UTC', "timestamp"), '%Y-%m-%d') AS day, count(*), sum(value),
               min(value), max(value), min(epoch_ns("timestamp")), max(epoch_ns("timestamp"))
        FROM read_parquet({files}) GROUP BY ALL ORDER BY ALL""").fetchall():
        # min and max as the bits of the double: JSON numbers do not round-trip exactly.
        bits = lambda v: struct.unpack("<q", struct.pack("<d", v))[0]
        out["groups"].append({"series": r[0], "day": r[1], "count": r[2], "sum": r[3], "min_bits": bits(r[4]),
                              "max_bits": bits(r[5]), "first_ns": r[6], "last_ns": r[7]})
    out["duplicates_committed"] = duckdb.sql(f"""
        SELECT count(*) - count(DISTINCT (series_key, "timestamp", value, event_id))
        FROM read_parquet({files})""").fetchall()[0][0]
    m = "[" + ", ".join(f"'{f}'" for f in manifests) + "]"
    out["parts"], out["blocks"], out["late_parts"] = duckdb.sql(f"""
        SELECT count(*), count(DISTINCT (series_key, quantum_start)), count(*) FILTER (WHERE base <> 0)
        FROM read_parquet({m})""").fetchall()[0]
every = glob.glob(f"{root}/**/points/**/*.parquet", recursive=True)
if every:
    out["rows_all"], out["duplicates_all"] = duckdb.sql(f"""
        SELECT count(*), count(*) - count(DISTINCT (series_key, "timestamp", value, event_id))
        FROM read_parquet('{root}/*/points/**/*.parquet')""").fetchall()[0]
print(json.dumps(out))
"#;

/// Runs DuckDB (PyPI `duckdb`) over the local archive at `root`.
pub fn duckdb(root: &Path) -> Result<DuckDb> {
    let out = Command::new(std::env::var("TIMESHARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(DUCKDB_SCRIPT)
        .arg(root)
        .output()
        .context("cannot run python3: install Python 3 and `pip install duckdb` (scripts/test does)")?;
    ensure!(
        out.status.success(),
        "DuckDB failed: {}\nInstall it with `pip install duckdb` (scripts/test does).",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let n = |k: &str| v[k].as_i64().unwrap_or(-1);
    Ok(DuckDb {
        groups: v["groups"].as_array().cloned().unwrap_or_default(),
        duplicates_committed: n("duplicates_committed"),
        duplicates_all: n("duplicates_all"),
        rows_all: n("rows_all"),
        parts: n("parts"),
        blocks: n("blocks"),
        late_parts: n("late_parts"),
    })
}

/// Every file under `dir` whose path contains `part`.
pub fn files_under(dir: &Path, part: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p, part));
        } else if p.to_string_lossy().contains(part) {
            out.push(p);
        }
    }
    out.sort();
    out
}

pub use timeshard_testkit::moto::Moto;

/// The node's `[tier]` settings for an archive on a [`Moto`] server.
pub trait MotoTier {
    /// An archive in `bucket` on this server.
    fn tier(&self, bucket: &str) -> TierConfig;
}

impl MotoTier for Moto {
    fn tier(&self, bucket: &str) -> TierConfig {
        let mut t = quick_tier(&format!("s3://{bucket}/archive"));
        t.options.extend(self.options());
        t
    }
}

//! `timeshard bench store`: one node's storage engine measured on the real disk with durable
//! settings, through the store's public API ([`measure`] returns a [`StoreBenchReport`], [`run`]
//! the benchmark's JSON document). The data are the `pmu` and `counter` datasets of
//! BENCHMARKS.md ([`crate::datasets`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Instant;

use timeshard_proto::point::BlockPoints;
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::block::xor;
use timeshard_store::{DiskConfig, DiskStore, Store, StoreError};

use super::floor::Floor;
use crate::datasets::{T0 as T0_NS, counter_points, counter_series, pmu_points, pmu_series};
use crate::stats::median;

/// Groups points of one series into per-quantum blocks.
pub fn to_blocks(series: &SeriesKey, len: QuantumLen, points: &[Point]) -> Vec<BlockPoints> {
    let mut out: Vec<BlockPoints> = Vec::new();
    for p in points {
        let q = len.quantum_of(p.ts);
        match out.last_mut() {
            Some(b) if b.quantum == q => b.points.push(*p),
            _ => out.push(BlockPoints { series: series.clone(), quantum: q, points: vec![*p] }),
        }
    }
    out
}

/// What to run; `Default` is the benchmark as specified, [`BenchOptions::quick`] a smoke run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Repetitions of each timed measurement (medians are reported).
    pub reps: usize,
    /// Points written by the ingest measurement (1,000 `pmu` series).
    pub ingest_points: usize,
    /// Concurrent writers during ingest (each owns a share of the series).
    pub writers: usize,
    /// Series written by the ingest measurement.
    pub ingest_series: u32,
    /// Points per write.
    pub batch_points: usize,
    /// Points of each dataset stored for bytes per point.
    pub bytes_points: usize,
    /// Points of the day of `pmu` scanned and aggregated.
    pub day_points: usize,
    /// Points of the year of `counter` aggregated.
    pub year_points: usize,
    /// Points in the log for the recovery measurement.
    pub recovery_points: usize,
    /// Quantum of the `pmu` class (default 10 s, the cluster default).
    pub pmu_quantum: QuantumLen,
    /// Quantum of the `counter` class (default 1 h: a 1 Hz class).
    pub counter_quantum: QuantumLen,
    /// Points per dataset in the codec comparison.
    pub codec_points: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            reps: 3,
            ingest_points: 10_000_000,
            writers: 4,
            ingest_series: 1_000,
            batch_points: 5_000,
            bytes_points: 10_000_000,
            day_points: 5_184_000,
            year_points: 31_536_000,
            recovery_points: 5_000_000,
            pmu_quantum: QuantumLen::DEFAULT,
            counter_quantum: QuantumLen::new(3_600_000_000_000).expect("valid"),
            codec_points: 2_000_000,
        }
    }
}

impl BenchOptions {
    /// A small run for tests: same steps, tiny sizes.
    pub fn quick() -> BenchOptions {
        BenchOptions {
            reps: 1,
            ingest_points: 40_000,
            writers: 2,
            ingest_series: 20,
            batch_points: 1_000,
            bytes_points: 30_000,
            day_points: 36_000,
            year_points: 20_000,
            recovery_points: 20_000,
            codec_points: 20_000,
            ..BenchOptions::default()
        }
    }
}

/// Bytes on disk per point after sealing.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BytesPerPoint {
    pub pmu: f64,
    pub counter: f64,
}

/// One codec on one dataset (columns only, in blocks of the dataset's quantum).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CodecFigures {
    pub bytes_per_point: f64,
    pub encode_points_per_s: u64,
    pub decode_points_per_s: u64,
}

/// The codecs compared on one dataset.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CodecComparison {
    pub points_per_block: usize,
    pub pco_level4: CodecFigures,
    pub pco_level8: CodecFigures,
    pub xor: CodecFigures,
}

/// What [`measure`] finds: the JSON document of `timeshard bench store` but its `floor`, which
/// [`run`] adds. The first six keys are fixed by BENCHMARKS.md; the rest are extras.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StoreBenchReport {
    pub ingest_points_per_s: u64,
    pub bytes_per_point: BytesPerPoint,
    pub scan_points_per_s: u64,
    pub agg_day_1m_ms: f64,
    pub agg_year_1h_ms: f64,
    pub recovery_s_per_gb: f64,
    /// Every repetition, for judging the spread.
    pub runs: Runs,
    pub setup: Setup,
    pub codecs: Codecs,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Runs {
    pub ingest_points_per_s: Vec<u64>,
    /// The same ingest by one writer (each write pays its own fsync).
    pub ingest_single_writer_points_per_s: Vec<u64>,
    pub scan_points_per_s: Vec<u64>,
    pub agg_day_1m_ms: Vec<f64>,
    pub agg_year_1h_ms: Vec<f64>,
    pub recovery_s_per_gb: Vec<f64>,
    /// Raw-decoding path for comparison: the same day read raw and aggregated naively.
    pub agg_day_1m_from_raw_ms: Vec<f64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Setup {
    pub reps: usize,
    pub writers: usize,
    pub ingest_series: u32,
    pub ingest_points: usize,
    pub batch_points: usize,
    pub fsync: String,
    pub codec: String,
    pub pmu_quantum_s: f64,
    pub counter_quantum_s: f64,
    /// Allocated (not logical) bytes per point, for the same stores.
    pub allocated_bytes_per_point: BytesPerPoint,
    pub recovery_log_bytes: u64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Codecs {
    pub pmu: CodecComparison,
    pub counter: CodecComparison,
}

/// A benchmark failure.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A result the benchmark checks was wrong (a bug, not a slow run).
    #[error("benchmark check failed: {0}")]
    Check(String),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

fn fresh(dir: &Path, name: &str) -> Result<PathBuf, BenchError> {
    let p = dir.join(name);
    if p.exists() {
        std::fs::remove_dir_all(&p).map_err(io(format!("clearing {}", p.display())))?;
    }
    Ok(p)
}

/// (logical, allocated) bytes of the files under `dir`, the lock file excepted.
fn disk_bytes(dir: &Path) -> Result<(u64, u64), BenchError> {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    for e in std::fs::read_dir(dir).map_err(io(format!("listing {}", dir.display())))? {
        let e = e.map_err(io("listing"))?;
        let md = e.metadata().map_err(io("stat"))?;
        if md.is_dir() {
            let (a, b) = disk_bytes(&e.path())?;
            total.0 += a;
            total.1 += b;
        } else if e.file_name() != "LOCK" {
            total.0 += md.len();
            total.1 += md.blocks() * 512;
        }
    }
    Ok(total)
}

fn settle(store: &DiskStore, now: i64) -> Result<(), BenchError> {
    while store.maintain(now)?.more {}
    Ok(())
}

/// Runs the benchmark as `timeshard bench store` does, in `dir` (`None`: a new directory under
/// the system's temporary directory), which it fills and removes, with the [`Floor`] measured
/// first (fsync in `dir`, round trips to a node started in this process). Returns the JSON
/// document and prints a summary.
pub async fn run(dir: Option<PathBuf>, opts: BenchOptions) -> anyhow::Result<serde_json::Value> {
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("timeshard-bench-store-{}", std::process::id())));
    eprintln!("measuring the store in {} (durable fsync); this takes a few minutes", dir.display());
    let floor = match Floor::measure_with_own_node(&dir).await {
        Ok(floor) => floor,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let report = tokio::task::spawn_blocking(move || {
        let r = measure(&dir, &opts);
        let _ = std::fs::remove_dir_all(&dir);
        r
    })
    .await??;
    let mut value = serde_json::to_value(&report)?;
    value["floor"] = serde_json::to_value(&floor)?;
    println!(
        "ingest {:.0} points/s, {:.2} bytes/point (pmu), scan {:.0} points/s, 1-minute windows over a day {:.2} ms, \
         1-hour windows over a year {:.2} ms",
        report.ingest_points_per_s,
        report.bytes_per_point.pmu,
        report.scan_points_per_s,
        report.agg_day_1m_ms,
        report.agg_year_1h_ms
    );
    println!("{}", floor.summary());
    Ok(value)
}

/// Measures the store in `dir` (which it fills and clears). Takes a few minutes with the
/// default options.
pub fn measure(dir: &Path, opts: &BenchOptions) -> Result<StoreBenchReport, BenchError> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let config = DiskConfig::default();
    let mut r = StoreBenchReport {
        setup: Setup {
            reps: opts.reps,
            writers: opts.writers,
            ingest_series: opts.ingest_series,
            ingest_points: opts.ingest_points,
            batch_points: opts.batch_points,
            fsync: format!("{:?}", config.fsync),
            codec: format!("{:?}", config.codec),
            pmu_quantum_s: opts.pmu_quantum.ns() as f64 / 1e9,
            counter_quantum_s: opts.counter_quantum.ns() as f64 / 1e9,
            ..Setup::default()
        },
        ..StoreBenchReport::default()
    };

    for rep in 0..opts.reps {
        let p = fresh(dir, &format!("ingest-{rep}"))?;
        r.runs.ingest_points_per_s.push(ingest(&p, opts, &config)?);
        std::fs::remove_dir_all(&p).map_err(io("clearing"))?;
    }
    r.ingest_points_per_s = median(&r.runs.ingest_points_per_s);
    // For comparison: one writer, so no two writes share an fsync.
    let single = BenchOptions { writers: 1, ..opts.clone() };
    for rep in 0..opts.reps {
        let p = fresh(dir, &format!("ingest1-{rep}"))?;
        r.runs.ingest_single_writer_points_per_s.push(ingest(&p, &single, &config)?);
        std::fs::remove_dir_all(&p).map_err(io("clearing"))?;
    }

    // Bytes per point: 10 series of each dataset, sealed.
    let per = opts.bytes_points / 10;
    for (name, is_pmu) in [("bytes-pmu", true), ("bytes-counter", false)] {
        let p = fresh(dir, name)?;
        let store = DiskStore::open(&p, config.clone())?;
        for s in 0..10u32 {
            let (key, len, pts): (SeriesKey, QuantumLen, Vec<Point>) = if is_pmu {
                (pmu_series(s), opts.pmu_quantum, pmu_points(s, 0, per).collect())
            } else {
                (counter_series(s), opts.counter_quantum, counter_points(s, per).collect())
            };
            for chunk in pts.chunks(opts.batch_points) {
                store.write(&to_blocks(&key, len, chunk))?;
            }
        }
        settle(&store, i64::MAX / 2)?;
        drop(store);
        let (logical, allocated) = disk_bytes(&p)?;
        let n = (per * 10) as f64;
        if is_pmu {
            r.bytes_per_point.pmu = logical as f64 / n;
            r.setup.allocated_bytes_per_point.pmu = allocated as f64 / n;
        } else {
            r.bytes_per_point.counter = logical as f64 / n;
            r.setup.allocated_bytes_per_point.counter = allocated as f64 / n;
        }
        std::fs::remove_dir_all(&p).map_err(io("clearing"))?;
    }

    day_and_year(dir, opts, &config, &mut r)?;

    for rep in 0..opts.reps {
        let p = fresh(dir, &format!("recovery-{rep}"))?;
        let (s_per_gb, bytes) = recovery(&p, opts, &config)?;
        r.runs.recovery_s_per_gb.push(s_per_gb);
        r.setup.recovery_log_bytes = bytes;
        std::fs::remove_dir_all(&p).map_err(io("clearing"))?;
    }
    r.recovery_s_per_gb = median(&r.runs.recovery_s_per_gb);

    let pmu: Vec<Point> = pmu_points(0, 0, opts.codec_points).collect();
    let counter: Vec<Point> = counter_points(0, opts.codec_points).collect();
    r.codecs.pmu = compare_codecs(&pmu, opts.pmu_quantum, opts.reps);
    r.codecs.counter = compare_codecs(&counter, opts.counter_quantum, opts.reps);
    Ok(r)
}

/// Durable ingest of `pmu` data by concurrent writers, with maintenance running as on a node
/// (its clock follows the data, as for live devices). Returns points per second.
fn ingest(dir: &Path, opts: &BenchOptions, config: &DiskConfig) -> Result<u64, BenchError> {
    let store = DiskStore::open(dir, config.clone())?;
    let writers = opts.writers.max(1);
    let per_writer = (opts.ingest_series as usize).div_ceil(writers);
    // Each writer owns `per_writer` series; a batch holds `ticks` consecutive samples of each.
    let ticks = (opts.batch_points / per_writer).max(1);
    let samples = opts.ingest_points / opts.ingest_series as usize;
    let batches: Vec<Vec<Vec<BlockPoints>>> = (0..writers)
        .map(|w| {
            let series: Vec<u32> =
                (w * per_writer..((w + 1) * per_writer).min(opts.ingest_series as usize)).map(|s| s as u32).collect();
            (0..samples.div_ceil(ticks))
                .map(|b| {
                    let first = (b * ticks) as u64;
                    let n = ticks.min(samples - b * ticks);
                    series
                        .iter()
                        .flat_map(|&s| {
                            let pts: Vec<Point> = pmu_points(s, first, n).collect();
                            to_blocks(&pmu_series(s), opts.pmu_quantum, &pts)
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let total: usize = batches.iter().flatten().flatten().map(|b| b.points.len()).sum();
    let clock = AtomicI64::new(T0_NS);
    let done = AtomicBool::new(false);
    let store = Arc::new(store);
    let start = Instant::now();
    let result: Result<(), BenchError> = std::thread::scope(|s| {
        let maint = s.spawn(|| -> Result<(), BenchError> {
            while !done.load(Ordering::Relaxed) {
                if !store.maintain(clock.load(Ordering::Relaxed))?.more {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            Ok(())
        });
        let handles: Vec<_> = batches
            .iter()
            .map(|mine| {
                let (store, clock) = (&store, &clock);
                s.spawn(move || -> Result<(), BenchError> {
                    for batch in mine {
                        store.write(batch)?;
                        if let Some(last) = batch.last().and_then(|b| b.points.last()) {
                            clock.fetch_max(last.ts, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut r = Ok(());
        for h in handles {
            r = r.and(h.join().expect("writer thread"));
        }
        done.store(true, Ordering::Relaxed);
        r.and(maint.join().expect("maintenance thread"))
    });
    let elapsed = start.elapsed().as_secs_f64();
    result?;
    Ok((total as f64 / elapsed) as u64)
}

fn day_and_year(
    dir: &Path,
    opts: &BenchOptions,
    config: &DiskConfig,
    r: &mut StoreBenchReport,
) -> Result<(), BenchError> {
    // One day of one pmu series, sealed.
    let p = fresh(dir, "day")?;
    let store = DiskStore::open(&p, config.clone())?;
    let key = pmu_series(0);
    let mut i = 0;
    while i < opts.day_points {
        let n = opts.batch_points.min(opts.day_points - i);
        let pts: Vec<Point> = pmu_points(0, i as u64, n).collect();
        store.write(&to_blocks(&key, opts.pmu_quantum, &pts))?;
        i += n;
    }
    settle(&store, i64::MAX / 2)?;
    let day_ns = (opts.day_points as i64) * 1_000_000_000 / 60;
    let day = TimeRange::new(T0_NS, T0_NS + day_ns).map_err(|e| BenchError::Check(e.to_string()))?;
    let minute = 60_000_000_000;
    for _ in 0..opts.reps.max(3) {
        let start = Instant::now();
        let mut n = 0usize;
        let mut after = None;
        loop {
            let page = store.read(&key, day, after, 100_000)?;
            n += page.points.len();
            after = page.points.last().map(Point::key);
            if !page.more {
                break;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        if n != opts.day_points {
            return Err(BenchError::Check(format!("scan returned {n} points, expected {}", opts.day_points)));
        }
        r.runs.scan_points_per_s.push((n as f64 / secs) as u64);

        let start = Instant::now();
        let w = store.aggregate(&key, day, Grid::epoch(minute))?;
        r.runs.agg_day_1m_ms.push(start.elapsed().as_secs_f64() * 1e3);
        // Windows are aligned to the epoch; T0 is not on a minute boundary.
        let want = (day.end() - 1).div_euclid(minute) - day.start().div_euclid(minute) + 1;
        if w.len() as i64 != want || w.iter().map(|w| w.count).sum::<u64>() != opts.day_points as u64 {
            return Err(BenchError::Check(format!("day aggregate made {} windows, expected {want}", w.len())));
        }

        // For comparison: the same windows computed from a raw read.
        let start = Instant::now();
        let raw = store.read(&key, day, None, usize::MAX)?;
        let mut agg = timeshard_store::agg::Aggregator::new(day, Grid::epoch(minute));
        agg.push_points(&raw.points);
        let w2 = agg.finish();
        r.runs.agg_day_1m_from_raw_ms.push(start.elapsed().as_secs_f64() * 1e3);
        // Sums of summaries add per-block partial sums, so their last bits may differ from a
        // point-by-point sum; everything else must be identical.
        let same = w2.len() == w.len()
            && w.iter().zip(&w2).all(|(a, b)| {
                (a.start, a.end, a.count, a.first_ts, a.last_ts) == (b.start, b.end, b.count, b.first_ts, b.last_ts)
                    && (a.min, a.max, a.first, a.last) == (b.min, b.max, b.first, b.last)
                    && (a.sum - b.sum).abs() <= 1e-9 * (1.0 + a.sum.abs())
            });
        if !same {
            let diff = w.iter().zip(&w2).find(|(a, b)| a != b);
            return Err(BenchError::Check(format!(
                "summary and raw aggregates differ ({} vs {} windows), first: {diff:?}",
                w.len(),
                w2.len()
            )));
        }
    }
    r.scan_points_per_s = median(&r.runs.scan_points_per_s);
    r.agg_day_1m_ms = median(&r.runs.agg_day_1m_ms);
    drop(store);
    std::fs::remove_dir_all(&p).map_err(io("clearing"))?;

    // One year of one counter series, sealed.
    let p = fresh(dir, "year")?;
    let store = DiskStore::open(&p, config.clone())?;
    let key = counter_series(0);
    let mut buf = Vec::with_capacity(opts.batch_points);
    for pt in counter_points(0, opts.year_points) {
        buf.push(pt);
        if buf.len() == opts.batch_points {
            store.write(&to_blocks(&key, opts.counter_quantum, &buf))?;
            buf.clear();
        }
    }
    store.write(&to_blocks(&key, opts.counter_quantum, &buf))?;
    settle(&store, i64::MAX / 2)?;
    let year = TimeRange::new(T0_NS, T0_NS + opts.year_points as i64 * 1_000_000_000)
        .map_err(|e| BenchError::Check(e.to_string()))?;
    let hour = 3_600_000_000_000;
    for _ in 0..opts.reps.max(3) {
        let start = Instant::now();
        let w = store.aggregate(&key, year, Grid::epoch(hour))?;
        r.runs.agg_year_1h_ms.push(start.elapsed().as_secs_f64() * 1e3);
        if w.iter().map(|w| w.count).sum::<u64>() != opts.year_points as u64 {
            return Err(BenchError::Check("year aggregate lost points".into()));
        }
    }
    r.agg_year_1h_ms = median(&r.runs.agg_year_1h_ms);
    drop(store);
    std::fs::remove_dir_all(&p).map_err(io("clearing"))?;
    Ok(())
}

/// Writes `recovery_points` without maintenance (all in the log), "kills" the store by dropping
/// it without any shutdown step, and times the reopen. Returns (s per GB of log, log bytes).
fn recovery(dir: &Path, opts: &BenchOptions, config: &DiskConfig) -> Result<(f64, u64), BenchError> {
    let series = opts.ingest_series.max(1);
    let per = opts.recovery_points / series as usize;
    {
        let store = DiskStore::open(dir, config.clone())?;
        let mut first = 0;
        while first < per {
            let n = (opts.batch_points / series as usize).max(1).min(per - first);
            let batch: Vec<BlockPoints> = (0..series)
                .flat_map(|s| {
                    let pts: Vec<Point> = pmu_points(s, first as u64, n).collect();
                    to_blocks(&pmu_series(s), opts.pmu_quantum, &pts)
                })
                .collect();
            store.write(&batch)?;
            first += n;
        }
    }
    let (log_bytes, _) = disk_bytes(&dir.join("wal"))?;
    let start = Instant::now();
    let store = DiskStore::open(dir, config.clone())?;
    let secs = start.elapsed().as_secs_f64();
    let held = store.stats().open_points;
    if held != (per * series as usize) as u64 {
        return Err(BenchError::Check(format!("recovered {held} points, expected {}", per * series as usize)));
    }
    Ok((secs / (log_bytes as f64 / 1e9), log_bytes))
}

/// Compresses (timestamps, values) into two columns.
type EncodeFn<'a> = dyn Fn(&[i64], &[f64]) -> (Vec<u8>, Vec<u8>) + 'a;
/// Decodes two columns of `n` points, returning how many came back.
type DecodeFn<'a> = dyn Fn(&[u8], &[u8], usize) -> usize + 'a;

fn compare_codecs(points: &[Point], len: QuantumLen, reps: usize) -> CodecComparison {
    let mut blocks: Vec<&[Point]> = Vec::new();
    let mut start = 0;
    for i in 1..=points.len() {
        if i == points.len() || len.quantum_of(points[i].ts) != len.quantum_of(points[start].ts) {
            blocks.push(&points[start..i]);
            start = i;
        }
    }
    let per_block = points.len() / blocks.len().max(1);
    let n = points.len() as f64;
    let measure = |enc: &EncodeFn<'_>, dec: &DecodeFn<'_>| {
        let mut figures = Vec::new();
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            let encoded: Vec<(Vec<u8>, Vec<u8>, usize)> = blocks
                .iter()
                .map(|b| {
                    let ts: Vec<i64> = b.iter().map(|p| p.ts).collect();
                    let vs: Vec<f64> = b.iter().map(|p| p.value).collect();
                    let (a, c) = enc(&ts, &vs);
                    (a, c, b.len())
                })
                .collect();
            let enc_s = t.elapsed().as_secs_f64();
            let bytes: usize = encoded.iter().map(|(a, b, _)| a.len() + b.len()).sum();
            let t = Instant::now();
            let decoded: usize = encoded.iter().map(|(a, b, n)| dec(a, b, *n)).sum();
            let dec_s = t.elapsed().as_secs_f64();
            assert_eq!(decoded, points.len(), "codec comparison decoded every point");
            figures.push((bytes as f64 / n, (n / enc_s) as u64, (n / dec_s) as u64));
        }
        figures.sort_by_key(|f| f.1);
        let m = figures[figures.len() / 2];
        CodecFigures { bytes_per_point: m.0, encode_points_per_s: m.1, decode_points_per_s: m.2 }
    };
    let pco_enc = |level: usize| {
        move |ts: &[i64], vs: &[f64]| {
            let cfg = pco::ChunkConfig::default().with_compression_level(level);
            (
                pco::standalone::simple_compress(ts, &cfg).expect("pco compresses i64"),
                pco::standalone::simple_compress(vs, &cfg).expect("pco compresses f64"),
            )
        }
    };
    let pco_dec = |a: &[u8], b: &[u8], _n: usize| {
        let ts: Vec<i64> = pco::standalone::simple_decompress(a).expect("round trip");
        let vs: Vec<f64> = pco::standalone::simple_decompress(b).expect("round trip");
        ts.len().min(vs.len())
    };
    let xor_enc = |ts: &[i64], vs: &[f64]| (xor::encode_ts(ts), xor::encode_values(vs));
    let xor_dec = |a: &[u8], b: &[u8], n: usize| {
        let ts = xor::decode_ts(a, n).expect("round trip");
        let vs = xor::decode_values(b, n).expect("round trip");
        ts.len().min(vs.len())
    };
    CodecComparison {
        points_per_block: per_block,
        pco_level4: measure(&pco_enc(4), &pco_dec),
        pco_level8: measure(&pco_enc(8), &pco_dec),
        xor: measure(&xor_enc, &xor_dec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_benchmark_runs_and_checks_itself() {
        let dir = tempfile::tempdir().unwrap();
        let r = measure(dir.path(), &BenchOptions::quick()).unwrap();
        assert!(r.ingest_points_per_s > 0 && r.scan_points_per_s > 0);
        assert!(r.bytes_per_point.pmu > 0.0 && r.bytes_per_point.counter > 0.0);
        assert!(r.recovery_s_per_gb > 0.0);
        let json = serde_json::to_value(&r).unwrap();
        for key in [
            "ingest_points_per_s",
            "bytes_per_point",
            "scan_points_per_s",
            "agg_day_1m_ms",
            "agg_year_1h_ms",
            "recovery_s_per_gb",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        assert!(json["bytes_per_point"].get("pmu").is_some() && json["bytes_per_point"].get("counter").is_some());
    }
}

//! `timeshard bench tier`: the cold tier (`timeshard-tier`) measured on the real disk: export
//! from a durable hot store ([`DiskStore`]) to an archive in a local directory, Parquet bytes per
//! point, a day of one 60 Hz series read cold and hot, and 1-hour windows over a cold year;
//! cold reads again with the archive's files dropped from the page cache.
//! [`measure`] returns a [`TierBenchReport`], [`run`] the benchmark's JSON document with the
//! [`Floor`]. The data are the `pmu` and `counter` datasets of BENCHMARKS.md
//! ([`crate::datasets`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use timeshard_proto::class::{Replication, SeriesClass};
use timeshard_proto::window::Grid;
use timeshard_proto::{KeyFormat, Point, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::{DiskConfig, DiskStore, Store};
use timeshard_tier::{Archive, Config};

use super::floor::Floor;
use super::store::{BenchError, to_blocks};
use crate::datasets::{T0, counter_points, counter_series, pmu_points, pmu_series};
use crate::moto::Moto;
use crate::stats::{median, round3};

/// What to run; `Default` is the benchmark as specified, [`TierOptions::quick`] a smoke run.
#[derive(Clone, Debug)]
pub struct TierOptions {
    /// Repetitions of each timed measurement (medians are reported).
    pub reps: usize,
    /// Points exported by the export measurement, over `export_series` `pmu` series.
    pub export_points: usize,
    pub export_series: u32,
    /// Points of `counter` (10 series) exported for its bytes per point.
    pub counter_points: usize,
    /// Points of the day of `pmu` read cold and hot.
    pub day_points: usize,
    /// Points of the year of `counter` aggregated cold.
    pub year_points: usize,
    /// Points per page of the day reads (as `bench store` scans).
    pub page_points: usize,
    /// Points of the backlog exported after an outage and under the rate cap.
    pub backlog_points: usize,
    /// The rate cap of the capped export (bytes per second).
    pub export_cap_bytes_per_s: u64,
    /// Quantum of the `pmu` class (default 10 s) and of the `counter` class (default 1 h).
    pub pmu_quantum: QuantumLen,
    pub counter_quantum: QuantumLen,
    /// Also read the day and aggregate the year from S3: the archive copied to moto's server
    /// (`moto_server` on the PATH, PyPI `moto[server]`), started for the run.
    pub s3: bool,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            reps: 3,
            export_points: 10_000_000,
            export_series: 10,
            counter_points: 10_000_000,
            day_points: 5_184_000,
            year_points: 31_536_000,
            page_points: 100_000,
            backlog_points: 2_000_000,
            export_cap_bytes_per_s: 1 << 20,
            pmu_quantum: QuantumLen::DEFAULT,
            counter_quantum: QuantumLen::new(3_600_000_000_000).expect("valid"),
            s3: true,
        }
    }
}

impl TierOptions {
    /// A small run for tests: same steps, tiny sizes.
    pub fn quick() -> TierOptions {
        TierOptions {
            reps: 1,
            export_points: 60_000,
            export_series: 3,
            counter_points: 20_000,
            day_points: 36_000,
            year_points: 20_000,
            page_points: 10_000,
            backlog_points: 30_000,
            export_cap_bytes_per_s: 256 << 10,
            s3: false,
            ..TierOptions::default()
        }
    }
}

/// Parquet bytes per point of each dataset.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BytesPerPoint {
    pub pmu: f64,
    pub counter: f64,
}

/// What [`measure`] finds: the JSON document of `timeshard bench tier` but its `floor`, which
/// [`run`] adds. The first five keys are the benchmark's; the rest are extras.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierBenchReport {
    pub export_points_per_s: u64,
    /// Bytes of the points files (what foreign engines read) per point.
    pub parquet_bytes_per_point: BytesPerPoint,
    pub read_day_cold_ms: f64,
    pub read_day_hot_ms: f64,
    /// With the catalog's listing and manifests cached, as on a node that queries the archive.
    pub agg_year_1h_cold_ms: f64,
    /// The day read by a new archive handle with none of the archive's files in the page cache
    /// (dropped before each read): listing, manifests, footers and pages all from the disk.
    pub read_day_uncached_ms: f64,
    /// The year aggregated the same way.
    pub agg_year_1h_uncached_ms: f64,
    /// The day read, and the year aggregated, by a new archive handle from moto's S3 server on
    /// loopback (absent when it was not run): every object over HTTP.
    pub read_day_s3_ms: Option<f64>,
    pub agg_year_1h_s3_ms: Option<f64>,
    /// After an outage (every archive operation failing for a few rounds): MB of points files
    /// per second exporting the backlog once the archive answers again.
    pub backlog_drain_mb_per_s: f64,
    /// The same export under `[tier] rate_limit_bytes_per_sec` = `export_cap_bytes_per_s`:
    /// bytes of points files per second, which should come close to the cap and not pass it.
    pub export_bytes_per_s_capped: u64,
    pub export_cap_bytes_per_s: u64,
    /// The durable store: from the disk having room again (simulated ENOSPC through its
    /// backend) to the first write accepted.
    pub enospc_recovery_s: f64,
    pub runs: Runs,
    pub setup: Setup,
}

/// Every repetition, and figures for comparison.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Runs {
    pub export_points_per_s: Vec<u64>,
    pub read_day_cold_ms: Vec<f64>,
    pub read_day_hot_ms: Vec<f64>,
    pub agg_year_1h_cold_ms: Vec<f64>,
    /// The first cold read of the day and the first cold year aggregate by a new archive
    /// handle: listing, manifests and footers fetched first.
    pub read_day_cold_first_ms: f64,
    pub agg_year_1h_cold_first_ms: f64,
    pub read_day_uncached_ms: Vec<f64>,
    pub agg_year_1h_uncached_ms: Vec<f64>,
    pub read_day_s3_ms: Vec<f64>,
    pub agg_year_1h_s3_ms: Vec<f64>,
    /// Bytes of the archive's files still in the page cache right after they were dropped,
    /// as `fincore` counts them (its largest over the reads; absent without `fincore`).
    pub uncached_resident_bytes: Option<u64>,
    /// The same year aggregated by the hot store.
    pub agg_year_1h_hot_ms: Vec<f64>,
    /// Manifest bytes per point (block summaries; not read by foreign engines).
    pub manifest_bytes_per_point: BytesPerPoint,
    pub backlog_drain_mb_per_s: Vec<f64>,
    pub export_bytes_per_s_capped: Vec<u64>,
    pub enospc_recovery_s: Vec<f64>,
    /// Export rounds that failed during each simulated outage before the archive came back.
    pub outage_failed_rounds: usize,
}

/// How the figures were taken.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Setup {
    pub reps: usize,
    pub export_points: usize,
    pub export_series: u32,
    pub day_points: usize,
    pub year_points: usize,
    pub page_points: usize,
    pub pmu_quantum_s: f64,
    pub counter_quantum_s: f64,
    pub archive: &'static str,
    pub row_group_rows: usize,
    pub verify_after_upload: bool,
    pub hot_store: &'static str,
    /// Value encodings the exporter chose (`dictionary` or `byte_stream_split`).
    pub pmu_value_encoding: String,
    pub counter_value_encoding: String,
    pub files_exported_for_the_year: usize,
}

pub(super) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

pub(super) fn tier(e: timeshard_tier::Error) -> BenchError {
    BenchError::Check(format!("archive: {e}"))
}

pub(super) fn fresh(dir: &Path, name: &str) -> Result<PathBuf, BenchError> {
    let p = dir.join(name);
    if p.exists() {
        std::fs::remove_dir_all(&p).map_err(io(format!("clearing {}", p.display())))?;
    }
    std::fs::create_dir_all(&p).map_err(io(format!("creating {}", p.display())))?;
    Ok(p)
}

pub(super) fn class(name: &str, quantum: QuantumLen) -> SeriesClass {
    SeriesClass {
        name: name.into(),
        metric_prefix: String::new(),
        format: KeyFormat::Qfi,
        quantum,
        replication: Replication::default(),
        coi: None,
    }
}

/// A durable hot store in `dir` holding `series`' points from `points` (written in batches,
/// then sealed).
pub(super) fn hot_store(
    dir: &Path,
    quantum: QuantumLen,
    series: impl IntoIterator<Item = (SeriesKey, Box<dyn Iterator<Item = Point>>)>,
) -> Result<Arc<DiskStore>, BenchError> {
    let store = DiskStore::open(dir, DiskConfig::default())?;
    for (key, points) in series {
        let mut batch = Vec::with_capacity(100_000);
        for p in points {
            batch.push(p);
            if batch.len() == batch.capacity() {
                store.write(&to_blocks(&key, quantum, &batch))?;
                batch.clear();
            }
        }
        store.write(&to_blocks(&key, quantum, &batch))?;
    }
    while store.maintain(i64::MAX / 2)?.more {}
    Ok(Arc::new(store))
}

pub(super) fn blocks_of(hot: &dyn Store) -> Result<Vec<(SeriesKey, Quantum)>, BenchError> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = hot.list_blocks(cursor, 10_000)?;
        out.extend(page.blocks.into_iter().map(|b| (b.series, b.quantum)));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

/// Bytes of the files under `dir` whose path contains `part`.
fn bytes_under(dir: &Path, part: &str) -> Result<u64, BenchError> {
    let mut total = 0;
    for path in files_under(dir)? {
        if path.to_string_lossy().contains(part) {
            total += std::fs::metadata(&path).map_err(io("stat"))?.len();
        }
    }
    Ok(total)
}

fn archive(dir: &Path) -> Result<Archive, BenchError> {
    Archive::open(dir.to_str().unwrap_or("."), Config::for_node("bench")).map_err(tier)
}

/// Runs the benchmark as `timeshard bench tier` does, in `dir` (`None`: a new directory under
/// the system's temporary directory), which it fills and removes, with the [`Floor`] measured
/// first. Returns the JSON document and prints a summary.
pub async fn run(dir: Option<PathBuf>, opts: TierOptions) -> anyhow::Result<serde_json::Value> {
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("timeshard-bench-tier-{}", std::process::id())));
    eprintln!("measuring the cold tier in {}; this takes a few minutes", dir.display());
    let floor = match Floor::measure_with_own_node(&dir).await {
        Ok(floor) => floor,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let mut opts = opts;
    if opts.s3 && !moto_installed() {
        eprintln!("moto_server is not on the PATH (pip install 'moto[server]'): the reads from S3 are left out");
        opts.s3 = false;
    }
    let report = measure(&dir, &opts).await;
    let _ = std::fs::remove_dir_all(&dir);
    let report = report?;
    let mut value = serde_json::to_value(&report)?;
    value["floor"] = serde_json::to_value(&floor)?;
    if let (Some(day), Some(year)) = (report.read_day_s3_ms, report.agg_year_1h_s3_ms) {
        println!(
            "from moto's S3 server on loopback, by a new archive handle: the day in {day:.1} ms, the year's 1-hour windows in {year:.1} ms"
        );
    }
    println!(
        "export {:.0} points/s, {:.2} Parquet bytes/point (pmu), {:.2} (counter); a day of 60 Hz read cold in {:.1} ms \
         ({:.1} ms not in the page cache), hot in {:.1} ms; 1-hour windows over a cold year in {:.2} ms ({:.2} ms not \
         cached); a backlog drained at {:.1} MB/s after an outage, {} B/s under a cap of {}; writes again {:.4} s after \
         ENOSPC cleared",
        report.export_points_per_s,
        report.parquet_bytes_per_point.pmu,
        report.parquet_bytes_per_point.counter,
        report.read_day_cold_ms,
        report.read_day_uncached_ms,
        report.read_day_hot_ms,
        report.agg_year_1h_cold_ms,
        report.agg_year_1h_uncached_ms,
        report.backlog_drain_mb_per_s,
        report.export_bytes_per_s_capped,
        report.export_cap_bytes_per_s,
        report.enospc_recovery_s
    );
    println!("{}", floor.summary());
    Ok(value)
}

/// Measures the cold tier in `dir` (which it fills and clears).
pub async fn measure(dir: &Path, opts: &TierOptions) -> Result<TierBenchReport, BenchError> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let defaults = Config::for_node("bench");
    let mut r = TierBenchReport {
        setup: Setup {
            reps: opts.reps,
            export_points: opts.export_points,
            export_series: opts.export_series,
            day_points: opts.day_points,
            year_points: opts.year_points,
            page_points: opts.page_points,
            pmu_quantum_s: opts.pmu_quantum.ns() as f64 / 1e9,
            counter_quantum_s: opts.counter_quantum.ns() as f64 / 1e9,
            archive: "local directory (fsync)",
            row_group_rows: defaults.export.row_group_rows,
            verify_after_upload: defaults.export.verify,
            hot_store: "DiskStore, durable, sealed",
            ..Setup::default()
        },
        ..TierBenchReport::default()
    };
    export(dir, opts, &mut r).await?;
    counter_bytes(dir, opts, &mut r).await?;
    read_day(dir, opts, &mut r).await?;
    agg_year(dir, opts, &mut r).await?;
    super::tier_outage::outage(dir, opts, &mut r).await?;
    Ok(r)
}

/// One exporter, `pmu` series: points per second and bytes per point.
async fn export(dir: &Path, opts: &TierOptions, r: &mut TierBenchReport) -> Result<(), BenchError> {
    let per = opts.export_points / opts.export_series.max(1) as usize;
    let hot_dir = fresh(dir, "export-hot")?;
    let series = (0..opts.export_series).map(|s| {
        let points: Box<dyn Iterator<Item = Point>> = Box::new(pmu_points(s, 0, per));
        (pmu_series(s), points)
    });
    let hot = hot_store(&hot_dir, opts.pmu_quantum, series)?;
    let blocks = blocks_of(&*hot)?;
    let pmu = class("pmu", opts.pmu_quantum);
    for rep in 0..opts.reps {
        let adir = fresh(dir, &format!("export-archive-{rep}"))?;
        let archive = archive(&adir)?;
        let start = Instant::now();
        let report = archive.export(hot.clone(), &pmu, blocks.clone()).await.map_err(tier)?;
        let secs = start.elapsed().as_secs_f64();
        if report.rows != (per * opts.export_series as usize) as u64 || report.confirmed.len() != blocks.len() {
            return Err(BenchError::Check(format!("export wrote {} rows for {} blocks", report.rows, blocks.len())));
        }
        r.runs.export_points_per_s.push((report.rows as f64 / secs) as u64);
        let rows = report.rows as f64;
        r.parquet_bytes_per_point.pmu = round3(bytes_under(&adir, "/points/")? as f64 / rows);
        r.runs.manifest_bytes_per_point.pmu = round3(bytes_under(&adir, "/manifests/")? as f64 / rows);
        r.setup.pmu_value_encoding = value_encoding(&archive).await?;
        std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;
    }
    r.export_points_per_s = median(&r.runs.export_points_per_s);
    drop(hot);
    std::fs::remove_dir_all(&hot_dir).map_err(io("clearing"))?;
    Ok(())
}

/// The value encoding of the first manifest of an archive.
async fn value_encoding(archive: &Archive) -> Result<String, BenchError> {
    let status = archive.status().await.map_err(tier)?;
    let Some(c) = status.classes.first() else { return Ok(String::new()) };
    use timeshard_tier::layout::{Kind, Owner};
    let folder = timeshard_tier::FileId::class_prefix(Owner::Node(&archive.config().node), Kind::Manifest, &c.class);
    let metas: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(archive.store().list(Some(&folder)))
        .await
        .map_err(|e| BenchError::Check(e.to_string()))?;
    for m in metas {
        if let Some((id, _)) = timeshard_tier::FileId::parse(&m.location) {
            let manifest =
                timeshard_tier::manifest::Manifest::open(&**archive.store(), &id, None).await.map_err(tier)?;
            return Ok(manifest.header.value_encoding);
        }
    }
    Ok(String::new())
}

/// Bytes per point of `counter` (10 series, 1 Hz, hourly quanta).
async fn counter_bytes(dir: &Path, opts: &TierOptions, r: &mut TierBenchReport) -> Result<(), BenchError> {
    let per = opts.counter_points / 10;
    let hot_dir = fresh(dir, "counter-hot")?;
    let series = (0..10u32).map(|s| {
        let points: Box<dyn Iterator<Item = Point>> = Box::new(counter_points(s, per));
        (counter_series(s), points)
    });
    let hot = hot_store(&hot_dir, opts.counter_quantum, series)?;
    let adir = fresh(dir, "counter-archive")?;
    let archive = archive(&adir)?;
    let report =
        archive.export(hot.clone(), &class("counter", opts.counter_quantum), blocks_of(&*hot)?).await.map_err(tier)?;
    let rows = report.rows as f64;
    r.parquet_bytes_per_point.counter = round3(bytes_under(&adir, "/points/")? as f64 / rows);
    r.runs.manifest_bytes_per_point.counter = round3(bytes_under(&adir, "/manifests/")? as f64 / rows);
    r.setup.counter_value_encoding = value_encoding(&archive).await?;
    drop(hot);
    std::fs::remove_dir_all(&hot_dir).map_err(io("clearing"))?;
    std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;
    Ok(())
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).map_err(io(format!("listing {}", d.display())))? {
            let path = entry.map_err(io("listing"))?.path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
    }
    Ok(files)
}

/// Drops every file under `dir` from the page cache: written back first (dirty pages stay
/// cached), then `posix_fadvise(DONTNEED)`. Returns what `fincore` still counts resident, if it
/// is installed, as a check that the drop took.
fn drop_from_page_cache(dir: &Path) -> Result<Option<u64>, BenchError> {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let files = files_under(dir)?;
    for path in &files {
        let file = std::fs::File::open(path).map_err(io("opening an archive file"))?;
        file.sync_all().map_err(io("writing an archive file back"))?;
        posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            .map_err(|e| BenchError::Check(format!("dropping {} from the page cache: {e}", path.display())))?;
    }
    let Ok(out) = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
        .args(&files)
        .output()
    else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(out.status.success().then(|| text.lines().filter_map(|l| l.trim().parse::<u64>().ok()).sum()))
}

/// The archive in `dir` copied to a bucket on a moto server started for it: the server (kept
/// running while it is held) and the archive's URL and options.
async fn on_s3(dir: &Path) -> Result<(Moto, String, Vec<(String, String)>), BenchError> {
    let check = |what: &str, e: &dyn std::fmt::Display| BenchError::Check(format!("{what}: {e}"));
    let mut moto = Moto::reserve();
    moto.start("bench-tier").map_err(|e| check("starting moto's S3 server", &e))?;
    let options = moto.options();
    let store = timeshard_tier::location::Location::parse("s3://bench-tier/archive")
        .and_then(|l| l.open(&options, std::time::Duration::from_secs(60)))
        .map_err(tier)?;
    for path in files_under(dir)? {
        let key = path.strip_prefix(dir).map_err(|e| check("an archive path", &e))?.to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).map_err(io("reading an archive file"))?;
        object_store::ObjectStoreExt::put(&*store, &object_store::path::Path::from(key), bytes.into())
            .await
            .map_err(|e| check("copying the archive to S3", &e))?;
    }
    Ok((moto, "s3://bench-tier/archive".into(), options))
}

/// Whether moto's S3 server can be started (`moto_server` on the PATH).
fn moto_installed() -> bool {
    std::process::Command::new("moto_server")
        .arg("--help")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// Keeps the largest of the resident bytes seen after drops.
fn note_resident(r: &mut TierBenchReport, resident: Option<u64>) {
    if let Some(b) = resident {
        r.runs.uncached_resident_bytes = Some(r.runs.uncached_resident_bytes.unwrap_or(0).max(b));
    }
}

/// A day of one 60 Hz series read in pages, from the archive and from the hot store.
async fn read_day(dir: &Path, opts: &TierOptions, r: &mut TierBenchReport) -> Result<(), BenchError> {
    let hot_dir = fresh(dir, "day-hot")?;
    let key = pmu_series(0);
    let points: Box<dyn Iterator<Item = Point>> = Box::new(pmu_points(0, 0, opts.day_points));
    let hot = hot_store(&hot_dir, opts.pmu_quantum, [(key.clone(), points)])?;
    let adir = fresh(dir, "day-archive")?;
    let pmu = class("pmu", opts.pmu_quantum);
    archive(&adir)?.export(hot.clone(), &pmu, blocks_of(&*hot)?).await.map_err(tier)?;
    let day_ns = (opts.day_points as i64) * 1_000_000_000 / 60;
    let day = TimeRange::new(T0, T0 + day_ns).map_err(|e| BenchError::Check(e.to_string()))?;
    let check = |n: usize| {
        if n == opts.day_points {
            Ok(())
        } else {
            Err(BenchError::Check(format!("read {n} points, expected {}", opts.day_points)))
        }
    };
    let read_all = |cold: Archive| {
        let (pmu, key) = (pmu.clone(), key.clone());
        async move {
            let start = Instant::now();
            let mut n = 0;
            let mut after = None;
            loop {
                let page = cold.read(&pmu, &key, day, after, opts.page_points).await.map_err(tier)?;
                n += page.points.len();
                after = page.points.last().map(Point::key);
                if !page.more {
                    break;
                }
            }
            Ok::<_, BenchError>((start.elapsed().as_secs_f64() * 1e3, n, cold))
        }
    };
    let mut cold = archive(&adir)?;
    for rep in 0..opts.reps.max(3) + 1 {
        let (ms, n, kept) = read_all(cold).await?;
        cold = kept;
        check(n)?;
        if rep == 0 {
            r.runs.read_day_cold_first_ms = round3(ms);
        } else {
            r.runs.read_day_cold_ms.push(round3(ms));
            // Not cached: a new handle, and the files dropped from the page cache.
            let resident = drop_from_page_cache(&adir)?;
            note_resident(r, resident);
            let (ms, n, _) = read_all(archive(&adir)?).await?;
            check(n)?;
            r.runs.read_day_uncached_ms.push(round3(ms));
        }

        let hot = Arc::clone(&hot);
        let (key, page_points) = (key.clone(), opts.page_points);
        let (ms, n) = tokio::task::spawn_blocking(move || -> Result<(f64, usize), BenchError> {
            let start = Instant::now();
            let mut n = 0;
            let mut after = None;
            loop {
                let page = hot.read(&key, day, after, page_points)?;
                n += page.points.len();
                after = page.points.last().map(Point::key);
                if !page.more {
                    break;
                }
            }
            Ok((start.elapsed().as_secs_f64() * 1e3, n))
        })
        .await
        .map_err(|e| BenchError::Check(e.to_string()))??;
        check(n)?;
        if rep > 0 {
            r.runs.read_day_hot_ms.push(round3(ms));
        }
    }
    if opts.s3 {
        let (_moto, url, options) = on_s3(&adir).await?;
        for _ in 0..opts.reps.max(3) {
            let s3 = Archive::open_with_options(&url, &options, Config::for_node("bench")).map_err(tier)?;
            let (ms, n, _) = read_all(s3).await?;
            check(n)?;
            r.runs.read_day_s3_ms.push(round3(ms));
        }
        r.read_day_s3_ms = Some(median(&r.runs.read_day_s3_ms));
    }
    r.read_day_cold_ms = median(&r.runs.read_day_cold_ms);
    r.read_day_uncached_ms = median(&r.runs.read_day_uncached_ms);
    r.read_day_hot_ms = median(&r.runs.read_day_hot_ms);
    drop(hot);
    std::fs::remove_dir_all(&hot_dir).map_err(io("clearing"))?;
    std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;
    Ok(())
}

/// 1-hour windows over a year of one `counter` series, from the archive (answered from block
/// summaries) and, for comparison, from the hot store.
async fn agg_year(dir: &Path, opts: &TierOptions, r: &mut TierBenchReport) -> Result<(), BenchError> {
    let hot_dir = fresh(dir, "year-hot")?;
    let key = counter_series(0);
    let points: Box<dyn Iterator<Item = Point>> = Box::new(counter_points(0, opts.year_points));
    let hot = hot_store(&hot_dir, opts.counter_quantum, [(key.clone(), points)])?;
    let adir = fresh(dir, "year-archive")?;
    let counter = class("counter", opts.counter_quantum);
    let report = archive(&adir)?.export(hot.clone(), &counter, blocks_of(&*hot)?).await.map_err(tier)?;
    r.setup.files_exported_for_the_year = report.files.len();
    let year = TimeRange::new(T0, T0 + opts.year_points as i64 * 1_000_000_000)
        .map_err(|e| BenchError::Check(e.to_string()))?;
    let hour = 3_600_000_000_000;
    let want = {
        let hot = Arc::clone(&hot);
        let key = key.clone();
        tokio::task::spawn_blocking(move || hot.aggregate(&key, year, Grid::epoch(hour)))
            .await
            .map_err(|e| BenchError::Check(e.to_string()))??
    };
    let aggregate = |cold: Archive| {
        let (counter, key, want) = (&counter, &key, &want);
        async move {
            let start = Instant::now();
            let windows = cold.aggregate(counter, key, year, Grid::epoch(hour)).await.map_err(tier)?;
            let ms = round3(start.elapsed().as_secs_f64() * 1e3);
            let same = windows.len() == want.len()
                && windows.iter().zip(want).all(|(a, b)| (a.start, a.count, a.digest) == (b.start, b.count, b.digest));
            if !same {
                return Err(BenchError::Check(format!("cold year: {} windows, hot: {}", windows.len(), want.len())));
            }
            Ok((ms, cold))
        }
    };
    let mut cold = archive(&adir)?;
    for rep in 0..opts.reps.max(3) + 1 {
        let (ms, kept) = aggregate(cold).await?;
        cold = kept;
        if rep == 0 {
            r.runs.agg_year_1h_cold_first_ms = ms;
        } else {
            r.runs.agg_year_1h_cold_ms.push(ms);
            // Not cached: a new handle, and the files dropped from the page cache.
            let resident = drop_from_page_cache(&adir)?;
            note_resident(r, resident);
            r.runs.agg_year_1h_uncached_ms.push(aggregate(archive(&adir)?).await?.0);
        }
        let (hot, key) = (Arc::clone(&hot), key.clone());
        let ms = tokio::task::spawn_blocking(move || -> Result<f64, BenchError> {
            let start = Instant::now();
            hot.aggregate(&key, year, Grid::epoch(hour))?;
            Ok(round3(start.elapsed().as_secs_f64() * 1e3))
        })
        .await
        .map_err(|e| BenchError::Check(e.to_string()))??;
        r.runs.agg_year_1h_hot_ms.push(ms);
    }
    if opts.s3 {
        let (_moto, url, options) = on_s3(&adir).await?;
        for _ in 0..opts.reps.max(3) {
            let s3 = Archive::open_with_options(&url, &options, Config::for_node("bench")).map_err(tier)?;
            r.runs.agg_year_1h_s3_ms.push(aggregate(s3).await?.0);
        }
        r.agg_year_1h_s3_ms = Some(median(&r.runs.agg_year_1h_s3_ms));
    }
    r.agg_year_1h_cold_ms = median(&r.runs.agg_year_1h_cold_ms);
    r.agg_year_1h_uncached_ms = median(&r.runs.agg_year_1h_uncached_ms);
    drop(hot);
    std::fs::remove_dir_all(&hot_dir).map_err(io("clearing"))?;
    std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quick_run_has_every_figure() {
        let dir = tempfile::tempdir().unwrap();
        let r = measure(dir.path(), &TierOptions::quick()).await.unwrap();
        let json = serde_json::to_value(&r).unwrap();
        for key in [
            "export_points_per_s",
            "read_day_cold_ms",
            "read_day_hot_ms",
            "agg_year_1h_cold_ms",
            "read_day_uncached_ms",
            "agg_year_1h_uncached_ms",
            "backlog_drain_mb_per_s",
            "export_bytes_per_s_capped",
            "enospc_recovery_s",
        ] {
            assert!(json[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {json}");
        }
        assert!(r.parquet_bytes_per_point.pmu > 0.0 && r.parquet_bytes_per_point.counter > 0.0, "{json}");
        assert!(!r.setup.pmu_value_encoding.is_empty(), "{json}");
        assert!(r.export_bytes_per_s_capped <= r.export_cap_bytes_per_s * 11 / 10, "the cap holds: {json}");
        assert!(r.runs.outage_failed_rounds > 0, "{json}");
        // Where fincore is installed, the archive's files really left the page cache.
        if let Some(resident) = r.runs.uncached_resident_bytes {
            assert!(resident < 64 << 10, "{resident} bytes still cached: {json}");
        }
    }
}

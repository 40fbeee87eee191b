//! `timeshard bench ...`: benchmarks that write one JSON document each (see BENCHMARKS.md).
//! They measure; they never pass or fail.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

pub mod paper;
pub mod policy;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The seed paper's Tables I and II plus batched ingest, on a local cluster of node processes.
    Paper(paper::PaperArgs),
    /// One node's storage engine on the real disk: ingest, bytes per point, scan, aggregates,
    /// recovery.
    Store(StoreArgs),
    /// WebAssembly policies: per-point cost, call overhead, instantiation, deadline stop, and
    /// push-down on a cluster of node processes. Needs guest/build.sh first.
    Policy(policy::PolicyArgs),
}

/// Options of `bench store`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Directory on the disk to measure (filled and removed); default: a new one under the
    /// system's temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Paper(a) => paper::run(a).await,
        BenchCommand::Store(a) => store(a).await,
        BenchCommand::Policy(a) => policy::run(a).await,
    }
}

async fn store(args: StoreArgs) -> Result<()> {
    use timeshard_testkit::bench::store::{self as bench, BenchOptions};
    let dir =
        args.dir.unwrap_or_else(|| std::env::temp_dir().join(format!("timeshard-bench-store-{}", std::process::id())));
    let opts = if args.quick { BenchOptions::quick() } else { BenchOptions::default() };
    eprintln!("measuring the store in {} (durable fsync); this takes a few minutes", dir.display());
    let report = tokio::task::spawn_blocking(move || {
        let r = bench::run(&dir, &opts);
        let _ = std::fs::remove_dir_all(&dir);
        r
    })
    .await??;
    let value = serde_json::to_value(&report)?;
    println!(
        "ingest {:.0} points/s, {:.2} bytes/point (pmu), scan {:.0} points/s, 1-minute windows over a day {:.2} ms, \
         1-hour windows over a year {:.2} ms",
        report.ingest_points_per_s,
        report.bytes_per_point.pmu,
        report.scan_points_per_s,
        report.agg_day_1m_ms,
        report.agg_year_1h_ms
    );
    write_json(&args.json, &value)?;
    println!("wrote {}", args.json.display());
    Ok(())
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

//! `timeshard bench ...`: benchmarks that write one JSON document each (see BENCHMARKS.md).
//! They measure; they never pass or fail.

use std::path::Path;

use anyhow::{Context, Result};
use clap::Subcommand;

pub mod paper;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The seed paper's Tables I and II plus batched ingest, on a local cluster of node processes.
    Paper(paper::PaperArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Paper(a) => paper::run(a).await,
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

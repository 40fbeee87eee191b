//! Runs `timeshard bench store` (see shared/BENCHMARKS.md) and prints its JSON document.
//!
//! `cargo run --release -p timeshard-store --example bench_store [DIR] [--quick]`
//! DIR defaults to `target/bench-store` (on the real disk, ignored by git; filled and cleared).

use std::path::PathBuf;

use timeshard_store::bench::{self, BenchOptions};

fn main() -> anyhow::Result<()> {
    let mut dir = PathBuf::from("target/bench-store");
    let mut opts = BenchOptions::default();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => opts = BenchOptions::quick(),
            "-h" | "--help" => {
                println!("usage: bench_store [DIR] [--quick]");
                return Ok(());
            }
            other => dir = PathBuf::from(other),
        }
    }
    let report = bench::run(&dir, &opts)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

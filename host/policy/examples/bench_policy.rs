//! Runs `timeshard bench policy` and prints its JSON document (BENCHMARKS.md), writing it to
//! `--json PATH` too when given. Build the guests first (guest/build.sh), then:
//!
//! ```text
//! cargo run --release -p timeshard-policy --example bench_policy -- --json policy.json
//! ```
//!
//! Options: `--guest-dir DIR` (default: the repository's guest/), `--quick` (fewer
//! repetitions, one hour of push-down data).

use std::path::PathBuf;

use anyhow::{Context, bail};
use timeshard_policy::bench;

fn main() -> anyhow::Result<()> {
    let mut json = None;
    let mut guest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest");
    let mut opts = bench::Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = Some(PathBuf::from(args.next().context("--json needs a path")?)),
            "--guest-dir" => guest_dir = PathBuf::from(args.next().context("--guest-dir needs a path")?),
            "--quick" => {
                opts.repetitions = 5;
                opts.loop_samples = 20;
                opts.pushdown_seconds = 3600;
            }
            other => bail!("unknown argument {other:?}; use --json PATH, --guest-dir DIR, --quick"),
        }
    }
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; run with --release for meaningful figures");
    }
    let report = bench::run(&guest_dir, &opts)?;
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(path) = json {
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    eprint!("{}", bench::summary(&report));
    println!("{text}");
    Ok(())
}

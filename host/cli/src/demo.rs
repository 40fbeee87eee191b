//! `timeshard demo`: the demo of `timeshard-testkit` on node processes of this binary.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use timeshard_testkit::demo::{self, DemoOptions};

/// Options of the demo.
#[derive(Debug, Args)]
#[command(long_about = "\
Starts a local cluster of separate node processes on loopback with a generated development CA,
writes a few minutes of 60 Hz PMU data (the `pmu` dataset), reads ranges back and checks every
point, prints what it did and how fast, and stops every node cleanly (also on Ctrl-C).

With --serve the cluster keeps running after the demo, so you can try `timeshard put` and
`timeshard get` against it; Ctrl-C stops it.")]
pub(crate) struct DemoArgs {
    /// Number of node processes.
    #[arg(long, default_value_t = DemoOptions::default().nodes)]
    nodes: usize,
    /// Minutes of 60 Hz data per bus.
    #[arg(long, default_value_t = DemoOptions::default().minutes)]
    minutes: u32,
    /// PMU buses, one series each.
    #[arg(long, default_value_t = DemoOptions::default().buses)]
    buses: u32,
    /// Working directory for certificates, configs, data and logs (default: a new temporary one).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster running after the demo until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// Keep the working directory afterwards.
    #[arg(long)]
    keep: bool,
}

/// Runs the demo.
pub(crate) async fn run(args: DemoArgs) -> Result<()> {
    let binary = std::env::current_exe().context("cannot find the timeshard binary")?;
    let options = DemoOptions {
        nodes: args.nodes,
        minutes: args.minutes,
        buses: args.buses,
        dir: args.dir,
        serve: args.serve,
        keep: args.keep,
    };
    demo::run(&binary, &options).await
}

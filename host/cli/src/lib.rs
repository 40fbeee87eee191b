//! The `timeshard` command line: the node daemon, client commands (put, get, series, query,
//! import, export, status, archive status), policy signing, a development PKI, the demo and the
//! benchmarks. Commands only, one module each, thin over `timeshard-node`, `timeshard-sdk` and
//! `timeshard-testkit`; `put` and `import` share one CSV row parser (`timeshard_formats::csv_points`). The binary
//! calls [`main`].

use anyhow::Result;
use clap::{Parser, Subcommand};

mod archive;
mod bench;
mod conn;
mod demo;
mod export;
mod get;
mod import;
mod node;
mod pki;
mod policy;
mod put;
mod query;
mod rows;
mod series;
mod status;
mod time;

const ABOUT: &str = "timeshard: a time-series store for edge fleets";
const LONG_ABOUT: &str = "\
timeshard stores time-indexed sensor data on the edge devices that produce it. Every device runs
a node; nodes form a Kademlia DHT over QUIC (mutual TLS) and store each series in blocks of one
time quantum, placed by a time-factored key, so reading a range is a parallel fan-out of one
lookup per quantum.

Start here:
  timeshard demo                 start a local 5-node cluster, write and read sample PMU data
  timeshard demo --serve         ... and keep it running for `put` and `get`
  timeshard node --help          run a node: configured by hand, or enrolled with a control plane

Client commands (put, get, status) talk to one node with a client certificate from the fleet
CA; --node and --pki default to $TIMESHARD_NODE and $TIMESHARD_PKI.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "timeshard", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Commands whose arguments carry a `long_about` (with examples) take their one-line summary as
// `about`: a doc comment here would replace that `long_about` in `--help`.
#[derive(Debug, Subcommand)]
enum Command {
    #[command(about = "Run an edge node, configured by hand or enrolled with a control plane")]
    Node(node::NodeArgs),
    #[command(about = "Start a local cluster of node processes, write sample PMU data, read it back, stop")]
    Demo(demo::DemoArgs),
    #[command(about = "Write points: as arguments (TS=VALUE ...) or as CSV on standard input")]
    Put(put::PutArgs),
    #[command(about = "Read a time range of one series as CSV or JSON, raw or in aggregated windows")]
    Get(get::GetArgs),
    /// List the series of the cluster, by metric prefix and tags.
    Series(series::SeriesArgs),
    /// Write the points of a CSV file, in batches, with progress.
    Import(import::ImportArgs),
    /// Write a time range of some series to CSV or Parquet, with progress.
    Export(export::ExportArgs),
    #[command(about = "Run a query policy (WebAssembly) over a time range, pushed down to the nodes that hold it")]
    Query(query::QueryArgs),
    /// Sign policy modules: create a signing key, sign a component.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Show what a node knows of itself and the cluster.
    Status(conn::ConnArgs),
    /// The cold tier: what the archive holds, what a node has pending, its last error.
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// Create a development CA and issue node and client certificates.
    #[command(subcommand)]
    Pki(pki::PkiCommand),
    /// Benchmarks; each writes one JSON document (see BENCHMARKS.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIMESHARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file or journald keeps plain `key=value` fields.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

/// Entry point of the `timeshard` binary.
pub fn main() -> std::process::ExitCode {
    timeshard_alloc::configure();
    let cli = Cli::parse();
    init_logging(if matches!(cli.command, Command::Node(_)) { "info" } else { "warn" });
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Node(a) => node::run(a).await,
        Command::Demo(a) => demo::run(a).await,
        Command::Put(a) => put::run(a).await,
        Command::Get(a) => get::run(a).await,
        Command::Query(a) => query::run(a).await,
        Command::Series(a) => series::run(a).await,
        Command::Import(a) => import::run(a).await,
        Command::Export(a) => export::run(a).await,
        Command::Policy(p) => policy::run(p),
        Command::Status(a) => status::run(a).await,
        Command::Archive(a) => archive::run(a).await,
        Command::Pki(p) => pki::run(p),
        Command::Bench(b) => bench::run(b).await,
    }
}

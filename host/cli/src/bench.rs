//! `timeshard bench ...`: the benchmarks of `timeshard-testkit`, each writing one JSON document
//! (see BENCHMARKS.md). They measure; they never pass or fail.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use timeshard_testkit::bench::coi::{self, CoiOptions};
use timeshard_testkit::bench::fleet::{self, Backends, FleetOptions};
use timeshard_testkit::bench::footprint::{self, FootprintOptions};
use timeshard_testkit::bench::hostile::{self, HostileBenchOptions};
use timeshard_testkit::bench::http::{self, HttpBenchOptions};
use timeshard_testkit::bench::paper::{self, PaperOptions};
use timeshard_testkit::bench::policy::{self, PolicyOptions};
use timeshard_testkit::bench::repair::{self, RepairOptions};
use timeshard_testkit::bench::store::{self, BenchOptions};
use timeshard_testkit::bench::tier::{self, TierOptions};

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// The seed paper's Tables I and II plus batched ingest, on a local cluster of node processes.
    Paper(PaperArgs),
    /// One node's storage engine on the real disk: ingest, bytes per point, scan, aggregates,
    /// recovery.
    Store(StoreArgs),
    /// WebAssembly policies: per-point cost, call overhead, instantiation, deadline stop, and
    /// push-down on a cluster of node processes. Needs guest/build.sh first.
    Policy(PolicyArgs),
    /// The cold tier on the real disk: export points/s, Parquet bytes per point, a day of
    /// 60 Hz read cold and hot, 1-hour windows over a cold year.
    Tier(TierArgs),
    /// The HTTP side: line protocol on one node and on 3 (RF 3, W 2), remote write, and
    /// `/query` windows over a day, on node processes.
    Http(HttpArgs),
    /// Hostile input over HTTP and QUIC, on one node process: a well-behaved client's read p99
    /// during each attack against its p99 without one, and the node's peak RSS against its
    /// memory budget.
    #[command(after_help = HOSTILE_EXAMPLES)]
    Hostile(HostileArgs),
    /// Data following membership on node processes: rebalancing when nodes join, idle
    /// anti-entropy, restoring RF after a departure, hint replay, lost acknowledged points, and
    /// one node's log after live ingest.
    Repair(RepairArgs),
    /// What a node costs an edge device: idle RSS (with and without policies), RSS and CPU
    /// at 10k points/s on 3 nodes (RF 3), binary size per target, Pulley vs Cranelift per
    /// point, virtual size. Needs guest/build.sh first.
    Footprint(FootprintArgs),
    /// Context-of-interest replication (FogStore) on 8 node processes with emulated WAN
    /// latency: latest reads and updates per mode (coi, quorum, eventual), read ratio and key
    /// distribution; a region down; simulated load balance and out-of-CoI distances.
    Coi(CoiArgs),
    /// The control plane at fleet scale, on SQLite and on PostgreSQL: simulated devices
    /// enrolling, class changes reaching every watcher, a policy rollout to all of them, and
    /// the service's memory; then a revocation reaching node processes cut off from the
    /// control plane, through gossip. Runs `timeshard-control serve` processes.
    #[command(after_help = FLEET_EXAMPLES)]
    Fleet(FleetArgs),
}

const HOSTILE_EXAMPLES: &str = "\
Examples:
  timeshard bench hostile --json hostile.json
  timeshard bench hostile --json hostile.json --secs 30 --budget-mib 512
  timeshard bench hostile --json hostile.json --quick      # check it runs (figures not meaningful)
  timeshard bench hostile --json quic.json --only located_nested_100000,quic_idle_connections";

const FLEET_EXAMPLES: &str = "\
Examples:
  timeshard bench fleet --json fleet.json
  timeshard bench fleet --json fleet.json --backend sqlite --devices 200 --rounds 3
  timeshard bench fleet --json fleet.json --backend sqlite --revocations 5 --cut-off 4
  timeshard bench fleet --json fleet.json --backend postgres --database postgres://bench@db.example/bench

Without --database the PostgreSQL figures come from a throwaway server started in a temporary
directory (Debian's `postgresql` package must be installed). Build both programs with --release
for figures worth comparing: cargo build --release --bin timeshard --bin timeshard-control.";

/// Which backends `bench fleet` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FleetBackend {
    Sqlite,
    Postgres,
    Both,
}

/// Options of `bench fleet`.
#[derive(Debug, Args)]
pub(crate) struct FleetArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// The `timeshard-control` program to measure (default: the one beside this binary).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Simulated devices that enroll, then watch.
    #[arg(long, default_value_t = FleetOptions::default().devices)]
    devices: usize,
    /// Enrollments in flight at once.
    #[arg(long, default_value_t = FleetOptions::default().concurrency)]
    concurrency: usize,
    /// Class changes whose propagation to every watcher is timed.
    #[arg(long, default_value_t = FleetOptions::default().rounds)]
    rounds: usize,
    #[arg(long, value_enum, default_value_t = FleetBackend::Both)]
    backend: FleetBackend,
    /// An existing, empty PostgreSQL database to use instead of a throwaway server.
    #[arg(long, env = "TIMESHARD_BENCH_DATABASE", hide_env_values = true)]
    database: Option<String>,
    /// PostgreSQL runs this many `serve` instances on the one database (watchers spread over them).
    #[arg(long, default_value_t = FleetOptions::default().postgres_instances)]
    postgres_instances: usize,
    /// The policy component the rollout figure rolls out (an ingest policy).
    #[arg(long, default_value_os_t = FleetOptions::default().policy_module)]
    policy_module: PathBuf,
    /// Nodes cut off from the control plane while a revocation spreads by gossip.
    #[arg(long, default_value_t = FleetOptions::default().cut_off)]
    cut_off: usize,
    /// Revocations timed on node processes (0: none).
    #[arg(long, default_value_t = FleetOptions::default().revocations)]
    revocations: usize,
}

/// Options of `bench footprint`.
#[derive(Debug, Args)]
pub(crate) struct FootprintArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Points per second written into the 3-node cluster.
    #[arg(long, default_value_t = FootprintOptions::default().rate)]
    rate: u64,
    /// Seconds of that ingest.
    #[arg(long, default_value_t = FootprintOptions::default().secs)]
    secs: u64,
    /// The guest workspace, built by guest/build.sh.
    #[arg(long, default_value_os_t = FootprintOptions::default().guest_dir)]
    guest_dir: PathBuf,
    /// sizes.json of scripts/cross-check (default: <target dir>/cross-check/sizes.json).
    #[arg(long)]
    sizes: Option<PathBuf>,
    /// Working directory (default: a new temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Options of `bench coi`.
#[derive(Debug, Args)]
pub(crate) struct CoiArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Client tasks, colocated with the Atlanta nodes.
    #[arg(long, default_value_t = CoiOptions::default().clients)]
    clients: usize,
    /// Operations per run (mode x read ratio x distribution).
    #[arg(long, default_value_t = CoiOptions::default().ops)]
    ops: usize,
    /// Seeds of the clusters' keys, one cluster each (node ids, and so placement, follow).
    #[arg(long, value_delimiter = ',', default_values_t = CoiOptions::default().seeds)]
    seeds: Vec<u64>,
    /// Working directory (default: a temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Options of `bench http`.
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Connections sending at once.
    #[arg(long, default_value_t = HttpBenchOptions::default().connections)]
    connections: usize,
    /// Seconds of each ingest run.
    #[arg(long, default_value_t = HttpBenchOptions::default().secs)]
    secs: u64,
    /// Runs of each ingest figure (median reported).
    #[arg(long, default_value_t = HttpBenchOptions::default().reps)]
    reps: usize,
    /// Working directory (default: a new temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Options of `bench hostile`.
#[derive(Debug, Args)]
pub(crate) struct HostileArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Seconds of the baseline and of each attack.
    #[arg(long, default_value_t = HostileBenchOptions::default().secs)]
    secs: u64,
    /// The node's memory budget, in MiB.
    #[arg(long, default_value_t = HostileBenchOptions::default().budget >> 20)]
    budget_mib: u64,
    /// Run only these attacks (comma-separated names, as the JSON document gives them).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Working directory (default: a new temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Options of `bench repair`.
#[derive(Debug, Args)]
pub(crate) struct RepairArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Historical `pmu` points loaded before the joins.
    #[arg(long, default_value_t = RepairOptions::default().points)]
    points: usize,
    /// Further historical `pmu` points loaded after the joins, before a node departs: a larger
    /// restore (`restore_rf_s_per_gb`) without a larger rebalance.
    #[arg(long, default_value_t = RepairOptions::default().restore_points)]
    restore_points: usize,
    /// Seconds of live ingest on one node before its log is measured.
    #[arg(long, default_value_t = RepairOptions::default().live_secs)]
    live_secs: u64,
    /// Seconds of the idle anti-entropy measurement.
    #[arg(long, default_value_t = RepairOptions::default().idle_secs)]
    idle_secs: u64,
    /// Working directory (default: a new temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes and short intervals, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Options of `bench paper`.
#[derive(Debug, Args)]
pub(crate) struct PaperArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Node processes.
    #[arg(long, default_value_t = PaperOptions::default().nodes)]
    nodes: usize,
    /// Single-point writes per (format, RF).
    #[arg(long, default_value_t = PaperOptions::default().writes)]
    writes: usize,
    /// Repetitions of each read.
    #[arg(long, default_value_t = PaperOptions::default().read_reps)]
    read_reps: usize,
    /// Seconds of batched ingest.
    #[arg(long, default_value_t = PaperOptions::default().ingest_secs)]
    ingest_secs: u64,
    /// Batches the ingest client keeps in flight.
    #[arg(long, default_value_t = PaperOptions::default().in_flight)]
    in_flight: usize,
    /// Points of the day read_day writes and streams back.
    #[arg(long, default_value_t = PaperOptions::default().day_points)]
    day_points: usize,
    /// Repetitions of the day's read.
    #[arg(long, default_value_t = PaperOptions::default().day_reps)]
    day_reps: usize,
    /// Working directory (default: a new temporary one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Options of `bench store`.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
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

/// Options of `bench policy`.
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// The guest workspace, built by guest/build.sh.
    #[arg(long, default_value_os_t = PolicyOptions::default().guest_dir)]
    guest_dir: PathBuf,
    /// Node processes for the push-down figure.
    #[arg(long, default_value_t = PolicyOptions::default().nodes)]
    nodes: usize,
    /// Seconds of 60 Hz data for the push-down figure (one day by default).
    #[arg(long, default_value_t = PolicyOptions::default().pushdown_seconds)]
    pushdown_seconds: i64,
    /// Repetitions of each push-down measurement (median reported).
    #[arg(long, default_value_t = PolicyOptions::default().reps)]
    reps: usize,
    /// Fewer repetitions and one hour of push-down data, to check the benchmark runs.
    #[arg(long)]
    quick: bool,
}

/// Options of `bench tier`.
#[derive(Debug, Args)]
pub(crate) struct TierArgs {
    /// Where to write the JSON result.
    #[arg(long)]
    json: PathBuf,
    /// Directory on the disk to measure (filled and removed); default: a new one under the
    /// system's temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Repetitions of each timed measurement (medians are reported).
    #[arg(long, default_value_t = TierOptions::default().reps)]
    reps: usize,
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    #[arg(long)]
    quick: bool,
}

/// Runs a benchmark and writes its JSON document.
pub(crate) async fn run(cmd: BenchCommand) -> Result<()> {
    // The cluster benchmarks run node processes of this very binary.
    let binary = || std::env::current_exe().context("cannot find the timeshard binary");
    let (json, report) = match cmd {
        BenchCommand::Paper(a) => {
            let options = PaperOptions {
                nodes: a.nodes,
                writes: a.writes,
                read_reps: a.read_reps,
                day_points: a.day_points,
                day_reps: a.day_reps,
                ingest_secs: a.ingest_secs,
                in_flight: a.in_flight,
                dir: a.dir,
            };
            (a.json, paper::run(&binary()?, &options).await?)
        }
        BenchCommand::Store(a) => {
            let options = if a.quick { BenchOptions::quick() } else { BenchOptions::default() };
            (a.json, store::run(a.dir, options).await?)
        }
        BenchCommand::Tier(a) => {
            let mut options = if a.quick { TierOptions::quick() } else { TierOptions::default() };
            if !a.quick {
                options.reps = a.reps.max(1);
            }
            (a.json, tier::run(a.dir, options).await?)
        }
        BenchCommand::Policy(a) => {
            let options = PolicyOptions {
                guest_dir: a.guest_dir,
                nodes: a.nodes,
                pushdown_seconds: a.pushdown_seconds,
                reps: a.reps,
                quick: a.quick,
            };
            (a.json, policy::run(&binary()?, &options).await?)
        }
        BenchCommand::Http(a) => {
            let options = if a.quick {
                HttpBenchOptions { dir: a.dir, ..HttpBenchOptions::quick() }
            } else {
                HttpBenchOptions {
                    connections: a.connections,
                    secs: a.secs,
                    reps: a.reps,
                    dir: a.dir,
                    ..HttpBenchOptions::default()
                }
            };
            (a.json, http::run(&binary()?, &options).await?)
        }
        BenchCommand::Hostile(a) => {
            let options = if a.quick {
                HostileBenchOptions { dir: a.dir, only: a.only, ..HostileBenchOptions::quick() }
            } else {
                HostileBenchOptions {
                    secs: a.secs,
                    budget: a.budget_mib << 20,
                    only: a.only,
                    dir: a.dir,
                    ..HostileBenchOptions::default()
                }
            };
            (a.json, hostile::run(&binary()?, &options).await?)
        }
        BenchCommand::Repair(a) => {
            let options = if a.quick {
                RepairOptions { dir: a.dir, ..RepairOptions::quick() }
            } else {
                RepairOptions {
                    points: a.points,
                    restore_points: a.restore_points,
                    live_secs: a.live_secs,
                    idle_secs: a.idle_secs,
                    dir: a.dir,
                    ..RepairOptions::default()
                }
            };
            (a.json, repair::run(&binary()?, &options).await?)
        }
        BenchCommand::Footprint(a) => {
            let base = if a.quick { FootprintOptions::quick() } else { FootprintOptions::default() };
            let options = FootprintOptions {
                rate: if a.quick { base.rate } else { a.rate },
                secs: if a.quick { base.secs } else { a.secs },
                guest_dir: a.guest_dir,
                sizes: a.sizes,
                dir: a.dir,
                ..base
            };
            (a.json, footprint::run(&binary()?, &options).await?)
        }
        BenchCommand::Coi(a) => {
            let options = if a.quick {
                CoiOptions { dir: a.dir, ..CoiOptions::quick() }
            } else {
                CoiOptions { clients: a.clients, ops: a.ops, seeds: a.seeds, dir: a.dir, ..CoiOptions::default() }
            };
            (a.json, coi::run(&binary()?, &options).await?)
        }
        BenchCommand::Fleet(a) => {
            let control = match a.control {
                Some(path) => path,
                None => binary()?.with_file_name("timeshard-control"),
            };
            let backend = match a.backend {
                FleetBackend::Sqlite => Backends::Sqlite,
                FleetBackend::Postgres => Backends::Postgres,
                FleetBackend::Both => Backends::Both,
            };
            let options = FleetOptions {
                control,
                devices: a.devices,
                concurrency: a.concurrency,
                rounds: a.rounds,
                backend,
                database: a.database,
                postgres_instances: a.postgres_instances,
                policy_module: a.policy_module,
                node: binary()?,
                cut_off: a.cut_off,
                revocations: a.revocations,
            };
            (a.json, fleet::run(&options).await?)
        }
    };
    write_json(&json, &report)?;
    println!("wrote {}", json.display());
    Ok(())
}

/// Writes `value` as pretty JSON to `path`.
fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

//! The `timeshard` command line: the node daemon, the demo, client commands and benchmarks.

use std::io::{BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use timeshard_proto::{Point, SeriesKey, TimeRange, Timestamp};
use timeshard_sdk::tls::TlsFiles;
use timeshard_sdk::{Client, SeriesPoints};

use timeshard_node::RunningNode;
use timeshard_node::config::NodeConfig;
use timeshard_node::pki::{self, Role};
use timeshard_node::process::{serve_until_stopped, write_ready_file};

const ABOUT: &str = "timeshard: a time-series store for edge fleets";
const LONG_ABOUT: &str = "\
timeshard stores time-indexed sensor data on the edge devices that produce it. Every device runs
a node; nodes form a Kademlia DHT over QUIC (mutual TLS) and store each series in blocks of one
time quantum, placed by a time-factored key, so reading a range is a parallel fan-out of one
lookup per quantum.

Start here:
  timeshard demo                 start a local 5-node cluster, write and read sample PMU data
  timeshard demo --serve         ... and keep it running for `put` and `get`
  timeshard node --help          run a node from a TOML config

Client commands (put, get, status) talk to one node with a client certificate from the fleet
CA; --node and --pki default to $TIMESHARD_NODE and $TIMESHARD_PKI.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "timeshard", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an edge node.
    Node(NodeArgs),
    /// Start a local cluster of node processes, write sample PMU data, read it back, stop.
    Demo(timeshard_node::demo::DemoArgs),
    /// Write points: as arguments (TS=VALUE ...) or as CSV on standard input.
    Put(PutArgs),
    /// Read a time range of one series as CSV or JSON, raw or in aggregated windows.
    Get(GetArgs),
    /// List the series of the cluster, by metric prefix and tags.
    Series(SeriesArgs),
    /// Run a query policy (WebAssembly) over a time range, pushed down to the nodes that hold it.
    Query(QueryArgs),
    /// Sign policy modules: create a signing key, sign a component.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Show what a node knows of itself and the cluster.
    Status(ConnArgs),
    /// Create a development CA and issue node and client certificates.
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Benchmarks; each writes one JSON document (see BENCHMARKS.md).
    #[command(subcommand)]
    Bench(timeshard_node::bench::BenchCommand),
}

/// Runs a node until SIGTERM or Ctrl-C.
#[derive(Debug, Args)]
#[command(long_about = "\
Runs an edge node until SIGTERM or Ctrl-C, then stops cleanly: it stops taking requests, lets the
ones in flight finish, and closes its connections.

Every setting has a default; a config file only needs what differs. `--print-config` shows all
settings with their defaults. The node needs a certificate from the fleet CA: for development,
`timeshard pki init pki && timeshard pki issue pki --name node --role node`.

Example:
  timeshard node --config node.toml
  timeshard node --listen 127.0.0.1:7401 --bootstrap 127.0.0.1:7400 --data-dir data-1")]
struct NodeArgs {
    /// TOML config file; relative paths in it are relative to the file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A node to join through, host:port; repeat for several (overrides `bootstrap`).
    #[arg(long)]
    bootstrap: Vec<String>,
    /// Data directory (overrides `data_dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Once serving, write {"id", "addr", "pid"} as JSON to this file.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

/// Which node to talk to, and with which certificate.
#[derive(Debug, Args)]
struct ConnArgs {
    /// Address of any node of the cluster.
    #[arg(long, env = "TIMESHARD_NODE", default_value = "127.0.0.1:7400")]
    node: SocketAddr,
    /// Directory with ca.pem and the client certificate (as `timeshard pki` writes it).
    #[arg(long, env = "TIMESHARD_PKI", default_value = "timeshard-pki")]
    pki: PathBuf,
    /// Name of the client certificate in the PKI directory (<name>.pem, <name>.key).
    #[arg(long, default_value = "client")]
    cert_name: String,
}

impl ConnArgs {
    async fn connect(&self) -> Result<Client> {
        let tls = TlsFiles::in_dir(&self.pki, &self.cert_name);
        Client::connect(self.node, &tls).await.with_context(|| format!("cannot reach the node at {}", self.node))
    }
}

#[derive(Debug, Args)]
#[command(long_about = "\
Writes points through any node, which places them on their replicas and returns once the write
quorum acknowledged them. Writing the same point twice stores it once, so a failed put can
simply be repeated.

Points as arguments, with the series first:
  timeshard put 'pmu.phase{bus=7,site=atl}' 1700000000000000000=49.98 1700000000016666666=50.01

TS is nanoseconds since the Unix epoch, an RFC 3339 time (2023-11-14T22:13:20Z) or `now`.
Append #N to a point for event id N (several events at one timestamp): 1700000000000000000=3#2.

Without points, CSV is read from standard input: `ts,value[,event]` when the series is given,
otherwise `series,ts,value[,event]` (quote series keys: they contain commas). A header line is
skipped.
  printf '%s\\n' 1700000000000000000,49.98 | timeshard put 'pmu.phase{bus=7,site=atl}'")]
struct PutArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The series, e.g. 'pmu.phase{bus=7,site=atl}'.
    series: Option<String>,
    /// Points as TS=VALUE or TS=VALUE#EVENT.
    points: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Csv,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TimeFormat {
    /// Nanoseconds since the Unix epoch.
    Ns,
    /// RFC 3339 with nanoseconds.
    Rfc3339,
}

#[derive(Debug, Args)]
#[command(long_about = "\
Reads [START, END) of one series (the end is exclusive), trimmed exactly, sorted by time.
With --window, prints one row per window instead (aligned to the epoch, trimmed to the range):
count, min, max, mean, sum, first and last; whole quanta inside a window are answered from
block summaries without reading their points.

Times are nanoseconds since the Unix epoch, RFC 3339 (2023-11-14T22:13:20Z), `now`, or
`now-DURATION` (now-15m).
  timeshard get 'pmu.phase{bus=7,site=atl}' --start 2023-11-14T22:13:20Z --end 2023-11-14T22:16:20Z
  timeshard get 'pmu.phase{bus=7,site=atl}' --start now-1d --end now --window 1m")]
struct GetArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The series, e.g. 'pmu.phase{bus=7,site=atl}'.
    series: String,
    /// First instant of the range.
    #[arg(long)]
    start: String,
    /// First instant after the range.
    #[arg(long)]
    end: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
    /// How timestamps are printed.
    #[arg(long, value_enum, default_value = "ns")]
    time: TimeFormat,
    /// Aggregate in windows of this width (e.g. 10s, 1m, 1h) instead of printing raw points.
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
struct SeriesArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Only series whose metric starts with this.
    #[arg(long, default_value = "")]
    metric: String,
    /// Only series with this tag, NAME=VALUE; repeat for several.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Most series to print.
    #[arg(long, default_value_t = 10_000)]
    limit: u32,
}

#[derive(Debug, Args)]
#[command(long_about = "\
Runs a query policy over [START, END) of one series. The nodes that own each quantum run the
policy over their raw points and send back only a small partial result; the node you talk to
merges them. The policy must be installed and bound to the series on every node ([policy] in
the node configuration).

  timeshard query 'pmu.phase{bus=7,site=atl}' --policy rms --start 2023-11-14T22:13:20Z --end now
  timeshard query 'pmu.phase{bus=7,site=atl}' --policy threshold-crossings --param threshold=49.5 \\
      --start 2023-11-14T22:13:20Z --end now")]
struct QueryArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The series.
    series: String,
    /// The query policy, by name (the version bound on the nodes runs).
    #[arg(long)]
    policy: String,
    /// First instant of the range.
    #[arg(long)]
    start: String,
    /// First instant after the range.
    #[arg(long)]
    end: String,
    /// A parameter for the policy, NAME=VALUE; repeat for several.
    #[arg(long = "param")]
    params: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Create an ed25519 signing key; prints the public key line for the nodes' trusted_keys.
    Keygen {
        /// Where to write the secret key (created with mode 0600; never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a policy component; writes MODULE.sig next to it.
    Sign {
        /// The secret key file from `timeshard policy keygen`.
        #[arg(long)]
        key: PathBuf,
        /// The component (.wasm) to sign.
        module: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum PkiCommand {
    /// Create a development CA (ca.pem, ca.key) in DIR.
    Init {
        /// Directory for the CA.
        dir: PathBuf,
    },
    /// Issue a certificate signed by the CA in DIR, as <name>.pem and <name>.key.
    Issue {
        /// Directory holding the CA.
        dir: PathBuf,
        /// Name of the files (and the certificate's common name).
        #[arg(long)]
        name: String,
        /// What the certificate is for.
        #[arg(long, value_enum)]
        role: Role,
    },
}

/// Parses a time: nanoseconds, RFC 3339, `now`, or `now-DURATION`.
pub fn parse_time(s: &str) -> Result<Timestamp> {
    let s = s.trim();
    let now = || -> Result<i64> {
        let d = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
        Ok(i64::try_from(d.as_nanos())?)
    };
    if let Ok(ns) = s.parse::<i64>() {
        return Ok(ns);
    }
    if s == "now" {
        return now();
    }
    if let Some(ago) = s.strip_prefix("now-") {
        let d = humantime::parse_duration(ago).with_context(|| format!("bad duration in {s:?}"))?;
        return Ok(now()? - i64::try_from(d.as_nanos())?);
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|_| {
        anyhow!(
            "cannot read time {s:?}: use nanoseconds since the epoch, RFC 3339 (2023-11-14T22:13:20Z), now, or now-15m"
        )
    })?;
    let d = t.duration_since(UNIX_EPOCH).map_err(|_| anyhow!("time {s:?} is before 1970"))?;
    Ok(i64::try_from(d.as_nanos())?)
}

fn format_time(ts: Timestamp, f: TimeFormat) -> String {
    match f {
        TimeFormat::Ns => ts.to_string(),
        TimeFormat::Rfc3339 => {
            let t = UNIX_EPOCH + std::time::Duration::from_nanos(ts.max(0) as u64);
            humantime::format_rfc3339_nanos(t).to_string()
        }
    }
}

/// Parses `TS=VALUE` or `TS=VALUE#EVENT`.
fn parse_point_arg(s: &str) -> Result<Point> {
    let (ts, rest) = s.split_once('=').ok_or_else(|| anyhow!("point {s:?} is not TS=VALUE"))?;
    let (value, event) = match rest.split_once('#') {
        Some((v, e)) => (v, e.parse::<u64>().with_context(|| format!("bad event id in {s:?}"))?),
        None => (rest, 0),
    };
    let value: f64 = value.trim().parse().with_context(|| format!("bad value in point {s:?}"))?;
    Ok(Point { ts: parse_time(ts)?, value, event })
}

/// Reads CSV points from `input`. With `series`, rows are `ts,value[,event]`; without, they
/// are `series,ts,value[,event]`.
fn read_csv(input: impl Read, series: Option<&SeriesKey>) -> Result<Vec<SeriesPoints>> {
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(input);
    let mut out: Vec<SeriesPoints> = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 1;
        let record = record.with_context(|| format!("CSV line {line} is malformed"))?;
        let fields: Vec<&str> = record.iter().collect();
        let (key, rest) = match series {
            Some(s) => (s.clone(), &fields[..]),
            None => {
                let Some((first, rest)) = fields.split_first() else { continue };
                if line == 1 && *first == "series" {
                    continue;
                }
                let key: SeriesKey = first.parse().with_context(|| format!("CSV line {line}: bad series key"))?;
                (key, rest)
            }
        };
        if line == 1 && rest.first().is_some_and(|f| *f == "ts" || *f == "time") {
            continue;
        }
        if rest.len() < 2 || rest.len() > 3 {
            bail!(
                "CSV line {line} has {} fields; expected {}ts,value[,event]",
                fields.len(),
                if series.is_some() { "" } else { "series," }
            );
        }
        let ts = parse_time(rest[0]).with_context(|| format!("CSV line {line}"))?;
        let value: f64 = rest[1].parse().with_context(|| format!("CSV line {line}: bad value {:?}", rest[1]))?;
        let event = match rest.get(2) {
            Some(e) if !e.is_empty() => e.parse().with_context(|| format!("CSV line {line}: bad event id {e:?}"))?,
            _ => 0,
        };
        let point = Point { ts, value, event };
        match out.last_mut() {
            Some(last) if last.series == key => last.points.push(point),
            _ => out.push(SeriesPoints { series: key, points: vec![point] }),
        }
    }
    Ok(out)
}

async fn put(args: PutArgs) -> Result<()> {
    let series: Option<SeriesKey> = args.series.as_deref().map(str::parse).transpose()?;
    let batch = if args.points.is_empty() {
        read_csv(std::io::stdin().lock(), series.as_ref())?
    } else {
        let series = series.ok_or_else(|| anyhow!("give the series before the points"))?;
        let points = args.points.iter().map(|p| parse_point_arg(p)).collect::<Result<Vec<_>>>()?;
        vec![SeriesPoints { series, points }]
    };
    let total: usize = batch.iter().map(|s| s.points.len()).sum();
    if total == 0 {
        bail!("no points to write: give TS=VALUE arguments or CSV on standard input");
    }
    let client = args.conn.connect().await?;
    let ack = client.write_batch(batch).await?;
    eprintln!("wrote {} points in {} blocks through {}", ack.points, ack.blocks, client.addr());
    if ack.rejected > 0 {
        eprintln!("{} points were refused by an ingest policy:", ack.rejected);
        for r in ack.rejections.iter().take(20) {
            eprintln!("  {} {}={}: {}", r.series, r.point.ts, r.point.value, r.reason);
        }
    }
    client.close().await;
    Ok(())
}

async fn get(args: GetArgs) -> Result<()> {
    let series: SeriesKey = args.series.parse()?;
    let range = TimeRange::new(parse_time(&args.start)?, parse_time(&args.end)?)?;
    let client = args.conn.connect().await?;
    if let Some(width) = args.window {
        let width_ns = i64::try_from(width.as_nanos()).context("window too wide")?;
        let windows = client.aggregate(&series, range, width_ns).await?;
        print_windows(&series, &windows, args.format, args.time)?;
        client.close().await;
        return Ok(());
    }
    let points = client.read(&series, range).await?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match args.format {
        Format::Csv => {
            writeln!(out, "ts,value,event")?;
            for p in &points {
                writeln!(out, "{},{},{}", format_time(p.ts, args.time), p.value, p.event)?;
            }
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = points
                .iter()
                .map(|p| {
                    let ts = match args.time {
                        TimeFormat::Ns => serde_json::json!(p.ts),
                        TimeFormat::Rfc3339 => serde_json::json!(format_time(p.ts, args.time)),
                    };
                    // JSON has no NaN or infinity: those values are written as strings.
                    let value = if p.value.is_finite() {
                        serde_json::json!(p.value)
                    } else {
                        serde_json::json!(p.value.to_string())
                    };
                    serde_json::json!({"ts": ts, "value": value, "event": p.event})
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"series": series.as_str(), "points": rows}))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    client.close().await;
    Ok(())
}

async fn query(args: QueryArgs) -> Result<()> {
    let series: SeriesKey = args.series.parse()?;
    let range = TimeRange::new(parse_time(&args.start)?, parse_time(&args.end)?)?;
    let params: Vec<(&str, &str)> = args
        .params
        .iter()
        .map(|p| p.split_once('=').ok_or_else(|| anyhow!("parameter {p:?} is not NAME=VALUE")))
        .collect::<Result<_>>()?;
    let client = args.conn.connect().await?;
    let out = client.query(&series, range, &args.policy, &params).await?;
    match args.format {
        Format::Csv => {
            println!("# {}@{} over {series}", out.policy, out.version);
            for (name, value) in &out.values {
                println!("{name},{value}");
            }
            if !out.points.is_empty() {
                println!("ts,value,event");
                for p in &out.points {
                    println!("{},{},{}", p.ts, p.value, p.event);
                }
            }
        }
        Format::Json => {
            let values: serde_json::Map<String, serde_json::Value> =
                out.values.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect();
            let points: Vec<serde_json::Value> = out
                .points
                .iter()
                .map(|p| serde_json::json!({"ts": p.ts, "value": p.value, "event": p.event}))
                .collect();
            let doc = serde_json::json!({"policy": out.policy, "version": out.version, "series": series.as_str(),
                "values": values, "points": points});
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    client.close().await;
    Ok(())
}

fn policy_command(cmd: PolicyCommand) -> Result<()> {
    use timeshard_policy::signing;
    match cmd {
        PolicyCommand::Keygen { out } => {
            if out.exists() {
                bail!("{} exists; a signing key is never overwritten", out.display());
            }
            let key = signing::generate_keypair()?;
            key.write(&out)?;
            println!("wrote the secret key to {}; keep it off the nodes", out.display());
            println!("add this line to trusted_keys in the nodes' [policy] section:");
            println!("{}", key.public().to_text());
        }
        PolicyCommand::Sign { key, module } => {
            let sig = signing::sign_file(&key, &module)?;
            println!("signed {} -> {}", module.display(), sig.display());
        }
    }
    Ok(())
}

fn print_windows(
    series: &SeriesKey,
    windows: &[timeshard_sdk::WindowStats],
    format: Format,
    time: TimeFormat,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match format {
        Format::Csv => {
            writeln!(out, "start,end,count,min,max,mean,sum,first,last")?;
            for w in windows {
                writeln!(
                    out,
                    "{},{},{},{},{},{},{},{},{}",
                    format_time(w.start, time),
                    format_time(w.end, time),
                    w.count,
                    w.min,
                    w.max,
                    w.mean(),
                    w.sum,
                    w.first,
                    w.last
                )?;
            }
        }
        Format::Json => {
            let num = |v: f64| if v.is_finite() { serde_json::json!(v) } else { serde_json::json!(v.to_string()) };
            let rows: Vec<serde_json::Value> = windows
                .iter()
                .map(|w| {
                    serde_json::json!({"start": format_time(w.start, time), "end": format_time(w.end, time),
                        "count": w.count, "min": num(w.min), "max": num(w.max), "mean": num(w.mean()),
                        "sum": num(w.sum), "first": num(w.first), "last": num(w.last)})
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"series": series.as_str(), "windows": rows}))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

async fn list_series(args: SeriesArgs) -> Result<()> {
    let tags = args
        .tags
        .iter()
        .map(|t| t.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| anyhow!("tags are NAME=VALUE"))?;
    let client = args.conn.connect().await?;
    let (series, more) =
        client.list_series(timeshard_sdk::SeriesFilter { metric_prefix: args.metric, tags }, args.limit).await?;
    for s in &series {
        println!("{s}");
    }
    if more {
        eprintln!("(more than {} series; raise --limit or narrow the filter)", args.limit);
    }
    client.close().await;
    Ok(())
}

async fn status(args: ConnArgs) -> Result<()> {
    let client = args.connect().await?;
    let s = client.status().await?;
    println!("node {} at {} (version {}), knows {} peers", s.id, s.addr, s.version, s.peers);
    client.close().await;
    Ok(())
}

async fn run_node(args: NodeArgs) -> Result<()> {
    let mut cfg = match &args.config {
        Some(path) => NodeConfig::load(path)?,
        None => {
            let mut c = NodeConfig::default();
            c.resolve_paths(&std::env::current_dir()?);
            c
        }
    };
    if let Some(listen) = args.listen {
        cfg.listen = listen;
    }
    if !args.bootstrap.is_empty() {
        cfg.bootstrap = args.bootstrap.clone();
    }
    if let Some(d) = args.data_dir {
        cfg.data_dir = std::env::current_dir()?.join(d);
    }
    cfg.validate()?;
    if args.print_config {
        print!("{}", toml::to_string(&cfg)?);
        return Ok(());
    }
    let node = RunningNode::start(cfg).await?;
    if let Some(path) = &args.ready_file {
        write_ready_file(path, &node)?;
    }
    serve_until_stopped(&node, args.config.as_deref()).await?;
    tracing::info!("stop signal received; shutting down");
    node.shutdown().await;
    Ok(())
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIMESHARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Entry point of the `timeshard` binary.
pub fn main() -> std::process::ExitCode {
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
        Command::Node(a) => run_node(a).await,
        Command::Demo(a) => timeshard_node::demo::run(a).await,
        Command::Put(a) => put(a).await,
        Command::Get(a) => get(a).await,
        Command::Query(a) => query(a).await,
        Command::Series(a) => list_series(a).await,
        Command::Policy(p) => policy_command(p),
        Command::Status(a) => status(a).await,
        Command::Pki(PkiCommand::Init { dir }) => {
            pki::init(&dir)?;
            println!("created a development CA in {}", dir.display());
            Ok(())
        }
        Command::Pki(PkiCommand::Issue { dir, name, role }) => {
            let files = pki::issue(&dir, &name, role)?;
            println!("issued {} and {}", files.cert.display(), files.key.display());
            Ok(())
        }
        Command::Bench(b) => timeshard_node::bench::run(b).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_accepted_form() {
        assert_eq!(parse_time("1700000000000000000").unwrap(), 1_700_000_000_000_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000_000_000_000);
        let ago = parse_time("now-1h").unwrap();
        assert!(parse_time("now").unwrap() - ago >= 3_600_000_000_000);
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn point_arguments_parse() {
        let p = parse_point_arg("5=1.5#3").unwrap();
        assert_eq!((p.ts, p.value, p.event), (5, 1.5, 3));
        assert!(parse_point_arg("5").is_err());
        assert!(parse_point_arg("5=x").is_err());
    }

    #[test]
    fn csv_reads_both_layouts_and_reports_bad_lines() {
        let s: SeriesKey = "m".parse().unwrap();
        let got = read_csv("ts,value\n1,2.5\n2,3.5,7\n".as_bytes(), Some(&s)).unwrap();
        assert_eq!(got[0].points.len(), 2);
        assert_eq!(got[0].points[1].event, 7);
        let got = read_csv("series,ts,value\n\"a{x=1,y=2}\",1,2\nb,2,3\n".as_bytes(), None).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].series.as_str(), "a{x=1,y=2}");
        let err = read_csv("1,2\n3,oops\n".as_bytes(), Some(&s)).unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}

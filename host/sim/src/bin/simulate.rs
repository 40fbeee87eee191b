//! `simulate`: runs seeds of the fleet simulation and reports each failure as its seed, the
//! commit and a one-line replay command (`scripts/simulate` builds and runs this).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use timeshard_sim::{Faults, Options};
// The nodes' allocator (mimalloc), as in the `timeshard` binary, with its own defaults: the
// simulator runs eight nodes in one process and wants speed, not memory handed back at once.
use timeshard_alloc as _;

/// Deterministic simulation of an 8-node timeshard fleet under faults.
///
/// Examples:
///   scripts/simulate --seeds 20                     # seeds 0..20, every fault
///   scripts/simulate --seed 17 --history h.txt      # replay seed 17, keep its history
///   scripts/simulate --seeds 100 --from 5000 --faults crash,partition --json out.json
#[derive(Parser, Debug)]
#[command(name = "simulate", verbatim_doc_comment)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed (a replay); overrides --seeds and --from.
    #[arg(long)]
    seed: Option<u64>,
    /// Fault families: all, none, or a comma-separated list of network, partition, crash,
    /// disk, clock, membership, control, archive.
    #[arg(long, default_value = "all")]
    faults: Faults,
    /// Seconds of simulated time faults strike.
    #[arg(long, default_value_t = 40)]
    fault_secs: u64,
    /// Seconds the fleet settles after the faults, before the final reads.
    #[arg(long, default_value_t = 45)]
    quiet_secs: u64,
    /// Writes the history of the (last) seed to this file.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Runs each seed twice and fails when the two histories differ.
    #[arg(long)]
    twice: bool,
    /// Writes a JSON report here: seeds_per_hour, sim_seconds_per_wall_second, failures.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The simulator's window in microseconds: the network's shortest one-way latency.
    #[arg(long, default_value_t = 2000)]
    window_us: u64,
    /// Prints the node logs (tracing, filtered by RUST_LOG; default warn), each line with its
    /// host and simulation time (`host{name=node-3#2 t_ms=41502}`: node 3's second run).
    #[arg(long)]
    log: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.log {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into())
                    // The span that names each line's host and simulation time.
                    .add_directive("timeshard_sim::host=info".parse().expect("a valid directive")),
            )
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            // Wall-clock times say nothing here; each line's `host{..t_ms=..}` is its time.
            .without_time()
            .init();
    }
    let commit = std::env::var("TIMESHARD_COMMIT").unwrap_or_else(|_| "unknown".into());
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => (args.from..args.from + args.seeds).collect(),
    };
    let opts = Options {
        faults: args.faults.clone(),
        fault_secs: args.fault_secs,
        quiet_secs: args.quiet_secs,
        ..Options::default()
    };
    let started = Instant::now();
    let mut sim = Duration::ZERO;
    let mut failures: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    let mut failed_seeds = 0;
    for &seed in &seeds {
        let outcome = timeshard_sim::run(seed, &opts).with_context(|| format!("seed {seed}"))?;
        sim += outcome.sim;
        let mut properties: Vec<&'static str> = outcome.failures.iter().map(|f| f.property).collect();
        if args.twice {
            let again = timeshard_sim::run(seed, &opts).with_context(|| format!("seed {seed}, again"))?;
            sim += again.sim;
            if again.history.text() != outcome.history.text() {
                let (a, b) = (outcome.history.text(), again.history.text());
                let line = a
                    .lines()
                    .zip(b.lines())
                    .position(|(x, y)| x != y)
                    .unwrap_or(a.lines().count().min(b.lines().count()));
                println!("seed {seed}: NOT DETERMINISTIC: histories differ from line {} on", line + 1);
                println!("  first:  {}", a.lines().nth(line).unwrap_or("(end)"));
                println!("  second: {}", b.lines().nth(line).unwrap_or("(end)"));
                properties.push("determinism");
            }
        }
        properties.sort();
        properties.dedup();
        let wall = outcome.wall.as_secs_f64();
        if properties.is_empty() {
            println!(
                "seed {seed}: ok ({} events, {:.0} s simulated in {wall:.1} s, history {})",
                outcome.history.events.len(),
                outcome.sim.as_secs_f64(),
                &outcome.history.digest()[..16]
            );
        } else {
            failed_seeds += 1;
            for f in &outcome.failures {
                println!("seed {seed}: FAIL {}: {}", f.property, f.detail);
            }
            println!(
                "seed {seed} commit {commit}: {} failed; replay: scripts/simulate --seed {seed} --faults {} --fault-secs {} --quiet-secs {}",
                properties.join(", "),
                args.faults,
                args.fault_secs,
                args.quiet_secs
            );
            for p in properties {
                failures.entry(p).or_default().push(seed);
            }
        }
        if let Some(path) = &args.history {
            let mut text = String::new();
            for (t, a) in &outcome.plan.steps {
                text.push_str(&format!("plan t={t} {a:?}\n"));
            }
            text.push_str(&outcome.history.text());
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let per_hour = seeds.len() as f64 * 3600.0 / wall.max(1e-9);
    let speed = sim.as_secs_f64() / wall.max(1e-9);
    println!(
        "{} seeds, {failed_seeds} failed; {:.0} s simulated in {wall:.1} s: {speed:.1} simulated s per wall s, {per_hour:.0} seeds per hour",
        seeds.len(),
        sim.as_secs_f64()
    );
    if let Some(path) = &args.json {
        let failures: serde_json::Map<String, serde_json::Value> = failures
            .iter()
            .map(|(p, s)| (p.to_string(), serde_json::json!({ "count": s.len(), "seeds": s })))
            .collect();
        let report = serde_json::json!({
            "commit": commit,
            "seeds": seeds.len(),
            "from": seeds.first(),
            "faults": args.faults.to_string(),
            "fault_secs": args.fault_secs,
            "quiet_secs": args.quiet_secs,
            "wall_seconds": wall,
            "sim_seconds": sim.as_secs_f64(),
            "seeds_per_hour": per_hour,
            "sim_seconds_per_wall_second": speed,
            "failures": failures,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if failed_seeds > 0 {
        std::process::exit(1);
    }
    Ok(())
}

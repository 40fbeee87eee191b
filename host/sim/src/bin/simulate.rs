//! `simulate`: runs seeds of the fleet simulation and reports each failure as its seed, the
//! commit and a one-line replay command (`scripts/simulate` builds and runs this).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
#[derive(Parser, Debug, Clone)]
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
    // What the seeds run so far found, shared with the watchdog: a run that stands still ends
    // the process, and the report is written first with that seed as a liveness failure.
    let report = Arc::new(Mutex::new(Report::new(commit, args.clone(), &seeds)));
    if let Some(path) = args.json.clone() {
        let report = Arc::clone(&report);
        timeshard_sim::watchdog::on_stall(move |seed, at_ms| {
            let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
            r.stalled = Some((seed, at_ms));
            r.failures.entry("liveness").or_default().push(seed);
            if let Err(e) = r.write(&path) {
                eprintln!("{e:#}");
            }
        });
    }
    for &seed in &seeds {
        let outcome = timeshard_sim::run(seed, &opts).with_context(|| format!("seed {seed}"))?;
        let mut sim = outcome.sim;
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
            for f in &outcome.failures {
                println!("seed {seed}: FAIL {}: {}", f.property, f.detail);
            }
            println!(
                "seed {seed} commit {}: {} failed; replay: scripts/simulate --seed {seed} --faults {} --fault-secs {} --quiet-secs {}",
                report.lock().unwrap_or_else(|e| e.into_inner()).commit,
                properties.join(", "),
                args.faults,
                args.fault_secs,
                args.quiet_secs
            );
        }
        report.lock().unwrap_or_else(|e| e.into_inner()).seed_done(seed, sim, &properties);
        if let Some(path) = &args.history {
            let mut text = String::new();
            for (t, a) in &outcome.plan.steps {
                text.push_str(&format!("plan t={t} {a:?}\n"));
            }
            text.push_str(&outcome.history.text());
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    let report = report.lock().unwrap_or_else(|e| e.into_inner());
    let (wall, speed, per_hour) = report.rates();
    println!(
        "{} seeds, {} failed; {:.0} s simulated in {wall:.1} s: {speed:.1} simulated s per wall s, {per_hour:.0} seeds per hour",
        report.seeds_run,
        report.failed_seeds,
        report.sim.as_secs_f64()
    );
    if let Some(path) = &args.json {
        report.write(path)?;
    }
    let failed_seeds = report.failed_seeds;
    if failed_seeds > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// What the seeds run so far found: the JSON report, written at the end, or by the watchdog
/// when a seed stands still.
#[derive(Debug)]
struct Report {
    commit: String,
    args: Args,
    first_seed: Option<u64>,
    seeds_planned: usize,
    seeds_run: usize,
    failed_seeds: usize,
    sim: Duration,
    started: Instant,
    failures: BTreeMap<&'static str, Vec<u64>>,
    /// The seed that stood still, and the simulated milliseconds it stood at.
    stalled: Option<(u64, u64)>,
}

impl Report {
    /// Nothing run yet of `seeds`.
    fn new(commit: String, args: Args, seeds: &[u64]) -> Report {
        Report {
            commit,
            args,
            first_seed: seeds.first().copied(),
            seeds_planned: seeds.len(),
            seeds_run: 0,
            failed_seeds: 0,
            sim: Duration::ZERO,
            started: Instant::now(),
            failures: BTreeMap::new(),
            stalled: None,
        }
    }

    fn seed_done(&mut self, seed: u64, sim: Duration, failed: &[&'static str]) {
        self.seeds_run += 1;
        self.sim += sim;
        if !failed.is_empty() {
            self.failed_seeds += 1;
        }
        for p in failed {
            self.failures.entry(p).or_default().push(seed);
        }
    }

    /// Wall seconds so far, simulated seconds per wall second, seeds per hour.
    fn rates(&self) -> (f64, f64, f64) {
        let wall = self.started.elapsed().as_secs_f64();
        (wall, self.sim.as_secs_f64() / wall.max(1e-9), self.seeds_run as f64 * 3600.0 / wall.max(1e-9))
    }

    fn write(&self, path: &std::path::Path) -> Result<()> {
        let (wall, speed, per_hour) = self.rates();
        let failures: serde_json::Map<String, serde_json::Value> = self
            .failures
            .iter()
            .map(|(p, s)| (p.to_string(), serde_json::json!({ "count": s.len(), "seeds": s })))
            .collect();
        let mut report = serde_json::json!({
            "commit": self.commit,
            "seeds": self.seeds_run,
            "from": self.first_seed,
            "faults": self.args.faults.to_string(),
            "fault_secs": self.args.fault_secs,
            "quiet_secs": self.args.quiet_secs,
            "wall_seconds": wall,
            "sim_seconds": self.sim.as_secs_f64(),
            "seeds_per_hour": per_hour,
            "sim_seconds_per_wall_second": speed,
            "failures": failures,
        });
        if let Some((seed, at_ms)) = self.stalled {
            // The run ends at the stalled seed: the seeds after it did not run.
            report["stalled"] = serde_json::json!({ "seed": seed, "at_ms": at_ms, "seeds_not_run": self.seeds_planned.saturating_sub(self.seeds_run + 1) });
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed that stood still ended the process before the report was written, so a run of a
    /// thousand seeds left no JSON. The watchdog now writes it first: the seeds run, the
    /// stalled seed as a liveness failure, and how many never ran.
    #[test]
    fn a_stalled_run_still_writes_its_report() {
        let args = Args::parse_from(["simulate", "--seeds", "5", "--from", "100"]);
        let mut report = Report::new("abc".into(), args, &[100, 101, 102, 103, 104]);
        report.seed_done(100, Duration::from_secs(85), &[]);
        report.seed_done(101, Duration::from_secs(85), &["acked_readable"]);
        report.stalled = Some((102, 22_538));
        report.failures.entry("liveness").or_default().push(102);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        report.write(&path).unwrap();
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["seeds"], 2);
        assert_eq!(json["sim_seconds"], 170.0);
        assert_eq!(json["failures"]["acked_readable"]["seeds"], serde_json::json!([101]));
        assert_eq!(json["failures"]["liveness"]["seeds"], serde_json::json!([102]));
        assert_eq!(json["stalled"], serde_json::json!({ "seed": 102, "at_ms": 22538, "seeds_not_run": 2 }));
    }
}

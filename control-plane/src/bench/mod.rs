//! `timeshard-control bench`: enrollment, propagation and policy rollouts at fleet scale, on SQLite and on
//! PostgreSQL, against real `serve` processes; and what it shares with the tests: a throwaway
//! PostgreSQL ([`postgres`]) and `serve` as a child process ([`process`]).
//!
//! Prints one JSON document (and writes it to `--json PATH`). Figures are measurements, never
//! assertions; the targets are printed beside them.

pub mod floor;
pub mod postgres;
pub mod process;
pub mod rollout;
pub mod scale;

use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;

const BENCH_EXAMPLES: &str = "\
Examples:
  timeshard-control bench --json fleet-bench.json
  timeshard-control bench --backend sqlite --devices 200 --rounds 3
  timeshard-control bench --backend postgres --database postgres://bench@db.example/bench

Without --database the PostgreSQL figures come from a throwaway server started in a temporary
directory (Debian's `postgresql` package must be installed). Build with --release for figures
worth comparing.";

/// Which backends to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backends {
    Sqlite,
    Postgres,
    Both,
}

/// `bench` options.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = BENCH_EXAMPLES)]
pub struct BenchArgs {
    /// Also write the JSON document to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Simulated devices that enroll, then watch.
    #[arg(long, default_value_t = 1000)]
    pub devices: usize,
    /// Enrollments in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Class changes whose propagation to every watcher is timed.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    #[arg(long, value_enum, default_value_t = Backends::Both)]
    pub backend: Backends,
    /// An existing, empty PostgreSQL database to use instead of a throwaway server.
    #[arg(long, env = "TIMESHARD_BENCH_DATABASE", hide_env_values = true)]
    pub database: Option<String>,
    /// PostgreSQL runs this many `serve` instances on the one database (watchers spread over them).
    #[arg(long, default_value_t = 2)]
    pub postgres_instances: usize,
    /// The policy component the rollout figure rolls out (an ingest policy).
    #[arg(long, default_value = "guest/target/wasm32-wasip2/release/noop.wasm")]
    pub policy_module: PathBuf,
}

/// Runs the benchmark and prints its JSON document.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.devices > 0 && args.concurrency > 0 && args.rounds > 0,
        "--devices, --concurrency and --rounds must be positive"
    );
    let exe = std::env::current_exe().context("cannot find this program's path to start `serve`")?;
    let module = std::fs::read(&args.policy_module).with_context(|| {
        format!(
            "cannot read the policy module {} for the rollout figure; build the guests (guest/build.sh) or pass \
             --policy-module",
            args.policy_module.display()
        )
    })?;
    let work = tempfile::Builder::new().prefix("timeshard-control-bench-").tempdir()?;
    let mut doc = json!({
        "devices": args.devices,
        "watchers": args.devices,
        "rounds": args.rounds,
        "enroll_concurrency": args.concurrency,
        "targets": { "enroll_per_s": 200, "propagate_p99_ms": 2000, "control_rss_mb": 200, "rollout_p99_s": 10 },
        "comparison": { "rollout": "AWS IoT Jobs roll out to at most 1,000 devices per minute by default" },
    });
    if matches!(args.backend, Backends::Sqlite | Backends::Both) {
        eprintln!("bench: SQLite ...");
        let storage = process::Storage::Sqlite(work.path().join("sqlite"));
        doc["sqlite"] = scale::measure(&exe, &storage, 1, &args, &module).await.context("SQLite")?.to_json();
    }
    if matches!(args.backend, Backends::Postgres | Backends::Both) {
        eprintln!("bench: PostgreSQL ({} instances) ...", args.postgres_instances.max(1));
        let (_server, url) = match &args.database {
            Some(url) => (None, url.clone()),
            None => {
                let server = postgres::ThrowawayPostgres::start(true)?;
                let url = server.create_database("bench")?;
                (Some(server), url)
            }
        };
        let storage = process::Storage::Postgres(url);
        doc["postgres"] = scale::measure(&exe, &storage, args.postgres_instances.max(1), &args, &module)
            .await
            .context("PostgreSQL")?
            .to_json();
    }
    doc["floor"] = floor::measure(&exe, work.path()).await?;
    let text = serde_json::to_string_pretty(&doc)?;
    println!("{text}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{text}\n")).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The `p`-th percentile (0..=100) of `samples` in milliseconds, nearest rank.
pub fn percentile_ms(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    let v = samples[rank.clamp(1, samples.len()) - 1];
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_ms(&mut s, 50.0), 50.0);
        assert_eq!(percentile_ms(&mut s, 99.0), 99.0);
        assert_eq!(percentile_ms(&mut [3.0, 1.0], 100.0), 3.0);
        assert!(percentile_ms(&mut [], 50.0).is_nan());
    }
}

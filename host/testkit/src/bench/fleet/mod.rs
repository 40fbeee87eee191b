//! `timeshard bench fleet`: enrollment, propagation and policy rollouts at fleet scale, on
//! SQLite and on PostgreSQL, against real `timeshard-control serve` processes (a throwaway
//! PostgreSQL server unless a database is given, see [`crate::control`]).
//!
//! Returns one JSON document. Figures are measurements, never assertions; the targets are
//! written beside them.

pub mod floor;
pub mod revocation;
pub mod rollout;
pub mod scale;

use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;

use crate::control::{postgres, process};

/// Which backends to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backends {
    Sqlite,
    Postgres,
    Both,
}

/// What `bench fleet` measures, and with which programs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The `timeshard-control` program whose `serve` is measured.
    pub control: PathBuf,
    /// Simulated devices that enroll, then watch.
    pub devices: usize,
    /// Enrollments in flight at once.
    pub concurrency: usize,
    /// Class changes whose propagation to every watcher is timed.
    pub rounds: usize,
    pub backend: Backends,
    /// An existing, empty PostgreSQL database to use instead of a throwaway server.
    pub database: Option<String>,
    /// PostgreSQL runs this many `serve` instances on the one database (watchers spread over them).
    pub postgres_instances: usize,
    /// The policy component the rollout figure rolls out (an ingest policy).
    pub policy_module: PathBuf,
    /// The `timeshard` program the revocation figure's nodes run.
    pub node: PathBuf,
    /// Nodes cut off from the control plane in the revocation figure.
    pub cut_off: usize,
    /// Revocations timed (0: no revocation figure).
    pub revocations: usize,
}

impl Default for FleetOptions {
    fn default() -> FleetOptions {
        FleetOptions {
            control: PathBuf::from("timeshard-control"),
            devices: 1000,
            concurrency: 16,
            rounds: 5,
            backend: Backends::Both,
            database: None,
            postgres_instances: 2,
            policy_module: PathBuf::from("guest/target/wasm32-wasip2/release/noop.wasm"),
            node: PathBuf::from("timeshard"),
            cut_off: 3,
            revocations: 3,
        }
    }
}

/// Runs the benchmark and returns its JSON document.
pub async fn run(args: &FleetOptions) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        args.devices > 0 && args.concurrency > 0 && args.rounds > 0,
        "--devices, --concurrency and --rounds must be positive"
    );
    let exe = &args.control;
    anyhow::ensure!(
        exe.is_file(),
        "cannot find the control plane's program at {}: build it (cargo build --release --bin \
         timeshard-control) or pass --control",
        exe.display()
    );
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
        "targets": { "enroll_per_s": 200, "propagate_p99_ms": 2000, "control_rss_mb": 200, "rollout_p99_s": 10,
            "revocation_spread_s": 10 },
        "comparison": { "rollout": "AWS IoT Jobs roll out to at most 1,000 devices per minute by default" },
    });
    if matches!(args.backend, Backends::Sqlite | Backends::Both) {
        eprintln!("bench: SQLite ...");
        let storage = process::Storage::Sqlite(work.path().join("sqlite"));
        doc["sqlite"] = scale::measure(exe, &storage, 1, args, &module).await.context("SQLite")?.to_json();
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
        doc["postgres"] = scale::measure(exe, &storage, args.postgres_instances.max(1), args, &module)
            .await
            .context("PostgreSQL")?
            .to_json();
    }
    if args.revocations > 0 {
        eprintln!("bench: revocation through gossip ...");
        let options = revocation::RevocationOptions {
            control: exe.clone(),
            node: args.node.clone(),
            cut_off: args.cut_off,
            rounds: args.revocations,
        };
        let dir = work.path().join("revocation");
        let figure = revocation::measure(&options, &dir).await.context("the revocation figure")?;
        doc["revocation_spread_s"] = figure["revocation_spread_s"].clone();
        doc["revocation"] = figure;
    }
    doc["floor"] = floor::measure(exe, work.path()).await?;
    Ok(doc)
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

//! `timeshard bench policy`: the policy host's figures (from [`super::policy_host`], in this
//! process) plus the push-down figure measured on a cluster of node processes: RMS over one
//! day of 60 Hz data computed on the owner nodes and merged, versus fetching the raw points
//! and computing it at the client.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_policy::signing;
use timeshard_proto::{Point, TimeRange};
use timeshard_sdk::{Client, SeriesPoints};

use super::floor::Floor;
use super::policy_host;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::datasets::{self, T0};
use crate::stats::{Latencies, median, round3};

/// What `bench policy` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct PolicyOptions {
    /// The guest workspace, built by guest/build.sh.
    pub guest_dir: PathBuf,
    /// Node processes for the push-down figure.
    pub nodes: usize,
    /// Seconds of 60 Hz data for the push-down figure (one day by default).
    pub pushdown_seconds: i64,
    /// Repetitions of each push-down measurement (median reported).
    pub reps: usize,
    /// Fewer repetitions and one hour of push-down data, to check the benchmark runs.
    pub quick: bool,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions { guest_dir: PathBuf::from("guest"), nodes: 5, pushdown_seconds: 86_400, reps: 5, quick: false }
    }
}

/// Runs the benchmark, the push-down part on node processes of `binary` (the `timeshard`
/// command line), and returns its JSON document; prints a summary as it goes.
pub async fn run(binary: &Path, options: &PolicyOptions) -> Result<serde_json::Value> {
    let mut args = options.clone();
    if args.quick {
        args.pushdown_seconds = args.pushdown_seconds.min(3_600);
        args.reps = args.reps.min(2);
    }
    let mut opts = policy_host::Options::default();
    if args.quick {
        opts.repetitions = 3;
        opts.loop_samples = 20;
        opts.pushdown_seconds = 3_600;
    }
    let guest_dir = args.guest_dir.clone();
    eprintln!("measuring the policy host (in this process)");
    let host = tokio::task::spawn_blocking(move || policy_host::run(&guest_dir, &opts)).await??;
    eprint!("{}", policy_host::summary(&host));
    let mut report = serde_json::to_value(&host)?;
    // The in-process estimate stays for comparison; the cluster figure is the benchmark's.
    report["pushdown_single_process"] = report["pushdown"].take();
    let (pushdown, floor) = pushdown(binary, &args).await?;
    report["pushdown"] = pushdown;
    report["floor"] = serde_json::to_value(&floor)?;
    Ok(report)
}

/// Sum over the cluster of the application bytes every node has sent.
async fn cluster_bytes_sent(clients: &[Client]) -> Result<u64> {
    let mut total = 0;
    for c in clients {
        total += c.status().await?.bytes_sent;
    }
    Ok(total)
}

/// The push-down figure on a cluster, and the floor measured on the same cluster.
async fn pushdown(binary: &Path, args: &PolicyOptions) -> Result<(serde_json::Value, Floor)> {
    let rms_wasm = timeshard_policy::guest_artifact(&args.guest_dir, "rms")?;
    let dir = std::env::temp_dir().join(format!("timeshard-bench-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = pushdown_in(binary, args, &dir, &rms_wasm).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn pushdown_in(
    binary: &Path,
    args: &PolicyOptions,
    dir: &Path,
    rms_wasm: &Path,
) -> Result<(serde_json::Value, Floor)> {
    let key_file = dir.join("policy.key");
    let key = signing::generate_keypair()?;
    key.write(&key_file)?;
    let wasm = dir.join("rms.wasm");
    std::fs::copy(rms_wasm, &wasm).context("copying the rms component")?;
    let identity =
        signing::Identity::new(timeshard_policy::PolicyRef::new("rms", "1.0.0")?, timeshard_policy::Kind::Query);
    signing::sign_file(&key_file, &wasm, &identity, None)?;
    let mut options = ClusterOptions::new(args.nodes, dir.join("cluster"), binary);
    options.log = "warn".into();
    options.policy = toml::from_str(&format!(
        "trusted_keys = [{:?}]\n[[modules]]\nname = \"rms\"\nversion = \"1.0.0\"\nkind = \"query\"\nwasm = {:?}\n\
         [[bindings]]\nselect = {{ metric_prefix = \"pmu.\" }}\nquery = [\"rms\"]\n",
        key.public().to_text().trim(),
        wasm.display().to_string(),
    ))?;
    eprintln!("starting {} node processes for the push-down figure", args.nodes);
    let cluster = LocalCluster::start(options).await?;
    let outcome = measure(&cluster, args).await;
    cluster.shutdown().await?;
    outcome
}

async fn measure(cluster: &LocalCluster, args: &PolicyOptions) -> Result<(serde_json::Value, Floor)> {
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let series = datasets::pmu_series(0);
    let n = (args.pushdown_seconds * 60) as usize;
    let writer = cluster.client(0).await?;
    let floor = Floor::measure(cluster.dir(), &writer).await?;
    println!("{}", floor.summary());
    eprintln!("writing {n} points ({} s of 60 Hz data)", args.pushdown_seconds);
    for first in (0..n).step_by(50_000) {
        let points: Vec<Point> = datasets::pmu_points(0, first as u64, 50_000.min(n - first)).collect();
        writer.write_batch(vec![SeriesPoints { series: series.clone(), points }]).await?;
    }
    let range = TimeRange::new(T0, T0 + args.pushdown_seconds * 1_000_000_000)?;
    let mut observers = Vec::new();
    for i in 0..cluster.len() {
        observers.push(cluster.client(i).await?);
    }
    let client = cluster.client(cluster.len() - 1).await?;

    let (mut t_push, mut t_raw) = (Latencies::default(), Latencies::default());
    let (mut bytes_push, mut bytes_raw) = (Vec::new(), Vec::new());
    let (mut rms_push, mut rms_raw) = (0.0, 0.0);
    for _ in 0..args.reps.max(1) {
        let before = cluster_bytes_sent(&observers).await?;
        let t = Instant::now();
        let out = client.query(&series, range, "rms", &[]).await?;
        t_push.push(t.elapsed());
        bytes_push.push(cluster_bytes_sent(&observers).await? - before);
        rms_push = out.values.iter().find(|(k, _)| k == "rms").map(|(_, v)| *v).context("no rms in the answer")?;

        let before = cluster_bytes_sent(&observers).await?;
        let t = Instant::now();
        let points = client.read(&series, range).await?;
        rms_raw = (points.iter().map(|p| p.value * p.value).sum::<f64>() / points.len() as f64).sqrt();
        t_raw.push(t.elapsed());
        bytes_raw.push(cluster_bytes_sent(&observers).await? - before);
        if points.len() != n {
            bail!("the raw read returned {} points, {n} were written", points.len());
        }
    }
    // The same day as window aggregates (the store benchmark's agg_day_1m_ms, but through the
    // cluster): owners answer from block summaries.
    let mut t_agg = Latencies::default();
    for _ in 0..args.reps.max(1) {
        let t = Instant::now();
        let windows = client.aggregate(&series, range, 60_000_000_000).await?;
        t_agg.push(t.elapsed());
        let count: u64 = windows.iter().map(|w| w.count).sum();
        if count != n as u64 {
            bail!("1-minute windows over the day count {count} points, {n} were written");
        }
    }
    if (rms_push - rms_raw).abs() > 1e-9 * rms_raw.abs().max(1.0) {
        bail!("push-down RMS {rms_push} differs from the raw RMS {rms_raw}");
    }
    let (bp, br) = (median(&bytes_push), median(&bytes_raw));
    println!(
        "push-down over {} node processes: rms of {n} points moves {bp} bytes in {:.1} ms; fetching them raw moves {br} \
         bytes in {:.1} ms ({:.0}x fewer bytes)",
        cluster.len(),
        t_push.percentile_ms(50.0),
        t_raw.percentile_ms(50.0),
        br as f64 / bp.max(1) as f64
    );
    println!("1-minute windows over the same span through the cluster: {:.1} ms", t_agg.percentile_ms(50.0));
    let pushdown = json!({"policy": "rms", "span": if args.pushdown_seconds == 86_400 { "1d".to_string() } else { format!("{}s", args.pushdown_seconds) },
        "bytes_pushdown": bp, "bytes_raw": br,
        "ms_pushdown": round3(t_push.percentile_ms(50.0)), "ms_raw": round3(t_raw.percentile_ms(50.0)),
        "scope": "cluster", "nodes": cluster.len(), "points": n, "rms": rms_push,
        "agg_1m_windows_ms": round3(t_agg.percentile_ms(50.0)),
        "bytes_counted": "application frames sent by every node (peer requests and answers, and answers to the client)"});
    Ok((pushdown, floor))
}

//! The demo behind `timeshard demo`: a local cluster of separate node processes, a few minutes
//! of PMU data written and read back (and checked), then a clean stop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use timeshard_node::process::wait_for_stop_signal;
use timeshard_proto::{Point, TimeRange};
use timeshard_sdk::SeriesPoints;

use crate::cluster::{ClusterOptions, LocalCluster};
use crate::datasets::{self, T0};
use crate::stats::Latencies;

/// What the demo does.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Number of node processes.
    pub nodes: usize,
    /// Minutes of 60 Hz data per bus.
    pub minutes: u32,
    /// PMU buses, one series each.
    pub buses: u32,
    /// Working directory for certificates, configs, data and logs (`None`: a new temporary one).
    pub dir: Option<PathBuf>,
    /// Keep the cluster running after the demo until Ctrl-C.
    pub serve: bool,
    /// Keep the working directory afterwards.
    pub keep: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions { nodes: 5, minutes: 3, buses: 4, dir: None, serve: false, keep: false }
    }
}

/// Runs the demo on node processes of `binary` (the `timeshard` command line). Ctrl-C stops
/// every node cleanly at any point.
pub async fn run(binary: &Path, args: &DemoOptions) -> Result<()> {
    if args.nodes == 0 || args.buses == 0 || args.minutes == 0 {
        bail!("--nodes, --buses and --minutes must be at least 1");
    }
    let (dir, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("timeshard-demo-{}", std::process::id())), true),
    };
    println!("timeshard demo: {} node processes on loopback, working directory {}", args.nodes, dir.display());
    let started = Instant::now();
    // HTTP needs a token on loopback too: one for this demo's nodes.
    let token = timeshard_control_api::token::hex(&rand::random::<[u8; 24]>());
    let mut options = ClusterOptions::new(args.nodes, &dir, binary);
    options.http.tokens = vec![token.clone()];
    let cluster = tokio::select! {
        c = LocalCluster::start(options) => c?,
        _ = wait_for_stop_signal() => bail!("interrupted while starting the cluster"),
    };
    for i in 0..cluster.len() {
        let http = cluster.http_addr(i).map(|a| format!("  http://{a}")).unwrap_or_default();
        println!("  node-{i}  {}  id {}{http}", cluster.addr(i), cluster.id(i).short());
    }
    println!("  HTTP token (every node): {token}");
    let outcome = tokio::select! {
        r = exercise(&cluster, args, started) => r,
        _ = wait_for_stop_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    if outcome.is_ok() && args.serve {
        println!("\nThe cluster keeps running; in another shell:");
        println!("  export TIMESHARD_NODE={} TIMESHARD_PKI={}", cluster.addr(0), cluster.pki_dir().display());
        println!("  timeshard get 'pmu.phase{{bus=1,site=atl}}' --start {T0} --end {} | head", T0 + 10_000_000_000);
        println!("  timeshard put 'demo.temp{{room=lab}}' now=21.5");
        if let Some(http) = cluster.http_addr(0) {
            println!("  curl -H 'Authorization: Bearer {token}' 'http://{http}/query?db=demo&q=SHOW+MEASUREMENTS'");
        }
        println!("Press Ctrl-C to stop.");
        wait_for_stop_signal().await?;
    }
    let n = cluster.len();
    println!("stopping {n} nodes...");
    let clean = cluster.shutdown().await?;
    println!("{clean} of {n} nodes exited cleanly");
    if temporary && !args.keep && !args.serve {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome?;
    if clean != n {
        bail!("{} node(s) did not exit cleanly; see the logs in {}", n - clean, dir.display());
    }
    Ok(())
}

fn count_in(points: &[Point], range: &TimeRange) -> usize {
    points.iter().filter(|p| range.contains(p.ts)).count()
}

async fn exercise(cluster: &LocalCluster, args: &DemoOptions, started: Instant) -> Result<()> {
    cluster.wait_converged(Duration::from_secs(30)).await?;
    println!("cluster ready in {:.2} s: every node knows the others", started.elapsed().as_secs_f64());

    let per_bus = args.minutes as usize * 60 * 60;
    let data: Vec<(timeshard_proto::SeriesKey, Vec<Point>)> =
        (1..=args.buses).map(|b| (datasets::pmu_series(b), datasets::pmu(b).take(per_bus).collect())).collect();
    let writer = cluster.client(0).await?;
    let reader = cluster.client(cluster.len() - 1).await?;

    // Write like a fleet of PMUs would, 10 s of every bus per batch, as fast as acknowledged.
    let chunk = 600;
    let mut batch_latency = Latencies::default();
    let t = Instant::now();
    for start in (0..per_bus).step_by(chunk) {
        let batch: Vec<SeriesPoints> = data
            .iter()
            .map(|(s, pts)| SeriesPoints {
                series: s.clone(),
                points: pts[start..(start + chunk).min(per_bus)].to_vec(),
            })
            .collect();
        let t_batch = Instant::now();
        writer.write_batch(batch).await?;
        batch_latency.push(t_batch.elapsed());
    }
    let secs = t.elapsed().as_secs_f64();
    let total = per_bus * data.len();
    println!(
        "wrote {total} points ({} series x {} min at 60 Hz, RF 3, W 2) through {} in {secs:.2} s: {:.0} points/s; \
         batch of {} points: p50 {:.2} ms, p99 {:.2} ms",
        data.len(),
        args.minutes,
        writer.addr(),
        total as f64 / secs,
        chunk * data.len(),
        batch_latency.percentile_ms(50.0),
        batch_latency.percentile_ms(99.0),
    );

    // Read every series back whole through another node and compare point by point.
    let whole = TimeRange::new(T0, T0 + per_bus as i64 * 1_000_000_000 / 60 + 1)?;
    let t = Instant::now();
    for (series, expected) in &data {
        let got = reader.read(series, whole).await?;
        if got != *expected {
            bail!("{series}: read {} points back, wrote {}; they differ", got.len(), expected.len());
        }
    }
    println!(
        "read all {total} points back through {} in {:.1} ms; every point matches what was written",
        reader.addr(),
        t.elapsed().as_secs_f64() * 1e3
    );

    // Ranges at random offsets, as the seed paper measured them.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let max_span = (per_bus as i64 * 1_000_000_000 / 60).min(150_000_000_000);
    for span_s in [10i64, 80, 150] {
        let span = (span_s * 1_000_000_000).min(max_span);
        let mut lat = Latencies::default();
        let mut points = 0;
        for _ in 0..20 {
            let (series, all) = &data[rng.random_range(0..data.len())];
            let room = (per_bus as i64 * 1_000_000_000 / 60 - span).max(1);
            let start = T0 + rng.random_range(0..room);
            let range = TimeRange::new(start, start + span)?;
            let t = Instant::now();
            let got = reader.read(series, range).await?;
            lat.push(t.elapsed());
            if got.len() != count_in(all, &range) {
                bail!("{series} {range:?}: read {} points, expected {}", got.len(), count_in(all, &range));
            }
            points += got.len();
        }
        println!(
            "read 20 random {}-second ranges ({} quanta each): {points} points, all exact; p50 {:.2} ms, p99 {:.2} ms",
            span / 1_000_000_000,
            span / 10_000_000_000 + 1,
            lat.percentile_ms(50.0),
            lat.percentile_ms(99.0)
        );
    }
    let sample = reader.read(&data[0].0, TimeRange::new(T0, T0 + 50_000_000)?).await?;
    println!("first points of {}:", data[0].0);
    for p in sample {
        println!("  {},{}", p.ts, p.value);
    }
    writer.close().await;
    reader.close().await;
    Ok(())
}

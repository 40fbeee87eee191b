//! `timeshard bench paper`, the seed paper's benchmark: single-point write latency (Table I),
//! range read latency (Table II), and batched ingest throughput, on separate node processes
//! talking QUIC over loopback.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_node::config::ClassConfig;
use timeshard_proto::{KeyFormat, Point, SeriesKey, TimeRange};
use timeshard_sdk::SeriesPoints;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::datasets::{self, T0};
use crate::stats::{Latencies, round3};

/// What `bench paper` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct PaperOptions {
    /// Node processes.
    pub nodes: usize,
    /// Single-point writes per (format, RF).
    pub writes: usize,
    /// Repetitions of each read.
    pub read_reps: usize,
    /// Seconds of batched ingest.
    pub ingest_secs: u64,
    /// Batches the ingest client keeps in flight.
    pub in_flight: usize,
    /// Points of the day `read_day` writes and reads back (a day of 60 Hz: 5,184,000).
    pub day_points: usize,
    /// Repetitions of the day's read.
    pub day_reps: usize,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for PaperOptions {
    fn default() -> Self {
        PaperOptions {
            nodes: 18,
            writes: 10_000,
            read_reps: 20,
            ingest_secs: 10,
            in_flight: 4,
            day_points: 5_184_000,
            day_reps: 5,
            dir: None,
        }
    }
}

const FORMATS: [KeyFormat; 2] = [KeyFormat::Qfi, KeyFormat::Kfi];
const WRITE_RFS: [u8; 3] = [1, 4, 7];
const READ_SPANS_S: [i64; 3] = [10, 80, 150];

fn write_metric(format: KeyFormat, rf: u8) -> String {
    format!("pmu.phase.{format}.rf{rf}")
}

fn read_metric(format: KeyFormat) -> String {
    format!("pmu.phase.{format}.read")
}

fn classes() -> Vec<ClassConfig> {
    let mut out = Vec::new();
    for format in FORMATS {
        for rf in WRITE_RFS {
            let name = write_metric(format, rf);
            out.push(ClassConfig {
                name: name.clone(),
                metric_prefix: name,
                format,
                rf,
                w: rf,
                r: 1,
                ..Default::default()
            });
        }
        let name = read_metric(format);
        out.push(ClassConfig {
            name: name.clone(),
            metric_prefix: name,
            format,
            rf: 3,
            w: 2,
            r: 2,
            ..Default::default()
        });
    }
    out
}

fn series(metric: &str, bus: u32) -> SeriesKey {
    format!("{metric}{{bus={bus},site=atl}}").parse().expect("valid key")
}

/// Runs the benchmark on node processes of `binary` (the `timeshard` command line) and returns
/// its JSON document; prints a line per figure as it goes.
pub async fn run(binary: &Path, args: &PaperOptions) -> Result<serde_json::Value> {
    if args.nodes < 7 {
        bail!("--nodes must be at least 7 (the largest replication factor measured)");
    }
    let dir = WorkDir::new("paper", args.dir.as_deref());
    let mut options = ClusterOptions::new(args.nodes, dir.path(), binary);
    options.classes = classes();
    options.log = "warn".into();
    eprintln!("starting {} node processes in {}", args.nodes, dir.path().display());
    let cluster = LocalCluster::start(options).await?;
    let result = measure(&cluster, args).await;
    let clean = cluster.shutdown().await?;
    drop(dir);
    let report = result?;
    if clean != args.nodes {
        eprintln!("warning: only {clean} of {} nodes exited cleanly", args.nodes);
    }
    Ok(report)
}

async fn measure(cluster: &LocalCluster, args: &PaperOptions) -> Result<serde_json::Value> {
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let writer = cluster.client(0).await?;
    let floor = Floor::measure(cluster.dir(), &writer).await?;
    println!("{}", floor.summary());

    // Table I: single-point writes, each awaited before the next.
    let mut writes = Vec::new();
    for format in FORMATS {
        for rf in WRITE_RFS {
            let s = series(&write_metric(format, rf), 1);
            let mut lat = Latencies::default();
            for p in datasets::pmu(1).take(args.writes) {
                let t = Instant::now();
                writer.write(&s, &[p]).await?;
                lat.push(t.elapsed());
            }
            println!(
                "write {format} rf {rf}: {} single points, p50 {:.3} ms, p99 {:.3} ms, mean {:.3} ms",
                lat.len(),
                lat.percentile_ms(50.0),
                lat.percentile_ms(99.0),
                lat.mean_ms()
            );
            writes.push(json!({"format": format.to_string(), "rf": rf, "n": lat.len(),
                "p50_ms": round3(lat.percentile_ms(50.0)), "p99_ms": round3(lat.percentile_ms(99.0)),
                "mean_ms": round3(lat.mean_ms())}));
        }
    }

    // Table II: 10,000 points written, then another client reads 10, 80 and 150 s.
    let reader = cluster.client(cluster.len() - 1).await?;
    let mut reads = Vec::new();
    for format in FORMATS {
        let s = series(&read_metric(format), 1);
        let points: Vec<Point> = datasets::pmu(1).take(10_000).collect();
        writer.write(&s, &points).await?;
        for span_s in READ_SPANS_S {
            let range = TimeRange::new(T0, T0 + span_s * 1_000_000_000)?;
            let mut lat = Latencies::default();
            let mut n = 0;
            for _ in 0..args.read_reps {
                let t = Instant::now();
                let got = reader.read(&s, range).await?;
                lat.push(t.elapsed());
                n = got.len();
            }
            let expected = span_s as usize * 60;
            if n != expected {
                bail!("read {format} {span_s} s returned {n} points, expected {expected}");
            }
            println!(
                "read {format} {span_s} s: {n} points, p50 {:.3} ms, p99 {:.3} ms",
                lat.percentile_ms(50.0),
                lat.percentile_ms(99.0)
            );
            reads.push(json!({"format": format.to_string(), "span_s": span_s, "points": n,
                "p50_ms": round3(lat.percentile_ms(50.0)), "p99_ms": round3(lat.percentile_ms(99.0))}));
        }
    }

    let ingest = ingest(cluster, args).await?;
    let read_day = read_day(cluster, args).await?;
    writer.close().await;
    reader.close().await;
    let trust = super::trust::gossip_verify(5)?;
    Ok(json!({"nodes": cluster.len(), "writes": writes, "reads": reads, "ingest": ingest, "read_day": read_day,
        "gossip_verify_us_per_entry": trust["gossip_verify_us_per_entry"], "trust": trust, "floor": floor}))
}

/// One day of one 60 Hz `pmu` series (RF 3, W 2, R 2), written in batches, then streamed back
/// through the SDK by a client of another node `day_reps` times, each read checked for count
/// and order while it is consumed, never held whole.
async fn read_day(cluster: &LocalCluster, args: &PaperOptions) -> Result<serde_json::Value> {
    use futures::StreamExt;
    const BATCH: usize = 50_000;
    let s = series(&read_metric(KeyFormat::Qfi), 1_000);
    let writer = cluster.client(0).await?;
    let started = Instant::now();
    let points: Vec<Point> = datasets::pmu(1_000).take(args.day_points).collect();
    let batches = points.chunks(BATCH).map(|c| writer.write(&s, c));
    let mut writes = futures::stream::iter(batches).buffer_unordered(args.in_flight.max(1));
    while let Some(ack) = writes.next().await {
        ack?;
    }
    drop(writes);
    eprintln!("read_day: wrote {} points in {:.1} s", points.len(), started.elapsed().as_secs_f64());
    let range = TimeRange::new(T0, points.last().map_or(T0, |p| p.ts) + 1)?;
    drop(points);
    // Steady state: a node reads the careful way until anti-entropy says its replicas agree
    // (`catch_up_delay` after it starts), which a cluster started seconds ago has not reached.
    let settling = Instant::now();
    cluster.wait_settled(Duration::from_secs(120)).await?;
    eprintln!("read_day: replicas settled after {:.1} s more", settling.elapsed().as_secs_f64());
    let reader = cluster.client(cluster.len() - 1).await?;
    let mut lat = Latencies::default();
    // The first read apart: later ones re-read a range whose blocks the nodes just read.
    let mut first_ms = None;
    for _ in 0..args.day_reps.max(1) {
        let t = Instant::now();
        let mut n = 0usize;
        let mut last = i64::MIN;
        let mut batches = std::pin::pin!(reader.read_stream(&s, range));
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            if batch.timestamps.first().is_some_and(|&ts| ts <= last) {
                bail!("read_day: batches out of order");
            }
            last = batch.timestamps.last().copied().unwrap_or(last);
            n += batch.len();
        }
        first_ms.get_or_insert(t.elapsed().as_secs_f64() * 1000.0);
        lat.push(t.elapsed());
        if n != args.day_points {
            bail!("read_day returned {n} points, expected {}", args.day_points);
        }
    }
    let p50 = lat.percentile_ms(50.0);
    let rate = args.day_points as f64 / (p50 / 1000.0);
    let first_ms = first_ms.unwrap_or(p50);
    println!("read_day: {} points, first {first_ms:.1} ms, p50 {p50:.1} ms = {rate:.0} points/s", args.day_points);
    writer.close().await;
    reader.close().await;
    Ok(json!({"points": args.day_points, "reps": lat.len(), "first_ms": round3(first_ms), "p50_ms": round3(p50),
            "points_per_s": rate.round() as u64}))
}

/// Batches of 5,000 points over 100 series (50 consecutive points each), RF 3, W 2, from one
/// client keeping `in_flight` batches outstanding, for at least `ingest_secs`.
async fn ingest(cluster: &LocalCluster, args: &PaperOptions) -> Result<serde_json::Value> {
    const SERIES: u32 = 100;
    const PER_SERIES: usize = 50;
    let client = cluster.client(0).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<SeriesPoints>>(args.in_flight * 2);
    let duration = Duration::from_secs(args.ingest_secs);
    // Generate on a blocking thread so data generation does not share the writers' threads.
    let producer = tokio::task::spawn_blocking(move || {
        let keys: Vec<SeriesKey> = (0..SERIES).map(datasets::pmu_series).collect();
        let mut gens: Vec<_> = (0..SERIES).map(|b| datasets::pmu(b).peekable()).collect();
        loop {
            let batch: Vec<SeriesPoints> = keys
                .iter()
                .zip(gens.iter_mut())
                .map(|(k, g)| SeriesPoints { series: k.clone(), points: g.by_ref().take(PER_SERIES).collect() })
                .collect();
            if tx.blocking_send(batch).is_err() {
                return;
            }
        }
    });
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let written = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.in_flight {
        let (client, rx, written) = (client.clone(), rx.clone(), written.clone());
        workers.push(tokio::spawn(async move {
            while start.elapsed() < duration {
                let Some(batch) = rx.lock().await.recv().await else { break };
                let ack = client.write_batch(batch).await?;
                written.fetch_add(ack.points, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await.context("ingest worker panicked")??;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(rx);
    producer.await?;
    let points = written.load(Ordering::Relaxed);
    let rate = points as f64 / secs;
    println!(
        "ingest: {points} points in {secs:.1} s = {rate:.0} points/s (RF 3, W 2, batches of 5000, {} in flight)",
        args.in_flight
    );
    // Check, outside the timing, that what was acknowledged reads back: every batch carried
    // the next 50 points of each series.
    let reader = cluster.client(cluster.len() - 1).await?;
    let expected = points / u64::from(SERIES);
    let written_until = datasets::pmu_ts(expected);
    let got = reader.read(&datasets::pmu_series(0), TimeRange::new(T0, written_until + 1_000_000_000)?).await?;
    if got.len() as u64 != expected {
        bail!("after ingest, series 0 holds {} points; {expected} were acknowledged", got.len());
    }
    reader.close().await;
    client.close().await;
    Ok(json!({"rf": 3, "w": 2, "batch": SERIES as usize * PER_SERIES, "points_per_s": rate.round() as u64,
        "points": points, "seconds": round3(secs), "in_flight": args.in_flight}))
}

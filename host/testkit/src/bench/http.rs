//! `timeshard bench http`: the HTTP side under load, on node processes over loopback.
//!
//! - `line_protocol_points_per_s`: one node, durable, several connections each sending batches
//!   of 5,000 lines (`pmu` data, 100 series per connection) and waiting for each answer;
//! - `line_protocol_points_per_s_cluster`: the same against 3 nodes at RF 3, W 2, the
//!   connections spread over the nodes;
//! - `remote_write_samples_per_s`: one node, Prometheus remote-write requests of the same size;
//! - `query_1m_windows_day_ms`: `/query` of mean, min, max and count in 1-minute windows over
//!   one day of one `pmu` series (5,184,000 points, written over line protocol and sealed);
//! - `promql_range_rate_1d_1m_ms`, `promql_sum_by_1d_5m_ms` and their VictoriaMetrics
//!   counterparts: PromQL over a day of 100 counters ([`super::promql`]).
//!
//! The clients run in this process, on the same machine: their formatting and compression
//! share its cores with the nodes.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_formats::remote_write::{self, Label, Sample, TimeSeries, WriteRequest};
use timeshard_node::config::ClassConfig;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, HTTP_TOKEN, LocalCluster};
use crate::datasets::{T0, pmu_point, pmu_ts};
use crate::http_client::{HttpClient, encode};
use crate::stats::{Latencies, median, round3};

/// What `bench http` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct HttpBenchOptions {
    /// Connections sending at once.
    pub connections: usize,
    /// Lines (or samples) per request.
    pub batch: usize,
    /// Seconds of each ingest run.
    pub secs: u64,
    /// Runs of each ingest figure (the median is reported).
    pub reps: usize,
    /// Repetitions of the query (median and p99 reported).
    pub query_reps: usize,
    /// Seconds of 60 Hz data the query reads (one day by default).
    pub query_seconds: i64,
    /// Seconds of 15-second counters the PromQL queries read (one day by default).
    pub promql_seconds: i64,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for HttpBenchOptions {
    fn default() -> Self {
        HttpBenchOptions {
            connections: 8,
            batch: 5_000,
            secs: 5,
            reps: 3,
            query_reps: 20,
            query_seconds: 86_400,
            promql_seconds: 86_400,
            dir: None,
        }
    }
}

impl HttpBenchOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> HttpBenchOptions {
        HttpBenchOptions {
            connections: 2,
            batch: 1_000,
            secs: 1,
            reps: 1,
            query_reps: 3,
            query_seconds: 600,
            promql_seconds: 3_600,
            dir: None,
        }
    }
}

/// Series per connection in the ingest runs.
const SERIES: usize = 100;

/// Batch `b` of connection `c` of run `run`: `batch` lines of `pmu` data over [`SERIES`]
/// buses, site `r<run>c<c>` (so runs and connections write distinct series).
fn lines(run: usize, c: usize, b: u64, batch: usize) -> String {
    let per_series = (batch / SERIES).max(1) as u64;
    let mut out = String::with_capacity(batch * 64);
    for j in 0..per_series {
        let i = b * per_series + j;
        for bus in 0..SERIES as u32 {
            let p = pmu_point(bus, i);
            let _ = writeln!(out, "pmu.phase,bus={bus},site=r{run}c{c} value={} {}", p.value, p.ts);
        }
    }
    out
}

/// The same points as a remote-write request.
fn samples(run: usize, c: usize, b: u64, batch: usize) -> Vec<u8> {
    let per_series = (batch / SERIES).max(1) as u64;
    let timeseries = (0..SERIES as u32)
        .map(|bus| TimeSeries {
            labels: [("__name__", "pmu_phase".to_string()), ("bus", bus.to_string()), ("site", format!("r{run}c{c}"))]
                .into_iter()
                .map(|(n, v)| Label { name: n.to_string(), value: v })
                .collect(),
            samples: (0..per_series)
                .map(|j| {
                    let p = pmu_point(bus, b * per_series + j);
                    // Milliseconds: 60 Hz samples keep distinct times.
                    Sample { value: p.value, timestamp: p.ts / 1_000_000 }
                })
                .collect(),
        })
        .collect();
    remote_write::encode(&WriteRequest { timeseries })
}

#[derive(Clone, Copy)]
enum Kind {
    LineProtocol,
    RemoteWrite,
}

/// Points per second acknowledged by `connections` clients of `addrs` (round robin) sending
/// for `secs`.
async fn ingest(addrs: &[std::net::SocketAddr], kind: Kind, run: usize, o: &HttpBenchOptions) -> Result<f64> {
    let points = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(o.secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..o.connections {
        let addr = addrs[c % addrs.len()];
        let (points, batch) = (points.clone(), o.batch);
        tasks.push(tokio::spawn(async move {
            let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
            let mut b = 0u64;
            while Instant::now() < deadline {
                let (path, body, n) = match kind {
                    Kind::LineProtocol => ("/write", lines(run, c, b, batch).into_bytes(), batch),
                    Kind::RemoteWrite => ("/api/v1/write", samples(run, c, b, batch), batch),
                };
                let a = client.post(path, body).await?;
                if a.status != 204 {
                    bail!("{path} answered {}: {}", a.status, a.text());
                }
                points.fetch_add(n as u64, Ordering::Relaxed);
                b += 1;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(points.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn ingest_median(
    addrs: &[std::net::SocketAddr],
    kind: Kind,
    first_run: usize,
    o: &HttpBenchOptions,
) -> Result<(f64, Vec<f64>)> {
    let mut runs = Vec::new();
    for r in 0..o.reps {
        runs.push(ingest(addrs, kind, first_run + r, o).await?.round());
    }
    Ok((median(&runs), runs))
}

async fn start(nodes: usize, dir: &Path, binary: &Path) -> Result<LocalCluster> {
    let mut options = ClusterOptions::new(nodes, dir, binary);
    let (rf, w) = if nodes >= 3 { (3, 2) } else { (1, 1) };
    options.classes = vec![
        ClassConfig { name: "bench".into(), rf, w, r: w, ..Default::default() },
        // Scraped counters, one sample every 15 s: hour-long quanta, as the README advises for
        // Prometheus data (10-second quanta would hold one sample each).
        ClassConfig {
            name: "scraped".into(),
            metric_prefix: super::promql::METRIC.into(),
            quantum: super::promql::QUANTUM,
            rf,
            w,
            r: w,
            ..Default::default()
        },
    ];
    options.log = "warn".into();
    LocalCluster::start_converged(options).await
}

/// Waits until node `addr`'s store sealed everything (its open points are 0), at most a minute.
async fn wait_sealed(client: &mut HttpClient) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = client.get("/metrics").await?.text();
        let open = text.lines().find_map(|l| l.strip_prefix("timeshard_store_open_points ")).unwrap_or("1");
        if open.trim() == "0" || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `seconds` of `pmu` bus 1 as series `pmu.phase{bus=1,site=day}`, then times `/query`.
async fn query_day(addr: std::net::SocketAddr, o: &HttpBenchOptions) -> Result<(Latencies, u64)> {
    let total = (o.query_seconds * 60) as u64;
    let per_conn = total.div_ceil(o.connections as u64);
    let mut tasks = Vec::new();
    for c in 0..o.connections as u64 {
        let batch = o.batch as u64;
        tasks.push(tokio::spawn(async move {
            let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
            let (first, last) = (c * per_conn, ((c + 1) * per_conn).min(total));
            let mut i = first;
            while i < last {
                let end = (i + batch).min(last);
                let mut body = String::with_capacity((end - i) as usize * 56);
                for k in i..end {
                    let p = pmu_point(1, k);
                    let _ = writeln!(body, "pmu.phase,bus=1,site=day value={} {}", p.value, p.ts);
                }
                let a = client.post("/write", body).await?;
                if a.status != 204 {
                    bail!("/write answered {}: {}", a.status, a.text());
                }
                i = end;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    wait_sealed(&mut client).await?;
    let q = format!(
        "SELECT mean(value), min(value), max(value), count(value) FROM \"pmu.phase\" WHERE bus = '1' AND site = 'day' \
         AND time >= {T0} AND time < {} GROUP BY time(1m)",
        pmu_ts(total)
    );
    let path = format!("/query?epoch=ns&q={}", encode(&q));
    let mut lat = Latencies::default();
    let mut counted = 0;
    for rep in 0..o.query_reps + 2 {
        let t = Instant::now();
        let a = client.get(&path).await?;
        let took = t.elapsed();
        if a.status != 200 {
            bail!("/query answered {}: {}", a.status, a.text());
        }
        let v = a.json()?;
        let rows = v["results"][0]["series"][0]["values"].as_array().context("no rows in the answer")?.clone();
        counted = rows.iter().map(|r| r[4].as_u64().unwrap_or(0)).sum();
        // The first two warm the caches.
        if rep >= 2 {
            lat.push(took);
        }
    }
    if counted != total {
        bail!("the query counted {counted} points of the {total} written");
    }
    Ok((lat, counted))
}

/// Runs the benchmark with node processes of `binary` and returns its JSON document.
pub async fn run(binary: &Path, o: &HttpBenchOptions) -> Result<serde_json::Value> {
    let dir = WorkDir::new("http", o.dir.as_deref());
    measure(binary, dir.path(), o).await
}

async fn measure(binary: &Path, dir: &Path, o: &HttpBenchOptions) -> Result<serde_json::Value> {
    eprintln!("starting one node in {}", dir.display());
    let single = start(1, &dir.join("single"), binary).await?;
    let addr = single.http_addr(0).context("the node serves no HTTP")?;
    let client = single.client(0).await?;
    let floor = Floor::measure(single.dir(), &client).await?;
    client.close().await;
    println!("{}", floor.summary());

    let (lp, lp_runs) = ingest_median(&[addr], Kind::LineProtocol, 0, o).await?;
    println!(
        "line protocol, one node: {lp:.0} points/s (runs {lp_runs:?}; {} connections, {} lines per request)",
        o.connections, o.batch
    );
    let (rw, rw_runs) = ingest_median(&[addr], Kind::RemoteWrite, 100, o).await?;
    println!("remote write, one node: {rw:.0} samples/s (runs {rw_runs:?})");
    let (lat, points) = query_day(addr, o).await?;
    let (q50, q99) = (lat.percentile_ms(50.0), lat.percentile_ms(99.0));
    println!("/query 1-minute windows over {} points: p50 {q50:.2} ms, p99 {q99:.2} ms", points);
    let promql = super::promql::measure(addr, HTTP_TOKEN, dir, o.promql_seconds, o.query_reps.min(10)).await?;
    single.shutdown().await?;

    eprintln!("starting 3 nodes (RF 3, W 2)");
    let cluster = start(3, &dir.join("cluster"), binary).await?;
    let addrs: Vec<_> = (0..3).map(|i| cluster.http_addr(i).context("a node serves no HTTP")).collect::<Result<_>>()?;
    let (lpc, lpc_runs) = ingest_median(&addrs, Kind::LineProtocol, 200, o).await?;
    println!("line protocol, 3 nodes RF 3 W 2: {lpc:.0} points/s (runs {lpc_runs:?})");
    cluster.shutdown().await?;

    let mut doc = json!({
        "line_protocol_points_per_s": lp,
        "line_protocol_points_per_s_cluster": lpc,
        "remote_write_samples_per_s": rw,
        "query_1m_windows_day_ms": round3(q50),
        "floor": floor,
        "query_1m_windows_day_p99_ms": round3(q99),
        "query_points": points,
        "runs": {"line_protocol": lp_runs, "line_protocol_cluster": lpc_runs, "remote_write": rw_runs},
        "settings": {"connections": o.connections, "batch": o.batch, "secs": o.secs, "reps": o.reps,
            "query_reps": o.query_reps, "series_per_connection": SERIES, "fsync": "durable"},
    });
    if let (Some(doc), serde_json::Value::Object(promql)) = (doc.as_object_mut(), promql) {
        doc.extend(promql);
    }
    Ok(doc)
}

//! `timeshard bench http`: the HTTP side under load, on node processes over loopback.
//!
//! - `line_protocol_points_per_s`: one node, durable, several connections each sending batches
//!   of 5,000 lines (`pmu` data, 100 series per connection) and waiting for each answer;
//! - `line_protocol_points_per_s_cluster`: the same against 3 nodes at RF 3, W 2, the
//!   connections spread over the nodes;
//! - `remote_write_samples_per_s`: one node, Prometheus remote-write requests of the same size;
//! - `live_line_protocol_points_per_s`: the same with timestamps near now (quanta still open),
//!   with `live_overloaded_pct` and `live_rss_mb_peak`;
//! - `*_overloaded_pct`: requests the node answered 503 (its memory budget), each sent again
//!   after a pause as Telegraf and Prometheus do; `*_rss_mb_peak`: the node's peak resident
//!   memory during each single-node phase, beside `memory_budget_mb`;
//! - `query_1m_windows_day_ms`: `/query` of mean, min, max and count in 1-minute windows over
//!   one day of one `pmu` series (5,184,000 points, written over line protocol and sealed);
//! - `read_http_{10s,150s,1h,day}_ms` (JSON), `read_http_csv_*`, `read_http_day_rss_mb`, beside
//!   the SDK's `read_sdk_*`: raw reads of that series ([`super::http_reads`]);
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

/// `batch` lines of [`SERIES`] buses (site `live<run>c<c>`) stamped from now on, a microsecond
/// apart within a series: live data, in quanta still open.
fn live_lines(run: usize, c: usize, batch: usize) -> String {
    let per_series = (batch / SERIES).max(1) as u64;
    let now = timeshard_clock::now_ns();
    let mut out = String::with_capacity(batch * 64);
    for j in 0..per_series {
        for bus in 0..SERIES as u32 {
            let p = pmu_point(bus, j);
            let _ =
                writeln!(out, "pmu.phase,bus={bus},site=live{run}c{c} value={} {}", p.value, now + j as i64 * 1_000);
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
    /// Line protocol with timestamps near now (open quanta).
    LiveLineProtocol,
}

/// What one ingest run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Ingested {
    /// Points acknowledged per second.
    points_per_s: f64,
    /// Requests sent, and those answered 503 (memory budget or another limit: retried after a
    /// pause, as Telegraf and Prometheus retry).
    requests: u64,
    overloaded: u64,
}

/// Posts `body` to `path` until the node takes it (204) and returns how many times it answered
/// 503 first ([`HttpClient::send_until_taken`]); any other answer is an error.
async fn post_until_taken(client: &mut HttpClient, path: &str, body: Vec<u8>) -> Result<u64> {
    let (a, refused) = client.send_until_taken(hyper::Method::POST, path, &[], body).await?;
    if a.status.as_u16() != 204 {
        bail!("{path} answered {}: {}", a.status, a.text());
    }
    Ok(refused)
}

/// Points per second acknowledged by `connections` clients of `addrs` (round robin) sending
/// for `secs`; a request answered 503 is sent again after a pause and counted.
async fn ingest(addrs: &[std::net::SocketAddr], kind: Kind, run: usize, o: &HttpBenchOptions) -> Result<Ingested> {
    let points = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let overloaded = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(o.secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..o.connections {
        let addr = addrs[c % addrs.len()];
        let (points, requests, overloaded, batch) = (points.clone(), requests.clone(), overloaded.clone(), o.batch);
        tasks.push(tokio::spawn(async move {
            let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
            let mut b = 0u64;
            while Instant::now() < deadline {
                let (path, body, n) = match kind {
                    Kind::LineProtocol => ("/write", lines(run, c, b, batch).into_bytes(), batch),
                    Kind::RemoteWrite => ("/api/v1/write", samples(run, c, b, batch), batch),
                    Kind::LiveLineProtocol => ("/write", live_lines(run, c, batch).into_bytes(), batch),
                };
                let refused = post_until_taken(&mut client, path, body).await?;
                requests.fetch_add(1 + refused, Ordering::Relaxed);
                overloaded.fetch_add(refused, Ordering::Relaxed);
                points.fetch_add(n as u64, Ordering::Relaxed);
                b += 1;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(Ingested {
        points_per_s: points.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
        requests: requests.load(Ordering::Relaxed),
        overloaded: overloaded.load(Ordering::Relaxed),
    })
}

/// The median rate of `o.reps` runs, the runs, and the share of requests answered 503 over all
/// of them (percent).
async fn ingest_median(
    addrs: &[std::net::SocketAddr],
    kind: Kind,
    first_run: usize,
    o: &HttpBenchOptions,
) -> Result<(f64, Vec<f64>, f64)> {
    let mut runs = Vec::new();
    let (mut requests, mut overloaded) = (0, 0);
    for r in 0..o.reps {
        let run = ingest(addrs, kind, first_run + r, o).await?;
        runs.push(run.points_per_s.round());
        requests += run.requests;
        overloaded += run.overloaded;
    }
    let overloaded_pct = if requests == 0 { 0.0 } else { 100.0 * overloaded as f64 / requests as f64 };
    Ok((median(&runs), runs, round3(overloaded_pct)))
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
pub(super) async fn wait_sealed(client: &mut HttpClient) -> Result<()> {
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
                post_until_taken(&mut client, "/write", body.into_bytes()).await?;
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

    let pid = single.pid(0).context("the node's process id")?;
    // Peak resident memory of the node while a phase ran, in MiB (the peak is started over
    // before each phase).
    let phase_peak_mb = |pid| -> Result<f64> {
        let peak = crate::procfs::memory(pid)?.peak;
        crate::procfs::reset_peak(pid)?;
        Ok(round3(peak as f64 / f64::from(1 << 20)))
    };
    phase_peak_mb(pid)?;
    let (lp, lp_runs, lp_overloaded) = ingest_median(&[addr], Kind::LineProtocol, 0, o).await?;
    let lp_rss = phase_peak_mb(pid)?;
    println!(
        "line protocol, one node: {lp:.0} points/s (runs {lp_runs:?}; {} connections, {} lines per request); \
         {lp_overloaded} % of requests answered 503; node peak RSS {lp_rss} MiB",
        o.connections, o.batch
    );
    let (rw, rw_runs, rw_overloaded) = ingest_median(&[addr], Kind::RemoteWrite, 100, o).await?;
    let rw_rss = phase_peak_mb(pid)?;
    println!(
        "remote write, one node: {rw:.0} samples/s (runs {rw_runs:?}); {rw_overloaded} % answered 503; \
         node peak RSS {rw_rss} MiB"
    );
    let (live, live_runs, live_overloaded) = ingest_median(&[addr], Kind::LiveLineProtocol, 300, o).await?;
    let live_rss = phase_peak_mb(pid)?;
    println!(
        "live line protocol (timestamps near now), one node: {live:.0} points/s (runs {live_runs:?}); \
         {live_overloaded} % answered 503; node peak RSS {live_rss} MiB"
    );
    let (lat, points) = query_day(addr, o).await?;
    let (q50, q99) = (lat.percentile_ms(50.0), lat.percentile_ms(99.0));
    let query_rss = phase_peak_mb(pid)?;
    println!(
        "/query 1-minute windows over {} points: p50 {q50:.2} ms, p99 {q99:.2} ms; node peak RSS {query_rss} MiB \
         (writing the day and querying it)",
        points
    );
    let sdk = single.client(0).await?;
    let day_series = "pmu.phase{bus=1,site=day}";
    let reads = super::http_reads::measure(addr, &sdk, day_series, o.query_seconds, o.query_reps.min(10), || {
        phase_peak_mb(pid)
    })
    .await?;
    sdk.close().await;
    let promql = super::promql::measure(addr, HTTP_TOKEN, dir, o.promql_seconds, o.query_reps.min(10)).await?;
    single.shutdown().await?;

    eprintln!("starting 3 nodes (RF 3, W 2)");
    let cluster = start(3, &dir.join("cluster"), binary).await?;
    let addrs: Vec<_> = (0..3).map(|i| cluster.http_addr(i).context("a node serves no HTTP")).collect::<Result<_>>()?;
    let (lpc, lpc_runs, lpc_overloaded) = ingest_median(&addrs, Kind::LineProtocol, 200, o).await?;
    println!("line protocol, 3 nodes RF 3 W 2: {lpc:.0} points/s (runs {lpc_runs:?}); {lpc_overloaded} % answered 503");
    cluster.shutdown().await?;

    let mut doc = json!({
        "line_protocol_points_per_s": lp,
        "line_protocol_points_per_s_cluster": lpc,
        "remote_write_samples_per_s": rw,
        "line_protocol_overloaded_pct": lp_overloaded,
        "line_protocol_overloaded_pct_cluster": lpc_overloaded,
        "remote_write_overloaded_pct": rw_overloaded,
        "line_protocol_rss_mb_peak": lp_rss,
        "remote_write_rss_mb_peak": rw_rss,
        "live_line_protocol_points_per_s": live,
        "live_overloaded_pct": live_overloaded,
        "live_rss_mb_peak": live_rss,
        "query_day_rss_mb_peak": query_rss,
        "memory_budget_mb": timeshard_node::budget::MemoryConfig::default().budget.0 >> 20,
        "query_1m_windows_day_ms": round3(q50),
        "floor": floor,
        "query_1m_windows_day_p99_ms": round3(q99),
        "query_points": points,
        "runs": {"live_line_protocol": live_runs, "line_protocol": lp_runs, "line_protocol_cluster": lpc_runs, "remote_write": rw_runs},
        "settings": {"connections": o.connections, "batch": o.batch, "secs": o.secs, "reps": o.reps,
            "query_reps": o.query_reps, "series_per_connection": SERIES, "fsync": "durable"},
    });
    if let (Some(doc), serde_json::Value::Object(promql)) = (doc.as_object_mut(), promql) {
        doc.extend(promql);
        doc.extend(reads);
    }
    Ok(doc)
}

//! `timeshard bench hostile`: what each HTTP attack of the hostile-input issue costs a
//! well-behaved client, on one node process over loopback with the default memory budget.
//!
//! A client reads 100 points of one series through `/v1/read` in a loop, first alone (the
//! baseline), then during each attack in turn; each attack gets the node to itself apart from
//! that client. Per attack: the client's read p99 and its ratio to the baseline's, the node's
//! peak resident memory during the attack (Linux: `VmHWM`, reset before each attack) against
//! its budget, the statuses the attacker got, and whether the node survived. The attackers run
//! in this process and share the machine's cores with the node.
//!
//! Attacks: InfluxQL `WHERE` clauses nested 10,000 and 200,000 deep; a 20 MB line; a 1 MB
//! series key; an aggregate of 100,000 windows x the wide series; slowloris connections that
//! send a header byte a second; concurrent 32 MiB bodies; concurrent gzip bodies that inflate
//! to 30 MiB. The QUIC attacks (nested located envelopes, idle connections) are measured by the
//! end-to-end tests, not here yet.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_node::budget::ByteSize;
use timeshard_node::config::ClassConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, HTTP_AUTHORIZATION, HTTP_TOKEN, LocalCluster};
use crate::http_client::{HttpClient, encode};
use crate::stats::{Latencies, round3};

/// What `bench hostile` runs; `Default` is the benchmark as specified.
#[derive(Clone, Debug)]
pub struct HostileBenchOptions {
    /// Seconds of the baseline and of each attack.
    pub secs: u64,
    /// The node's memory budget.
    pub budget: u64,
    /// Series of the wide aggregate (one point each).
    pub series: usize,
    /// Slowloris connections held open at once.
    pub slowloris: usize,
    /// Large bodies (and, a sixteenth of them, gzip bodies) sent at once.
    pub bodies: usize,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for HostileBenchOptions {
    fn default() -> Self {
        HostileBenchOptions { secs: 10, budget: 256 << 20, series: 10_000, slowloris: 1_000, bodies: 256, dir: None }
    }
}

impl HostileBenchOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> HostileBenchOptions {
        HostileBenchOptions { secs: 2, series: 500, slowloris: 50, bodies: 16, ..HostileBenchOptions::default() }
    }
}

/// 2023-11-14T22:13:20Z in seconds: where the benchmark's points lie.
const T: i64 = 1_700_000_000;
/// Points of the well-behaved client's series, all read each time.
const WELL_POINTS: i64 = 100;
const MIB: usize = 1 << 20;

/// The attacks, by the name the JSON document gives them.
const ATTACKS: &[&str] = &[
    "influxql_nested_10000",
    "influxql_nested_200000",
    "line_20mb",
    "series_key_1mb",
    "aggregate_100000_windows",
    "slowloris",
    "bodies_32mib",
    "gzip_30mib",
];

/// Peak resident bytes of `pid` since start or its last reset (Linux: `VmHWM`; 0 elsewhere).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok());
    kb.unwrap_or(0u64) * 1024
}

/// Starts `pid`'s peak resident memory over from its current (Linux: `clear_refs` 5).
fn reset_peak_rss(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// Sends one request by hand (`head` without its final blank line), the body whole; the
/// answer's status, or 0 when the node closed without one.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> Result<u16> {
    let mut tcp = TcpStream::connect(addr).await?;
    // With the cluster's token: an attacker holding one reaches every limit.
    let request =
        format!("{head}\r\n{HTTP_AUTHORIZATION}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    tcp.write_all(request.as_bytes()).await?;
    // The node may answer (and close) before the whole body is sent: that is an answer too.
    let _ = tcp.write_all(body).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    Ok(text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0))
}

/// Statuses an attacker got, by code (0: closed without an answer).
#[derive(Default)]
struct Statuses(BTreeMap<u16, u64>);

impl Statuses {
    fn add(&mut self, status: u16) {
        *self.0.entry(status).or_default() += 1;
    }

    fn merge(&mut self, other: Statuses) {
        for (k, v) in other.0 {
            *self.0.entry(k).or_default() += v;
        }
    }

    fn json(&self) -> serde_json::Value {
        json!(self.0.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>())
    }
}

/// The well-behaved client: reads its series until `stop`, checking every answer.
async fn well_behaved(addr: SocketAddr, stop: Arc<AtomicBool>) -> Result<Latencies> {
    let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let path = format!("/v1/read?series=well&start={}&end={}", T * 1_000_000_000, (T + WELL_POINTS) * 1_000_000_000);
    let mut lat = Latencies::default();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let a = client.get(&path).await?;
        if a.status != 200 {
            bail!("the well-behaved read got {}: {}", a.status, a.text());
        }
        let points = a.json()?["points"].as_array().map_or(0, Vec::len);
        if points != WELL_POINTS as usize {
            bail!("the well-behaved read got {points} points of {WELL_POINTS}");
        }
        lat.push(started.elapsed());
    }
    Ok(lat)
}

/// One attacker's requests, repeated until `stop`; `parallel` of them at once.
async fn repeat<F, Fut>(parallel: usize, stop: &Arc<AtomicBool>, request: F) -> Result<Statuses>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u16>> + Send,
{
    let request = Arc::new(request);
    let tasks: Vec<_> = (0..parallel)
        .map(|_| {
            let (stop, request) = (stop.clone(), request.clone());
            tokio::spawn(async move {
                let mut statuses = Statuses::default();
                while !stop.load(Ordering::Relaxed) {
                    statuses.add(request().await?);
                }
                anyhow::Ok(statuses)
            })
        })
        .collect();
    let mut all = Statuses::default();
    for t in tasks {
        all.merge(t.await??);
    }
    Ok(all)
}

/// `n` connections that send their request head one byte a second, each opened again when the
/// node closes it, until `stop`; the statuses the node answered them with (0: closed silently).
async fn slowloris(addr: SocketAddr, n: usize, stop: &Arc<AtomicBool>) -> Result<Statuses> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut statuses = Statuses::default();
                while !stop.load(Ordering::Relaxed) {
                    let Ok(tcp) = TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let (mut rd, mut wr) = tcp.into_split();
                    let head = format!("POST /write HTTP/1.1\r\nHost: {addr}\r\n{HTTP_AUTHORIZATION}\r\nX-Slow: ");
                    let writer = tokio::spawn(async move {
                        for b in head.bytes().chain(std::iter::repeat(b'x')) {
                            if wr.write_all(&[b]).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    });
                    let mut answer = Vec::new();
                    let stopped = async {
                        while !stop.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    };
                    tokio::select! {
                        _ = rd.read_to_end(&mut answer) => {
                            let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
                            statuses.add(text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0));
                        }
                        _ = stopped => {}
                    }
                    writer.abort();
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Statuses::default();
    for t in tasks {
        statuses.merge(t.await?);
    }
    Ok(statuses)
}

/// Runs attack `name` until `stop`.
async fn attack(name: &str, addr: SocketAddr, o: &HostileBenchOptions, stop: &Arc<AtomicBool>) -> Result<Statuses> {
    let host = format!("Host: {addr}");
    let nested = |depth: usize| {
        let q = format!("SELECT value FROM m WHERE {}a = 'b'{}", "(".repeat(depth), ")".repeat(depth));
        Arc::new(format!("q={}", encode(&q)).into_bytes())
    };
    let post = |path: &str, extra: &str| format!("POST {path} HTTP/1.1\r\n{host}{extra}");
    match name {
        "influxql_nested_10000" | "influxql_nested_200000" => {
            let body = nested(if name.ends_with("10000") { 10_000 } else { 200_000 });
            let head = post("/query", "\r\nContent-Type: application/x-www-form-urlencoded");
            repeat(2, stop, move || {
                let (head, body) = (head.clone(), body.clone());
                async move { raw(addr, &head, &body).await }
            })
            .await
        }
        "line_20mb" | "series_key_1mb" => {
            let line = if name == "line_20mb" {
                format!("big,site=atl value=1,{}=2 {T}\n", "f".repeat(20 * MIB))
            } else {
                format!("big,site={} value=1 {T}\n", "a".repeat(MIB))
            };
            let (body, head) = (Arc::new(line.into_bytes()), post("/write?precision=s", ""));
            repeat(2, stop, move || {
                let (head, body) = (head.clone(), body.clone());
                async move { raw(addr, &head, &body).await }
            })
            .await
        }
        "aggregate_100000_windows" => {
            let q = format!(
                "SELECT mean(value) FROM wide WHERE time >= {T}s AND time < {}s GROUP BY time(1s)",
                T + 100_000
            );
            let head = format!("GET /query?q={} HTTP/1.1\r\n{host}", encode(&q));
            repeat(2, stop, move || {
                let head = head.clone();
                async move { raw(addr, &head, b"").await }
            })
            .await
        }
        "slowloris" => slowloris(addr, o.slowloris, stop).await,
        "bodies_32mib" => {
            let mut body =
                "# padding padding padding padding padding padding padding padding padding\n".repeat(32 * MIB / 76);
            body.push_str(&format!("bulk value=1 {T}\n"));
            let (body, head) = (Arc::new(body.into_bytes()), post("/write?precision=s", ""));
            repeat(o.bodies, stop, move || {
                let (head, body) = (head.clone(), body.clone());
                async move { raw(addr, &head, &body).await }
            })
            .await
        }
        "gzip_30mib" => {
            let padding =
                "# padding padding padding padding padding padding padding padding padding\n".repeat(30 * MIB / 76);
            let bomb = timeshard_formats::compression::gzip(format!("{padding}bulk value=2 {T}\n").as_bytes());
            let (body, head) = (Arc::new(bomb), post("/write?precision=s", "\r\nContent-Encoding: gzip"));
            repeat((o.bodies / 16).max(2), stop, move || {
                let (head, body) = (head.clone(), body.clone());
                async move { raw(addr, &head, &body).await }
            })
            .await
        }
        other => bail!("unknown attack {other}"),
    }
}

/// The well-behaved client alone for `o.secs`, or beside attack `name`: its latencies and the
/// attacker's statuses.
async fn phase(name: Option<&str>, addr: SocketAddr, o: &HostileBenchOptions) -> Result<(Latencies, Statuses)> {
    let stop = Arc::new(AtomicBool::new(false));
    let well = tokio::spawn(well_behaved(addr, stop.clone()));
    let attacker = name.map(|n| {
        let (n, o, stop) = (n.to_string(), o.clone(), stop.clone());
        tokio::spawn(async move { attack(&n, addr, &o, &stop).await })
    });
    tokio::time::sleep(Duration::from_secs(o.secs)).await;
    stop.store(true, Ordering::Relaxed);
    let lat = well.await?.context("the well-behaved client")?;
    let statuses = match attacker {
        Some(a) => tokio::time::timeout(Duration::from_secs(120), a).await.context("the attack did not stop")??,
        None => Ok(Statuses::default()),
    }?;
    Ok((lat, statuses))
}

/// Runs the benchmark with a node process of `binary` and returns its JSON document.
pub async fn run(binary: &Path, o: &HostileBenchOptions) -> Result<serde_json::Value> {
    let dir = WorkDir::new("hostile", o.dir.as_deref());
    measure(binary, dir.path(), o).await
}

async fn measure(binary: &Path, dir: &Path, o: &HostileBenchOptions) -> Result<serde_json::Value> {
    let mut options = ClusterOptions::new(1, dir, binary);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.memory.budget = ByteSize(o.budget);
    options.log = "warn".into();
    eprintln!("starting one node in {} (memory budget {} MiB)", dir.display(), o.budget >> 20);
    let cluster = LocalCluster::start_converged(options).await?;
    let addr = cluster.http_addr(0).context("the node serves no HTTP")?;
    let pid = cluster.pid(0).context("the node has no process id")?;
    let client = cluster.client(0).await?;
    let floor = Floor::measure(cluster.dir(), &client).await?;
    client.close().await;
    println!("{}", floor.summary());

    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let well: String = (0..WELL_POINTS).map(|i| format!("well value={i} {}\n", T + i)).collect();
    let wide: String = (0..o.series).map(|i| format!("wide,n={i} value={i} {T}\n")).collect();
    for body in [well, wide] {
        let a = c.post("/write?precision=s", body).await?;
        if a.status != 204 {
            bail!("loading the data: {} {}", a.status, a.text());
        }
    }
    let started_rss = peak_rss(pid);

    let (base, _) = phase(None, addr, o).await?;
    let base_p99 = base.percentile_ms(99.0);
    println!("baseline: {} reads, p99 {base_p99:.2} ms", base.len());
    let mut attacks = Vec::new();
    let mut worst: (f64, u64) = (0.0, 0);
    for name in ATTACKS {
        reset_peak_rss(pid);
        let (lat, statuses) = phase(Some(name), addr, o).await?;
        let survived = cluster.is_running(0) && c.get("/ping").await.is_ok_and(|a| a.status == 204);
        let peak = peak_rss(pid);
        let p99 = lat.percentile_ms(99.0);
        let ratio = if base_p99 > 0.0 { p99 / base_p99 } else { 0.0 };
        worst = (worst.0.max(ratio), worst.1.max(peak));
        println!(
            "{name}: {} reads, p99 {p99:.2} ms ({ratio:.2} x), peak RSS {} MiB of {} MiB, survived {survived}, \
             attacker got {:?}",
            lat.len(),
            peak >> 20,
            o.budget >> 20,
            statuses.0
        );
        attacks.push(json!({
            "attack": name,
            "reads": lat.len(),
            "p99_ms": round3(p99),
            "p50_ms": round3(lat.percentile_ms(50.0)),
            "p99_ratio": round3(ratio),
            "peak_rss_bytes": peak,
            "peak_rss_over_budget": round3(peak as f64 / o.budget as f64),
            "statuses": statuses.json(),
            "survived": survived,
        }));
        if !survived {
            break;
        }
    }
    cluster.shutdown().await?;
    Ok(json!({
        "baseline_p99_ms": round3(base_p99),
        "baseline_p50_ms": round3(base.percentile_ms(50.0)),
        "baseline_reads": base.len(),
        "attacks": attacks,
        "worst_p99_ratio": round3(worst.0),
        "max_peak_rss_bytes": worst.1,
        "budget_bytes": o.budget,
        "started_rss_bytes": started_rss,
        "floor": floor,
        "settings": {"secs": o.secs, "series": o.series, "slowloris": o.slowloris, "bodies": o.bodies,
            "well_behaved": "GET /v1/read of 100 points in a loop, one connection"},
    }))
}

//! `timeshard bench hostile`: what each attack of the hostile-input issue, over HTTP and over
//! QUIC, costs a well-behaved client, on one node process over loopback with the default memory
//! budget.
//!
//! Each attack gets a node process of its own (the node is started anew on the same data
//! before every attack but the first), so that what one attack leaves resident neither counts
//! against the next nor pushes the node over its budget before the next begins. On that
//! process, a client reads 100 points of one series through `/v1/read` in a loop, first alone
//! for `secs` (the attack's baseline), then during the attack; beside it, an SDK client with a
//! certificate of its own reads 100 points over QUIC every 5 ms (the `quic_` keys). Per attack:
//! the HTTP client's read p99 and its ratio to its baseline's, the same for the QUIC client,
//! the node's peak resident memory during the attack (Linux: `VmHWM`, reset before the attack
//! to what is resident then, `rss_at_start_bytes`) against its budget and what stays resident
//! after it (`rss_after_bytes`), what the attacker got, whether the node survived, and the CPU
//! time of the node and of this process (`bench_cpu_s`: attackers and clients) during it. The
//! top-level `baseline_` keys are the medians of the attacks' baselines; `load_average_1m` is
//! the machine's when the attacks begin. The attackers run in this process, on threads of
//! their own at a lower priority (Linux nice [`ATTACKER_NICE`]): an attacker is another machine,
//! and one sharing the node's two cores at the same priority measured its own cost as much as
//! the node's (with 256 bodies of 32 MiB it took 1.2 cores, the node 0.7). The node's work on
//! every attack request is still at full priority. The two clients run on a thread of their
//! own, so they never wait behind the attackers' tasks. An attack that is a fixed amount of work (a round of
//! connections, a request in flight) finishes it after `secs`, and the clients read until it
//! has.
//!
//! HTTP attacks: InfluxQL `WHERE` clauses nested 10,000 and 200,000 deep; a 20 MB line; a 1 MB
//! series key; an aggregate of 100,000 windows x the wide series; slowloris connections that
//! send a header byte a second; concurrent 32 MiB bodies; concurrent gzip bodies that inflate
//! to 30 MiB. QUIC attacks ([`quic`]): frames of located envelopes nested 100,000 deep, and
//! rounds of 10,000 idle connections from one client certificate. What the attacker got is
//! counted by HTTP status (0: closed without one), by the wire error code of the QUIC answers,
//! and by `open`, `refused` (the per-certificate cap) and `failed` for the connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use timeshard_node::budget::ByteSize;
use timeshard_node::config::{ClassConfig, LimitsConfig};
use timeshard_node::pki::{self, Role};
use timeshard_proto::Point;
use timeshard_sdk::tls::TlsFiles;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::WorkDir;
use super::floor::Floor;
use crate::cluster::{ClusterOptions, HTTP_AUTHORIZATION, HTTP_TOKEN, LocalCluster};
use crate::http_client::{HttpClient, encode, raw_request};
use crate::procfs;
use crate::stats::{Latencies, round3};

mod quic;

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
    /// Connections of each round of the idle-connection attack.
    pub idle_connections: usize,
    /// The attacks to run, by name (empty: all of them, in [`ATTACKS`]' order).
    pub only: Vec<String>,
    /// Working directory (`None`: a new temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
}

impl Default for HostileBenchOptions {
    fn default() -> Self {
        HostileBenchOptions {
            secs: 10,
            budget: 256 << 20,
            series: 10_000,
            slowloris: 1_000,
            bodies: 256,
            idle_connections: 10_000,
            only: Vec::new(),
            dir: None,
        }
    }
}

impl HostileBenchOptions {
    /// Tiny sizes, to check the benchmark runs (figures are not meaningful).
    pub fn quick() -> HostileBenchOptions {
        HostileBenchOptions {
            secs: 2,
            series: 500,
            slowloris: 50,
            bodies: 16,
            idle_connections: 300,
            ..HostileBenchOptions::default()
        }
    }
}

/// How much lower the attackers' threads' priority is than the node's and the clients'.
pub const ATTACKER_NICE: i32 = 10;

/// 2023-11-14T22:13:20Z in seconds: where the benchmark's points lie.
const T: i64 = 1_700_000_000;
/// Points of the well-behaved client's series, all read each time.
const WELL_POINTS: i64 = 100;
const MIB: usize = 1 << 20;

/// The attacks, by the name the JSON document gives them.
pub const ATTACKS: &[&str] = &[
    "influxql_nested_10000",
    "influxql_nested_200000",
    "line_20mb",
    "series_key_1mb",
    "aggregate_100000_windows",
    "slowloris",
    "bodies_32mib",
    "gzip_30mib",
    "located_nested_100000",
    "quic_idle_connections",
];

/// Peak resident bytes of `pid` since start or its last reset (Linux: `VmHWM`; 0 elsewhere).
fn peak_rss(pid: u32) -> u64 {
    procfs::memory(pid).map_or(0, |m| m.peak)
}

/// Resident bytes of `pid` now (0 where `/proc` cannot tell).
fn rss(pid: u32) -> u64 {
    procfs::memory(pid).map_or(0, |m| m.rss)
}

/// CPU time `pid` has used so far (zero where `/proc` cannot tell).
fn cpu_time(pid: u32) -> Duration {
    procfs::cpu_time(pid).unwrap_or_default()
}

/// Sends one request by hand ([`raw_request`]); the answer's status, or 0 when the node closed
/// without one.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> Result<u16> {
    let (answer, _) = raw_request(addr, head, body, Duration::from_secs(60)).await?;
    let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    Ok(text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0))
}

/// What an attacker got, counted by answer: an HTTP status (0: closed without an answer), a
/// wire error code, or what became of a connection.
#[derive(Default)]
struct Statuses(BTreeMap<String, u64>);

impl Statuses {
    fn add(&mut self, what: impl ToString) {
        *self.0.entry(what.to_string()).or_default() += 1;
    }

    fn merge(&mut self, other: Statuses) {
        for (k, v) in other.0 {
            *self.0.entry(k).or_default() += v;
        }
    }

    fn json(&self) -> serde_json::Value {
        json!(self.0.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>())
    }
}

/// The well-behaved client: reads its series until `stop`, checking every answer. It connects
/// again when an answer says `Connection: close` (the node's `max_requests_per_connection`),
/// as a keep-alive client does; that read's time includes the new connection.
async fn well_behaved(addr: SocketAddr, stop: Arc<AtomicBool>) -> Result<Latencies> {
    let mut client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let path = format!("/v1/read?series=well&start={}&end={}", T * 1_000_000_000, (T + WELL_POINTS) * 1_000_000_000);
    let mut lat = Latencies::default();
    let mut closed = false;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if closed {
            client = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
        }
        let a = client.get(&path).await?;
        closed = a.headers.get(http::header::CONNECTION).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        if a.status != 200 {
            bail!("the well-behaved read got {}: {}", a.status, a.text());
        }
        let points = a.read_points()?.len();
        if points != WELL_POINTS as usize {
            bail!("the well-behaved read got {points} points of {WELL_POINTS}");
        }
        lat.push(started.elapsed());
    }
    Ok(lat)
}

/// Whether the node answers `GET /ping` on a new connection.
async fn ping(addr: SocketAddr) -> bool {
    match HttpClient::connect(addr, Some(HTTP_TOKEN)).await {
        Ok(mut c) => c.get("/ping").await.is_ok_and(|a| a.status == 204),
        Err(_) => false,
    }
}

/// One attacker's requests, repeated until `stop`; `parallel` of them at once.
async fn repeat<F, Fut, K>(parallel: usize, stop: &Arc<AtomicBool>, request: F) -> Result<Statuses>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<K>> + Send,
    K: ToString + Send + 'static,
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

/// Where the attacks aim.
struct Target {
    /// The node's HTTP side.
    http: SocketAddr,
    quic: quic::QuicTarget,
}

/// Runs attack `name` until `stop`.
async fn attack(name: &str, target: &Target, o: &HostileBenchOptions, stop: &Arc<AtomicBool>) -> Result<Statuses> {
    let addr = target.http;
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
        "located_nested_100000" => quic::nested_located(&target.quic, stop).await,
        "quic_idle_connections" => quic::idle_connections(&target.quic, o.idle_connections, stop).await,
        other => bail!("unknown attack {other}"),
    }
}

/// The well-behaved clients, on a runtime of their own: one thread apart from the attackers'
/// tasks, as a client in another process would be (the machine's cores are still shared), so
/// their latency is the node's and the machine's, not a wait behind the attackers' tasks.
struct Readers {
    runtime: Option<tokio::runtime::Runtime>,
    /// The SDK client's certificate.
    tls: TlsFiles,
    /// The SDK client (its endpoint driven by `runtime`), and the points it reads back.
    quic: timeshard_sdk::Client,
    points: Vec<Point>,
}

impl Readers {
    /// Connects the SDK client to `addr` with `tls` and writes its points.
    async fn start(addr: SocketAddr, tls: TlsFiles) -> Result<Readers> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("well-behaved")
            .enable_all()
            .build()?;
        let quic = Readers::connect_on(&runtime, addr, tls.clone()).await?;
        let points: Vec<Point> = (0..WELL_POINTS).map(|i| Point::new((T + i) * 1_000_000_000, i as f64)).collect();
        quic.write(&WELL_QUIC.parse()?, &points).await?;
        Ok(Readers { runtime: Some(runtime), tls, quic, points })
    }

    /// Connects the SDK client again, to a node process started anew at `addr`.
    async fn reconnect(&mut self, addr: SocketAddr) -> Result<()> {
        let runtime = self.runtime.as_ref().expect("running until dropped");
        self.quic = Readers::connect_on(runtime, addr, self.tls.clone()).await?;
        Ok(())
    }

    async fn connect_on(
        runtime: &tokio::runtime::Runtime,
        addr: SocketAddr,
        tls: TlsFiles,
    ) -> Result<timeshard_sdk::Client> {
        Ok(runtime.spawn(async move { timeshard_sdk::Client::connect(addr, &tls).await }).await??)
    }

    fn spawn<F: std::future::Future<Output = Result<Latencies>> + Send + 'static>(
        &self,
        f: F,
    ) -> tokio::task::JoinHandle<Result<Latencies>> {
        self.runtime.as_ref().expect("running until dropped").spawn(f)
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // A runtime dropped in an asynchronous context would block it.
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}

/// The SDK client's series.
const WELL_QUIC: &str = "well.quic";

/// What the well-behaved clients measured during one phase, and what the attacker got.
struct Phase {
    http: Latencies,
    quic: Latencies,
    statuses: Statuses,
    /// How long the phase lasted (longer than `secs` when an attack finished what it had begun).
    secs: f64,
}

/// The well-behaved clients alone for `o.secs`, or beside attack `name` until it has stopped.
async fn phase(
    name: Option<&str>,
    target: &Arc<Target>,
    readers: &Readers,
    attackers: &tokio::runtime::Handle,
    o: &HostileBenchOptions,
) -> Result<Phase> {
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let well_stop = Arc::new(AtomicBool::new(false));
    let well = readers.spawn(well_behaved(target.http, well_stop.clone()));
    let (client, points) = (readers.quic.clone(), readers.points.clone());
    let well_quic = readers.spawn(quic::well_behaved(client, WELL_QUIC.parse()?, points, well_stop.clone()));
    let attacker = name.map(|n| {
        let (n, o, stop, target) = (n.to_string(), o.clone(), stop.clone(), target.clone());
        attackers.spawn(async move { attack(&n, &target, &o, &stop).await })
    });
    tokio::time::sleep(Duration::from_secs(o.secs)).await;
    stop.store(true, Ordering::Relaxed);
    // The clients read until the attacker has finished what it had begun.
    let statuses = match attacker {
        Some(a) => tokio::time::timeout(Duration::from_secs(600), a).await.context("the attack did not stop")??,
        None => Ok(Statuses::default()),
    };
    well_stop.store(true, Ordering::Relaxed);
    let http = well.await?.context("the well-behaved HTTP client")?;
    let quic = well_quic.await?.context("the well-behaved QUIC client")?;
    Ok(Phase { http, quic, statuses: statuses?, secs: started.elapsed().as_secs_f64() })
}

/// Runs the benchmark with a node process of `binary` and returns its JSON document.
pub async fn run(binary: &Path, o: &HostileBenchOptions) -> Result<serde_json::Value> {
    if let Some(unknown) = o.only.iter().find(|n| !ATTACKS.contains(&n.as_str())) {
        bail!("no attack is named {unknown}; the attacks are {}", ATTACKS.join(", "));
    }
    let dir = WorkDir::new("hostile", o.dir.as_deref());
    measure(binary, dir.path(), o).await
}

async fn measure(binary: &Path, dir: &Path, o: &HostileBenchOptions) -> Result<serde_json::Value> {
    let mut options = ClusterOptions::new(1, dir, binary);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.memory.budget = ByteSize(o.budget);
    options.log = "warn".into();
    eprintln!("starting one node in {} (memory budget {} MiB)", dir.display(), o.budget >> 20);
    let mut cluster = LocalCluster::start_converged(options).await?;
    let addr = cluster.http_addr(0).context("the node serves no HTTP")?;
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
    drop(c);
    // The well-behaved SDK client holds a certificate of its own: the idle-connection attacker
    // uses the cluster's client certificate, whose connections the node caps.
    let steady_tls = pki::issue(&cluster.pki_dir(), "steady", Role::Client)?;
    let mut readers = Readers::start(cluster.addr(0), steady_tls).await?;
    let started_rss = rss(cluster.pid(0).context("the node has no process id")?);
    // The machine's load when the attacks start: the ratios depend on the cores left over.
    let load_average: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);

    let attackers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("attacker")
        .on_thread_start(|| {
            if let Err(e) = timeshard_node::priority::lower_this_threads_priority(ATTACKER_NICE) {
                eprintln!("cannot lower an attacker thread's priority: {e}");
            }
        })
        .enable_all()
        .build()?;
    let ratio = |p99: f64, base: f64| if base > 0.0 { p99 / base } else { 0.0 };
    let mut attacks = Vec::new();
    let mut baselines = Vec::new();
    let mut worst: (f64, f64, u64) = (0.0, 0.0, 0);
    let chosen = ATTACKS.iter().filter(|n| o.only.is_empty() || o.only.iter().any(|c| c == *n));
    for (k, name) in chosen.enumerate() {
        if k > 0 {
            // A node process started anew for each attack: what an attack leaves resident
            // (allocators keep freed memory) must not count against the next, nor push the node
            // over its budget so that the next attack's requests are refused before they reach
            // the limit they test.
            cluster.terminate(0).await?;
            cluster.restart(0).await?;
            readers.reconnect(cluster.addr(0)).await?;
        }
        let pid = cluster.pid(0).context("the node has no process id")?;
        let target = Arc::new(Target {
            http: cluster.http_addr(0).context("the node serves no HTTP")?,
            quic: quic::QuicTarget {
                addr: cluster.addr(0),
                tls: cluster.client_tls(),
                per_identity: LimitsConfig::default().max_connections_per_identity,
            },
        });
        // The baseline right before each attack, on the same process, so that a machine whose
        // load changes during the run compares like with like.
        let base = phase(None, &target, &readers, attackers.handle(), o).await?;
        let (base_p99, base_quic_p99) = (base.http.percentile_ms(99.0), base.quic.percentile_ms(99.0));

        let _ = procfs::reset_peak(pid);
        let (rss_at_start, cpu_at_start, own_cpu_at_start) = (rss(pid), cpu_time(pid), cpu_time(std::process::id()));
        let Phase { http, quic, statuses, secs } = phase(Some(name), &target, &readers, attackers.handle(), o).await?;
        let node_cpu = (cpu_time(pid).saturating_sub(cpu_at_start)).as_secs_f64();
        let own_cpu = (cpu_time(std::process::id()).saturating_sub(own_cpu_at_start)).as_secs_f64();
        // On a new connection: the node closes idle ones after its header timeout.
        let survived = cluster.is_running(0) && ping(target.http).await;
        let (peak, rss_after) = (peak_rss(pid), rss(pid));
        let (p99, quic_p99) = (http.percentile_ms(99.0), quic.percentile_ms(99.0));
        let (http_ratio, quic_ratio) = (ratio(p99, base_p99), ratio(quic_p99, base_quic_p99));
        worst = (worst.0.max(http_ratio), worst.1.max(quic_ratio), worst.2.max(peak));
        println!(
            "{name}: {} reads, p99 {p99:.2} ms ({http_ratio:.2} x {base_p99:.2} ms); QUIC p99 {quic_p99:.2} ms \
             ({quic_ratio:.2} x {base_quic_p99:.2} ms); peak RSS {} MiB of {} MiB, survived {survived}, attacker got \
             {:?} ({secs:.1} s, node CPU {node_cpu:.1} s)",
            http.len(),
            peak >> 20,
            o.budget >> 20,
            statuses.0
        );
        attacks.push(json!({
            "attack": name,
            "reads": http.len(),
            "p99_ms": round3(p99),
            "p50_ms": round3(http.percentile_ms(50.0)),
            "p99_ratio": round3(http_ratio),
            "baseline_p99_ms": round3(base_p99),
            "quic_reads": quic.len(),
            "quic_p99_ms": round3(quic_p99),
            "quic_p99_ratio": round3(quic_ratio),
            "baseline_quic_p99_ms": round3(base_quic_p99),
            "peak_rss_bytes": peak,
            "peak_rss_over_budget": round3(peak as f64 / o.budget as f64),
            "rss_at_start_bytes": rss_at_start,
            "rss_after_bytes": rss_after,
            "statuses": statuses.json(),
            "secs": round3(secs),
            "node_cpu_s": round3(node_cpu),
            "bench_cpu_s": round3(own_cpu),
            "survived": survived,
        }));
        baselines.push(base);
        if !survived {
            break;
        }
    }
    readers.quic.clone().close().await;
    drop(readers);
    // A runtime dropped in an asynchronous context would block it.
    attackers.shutdown_background();
    cluster.shutdown().await?;
    let baseline_median =
        |f: &dyn Fn(&Phase) -> f64| round3(crate::stats::median(&baselines.iter().map(f).collect::<Vec<f64>>()));
    Ok(json!({
        "baseline_p99_ms": baseline_median(&|b| b.http.percentile_ms(99.0)),
        "baseline_p50_ms": baseline_median(&|b| b.http.percentile_ms(50.0)),
        "baseline_reads": baseline_median(&|b| b.http.len() as f64),
        "baseline_quic_p99_ms": baseline_median(&|b| b.quic.percentile_ms(99.0)),
        "baseline_quic_reads": baseline_median(&|b| b.quic.len() as f64),
        "attacks": attacks,
        "worst_p99_ratio": round3(worst.0),
        "worst_quic_p99_ratio": round3(worst.1),
        "max_peak_rss_bytes": worst.2,
        "budget_bytes": o.budget,
        "load_average_1m": load_average,
        "started_rss_bytes": started_rss,
        "floor": floor,
        "settings": {"secs": o.secs, "series": o.series, "slowloris": o.slowloris, "bodies": o.bodies,
            "located_depth": quic::LOCATED_DEPTH, "idle_connections": o.idle_connections, "only": o.only,
            "well_behaved": "GET /v1/read of 100 points in a loop, one connection",
            "well_behaved_quic": "SDK read of 100 points every 5 ms, a certificate of its own",
            "attacker_nice": ATTACKER_NICE},
    }))
}

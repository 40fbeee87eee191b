//! Hostile HTTP against a node process: requests from web pages (foreign `Host`, `Origin`,
//! `Referer`, `Sec-Fetch-Site`) refused while tools are served; slowloris connections closed
//! after their timeouts without starving a well-behaved client; connections closed after
//! their quota of requests; deeply nested statements refused, at the parser's bound or, too
//! long to be one, before their body is read; large and many bodies refused within the memory budget, and
//! oversize aggregates and listings refused with the numbers, while a well-behaved client
//! keeps getting correct answers; clients that stop reading their answers closed after the
//! write timeout.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use timeshard_node::config::ClassConfig;
use timeshard_node::http::HttpConfig;
use timeshard_testkit::cluster::{ClusterOptions, HTTP_AUTHORIZATION, HTTP_TOKEN, LocalCluster};
use timeshard_testkit::http_client::{HttpClient, encode, raw_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::NODE;

const T: i64 = 1_700_000_000; // seconds
const SEC: i64 = 1_000_000_000;

/// One node, RF 1, the default `[http]` changed by `http`.
async fn one_node(http: impl FnOnce(&mut HttpConfig)) -> anyhow::Result<(LocalCluster, tempfile::TempDir)> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    http(&mut options.http);
    Ok((LocalCluster::start_converged(options).await?, dir))
}

/// An answer read off a raw connection.
#[derive(Debug)]
struct Raw {
    status: u16,
    body: String,
}

/// Sends `head` and `body` by hand ([`raw_request`]) and reads the whole answer.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> anyhow::Result<Raw> {
    let (answer, closed) = raw_request(addr, head, body, Duration::from_secs(30)).await?;
    anyhow::ensure!(closed, "no answer");
    parse(&answer)
}

fn parse(answer: &[u8]) -> anyhow::Result<Raw> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("not an HTTP answer: {text:?}"))?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).with_context(|| format!("no status: {head}"))?;
    Ok(Raw { status, body: body.to_string() })
}

/// Values of `series` in [T, T + 1 day) through the JSON API; none when it is unknown. (The
/// well-behaved client writes one point a second from T: it once passed 1,000 writes and its
/// read of [T, T + 1000 s) missed the last one.)
async fn values(c: &mut HttpClient, series: &str) -> anyhow::Result<Vec<f64>> {
    let a = c.get(&format!("/v1/read?series={}&start={}&end={}", encode(series), T * SEC, (T + 86_400) * SEC)).await?;
    if a.status == 404 {
        return Ok(Vec::new());
    }
    anyhow::ensure!(a.status == 200, "read {series}: {} {}", a.status, a.text());
    Ok(a.read_points()?.iter().map(|p| p["value"].as_f64().unwrap()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_web_pages_are_refused_and_tools_are_served() -> anyhow::Result<()> {
    let (cluster, _dir) = one_node(|h| {
        h.allowed_hosts = vec!["tsdb.plant.example".into()];
        h.allowed_origins = vec!["https://grafana.plant.example".into()];
        h.max_requests_per_connection = 3;
    })
    .await?;
    let addr = cluster.http_addr(0).unwrap();
    let port = addr.port();
    let line = |series: &str, v: i32| format!("{series} value={v} {}\n", T + i64::from(v));
    // As the InfluxDB clients send line protocol, unless `extra` names another type.
    let write = |host: &str, extra: &str| {
        let ct = if extra.contains("Content-Type") { "" } else { "\r\nContent-Type: text/plain; charset=utf-8" };
        format!("POST /write?db=edge&precision=s HTTP/1.1\r\nHost: {host}{ct}{extra}")
    };

    // DNS rebinding: a name that is not the node's, with the node's port.
    let a = raw(addr, &write(&format!("evil.example:{port}"), ""), line("rebound", 1).as_bytes()).await?;
    assert_eq!(a.status, 421, "{a:?}");
    assert!(a.body.contains("evil.example") && a.body.contains("allowed_hosts"), "{}", a.body);
    let a =
        raw(addr, &format!("GET /query?q=SHOW%20MEASUREMENTS HTTP/1.1\r\nHost: localhost.evil.example:{port}"), b"")
            .await?;
    assert_eq!(a.status, 421, "{a:?}");

    // A page's POSTs, as a browser sends them: simple bodies, with Origin (or, from older
    // browsers' forms, a Referer only).
    let host = format!("127.0.0.1:{port}");
    for (what, head) in [
        ("a fetch with text/plain", write(&host, "\r\nOrigin: http://evil.example")),
        ("a sandboxed frame", write(&host, "\r\nOrigin: null")),
        ("an old browser's form", write(&host, "\r\nReferer: http://evil.example/form.html")),
        ("a link from a sibling port", write(&host, "\r\nSec-Fetch-Site: same-site")),
    ] {
        let a = raw(addr, &head, line("from_a_page", 2).as_bytes()).await?;
        assert_eq!(a.status, 403, "{what}: {a:?}");
        assert!(a.body.contains("web page") && a.body.contains("allowed_origins"), "{what}: {}", a.body);
    }
    let a = raw(
        addr,
        &format!(
            "POST /query HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded"
        ),
        b"q=SELECT+*+FROM+rebound",
    )
    .await?;
    assert_eq!(a.status, 403, "{a:?}");
    let a = raw(
        addr,
        &format!(
            "POST /api/v1/write HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain"
        ),
        b"not snappy",
    )
    .await?;
    assert_eq!(a.status, 403, "{a:?}");
    let a = raw(addr, &format!("GET /v1/series HTTP/1.1\r\nHost: {host}\r\nSec-Fetch-Site: cross-site"), b"").await?;
    assert_eq!(a.status, 403, "{a:?}");

    // Tools, as the InfluxDB clients send them: text/plain, no Origin; by IP, localhost or a
    // configured name. The allowed origin, and the node's own, may call it from a browser.
    for (i, head) in [
        write(&host, ""),
        write(&format!("localhost:{port}"), ""),
        write("TSDB.plant.example", ""),
        write(&format!("[::1]:{port}"), ""),
        write(&host, "\r\nOrigin: https://grafana.plant.example\r\nSec-Fetch-Site: cross-site"),
        write(&host, &format!("\r\nOrigin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin")),
        write(&host, "\r\nReferer: http://evil.example/\r\nContent-Type: application/x-protobuf"),
    ]
    .into_iter()
    .enumerate()
    {
        let a = raw(addr, &head, line("by_a_tool", i as i32).as_bytes()).await?;
        assert_eq!(a.status, 204, "{head}: {a:?}");
    }

    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    assert_eq!(values(&mut c, "by_a_tool").await?, (0..7).map(f64::from).collect::<Vec<_>>());
    // Nothing a page sent was stored.
    assert_eq!(values(&mut c, "rebound").await?, Vec::<f64>::new());
    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    assert_eq!(values(&mut c, "from_a_page").await?, Vec::<f64>::new());

    // Three requests per connection: the third answer says so, and the connection closes.
    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    for i in 1..=3 {
        let a = c.get("/ping").await?;
        assert_eq!(a.status, 204);
        let close = a.headers.get("connection").is_some_and(|v| v == "close");
        assert_eq!(close, i == 3, "request {i}: {:?}", a.headers);
    }
    assert!(c.get("/ping").await.is_err(), "the fourth request finds the connection closed");
    cluster.shutdown().await?;
    Ok(())
}

/// What a slow connection saw: how long until the node closed it, and the status it answered
/// (none for a request whose headers never arrived).
struct Closed {
    after: Duration,
    status: Option<u16>,
}

/// A connection that sends `head` one byte every `pace`, then (if it gets that far) `body`
/// likewise, until the node closes it.
async fn trickle(addr: SocketAddr, head: Vec<u8>, body_len: usize, pace: Duration) -> anyhow::Result<Closed> {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).await?;
    let (mut rd, mut wr) = tcp.into_split();
    let writer = tokio::spawn(async move {
        for b in head.into_iter().chain(std::iter::repeat_n(b'x', body_len)) {
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(pace).await;
        }
        // Everything sent: keep the connection open.
        std::future::pending::<()>().await;
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
    writer.abort();
    anyhow::ensure!(read.is_ok(), "a slow connection was still open after 60 s");
    let status = parse(&answer).ok().map(|a| a.status);
    Ok(Closed { after: started.elapsed(), status })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_in_time_and_do_not_starve_a_client() -> anyhow::Result<()> {
    const SLOW: usize = 1_000;
    let timeout = Duration::from_secs(3);
    let (cluster, _dir) = one_node(|h| {
        h.header_timeout = timeout;
        h.body_timeout = timeout;
    })
    .await?;
    let addr = cluster.http_addr(0).unwrap();
    let pace = Duration::from_millis(250);

    // Half send their headers a byte at a time; half send whole headers, then the body a byte
    // at a time (each of those, unchecked, would hold one of the 256 request slots).
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let (head, body) = if i % 2 == 0 {
            (
                format!(
                    "POST /write HTTP/1.1\r\nHost: 127.0.0.1\r\n{HTTP_AUTHORIZATION}\r\nContent-Length: 64\r\nX-Pad: {}\r\n\r\n",
                    "p".repeat(64)
                ),
                0,
            )
        } else {
            (
                format!(
                    "POST /write HTTP/1.1\r\nHost: 127.0.0.1\r\n{HTTP_AUTHORIZATION}\r\nContent-Length: 1000\r\n\r\n"
                ),
                1000,
            )
        };
        let whole_head = i % 2 == 1;
        slow.push(tokio::spawn(async move {
            if whole_head {
                // Headers at once, then the body in a trickle.
                let mut head = head.into_bytes();
                head.push(b'x');
                return trickle_after_head(addr, head, body, pace).await;
            }
            trickle(addr, head.into_bytes(), body, pace).await
        }));
    }
    // Let them all connect and start.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A well-behaved client meanwhile: writes and reads back, each answer correct and prompt.
    let well = Instant::now();
    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let a = c.post("/write?precision=s", format!("well value={i} {}\n", T + i)).await?;
        assert_eq!(a.status, 204, "write {i} during the attack: {}", a.text());
        assert_eq!(values(&mut c, "well").await?, (0..=i).map(|v| v as f64).collect::<Vec<_>>());
        slowest = slowest.max(started.elapsed());
    }
    let well = well.elapsed();

    let mut header_closed = Vec::new();
    let mut body_closed = Vec::new();
    for (i, task) in slow.into_iter().enumerate() {
        let closed = task.await??;
        if i % 2 == 0 { header_closed.push(closed) } else { body_closed.push(closed) }
    }
    let latest = |c: &[Closed]| c.iter().map(|c| c.after).max().unwrap();
    // Closed after the timeout (not before: the headers would have taken 30 s), with slack for
    // 1,000 connections on a loaded machine.
    for (what, closed) in [("slow headers", &header_closed), ("slow bodies", &body_closed)] {
        let earliest = closed.iter().map(|c| c.after).min().unwrap();
        assert!(earliest >= timeout - Duration::from_millis(100), "{what}: one closed after {earliest:?}");
        assert!(latest(closed) < timeout * 3, "{what}: one closed only after {:?}", latest(closed));
    }
    assert!(body_closed.iter().all(|c| c.status == Some(408)), "slow bodies get 408");
    println!(
        "{SLOW} slowloris connections: headers closed within {:?}, bodies within {:?} (408); the well-behaved \
         client's 20 writes and reads took {well:?}, the slowest pair {slowest:?}",
        latest(&header_closed),
        latest(&body_closed)
    );
    assert!(slowest < Duration::from_secs(2), "a write and read took {slowest:?} during the attack");
    cluster.shutdown().await?;
    Ok(())
}

/// Like [`trickle`], but sends `head` whole first.
async fn trickle_after_head(
    addr: SocketAddr,
    head: Vec<u8>,
    body_len: usize,
    pace: Duration,
) -> anyhow::Result<Closed> {
    let started = Instant::now();
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(&head).await?;
    let (mut rd, mut wr) = tcp.into_split();
    let writer = tokio::spawn(async move {
        for _ in 1..body_len {
            tokio::time::sleep(pace).await;
            if wr.write_all(b"x").await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
    writer.abort();
    anyhow::ensure!(read.is_ok(), "a slow body was still open after 60 s");
    let status = parse(&answer).ok().map(|a| a.status);
    Ok(Closed { after: started.elapsed(), status })
}

/// Sends `head` with `Expect: 100-continue` and waits for the node's go-ahead before sending
/// `body` (after `hold`, so bodies overlap): a refusal comes before any of the body is sent.
async fn raw_expect(addr: SocketAddr, head: &str, body: &[u8], hold: Duration) -> anyhow::Result<Raw> {
    let mut tcp = TcpStream::connect(addr).await?;
    let request = format!(
        "{head}\r\n{HTTP_AUTHORIZATION}\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await?;
    let mut first = vec![0u8; 25];
    let n = tcp.read(&mut first).await?;
    first.truncate(n);
    if first.starts_with(b"HTTP/1.1 100") {
        tokio::time::sleep(hold).await;
        tcp.write_all(body).await?;
        first.clear();
    }
    let mut answer = first;
    tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut answer)).await.context("no answer")??;
    let text = String::from_utf8_lossy(&answer).into_owned();
    // After a 100 Continue, the final answer follows it.
    let start = text.rfind("HTTP/1.1 ").unwrap_or(0);
    parse(&text.as_bytes()[start..])
}

/// The node's peak resident memory (VmHWM), in bytes.
/// Starts `pid`'s peak resident memory over from its current (Linux: `clear_refs` 5).
fn reset_peak_rss(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().split(' ').next()?.parse().ok());
    kb.unwrap_or(0u64) * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_many_requests_get_clear_errors_while_a_client_is_served() -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use timeshard_node::budget::ByteSize;

    const BUDGET: u64 = 256 << 20; // the default; queues (and bodies) get a quarter: 64 MiB
    const SERIES: usize = 10_000;
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.memory.budget = ByteSize(BUDGET);
    let cluster = LocalCluster::start_converged(options).await?;
    let addr = cluster.http_addr(0).unwrap();
    let host = format!("Host: 127.0.0.1:{}", addr.port());
    let started_rss = peak_rss(cluster.pid(0).unwrap());

    // SERIES series of one point each, for the wide aggregate.
    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let wide: String = (0..SERIES).map(|i| format!("wide,n={i} value={i} {T}\n")).collect();
    let a = c.post("/write?precision=s", wide).await?;
    assert_eq!(a.status, 204, "{}", a.text());

    // A well-behaved client writes and reads back all along.
    let stop = Arc::new(AtomicBool::new(false));
    let well = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
            let (mut i, mut slowest, mut retried) = (0i64, Duration::ZERO, 0u32);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                // While the node's resident memory is over its budget (the allocator has not
                // given an attack's memory back yet) a write gets 503 with Retry-After, and a
                // client retries it: it must then succeed, and nothing else may go wrong.
                let mut a = c.post("/write?precision=s", format!("well value={i} {}\n", T + i)).await?;
                for _ in 0..20 {
                    if a.status != 503 || !a.text().contains("memory budget exceeded") {
                        break;
                    }
                    retried += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    a = c.post("/write?precision=s", format!("well value={i} {}\n", T + i)).await?;
                }
                anyhow::ensure!(a.status == 204, "write {i} during the attacks: {}", a.text());
                let got = values(&mut c, "well").await?;
                anyhow::ensure!(got.len() == i as usize + 1 && got[i as usize] == i as f64, "read {i}: {got:?}");
                slowest = slowest.max(started.elapsed());
                i += 1;
            }
            Ok::<_, anyhow::Error>((i, slowest, retried))
        }
    });

    // A 20 MB line and a 1 MB series key, each between two good lines: left out as they
    // arrive and refused with the line limit named; the good lines are stored. A 100 KB key
    // (a line within the limit) is refused by the parser, with the key limit named.
    for (i, (what, line, limit)) in [
        ("a 20 MB line", format!("big,site=atl value=1,{}=2 {T}", "f".repeat(20 << 20)), "262144 bytes"),
        ("a 1 MB series key", format!("big,site={} value=1 {T}", "a".repeat(1 << 20)), "262144 bytes"),
        ("a 100 KB series key", format!("big,site={} value=1 {T}", "a".repeat(100 << 10)), "512 bytes"),
    ]
    .into_iter()
    .enumerate()
    {
        let body = format!(
            "around value={} {}\n{line}\naround value={} {}\n",
            2 * i,
            T + 2 * i as i64,
            2 * i + 1,
            T + 2 * i as i64 + 1
        );
        let a = raw(addr, &format!("POST /write?precision=s HTTP/1.1\r\n{host}"), body.as_bytes()).await?;
        assert_eq!(a.status, 400, "{what}: {a:?}");
        assert!(
            a.body.contains("line 2:") && a.body.contains(limit) && a.body.contains("dropped=1"),
            "{what}: the line and the limit are named: {}",
            &a.body[..a.body.len().min(500)]
        );
        let got = values(&mut c, "around").await?;
        assert_eq!(got.len(), 2 * i + 2, "{what}: the lines around it are stored: {got:?}");
    }

    // InfluxQL nested 10,000 deep: parsed, and refused at the parser's depth bound. Nested
    // 200,000 deep (1.2 MB as a form): refused at its declared length, before it is read.
    let nested = |depth: usize| {
        let q = format!("SELECT value FROM wide WHERE {}n = '1'{}", "(".repeat(depth), ")".repeat(depth));
        format!("q={}", encode(&q))
    };
    let form = format!("POST /query HTTP/1.1\r\n{host}\r\nContent-Type: application/x-www-form-urlencoded");
    let a = raw(addr, &form, nested(10_000).as_bytes()).await?;
    assert_eq!(a.status, 400, "nested 10,000 deep: {a:?}");
    assert!(a.body.contains("32"), "nested 10,000 deep: the depth bound is named: {}", a.body);
    let a = raw_expect(addr, &form, nested(200_000).as_bytes(), Duration::ZERO).await?;
    assert_eq!(a.status, 413, "nested 200,000 deep: {a:?}");
    assert!(a.body.contains("max_query_body_bytes"), "nested 200,000 deep: the limit is named: {}", a.body);

    // 100,000 windows x 10,000 series: refused before anything is read, with the numbers (the
    // windows allow 10 series: the listing stops at the 11th).
    let q = format!("SELECT mean(value) FROM wide WHERE time >= {}s AND time < {}s GROUP BY time(1s)", T, T + 100_000);
    let a = c.get(&format!("/query?q={}", encode(&q))).await?;
    let text = a.text();
    assert!(
        text.contains("100000 windows x more than 10 series") && text.contains("max_query_windows"),
        "{}: {}",
        a.status,
        &text[..text.len().min(500)]
    );

    // A remote-write body of 4 MiB of empty series: a few KB on the wire, 96 MiB decoded.
    let empties = timeshard_formats::compression::snappy(&[0x0a, 0x00].repeat(2 << 20));
    let a =
        raw(addr, &format!("POST /api/v1/write HTTP/1.1\r\n{host}\r\nContent-Type: application/x-protobuf"), &empties)
            .await?;
    assert_eq!(a.status, 413, "{a:?}");
    assert!(a.body.contains("4194304 bytes") && a.body.contains("memory budget"), "{}", a.body);

    // 256 bodies of 32 MiB (the default limit) at once, comments and one point: two fit the
    // bodies' share at a time; the others are refused before they are sent.
    const BODIES: usize = 256;
    const MIB: usize = 32;
    let mut body =
        "# padding padding padding padding padding padding padding padding padding\n".repeat((MIB << 20) / 76);
    body.push_str(&format!("bulk value=1 {T}\n"));
    let body = Arc::new(body);
    let sends: Vec<_> = (0..BODIES)
        .map(|_| {
            let (body, head) = (body.clone(), format!("POST /write?precision=s HTTP/1.1\r\n{host}"));
            tokio::spawn(async move { raw_expect(addr, &head, body.as_bytes(), Duration::from_millis(500)).await })
        })
        .collect();
    let (mut stored, mut refused) = (0, 0);
    for send in sends {
        let a = send.await??;
        match a.status {
            204 => stored += 1,
            503 => {
                assert!(a.body.contains("memory budget exceeded"), "{}", a.body);
                refused += 1;
            }
            other => panic!("a {MIB} MiB body got {other}: {}", a.body),
        }
    }
    assert!(stored >= 1 && refused >= 1, "{stored} stored, {refused} refused");
    let bodies_peak = peak_rss(cluster.pid(0).unwrap());
    reset_peak_rss(cluster.pid(0).unwrap());

    // 16 gzip bodies of 30 MiB of comments at once (about 30 KB each on the wire): what
    // decompressing takes is charged as it grows, before it is allocated, so they cannot all
    // inflate at once and those past the budget are refused part way.
    const GZIPS: usize = 16;
    let padding = "# padding padding padding padding padding padding padding padding padding\n".repeat((30 << 20) / 76);
    let bomb = Arc::new(timeshard_formats::compression::gzip(format!("{padding}bulk value=2 {T}\n").as_bytes()));
    let gzip_head = format!("POST /write?precision=s HTTP/1.1\r\n{host}\r\nContent-Encoding: gzip");
    let sends: Vec<_> = (0..GZIPS)
        .map(|_| {
            let (bomb, head) = (bomb.clone(), gzip_head.clone());
            tokio::spawn(async move { raw(addr, &head, &bomb).await })
        })
        .collect();
    let (mut unzipped, mut unzip_refused) = (0, 0);
    for send in sends {
        let a = send.await??;
        match a.status {
            204 => unzipped += 1,
            503 => {
                assert!(a.body.contains("memory budget exceeded"), "{}", a.body);
                unzip_refused += 1;
            }
            other => panic!("a gzip body of {} bytes got {other}: {}", bomb.len(), a.body),
        }
    }
    assert!(unzip_refused >= 1, "{unzipped} decompressed, {unzip_refused} refused");
    // Alone, the same body decompresses and its point is stored (retried as a client retries
    // a 503, while the memory the burst took is given back).
    let lone = timeshard_formats::compression::gzip(format!("{padding}lone value=3 {T}\n").as_bytes());
    let mut a = raw(addr, &gzip_head, &lone).await?;
    for _ in 0..10 {
        if a.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        a = raw(addr, &gzip_head, &lone).await?;
    }
    assert_eq!(a.status, 204, "a lone gzip body of 30 MiB: {}", a.body);
    assert_eq!(values(&mut c, "lone").await?, vec![3.0]);
    // A bomb past the body limit decompressed is refused as too large, having taken at most that.
    let over = timeshard_formats::compression::gzip(&vec![b'#'; 40 << 20]);
    let a = raw(addr, &gzip_head, &over).await?;
    assert_eq!(a.status, 413, "a gzip body of 40 MiB decompressed: {}", a.body);
    let gzip_peak = peak_rss(cluster.pid(0).unwrap());

    stop.store(true, Ordering::Relaxed);
    let (rounds, slowest, retried) = well.await??;
    assert!(rounds > 0);
    let a = c.get("/ping").await?;
    assert_eq!(a.status, 204, "the node keeps serving");
    println!(
        "{BODIES} bodies of {MIB} MiB: {stored} stored, {refused} refused (memory budget), node peak RSS {} MiB; \
         {GZIPS} gzip bodies of 30 MiB: {unzipped} decompressed, {unzip_refused} refused, node peak RSS {} MiB; of a \
         {} MiB budget ({} MiB when started); the well-behaved client's {rounds} writes and reads all correct \
         ({retried} retries of a 503 while resident memory was over the budget), the slowest {slowest:?}",
        bodies_peak >> 20,
        gzip_peak >> 20,
        BUDGET >> 20,
        started_rss >> 20
    );
    cluster.shutdown().await?;
    Ok(())
}

/// The `timeshard_abandoned_answers_total` sample of `door` in the node's `/metrics`.
async fn abandoned_answers(c: &mut HttpClient, door: &str) -> anyhow::Result<u64> {
    let text = c.get("/metrics").await?.text();
    let sample = format!("timeshard_abandoned_answers_total{{door=\"{door}\"}} ");
    let line = text.lines().find(|l| l.starts_with(&sample)).with_context(|| format!("no {sample} in /metrics"))?;
    Ok(line[sample.len()..].trim().parse::<f64>()? as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_their_answers_are_closed_after_the_write_timeout() -> anyhow::Result<()> {
    const CONNECTIONS: usize = 3;
    const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
    // A read of them all answers about 7 MB of JSON: more than the sockets' buffers hold.
    const POINTS: i64 = 250_000;
    let (cluster, _dir) = one_node(|h| {
        h.max_connections = CONNECTIONS;
        h.write_timeout = WRITE_TIMEOUT;
    })
    .await?;
    let addr = cluster.http_addr(0).unwrap();
    let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let body: String = (0..POINTS).map(|i| format!("big value={i} {}\n", T + i)).collect();
    let a = c.post("/write?precision=s", body).await?;
    assert_eq!(a.status, 204, "{}", a.text());
    drop(c);

    // Every connection the node takes asks for them all and reads none of its answer (a
    // receive buffer of a few KiB, never read).
    let ask = format!(
        "GET /v1/read?series=big&start={}&end={}&limit={POINTS} HTTP/1.1\r\nHost: {addr}\r\n{HTTP_AUTHORIZATION}\r\n\r\n",
        T * SEC,
        (T + POINTS) * SEC
    );
    let mut unread = Vec::new();
    for _ in 0..CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4 << 10)?;
        let mut tcp = socket.connect(addr).await?;
        tcp.write_all(ask.as_bytes()).await?;
        unread.push(tcp);
    }
    let asked = Instant::now();
    // A well-behaved client waits for a place; the node closes the stalled connections after
    // the write timeout and serves it (before, it waited for ever).
    let served = tokio::time::timeout(Duration::from_secs(60), async {
        let mut c = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
        let a = c.get(&format!("/v1/read?series=big&start={}&end={}&limit=3", T * SEC, (T + POINTS) * SEC)).await?;
        anyhow::ensure!(a.status == 200, "{} {}", a.status, a.text());
        let got: Vec<f64> = a.read_points()?.iter().map(|p| p["value"].as_f64().unwrap()).collect();
        anyhow::ensure!(got == [0.0, 1.0, 2.0], "{got:?}");
        Ok::<_, anyhow::Error>(c)
    })
    .await
    .context("no answer within 60 s: the connections that stopped reading still hold every place")??;
    let waited = asked.elapsed();
    println!("a client was served {waited:?} after {CONNECTIONS} connections stopped reading their answers");
    assert!(waited >= WRITE_TIMEOUT, "served after {waited:?}: the places were not all taken");
    let mut c = served;
    // Each of them (one freed place was enough for the read above).
    let deadline = Instant::now() + Duration::from_secs(60);
    while abandoned_answers(&mut c, "http").await? < CONNECTIONS as u64 {
        anyhow::ensure!(Instant::now() < deadline, "{} answers counted", abandoned_answers(&mut c, "http").await?);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(abandoned_answers(&mut c, "http").await?, CONNECTIONS as u64);
    // A stalled connection got part of its answer, then the node closed it.
    let mut tcp = unread.pop().unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got)).await.context("not closed")?;
    let text = String::from_utf8_lossy(&got);
    let (head, body) = text.split_once("\r\n\r\n").context("no answer's head")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The answer streams (chunked): a whole one ends with its count and the last chunk.
    assert!(head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{head}");
    assert!(body.len() > 1000 && !body.contains("\"count\":"), "{} bytes: the whole answer", body.len());
    assert!(cluster.is_running(0), "the node survives");
    Ok(())
}

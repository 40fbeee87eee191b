//! Hostile HTTP against a node process: requests from web pages (foreign `Host`, `Origin`,
//! `Referer`, `Sec-Fetch-Site`) refused while tools are served; slowloris connections closed
//! after their timeouts without starving a well-behaved client; connections closed after
//! their quota of requests; large and many bodies refused within the memory budget, and
//! oversize aggregates and listings refused with the numbers, while a well-behaved client
//! keeps getting correct answers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use timeshard_node::config::ClassConfig;
use timeshard_node::http::HttpConfig;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::http_client::{HttpClient, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::NODE;

const T: i64 = 1_700_000_000; // seconds
const SEC: i64 = 1_000_000_000;

/// One node, RF 1, the default `[http]` (loopback, no tokens: what a new user runs) changed by `http`.
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

/// Sends `head` (request line and headers, without the blank line) and `body` on a fresh
/// connection, with `Content-Length` and `Connection: close`, and reads the whole answer.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> anyhow::Result<Raw> {
    let mut tcp = TcpStream::connect(addr).await?;
    let request = format!("{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    tcp.write_all(request.as_bytes()).await?;
    // The node may answer (and close) before the whole body is sent: that is an answer too.
    let _ = tcp.write_all(body).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut answer)).await.context("no answer")?;
    parse(&answer)
}

fn parse(answer: &[u8]) -> anyhow::Result<Raw> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("not an HTTP answer: {text:?}"))?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).with_context(|| format!("no status: {head}"))?;
    Ok(Raw { status, body: body.to_string() })
}

/// Values of `series` in [T, T + 1000 s) through the JSON API; none when it is unknown.
async fn values(c: &mut HttpClient, series: &str) -> anyhow::Result<Vec<f64>> {
    let a = c.get(&format!("/v1/read?series={}&start={}&end={}", encode(series), T * SEC, (T + 1000) * SEC)).await?;
    if a.status == 404 {
        return Ok(Vec::new());
    }
    anyhow::ensure!(a.status == 200, "read {series}: {} {}", a.status, a.text());
    Ok(a.json()?["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect())
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

    let mut c = HttpClient::connect(addr, None).await?;
    assert_eq!(values(&mut c, "by_a_tool").await?, (0..7).map(f64::from).collect::<Vec<_>>());
    // Nothing a page sent was stored.
    assert_eq!(values(&mut c, "rebound").await?, Vec::<f64>::new());
    let mut c = HttpClient::connect(addr, None).await?;
    assert_eq!(values(&mut c, "from_a_page").await?, Vec::<f64>::new());

    // Three requests per connection: the third answer says so, and the connection closes.
    let mut c = HttpClient::connect(addr, None).await?;
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
                    "POST /write HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 64\r\nX-Pad: {}\r\n\r\n",
                    "p".repeat(64)
                ),
                0,
            )
        } else {
            ("POST /write HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n".to_string(), 1000)
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
    let mut c = HttpClient::connect(addr, None).await?;
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

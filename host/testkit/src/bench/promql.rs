//! The PromQL part of `timeshard bench http`: dashboard queries over a day of counters, against
//! a node and, in the same run, against a VictoriaMetrics process when its binary is found.
//!
//! Data: 100 counters `bench_requests_total{instance, group}` (10 groups), one sample every
//! 15 s for a day (576,000 samples), written by remote write in requests of 2,000 samples, as
//! Prometheus sends them, to both. Queries, each through `/api/v1/query_range`:
//! - `promql_range_rate_1d_1m_ms`: `rate(bench_requests_total[5m])` over the day at a 1-minute
//!   step (1,440 steps x 100 series);
//! - `promql_sum_by_1d_5m_ms`: `sum by (group) (bench_requests_total)` over the day at a
//!   5-minute step.
//!
//! The counters' class has hour-long quanta (`[[class]] quantum = "1h"`), as the README
//! advises for scraped data. Both sides are queried settled: the node once its store has
//! sealed the day's blocks, VictoriaMetrics once flushed. Each figure is the median of `reps` timed runs after two untimed ones. VictoriaMetrics is
//! asked with `nocache=1`, so neither side answers from a cache of earlier answers (timeshard
//! keeps none); both sides answer the same number of series, which is checked. The binary is
//! `$VICTORIA_METRICS_BIN`, or `victoria-metrics` (Debian's package) or
//! `victoria-metrics-prod` on the PATH; without one, its keys are `null`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use timeshard_formats::remote_write::{self, Label, Sample, TimeSeries, WriteRequest};

use crate::datasets::T0;
use crate::http_client::{HttpClient, encode};
use crate::stats::{median, round3};

/// The counters' metric, and the quantum of the class the benchmark gives it.
pub const METRIC: &str = "bench_requests_total";
pub const QUANTUM: Duration = Duration::from_secs(3_600);
const SERIES: usize = 100;
const GROUPS: usize = 10;
const SCRAPE_MS: i64 = 15_000;
/// Samples per remote-write request (Prometheus' `max_samples_per_send`).
const PER_REQUEST: usize = 2_000;

/// The queries, by the key their median goes under: (key, query, step in seconds).
const QUERIES: [(&str, &str, i64); 2] = [
    ("promql_range_rate_1d_1m_ms", "rate(bench_requests_total[5m])", 60),
    ("promql_sum_by_1d_5m_ms", "sum by (group) (bench_requests_total)", 300),
];

fn start_ms() -> i64 {
    T0 / 1_000_000
}

/// A counter's value at sample `i`: increasing by a per-series rate with some jitter.
fn value(series: usize, i: i64) -> f64 {
    let rate = 1.0 + series as f64 * 0.25;
    (i as f64) * rate * 15.0 + ((i * 7919 + series as i64 * 104_729) % 13) as f64
}

/// The day's samples as remote-write request bodies of [`PER_REQUEST`] samples.
fn bodies(seconds: i64) -> Vec<Vec<u8>> {
    let per_series = (seconds * 1_000 / SCRAPE_MS) as usize;
    let chunk = PER_REQUEST.min(per_series).max(1);
    let mut out = Vec::new();
    for first in (0..per_series).step_by(chunk) {
        let end = (first + chunk).min(per_series);
        for s in 0..SERIES {
            let labels = vec![
                Label { name: "__name__".into(), value: METRIC.into() },
                Label { name: "group".into(), value: format!("g{}", s % GROUPS) },
                Label { name: "instance".into(), value: format!("i{s}") },
            ];
            let samples = (first..end)
                .map(|i| Sample { value: value(s, i as i64), timestamp: start_ms() + i as i64 * SCRAPE_MS })
                .collect();
            out.push(remote_write::encode(&WriteRequest { timeseries: vec![TimeSeries { labels, samples }] }));
        }
    }
    out
}

/// Sends every body as a remote-write request; one answered 503 (a node's memory budget) is
/// sent again ([`HttpClient::send_until_taken`]), as Prometheus retries.
async fn write_all(addr: SocketAddr, token: Option<&str>, bodies: &[Vec<u8>]) -> Result<()> {
    let mut client = HttpClient::connect(addr, token).await?;
    let headers = [
        ("content-type", "application/x-protobuf"),
        ("content-encoding", "snappy"),
        ("x-prometheus-remote-write-version", "0.1.0"),
    ];
    for body in bodies {
        let (a, _) = client.send_until_taken(hyper::Method::POST, "/api/v1/write", &headers, body.clone()).await?;
        if !a.status.is_success() {
            bail!("remote write to {addr} answered {}: {}", a.status, a.text());
        }
    }
    Ok(())
}

/// Times each query `reps` times (after two untimed runs) against `addr`; the median
/// milliseconds and the series answered, per query.
async fn time_queries(
    addr: SocketAddr,
    token: Option<&str>,
    seconds: i64,
    reps: usize,
    extra: &str,
) -> Result<Vec<(f64, usize)>> {
    let mut client = HttpClient::connect(addr, token).await?;
    let (start, end) = (start_ms() / 1_000, (start_ms() + seconds * 1_000) / 1_000);
    let mut out = Vec::new();
    for (key, query, step) in QUERIES {
        let path = format!("/api/v1/query_range?query={}&start={start}&end={end}&step={step}{extra}", encode(query));
        let mut times = Vec::new();
        let mut series = 0;
        for rep in 0..reps + 2 {
            let t = Instant::now();
            let a = client.get(&path).await?;
            let took = t.elapsed().as_secs_f64() * 1e3;
            if a.status != 200 {
                bail!("{key} at {addr} answered {}: {}", a.status, a.text());
            }
            series = a.json()?["data"]["result"].as_array().map_or(0, Vec::len);
            if rep >= 2 {
                times.push(took);
            }
        }
        out.push((median(&times), series));
    }
    Ok(out)
}

/// The VictoriaMetrics binary, if there is one.
fn victoria_metrics() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VICTORIA_METRICS_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["victoria-metrics", "victoria-metrics-prod"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// A VictoriaMetrics process on a free loopback port, killed when dropped.
struct Victoria {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Victoria {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_victoria(bin: &Path, dir: &Path) -> Result<Victoria> {
    let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let child = Command::new(bin)
        .arg(format!("-storageDataPath={}", dir.display()))
        .arg(format!("-httpListenAddr={addr}"))
        // The benchmark's day lies in the past: keep it.
        .arg("-retentionPeriod=100y")
        .arg("-loggerLevel=ERROR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let vm = Victoria { child, addr };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut c) = HttpClient::connect(addr, None).await
            && c.get("/health").await.is_ok_and(|a| a.status == 200)
        {
            return Ok(vm);
        }
        if Instant::now() > deadline {
            bail!("{} did not answer /health on {addr} within 60 s", bin.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes the day to the node at `node` (and to VictoriaMetrics, if found), times the
/// queries on both, and returns the keys of the JSON document.
pub async fn measure(node: SocketAddr, token: &str, dir: &Path, seconds: i64, reps: usize) -> Result<Value> {
    let bodies = bodies(seconds);
    write_all(node, Some(token), &bodies).await?;
    // Settled as VictoriaMetrics is below (flushed): the day's blocks sealed, not queried while
    // the store is still compressing them.
    super::http::wait_sealed(&mut HttpClient::connect(node, Some(token)).await?).await?;
    let ours = time_queries(node, Some(token), seconds, reps, "").await?;
    let victoria = victoria_metrics();
    let theirs = match &victoria {
        None => {
            println!("PromQL: no VictoriaMetrics binary (victoria-metrics on the PATH or $VICTORIA_METRICS_BIN)");
            None
        }
        Some(bin) => {
            let vm = start_victoria(bin, &dir.join("victoria-metrics")).await?;
            write_all(vm.addr, None, &bodies).await?;
            // Makes what was written searchable now, not after VictoriaMetrics' flush interval.
            HttpClient::connect(vm.addr, None).await?.get("/internal/force_flush").await?;
            Some(time_queries(vm.addr, None, seconds, reps, "&nocache=1").await?)
        }
    };
    let mut keys = serde_json::Map::new();
    for (i, (key, query, _)) in QUERIES.iter().enumerate() {
        let (ms, series) = ours[i];
        let vm = theirs.as_ref().map(|t| t[i]);
        if let Some((_, vm_series)) = vm
            && vm_series != series
        {
            bail!("{query}: timeshard answered {series} series and VictoriaMetrics {vm_series}");
        }
        println!(
            "PromQL {query}: {ms:.1} ms for {series} series{}",
            vm.map_or(String::new(), |(t, _)| format!(", VictoriaMetrics {t:.1} ms ({:.2}x)", ms / t))
        );
        keys.insert(key.to_string(), json!(round3(ms)));
        keys.insert(key.replace("promql_", "victoria_metrics_promql_"), json!(vm.map(|(t, _)| round3(t))));
    }
    keys.insert(
        "promql_settings".into(),
        json!({"series": SERIES, "scrape_s": SCRAPE_MS / 1000, "seconds": seconds, "reps": reps,
            "quantum_s": QUANTUM.as_secs(),
            "samples": SERIES * (seconds * 1000 / SCRAPE_MS) as usize,
            "victoria_metrics": victoria.map(|p| p.display().to_string())}),
    );
    Ok(Value::Object(keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_day_is_cut_into_requests_of_at_most_2000_samples_per_series() {
        let bodies = bodies(3_600);
        // 240 samples per series in an hour: one request per series.
        assert_eq!(bodies.len(), SERIES);
        let decoded = remote_write::decode(&bodies[7], 1 << 20).unwrap();
        assert_eq!(decoded.samples, 240);
        assert!(value(3, 10) > value(3, 9), "counters increase");
    }
}

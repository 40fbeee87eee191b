//! Real clients against a node's HTTP side: the Python InfluxDB clients from PyPI write and read
//! back, and a real Prometheus scrapes `/metrics` and remote-writes into the node, which serves
//! the samples back; `promtool check metrics` finds nothing to fix. `./scripts/test` installs
//! them (`influxdb-client` and `influxdb` from PyPI, in a virtual environment when python3 lacks
//! them, named by `TIMESHARD_TEST_PYTHON`; Debian's `prometheus`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use timeshard_node::config::ClassConfig;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::http_client::{HttpClient, encode};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::NODE;

const TOKEN: &str = "clients-token-0123456789abcdef";

async fn one_node() -> anyhow::Result<(LocalCluster, tempfile::TempDir)> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    // The InfluxDB 1.x Python client sends its password in the URL (`?p=`).
    options.http.tokens_in_urls = true;
    Ok((LocalCluster::start_converged(options).await?, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_influxdb_clients_write_and_read_back() -> anyhow::Result<()> {
    let (cluster, _dir) = one_node().await?;
    let url = format!("http://{}", cluster.http_addr(0).unwrap());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/influx_clients.py");
    // ./scripts/test names the interpreter it installed the clients for.
    let python = std::env::var("TIMESHARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(&script)
        .arg(&url)
        .arg(TOKEN)
        .output()
        .await
        .with_context(|| format!("cannot run {python} (./scripts/test installs the clients)"))?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{} failed ({}):\n{stdout}\n{stderr}", script.display(), out.status);
    assert!(stdout.contains("influx clients: ok"), "{stdout}");
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_metrics_and_remote_writes_samples_that_are_served_back() -> anyhow::Result<()> {
    let (cluster, dir) = one_node().await?;
    let http = cluster.http_addr(0).unwrap();
    let mut client = HttpClient::connect(http, Some(TOKEN)).await?;

    // promtool's lint of the exposition, with every family present (a write and a query first).
    assert_eq!(client.post("/write", "m v=1 1").await?.status, 204);
    assert_eq!(client.get("/query?q=SHOW%20DATABASES").await?.status, 200);
    let metrics = client.get("/metrics").await?;
    assert_eq!(metrics.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run promtool (Debian's prometheus package)")?;
    promtool.stdin.take().unwrap().write_all(&metrics.body).await?;
    let lint = promtool.wait_with_output().await?;
    let said = format!("{}{}", String::from_utf8_lossy(&lint.stdout), String::from_utf8_lossy(&lint.stderr));
    assert!(lint.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{}", metrics.text());

    // A real Prometheus scraping the node (and itself), remote-writing into the node.
    let port = free_port()?;
    let work = dir.path().join("prometheus");
    std::fs::create_dir_all(&work)?;
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n\
         \x20 - job_name: timeshard\n    authorization:\n      credentials: {TOKEN}\n    static_configs:\n      - targets: ['{http}']\n\
         \x20 - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n\
         remote_write:\n  - url: http://{http}/api/v1/write\n    authorization:\n      credentials: {TOKEN}\n\
         \x20   queue_config:\n      batch_send_deadline: 1s\n      max_samples_per_send: 500\n"
    );
    std::fs::write(work.join("prometheus.yml"), config)?;
    let log = std::fs::File::create(work.join("prometheus.log"))?;
    let mut prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", work.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", work.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot run prometheus (Debian's prometheus package)")?;

    // The node serves back what Prometheus sent: `up` of its scrape of the node, which is 1
    // only if Prometheus could parse /metrics.
    let up = format!("up{{instance={http},job=timeshard}}");
    let deadline = Instant::now() + Duration::from_secs(90);
    let samples = loop {
        let a = client.get(&format!("/v1/read?series={}&start=now-10m&end=now%2B1m", encode(&up))).await?;
        assert!(a.status == 200 || a.status == 404, "{}", a.text());
        if a.status == 200 {
            let values: Vec<f64> = a.read_points()?.iter().map(|p| p["value"].as_f64().unwrap()).collect();
            if values.len() >= 3 {
                break values;
            }
        }
        if let Some(status) = prometheus.try_wait()? {
            bail!("prometheus exited with {status}: {}", std::fs::read_to_string(work.join("prometheus.log"))?);
        }
        if Instant::now() > deadline {
            bail!(
                "no `up` samples came back within 90 s; prometheus log:\n{}",
                std::fs::read_to_string(work.join("prometheus.log"))?
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(samples.iter().all(|&v| v == 1.0), "{samples:?}");
    // Prometheus' own series came too, and the node's metrics as Prometheus stored them.
    let a = client.get("/v1/series?metric=prometheus_build_info").await?;
    assert_eq!(a.json()?["series"].as_array().map(Vec::len), Some(1), "{}", a.text());
    let a = client.get("/v1/series?metric=timeshard_ingest_points_total&tag=protocol=remote_write").await?;
    assert_eq!(a.json()?["series"].as_array().map(Vec::len), Some(1), "{}", a.text());
    // Histograms' `le` labels (`+Inf`) survive the name mapping.
    let a = client.get("/v1/series?metric=timeshard_ingest_duration_seconds_bucket&tag=le=%252BInf").await?;
    assert_eq!(a.json()?["series"].as_array().map(Vec::len), Some(3), "{}", a.text());
    // And the same data through InfluxQL, as a dashboard would ask.
    let q = "SELECT last(value) FROM up WHERE job = 'timeshard' AND time > now() - 10m";
    let v = client.get(&format!("/query?q={}", encode(q))).await?.json()?;
    assert_eq!(v["results"][0]["series"][0]["values"][0][1], 1.0, "{v}");

    prometheus.kill().await?;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

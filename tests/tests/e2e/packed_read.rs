//! Streamed reads that carry sealed blocks as their stores' compressed columns: 3 node
//! processes at RF 3, R 2. A historical day-part (ended quanta, sealed by maintenance, several
//! events at some timestamps) and a live series (quanta still open) are read back through the
//! SDK and compared point by point with what was written; so are they after late points land
//! in sealed blocks (those blocks go back to points), after a replica was SIGKILLed and
//! restarted, and while and after a fourth node joins. The nodes' `/metrics` must show packed
//! blocks were sent, so the test knows it tried the packed path and not only the fallback.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use timeshard_node::config::ClassConfig;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::tls::Identity;
use timeshard_sdk::{Client, ClientOptions};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};
use timeshard_testkit::http_client::HttpClient;

use crate::NODE;

const TOKEN: &str = "packed-read-token-0123456789";
const SEC: i64 = 1_000_000_000;

/// Every point of `series` in `range` through the stream, checked for order on the way.
async fn read_all(client: &Client, series: &SeriesKey, range: TimeRange) -> anyhow::Result<Vec<Point>> {
    let mut out: Vec<Point> = Vec::new();
    let mut batches = std::pin::pin!(client.read_stream(series, range));
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        anyhow::ensure!(batch.is_consistent() && !batch.is_empty(), "a batch with uneven or no columns");
        let first = batch.points().next().unwrap();
        anyhow::ensure!(out.last().is_none_or(|l| l.key() < first.key()), "batches out of order");
        out.extend(batch.points());
    }
    anyhow::ensure!(out.windows(2).all(|w| w[0].key() < w[1].key()), "points out of order");
    Ok(out)
}

/// Compares a read with what was written, point by point, naming the first difference.
fn same(got: &[Point], want: &BTreeSet<Point>, what: &str) {
    let want: Vec<Point> = want.iter().copied().collect();
    if let Some(i) = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]) {
        panic!("{what}: point {i} is {:?}, written {:?}", got[i], want[i]);
    }
    assert_eq!(got.len(), want.len(), "{what}: {} points read, {} written", got.len(), want.len());
}

/// Sum over the nodes of `timeshard_store_blocks_sent_packed_total`.
async fn packed_sent(cluster: &LocalCluster) -> anyhow::Result<u64> {
    let mut total = 0;
    for i in 0..cluster.len() {
        let Some(addr) = cluster.http_addr(i) else { continue };
        let text = HttpClient::connect(addr, Some(TOKEN)).await?.get("/metrics").await?.text();
        let line = text
            .lines()
            .find(|l| l.starts_with("timeshard_store_blocks_sent_packed_total "))
            .ok_or_else(|| anyhow::anyhow!("no packed counter in {text}"))?;
        total += line.rsplit(' ').next().unwrap_or("0").parse::<f64>()? as u64;
    }
    Ok(total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_blocks_travel_packed_and_read_back_exactly() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(3, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 3, w: 2, r: 2, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let writer = cluster.client(0).await?;

    // Historical: 20 minutes of 60 Hz, a second event at every 7th timestamp.
    let hist = datasets::pmu_series(11);
    let mut hist_points: BTreeSet<Point> = datasets::pmu(11).take(72_000).collect();
    let extra: Vec<Point> =
        hist_points.iter().step_by(7).map(|p| Point { event: 1, value: p.value + 0.5, ..*p }).collect();
    hist_points.extend(extra);
    let all: Vec<Point> = hist_points.iter().copied().collect();
    for chunk in all.chunks(10_000) {
        writer.write(&hist, chunk).await?;
    }
    let hist_range = TimeRange::new(T0 - SEC, T0 + 1_300 * SEC)?;
    // Live: the last 40 s, 10 Hz, ending now (quanta still open or not yet sealed).
    let live = datasets::pmu_series(12);
    let now = timeshard_clock::now_ns();
    let live_points: BTreeSet<Point> =
        (0..400i64).map(|i| Point::new(now - 40 * SEC + i * SEC / 10, (i % 13) as f64)).collect();
    writer.write(&live, &live_points.iter().copied().collect::<Vec<_>>()).await?;
    let live_range = TimeRange::new(now - 60 * SEC, now + SEC)?;

    cluster.wait_settled(Duration::from_secs(60)).await?;
    // Small batches, so a read spans many frames and batches mix packed blocks with points.
    let identity = Identity::load(&cluster.client_tls_of(2))?;
    let reader =
        Client::connect_with(cluster.addr(2), &identity, ClientOptions { page_points: 5_000, ..Default::default() })
            .await?;
    // Read until maintenance has sealed the historical blocks and reads send them packed; every
    // read on the way must be exact whatever mix of packed and plain it got.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = packed_sent(&cluster).await?;
    loop {
        same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "historical");
        same(&read_all(&reader, &live, live_range).await?, &live_points, "live");
        if packed_sent(&cluster).await? >= before + 100 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no packed blocks sent within 60 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(reader.read(&hist, hist_range).await?.len(), hist_points.len());

    // Late points into sealed quanta: those blocks hold open points again and go as points.
    let late: Vec<Point> = (0..50i64).map(|i| Point::new(T0 + i * 24 * SEC + 7, -1.0 - i as f64)).collect();
    writer.write(&hist, &late).await?;
    hist_points.extend(late);
    same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "historical with late points");

    // A replica killed and restarted: reads stay exact while it catches up and after.
    cluster.kill(1).await?;
    same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "with a replica down");
    cluster.restart(1).await?;
    same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "with a replica catching up");
    cluster.wait_settled(Duration::from_secs(60)).await?;
    same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "settled again");
    same(&read_all(&reader, &live, live_range).await?, &live_points, "live, settled again");

    // A node joins: blocks move to it while reads go on, through it and through an old node.
    let joined = cluster.add_nodes(1).await?[0];
    let newcomer = cluster.client(joined).await?;
    same(&read_all(&newcomer, &hist, hist_range).await?, &hist_points, "through the new node, joining");
    same(&read_all(&reader, &hist, hist_range).await?, &hist_points, "while a node joins");
    cluster.wait_settled(Duration::from_secs(60)).await?;
    same(&read_all(&newcomer, &hist, hist_range).await?, &hist_points, "through the new node, settled");
    same(&read_all(&newcomer, &live, live_range).await?, &live_points, "live, through the new node");
    newcomer.close().await;

    reader.close().await;
    writer.close().await;
    cluster.shutdown().await?;
    Ok(())
}

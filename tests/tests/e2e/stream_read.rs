//! A streamed read of a range larger than the node's memory budget completes with bounded
//! memory: 3 node processes at RF 3, R 2, one series of 2,000,000 points (48 MB as points in
//! memory), streamed through the SDK from node 0 and counted as it arrives. Node 0's peak
//! resident memory during the read grows by less than the budget, and every point arrives once,
//! in order.

use std::time::Duration;

use futures::StreamExt;
use timeshard_proto::{Point, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

const POINTS: usize = 2_000_000;
/// What the read may add to node 0's peak resident memory: less than the range's points.
const MEMORY_BUDGET: u64 = 32 << 20;

/// A process's (current, peak) resident memory in bytes.
fn rss(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status.lines().find(|l| l.starts_with(name)).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
        let kb: u64 = line.split_whitespace().nth(1).unwrap_or("0").parse()?;
        Ok(kb * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_read_larger_than_the_memory_budget_stays_within_it() -> anyhow::Result<()> {
    assert!((POINTS * std::mem::size_of::<Point>()) as u64 > MEMORY_BUDGET, "the range exceeds the budget");
    let (mut options, _dir) = ClusterOptions::for_tests(3, NODE);
    // Frames of at most 4 MB, so QUIC's per-stream windows stay small too.
    options.limits.max_message_bytes = 4 << 20;
    options.limits.max_page_points = 100_000;
    let cluster = LocalCluster::start_converged(options).await?;
    let series = datasets::pmu_series(7);
    let writer = cluster.client(1).await?;
    let points: Vec<Point> = datasets::pmu(7).take(POINTS).collect();
    let range = TimeRange::new(T0, points.last().unwrap().ts + 1)?;
    let mut writes = futures::stream::iter(points.chunks(50_000).map(|c| writer.write(&series, c))).buffer_unordered(2);
    while let Some(ack) = writes.next().await {
        ack?;
    }
    drop(writes);
    drop(points);

    let pid = cluster.pid(0).expect("node 0 runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Reset the peak to the current resident set, so only the read counts.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    let (before, _) = rss(pid)?;
    let reader = cluster.client(0).await?;
    let mut n = 0usize;
    let mut last = i64::MIN;
    let mut batches = std::pin::pin!(reader.read_stream(&series, range));
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        assert!(batch.timestamps.windows(2).all(|w| w[0] < w[1]) && batch.timestamps[0] > last, "in order, once each");
        last = *batch.timestamps.last().unwrap();
        n += batch.len();
    }
    let (_, peak) = rss(pid)?;
    assert_eq!(n, POINTS);
    let grew = peak.saturating_sub(before);
    assert!(grew < MEMORY_BUDGET, "node 0's peak resident memory grew by {} MB during the read", grew >> 20);
    eprintln!("streamed {n} points; node 0 peak RSS grew by {:.1} MB", grew as f64 / (1 << 20) as f64);
    reader.close().await;
    writer.close().await;
    cluster.shutdown().await?;
    Ok(())
}

//! Full-size batches: the SDK and `timeshard put` split writes into chunks of exactly
//! `max_batch_points`. The coordinator used to send one node its data blocks and the new index
//! blocks in one store request, one past the limit, which the replica refused: a key-first
//! class (every block of a series on the same few nodes) and a cluster of exactly RF nodes
//! (every node holds every block) could not take a full batch at all, and the client saw
//! `Unavailable`. Every point of a full batch must now be stored and read back.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_node::config::ClassConfig;
use timeshard_proto::wire::Limits;
use timeshard_proto::{KeyFormat, Point, SeriesKey, TimeRange};
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

/// Reads `series` back through `client` and checks every expected point, one by one.
async fn check_all(client: &timeshard_sdk::Client, series: &SeriesKey, expected: &[Point]) -> anyhow::Result<()> {
    let range = TimeRange::new(expected[0].ts, expected[expected.len() - 1].ts + 1)?;
    let got = client.read(series, range).await?;
    assert_eq!(got.len(), expected.len(), "{series}: point count");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g, e, "{series}: point {i} differs");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_into_a_key_first_class_is_stored() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(5, NODE);
    options.classes = vec![ClassConfig {
        name: "meters".into(),
        metric_prefix: "meter.".into(),
        format: KeyFormat::Kfi,
        quantum: Duration::from_secs(60),
        ..Default::default()
    }];
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(2).await?;

    // Live timestamps: one full batch of a meter sampled every millisecond until now.
    let full = Limits::default().max_batch_points as usize;
    let series = datasets::counter_series(7);
    let start = now_ns() - full as i64 * 1_000_000;
    let points: Vec<Point> = (0..full).map(|i| Point::new(start + i as i64 * 1_000_000, i as f64)).collect();
    let ack = client.write_batch(vec![SeriesPoints { series: series.clone(), points: points.clone() }]).await?;
    assert_eq!(ack.points, full as u64);
    check_all(&client, &series, &points).await?;
    // Through another node too.
    check_all(&cluster.client(4).await?, &series, &points).await?;
    assert_eq!(cluster.shutdown().await?, 5);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_put_into_a_cluster_of_exactly_rf_nodes_is_stored() -> anyhow::Result<()> {
    let (options, _dir) = ClusterOptions::for_tests(3, NODE);
    let cluster = LocalCluster::start_converged(options).await?;

    // Fixed historical data: a full batch and one point more, as CSV through `timeshard put`.
    let n = Limits::default().max_batch_points as u64 + 1;
    let series = datasets::pmu_series(3);
    let points: Vec<Point> = datasets::pmu(3).take(n as usize).collect();
    assert!(points[0].ts >= T0);
    let mut csv = String::from("ts,value\n");
    for p in &points {
        csv.push_str(&format!("{},{}\n", p.ts, p.value));
    }
    let node = cluster.addr(0).to_string();
    let pki = cluster.pki_dir().display().to_string();
    let mut child = Command::new(NODE)
        .args(["put", "--node", &node, "--pki", &pki, series.as_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(csv.as_bytes())?;
    let out = child.wait_with_output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "put failed: {err}");
    assert!(err.contains(&format!("wrote {n} points")), "{err}");

    let client = cluster.client(1).await?;
    check_all(&client, &series, &points).await?;

    // The node reports its view and hints.
    let status = Command::new(NODE).args(["status", "--node", &node, "--pki", &pki]).output()?;
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert!(text.contains("members: 3 up, 0 down, 0 gone"), "{text}");
    assert!(text.contains("hints: 0 pending"), "{text}");
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

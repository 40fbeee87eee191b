//! Acknowledged means durable: a node process killed with SIGKILL in the middle of sustained
//! ingest, then restarted on the same data directory, holds every point it acknowledged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use timeshard_node::config::ClassConfig;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

const SERIES: u32 = 8;
const PER_BATCH: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_restarts_with_every_acknowledged_point() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    // One node, one replica: everything the client saw acknowledged, this node acknowledged.
    options.classes = vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    let keys: Vec<SeriesKey> = (0..SERIES).map(datasets::pmu_series).collect();
    let acked: Arc<Mutex<Vec<Vec<Point>>>> = Arc::new(Mutex::new(vec![Vec::new(); SERIES as usize]));
    let writer = {
        let (client, keys, acked) = (client.clone(), keys.clone(), acked.clone());
        tokio::spawn(async move {
            let mut gens: Vec<_> = (0..SERIES).map(datasets::pmu).collect();
            let mut batches = 0u64;
            loop {
                let batch: Vec<SeriesPoints> = keys
                    .iter()
                    .zip(gens.iter_mut())
                    .map(|(k, g)| SeriesPoints { series: k.clone(), points: g.by_ref().take(PER_BATCH).collect() })
                    .collect();
                match client.write_batch(batch.clone()).await {
                    Ok(_) => {
                        let mut acked = acked.lock().unwrap();
                        for (i, s) in batch.into_iter().enumerate() {
                            acked[i].extend(s.points);
                        }
                        batches += 1;
                    }
                    // The node died under us: that batch was not acknowledged.
                    Err(_) => return batches,
                }
            }
        })
    };

    // Let ingest run, then kill the node without warning.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(0).await?;
    let batches = writer.await?;
    assert!(batches >= 5, "ingest barely ran before the kill ({batches} batches)");

    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let acked = acked.lock().unwrap().clone();
    let all = TimeRange::new(T0, T0 + 86_400_000_000_000)?;
    let mut checked = 0;
    for (key, expected) in keys.iter().zip(&acked) {
        let got = client.read(key, all).await?;
        // The batch in flight at the kill may or may not have been stored; every acknowledged
        // point must be.
        assert!(
            got.len() >= expected.len(),
            "{key}: {} points after restart, {} acknowledged",
            got.len(),
            expected.len()
        );
        assert_eq!(&got[..expected.len()], &expected[..], "{key}: an acknowledged point is missing or changed");
        checked += expected.len();
    }
    println!("{batches} batches acknowledged before SIGKILL; all {checked} acknowledged points read back");
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

//! A 10-node cluster of separate processes at RF 3: after killing any one node with SIGKILL,
//! every acknowledged point is still readable, point for point, and writes still succeed.

use rand::{Rng, SeedableRng};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

const NODES: usize = 10;
const SERIES: u32 = 12;
/// 70 s of 60 Hz data per series: 8 quanta each, so ~100 blocks spread over the cluster.
const POINTS: usize = 70 * 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_point_survives_killing_any_one_node() -> anyhow::Result<()> {
    let (options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    let mut cluster = LocalCluster::start_converged(options).await?;

    let data: Vec<(SeriesKey, Vec<Point>)> =
        (0..SERIES).map(|b| (datasets::pmu_series(b), datasets::pmu(b).take(POINTS).collect())).collect();
    let writer = cluster.client(0).await?;
    for chunk in (0..POINTS).step_by(1000) {
        let batch = data
            .iter()
            .map(|(s, p)| SeriesPoints { series: s.clone(), points: p[chunk..(chunk + 1000).min(POINTS)].to_vec() })
            .collect();
        let ack = writer.write_batch(batch).await?;
        assert!(ack.points > 0);
    }

    // Kill a random node other than the two the clients use; the seed is printed so a failure
    // can be replayed.
    let seed: u64 = rand::rng().random();
    let victim = rand::rngs::StdRng::seed_from_u64(seed).random_range(2..NODES);
    println!("seed {seed}: killing node {victim} ({})", cluster.id(victim).short());
    cluster.kill(victim).await?;

    let reader = cluster.client(1).await?;
    let all = TimeRange::new(T0, T0 + 3_600_000_000_000)?;
    for (series, expected) in &data {
        let got = reader.read(series, all).await?;
        assert_eq!(got.len(), expected.len(), "{series}: point count after killing node {victim} (seed {seed})");
        assert_eq!(&got, expected, "{series}: points differ after killing node {victim} (seed {seed})");
    }

    // The cluster still takes writes (W = 2 of the 3 replicas), and they read back.
    let late: Vec<Point> = datasets::pmu(0).skip(POINTS).take(600).collect();
    writer.write(&data[0].0, &late).await?;
    let got = reader.read(&data[0].0, TimeRange::new(late[0].ts, late[599].ts + 1)?).await?;
    assert_eq!(got, late);

    let survivors = NODES - 1;
    assert_eq!(cluster.shutdown().await?, survivors, "every surviving node exits cleanly");
    Ok(())
}

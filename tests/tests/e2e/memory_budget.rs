//! Past its memory budget a node sheds load instead of growing: a node restarted with a budget
//! below what the process already holds refuses writes with a retryable "memory budget
//! exceeded" error, still serves every acknowledged point, and takes the refused write once it
//! has room again.

use timeshard_node::budget::{ByteSize, MIN_BUDGET, MemoryConfig};
use timeshard_node::config::ClassConfig;
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::SeriesPoints;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

const SERIES: u32 = 4;
const PER_BATCH: usize = 500;

fn batch(keys: &[SeriesKey], gens: &mut [impl Iterator<Item = Point>]) -> Vec<SeriesPoints> {
    keys.iter()
        .zip(gens.iter_mut())
        .map(|(k, g)| SeriesPoints { series: k.clone(), points: g.by_ref().take(PER_BATCH).collect() })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_over_its_budget_refuses_writes_and_keeps_serving_reads() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    let keys: Vec<SeriesKey> = (0..SERIES).map(datasets::pmu_series).collect();
    let mut gens: Vec<_> = (0..SERIES).map(datasets::pmu).collect();
    let mut acked: Vec<Vec<Point>> = vec![Vec::new(); SERIES as usize];
    for _ in 0..4 {
        let b = batch(&keys, &mut gens);
        client.write_batch(b.clone()).await?;
        for (i, s) in b.into_iter().enumerate() {
            acked[i].extend(s.points);
        }
    }

    // A budget below what the process holds once started (about 10 MB): every write is over it.
    cluster.edit_config(0, |c| c.memory.budget = ByteSize(MIN_BUDGET))?;
    assert!(cluster.terminate(0).await?, "node 0 exits cleanly");
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let refused = batch(&keys, &mut gens);
    for _ in 0..3 {
        let err = client.write_batch(refused.clone()).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::Overloaded), "{err}");
        assert!(err.code().unwrap().is_replica_fault(), "the refusal is retryable");
        assert!(err.to_string().contains("memory budget exceeded"), "{err}");
    }
    let all = TimeRange::new(T0, T0 + 86_400_000_000_000)?;
    for (key, expected) in keys.iter().zip(&acked) {
        assert_eq!(&client.read(key, all).await?, expected, "{key}: reads go on over the budget");
    }

    // With room again, the refused write goes through on retry, and nothing was lost.
    cluster.edit_config(0, |c| c.memory = MemoryConfig::default())?;
    assert!(cluster.terminate(0).await?, "node 0 exits cleanly");
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    client.write_batch(refused.clone()).await?;
    for (i, s) in refused.into_iter().enumerate() {
        acked[i].extend(s.points);
    }
    let mut checked = 0;
    for (key, expected) in keys.iter().zip(&acked) {
        assert_eq!(&client.read(key, all).await?, expected, "{key}");
        checked += expected.len();
    }
    println!("writes refused over a {} budget; all {checked} acknowledged points read back", ByteSize(MIN_BUDGET));
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

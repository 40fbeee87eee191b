//! Context of interest on nodes enrolled with a control plane, where the CoI class and every
//! node's location come from the control plane only: the enrollment tokens place all five nodes
//! in Atlanta, then `device set-location` moves three of them away (Houston, Seattle, Chicago)
//! while they run. Node 0's own file says Seattle: the control plane's location wins.
//!
//! Series located in Atlanta are then written through Chicago: each block's in-CoI replicas are
//! the two Atlanta nodes, its out-of-CoI replica is Houston or Seattle (over 1,000 km away), and
//! Chicago (945 km) holds nothing; checked on each node's store. Had a move not been applied,
//! the moved nodes would still count as Atlanta's and take in-CoI replicas.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use timeshard_clock::now_ns;
use timeshard_node::control::digest_prefix;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::fleet::{Backend, ControlPlane};
use timeshard_testkit::inspect::Inspector;

use crate::{CONTROL, NODE};

/// Where the control plane moves nodes 1 to 4 (node 0 stays where its token put it, Atlanta).
const MOVES: [(usize, &str); 4] =
    [(1, "33.775,-84.396"), (2, "29.76,-95.37"), (3, "47.606,-122.332"), (4, "41.878,-87.63")];
const ATLANTA: [usize; 2] = [0, 1];
const FAR: [usize; 2] = [2, 3];
const CHICAGO: usize = 4;

/// The series node `i` holds points of.
async fn held(cluster: &LocalCluster, i: usize) -> anyhow::Result<BTreeSet<SeriesKey>> {
    let mut inspector = Inspector::with_identity(&cluster.client_tls_of(i))?;
    let blocks = inspector.blocks(cluster.addr(i)).await?;
    inspector.close().await;
    Ok(blocks
        .into_iter()
        .filter(|b| b.count > 0 && b.series.metric().starts_with("traffic."))
        .map(|b| b.series)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coi_classes_and_locations_from_the_control_plane() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-coi-fleet-").tempdir()?;
    let control = ControlPlane::start(CONTROL, Backend::Sqlite, dir.path()).await?;
    control
        .cli(&[
            "class",
            "set",
            "traffic",
            "--prefix",
            "traffic.",
            "--quantum",
            "2s",
            "--coi",
            "n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5",
        ])
        .await?;
    let (mut options, _) = ClusterOptions::for_tests(5, NODE);
    options.dir = dir.path().join("nodes");
    // Node 0's own file puts it in Seattle; its enrollment token says Atlanta.
    options.locations = vec![Some("47.606,-122.332".into())];
    let cluster = control.enroll_cluster(options).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;

    let ids: Vec<String> = (0..5).map(|i| cluster.id(i).to_hex()).collect();
    for (i, at) in MOVES {
        control.cli(&["device", "set-location", &ids[i], at]).await?;
    }
    let fleet = control.fleet().await?;
    let started = Instant::now();
    loop {
        let mut current = true;
        for i in 0..5 {
            let s = cluster.status(i).await?;
            current &= s.config_generation == fleet.generation && s.config_digest == digest_prefix(&fleet.digest);
        }
        if current {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the moves were not applied within 15 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = control.cli(&["devices"]).await?;
    assert!(MOVES.iter().all(|(_, at)| listed.contains(at)) && listed.contains("33.75,-84.39"), "{listed}");
    // The new locations travel by gossip (every 200 ms here).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let series: Vec<SeriesKey> =
        (0..6).map(|i| format!("traffic.speed{{geohash=dn5bpsb,seg={i}}}").parse()).collect::<Result<_, _>>()?;
    // Live points, all in the last ended 2 s quantum: points spanning two quanta would make
    // two blocks of a series, placed apart, and the count of far copies below is per series.
    let now = now_ns();
    let quantum = 2_000_000_000;
    let base = (now / quantum - 1) * quantum;
    let points: Vec<Point> = (0..50).map(|i| Point::new(base + i * 10_000_000, i as f64)).collect();
    let chicago = cluster.client(CHICAGO).await?;
    for s in &series {
        chicago.write(s, &points).await?;
    }
    let everything: BTreeSet<SeriesKey> = series.iter().cloned().collect();

    // Out-of-CoI replicas are written asynchronously: wait for them.
    let started = Instant::now();
    loop {
        let far: Vec<BTreeSet<SeriesKey>> = vec![held(&cluster, FAR[0]).await?, held(&cluster, FAR[1]).await?];
        let far_copies: usize = far.iter().map(BTreeSet::len).sum();
        if far_copies >= series.len() {
            assert_eq!(far_copies, series.len(), "one out-of-CoI replica per block: {far:?}");
            assert_eq!(far[0].union(&far[1]).cloned().collect::<BTreeSet<_>>(), everything);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "out-of-CoI replicas incomplete: {far:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in ATLANTA {
        assert_eq!(held(&cluster, i).await?, everything, "Atlanta node {i} holds an in-CoI replica of every series");
    }
    assert!(held(&cluster, CHICAGO).await?.is_empty(), "Chicago is neither in the CoI nor 1,000 km away");
    let range = TimeRange::new(base, now)?;
    let seattle = cluster.client(FAR[1]).await?;
    assert_eq!(seattle.read(&series[0], range).await?, points);

    chicago.close().await;
    seattle.close().await;
    assert_eq!(cluster.shutdown().await?, 5, "every node exits cleanly");
    Ok(())
}

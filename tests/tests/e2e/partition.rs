//! A partition: 10 node processes at RF 3, W 2, split 3 | 7 by their fault files
//! (`[testing] fault_file`) while fixed historical data is ingested through a node of the
//! majority. Once each side's view sees the other as down, a write succeeds exactly when W
//! owners of everything it touches are on the coordinator's side, and otherwise fails with
//! `Unavailable` saying so; ingest through the majority continues. After healing, the hints
//! reach the other side, every owner holds every acknowledged point, and every acknowledged
//! point reads back at R = 2 from either side, point by point.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timeshard_proto::key::{self, series_meta_id};
use timeshard_proto::placement::owners;
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Contact, Id, KeyFormat, Point, PointKey, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};
use timeshard_testkit::inspect::Inspector;

use crate::NODE;

const NODES: usize = 10;
const MAJORITY: [usize; 7] = [0, 1, 2, 3, 4, 5, 6];
const MINORITY: [usize; 3] = [7, 8, 9];
const SERIES: u32 = 8;
/// Points per write: one second of 60 Hz.
const PER_WRITE: usize = 60;
/// Single-point writes of fresh series through each side while partitioned: up to this many
/// that should succeed and this many that should fail.
const PROBES: usize = 6;

/// Acknowledged points per series, and the phase (0 before, 1 during, 2 after the partition)
/// of each acknowledged write.
#[derive(Default)]
struct Log {
    acked: BTreeMap<SeriesKey, Vec<Point>>,
    ok: [u64; 3],
    failed: [u64; 3],
}

async fn ingest(client: Client, log: Arc<Mutex<Log>>, phase: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    let mut next = vec![0usize; SERIES as usize];
    let mut s = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let key = datasets::pmu_series(s);
        let from = next[s as usize];
        let points: Vec<Point> = (from..from + PER_WRITE).map(|i| datasets::pmu_point(s, i as u64)).collect();
        next[s as usize] += PER_WRITE;
        let p = phase.load(Ordering::Relaxed);
        match client.write(&key, &points).await {
            Ok(_) => {
                let mut log = log.lock().unwrap();
                log.ok[p] += 1;
                log.acked.entry(key).or_default().extend(points);
            }
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
                log.lock().unwrap().failed[p] += 1;
            }
        }
        s = (s + 1) % SERIES;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the nodes of `side` hold W = 2 of the owners of everything a first write of one
/// point of `series` touches: its block, and its registration and quantum index.
fn writable(members: &[Contact], side: &HashSet<Id>, series: &SeriesKey, q: &Quantum) -> bool {
    let ids = [key::block_id(KeyFormat::Qfi, series, q), series_meta_id(series)];
    ids.iter().all(|id| owners(members, id, 3).iter().filter(|c| side.contains(&c.id)).count() >= 2)
}

/// Waits until every node sees the `down` nodes of the other side as down and the rest up.
async fn wait_views(cluster: &LocalCluster, down: impl Fn(usize) -> u32, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut settled = true;
        for i in 0..NODES {
            let s = cluster.status(i).await?;
            settled &= s.members_down == down(i) && s.members_up == NODES as u32 - down(i);
        }
        if settled {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the views did not settle within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_cluster_refuses_what_it_cannot_replicate_and_heals() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    options.fault_injection = true;
    let cluster = LocalCluster::start_converged(options).await?;
    let members = cluster.contacts();

    let log = Arc::new(Mutex::new(Log::default()));
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(ingest(cluster.client(0).await?, log.clone(), phase.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    cluster.partition(&[&MAJORITY, &MINORITY])?;
    phase.store(1, Ordering::Relaxed);
    wait_views(&cluster, |i| if MINORITY.contains(&i) { 7 } else { 3 }, Duration::from_secs(20)).await?;

    // Fresh series, one point each, through a node of each side: each write succeeds exactly
    // when its side holds W owners of what it touches, and says why when it does not. The
    // series are picked so both outcomes are tried on each side where the ids allow it.
    let len = QuantumLen::DEFAULT;
    let mut probes_acked: Vec<(SeriesKey, Point)> = Vec::new();
    let mut outcomes = [[0usize; 2]; 2];
    for (side, group, through) in [(0, &MAJORITY[..], 0), (1, &MINORITY[..], 7)] {
        let ids: HashSet<Id> = group.iter().map(|&i| cluster.id(i)).collect();
        let mut probes: [Vec<(SeriesKey, Point)>; 2] = [Vec::new(), Vec::new()];
        for k in 0..5_000u32 {
            let series: SeriesKey = format!("probe.side{side}{{k={k}}}").parse()?;
            let point = Point::new(T0 + i64::from(k % 3_600) * 1_000_000_000, f64::from(k));
            let expected = writable(&members, &ids, &series, &len.quantum_of(point.ts));
            let bucket = &mut probes[usize::from(!expected)];
            if bucket.len() < PROBES {
                bucket.push((series, point));
            }
        }
        let client = cluster.client(through).await?;
        for (expected, (series, point)) in
            probes.into_iter().zip([true, false]).flat_map(|(v, e)| v.into_iter().map(move |p| (e, p)))
        {
            match client.write(&series, &[point]).await {
                Ok(_) => {
                    assert!(expected, "{series} was written through node {through} without W owners on its side");
                    probes_acked.push((series, point));
                    outcomes[side][0] += 1;
                }
                Err(e) => {
                    assert!(!expected, "{series} through node {through} failed though its side holds W owners: {e}");
                    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
                    let message = e.to_string();
                    assert!(message.contains("are up") && message.contains("nothing was written"), "{message}");
                    outcomes[side][1] += 1;
                }
            }
        }
    }
    println!("probe writes [ok, refused]: majority {:?}, minority {:?}", outcomes[0], outcomes[1]);
    assert!(outcomes[0][0] > 0 && outcomes[1][1] > 0, "{outcomes:?}");

    cluster.heal()?;
    phase.store(2, Ordering::Relaxed);
    wait_views(&cluster, |_| 0, Duration::from_secs(20)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await?;
    let log = std::mem::take(&mut *log.lock().unwrap());
    println!("ingest through the majority [before, during, after]: ok {:?}, failed {:?}", log.ok, log.failed);
    assert!(log.ok[1] > 0, "no write through the majority succeeded during the partition");
    // The hints reach the other side.
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..NODES {
        loop {
            let s = cluster.status(i).await?;
            if s.hints_pending == 0 && s.replica_writes_in_flight == 0 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "node {i} still holds hints: {s:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let replayed: u64 = {
        let mut n = 0;
        for i in 0..NODES {
            n += cluster.status(i).await?.hints_replayed;
        }
        n
    };
    assert!(replayed > 0, "no hints were replayed");

    // Every owner of every block holds every acknowledged point of it.
    let mut acked = log.acked;
    for (series, point) in probes_acked {
        acked.entry(series).or_default().push(point);
    }
    let mut inspector = Inspector::new(&cluster).await?;
    let mut blocks = 0;
    for (series, points) in &acked {
        let mut by_quantum: BTreeMap<Quantum, Vec<Point>> = BTreeMap::new();
        for p in points {
            by_quantum.entry(len.quantum_of(p.ts)).or_default().push(*p);
        }
        for (q, expected) in by_quantum {
            for o in owners(&members, &key::block_id(KeyFormat::Qfi, series, &q), 3) {
                let held: HashSet<PointKey> =
                    inspector.block(o.addr, series, q).await?.iter().map(Point::key).collect();
                let missing = expected.iter().filter(|p| !held.contains(&p.key())).count();
                assert_eq!(missing, 0, "{series} at {}: owner {} lacks {missing} acknowledged points", q.start, o.addr);
            }
            blocks += 1;
        }
    }
    inspector.close().await;
    println!("every owner of {blocks} blocks holds every acknowledged point");

    // And every acknowledged point reads back at R = 2, through either side.
    for reader in [0, 8] {
        let client = cluster.client(reader).await?;
        for (series, points) in &acked {
            let range = TimeRange::new(points[0].ts, points[points.len() - 1].ts + 1)?;
            let have: HashSet<PointKey> = client.read(series, range).await?.iter().map(Point::key).collect();
            for p in points {
                assert!(have.contains(&p.key()), "{series}: acknowledged point {p:?} missing through node {reader}");
            }
        }
    }
    assert_eq!(cluster.shutdown().await?, NODES);
    Ok(())
}

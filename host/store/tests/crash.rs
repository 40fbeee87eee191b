//! Crash injection below the store: concurrent ingest and maintenance on a simulated disk that
//! dies after a random number of bytes (tearing the write in flight), then a restart from what
//! a power cut would leave. Reopening must always succeed and hold every acknowledged point, and
//! nothing that was never written.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use timeshard_proto::{Point, PointKey, SeriesKey};
use timeshard_store::sim::{FailKind, SimBackend, SplitMix64};
use timeshard_store::{DiskStore, Store};

use common::*;

fn value_of(ts: i64, event: u64) -> f64 {
    (ts % 1000) as f64 + event as f64 * 0.5
}

fn keys() -> Vec<SeriesKey> {
    (0..3).map(|i| format!("crash{{dev={i}}}").parse().unwrap()).collect()
}

/// Counts a finished writer however it ends.
struct Finish<'a>(&'a AtomicUsize);
impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs 3 writers and a maintenance thread until the disk dies; returns the acknowledged points
/// per series.
fn ingest_until_death(store: &DiskStore, seed: u64) -> Vec<BTreeSet<PointKey>> {
    let acked: Vec<Mutex<BTreeSet<PointKey>>> = (0..3).map(|_| Mutex::new(BTreeSet::new())).collect();
    let dead = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let clock = AtomicI64::new(0);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (acked, dead, clock, done) = (&acked, &dead, &clock, &done);
            s.spawn(move || {
                let _finish = Finish(done);
                let mut rng = SplitMix64(seed ^ ((t + 1) * 0x1234_5678));
                let keys = keys();
                for i in 0..400i64 {
                    if dead.load(Ordering::Relaxed) {
                        return;
                    }
                    let si = rng.below(3) as usize;
                    // Mostly in order, sometimes late (older quanta), sometimes a replay.
                    let base = if rng.below(5) == 0 { rng.below(i as u64 * 50_000 + 1) as i64 } else { i * 50_000 };
                    let pts: Vec<Point> = (0..1 + rng.below(20) as i64)
                        .map(|j| {
                            let ts = base + j * 7_000;
                            Point { ts, event: t, value: value_of(ts, t) }
                        })
                        .collect();
                    clock.fetch_max(base, Ordering::Relaxed);
                    match store.write(&blocks(&keys[si], qlen(), &pts)) {
                        Ok(_) => acked[si].lock().unwrap().extend(pts.iter().map(Point::key)),
                        Err(_) => {
                            dead.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            });
        }
        s.spawn(|| {
            while !dead.load(Ordering::Relaxed) && done.load(Ordering::Relaxed) < 3 {
                if store.maintain(clock.load(Ordering::Relaxed)).is_err() {
                    dead.store(true, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
        });
    });
    acked.into_iter().map(|m| m.into_inner().unwrap()).collect()
}

#[test]
fn every_acknowledged_point_survives_a_crash_at_any_offset() {
    let (mut died, mut sealed) = (0, 0);
    for seed in 0..40u64 {
        let sim = SimBackend::new();
        let store = open(&sim, small_config());
        let mut rng = SplitMix64(seed);
        let budget = 2_000 + rng.below(120_000);
        sim.fail_writes_after(budget, FailKind::Crashed);
        let acked = ingest_until_death(&store, seed);
        let appended = sim.bytes_appended();
        died += usize::from(appended >= budget);
        drop(store);
        for image_seed in 0..3 {
            let image = sim.crash(seed * 100 + image_seed);
            sealed += usize::from(image.files().iter().any(|(n, _)| n.starts_with("blocks/")));
            let store = open(&image, small_config());
            for (key, want) in keys().iter().zip(&acked) {
                let got = read_all(&store, key, 1000);
                let got_keys: BTreeSet<PointKey> = got.iter().map(Point::key).collect();
                let missing: Vec<_> = want.difference(&got_keys).take(3).collect();
                assert!(
                    missing.is_empty(),
                    "seed {seed}/{image_seed} (crash after {appended} bytes): acknowledged points lost, e.g. {missing:?}"
                );
                for p in &got {
                    assert_eq!(p.value, value_of(p.ts, p.event), "a point that was never written appeared");
                }
            }
            // The restarted store works: it ingests, seals and restarts again.
            let k: SeriesKey = "after{crash=1}".parse().unwrap();
            store.write(&blocks(&k, qlen(), &[Point::new(5, 1.0)])).unwrap();
            settle(&store, i64::MAX / 2);
            drop(store);
            let again = open(&image, small_config());
            assert_eq!(read_all(&again, &k, 10).len(), 1);
        }
    }
    assert!(sealed >= 30, "crashes should often hit a store with sealed blocks, did {sealed} times");
    assert!(died >= 25, "the disk should die mid-run in most runs, did in {died}");
}

#[test]
fn a_torn_last_record_is_dropped_and_the_rest_replayed() {
    let sim = SimBackend::new();
    let store = open(&sim, small_config());
    let k: SeriesKey = "torn".parse().unwrap();
    let pts: Vec<Point> = (0..100).map(|i| Point::new(i * 10_000, i as f64)).collect();
    store.write(&blocks(&k, qlen(), &pts)).unwrap();
    // The next write dies 20 bytes in: a torn record at the end of the log.
    sim.fail_writes_after(20, FailKind::Crashed);
    let more: Vec<Point> = (100..200).map(|i| Point::new(i * 10_000, i as f64)).collect();
    assert!(store.write(&blocks(&k, qlen(), &more)).is_err());
    drop(store);
    let image = sim.crash(7);
    let wal: Vec<_> = image.files().into_iter().filter(|(n, _)| n.starts_with("wal/")).collect();
    assert!(!wal.is_empty());
    let store = open(&image, small_config());
    assert_eq!(read_all(&store, &k, 1000).len(), 100);
    assert!(store.health().is_empty(), "a torn tail is expected after a crash: {:?}", store.health());
}

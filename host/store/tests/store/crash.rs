//! Crash injection below the store: concurrent ingest and maintenance on a simulated disk that
//! dies after a random number of bytes (tearing the write in flight), then a restart from what
//! a power cut would leave. Reopening must always succeed and hold every acknowledged point, and
//! nothing that was never written.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey};
use timeshard_store::faulty_disk::{FailKind, FaultyDisk, SplitMix64};
use timeshard_store::{DiskStore, Store};

use crate::common::*;

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
        let disk = FaultyDisk::new();
        let store = open(&disk, small_config());
        let mut rng = SplitMix64(seed);
        let budget = 2_000 + rng.below(120_000);
        disk.fail_writes_after(budget, FailKind::Crashed);
        let acked = ingest_until_death(&store, seed);
        let appended = disk.bytes_appended();
        died += usize::from(appended >= budget);
        drop(store);
        for image_seed in 0..3 {
            let image = disk.crash(seed * 100 + image_seed);
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
    let disk = FaultyDisk::new();
    let store = open(&disk, small_config());
    let k: SeriesKey = "torn".parse().unwrap();
    let pts: Vec<Point> = (0..100).map(|i| Point::new(i * 10_000, i as f64)).collect();
    store.write(&blocks(&k, qlen(), &pts)).unwrap();
    // The next write dies 20 bytes in: a torn record at the end of the log.
    disk.fail_writes_after(20, FailKind::Crashed);
    let more: Vec<Point> = (100..200).map(|i| Point::new(i * 10_000, i as f64)).collect();
    assert!(store.write(&blocks(&k, qlen(), &more)).is_err());
    drop(store);
    let image = disk.crash(7);
    let wal: Vec<_> = image.files().into_iter().filter(|(n, _)| n.starts_with("wal/")).collect();
    assert!(!wal.is_empty());
    let store = open(&image, small_config());
    assert_eq!(read_all(&store, &k, 1000).len(), 100);
    assert!(store.health().is_empty(), "a torn tail is expected after a crash: {:?}", store.health());
}

/// One deterministic run: writes to two series (one under retention) and to a third whose
/// quantum never ends, registrations, late data into sealed blocks, a conditional drop, and
/// maintenance with tiny segments, so that it seals, re-seals, writes and merges checkpoint
/// frames (raising the format), compacts, rewrites the index, checkpoints the log and expires
/// blocks. Stops at the first failure.
fn scripted_run(store: &DiskStore) -> Scripted {
    let keys = scripted_keys();
    let mut run = Scripted::default();
    let names: Vec<SeriesKey> = keys.iter().map(|(k, _)| k.clone()).collect();
    if store.register_series(&names).is_err() {
        return run;
    }
    run.registered = true;
    for round in 0..16i64 {
        for (si, (k, len)) in keys.iter().enumerate() {
            // New points in this round's quanta, plus late points into every older quantum.
            let mut pts: Vec<Point> = (0..30)
                .map(|j| {
                    let ts = round * 2_000_000 + j * 66_000;
                    Point { ts, event: 0, value: value_of(ts, 0) }
                })
                .collect();
            pts.extend((0..round).map(|q| {
                let ts = q * 2_000_000 + 1_000 + round;
                Point { ts, event: 1, value: value_of(ts, 1) }
            }));
            match store.write(&blocks(k, *len, &pts)) {
                Ok(_) => run.acked[si].extend(pts.iter().map(Point::key)),
                Err(_) => return run,
            }
        }
        if round == 8 {
            // Hand a sealed block off: drop it with the digest a new owner would confirm.
            // Until the drop returns, its points may or may not survive a crash.
            let (k, len) = &keys[0];
            let q = len.quantum_of(DROPPED_AT);
            let doomed: Vec<PointKey> = run.acked[0].iter().filter(|p| q.contains(p.ts)).copied().collect();
            run.dropped[0].extend(doomed.iter().copied());
            for p in &doomed {
                run.acked[0].remove(p);
            }
            let digest = match store.block_info(k, q.start) {
                Ok(Some(info)) => info.digest,
                _ => return run,
            };
            match store.drop_block(k, q.start, digest) {
                Ok(true) => {}
                Ok(false) => panic!("the drop found another digest in a run without concurrency"),
                Err(_) => return run,
            }
        }
        run.now = round * 2_000_000;
        for _ in 0..4 {
            match store.maintain(run.now) {
                Ok(r) => {
                    run.did.sealed_blocks += r.sealed_blocks;
                    run.did.checkpointed_blocks += r.checkpointed_blocks;
                    run.did.expired_blocks += r.expired_blocks;
                    run.did.compacted_segments += r.compacted_segments;
                    run.did.wal_segments_removed += r.wal_segments_removed;
                    run.did.index_rewrites += r.index_rewrites;
                    if !r.more {
                        break;
                    }
                }
                Err(_) => return run,
            }
        }
    }
    run
}

#[derive(Default)]
struct Scripted {
    registered: bool,
    acked: [BTreeSet<PointKey>; 3],
    /// Points of the dropped block, acknowledged before the drop: they may or may not be there.
    dropped: [BTreeSet<PointKey>; 3],
    /// The latest time maintenance ran at (retention may have removed what ended before).
    now: i64,
    did: timeshard_store::MaintenanceReport,
}

const SCRIPTED_KEEP_NS: i64 = 9_000_000;

/// The scripted run drops the block of its first series holding this time, at round 8.
const DROPPED_AT: i64 = 4_000_000;

fn scripted_keys() -> [(SeriesKey, QuantumLen); 3] {
    [
        ("ops{s=a}".parse().unwrap(), qlen()),
        ("tmp.ops{s=b}".parse().unwrap(), qlen()),
        // A quantum that lasts the whole run: its points become checkpoint frames.
        ("live.ops{s=c}".parse().unwrap(), QuantumLen::new(1_000_000_000).unwrap()),
    ]
}

fn scripted_config() -> timeshard_store::DiskConfig {
    timeshard_store::DiskConfig {
        retention: vec![timeshard_store::RetentionRule::new("tmp.", SCRIPTED_KEEP_NS)],
        max_open_age_ns: 0,
        max_block_frames: 3,
        block_segment_bytes: 3 << 10,
        wal_segment_bytes: 2 << 10,
        index_rewrite_bytes: 3 << 10,
        ..small_config()
    }
}

/// Stops the process before every single file operation of a run in turn (an append, a sync,
/// a truncation, an atomic replace, a removal), then restarts from what a power cut leaves:
/// every acknowledged point is there, nothing else appears, summaries match the points, and
/// the restarted store keeps working.
#[test]
fn a_crash_before_any_file_operation_loses_no_acknowledged_point() {
    let full = FaultyDisk::new();
    let written = scripted_run(&open(&full, scripted_config()));
    let did = written.did;
    assert!(
        did.sealed_blocks > 0
            && did.checkpointed_blocks > 0
            && did.expired_blocks > 0
            && did.compacted_segments > 0
            && did.wal_segments_removed > 0
            && did.index_rewrites > 0,
        "the run does every kind of maintenance, so the crashes below hit each of them: {did:?}"
    );
    {
        use timeshard_store::Backend;
        let format = String::from_utf8(full.read_all("FORMAT").unwrap()).unwrap();
        assert!(format.contains("\nformat 2\n"), "checkpoint frames raised the format: {format:?}");
    }
    let total_ops = full.ops();
    for n in 0..total_ops {
        let disk = FaultyDisk::new();
        let store = open(&disk, scripted_config());
        disk.fail_writes_after_ops(n, FailKind::Crashed);
        let run = scripted_run(&store);
        drop(store);
        for image_seed in 0..2 {
            let at = format!("crash before op {n}/{total_ops} (image {image_seed})");
            check_restart(&disk.crash(n * 10 + image_seed), &run, &written, &at);
        }
    }
}

/// The disk fills up before any one file operation, the run fails there, space comes back and
/// the run is done again: the store carries on and a later power cut loses nothing.
#[test]
fn the_store_carries_on_after_the_disk_fills_before_any_file_operation() {
    let full = FaultyDisk::new();
    let written = scripted_run(&open(&full, scripted_config()));
    let total_ops = full.ops();
    for n in (0..total_ops).step_by(3) {
        let disk = FaultyDisk::new();
        let store = open(&disk, scripted_config());
        disk.fail_writes_after_ops(n, FailKind::DiskFull);
        let first = scripted_run(&store);
        disk.heal();
        let mut run = scripted_run(&store);
        assert!(run.registered && run.acked == written.acked, "full before op {n}: the retried run failed");
        // The retried run dropped the block after everything the first run wrote to it, and
        // then wrote some of those points again.
        let dropped = qlen().quantum_of(DROPPED_AT);
        for (si, ((a, d), b)) in run.acked.iter_mut().zip(&mut run.dropped).zip(first.acked).enumerate() {
            for p in b {
                if si == 0 && dropped.contains(p.ts) && !a.contains(&p) {
                    d.insert(p);
                } else {
                    a.insert(p);
                }
            }
        }
        assert!(store.health().is_empty(), "full before op {n}: {:?}", store.health());
        drop(store);
        check_restart(&disk.crash(n), &run, &written, &format!("full before op {n}/{total_ops}"));
    }
}

/// Reopens `image` and checks it against the run that was acknowledged on it.
fn check_restart(image: &FaultyDisk, run: &Scripted, written: &Scripted, at: &str) {
    let store = DiskStore::open_with_backend(std::sync::Arc::new(image.clone()), scripted_config())
        .unwrap_or_else(|e| panic!("{at}: reopening failed: {e}"));
    for (si, (key, len)) in scripted_keys().iter().enumerate() {
        let got = read_all(&store, key, 50);
        let got_keys: BTreeSet<PointKey> = got.iter().map(Point::key).collect();
        // Retention may have removed the quanta that ended before the last cutoff.
        let cutoff = if si == 1 { run.now - SCRIPTED_KEEP_NS } else { i64::MIN };
        let missing: Vec<_> = run.acked[si]
            .iter()
            .filter(|p| len.quantum_of(p.ts).end() > cutoff && !got_keys.contains(p))
            .take(3)
            .collect();
        assert!(missing.is_empty(), "{at}: acknowledged points lost, e.g. {missing:?}");
        let ever: BTreeSet<PointKey> = written.acked[si].union(&written.dropped[si]).copied().collect();
        let strays: Vec<_> = got_keys.difference(&ever).take(3).collect();
        assert!(strays.is_empty(), "{at}: points never written appeared: {strays:?}");
        let mut by_q: std::collections::BTreeMap<i64, Vec<Point>> = Default::default();
        for p in &got {
            by_q.entry(len.quantum_of(p.ts).start).or_default().push(*p);
        }
        for (q, pts) in &by_q {
            let s = store.block_summary(key, *q).unwrap();
            assert_eq!(s, timeshard_store::Summary::of(pts), "{at}: summary of quantum {q}");
        }
        if run.registered {
            assert!(store.has_series(key).unwrap(), "{at}: registration of {key} lost");
        }
    }
    // The restarted store works and restarts again.
    let k: SeriesKey = "after{crash=1}".parse().unwrap();
    store.write(&blocks(&k, qlen(), &[Point::new(5, 1.0)])).unwrap();
    settle(&store, run.now);
    drop(store);
    let again = open(image, scripted_config());
    assert_eq!(read_all(&again, &k, 10).len(), 1, "{at}");
}

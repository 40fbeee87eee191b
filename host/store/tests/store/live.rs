//! Live timestamps: points stamped near the wall clock, in quanta that have not ended (a
//! 366-day quantum, as the quantum index uses, and a 10 s one), or far in the future. The log
//! must stay bounded during sustained ingest, a restart must replay a bounded log, and every
//! acknowledged point must survive. (Tests stamped in 2023 never saw the log grow: their
//! quanta had long ended.) Time is simulated: the maintenance clock starts at the wall clock and
//! advances with the data.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use timeshard_clock::now_ns;
use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey};
use timeshard_store::faulty_disk::{FailKind, FaultyDisk, SplitMix64};
use timeshard_store::{DiskConfig, DiskStore, MaintenanceReport, Store};

use crate::common::*;

const SEC: i64 = 1_000_000_000;
const DAY: i64 = 86_400 * SEC;

fn year() -> QuantumLen {
    timeshard_proto::key::index_quantum()
}

fn ten_s() -> QuantumLen {
    QuantumLen::new(10 * SEC).unwrap()
}

/// Small log segments and bounds, so a few megabytes of ingest show whether the log is bounded.
fn live_config() -> DiskConfig {
    DiskConfig {
        wal_segment_bytes: 32 << 10,
        max_wal_bytes: 128 << 10,
        max_open_age_ns: SEC,
        block_segment_bytes: 1 << 20,
        ..DiskConfig::default()
    }
}

/// The log a store just opened replayed: (segments, bytes). (A crash image may also hold
/// segments removed before the crash, which opening deletes unread.)
fn replayed(store: &DiskStore) -> (u64, u64) {
    let st = store.stats();
    (st.wal_segments, st.wal_bytes)
}

/// What a run of [`ingest`] saw.
#[derive(Debug, Default)]
struct Run {
    points: Vec<(SeriesKey, QuantumLen, Point)>,
    peak_wal_bytes: u64,
    peak_wal_segments: u64,
    /// Points maintenance wrote into frames, and of those blocks, checkpoints of open quanta.
    sealed_points: u64,
    checkpointed_blocks: u64,
}

/// Writes `batches` batches of 50 points to a 366-day-quantum series and a 10 s-quantum series,
/// 10 ms of simulated time apart from `t0`, with a maintenance step every 5 batches.
fn ingest(store: &DiskStore, t0: i64, batches: i64) -> Run {
    let long: SeriesKey = "live.long{q=366d}".parse().unwrap();
    let short: SeriesKey = "live.short{q=10s}".parse().unwrap();
    let mut run = Run::default();
    for i in 0..batches {
        let now = t0 + i * 10_000_000;
        let pts: Vec<Point> = (0..50).map(|j| Point::new(now + j * 200_000, (i * 50 + j) as f64)).collect();
        for (k, len) in [(&long, year()), (&short, ten_s())] {
            store.write(&blocks(k, len, &pts)).unwrap();
            run.points.extend(pts.iter().map(|p| (k.clone(), len, *p)));
        }
        if i % 5 == 4 {
            loop {
                let r: MaintenanceReport = store.maintain(now).unwrap();
                run.sealed_points += r.sealed_points;
                run.checkpointed_blocks += r.checkpointed_blocks;
                if !r.more {
                    break;
                }
            }
        }
        let st = store.stats();
        run.peak_wal_bytes = run.peak_wal_bytes.max(st.wal_bytes);
        run.peak_wal_segments = run.peak_wal_segments.max(st.wal_segments);
    }
    run
}

fn assert_all_there(store: &DiskStore, points: &[(SeriesKey, QuantumLen, Point)]) {
    let keys: BTreeSet<&SeriesKey> = points.iter().map(|(k, _, _)| k).collect();
    for k in keys {
        let got: BTreeSet<PointKey> = read_all(store, k, 10_000).iter().map(Point::key).collect();
        let want: BTreeSet<PointKey> = points.iter().filter(|(s, _, _)| s == k).map(|(_, _, p)| p.key()).collect();
        assert_eq!(got.len(), want.len(), "{k}: {} points read, {} written", got.len(), want.len());
        assert!(got == want, "{k}: the points read differ from those written");
    }
}

#[test]
fn sustained_live_ingest_keeps_the_log_bounded_by_age_and_by_size() {
    // By age alone (no size bound), then by size alone (no age bound).
    let cases = [
        ("age", DiskConfig { max_wal_bytes: u64::MAX, ..live_config() }),
        ("size", DiskConfig { max_open_age_ns: i64::MAX, ..live_config() }),
    ];
    for (bound, cfg) in cases {
        let disk = FaultyDisk::new();
        let store = open(&disk, cfg.clone());
        let run = ingest(&store, now_ns(), 3_000); // 30 s simulated, 300,000 points
        let logged = disk.bytes_appended();
        println!(
            "bounded by {bound}: log peak {} bytes in {} segments; {logged} bytes appended in all; \
             {} points written, {} sealed into frames ({} checkpoints of open blocks)",
            run.peak_wal_bytes,
            run.peak_wal_segments,
            run.points.len(),
            run.sealed_points,
            run.checkpointed_blocks
        );
        // The data alone is about 3 MB of log; 1 s of it is about 110 kB, and the size bound is
        // 128 kB: with the segment being written and one rotated away, under 512 kB.
        assert!(run.peak_wal_bytes < 512 << 10, "bounded by {bound}: the log reached {} bytes", run.peak_wal_bytes);
        assert!(run.peak_wal_segments <= 16, "bounded by {bound}: {} log segments", run.peak_wal_segments);
        assert!(run.checkpointed_blocks > 0);
        // Checkpoint frames are merged by doubling, not rewritten whole at every checkpoint:
        // rewriting each block's frame at all of its 30 or so checkpoints would write every
        // point about 15 times.
        let amplification = run.sealed_points as f64 / run.points.len() as f64;
        assert!(amplification < 8.0, "bounded by {bound}: each point was written {amplification:.1} times");
        assert_all_there(&store, &run.points);
        // A restart replays a bounded log and holds everything.
        drop(store);
        let store = open(&disk.crash(7), cfg);
        let (segs, bytes) = replayed(&store);
        println!("bounded by {bound}: the restart replayed {bytes} bytes in {segs} segments");
        assert!(bytes < 512 << 10, "bounded by {bound}: the restart replayed {bytes} bytes in {segs} segments");
        assert!(store.health().is_empty(), "{:?}", store.health());
        assert!(store.stats().open_points < 60_000, "replayed {} points", store.stats().open_points);
        assert_all_there(&store, &run.points);
    }
}

#[test]
fn points_far_in_the_future_do_not_pin_the_log() {
    let cfg = DiskConfig { max_wal_bytes: u64::MAX, ..live_config() };
    let disk = FaultyDisk::new();
    let store = open(&disk, cfg.clone());
    let t0 = now_ns();
    let future: SeriesKey = "live.future".parse().unwrap();
    let far: SeriesKey = "live.future.year".parse().unwrap();
    // A sensor with a broken clock: 300 days ahead in a 10 s quantum, and two years ahead in a
    // 366-day one. Neither quantum ends for a very long time.
    let odd = [Point::new(t0 + 300 * DAY, 1.0)];
    let odder = [Point::new(t0 + 800 * DAY, 2.0)];
    store.write(&blocks(&future, ten_s(), &odd)).unwrap();
    store.write(&blocks(&far, year(), &odder)).unwrap();
    let mut run = ingest(&store, t0, 3_000);
    run.points.push((future.clone(), ten_s(), odd[0]));
    run.points.push((far.clone(), year(), odder[0]));
    println!("future points: log peak {} bytes in {} segments", run.peak_wal_bytes, run.peak_wal_segments);
    assert!(run.peak_wal_bytes < 512 << 10, "the log reached {} bytes", run.peak_wal_bytes);
    drop(store);
    let store = open(&disk.crash(3), cfg);
    let (_, bytes) = replayed(&store);
    assert!(bytes < 512 << 10, "the restart replayed {bytes} bytes of log");
    assert_all_there(&store, &run.points);
}

/// Writers with live timestamps on a disk that dies after a random number of bytes: every
/// restart image holds exactly the acknowledged points and a bounded log.
#[test]
fn a_crash_during_live_ingest_replays_a_bounded_log_and_loses_nothing() {
    let cfg = || DiskConfig {
        max_open_age_ns: 200_000_000,
        max_wal_bytes: 64 << 10,
        wal_segment_bytes: 16 << 10,
        block_segment_bytes: 64 << 10,
        max_block_frames: 3,
        ..small_config()
    };
    let keys: Vec<(SeriesKey, QuantumLen)> =
        vec![("crash.long".parse().unwrap(), year()), ("crash.short".parse().unwrap(), ten_s())];
    let value_of = |ts: i64, ev: u64| (ts % 1_000) as f64 + ev as f64;
    let (mut worst_replay, mut died) = (0, 0);
    for seed in 0..8u64 {
        let disk = FaultyDisk::new();
        let store = open(&disk, cfg());
        let mut rng = SplitMix64(seed);
        let budget = 350_000 + rng.below(300_000);
        disk.fail_writes_after(budget, FailKind::Crashed);
        let t0 = now_ns();
        let clock = AtomicI64::new(t0);
        let dead = AtomicBool::new(false);
        let acked: Vec<Mutex<BTreeSet<PointKey>>> = keys.iter().map(|_| Mutex::new(BTreeSet::new())).collect();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (keys, clock, dead, acked) = (&keys, &clock, &dead, &acked);
                let store = &store;
                s.spawn(move || {
                    let mut rng = SplitMix64(seed * 31 + t);
                    for i in 0..1_500i64 {
                        if dead.load(Ordering::Relaxed) {
                            break;
                        }
                        // Mostly now, sometimes a replay of a recent batch.
                        let at = if rng.below(6) == 0 { i - rng.below(20) as i64 } else { i };
                        let now = t0 + at.max(0) * 5_000_000;
                        clock.fetch_max(now, Ordering::Relaxed);
                        let pts: Vec<Point> = (0..20)
                            .map(|j| {
                                let ts = now + j * 100_000 + t as i64;
                                Point { ts, event: t, value: value_of(ts, t) }
                            })
                            .collect();
                        let k = rng.below(2) as usize;
                        match store.write(&blocks(&keys[k].0, keys[k].1, &pts)) {
                            Ok(_) => acked[k].lock().unwrap().extend(pts.iter().map(Point::key)),
                            Err(_) => {
                                dead.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                        // Each writer runs maintenance in turn (while the other writes), so it
                        // keeps pace with ingest however the threads are scheduled.
                        if i % 8 == 7 && store.maintain(clock.load(Ordering::Relaxed)).is_err() {
                            dead.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                });
            }
        });
        died += usize::from(dead.load(Ordering::Relaxed));
        drop(store);
        for image_seed in 0..2 {
            let store = open(&disk.crash(seed * 10 + image_seed), cfg());
            let (_, bytes) = replayed(&store);
            worst_replay = worst_replay.max(bytes);
            // Up to about 650 kB is logged in all; the log holds its bound (64 kB) plus the
            // segments being written, whatever the crash interrupted.
            assert!(bytes < 192 << 10, "seed {seed}/{image_seed}: the restart replayed {bytes} bytes of log");
            for ((k, _), want) in keys.iter().zip(&acked) {
                let want = want.lock().unwrap();
                let got = read_all(&store, k, 5_000);
                let got_keys: BTreeSet<PointKey> = got.iter().map(Point::key).collect();
                let missing: Vec<_> = want.difference(&got_keys).take(3).collect();
                assert!(missing.is_empty(), "seed {seed}/{image_seed}: acknowledged points of {k} lost: {missing:?}");
                for p in &got {
                    assert_eq!(p.value, value_of(p.ts, p.event), "a point that was never written appeared");
                }
            }
            // Settled, the listing agrees with the points.
            settle(&store, clock.load(Ordering::Relaxed));
            for (k, len) in &keys {
                let pts = read_all(&store, k, 5_000);
                let mut by_q: std::collections::BTreeMap<i64, Vec<Point>> = Default::default();
                for p in pts {
                    by_q.entry(len.quantum_of(p.ts).start).or_default().push(p);
                }
                for (q, pts) in by_q {
                    let info = store.block_info(k, q).unwrap().unwrap();
                    let digest = pts.iter().fold(0u64, |d, p| d.wrapping_add(p.identity_hash()));
                    assert_eq!((info.count, info.digest), (pts.len() as u64, digest), "{k} block {q}");
                }
            }
        }
    }
    println!(
        "live crashes: {died} of 8 runs died mid-ingest; at most {worst_replay} bytes of log replayed at a restart"
    );
    assert!(died >= 6, "only {died} runs crashed mid-ingest");
}

/// Maintenance that never runs (a node whose maintenance task lags far behind ingest, as under
/// CPU starvation): writers checkpoint the log themselves once it passes twice
/// `max_wal_bytes`, so the log and a crash's replay stay bounded, with every point kept.
/// (The log used to grow by every write until maintenance ran again: a SIGKILL test on a
/// loaded machine replayed 4 MB against a 1 MiB bound.)
#[test]
fn writers_bound_the_log_when_maintenance_falls_behind() {
    let cfg = DiskConfig { max_open_age_ns: i64::MAX / 4, ..live_config() };
    let disk = FaultyDisk::new();
    let store = open(&disk, cfg.clone());
    let t0 = now_ns();
    // Each writer its own series, so every write lands after the frames (as live data does).
    let keys = |t: u64| -> Vec<(SeriesKey, QuantumLen)> {
        vec![
            (format!("lag.long{{w={t}}}").parse().unwrap(), year()),
            (format!("lag.short{{w={t}}}").parse().unwrap(), ten_s()),
        ]
    };
    let written: Mutex<Vec<(SeriesKey, QuantumLen, Point)>> = Mutex::new(Vec::new());
    let peak = AtomicI64::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (written, peak, store) = (&written, &peak, &store);
            let keys = keys(t);
            s.spawn(move || {
                for i in 0..2_000i64 {
                    let (key, len) = &keys[(i % 2) as usize];
                    let pts: Vec<Point> = (0..50)
                        .map(|j| Point { ts: t0 + i * 10_000_000 + j * 1_000, event: t, value: j as f64 })
                        .collect();
                    store.write(&blocks(key, *len, &pts)).unwrap();
                    written.lock().unwrap().extend(pts.iter().map(|p| (key.clone(), *len, *p)));
                    peak.fetch_max(store.stats().wal_bytes as i64, Ordering::Relaxed);
                }
            });
        }
    });
    let points = written.into_inner().unwrap();
    let logged: u64 = points.len() as u64 * 12;
    let peak = peak.load(Ordering::Relaxed) as u64;
    println!("{} points, about {logged} bytes logged; log peak {peak} bytes", points.len());
    assert!(logged > 8 * cfg.max_wal_bytes, "the test must log far more than the bound");
    // Twice the bound, plus the segment being written and what the two writers flush at once.
    let bound = 2 * cfg.max_wal_bytes + 2 * cfg.wal_segment_bytes;
    assert!(peak <= bound, "the log reached {peak} bytes with no maintenance (bound {bound})");
    drop(store);
    let store = open(&disk.crash(5), cfg);
    let (_, bytes) = replayed(&store);
    assert!(bytes <= bound, "the restart replayed {bytes} bytes of log");
    assert_all_there(&store, &points);
}

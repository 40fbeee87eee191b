//! Reads and aggregates racing with writes and maintenance (seals, re-seals of late data,
//! compaction moving blocks, index rewrites, checkpoints): a reader never misses a point that
//! was acknowledged before its read began, never sees a point twice, and never errors.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};
use timeshard_store::faulty_disk::{FaultyDisk, SplitMix64};
use timeshard_store::{DiskConfig, Store};

use crate::common::*;

#[test]
fn readers_see_every_acknowledged_point_while_maintenance_moves_blocks() {
    let disk = FaultyDisk::new();
    let store = open(&disk, DiskConfig { block_segment_bytes: 2 << 10, ..small_config() });
    let k: SeriesKey = "race{n=1}".parse().unwrap();
    let acked: Mutex<BTreeSet<PointKey>> = Mutex::new(BTreeSet::new());
    let stop = AtomicBool::new(false);
    let clock = AtomicI64::new(0);
    let all = TimeRange::new(0, timeshard_proto::time::MAX_TIMESTAMP).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = SplitMix64(7);
            for i in 0..6000i64 {
                let base = if rng.below(3) == 0 { rng.below(i as u64 * 20_000 + 1) as i64 } else { i * 20_000 };
                let pts: Vec<Point> = (0..1 + rng.below(8) as i64)
                    .map(|j| Point { ts: base + j * 3_000, event: i as u64, value: 1.0 })
                    .collect();
                store.write(&blocks(&k, qlen(), &pts)).unwrap();
                acked.lock().unwrap().extend(pts.iter().map(Point::key));
                clock.fetch_max(base, Ordering::Relaxed);
            }
            stop.store(true, Ordering::Relaxed);
        });
        s.spawn(|| {
            let mut compacted = 0;
            while !stop.load(Ordering::Relaxed) {
                compacted += store.maintain(clock.load(Ordering::Relaxed)).unwrap().compacted_segments;
            }
            assert!(compacted > 0, "the race needs compaction to move blocks under the readers");
        });
        for page in [7usize, 1000] {
            let (acked, stop, store, k) = (&acked, &stop, &store, &k);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let want = acked.lock().unwrap().clone();
                    let got = read_all(store, k, page);
                    assert!(got.windows(2).all(|w| w[0] < w[1]), "a read returned points out of order or twice");
                    let got: BTreeSet<PointKey> = got.iter().map(Point::key).collect();
                    let missing: Vec<_> = want.difference(&got).take(3).collect();
                    assert!(missing.is_empty(), "a read missed acknowledged points, e.g. {missing:?}");
                    // Windows of 2^47 ns (39 h) over all time stay within proto's MAX_WINDOWS;
                    // every point lies in the first one, as with any window above 0.12 s.
                    let aggs = store.aggregate(k, all, Grid::epoch(1 << 47)).unwrap();
                    let n: u64 = aggs.iter().map(|a| a.count).sum();
                    assert!(
                        n >= want.len() as u64,
                        "an aggregate counted {n} points, {} were acknowledged",
                        want.len()
                    );
                }
            });
        }
    });
    settle(&store, i64::MAX / 2);
    assert_eq!(read_all(&store, &k, 100).len(), acked.lock().unwrap().len());
}

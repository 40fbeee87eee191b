//! Maintenance under pressure and over time: the memory valve, compaction of segments left
//! with dead blocks by re-seals, index rewrites, and log checkpoints. Data stays intact
//! through all of it, including restarts.

use timeshard_proto::{Point, SeriesKey};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{DiskConfig, MaintenanceReport, Store};

use crate::common::*;

#[test]
fn writes_seal_by_themselves_when_maintenance_lags() {
    let disk = FaultyDisk::new();
    let cfg = || DiskConfig { max_open_points: 1_000, ..small_config() };
    let store = open(&disk, cfg());
    let k: SeriesKey = "pressure".parse().unwrap();
    let mut peak = 0;
    for b in 0..40i64 {
        let pts: Vec<Point> = (0..250).map(|i| Point::new((b * 250 + i) * 10_000, i as f64)).collect();
        store.write(&blocks(&k, qlen(), &pts)).unwrap();
        peak = peak.max(store.stats().open_points);
    }
    assert!(peak <= 1_250, "open points stay near the cap without maintenance: peak {peak}");
    assert!(store.stats().sealed_blocks > 0);
    assert_eq!(read_all(&store, &k, 997).len(), 10_000);
    drop(store);
    let store = open(&disk.crash(2), cfg());
    assert_eq!(read_all(&store, &k, 10_000).len(), 10_000);
    assert!(store.health().is_empty(), "{:?}", store.health());
}

#[test]
fn reseals_compact_segments_rewrite_the_index_and_checkpoint_the_log() {
    let disk = FaultyDisk::new();
    let store = open(&disk, small_config());
    let keys: Vec<SeriesKey> = (0..4).map(|i| format!("churn{{n={i}}}").parse().unwrap()).collect();
    let mut total = MaintenanceReport::default();
    let mut add = |r: MaintenanceReport| {
        total.sealed_blocks += r.sealed_blocks;
        total.compacted_segments += r.compacted_segments;
        total.index_rewrites += r.index_rewrites;
        total.wal_segments_removed += r.wal_segments_removed;
    };
    for round in 0..30i64 {
        for k in &keys {
            // Each round adds one late event to every one of 10 old quanta: each re-seal leaves
            // the previous copy of the block dead in its segment.
            let pts: Vec<Point> =
                (0..10).map(|q| Point { ts: q * 1_000_000 + round, value: round as f64, event: 1 }).collect();
            store.write(&blocks(k, qlen(), &pts)).unwrap();
        }
        loop {
            let r = store.maintain(i64::MAX / 2).unwrap();
            add(r);
            if !r.more {
                break;
            }
        }
    }
    assert!(total.sealed_blocks >= 30 * 40);
    assert!(total.compacted_segments > 0, "{total:?}");
    assert!(total.index_rewrites > 0, "{total:?}");
    assert!(total.wal_segments_removed > 0, "{total:?}");
    let live: usize = disk.files().iter().filter(|(n, _)| n.starts_with("blocks/")).map(|(_, l)| l).sum();
    assert!(live < 64 << 10, "dead blocks are reclaimed: {live} bytes of segments");
    for k in &keys {
        assert_eq!(read_all(&store, k, 33).len(), 300);
    }
    drop(store);
    let store = open(&disk.crash(5), small_config());
    assert!(store.health().is_empty(), "{:?}", store.health());
    assert_eq!(store.stats().open_points, 0, "everything was sealed and the log checkpointed");
    for k in &keys {
        let got = read_all(&store, k, 1000);
        assert_eq!(got.len(), 300);
        assert_eq!(store.block_summary(k, 0).unwrap().unwrap().count, 30);
    }
}

#[test]
fn one_step_rewrites_a_bounded_number_of_points_even_for_late_data() {
    let disk = FaultyDisk::new();
    let cfg = || DiskConfig { step_max_points: 2_000, ..small_config() };
    let store = open(&disk, cfg());
    let k: SeriesKey = "late.everywhere".parse().unwrap();
    // 20 sealed blocks of 500 points.
    let pts: Vec<Point> = (0..10_000).map(|i| Point::new(i * 2_000, i as f64)).collect();
    store.write(&blocks(&k, qlen(), &pts)).unwrap();
    while store.maintain(i64::MAX / 2).unwrap().more {}
    // One late point into each: re-sealing a block decodes and re-encodes all its points, so
    // the step's budget must count them, or one step holds every touched block at once.
    let late: Vec<Point> = (0..20).map(|q| Point { ts: q * 1_000_000 + 1, value: 0.0, event: 1 }).collect();
    store.write(&blocks(&k, qlen(), &late)).unwrap();
    let mut steps = 0;
    loop {
        let r = store.maintain(i64::MAX / 2).unwrap();
        assert!(r.sealed_points <= 2_000 + 501, "one step re-sealed {} points", r.sealed_points);
        steps += 1;
        if !r.more {
            break;
        }
    }
    assert!(steps >= 5, "{steps} steps");
    assert_eq!(read_all(&store, &k, 1000).len(), 10_020);
    assert_eq!(store.stats().open_points, 0);
}

#[test]
fn paging_through_an_open_block_copies_each_point_about_once() {
    let store = open(&FaultyDisk::new(), DiskConfig { max_block_points: 1 << 20, ..small_config() });
    let k: SeriesKey = "open.paging".parse().unwrap();
    let len = timeshard_proto::QuantumLen::new(1_000_000_000).unwrap();
    let pts: Vec<Point> = (0..200_000).map(|i| Point::new(i * 1_000, i as f64)).collect();
    store.write(&blocks(&k, len, &pts)).unwrap();
    assert_eq!(store.stats().open_points, 200_000, "one big open block");
    let range = timeshard_proto::TimeRange::new(0, 1_000_000_000).unwrap();
    let copied = store.stats().open_points_copied;
    let mut after = None;
    let mut n = 0;
    loop {
        let p = store.read(&k, range, after, 1_000).unwrap();
        n += p.points.len();
        after = p.points.last().map(Point::key);
        if !p.more {
            break;
        }
    }
    assert_eq!(n, 200_000);
    // 200 pages: copying the rest of the open block for every page would copy about
    // 20 million points; each page copies what it returns (and one more to know there is more).
    let copied = store.stats().open_points_copied - copied;
    assert!(copied <= 2 * 200_000, "200 pages copied {copied} open points");
}

#[test]
fn the_memory_valve_skips_blocks_it_cannot_seal() {
    let disk = FaultyDisk::new();
    let cfg = DiskConfig { max_open_points: 1_000, block_segment_bytes: 1 << 20, ..small_config() };
    let store = open(&disk, cfg);
    let damaged: SeriesKey = "valve.damaged".parse().unwrap();
    store.write(&blocks(&damaged, qlen(), &[Point::new(0, 1.0), Point::new(1, 1.0)])).unwrap();
    settle(&store, i64::MAX / 2);
    let (seg, _) = disk.files().into_iter().find(|(n, _)| n.starts_with("blocks/")).unwrap();
    disk.corrupt(&seg, 40, 0x5a);
    // 800 late points that can never merge into the damaged block stay open.
    let late: Vec<Point> = (0..800).map(|i| Point { ts: 2 + i, value: 0.0, event: 1 }).collect();
    store.write(&blocks(&damaged, qlen(), &late)).unwrap();
    settle(&store, i64::MAX / 2);
    assert_eq!(store.stats().open_points, 800);
    // Without maintenance, writes seal their own blocks to stay near the cap, and leave the
    // damaged block (the oldest) alone.
    let k: SeriesKey = "valve.fresh".parse().unwrap();
    let decoded = store.stats().blocks_decoded;
    let mut peak = 0;
    for b in 0..40i64 {
        let pts: Vec<Point> = (0..250).map(|i| Point::new(1_000_000_000 + (b * 250 + i) * 10_000, 1.0)).collect();
        store.write(&blocks(&k, qlen(), &pts)).unwrap();
        peak = peak.max(store.stats().open_points);
    }
    assert!(peak <= 800 + 1_250, "open points grew to {peak}");
    // Retrying the damaged block decodes it (a whole block, possibly millions of points) in
    // the write path, at every write while memory is over the cap.
    let retried = store.stats().blocks_decoded - decoded;
    assert!(retried <= 2, "writes decoded the damaged block {retried} times");
}

#[test]
fn idle_maintenance_does_not_walk_every_series() {
    use timeshard_store::RetentionRule;
    let cfg = DiskConfig { retention: vec![RetentionRule::new("m", 1 << 50)], ..DiskConfig::default() };
    let store = open(&FaultyDisk::new(), cfg);
    let keys: Vec<SeriesKey> = (0..200_000).map(|i| format!("m{{i={i}}}").parse().unwrap()).collect();
    for c in keys.chunks(10_000) {
        store.register_series(c).unwrap();
    }
    let k: SeriesKey = "m{i=7}".parse().unwrap();
    store.write(&blocks(&k, qlen(), &[Point::new(5, 1.0)])).unwrap();
    settle(&store, 1 << 60);
    // Maintenance runs every second. Walking the whole dictionary at every step (retention,
    // the checkpoint's dictionary edits, the index size estimate) costs a core and stalls
    // writers on the state lock at the advertised 10 Mi series; one walk of these 200k takes
    // tens of milliseconds here.
    let walked = store.stats().series_walked;
    for i in 0..10 {
        store.write(&blocks(&k, qlen(), &[Point::new(6 + i, 1.0)])).unwrap();
        store.maintain(1 << 60).unwrap();
    }
    let walked = store.stats().series_walked - walked;
    assert!(walked < 1_000, "10 steps with little to do visited {walked} dictionary entries");
    assert!(store.has_series(&keys[199_999]).unwrap());
}

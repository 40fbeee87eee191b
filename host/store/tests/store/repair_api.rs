//! The store API repair and handoff use: block listings (count, digest, last write, from
//! memory), reading a whole block, conditional and durable drops, and paged registrations,
//! checked on the disk engine against the memory engine and against the raw points.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{BlockInfo, DiskConfig, DiskStore, MemStore, Store, StoreError};

use crate::common::*;

const SEC: i64 = 1_000_000_000;

/// Every block `store` lists, paged by `page`, keyed by (series, quantum start).
fn listed(store: &dyn Store, page: usize) -> BTreeMap<(SeriesKey, i64), BlockInfo> {
    let mut out = BTreeMap::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let p = store.list_blocks(after, page).unwrap();
        pages += 1;
        assert!(p.blocks.len() <= page, "a page of {} blocks for a limit of {page}", p.blocks.len());
        for b in p.blocks {
            assert!(out.insert((b.series.clone(), b.quantum.start), b).is_none(), "a block listed twice");
        }
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
        assert!(pages < 1_000_000, "the listing does not end");
    }
    out
}

/// (count, digest) of each block, without the write times.
fn digests(blocks: &BTreeMap<(SeriesKey, i64), BlockInfo>) -> BTreeMap<(SeriesKey, i64), (i64, u64, u64)> {
    blocks.iter().map(|(k, b)| (k.clone(), (b.quantum.len.ns(), b.count, b.digest))).collect()
}

fn digest_of(points: &[Point]) -> u64 {
    points.iter().fold(0u64, |d, p| d.wrapping_add(p.identity_hash()))
}

/// Series with 1 ms quanta (sealed once maintenance passes them) and 1 s quanta (that stay
/// open as checkpoint frames), written in several rounds with maintenance in between.
fn fill(stores: &[&dyn Store], maintain_at: i64) -> Vec<(SeriesKey, QuantumLen, Vec<Point>)> {
    let shapes: Vec<(SeriesKey, QuantumLen)> = (0..6)
        .map(|i| {
            let len = if i % 2 == 0 { qlen() } else { QuantumLen::new(SEC).unwrap() };
            (format!("api.m{i}{{dev={i}}}").parse().unwrap(), len)
        })
        .collect();
    let mut all: Vec<(SeriesKey, QuantumLen, Vec<Point>)> =
        shapes.iter().map(|(k, l)| (k.clone(), *l, Vec::new())).collect();
    for round in 0..4i64 {
        for (i, (k, len, pts)) in all.iter_mut().enumerate() {
            let new: Vec<Point> = (0..60)
                .map(|j| Point { ts: (round * 60 + j) * 37_000 + i as i64, event: (j % 3) as u64, value: j as f64 })
                .collect();
            for s in stores {
                s.write(&blocks(k, *len, &new)).unwrap();
            }
            pts.extend(new);
        }
        for s in stores {
            while s.maintain(maintain_at + round).unwrap().more {}
        }
    }
    all
}

#[test]
fn the_disk_and_memory_engines_list_the_same_blocks_as_the_points_say() {
    let disk = FaultyDisk::new();
    let cfg = || DiskConfig { max_open_age_ns: 0, max_block_frames: 3, ..small_config() };
    let store = open(&disk, cfg());
    let mem = MemStore::default();
    // The maintenance clock passes the 1 ms quanta, never the 1 s ones.
    let data = fill(&[&store, &mem], 50_000_000);
    assert!(store.stats().frames > store.stats().sealed_blocks, "some blocks are held as several frames");

    // The reference: each block's count and digest from the raw points.
    let mut want = BTreeMap::new();
    for (k, len, pts) in &data {
        let mut by_q: BTreeMap<i64, BTreeSet<PointKey>> = BTreeMap::new();
        for p in pts {
            by_q.entry(len.quantum_of(p.ts).start).or_default().insert(p.key());
        }
        for (q, keys) in by_q {
            let pts: Vec<Point> =
                keys.iter().map(|k| Point { ts: k.ts, event: k.event, value: f64::from_bits(k.value_bits) }).collect();
            want.insert((k.clone(), q), (len.ns(), pts.len() as u64, digest_of(&pts)));
        }
    }
    let decoded = store.stats().blocks_decoded;
    for page in [1, 7, 1000] {
        assert_eq!(digests(&listed(&store, page)), want, "disk engine, pages of {page}");
        assert_eq!(digests(&listed(&mem, page)), want, "memory engine, pages of {page}");
    }
    assert_eq!(store.stats().blocks_decoded, decoded, "listing blocks decodes none");

    // One block at a time, and its points.
    for ((k, q), (_, count, digest)) in &want {
        for s in [&store as &dyn Store, &mem] {
            let info = s.block_info(k, *q).unwrap().expect("held");
            assert_eq!((info.count, info.digest), (*count, *digest));
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let p = s.read_block(k, *q, after, 13).unwrap();
                after = p.points.last().map(Point::key);
                got.extend(p.points);
                if !p.more {
                    break;
                }
            }
            assert_eq!(got.len() as u64, *count);
            assert_eq!(digest_of(&got), *digest);
        }
    }
    let (k, _, _) = &data[0];
    assert_eq!(store.block_info(k, 123 * 1_000_000_000).unwrap(), None);
    assert!(matches!(store.read_block(k, 1, None, 10), Err(StoreError::InvalidInput(_))));

    // After a restart (and maintenance) the listing is the same.
    drop(store);
    let store = open(&disk.crash(4), cfg());
    settle(&store, 50_000_000);
    assert_eq!(digests(&listed(&store, 5)), want);
}

#[test]
fn a_block_drops_only_with_the_expected_digest_and_stays_dropped() {
    let disk = FaultyDisk::new();
    let cfg = || DiskConfig { max_open_age_ns: 0, ..small_config() };
    let store = open(&disk, cfg());
    let mem = MemStore::default();
    let len = QuantumLen::new(SEC).unwrap();
    let k: SeriesKey = "drop.me".parse().unwrap();
    let keep: SeriesKey = "drop.keep".parse().unwrap();
    let first: Vec<Point> = (0..100).map(|i| Point::new(i * 1_000, i as f64)).collect();
    let second: Vec<Point> = (100..150).map(|i| Point::new(i * 1_000, i as f64)).collect();
    for s in [&store as &dyn Store, &mem] {
        s.write(&blocks(&k, len, &first)).unwrap();
        s.write(&blocks(&keep, len, &first)).unwrap();
        s.maintain(1_000).unwrap(); // a checkpoint frame (the quantum lasts)
        s.write(&blocks(&k, len, &second)).unwrap(); // open points, in the log only
    }
    let info = store.block_info(&k, 0).unwrap().unwrap();
    assert_eq!(info.count, 150);
    for s in [&store as &dyn Store, &mem] {
        assert!(!s.drop_block(&k, 0, info.digest ^ 1).unwrap(), "another digest: kept");
        assert_eq!(s.block_info(&k, 0).unwrap().map(|b| b.count), Some(150));
        assert!(!s.drop_block(&k, SEC, info.digest).unwrap(), "a block not held");
        assert!(s.drop_block(&k, 0, info.digest).unwrap());
        assert_eq!(s.block_info(&k, 0).unwrap(), None);
        assert!(read_all(s, &k, 100).is_empty());
        assert_eq!(read_all(s, &keep, 1000).len(), 100, "other blocks are untouched");
    }
    // Neither the frame nor the logged points come back after a restart.
    drop(store);
    let disk = disk.crash(1);
    let store = open(&disk, cfg());
    assert!(store.health().is_empty(), "{:?}", store.health());
    assert!(read_all(&store, &k, 100).is_empty(), "the dropped block came back");
    // The block can be written again, and that survives restarts.
    let again = [Point::new(5, 5.0)];
    store.write(&blocks(&k, len, &again)).unwrap();
    drop(store);
    let disk = disk.crash(2);
    let store = open(&disk, cfg());
    assert_eq!(read_all(&store, &k, 100), again.to_vec());
    settle(&store, 2_000);
    drop(store);
    let store = open(&disk.crash(3), cfg());
    assert_eq!(read_all(&store, &k, 100), again.to_vec());
    assert_eq!(read_all(&store, &keep, 1000).len(), 100);
}

/// Writes keep landing in a block while it is dropped: every point acknowledged after the drop
/// returned is kept, in memory and after a restart.
#[test]
fn writes_racing_a_drop_are_kept() {
    let disk = FaultyDisk::new();
    let cfg = || DiskConfig { max_open_age_ns: 0, ..small_config() };
    let store = open(&disk, cfg());
    let len = QuantumLen::new(SEC).unwrap();
    let k: SeriesKey = "drop.race".parse().unwrap();
    store.write(&blocks(&k, len, &[Point::new(0, 0.0)])).unwrap();
    let dropped = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let after_drop: Mutex<Vec<Point>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..SEC / 1_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let started_after = dropped.load(Ordering::SeqCst);
                let p = Point::new(i * 1_000, i as f64);
                store.write(&blocks(&k, len, &[p])).unwrap();
                if started_after {
                    after_drop.lock().unwrap().push(p);
                }
            }
        });
        s.spawn(|| {
            for _ in 0..200 {
                store.maintain(1).unwrap();
            }
        });
        let mut tries = 0;
        loop {
            tries += 1;
            let info = store.block_info(&k, 0).unwrap().unwrap();
            if store.drop_block(&k, 0, info.digest).unwrap() {
                break;
            }
            assert!(tries < 10_000, "the drop never matched");
        }
        dropped.store(true, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
    });
    let kept = after_drop.into_inner().unwrap();
    assert!(!kept.is_empty(), "writes went on after the drop");
    let check = |store: &DiskStore, when: &str| {
        let got: BTreeSet<PointKey> = read_all(store, &k, 10_000).iter().map(Point::key).collect();
        let lost: Vec<&Point> = kept.iter().filter(|p| !got.contains(&p.key())).take(3).collect();
        assert!(lost.is_empty(), "{when}: points written after the drop were lost: {lost:?}");
    };
    check(&store, "in memory");
    settle(&store, 2);
    drop(store);
    let store = open(&disk.crash(9), cfg());
    check(&store, "after a restart");
}

#[test]
fn registrations_list_in_pages_on_both_engines() {
    let disk = FaultyDisk::new();
    let store = open(&disk, small_config());
    let mem = MemStore::default();
    let keys: Vec<SeriesKey> = (0..5_000).map(|i| format!("reg.m{{i={i}}}").parse().unwrap()).collect();
    // Series only written to are in the dictionary but not registered.
    let written: SeriesKey = "reg.written.only".parse().unwrap();
    for s in [&store as &dyn Store, &mem] {
        s.write(&blocks(&written, qlen(), &[Point::new(1, 1.0)])).unwrap();
        for c in keys.chunks(700) {
            s.register_series(c).unwrap();
        }
    }
    let all = |s: &dyn Store, limit: usize| {
        let mut out = BTreeSet::new();
        let mut after = None;
        loop {
            let p = s.list_registered(after, limit).unwrap();
            assert!(p.series.len() <= limit);
            for k in p.series {
                assert!(out.insert(k), "a registration listed twice");
            }
            match p.next {
                Some(n) => after = Some(n),
                None => return out,
            }
        }
    };
    let want: BTreeSet<SeriesKey> = keys.iter().cloned().collect();
    for limit in [1, 333, 10_000] {
        assert_eq!(all(&store, limit), want);
        assert_eq!(all(&mem, limit), want);
    }
    drop(store);
    let store = open(&disk.crash(1), small_config());
    assert_eq!(all(&store, 999), want);
}

#[test]
fn last_write_follows_the_maintenance_clock() {
    let disk = FaultyDisk::new();
    let store = open(&disk, small_config());
    let mem = MemStore::default();
    let len = QuantumLen::new(SEC).unwrap();
    let k: SeriesKey = "clock.m".parse().unwrap();
    for s in [&store as &dyn Store, &mem] {
        s.maintain(1_000).unwrap();
        s.write(&blocks(&k, len, &[Point::new(1, 1.0)])).unwrap();
        s.maintain(5_000).unwrap();
        s.write(&blocks(&k, len, &[Point::new(SEC + 1, 1.0)])).unwrap();
        // A write that adds nothing does not count as a change.
        s.write(&blocks(&k, len, &[Point::new(1, 1.0)])).unwrap();
        assert_eq!(s.block_info(&k, 0).unwrap().unwrap().last_write, 1_000);
        assert_eq!(s.block_info(&k, SEC).unwrap().unwrap().last_write, 5_000);
    }
    // After a restart, blocks not written since report the first maintenance time.
    drop(store);
    let store = open(&disk.crash(1), small_config());
    assert_eq!(store.block_info(&k, 0).unwrap().unwrap().last_write, 0, "before any maintenance");
    store.maintain(9_000).unwrap();
    store.maintain(12_000).unwrap();
    assert_eq!(store.block_info(&k, 0).unwrap().unwrap().last_write, 9_000);
}

#[test]
fn listing_many_blocks_is_paged_and_decodes_nothing() {
    let store = open(&FaultyDisk::new(), DiskConfig { step_max_points: 1 << 20, ..small_config() });
    // 100,000 blocks over 100 series, sealed.
    let series: Vec<SeriesKey> = (0..100).map(|i| format!("many{{i={i}}}").parse().unwrap()).collect();
    for k in &series {
        let pts: Vec<Point> = (0..1_000).map(|q| Point::new(q * 1_000_000, 1.0)).collect();
        store.write(&blocks(k, qlen(), &pts)).unwrap();
    }
    settle(&store, i64::MAX / 2);
    let decoded = store.stats().blocks_decoded;
    let mut after = None;
    let (mut pages, mut seen) = (0, 0);
    loop {
        let p = store.list_blocks(after, 1_000).unwrap();
        assert!(p.blocks.len() <= 1_000);
        seen += p.blocks.len();
        pages += 1;
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, 100_000);
    assert!((100..=101).contains(&pages), "{pages} pages");
    assert_eq!(store.stats().blocks_decoded, decoded);
}

#[test]
fn both_engines_refuse_a_write_with_another_quantum() {
    let k: SeriesKey = "q.m".parse().unwrap();
    for s in [&open(&FaultyDisk::new(), small_config()) as &dyn Store, &MemStore::default()] {
        s.write(&blocks(&k, qlen(), &[Point::new(1, 1.0)])).unwrap();
        let other = QuantumLen::new(SEC).unwrap();
        let err = s.write(&blocks(&k, other, &[Point::new(2, 1.0)])).unwrap_err();
        assert!(matches!(err, StoreError::QuantumMismatch { .. }), "{err}");
        assert_eq!(read_all(s, &k, 10).len(), 1);
    }
}

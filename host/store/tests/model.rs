//! Property tests of the disk store against a model (a set of points per series): any
//! interleaving of writes, replays, maintenance and restarts stores exactly the set, and every
//! block summary equals one recomputed from the raw points.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};
use timeshard_store::agg::Summary;
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{Codec, DiskStore, MemStore, Store, StoreError};

use common::*;

#[derive(Debug, Clone)]
enum Op {
    Write(Vec<(usize, i64, u64, i8)>),
    Replay(usize),
    Maintain(i64),
    Restart(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec((0usize..2, 0i64..12_000_000, 0u64..3, -4i8..4), 1..40).prop_map(Op::Write),
        1 => (0usize..8).prop_map(Op::Replay),
        2 => (0i64..16_000_000).prop_map(Op::Maintain),
        1 => any::<u64>().prop_map(Op::Restart),
    ]
}

fn series() -> [SeriesKey; 2] {
    ["m{a=1}".parse().unwrap(), "m{a=2}".parse().unwrap()]
}

fn check(store: &DiskStore, model: &[BTreeSet<PointKey>; 2]) -> Result<(), TestCaseError> {
    for (s, set) in series().iter().zip(model) {
        let got: Vec<PointKey> = read_all(store, s, 7).iter().map(Point::key).collect();
        let want: Vec<PointKey> = set.iter().copied().collect();
        prop_assert_eq!(&got, &want, "series {}", s);
        // Every block summary equals the one recomputed from the raw points.
        let mut by_q: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
        for k in set {
            by_q.entry(qlen().quantum_of(k.ts).start).or_default().push(Point {
                ts: k.ts,
                value: f64::from_bits(k.value_bits),
                event: k.event,
            });
        }
        for (q, pts) in &by_q {
            prop_assert_eq!(store.block_summary(s, *q).unwrap(), Summary::of(pts));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Writes are idempotent, late data merges into sealed blocks, restarts lose nothing, and
    /// summaries always match the raw points.
    #[test]
    fn any_interleaving_matches_the_model(ops in proptest::collection::vec(arb_op(), 1..16), xor in any::<bool>()) {
        let disk = FaultyDisk::new();
        let config = || {
            let mut c = small_config();
            c.codec = if xor { Codec::Xor } else { Codec::Pco };
            c
        };
        let mut store = open(&disk, config());
        let mut model: [BTreeSet<PointKey>; 2] = Default::default();
        let mut batches: Vec<Vec<(usize, i64, u64, i8)>> = Vec::new();
        let mut disk = disk;
        for op in ops {
            let batch = match op {
                Op::Write(b) => { batches.push(b.clone()); Some(b) }
                Op::Replay(i) if !batches.is_empty() => Some(batches[i % batches.len()].clone()),
                Op::Replay(_) => None,
                Op::Maintain(now) => { while store.maintain(now).unwrap().more {} None }
                Op::Restart(seed) => {
                    drop(store);
                    // Every write was acknowledged durable, so any crash image holds it all.
                    disk = disk.crash(seed);
                    store = open(&disk, config());
                    prop_assert!(store.health().is_empty(), "{:?}", store.health());
                    None
                }
            };
            if let Some(batch) = batch {
                let s = series();
                let mut new = 0;
                for (i, key) in s.iter().enumerate() {
                    let pts: Vec<Point> = batch.iter().filter(|p| p.0 == i)
                        .map(|&(_, ts, event, v)| Point { ts, event, value: f64::from(v) }).collect();
                    let stats = store.write(&blocks(key, qlen(), &pts)).unwrap();
                    new += stats.new_points;
                }
                let before: usize = model.iter().map(BTreeSet::len).sum();
                for &(i, ts, event, v) in &batch {
                    model[i].insert(Point { ts, event, value: f64::from(v) }.key());
                }
                let after: usize = model.iter().map(BTreeSet::len).sum();
                prop_assert_eq!(new, (after - before) as u64, "new_points counts exactly the new points");
            }
            check(&store, &model)?;
        }
    }

    /// Window aggregates equal a naive computation over the raw points, for any window width
    /// and range, whether blocks are open, sealed, or sealed with late data.
    #[test]
    fn aggregates_match_a_naive_reference(
        pts in proptest::collection::vec((0i64..12_000_000, 0u64..2, -50i16..50), 1..200),
        late in proptest::collection::vec((0i64..12_000_000, -50i16..50), 0..20),
        seal_at in prop_oneof![Just(0i64), Just(6_000_000), Just(i64::MAX / 2)],
        window in prop_oneof![Just(1_000_000i64), Just(2_000_000), Just(3_000_000), 1i64..5_000_000],
        (start, len) in (0i64..12_000_000, 1i64..14_000_000),
    ) {
        let s: SeriesKey = "agg".parse().unwrap();
        let disk = FaultyDisk::new();
        let store = open(&disk, small_config());
        let mem = MemStore::default();
        let points: Vec<Point> = pts.iter().map(|&(ts, event, v)| Point { ts, event, value: f64::from(v) }).collect();
        store.write(&blocks(&s, qlen(), &points)).unwrap();
        mem.write(&blocks(&s, qlen(), &points)).unwrap();
        while store.maintain(seal_at).unwrap().more {}
        let late: Vec<Point> = late.iter().map(|&(ts, v)| Point::new(ts, f64::from(v))).collect();
        store.write(&blocks(&s, qlen(), &late)).unwrap();
        mem.write(&blocks(&s, qlen(), &late)).unwrap();

        let range = TimeRange::new(start, start + len).unwrap();
        if timeshard_proto::window::check_windows(&range, window).is_err() {
            // Over the one windows limit (narrow windows, long range): both engines refuse it.
            prop_assert!(matches!(store.aggregate(&s, range, window), Err(StoreError::InvalidInput(_))));
            prop_assert!(matches!(mem.aggregate(&s, range, window), Err(StoreError::InvalidInput(_))));
            return Ok(());
        }
        let got = store.aggregate(&s, range, window).unwrap();
        prop_assert_eq!(&got, &mem.aggregate(&s, range, window).unwrap());

        // Naive reference, written independently of the aggregator.
        let mut all: Vec<Point> = points.iter().chain(&late).copied().filter(|p| range.contains(p.ts)).collect();
        timeshard_proto::point::sort_dedup(&mut all);
        let mut by_w: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
        for p in all { by_w.entry(p.ts.div_euclid(window)).or_default().push(p); }
        prop_assert_eq!(got.len(), by_w.len());
        for (g, (w, ps)) in got.iter().zip(&by_w) {
            let vals: Vec<f64> = ps.iter().map(|p| p.value).collect();
            prop_assert_eq!(g.start, (w * window).max(range.start()));
            prop_assert_eq!(g.end, ((w + 1) * window).min(range.end()));
            prop_assert_eq!(g.count, ps.len() as u64);
            prop_assert_eq!(g.min, vals.iter().copied().fold(f64::INFINITY, f64::min));
            prop_assert_eq!(g.max, vals.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            // Small integers: every partial sum is exact, whatever the order.
            prop_assert_eq!(g.sum, vals.iter().sum::<f64>());
            prop_assert_eq!(g.mean(), g.sum / ps.len() as f64);
            prop_assert_eq!((g.first, g.first_ts), (ps[0].value, ps[0].ts));
            prop_assert_eq!((g.last, g.last_ts), (ps[ps.len() - 1].value, ps[ps.len() - 1].ts));
        }
    }

    /// Raw range reads are trimmed exactly and paged without loss or repetition.
    #[test]
    fn raw_ranges_are_trimmed_exactly(
        pts in proptest::collection::vec((0i64..12_000_000, 0u64..3), 1..200),
        sealed in any::<bool>(),
        (start, len) in (0i64..12_000_000, 1i64..6_000_000),
        page in 1usize..40,
    ) {
        let s: SeriesKey = "raw".parse().unwrap();
        let store = open(&FaultyDisk::new(), small_config());
        let points: Vec<Point> = pts.iter().map(|&(ts, event)| Point { ts, event, value: ts as f64 }).collect();
        store.write(&blocks(&s, qlen(), &points)).unwrap();
        if sealed { while store.maintain(i64::MAX / 2).unwrap().more {} }
        let range = TimeRange::new(start, start + len).unwrap();
        let mut want: Vec<Point> = points.iter().copied().filter(|p| range.contains(p.ts)).collect();
        timeshard_proto::point::sort_dedup(&mut want);
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let p = store.read(&s, range, after, page).unwrap();
            prop_assert!(p.points.len() <= page);
            after = p.points.last().map(Point::key);
            got.extend(p.points);
            if !p.more { break; }
        }
        prop_assert_eq!(got, want);
    }
}

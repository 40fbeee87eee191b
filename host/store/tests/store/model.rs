//! Property tests of the disk store against a model (a set of points per series): any
//! interleaving of writes, replays, maintenance and restarts stores exactly the set, every
//! block summary equals one recomputed from the raw points, and the block listing reports
//! each block's count and digest. Configurations vary the quantum (short ones end during the
//! run; 1 s ones never do, so their blocks live as checkpoint frames), the checkpoint age, the
//! frame cap and the block size, so blocks of many frames, their merges and chunked final
//! seals all occur.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::agg::Summary;
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{Codec, DiskConfig, DiskStore, MemStore, Store, StoreError};

use crate::common::*;

#[derive(Debug, Clone)]
enum Op {
    Write(Vec<(usize, i64, u64, i8)>),
    Replay(usize),
    Maintain(i64),
    Restart(u64),
    /// Drop the block of series `.0` holding the `.1`-th point of the model (if any), with its
    /// digest or (`.2`) a wrong one.
    Drop(usize, usize, bool),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec((0usize..2, 0i64..12_000_000, 0u64..3, -4i8..4), 1..40).prop_map(Op::Write),
        1 => (0usize..8).prop_map(Op::Replay),
        2 => (0i64..16_000_000).prop_map(Op::Maintain),
        1 => any::<u64>().prop_map(Op::Restart),
        1 => (0usize..2, any::<usize>(), any::<bool>()).prop_map(|(s, i, wrong)| Op::Drop(s, i, wrong)),
    ]
}

fn series() -> [SeriesKey; 2] {
    ["m{a=1}".parse().unwrap(), "m{a=2}".parse().unwrap()]
}

/// Settings that make blocks of several frames likely: `(quantum, max_open_age_ns,
/// max_block_frames, max_block_points)`.
fn arb_shape() -> impl Strategy<Value = (i64, i64, usize, usize)> {
    (
        prop_oneof![Just(1_000_000i64), Just(4_000_000), Just(1_000_000_000)],
        prop_oneof![Just(0i64), Just(3_000_000), Just(60_000_000_000)],
        prop_oneof![Just(2usize), Just(3), Just(8)],
        prop_oneof![Just(7usize), Just(64), Just(5_000)],
    )
}

fn shaped((_, age, frames, points): (i64, i64, usize, usize), xor: bool) -> DiskConfig {
    DiskConfig {
        codec: if xor { Codec::Xor } else { Codec::Pco },
        max_open_age_ns: age,
        max_block_frames: frames,
        max_block_points: points,
        ..small_config()
    }
}

/// Every block (quantum start) of `set` with its points, sorted.
fn by_block(set: &BTreeSet<PointKey>, len: QuantumLen) -> BTreeMap<i64, Vec<Point>> {
    let mut by_q: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
    for k in set {
        by_q.entry(len.quantum_of(k.ts).start).or_default().push(Point {
            ts: k.ts,
            value: f64::from_bits(k.value_bits),
            event: k.event,
        });
    }
    by_q
}

/// Every block `store` lists, as (series, quantum start) -> (count, digest), paged by `page`.
fn listed(store: &dyn Store, page: usize) -> BTreeMap<(SeriesKey, i64), (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let p = store.list_blocks(after, page).unwrap();
        assert!(p.blocks.len() <= page);
        for b in p.blocks {
            let dup = out.insert((b.series, b.quantum.start), (b.count, b.digest));
            assert!(dup.is_none(), "a block listed twice");
        }
        match p.next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

/// The store holds exactly the model; with `settled` (maintenance ran since the last restart)
/// its block listing reports exact counts and digests.
fn check(
    store: &DiskStore,
    model: &[BTreeSet<PointKey>; 2],
    len: QuantumLen,
    settled: bool,
) -> Result<(), TestCaseError> {
    let mut want_listed = BTreeMap::new();
    for (s, set) in series().iter().zip(model) {
        let got: Vec<PointKey> = read_all(store, s, 7).iter().map(Point::key).collect();
        let want: Vec<PointKey> = set.iter().copied().collect();
        prop_assert_eq!(&got, &want, "series {}", s);
        // Every block summary equals the one recomputed from the raw points, and reading the
        // block returns its points.
        for (q, pts) in &by_block(set, len) {
            let summary = Summary::of(pts);
            prop_assert_eq!(store.block_summary(s, *q).unwrap(), summary);
            let whole = store.read_block(s, *q, None, usize::MAX).unwrap();
            prop_assert_eq!(&whole.points, pts);
            let summary = summary.unwrap();
            want_listed.insert((s.clone(), *q), (summary.count, summary.digest));
        }
    }
    if settled {
        prop_assert_eq!(listed(store, 3), want_listed);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Writes are idempotent, late data merges into sealed blocks, checkpoint frames of open
    /// blocks merge and split as they should, restarts lose nothing, summaries always match
    /// the raw points, and the block listing matches them once maintenance ran.
    #[test]
    fn any_interleaving_matches_the_model(
        ops in proptest::collection::vec(arb_op(), 1..16),
        xor in any::<bool>(),
        shape in arb_shape(),
    ) {
        let disk = FaultyDisk::new();
        let len = QuantumLen::new(shape.0).unwrap();
        let config = || shaped(shape, xor);
        let mut store = open(&disk, config());
        let mut model: [BTreeSet<PointKey>; 2] = Default::default();
        let mut batches: Vec<Vec<(usize, i64, u64, i8)>> = Vec::new();
        let mut disk = disk;
        let mut settled = true;
        for op in ops {
            let batch = match op {
                Op::Write(b) => { batches.push(b.clone()); Some(b) }
                Op::Replay(i) if !batches.is_empty() => Some(batches[i % batches.len()].clone()),
                Op::Replay(_) => None,
                Op::Maintain(now) => {
                    while store.maintain(now).unwrap().more {}
                    settled = true;
                    None
                }
                Op::Restart(seed) => {
                    drop(store);
                    // Every write was acknowledged durable, so any crash image holds it all.
                    disk = disk.crash(seed);
                    store = open(&disk, config());
                    prop_assert!(store.health().is_empty(), "{:?}", store.health());
                    settled = false;
                    None
                }
                Op::Drop(si, i, wrong) => {
                    let set = &mut model[si];
                    if let Some(&k) = set.iter().nth(i % set.len().max(1)) {
                        let q = len.quantum_of(k.ts);
                        let pts: Vec<PointKey> = set.range(PointKey { ts: q.start, event: 0, value_bits: 0 }..)
                            .take_while(|p| p.ts < q.end()).copied().collect();
                        let digest = pts.iter().fold(0u64, |d, p| {
                            let p = Point { ts: p.ts, event: p.event, value: f64::from_bits(p.value_bits) };
                            d.wrapping_add(p.identity_hash())
                        });
                        let expected = if wrong { digest ^ 1 } else { digest };
                        let dropped = store.drop_block(&series()[si], q.start, expected).unwrap();
                        if wrong {
                            prop_assert!(!dropped, "a drop with another digest");
                        } else if settled {
                            // (Right after a restart a block may be settling its digest.)
                            prop_assert!(dropped, "a drop with the block's digest");
                        }
                        if dropped {
                            for p in &pts {
                                set.remove(p);
                            }
                        }
                    }
                    None
                }
            };
            if let Some(batch) = batch {
                let s = series();
                let mut new = 0;
                for (i, key) in s.iter().enumerate() {
                    let pts: Vec<Point> = batch.iter().filter(|p| p.0 == i)
                        .map(|&(_, ts, event, v)| Point { ts, event, value: f64::from(v) }).collect();
                    let stats = store.write(&blocks(key, len, &pts)).unwrap();
                    new += stats.new_points;
                }
                let before: usize = model.iter().map(BTreeSet::len).sum();
                for &(i, ts, event, v) in &batch {
                    model[i].insert(Point { ts, event, value: f64::from(v) }.key());
                }
                let after: usize = model.iter().map(BTreeSet::len).sum();
                prop_assert_eq!(new, (after - before) as u64, "new_points counts exactly the new points");
            }
            check(&store, &model, len, settled)?;
        }
    }

    /// Window aggregates equal a naive computation over the raw points, for any window width,
    /// origin and range, whether blocks are open, sealed, sealed with late data, or held as several
    /// checkpoint frames plus open points.
    #[test]
    fn aggregates_match_a_naive_reference(
        rounds in proptest::collection::vec(
            proptest::collection::vec((0i64..12_000_000, 0u64..2, -50i16..50), 1..100), 1..4),
        late in proptest::collection::vec((0i64..12_000_000, -50i16..50), 0..20),
        seal_at in prop_oneof![Just(0i64), Just(6_000_000), Just(i64::MAX / 2)],
        window in prop_oneof![Just(1_000_000i64), Just(2_000_000), Just(3_000_000), 1i64..5_000_000],
        boundary in prop_oneof![Just(0i64), 0i64..12_000_000],
        (start, len) in (0i64..12_000_000, 1i64..14_000_000),
        shape in arb_shape(),
    ) {
        let s: SeriesKey = "agg".parse().unwrap();
        let disk = FaultyDisk::new();
        let store = open(&disk, shaped(shape, false));
        let qlen = QuantumLen::new(shape.0).unwrap();
        let mem = MemStore::default();
        let mut points: Vec<Point> = Vec::new();
        // Each round is written, then maintained: blocks whose quantum lasts become checkpoint
        // frames (the checkpoint age may be 0), which later rounds add to.
        for round in &rounds {
            let pts: Vec<Point> = round.iter().map(|&(ts, event, v)| Point { ts, event, value: f64::from(v) }).collect();
            store.write(&blocks(&s, qlen, &pts)).unwrap();
            mem.write(&blocks(&s, qlen, &pts)).unwrap();
            while store.maintain(seal_at).unwrap().more {}
            points.extend(pts);
        }
        let late: Vec<Point> = late.iter().map(|&(ts, v)| Point::new(ts, f64::from(v))).collect();
        store.write(&blocks(&s, qlen, &late)).unwrap();
        mem.write(&blocks(&s, qlen, &late)).unwrap();

        let range = TimeRange::new(start, start + len).unwrap();
        let grid = Grid::new(window, boundary);
        if timeshard_proto::window::check_windows(&range, grid).is_err() {
            // Over the one windows limit (narrow windows, long range): both engines refuse it.
            prop_assert!(matches!(store.aggregate(&s, range, grid), Err(StoreError::InvalidInput(_))));
            prop_assert!(matches!(mem.aggregate(&s, range, grid), Err(StoreError::InvalidInput(_))));
            return Ok(());
        }
        let got = store.aggregate(&s, range, grid).unwrap();
        prop_assert_eq!(&got, &mem.aggregate(&s, range, grid).unwrap());

        // Naive reference, written independently of the aggregator.
        let mut all: Vec<Point> = points.iter().chain(&late).copied().filter(|p| range.contains(p.ts)).collect();
        timeshard_proto::point::sort_dedup(&mut all);
        let mut by_w: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
        // Window w is [boundary + w * window, boundary + (w + 1) * window).
        for p in all { by_w.entry((p.ts - boundary).div_euclid(window)).or_default().push(p); }
        prop_assert_eq!(got.len(), by_w.len());
        for (g, (w, ps)) in got.iter().zip(&by_w) {
            let vals: Vec<f64> = ps.iter().map(|p| p.value).collect();
            prop_assert_eq!(g.start, (boundary + w * window).max(range.start()));
            prop_assert_eq!(g.end, (boundary + (w + 1) * window).min(range.end()));
            prop_assert_eq!(g.count, ps.len() as u64);
            prop_assert_eq!(g.min, vals.iter().copied().fold(f64::INFINITY, f64::min));
            prop_assert_eq!(g.max, vals.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            // Small integers: every partial sum is exact, whatever the order.
            prop_assert_eq!(g.sum, vals.iter().sum::<f64>());
            prop_assert_eq!(g.mean(), g.sum / ps.len() as f64);
            prop_assert_eq!((g.first, g.first_ts), (ps[0].value, ps[0].ts));
            prop_assert_eq!((g.last, g.last_ts), (ps[ps.len() - 1].value, ps[ps.len() - 1].ts));
            let digest = ps.iter().fold(0u64, |d, p| d.wrapping_add(p.identity_hash()));
            prop_assert_eq!(g.digest, digest);
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

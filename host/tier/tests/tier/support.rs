//! What the tier's integration tests share: data like the benchmark datasets (a 60 Hz signal of
//! 3-decimal readings, a 1 Hz counter), hot stores filled with it, and comparisons of the
//! archive's answers with the hot store's.
#![allow(dead_code)]

use std::sync::Arc;

use timeshard_proto::class::{Replication, SeriesClass};
use timeshard_proto::point::BlockPoints;
use timeshard_proto::window::Grid;
use timeshard_proto::{KeyFormat, Point, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::{MemStore, Store};
use timeshard_tier::{Archive, Config, RetryPolicy};

/// 2023-11-14T22:13:20Z, the datasets' first timestamp.
pub const T0: i64 = 1_700_000_000 * 1_000_000_000;
pub const SEC: i64 = 1_000_000_000;
pub const DAY: i64 = 86_400 * SEC;

pub fn class(name: &str, quantum_s: i64) -> SeriesClass {
    SeriesClass {
        name: name.into(),
        metric_prefix: String::new(),
        format: KeyFormat::Qfi,
        quantum: QuantumLen::new(quantum_s * SEC).unwrap(),
        replication: Replication::default(),
        coi: None,
    }
}

/// Series and their points.
pub type Data = Vec<(SeriesKey, Vec<Point>)>;

pub fn series(name: &str) -> SeriesKey {
    name.parse().unwrap()
}

/// Sample `i` of a `hz` signal of bus `bus` from `start`: a 20 s sine of amplitude 50 plus
/// deterministic noise, rounded to 3 decimals (like the `pmu` dataset).
pub fn signal(bus: u64, start: i64, hz: i64, i: u64) -> Point {
    let ts = start + (i as i64) * SEC / hz;
    let t = (ts - T0) as f64 / 1e9;
    let noise = ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ bus.wrapping_mul(0xBF58_476D_1CE4_E5B9)) >> 40) as f64
        / (1u64 << 24) as f64
        - 0.5;
    let v = 50.0 * (std::f64::consts::TAU * 0.05 * t).sin() + 0.1 * noise;
    Point::new(ts, (v * 1000.0).round() / 1000.0)
}

pub fn signal_points(bus: u64, start: i64, hz: i64, n: u64) -> Vec<Point> {
    (0..n).map(|i| signal(bus, start, hz, i)).collect()
}

/// Groups points of one series into blocks of `len`.
pub fn to_blocks(series: &SeriesKey, len: QuantumLen, points: &[Point]) -> Vec<BlockPoints> {
    let mut out: Vec<BlockPoints> = Vec::new();
    for p in points {
        let q = len.quantum_of(p.ts);
        match out.last_mut() {
            Some(b) if b.quantum == q => b.points.push(*p),
            _ => out.push(BlockPoints { series: series.clone(), quantum: q, points: vec![*p] }),
        }
    }
    out
}

/// A memory hot store holding `data` (series and their points) in quanta of `len`.
pub fn hot_store(len: QuantumLen, data: &[(SeriesKey, Vec<Point>)]) -> Arc<MemStore> {
    let hot = Arc::new(MemStore::new(u64::MAX));
    for (s, points) in data {
        hot.write(&to_blocks(s, len, points)).unwrap();
    }
    hot
}

/// Every block the hot store holds, as (series, quantum).
pub fn hot_blocks(hot: &dyn Store) -> Vec<(SeriesKey, Quantum)> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = hot.list_blocks(cursor, 1000).unwrap();
        out.extend(page.blocks.into_iter().map(|b| (b.series, b.quantum)));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    out.sort_by(|a, b| (&a.0, a.1.start).cmp(&(&b.0, b.1.start)));
    out
}

/// Fast retries, so tests of failures take milliseconds.
pub fn quick_config(node: &str) -> Config {
    let mut c = Config::for_node(node);
    c.retry = RetryPolicy {
        attempts: 3,
        first_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(4),
    };
    c.cache.listing_ttl = std::time::Duration::ZERO;
    c
}

/// Every point the archive holds for `series` in `range`, paging `limit` at a time.
pub async fn read_all(
    archive: &Archive,
    class: &SeriesClass,
    series: &SeriesKey,
    range: TimeRange,
    limit: usize,
) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    loop {
        let page = archive.read(class, series, range, out.last().map(Point::key), limit).await.unwrap();
        assert!(page.points.len() <= limit);
        out.extend(page.points);
        if !page.more {
            return out;
        }
    }
}

/// Every point the hot store holds for `series` in `range`.
pub fn hot_read_all(hot: &dyn Store, series: &SeriesKey, range: TimeRange) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    loop {
        let page = hot.read(series, range, out.last().map(Point::key), 100_000).unwrap();
        out.extend(page.points);
        if !page.more {
            return out;
        }
    }
}

/// Asserts the archive's window aggregates equal the hot store's (sums to rounding), in
/// windows of `width` aligned to the epoch and shifted off it.
pub async fn assert_same_aggregates(
    archive: &Archive,
    hot: &dyn Store,
    class: &SeriesClass,
    series: &SeriesKey,
    range: TimeRange,
    width: i64,
) {
    for grid in [Grid::epoch(width), Grid::new(width, width / 3 + 1)] {
        same_aggregates(archive, hot, class, series, range, grid).await;
    }
}

async fn same_aggregates(
    archive: &Archive,
    hot: &dyn Store,
    class: &SeriesClass,
    series: &SeriesKey,
    range: TimeRange,
    grid: Grid,
) {
    let cold = archive.aggregate(class, series, range, grid).await.unwrap();
    let want = hot.aggregate(series, range, grid).unwrap();
    assert_eq!(cold.len(), want.len(), "windows of {grid:?} over {range:?}");
    for (c, w) in cold.iter().zip(&want) {
        assert_eq!(
            (c.start, c.end, c.count, c.first_ts, c.last_ts, c.digest),
            (w.start, w.end, w.count, w.first_ts, w.last_ts, w.digest)
        );
        assert_eq!((c.min.to_bits(), c.max.to_bits()), (w.min.to_bits(), w.max.to_bits()));
        assert_eq!((c.first.to_bits(), c.last.to_bits()), (w.first.to_bits(), w.last.to_bits()));
        assert!((c.sum - w.sum).abs() <= 1e-9 * w.sum.abs().max(1.0), "{} vs {}", c.sum, w.sum);
    }
}

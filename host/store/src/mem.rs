//! An in-memory store: a sorted set of point identities per series. Bounded by a point cap so
//! a runaway writer gets [`StoreError::Full`] instead of exhausting memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::RwLock;

use timeshard_proto::window::check_windows;
use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};

use crate::agg::{Aggregator, WindowAggregate};
use crate::{MaintenanceReport, ReadPage, Store, StoreError, WriteStats, page_start};
use timeshard_proto::Timestamp;

/// Everything in memory; lost on restart.
#[derive(Debug)]
pub struct MemStore {
    inner: RwLock<Inner>,
    max_points: u64,
}

#[derive(Debug, Default)]
struct Inner {
    series: HashMap<SeriesKey, BTreeSet<PointKey>>,
    registered: BTreeMap<SeriesKey, ()>,
    points: u64,
}

impl MemStore {
    /// A store holding at most `max_points` points.
    pub fn new(max_points: u64) -> MemStore {
        MemStore { inner: RwLock::new(Inner::default()), max_points }
    }

    /// Points held.
    pub fn len(&self) -> u64 {
        self.read_lock().points
    }

    /// Whether no point is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way readers
        // could misread (every insert is one set operation), so poisoning is ignored.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new(u64::MAX)
    }
}

impl Store for MemStore {
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError> {
        let mut inner = self.write_lock();
        let incoming: u64 = blocks.iter().map(|b| b.points.len() as u64).sum();
        if inner.points.saturating_add(incoming) > self.max_points {
            return Err(StoreError::Full(format!(
                "the memory store holds {} points and its cap is {}; raise the cap or use the durable store",
                inner.points, self.max_points
            )));
        }
        let mut new_points = 0;
        for b in blocks {
            let set = inner.series.entry(b.series.clone()).or_default();
            for p in &b.points {
                new_points += u64::from(set.insert(p.key()));
            }
        }
        inner.points += new_points;
        Ok(WriteStats { new_points })
    }

    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let inner = self.read_lock();
        let Some(set) = inner.series.get(series) else {
            return Ok(ReadPage::default());
        };
        let mut iter = set.range(page_start(&range, after)..).take_while(|k| k.ts < range.end()).map(|k| Point {
            ts: k.ts,
            value: f64::from_bits(k.value_bits),
            event: k.event,
        });
        let points: Vec<Point> = iter.by_ref().take(limit).collect();
        let more = iter.next().is_some();
        Ok(ReadPage { points, more })
    }

    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        let mut inner = self.write_lock();
        for s in series {
            inner.registered.insert(s.clone(), ());
        }
        Ok(())
    }

    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError> {
        Ok(self.read_lock().registered.contains_key(series))
    }

    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError> {
        Ok(self.read_lock().registered.keys().filter(|s| s.metric().starts_with(metric_prefix)).cloned().collect())
    }

    fn aggregate(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        window_ns: i64,
    ) -> Result<Vec<WindowAggregate>, StoreError> {
        check_windows(&range, window_ns).map_err(StoreError::InvalidInput)?;
        let inner = self.read_lock();
        let mut agg = Aggregator::new(range, window_ns);
        if let Some(set) = inner.series.get(series) {
            let start = PointKey { ts: range.start(), event: 0, value_bits: 0 };
            let points: Vec<Point> = set
                .range(start..)
                .take_while(|k| k.ts < range.end())
                .map(|k| Point { ts: k.ts, value: f64::from_bits(k.value_bits), event: k.event })
                .collect();
            agg.push_points(&points);
        }
        Ok(agg.finish())
    }

    /// Nothing to maintain: the memory store neither seals nor expires.
    fn maintain(&self, _now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        Ok(MaintenanceReport::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use timeshard_proto::QuantumLen;

    fn block(series: &SeriesKey, points: &[Point]) -> Vec<BlockPoints> {
        let len = QuantumLen::new(1_000).unwrap_or(QuantumLen::DEFAULT);
        let mut by_q: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
        for p in points {
            by_q.entry(len.quantum_of(p.ts).start).or_default().push(*p);
        }
        by_q.into_iter()
            .map(|(start, points)| BlockPoints {
                series: series.clone(),
                quantum: timeshard_proto::Quantum::at(start, len).unwrap(),
                points,
            })
            .collect()
    }

    #[test]
    fn cap_is_enforced_and_loses_nothing_else() {
        let s: SeriesKey = "m".parse().unwrap();
        let store = MemStore::new(3);
        store.write(&block(&s, &[Point::new(1, 1.0), Point::new(2, 2.0)])).unwrap();
        let err = store.write(&block(&s, &[Point::new(3, 1.0), Point::new(4, 2.0)])).unwrap_err();
        assert!(matches!(err, StoreError::Full(_)));
        let page = store.read(&s, TimeRange::new(0, 10).unwrap(), None, 10).unwrap();
        assert_eq!(page.points.len(), 2);
    }

    proptest! {
        /// Replaying writes is idempotent and paged reads return exactly the distinct points
        /// in range, in order.
        #[test]
        fn paged_reads_return_each_point_once(
            pts in proptest::collection::vec((0i64..5_000, 0u64..3, -5i8..5), 0..300),
            replays in 1usize..3,
            page in 1usize..50,
            (start, len) in (0i64..5_000, 1i64..5_000),
        ) {
            let s: SeriesKey = "m{a=1}".parse().unwrap();
            let store = MemStore::default();
            let points: Vec<Point> = pts.iter().map(|&(ts, event, v)| Point { ts, value: f64::from(v), event }).collect();
            for _ in 0..replays {
                store.write(&block(&s, &points)).unwrap();
            }
            let range = TimeRange::new(start, start + len).unwrap();
            let mut expected: Vec<Point> = points.iter().copied().filter(|p| range.contains(p.ts)).collect();
            timeshard_proto::point::sort_dedup(&mut expected);
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let p = store.read(&s, range, after, page).unwrap();
                prop_assert!(p.points.len() <= page);
                after = p.points.last().map(|p| p.key());
                got.extend(p.points);
                if !p.more { break; }
            }
            prop_assert_eq!(got, expected);
        }
    }
}

//! An in-memory store: a sorted set of point identities per series, with per-block counts and
//! digests for the repair listings. Bounded by a point cap so a runaway writer gets
//! [`StoreError::Full`] instead of exhausting memory.

use crate::SeriesFilter;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::RwLock;

use timeshard_proto::point::BlockPoints;
use timeshard_proto::window::{Grid, check_windows};
use timeshard_proto::{Point, PointKey, Quantum, QuantumLen, SeriesKey, TimeRange};

use crate::agg::{Aggregator, WindowAggregate};
use crate::{
    BlockInfo, BlockPage, LIST_SCAN_SLACK, ListCursor, MaintenanceReport, ReadPage, SeriesPage, Store, StoreError,
    WriteStats, page_start,
};
use timeshard_proto::Timestamp;

/// Everything in memory; lost on restart.
#[derive(Debug)]
pub struct MemStore {
    inner: RwLock<Inner>,
    max_points: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// The number of each series: its index in `series`.
    ids: HashMap<SeriesKey, u32>,
    series: Vec<MemSeries>,
    points: u64,
    /// The latest `now` given to maintenance: stamps writes.
    clock: i64,
}

#[derive(Debug)]
struct MemSeries {
    key: SeriesKey,
    registered: bool,
    /// The quantum length of its writes (from the first one).
    quantum: Option<QuantumLen>,
    points: BTreeSet<PointKey>,
    blocks: BTreeMap<i64, MemBlock>,
}

/// What the listings report of one block.
#[derive(Debug, Default, Clone, Copy)]
struct MemBlock {
    count: u64,
    digest: u64,
    last_write: i64,
}

fn point_of(k: &PointKey) -> Point {
    Point { ts: k.ts, value: f64::from_bits(k.value_bits), event: k.event }
}

impl Inner {
    fn get(&self, key: &SeriesKey) -> Option<&MemSeries> {
        Some(&self.series[*self.ids.get(key)? as usize])
    }

    fn ensure(&mut self, key: &SeriesKey) -> &mut MemSeries {
        let n = self.series.len() as u32;
        let id = *self.ids.entry(key.clone()).or_insert(n);
        if id == n {
            self.series.push(MemSeries {
                key: key.clone(),
                registered: false,
                quantum: None,
                points: BTreeSet::new(),
                blocks: BTreeMap::new(),
            });
        }
        &mut self.series[id as usize]
    }
}

impl MemSeries {
    fn info(&self, start: i64, b: &MemBlock) -> Option<BlockInfo> {
        let quantum = Quantum::at(start, self.quantum?)?;
        Some(BlockInfo {
            series: self.key.clone(),
            quantum,
            count: b.count,
            digest: b.digest,
            last_write: b.last_write,
            bytes: b.count * 16,
        })
    }
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
        // Quantum lengths first, so a refused write changes nothing.
        let mut in_batch: HashMap<&SeriesKey, QuantumLen> = HashMap::new();
        for b in blocks {
            let stored = inner.get(&b.series).and_then(|s| s.quantum).or_else(|| in_batch.get(&b.series).copied());
            if let Some(len) = stored
                && len != b.quantum.len
            {
                return Err(StoreError::QuantumMismatch {
                    series: b.series.clone(),
                    stored_ns: len.ns(),
                    requested_ns: b.quantum.len.ns(),
                });
            }
            in_batch.insert(&b.series, b.quantum.len);
        }
        let clock = inner.clock;
        let mut new_points = 0;
        for b in blocks.iter().filter(|b| !b.points.is_empty()) {
            let s = inner.ensure(&b.series);
            s.quantum = Some(b.quantum.len);
            let mut added = MemBlock::default();
            for p in &b.points {
                if s.points.insert(p.key()) {
                    added.count += 1;
                    added.digest = added.digest.wrapping_add(p.identity_hash());
                }
            }
            if added.count > 0 {
                let block = s.blocks.entry(b.quantum.start).or_default();
                block.count += added.count;
                block.digest = block.digest.wrapping_add(added.digest);
                block.last_write = clock;
            }
            new_points += added.count;
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
        let Some(s) = inner.get(series) else {
            return Ok(ReadPage::default());
        };
        let mut iter = s.points.range(page_start(&range, after)..).take_while(|k| k.ts < range.end()).map(point_of);
        let points: Vec<Point> = iter.by_ref().take(limit).collect();
        let more = iter.next().is_some();
        Ok(ReadPage { points, more })
    }

    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        let mut inner = self.write_lock();
        for s in series {
            inner.ensure(s).registered = true;
        }
        Ok(())
    }

    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError> {
        Ok(self.read_lock().get(series).is_some_and(|s| s.registered))
    }

    fn find_series_page(&self, filter: &SeriesFilter, limit: usize) -> Result<(Vec<SeriesKey>, bool), StoreError> {
        let inner = self.read_lock();
        let passing = inner.series.iter().filter(|s| s.registered && filter.matches(&s.key)).map(|s| &s.key);
        Ok(crate::smallest(passing, limit))
    }

    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError> {
        let inner = self.read_lock();
        let mut out: Vec<SeriesKey> = inner
            .series
            .iter()
            .filter(|s| s.registered && s.key.metric().starts_with(metric_prefix))
            .map(|s| s.key.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    fn aggregate(&self, series: &SeriesKey, range: TimeRange, grid: Grid) -> Result<Vec<WindowAggregate>, StoreError> {
        check_windows(&range, grid).map_err(StoreError::InvalidInput)?;
        let inner = self.read_lock();
        let mut agg = Aggregator::new(range, grid);
        if let Some(s) = inner.get(series) {
            let start = PointKey { ts: range.start(), event: 0, value_bits: 0 };
            let points: Vec<Point> = s.points.range(start..).take_while(|k| k.ts < range.end()).map(point_of).collect();
            agg.push_points(&points);
        }
        Ok(agg.finish())
    }

    /// Nothing to maintain: the memory store neither seals nor expires. `now` stamps later
    /// writes ([`BlockInfo::last_write`]).
    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        let mut inner = self.write_lock();
        inner.clock = inner.clock.max(now);
        Ok(MaintenanceReport::default())
    }

    fn list_blocks(&self, after: Option<ListCursor>, limit: usize) -> Result<BlockPage, StoreError> {
        let inner = self.read_lock();
        let (mut id, mut from) = after.map_or((0, None), |c| (c.series, c.after));
        let mut blocks = Vec::new();
        let mut visited = 0usize;
        while let Some(s) = inner.series.get(id as usize) {
            if blocks.len() >= limit || visited >= limit.saturating_add(LIST_SCAN_SLACK) {
                return Ok(BlockPage { blocks, next: Some(ListCursor { series: id, after: from }) });
            }
            for (&start, b) in s.blocks.range((from.map_or(Bound::Unbounded, Bound::Excluded), Bound::Unbounded)) {
                if blocks.len() >= limit {
                    return Ok(BlockPage { blocks, next: Some(ListCursor { series: id, after: from }) });
                }
                visited += 1;
                blocks.extend(s.info(start, b));
                from = Some(start);
            }
            visited += 1;
            id += 1;
            from = None;
        }
        Ok(BlockPage { blocks, next: None })
    }

    fn block_info(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<BlockInfo>, StoreError> {
        let inner = self.read_lock();
        Ok(inner.get(series).and_then(|s| s.info(quantum_start, s.blocks.get(&quantum_start)?)))
    }

    fn read_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let Some(len) = self.read_lock().get(series).and_then(|s| s.quantum) else {
            return Ok(ReadPage::default());
        };
        let q = Quantum::at(quantum_start, len).ok_or_else(|| {
            StoreError::InvalidInput(format!(
                "{quantum_start} is not the start of a quantum of {series} (quanta of {} ns)",
                len.ns()
            ))
        })?;
        let range = TimeRange::new(q.start, q.end())
            .map_err(|e| StoreError::InvalidInput(format!("block {quantum_start} of {series}: {e}")))?;
        self.read(series, range, after, limit)
    }

    fn drop_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        expected_digest: u64,
    ) -> Result<bool, StoreError> {
        let mut inner = self.write_lock();
        let Some(&id) = inner.ids.get(series) else {
            return Ok(false);
        };
        let s = &mut inner.series[id as usize];
        let (Some(len), Some(b)) = (s.quantum, s.blocks.get(&quantum_start)) else {
            return Ok(false);
        };
        if b.digest != expected_digest {
            return Ok(false);
        }
        let count = b.count;
        s.blocks.remove(&quantum_start);
        let from = PointKey { ts: quantum_start, event: 0, value_bits: 0 };
        let to = PointKey { ts: quantum_start.saturating_add(len.ns()), event: 0, value_bits: 0 };
        let doomed: Vec<PointKey> = s.points.range(from..to).copied().collect();
        for k in &doomed {
            s.points.remove(k);
        }
        inner.points -= count;
        Ok(true)
    }

    fn list_registered(&self, after: Option<ListCursor>, limit: usize) -> Result<SeriesPage, StoreError> {
        let inner = self.read_lock();
        let mut id = after.map_or(0, |c| c.series);
        let mut series = Vec::new();
        let mut visited = 0usize;
        while let Some(s) = inner.series.get(id as usize) {
            if series.len() >= limit || visited >= limit.saturating_add(LIST_SCAN_SLACK) {
                return Ok(SeriesPage { series, next: Some(ListCursor { series: id, after: None }) });
            }
            if s.registered {
                series.push(s.key.clone());
            }
            visited += 1;
            id += 1;
        }
        Ok(SeriesPage { series, next: None })
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

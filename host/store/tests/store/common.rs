//! Helpers shared by the disk store tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use timeshard_proto::point::BlockPoints;
use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{DiskConfig, DiskStore, Store};

/// 1 ms quanta, the shortest allowed, so small timestamps span many blocks.
pub fn qlen() -> QuantumLen {
    QuantumLen::new(1_000_000).unwrap()
}

/// Splits points into per-quantum blocks.
pub fn blocks(series: &SeriesKey, len: QuantumLen, points: &[Point]) -> Vec<BlockPoints> {
    let mut by_q: BTreeMap<i64, Vec<Point>> = BTreeMap::new();
    for p in points {
        by_q.entry(len.quantum_of(p.ts).start).or_default().push(*p);
    }
    by_q.into_iter()
        .map(|(start, points)| BlockPoints {
            series: series.clone(),
            quantum: Quantum::at(start, len).unwrap(),
            points,
        })
        .collect()
}

/// A config that exercises rotation, segment rolls and small steps on little data.
pub fn small_config() -> DiskConfig {
    DiskConfig {
        seal_grace_ns: 1_000_000,
        wal_segment_bytes: 4 << 10,
        block_segment_bytes: 8 << 10,
        step_max_points: 2_000,
        max_block_points: 5_000,
        index_rewrite_bytes: 2 << 10,
        ..DiskConfig::default()
    }
}

pub fn open(disk: &FaultyDisk, config: DiskConfig) -> DiskStore {
    DiskStore::open_with_backend(Arc::new(disk.clone()), config).unwrap()
}

/// Every point of `series`, read in pages of `page`.
pub fn read_all(store: &dyn Store, series: &SeriesKey, page: usize) -> Vec<Point> {
    let range = TimeRange::new(0, timeshard_proto::time::MAX_TIMESTAMP).unwrap();
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let p = store.read(series, range, after, page).unwrap();
        assert!(p.points.len() <= page);
        after = p.points.last().map(|p| p.key());
        out.extend(p.points);
        if !p.more {
            return out;
        }
    }
}

/// Runs maintenance until it reports no more work.
pub fn settle(store: &DiskStore, now: i64) {
    for _ in 0..1000 {
        if !store.maintain(now).unwrap().more {
            return;
        }
    }
    panic!("maintenance never settled");
}

//! The archive as the simulator runs it: on one current-thread runtime with a paused clock,
//! entered as a simulated host. An export whose uploads fail and are retried, an export of late
//! data diffed against the archived rows, and reads of every point all run on the runtime's own
//! thread (nothing may block it, nothing may run beside it), and a seed replays them exactly.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use object_store::memory::InMemory;
use timeshard_clock::sim;
use timeshard_proto::point::{BlockPoints, sort_dedup};
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange, Timestamp};
use timeshard_store::{
    BlockInfo, BlockPage, ListCursor, MaintenanceReport, MemStore, ReadPage, SeriesPage, Store, StoreError,
    WindowAggregate, WriteStats,
};
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::{Archive, RetryPolicy};

use crate::support::*;

/// A hot store that records which of its methods were called off the thread that made it.
#[derive(Debug)]
struct OnOneThread {
    inner: Arc<MemStore>,
    home: ThreadId,
    strays: Mutex<BTreeSet<&'static str>>,
}

impl OnOneThread {
    fn new(inner: Arc<MemStore>) -> OnOneThread {
        OnOneThread { inner, home: std::thread::current().id(), strays: Mutex::default() }
    }

    fn here(&self, method: &'static str) {
        if std::thread::current().id() != self.home {
            self.strays.lock().unwrap().insert(method);
        }
    }

    fn strays(&self) -> BTreeSet<&'static str> {
        self.strays.lock().unwrap().clone()
    }
}

impl Store for OnOneThread {
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError> {
        self.here("write");
        self.inner.write(blocks)
    }
    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        self.here("read");
        self.inner.read(series, range, after, limit)
    }
    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        self.here("register_series");
        self.inner.register_series(series)
    }
    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError> {
        self.here("has_series");
        self.inner.has_series(series)
    }
    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError> {
        self.here("list_series");
        self.inner.list_series(metric_prefix)
    }
    fn aggregate(&self, series: &SeriesKey, range: TimeRange, grid: Grid) -> Result<Vec<WindowAggregate>, StoreError> {
        self.here("aggregate");
        self.inner.aggregate(series, range, grid)
    }
    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        self.here("maintain");
        self.inner.maintain(now)
    }
    fn list_blocks(&self, after: Option<ListCursor>, limit: usize) -> Result<BlockPage, StoreError> {
        self.here("list_blocks");
        self.inner.list_blocks(after, limit)
    }
    fn block_info(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<BlockInfo>, StoreError> {
        self.here("block_info");
        self.inner.block_info(series, quantum_start)
    }
    fn read_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        self.here("read_block");
        self.inner.read_block(series, quantum_start, after, limit)
    }
    fn drop_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        expected_digest: u64,
    ) -> Result<bool, StoreError> {
        self.here("drop_block");
        self.inner.drop_block(series, quantum_start, expected_digest)
    }
    fn list_registered(&self, after: Option<ListCursor>, limit: usize) -> Result<SeriesPage, StoreError> {
        self.here("list_registered");
        self.inner.list_registered(after, limit)
    }
}

/// What a run did that another run of its seed must repeat.
#[derive(Debug, PartialEq, Eq)]
struct Replay {
    /// Every object-store operation, in order.
    operations: Vec<String>,
    retries: u32,
    /// Virtual time the exports and reads took.
    took: Duration,
}

/// Runs `scenario` as a simulated host with random stream `seed`, as the simulator does.
fn on_a_simulated_host<T>(seed: u64, scenario: impl AsyncFnOnce() -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let origin = rt.block_on(async { tokio::time::Instant::now() });
    let host = Rc::new(sim::Host::new(origin, T0 + 2 * DAY, seed));
    let _as_host = sim::enter(&host);
    rt.block_on(scenario())
}

/// Two series of 100 minutes at 10 Hz across midnight, exported in large row groups (reads
/// decode spans too long to decode inline) and small upload parts; the first part of the
/// first upload fails, and so does the first part of its retry. Then late points, some into
/// exported blocks, are exported against the archived rows.
async fn export_with_failures_then_late_data() -> Replay {
    let class = class("c", 10);
    let start = T0 - T0.rem_euclid(DAY) + DAY - 3_000 * SEC;
    let data: Data =
        (1..=2u64).map(|i| (series(&format!("m{{id={i}}}")), signal_points(i, start, 10, 60_000))).collect();
    let hot = Arc::new(OnOneThread::new(hot_store(class.quantum, &data)));
    let blocks = hot_blocks(&*hot);
    let mut config = quick_config("n1");
    // Real backoffs, with jitter from the host's stream: virtual waits, replayed by the seed.
    config.retry = RetryPolicy::default();
    config.export.row_group_rows = 32_768;
    config.export.part_bytes = 16 * 1024;

    // A clean run finds the first part upload: until it, a run with failures does the same.
    let clean = FaultyStore::new(Arc::new(InMemory::new()));
    Archive::with_store(Arc::new(clean.clone()), config.clone())
        .unwrap()
        .export(hot.clone(), &class, blocks.clone())
        .await
        .unwrap();
    let first_part = clean.log().iter().position(|op| op.starts_with("put_part")).expect("uploads in parts") as u64;
    // After the failed part: the upload's abort, then the retry's new upload and first part.
    let retried_part = first_part + 3;

    let began = tokio::time::Instant::now();
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    faulty.set_fault(Fault::FailOnly(BTreeSet::from([first_part, retried_part])));
    let archive = Archive::with_store(Arc::new(faulty.clone()), config).unwrap();
    let first = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    let log = faulty.log();
    for n in [first_part, retried_part] {
        assert!(log[n as usize].starts_with("put_part"), "operation {n} is {}", log[n as usize]);
    }
    assert_eq!(first.retries, 2);
    assert_eq!(first.rows, 120_000);
    assert_eq!(first.files.len(), 2, "one file per class-day: {:?}", first.files);
    assert_eq!(first.confirmed.len(), blocks.len());
    assert!(first.confirmed.iter().all(|c| !c.already));
    let range = TimeRange::new(start - DAY, start + 2 * DAY).unwrap();
    for (s, points) in &data {
        assert_eq!(&read_all(&archive, &class, s, range, 100_000).await, points, "{s}");
    }

    // Late points: a new one and a repeat of an archived one into exported blocks of a, one
    // with an event id at an archived timestamp of b, and one after midnight.
    let (a, b) = (&data[0], &data[1]);
    let late_a = vec![
        Point { ts: start + 5 * SEC + 1, value: 1.5, event: 0 },
        a.1[100],
        Point { ts: start + 3_000 * SEC + 2 * SEC + 3, value: -2.0, event: 0 },
    ];
    let late_b = vec![Point { ts: b.1[200].ts, value: b.1[200].value, event: 7 }];
    hot.write(&to_blocks(&a.0, class.quantum, &late_a)).unwrap();
    hot.write(&to_blocks(&b.0, class.quantum, &late_b)).unwrap();
    let second = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert_eq!(second.rows, 3, "only the points the archive lacked are written");
    assert_eq!(second.confirmed.iter().filter(|c| !c.already).count(), 3);
    for (s, points, late) in [(&a.0, &a.1, &late_a), (&b.0, &b.1, &late_b)] {
        let mut want = points.clone();
        want.extend(late);
        sort_dedup(&mut want);
        assert_eq!(read_all(&archive, &class, s, range, 100_000).await, want, "{s} with its late points");
    }

    assert!(hot.strays().is_empty(), "the hot store was called off the runtime's thread: {:?}", hot.strays());
    Replay { operations: faulty.log(), retries: first.retries + second.retries, took: began.elapsed() }
}

#[test]
fn an_export_with_retries_and_late_data_runs_on_the_simulators_one_thread() {
    let replay = on_a_simulated_host(7, export_with_failures_then_late_data);
    assert!(replay.took >= Duration::from_millis(600), "two backoffs of 200 and 400 ms at least: {:?}", replay.took);
}

#[test]
fn a_seed_replays_an_archive_run_exactly() {
    let run = || on_a_simulated_host(11, export_with_failures_then_late_data);
    assert_eq!(run(), run());
}

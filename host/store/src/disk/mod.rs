//! The durable disk engine: [`DiskStore`].
//!
//! Owns the in-memory state (series dictionary, per-(series, quantum) blocks with their open
//! points and sealed location), the write path (validate, log with group commit, apply), the
//! read and aggregate paths, maintenance (seal, merge late data, retention, compaction, log
//! checkpoints, index rewrites) and recovery on open. File formats live in [`crate::frame`],
//! [`crate::block`], [`crate::wal`] and [`crate::index`]; FORMAT.md documents them.
//!
//! This module holds the settings, the state every path shares and the [`Store`] impl; each
//! path has its own file:
//!
//! - `write`: resolving series ids, logging a write and applying it, the memory valve;
//! - `read`: raw reads, aggregates and block summaries over sealed and open points;
//! - `seal`: sealing open points into block segments, compaction, and index log writes;
//! - `recover`: opening (format check, index load, log replay) and log checkpoints;
//! - `retain`: retention rules and expiry.
//!
//! # Implementation notes
//!
//! - A block is `sealed` (one compressed frame in a block segment file, listed in the index)
//!   plus `open` points (in memory and in the log). Open points of a sealed block are late data:
//!   reads merge them, maintenance re-seals the union into a new frame.
//! - Locks: `state` (RwLock) is never held across I/O. Maintenance snapshots what it needs,
//!   does its I/O unlocked, then applies the result; it is serialised by `maint`, which ingest
//!   never waits for (the pressure valve only `try_lock`s it).
//! - The log may be cut at segment `s` once every point logged in segments before `s` is in a
//!   sealed block listed in the index: blocks remember the oldest segment of their open
//!   points, and the log pins segments with writes logged but not yet applied.
//! - Sealed frames are immutable. A reader holding an old location may find its segment
//!   compacted away (not found): it re-reads the location and retries.

mod read;
mod recover;
mod retain;
mod seal;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey, TimeRange, Timestamp};

use crate::agg::WindowAggregate;
use crate::backend::{Backend, FileBackend};
use crate::block::{self, Codec};
use crate::index::Loc;
use crate::wal::Wal;
use crate::{MaintenanceReport, ReadPage, Store, StoreError, WriteStats};

pub use retain::RetentionRule;

/// On-disk format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// After the log is fsynced (survives power loss). Concurrent writes share one fsync.
    #[default]
    Durable,
    /// After the log is handed to the OS (survives a process crash, not a power cut).
    OsBuffered,
}

/// Settings of a [`DiskStore`]. `Default` is what a node should use.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// When writes are acknowledged (default: durable).
    pub fsync: FsyncPolicy,
    /// Codec of newly sealed blocks (default: pco; both are always readable).
    pub codec: Codec,
    /// A block is sealed once its quantum ended this long ago (default 30 s); later points are
    /// late data and get merged by a re-seal.
    pub seal_grace_ns: i64,
    /// A block's open points are sealed early past this many (default 1 Mi).
    pub max_block_points: usize,
    /// Open points held in memory above which writes seal the oldest blocks themselves
    /// (default 8 Mi points, about 200 MB).
    pub max_open_points: usize,
    /// Most points accepted in one write (default 1 Mi).
    pub max_write_points: usize,
    /// Most series in the dictionary (default 10 Mi); more is refused as [`StoreError::Full`].
    pub max_series: usize,
    /// A log segment is rotated past this size (default 64 MiB).
    pub wal_segment_bytes: u64,
    /// A block segment file is rotated past this size (default 64 MiB).
    pub block_segment_bytes: u64,
    /// Most points one maintenance step seals (default 4 Mi).
    pub step_max_points: usize,
    /// The index log is rewritten as a snapshot once it is this large and 4 times its live
    /// content (default 8 MiB).
    pub index_rewrite_bytes: u64,
    /// Retention rules by metric prefix; series without a rule are kept forever.
    pub retention: Vec<RetentionRule>,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            fsync: FsyncPolicy::Durable,
            codec: Codec::Pco,
            seal_grace_ns: 30_000_000_000,
            max_block_points: 1 << 20,
            max_open_points: 8 << 20,
            max_write_points: 1 << 20,
            max_series: 10 << 20,
            wal_segment_bytes: 64 << 20,
            block_segment_bytes: 64 << 20,
            step_max_points: 4 << 20,
            index_rewrite_bytes: 8 << 20,
            retention: Vec::new(),
        }
    }
}

/// Counters and sizes, for tests, metrics and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskStats {
    /// Sealed blocks read and decoded since open.
    pub blocks_decoded: u64,
    /// Open (not yet sealed) points copied out by reads since open.
    pub open_points_copied: u64,
    /// Dictionary entries visited by maintenance (retention and checkpoints) since open.
    pub series_walked: u64,
    /// Block summaries used whole by aggregates since open.
    pub summaries_used: u64,
    /// Points held in memory (open blocks and late data).
    pub open_points: u64,
    /// Sealed blocks.
    pub sealed_blocks: u64,
    /// Series in the dictionary.
    pub series: u64,
    /// Log segment files.
    pub wal_segments: u64,
    /// Block segment files.
    pub block_segments: u64,
}

#[derive(Debug, Default)]
struct Block {
    sealed: Option<Loc>,
    /// Sorted by identity, no duplicates.
    open: Vec<Point>,
    /// Oldest log segment holding any of `open` (u64::MAX when empty).
    open_min_seg: u64,
    /// While maintenance seals or re-logs a snapshot: oldest segment of points added since.
    snap_min_seg: Option<u64>,
    /// The last seal left the open points open (a damaged sealed part, or too many points for
    /// one block): checkpoints re-log them instead of keeping old log segments for them.
    stuck: bool,
}

#[derive(Debug)]
struct Series {
    key: SeriesKey,
    registered: bool,
    quantum: Option<QuantumLen>,
    /// What the index holds of this entry, to write only changes.
    indexed: Option<DictEntry>,
    expired_before: i64,
    blocks: BTreeMap<i64, Block>,
}

impl Series {
    /// The dictionary entry as the index records it.
    fn entry(&self) -> DictEntry {
        DictEntry { registered: self.registered, quantum_ns: self.quantum.map_or(0, QuantumLen::ns) }
    }
}

/// A series' dictionary entry as the index records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DictEntry {
    /// The series was registered (not only written to).
    registered: bool,
    /// Its quantum length, 0 while it has none.
    quantum_ns: i64,
}

/// Size of one block segment file, to pick segments worth compacting.
#[derive(Debug, Default, Clone, Copy)]
struct SegStat {
    /// Bytes in the file.
    bytes: u64,
    /// Bytes of the frames blocks still point at.
    live: u64,
}

#[derive(Debug, Default)]
struct State {
    ids: HashMap<SeriesKey, u32>,
    series: HashMap<u32, Series>,
    next_id: u32,
    open_points: usize,
    /// Blocks (series id, quantum start) with open points.
    dirty: BTreeSet<(u32, i64)>,
    segs: BTreeMap<u32, SegStat>,
    /// Series whose dictionary entry (registered, quantum) may differ from what the index
    /// holds: every change adds the id, so checkpoints need not walk the whole dictionary.
    unindexed: BTreeSet<u32>,
    /// Blocks of all series (for the index size estimate).
    blocks: usize,
}

#[derive(Debug, Default)]
struct Maint {
    seg: u32,
    seg_len: u64,
    index_len: u64,
    /// A failed index append may have left torn bytes past `index_len`.
    index_torn: bool,
    first_live_wal: u64,
    /// Segments that could not be compacted (a corrupt block in them).
    stuck: BTreeSet<u32>,
    /// The index had damaged edits: rewrite it from memory at the next step.
    rewrite_index: bool,
}

/// The durable store. See the crate docs for how a node opens and maintains it.
pub struct DiskStore {
    backend: Arc<dyn Backend>,
    config: DiskConfig,
    state: RwLock<State>,
    wal: Wal,
    maint: Mutex<Maint>,
    retention: RwLock<Vec<RetentionRule>>,
    health: Mutex<Vec<String>>,
    /// Retention runs again at or after this time (it walks every series).
    next_expire: AtomicI64,
    decoded: AtomicU64,
    open_copied: AtomicU64,
    series_walked: AtomicU64,
    summaries_used: AtomicU64,
}

impl fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskStore")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn seg_path(seg: u32) -> String {
    format!("blocks/{seg:010}.seg")
}

fn parse_seg_name(name: &str) -> Option<u32> {
    name.strip_suffix(".seg")?.parse().ok()
}

/// Union of two sorted, deduplicated point lists.
fn union(a: Vec<Point>, b: &[Point]) -> Vec<Point> {
    if b.is_empty() {
        return a;
    }
    if a.last().is_none_or(|l| *l < b[0]) {
        let mut a = a;
        a.extend_from_slice(b);
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// `a` without the points of `b` (both sorted).
fn difference(a: &[Point], b: &[Point]) -> Vec<Point> {
    let mut out = Vec::with_capacity(a.len().saturating_sub(b.len()));
    let mut j = 0;
    for p in a {
        while j < b.len() && b[j] < *p {
            j += 1;
        }
        if j < b.len() && b[j] == *p {
            continue;
        }
        out.push(*p);
    }
    out
}

impl DiskStore {
    /// Opens (or creates) the store in `dir`, replaying its log. The directory is locked
    /// against other processes while the store lives.
    pub fn open(dir: &Path, config: DiskConfig) -> Result<DiskStore, StoreError> {
        let backend = FileBackend::open(dir)?;
        DiskStore::open_with_backend(Arc::new(backend), config)
    }

    /// Opens the store over any backend (tests use [`crate::faulty_disk::FaultyDisk`]).
    pub fn open_with_backend(backend: Arc<dyn Backend>, mut config: DiskConfig) -> Result<DiskStore, StoreError> {
        config.max_block_points = config.max_block_points.clamp(1, block::MAX_POINTS / 2);
        let found = recover::recover(&*backend)?;
        let wal = Wal::new(backend.clone(), config.fsync, found.last_wal_seq, found.wal_segments);
        let retention = RwLock::new(config.retention.clone());
        Ok(DiskStore {
            backend,
            config,
            state: RwLock::new(found.state),
            wal,
            maint: Mutex::new(found.maint),
            retention,
            health: Mutex::new(found.problems),
            next_expire: AtomicI64::new(i64::MIN),
            decoded: AtomicU64::new(0),
            open_copied: AtomicU64::new(0),
            series_walked: AtomicU64::new(0),
            summaries_used: AtomicU64::new(0),
        })
    }

    /// Problems found at open or by maintenance that the store worked around (damaged bytes
    /// skipped, blocks it could not merge). Empty when all is well.
    pub fn health(&self) -> Vec<String> {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn problem(&self, p: String) {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        // Maintenance retries what it could not do; report each problem once.
        if h.len() < 1000 && !h.contains(&p) {
            tracing::warn!(problem = %p, "store problem");
            h.push(p);
        }
    }

    /// Counters and sizes.
    pub fn stats(&self) -> DiskStats {
        let st = self.read_state();
        DiskStats {
            blocks_decoded: self.decoded.load(Ordering::Relaxed),
            open_points_copied: self.open_copied.load(Ordering::Relaxed),
            series_walked: self.series_walked.load(Ordering::Relaxed),
            summaries_used: self.summaries_used.load(Ordering::Relaxed),
            open_points: st.open_points as u64,
            sealed_blocks: st
                .series
                .values()
                .map(|s| s.blocks.values().filter(|b| b.sealed.is_some()).count() as u64)
                .sum(),
            series: st.series.len() as u64,
            wal_segments: self.wal.segments().len() as u64,
            block_segments: st.segs.len() as u64,
        }
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Every state change is applied in one critical section after its I/O succeeded, so a
        // panic elsewhere cannot leave it half-done.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_maint(&self) -> std::sync::MutexGuard<'_, Maint> {
        self.maint.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for DiskStore {
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError> {
        self.write_blocks(blocks)
    }

    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        self.read_page(series, range, after, limit)
    }

    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        self.register(series)
    }

    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError> {
        let st = self.read_state();
        Ok(st.ids.get(series).is_some_and(|id| st.series[id].registered))
    }

    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError> {
        let st = self.read_state();
        let mut out: Vec<SeriesKey> = st
            .series
            .values()
            .filter(|s| s.registered && s.key.metric().starts_with(metric_prefix))
            .map(|s| s.key.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    fn aggregate(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        window_ns: i64,
    ) -> Result<Vec<WindowAggregate>, StoreError> {
        self.aggregate_windows(series, range, window_ns)
    }

    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        let mut m = self.lock_maint();
        let mut report = MaintenanceReport::default();
        self.expire_step(&mut m, now, &mut report)?;
        self.seal_step(&mut m, Some(now), None, &mut report)?;
        self.compact_step(&mut m, &mut report)?;
        self.checkpoint_step(&mut m, &mut report)?;
        self.rewrite_index_if_bloated(&mut m, &mut report)?;
        Ok(report)
    }
}

//! Local storage of a timeshard node.
//!
//! A node stores the blocks (series, quantum) it replicates, plus the registrations of the
//! series it holds in the series dictionary. Engines implement [`Store`]; the node holds an
//! `Arc<dyn Store>` and never sees files. [`DiskStore`] is the durable engine every node uses by
//! default; [`MemStore`] keeps everything in memory (tests, tools).
//!
//! Stored data is a set of points (see [`timeshard_proto::point`]): writing a point twice stores
//! it once, so replays, retries and repairs are harmless.
//!
//! # How a node uses the disk store
//!
//! ```no_run
//! use std::sync::Arc;
//! use timeshard_store::{DiskConfig, DiskStore, RetentionRule, Store};
//!
//! # fn main() -> Result<(), timeshard_store::StoreError> {
//! // One data directory per node; the store takes an exclusive lock on it.
//! let config = DiskConfig {
//!     retention: vec![RetentionRule::new("pmu.", 30 * 86_400 * 1_000_000_000)],
//!     ..DiskConfig::default() // durable fsync policy, pco codec
//! };
//! let store: Arc<dyn Store> = Arc::new(DiskStore::open("/var/lib/timeshard/node-1".as_ref(), config)?);
//! // A background task calls maintenance about once a second with the wall clock, and again at
//! // once while it reports more work. Each call does a bounded step and holds no lock across I/O,
//! // so it never stalls ingest.
//! let now = std::time::SystemTime::now()
//!     .duration_since(std::time::UNIX_EPOCH)
//!     .map(|d| d.as_nanos() as i64)
//!     .unwrap_or(0);
//! let report = store.maintain(now)?;
//! if report.more { /* call again right away */ }
//! # Ok(())
//! # }
//! ```
//!
//! Opening replays the write-ahead log, so a restart after a crash (or SIGKILL) holds exactly the
//! acknowledged points; a killed node needs no shutdown step. [`DiskStore::health`] lists damage
//! the store worked around (log it, export it as a metric); [`Store::set_retention`] applies
//! new retention rules without a restart (give one [`RetentionRule`] per class, the catch-all
//! class and classes that keep forever included); [`DiskStore::stats`] feeds `/metrics`.
//! Maintenance seals blocks whose quantum ended more than [`DiskConfig::seal_grace_ns`] ago,
//! merges late data, checkpoints blocks whose quantum lasts (so no block pins the log longer
//! than [`DiskConfig::max_open_age_ns`], and the log stays under about
//! [`DiskConfig::max_wal_bytes`] whatever the quantum lengths and timestamps), applies
//! retention, compacts and cuts the log; without it the log and memory grow (writes then seal
//! blocks themselves to stay within [`DiskConfig::max_open_points`]). The `now` it is given is
//! the store's only clock.
//!
//! Repair and handoff work on whole blocks: [`Store::list_blocks`] pages through every block
//! with its count, digest and last write (from memory), [`Store::read_block`] copies one,
//! [`Store::drop_block`] removes one only if it still has the digest the new owners confirmed,
//! and [`Store::list_registered`] pages through the registrations.
//!
//! # Layout
//!
//! - `disk`: the disk engine, one file per path: `write`, `read`, `seal` (sealing and
//!   checkpoint frames, compaction, index writes), `recover` (opening, log replay, log cuts),
//!   `retain` (retention) and `blocks` (whole blocks for repair);
//! - [`block`], [`wal`] and the private `frame` and `index`: the on-disk formats (FORMAT.md);
//! - [`backend`]: the few file operations the disk engine uses ([`FileBackend`]), and
//!   [`faulty_disk`]: a disk in memory that crashes and fails on demand, for the store's tests;
//! - [`agg`]: block summaries and window aggregates; `mem`: [`MemStore`].
//!
//! Aggregate windows are bounded by [`timeshard_proto::window::MAX_WINDOWS`], the limit the
//! wire protocol enforces too.

use std::fmt;

use timeshard_proto::packed::PackedColumns;
use timeshard_proto::point::BlockPoints;
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, Quantum, SeriesKey, TimeRange, Timestamp};

pub mod agg;
pub mod backend;

/// The `limit` smallest of `keys`, sorted, and whether there were more: keeps `limit + 1`
/// references however many keys pass.
pub fn smallest<'a>(keys: impl Iterator<Item = &'a SeriesKey>, limit: usize) -> (Vec<SeriesKey>, bool) {
    let mut kept: std::collections::BinaryHeap<&SeriesKey> = std::collections::BinaryHeap::with_capacity(limit + 1);
    let mut more = false;
    for key in keys {
        if kept.len() < limit {
            kept.push(key);
        } else if kept.peek().is_some_and(|largest| key < *largest) {
            kept.pop();
            kept.push(key);
            more = true;
        } else {
            more = true;
        }
    }
    let mut out: Vec<SeriesKey> = kept.into_iter().cloned().collect();
    out.sort();
    (out, more)
}
pub mod block;
mod disk;
pub mod faulty_disk;
mod frame;
mod index;
mod mem;
pub mod wal;

pub use agg::{Summary, WindowAggregate};
pub use backend::{Backend, FileBackend};
pub use block::Codec;
pub use disk::{DiskConfig, DiskStats, DiskStore, FsyncPolicy, OPEN_POINT_BYTES, QuotaRule, QuotaUse, RetentionRule};
pub use mem::MemStore;

/// Failures of a store. Each says what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store has no room left (disk full, or the memory store's cap).
    #[error("store is full: {0}")]
    Full(String),
    /// The store's files may not be read or written.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Stored data failed its checksum or does not decode.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// Any other I/O failure.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The store was closed or has failed earlier and accepts no more writes.
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    /// A write used another quantum length than the series already has. Nothing of the write
    /// was stored.
    #[error(
        "series {series} is stored in quanta of {stored_ns} ns but the write uses {requested_ns} ns; \
         a series keeps the quantum of its class: write with the original class, or use a new metric"
    )]
    QuantumMismatch { series: SeriesKey, stored_ns: i64, requested_ns: i64 },
    /// A request that cannot be served as asked (nothing was changed).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// The directory holds data in an on-disk format this build cannot read.
    #[error(
        "{path}: on-disk format version {found} is newer than this build reads (up to {supported}); \
         upgrade timeshard or point it at another data directory"
    )]
    UnsupportedFormat { path: String, found: u32, supported: u32 },
}

/// Which registered series to list: a metric prefix plus tags that must match exactly (the
/// same filter a client sends).
pub use timeshard_proto::wire::SeriesFilter;

/// What one maintenance step did. The node calls [`Store::maintain`] again at once while
/// `more` is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Blocks sealed (compressed and written) from open or late data.
    pub sealed_blocks: u64,
    /// Points those blocks hold.
    pub sealed_points: u64,
    /// Of the sealed blocks, those whose quantum has not ended: their open points were written
    /// as a checkpoint frame so they no longer pin the log.
    pub checkpointed_blocks: u64,
    /// Blocks removed because retention expired them.
    pub expired_blocks: u64,
    /// Blocks removed to keep a class within its quota (`evict_oldest`).
    pub evicted_blocks: u64,
    /// Block segment files rewritten to reclaim space.
    pub compacted_segments: u64,
    /// Write-ahead log segments removed because everything in them is sealed.
    pub wal_segments_removed: u64,
    /// Times the index log was rewritten as a compact snapshot.
    pub index_rewrites: u64,
    /// Whether work is left that the step's bounds deferred.
    pub more: bool,
}

/// A block a read found damaged ([`Store::take_damaged`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedBlock {
    pub series: SeriesKey,
    pub quantum: Quantum,
}

/// One step of a scrub ([`Store::scrub`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubPage {
    /// Sealed frames read and checked.
    pub checked: usize,
    /// Of those, frames found damaged (recorded for [`Store::take_damaged`]).
    pub damaged: usize,
    /// Where the next step starts; `None` once the pass reached the last block.
    pub next: Option<ListCursor>,
}

/// One page of a read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadPage {
    /// Points sorted by identity (time, event, value).
    pub points: Vec<Point>,
    /// Whether the range holds more points after the last one returned.
    pub more: bool,
}

/// A block as its sealed columns ([`Store::read_packed`]): its count and digest (the frame's
/// summary) and the columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedBlock {
    pub count: u64,
    pub digest: u64,
    pub columns: PackedColumns,
}

/// What a write changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Points that were not stored before.
    pub new_points: u64,
}

/// One block a store holds, as [`Store::list_blocks`] reports it: what anti-entropy and
/// handoff compare between replicas without reading points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The block's series.
    pub series: SeriesKey,
    /// Its quantum.
    pub quantum: Quantum,
    /// Points it holds.
    pub count: u64,
    /// Wrapping sum of [`Point::identity_hash`] over its points: equal on two replicas exactly
    /// when they hold the same points (up to hash collisions).
    pub digest: u64,
    /// When a write last added points to it, in ns of the clock the store's caller gives
    /// [`Store::maintain`] (the store reads no clock; it may lag the wall clock by one
    /// maintenance interval). Blocks not written since the store was opened report the first
    /// maintenance time after opening (0 before it).
    pub last_write: Timestamp,
    /// Bytes it takes in the store: its sealed frames, and [`OPEN_POINT_BYTES`] per point not
    /// yet sealed (the memory store counts 16 per point).
    pub bytes: u64,
}

/// Where a paged listing ([`Store::list_blocks`], [`Store::list_registered`]) goes on: returned
/// with a page, and valid only for the store that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ListCursor {
    /// The engine's number of the series to go on with.
    series: u32,
    /// Its blocks starting after this one are next (all of them when `None`).
    after: Option<i64>,
}

impl ListCursor {
    /// The cursor's parts, so a node can hand it to a peer that pages through its blocks
    /// ([`ListCursor::from_parts`] takes them back; a made-up cursor only skips or repeats).
    pub fn to_parts(self) -> (u32, Option<i64>) {
        (self.series, self.after)
    }

    /// A cursor from [`ListCursor::to_parts`].
    pub fn from_parts(series: u32, after: Option<i64>) -> ListCursor {
        ListCursor { series, after }
    }
}

/// One page of [`Store::list_blocks`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockPage {
    /// At most the `limit` asked for; possibly fewer (even none) while `next` is set.
    pub blocks: Vec<BlockInfo>,
    /// Where the next page starts; `None` once every block was listed.
    pub next: Option<ListCursor>,
}

/// One page of [`Store::list_registered`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeriesPage {
    /// At most the `limit` asked for; possibly fewer (even none) while `next` is set.
    pub series: Vec<SeriesKey>,
    /// Where the next page starts; `None` once every registration was listed.
    pub next: Option<ListCursor>,
}

/// Series numbers (of dictionary entries, or empty slots) a listing call visits beyond its
/// limit, so a page holds the state lock for bounded work even when few entries qualify.
const LIST_SCAN_SLACK: usize = 4096;

/// Local storage engine.
pub trait Store: Send + Sync + fmt::Debug {
    /// Stores the points of `blocks`, returning once they are durable as the engine is
    /// configured. Idempotent. Each block's points lie within its quantum (validated by the
    /// caller).
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError>;

    /// Points of `series` within `range`, sorted by identity, strictly after `after`, at most
    /// `limit` of them.
    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError>;

    /// Records that `series` exist (idempotent).
    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError>;

    /// Whether `series` was registered here.
    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError>;

    /// Registered series whose metric starts with `metric_prefix`, sorted.
    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError>;

    /// Registered series passing `filter` (metric prefix and exact tags), sorted.
    fn find_series(&self, filter: &SeriesFilter) -> Result<Vec<SeriesKey>, StoreError> {
        Ok(self.list_series(&filter.metric_prefix)?.into_iter().filter(|s| filter.matches(s)).collect())
    }

    /// The first `limit` registered series passing `filter`, sorted, and whether more pass.
    /// The stores keep only `limit` keys while they scan, whatever the dictionary holds (a
    /// listing from outside asks this, never the whole dictionary).
    fn find_series_page(&self, filter: &SeriesFilter, limit: usize) -> Result<(Vec<SeriesKey>, bool), StoreError> {
        Ok(smallest(self.find_series(filter)?.iter(), limit))
    }

    /// Aggregates of `series` over `range` in the windows of `grid`: count, min, max, sum,
    /// mean, first and last per window, for the windows that hold points, in time order,
    /// trimmed to `range`. First and last follow point identity order (time, event, value).
    /// A grid [`timeshard_proto::window::check_windows`] refuses (a width that is not
    /// positive, more than [`timeshard_proto::window::MAX_WINDOWS`] windows) is
    /// [`StoreError::InvalidInput`].
    fn aggregate(&self, series: &SeriesKey, range: TimeRange, grid: Grid) -> Result<Vec<WindowAggregate>, StoreError>;

    /// One bounded step of background work at wall-clock time `now` (ns since the epoch):
    /// sealing, late-data merges, retention, compaction and log checkpoints. See the crate docs
    /// for how often to call it. `now` is also the store's clock for [`BlockInfo::last_write`].
    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError>;

    /// Every block held, a page at a time: start with `after = None`, then pass each page's
    /// `next` until it is `None`. Counts, digests and write times come from memory; no point
    /// is decoded, and each call holds the state lock for bounded work (about `limit` blocks),
    /// so listing a million blocks never stalls writers. The order is the engine's (stable
    /// while the store lives); blocks created behind the cursor meanwhile show up in the next
    /// listing. A block written within the last maintenance step may briefly report a count and
    /// digest that include points it holds twice (after a restart, or a write racing a
    /// checkpoint); its `last_write` is then recent.
    fn list_blocks(&self, after: Option<ListCursor>, limit: usize) -> Result<BlockPage, StoreError>;

    /// Block (`series`, `quantum_start`) as [`Store::list_blocks`] reports it; `None` when it
    /// is not held.
    fn block_info(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<BlockInfo>, StoreError>;

    /// Points of block (`series`, `quantum_start`), sorted by identity, strictly after `after`,
    /// at most `limit` of them (page through a block to copy it whole).
    fn read_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError>;

    /// Block (`series`, `quantum_start`) as the columns its store compressed, when it is held
    /// as exactly one sealed pco frame of at most `max_points` points with nothing open or
    /// overlapping; `None` otherwise (read its points instead, in pages). No point is decoded:
    /// a streamed read sends the columns on.
    fn read_packed(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        max_points: u64,
    ) -> Result<Option<PackedBlock>, StoreError> {
        let _ = (series, quantum_start, max_points);
        Ok(None)
    }

    /// Removes block (`series`, `quantum_start`) if its digest is `expected_digest` (what the
    /// new owners confirmed they hold), durably: a restart does not bring it back. Returns
    /// whether it was dropped: `false` when it is not held, its digest differs, or its digest
    /// is being settled (retry later). Points written into it after the check are kept, as a
    /// new block. May wait briefly for writes in flight.
    fn drop_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        expected_digest: u64,
    ) -> Result<bool, StoreError>;

    /// The blocks reads found damaged since the last call (a failed checksum, a frame past its
    /// segment's end): the node drops such a copy ([`Store::drop_damaged`]) when replicas
    /// hold the block, and anti-entropy fetches it again. Blocks gone since are left out.
    fn take_damaged(&self) -> Vec<DamagedBlock> {
        Vec::new()
    }

    /// Reads and checks the sealed frames of the blocks after `after` (in
    /// [`Store::list_blocks`] order), up to about `max_frames`: damage no read has come across
    /// (a block nobody queries, a misdirected write) is found and recorded as a read would
    /// record it ([`Store::take_damaged`]). Stores with nothing on disk check nothing.
    fn scrub(&self, after: Option<ListCursor>, max_frames: usize) -> Result<ScrubPage, StoreError> {
        let _ = (after, max_frames);
        Ok(ScrubPage::default())
    }

    /// Drops damaged block (`series`, `quantum_start`) whatever its digest, durably, keeping
    /// the points it holds in memory (not yet sealed, or late ones its damaged frames kept from
    /// merging): only what was unreadable goes. Returns whether it was held.
    fn drop_damaged(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<bool, StoreError> {
        let _ = (series, quantum_start);
        Ok(false)
    }

    /// Registered series a page at a time, with cursors as [`Store::list_blocks`]; cheap at any
    /// dictionary size (no sorting, bounded work per call).
    fn list_registered(&self, after: Option<ListCursor>, limit: usize) -> Result<SeriesPage, StoreError>;

    /// Replaces the retention rules (a configuration reload); engines that never expire points
    /// ignore them.
    fn set_retention(&self, rules: Vec<RetentionRule>) {
        let _ = rules;
    }

    /// Replaces the quota rules (a configuration reload); engines without quotas ignore them.
    fn set_quotas(&self, rules: Vec<QuotaRule>) {
        let _ = rules;
    }

    /// What each quota rule's series held at the last measure (empty without quotas).
    fn quota_use(&self) -> Vec<QuotaUse> {
        Vec::new()
    }
}

pub use timeshard_proto::point::page_start;

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
//! - `retain`: retention rules and expiry;
//! - `blocks`: whole blocks for repair and handoff (listing, reading, conditional drops) and
//!   paged registrations.
//!
//! # Implementation notes
//!
//! - A block is a list of sealed `frames` (compressed frames in block segment files, listed in
//!   the index, with disjoint point sets) plus `open` points (in memory and in the log).
//!   Maintenance writes a block's open points as a new frame once its quantum has ended (then
//!   merging every frame into one), or, while the quantum lasts, once the open points are
//!   older than [`DiskConfig::max_open_age_ns`], are many, or pin a log grown past
//!   [`DiskConfig::max_wal_bytes`]: such a *checkpoint* frame is merged only with the newest
//!   frames no more than twice its size (so a point is rewritten O(log n) times, never the
//!   whole block at every checkpoint), and the log stays bounded whatever the quantum.
//! - Writes keep open points disjoint from the frames: a write loads the frames whose key range
//!   its points fall in (none for live data, which lands after them) and leaves out points they
//!   hold. When that cannot be known (the log replayed at open, a write racing a checkpoint of
//!   the same block) the block is flagged `open_overlap` and the next step removes duplicates.
//!   Disjoint parts make a block's count and digest sums of its frames' summaries and of a
//!   running digest of its open points, so listing blocks decodes nothing.
//! - Locks: `state` (RwLock) is never held across I/O. Maintenance snapshots what it needs,
//!   does its I/O unlocked, then applies the result; it is serialised by `maint`. Ingest waits
//!   for it only when the log has grown past twice [`DiskConfig::max_wal_bytes`] (maintenance
//!   fell behind): the writer then checkpoints itself, so the log, and the replay at open, stay
//!   bounded whatever the load (the memory valve only `try_lock`s it).
//! - The log may be cut at segment `s` once every point logged in segments before `s` is in a
//!   sealed block listed in the index: blocks remember the oldest segment of their open
//!   points, and the log pins segments with writes logged but not yet applied.
//! - Sealed frames are immutable. A reader holding an old location may find its segment
//!   compacted away (not found): it re-reads the location and retries.

mod blocks;
mod format_file;
mod quota;
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

use timeshard_proto::point::BlockPoints;
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey, TimeRange, Timestamp};

use crate::agg::WindowAggregate;
use crate::backend::{Backend, FileBackend};
use crate::block::{self, Codec};
use crate::index::Loc;
use crate::wal::Wal;
use crate::{
    BlockInfo, BlockPage, ListCursor, MaintenanceReport, ReadPage, SeriesFilter, SeriesPage, Store, StoreError,
    WriteStats,
};
use crate::{DamagedBlock, PackedBlock, ScrubPage};

pub use quota::{OPEN_POINT_BYTES, QuotaRule, QuotaUse};
pub use retain::RetentionRule;

/// On-disk format version this build writes and the newest it reads. Version 2 adds blocks of
/// several frames and dropped blocks (index edits 6 and 7); a directory stays at version 1
/// (readable by older builds) until the first such edit is written.
pub const FORMAT_VERSION: u32 = 2;

/// The format a new directory starts at: the oldest that reads everything written so far.
const BASE_FORMAT: u32 = 1;

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
    /// A block's open points are sealed early past this many, and no frame holds more
    /// (default 1 Mi; a block with more is kept as several frames).
    pub max_block_points: usize,
    /// Open points held in memory above which writes seal the oldest blocks themselves
    /// (default 8 Mi points, about 200 MB).
    pub max_open_points: usize,
    /// Most points accepted in one write (default 1 Mi).
    pub max_write_points: usize,
    /// Most series in the dictionary (default 10 Mi); more is refused as [`StoreError::Full`].
    pub max_series: usize,
    /// A log segment is rotated past this size (default 16 MiB).
    pub wal_segment_bytes: u64,
    /// A block segment file is rotated past this size (default 64 MiB).
    pub block_segment_bytes: u64,
    /// Open points of a block whose quantum has not ended are written as a checkpoint frame
    /// once the oldest of them is this old by the maintenance clock (default 60 s), so no block
    /// pins the log longer, whatever its quantum length or timestamps.
    pub max_open_age_ns: i64,
    /// Past this many bytes of log, the blocks pinning its older half are checkpointed at once
    /// (default 64 MiB): bounds the log, and the replay at open, under heavy ingest. Past twice
    /// this, writers wait and checkpoint themselves until maintenance has caught up.
    pub max_wal_bytes: u64,
    /// Checkpoint frames of one block above which maintenance merges the newest ones even when
    /// they differ in size (default 8).
    pub max_block_frames: usize,
    /// Most points one maintenance step seals (default 4 Mi).
    pub step_max_points: usize,
    /// The index log is rewritten as a snapshot once it is this large and 4 times its live
    /// content (default 8 MiB).
    pub index_rewrite_bytes: u64,
    /// Retention rules by metric prefix: the longest matching prefix decides (see
    /// [`RetentionRule`]); series no rule matches are kept forever.
    pub retention: Vec<RetentionRule>,
    /// Quotas by metric prefix, one per class (see [`QuotaRule`]); none by default.
    pub quotas: Vec<QuotaRule>,
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
            wal_segment_bytes: 16 << 20,
            block_segment_bytes: 64 << 20,
            max_open_age_ns: 60_000_000_000,
            max_wal_bytes: 64 << 20,
            max_block_frames: 8,
            step_max_points: 4 << 20,
            index_rewrite_bytes: 8 << 20,
            retention: Vec::new(),
            quotas: Vec::new(),
        }
    }
}

/// Counters and sizes, for tests, metrics and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskStats {
    /// Sealed blocks read and decoded since open.
    pub blocks_decoded: u64,
    /// Sealed blocks whose columns were read for a streamed read, not decoded.
    pub blocks_sent_packed: u64,
    /// Open (not yet sealed) points copied out by reads since open.
    pub open_points_copied: u64,
    /// Dictionary entries visited by maintenance (retention and checkpoints) since open.
    pub series_walked: u64,
    /// Block summaries used whole by aggregates since open.
    pub summaries_used: u64,
    /// Points held in memory (open blocks and late data).
    pub open_points: u64,
    /// Sealed blocks (blocks with at least one frame).
    pub sealed_blocks: u64,
    /// Blocks holding open points: what sealing has still to do.
    pub open_blocks: u64,
    /// Frames of sealed blocks (a block has more while its quantum lasts).
    pub frames: u64,
    /// Bytes of log segments.
    pub wal_bytes: u64,
    /// Series in the dictionary.
    pub series: u64,
    /// Log segment files.
    pub wal_segments: u64,
    /// Block segment files.
    pub block_segments: u64,
}

/// The sealed frames of a block, oldest first. Most blocks have one, kept without a heap
/// allocation.
#[derive(Clone, Debug, Default, PartialEq)]
enum Frames {
    #[default]
    Empty,
    One(Loc),
    Many(Vec<Loc>),
}

impl Frames {
    fn as_slice(&self) -> &[Loc] {
        match self {
            Frames::Empty => &[],
            Frames::One(l) => std::slice::from_ref(l),
            Frames::Many(v) => v,
        }
    }

    fn from_vec(mut v: Vec<Loc>) -> Frames {
        match v.len() {
            0 => Frames::Empty,
            1 => Frames::One(v.pop().expect("one")),
            _ => Frames::Many(v),
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Points in the frames (their sum when they are disjoint).
    fn count(&self) -> u64 {
        self.as_slice().iter().map(|l| l.summary.count).sum()
    }

    /// Wrapping sum of the frames' digests (the digest of their union when disjoint).
    fn digest(&self) -> u64 {
        self.as_slice().iter().fold(0u64, |d, l| d.wrapping_add(l.summary.digest))
    }
}

/// Whether `p` lies within the key range of frame `l` (so the frame may hold it).
fn in_range(l: &Loc, p: &Point) -> bool {
    l.summary.first <= *p && *p <= l.summary.last
}

/// Wrapping sum of the identity hashes of `points`: the digest of a set of points.
fn digest_of(points: &[Point]) -> u64 {
    points.iter().fold(0u64, |d, p| d.wrapping_add(p.identity_hash()))
}

#[derive(Debug, Default)]
struct Block {
    /// Sealed frames, oldest first; their point sets are disjoint unless `overlap`.
    frames: Frames,
    /// Bumped at every change of `frames`, so a write that looked at them knows whether what
    /// it saw still holds when it applies.
    frames_gen: u32,
    /// The frames may share points (found again after index damage): maintenance merges them
    /// before their summaries are used.
    overlap: bool,
    /// When maintenance should merge the frames into as few as possible (the block is in
    /// `State::merge_due` under this time), if it has several.
    merge_at: Option<i64>,
    /// Sorted by identity, no duplicates.
    open: Vec<Point>,
    /// [`digest_of`] the open points.
    open_digest: u64,
    /// The open points may share points with the frames (replayed log, a write racing a
    /// checkpoint): the next step takes them out before summaries are used.
    open_overlap: bool,
    /// Maintenance clock when the oldest open point was added.
    open_since: i64,
    /// Maintenance clock of the last write that added points (0: before this process).
    last_write: i64,
    /// Oldest log segment holding any of `open` (u64::MAX when empty).
    open_min_seg: u64,
    /// While maintenance seals or re-logs a snapshot: oldest segment of points added since.
    snap_min_seg: Option<u64>,
    /// The last seal left the open points open (a damaged sealed part, or too many points for
    /// one block): checkpoints re-log them instead of keeping old log segments for them.
    stuck: bool,
}

impl Block {
    /// Bytes the block takes: sealed frames, and [`OPEN_POINT_BYTES`] per open point.
    fn bytes(&self) -> u64 {
        self.sealed_bytes() + self.open.len() as u64 * OPEN_POINT_BYTES
    }

    /// Bytes of the block's sealed frames.
    fn sealed_bytes(&self) -> u64 {
        self.frames.as_slice().iter().map(|l| u64::from(l.len)).sum()
    }
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
    /// Frames of all blocks (for the index size estimate and stats).
    frames: usize,
    /// Blocks with several frames (or overlapping ones), by when to merge them: (time, id,
    /// start).
    merge_due: BTreeSet<(i64, u32, i64)>,
    /// Dropped blocks whose points in log segments before the value must not be replayed, as
    /// long as such segments exist.
    drops: HashMap<(u32, i64), u64>,
}

impl State {
    /// Updates the totals after block `start` of series `id`, `b`, was taken out of its series.
    fn forget_block(&mut self, id: u32, start: i64, b: &Block) {
        self.open_points -= b.open.len();
        self.dirty.remove(&(id, start));
        if let Some(at) = b.merge_at {
            self.merge_due.remove(&(at, id, start));
        }
        self.frames -= b.frames.len();
        for loc in b.frames.as_slice() {
            if let Some(seg) = self.segs.get_mut(&loc.seg) {
                seg.live = seg.live.saturating_sub(u64::from(loc.len));
            }
        }
    }

    /// Drops the blocks of series `id` that end at or before `before` and raises its expiry
    /// watermark to it (the caller has logged the `Expire` edit); calls `gone` with each block
    /// dropped.
    fn expire_series(&mut self, id: u32, before: i64, mut gone: impl FnMut(&Block)) {
        let Some(s) = self.series.get_mut(&id) else { return };
        let len = s.quantum.map_or(1, QuantumLen::ns);
        s.expired_before = s.expired_before.max(before);
        let keep = s.blocks.split_off(&(before - len + 1));
        let dropped = std::mem::replace(&mut s.blocks, keep);
        self.blocks -= dropped.len();
        for (start, b) in dropped {
            gone(&b);
            self.forget_block(id, start, &b);
        }
    }

    /// Adds or takes `b` (block `start` of series `id`) in `merge_due` after its frames or
    /// flags changed: due once its quantum ended plus grace (`ends_at`) if fewer frames of at
    /// most `max_points` would hold it, at once if its frames overlap, else never.
    fn schedule_merge(
        merge_due: &mut BTreeSet<(i64, u32, i64)>,
        (id, start): (u32, i64),
        b: &mut Block,
        ends_at: i64,
        max_points: usize,
    ) {
        let fewer = b.frames.len() as u64 > b.frames.count().div_ceil(max_points.max(1) as u64);
        let want = if b.overlap {
            Some(i64::MIN)
        } else if fewer {
            Some(ends_at)
        } else {
            None
        };
        if want != b.merge_at {
            if let Some(at) = b.merge_at {
                merge_due.remove(&(at, id, start));
            }
            if let Some(at) = want {
                merge_due.insert((at, id, start));
            }
            b.merge_at = want;
        }
    }
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
    /// The format version `FORMAT` declares (raised before the first edit that needs more).
    format: u32,
}

/// The durable store. See the crate docs for how a node opens and maintains it.
pub struct DiskStore {
    backend: Arc<dyn Backend>,
    config: DiskConfig,
    state: RwLock<State>,
    wal: Wal,
    maint: Mutex<Maint>,
    retention: RwLock<Vec<RetentionRule>>,
    quota_rules: RwLock<Vec<QuotaRule>>,
    quotas: Mutex<quota::Quotas>,
    health: Mutex<Vec<String>>,
    /// Retention runs again at or after this time (it walks every series).
    next_expire: AtomicI64,
    /// The maintenance clock: the latest `now` given to [`Store::maintain`] (the store reads no
    /// clock itself). Stamps blocks' writes and open points.
    clock: AtomicI64,
    /// The first `now` given to maintenance since open (`i64::MIN` before): blocks written
    /// before report it as their last write.
    opened_at: AtomicI64,
    decoded: AtomicU64,
    packed_sent: AtomicU64,
    open_copied: AtomicU64,
    series_walked: AtomicU64,
    summaries_used: AtomicU64,
    /// Blocks a read found damaged (series id, quantum start), until the node takes them
    /// ([`Store::take_damaged`]) to have them fetched again from a replica.
    damaged: Mutex<BTreeSet<(u32, i64)>>,
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
        let found = recover::recover(&*backend, &config)?;
        let wal =
            Wal::new(backend.clone(), config.fsync, config.wal_segment_bytes, found.last_wal_seq, found.wal_segments);
        let retention = RwLock::new(config.retention.clone());
        let quotas = Mutex::new(quota::Quotas::new(&config.quotas));
        let quota_rules = RwLock::new(config.quotas.clone());
        Ok(DiskStore {
            backend,
            config,
            state: RwLock::new(found.state),
            wal,
            maint: Mutex::new(found.maint),
            retention,
            quota_rules,
            quotas,
            health: Mutex::new(found.problems),
            next_expire: AtomicI64::new(i64::MIN),
            clock: AtomicI64::new(0),
            opened_at: AtomicI64::new(i64::MIN),
            decoded: AtomicU64::new(0),
            packed_sent: AtomicU64::new(0),
            damaged: Mutex::default(),
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
            blocks_sent_packed: self.packed_sent.load(Ordering::Relaxed),
            open_points_copied: self.open_copied.load(Ordering::Relaxed),
            series_walked: self.series_walked.load(Ordering::Relaxed),
            summaries_used: self.summaries_used.load(Ordering::Relaxed),
            open_points: st.open_points as u64,
            sealed_blocks: st
                .series
                .values()
                .map(|s| s.blocks.values().filter(|b| !b.frames.is_empty()).count() as u64)
                .sum(),
            open_blocks: st
                .series
                .values()
                .map(|s| s.blocks.values().filter(|b| !b.open.is_empty()).count() as u64)
                .sum(),
            frames: st.frames as u64,
            series: st.series.len() as u64,
            wal_segments: self.wal.segments().len() as u64,
            wal_bytes: self.wal.bytes(),
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

    fn find_series_page(&self, filter: &SeriesFilter, limit: usize) -> Result<(Vec<SeriesKey>, bool), StoreError> {
        let st = self.read_state();
        let passing = st.series.values().filter(|s| s.registered && filter.matches(&s.key)).map(|s| &s.key);
        Ok(crate::smallest(passing, limit))
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

    fn aggregate(&self, series: &SeriesKey, range: TimeRange, grid: Grid) -> Result<Vec<WindowAggregate>, StoreError> {
        self.aggregate_windows(series, range, grid)
    }

    fn list_blocks(&self, after: Option<ListCursor>, limit: usize) -> Result<BlockPage, StoreError> {
        Ok(self.list_blocks_page(after, limit))
    }

    fn block_info(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<BlockInfo>, StoreError> {
        Ok(self.block_info_of(series, quantum_start))
    }

    fn read_packed(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        max_points: u64,
    ) -> Result<Option<PackedBlock>, StoreError> {
        self.read_packed_block(series, quantum_start, max_points)
    }

    fn read_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        self.read_block_page(series, quantum_start, after, limit)
    }

    fn take_damaged(&self) -> Vec<DamagedBlock> {
        self.take_damaged_blocks()
    }

    fn scrub(&self, after: Option<ListCursor>, max_frames: usize) -> Result<ScrubPage, StoreError> {
        Ok(self.scrub_page(after, max_frames))
    }

    fn drop_damaged(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<bool, StoreError> {
        self.drop_damaged_block(series, quantum_start)
    }

    fn drop_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        expected_digest: u64,
    ) -> Result<bool, StoreError> {
        self.drop_block_if(series, quantum_start, expected_digest)
    }

    fn list_registered(&self, after: Option<ListCursor>, limit: usize) -> Result<SeriesPage, StoreError> {
        Ok(self.list_registered_page(after, limit))
    }

    fn set_retention(&self, rules: Vec<RetentionRule>) {
        DiskStore::set_retention(self, rules);
    }

    fn set_quotas(&self, rules: Vec<QuotaRule>) {
        DiskStore::set_quotas(self, rules);
    }

    fn quota_use(&self) -> Vec<QuotaUse> {
        DiskStore::quota_use(self)
    }

    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        self.clock.fetch_max(now, Ordering::Relaxed);
        let _ = self.opened_at.compare_exchange(i64::MIN, now, Ordering::Relaxed, Ordering::Relaxed);
        let mut m = self.lock_maint();
        let mut report = MaintenanceReport::default();
        if m.rewrite_index {
            // Damaged edits first: later edits name frames by position, so they must build
            // on what memory holds.
            self.rewrite_index_if_bloated(&mut m, &mut report)?;
        }
        self.expire_step(&mut m, now, &mut report)?;
        self.seal_step(&mut m, Some(now), None, &mut report)?;
        self.quota_step(&mut m, now, &mut report)?;
        self.compact_step(&mut m, &mut report)?;
        self.checkpoint_step(&mut m, &mut report)?;
        self.rewrite_index_if_bloated(&mut m, &mut report)?;
        Ok(report)
    }
}

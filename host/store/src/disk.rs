//! The durable disk engine: [`DiskStore`].
//!
//! Owns the in-memory state (series dictionary, per-(series, quantum) blocks with their open
//! points and sealed location), the write path (validate, log with group commit, apply), the
//! read and aggregate paths, maintenance (seal, merge late data, retention, compaction, log
//! checkpoints, index rewrites) and recovery on open. File formats live in [`crate::frame`],
//! [`crate::block`], [`crate::wal`] and [`crate::index`]; FORMAT.md documents them.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use timeshard_proto::time::check_timestamp;
use timeshard_proto::window::check_windows;
use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, PointKey, Quantum, QuantumLen, SeriesKey, TimeRange, Timestamp};

use crate::agg::{Aggregator, Summary, WindowAggregate};
use crate::backend::{Backend, FileBackend, io_error};
use crate::block::{self, Codec};
use crate::frame;
use crate::index::{self, Edit, Image, Loc};
use crate::wal::{self, Def, Record, Wal};
use crate::{MaintenanceReport, ReadPage, Store, StoreError, WriteStats, page_start};

/// On-disk format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_PATH: &str = "FORMAT";

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// After the log is fsynced (survives power loss). Concurrent writes share one fsync.
    #[default]
    Durable,
    /// After the log is handed to the OS (survives a process crash, not a power cut).
    OsBuffered,
}

/// Keep the series whose metric starts with `metric_prefix` for `keep_ns` of event time; the
/// longest matching prefix wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionRule {
    pub metric_prefix: String,
    pub keep_ns: i64,
}

impl RetentionRule {
    pub fn new(metric_prefix: impl Into<String>, keep_ns: i64) -> RetentionRule {
        RetentionRule { metric_prefix: metric_prefix.into(), keep_ns }
    }
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
    /// What the index knows of (registered, quantum), to write only changes.
    indexed: Option<(bool, i64)>,
    expired_before: i64,
    blocks: BTreeMap<i64, Block>,
}

#[derive(Debug, Default, Clone, Copy)]
struct SegStat {
    bytes: u64,
    live: u64,
}

#[derive(Debug, Default)]
struct State {
    ids: HashMap<SeriesKey, u32>,
    series: HashMap<u32, Series>,
    next_id: u32,
    open_points: usize,
    /// Blocks with open points.
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

enum Load {
    /// The segment is gone (compacted since the location was read): look it up again.
    Gone,
    Err(StoreError),
}

enum AggView {
    Summary(i64, Summary),
    Raw(i64, Option<Loc>, Vec<Point>),
}

/// A block's open points taken for sealing: (id, quantum start, quantum length, sealed part,
/// open points).
type Snap = (u32, i64, QuantumLen, Option<Loc>, Vec<Point>);

enum Sealed {
    Put(usize, usize, Summary),
    /// The late points were all in the sealed block already.
    Contained,
    Skip,
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
        let mut problems = Vec::new();
        check_format(&*backend, &mut problems)?;

        // The index: dictionary, sealed blocks, watermarks, checkpoint.
        let mut img = Image::default();
        let mut maint = Maint::default();
        match backend.read_all(index::PATH) {
            Ok(bytes) => {
                let scan = frame::scan(&bytes, index::MAGIC);
                maint.rewrite_index = !scan.skipped.is_empty();
                for (at, n) in &scan.skipped {
                    problems.push(format!(
                        "{}: {n} damaged bytes at offset {at} skipped; the edits after them were read",
                        index::PATH
                    ));
                }
                for f in &scan.frames {
                    match index::decode(f.kind, f.body) {
                        Ok(e) => img.apply(e),
                        Err(e) => {
                            maint.rewrite_index = true;
                            problems.push(format!(
                                "{}: edit at offset {} does not decode ({e}); skipped",
                                index::PATH,
                                f.offset
                            ))
                        }
                    }
                }
                if img.version > FORMAT_VERSION {
                    return Err(StoreError::UnsupportedFormat {
                        path: index::PATH.into(),
                        found: img.version,
                        supported: FORMAT_VERSION,
                    });
                }
                if scan.valid_len < bytes.len() {
                    backend
                        .truncate(index::PATH, scan.valid_len as u64)
                        .map_err(|e| io_error(format!("cutting the torn tail of {}", index::PATH), e))?;
                }
                maint.index_len = scan.valid_len as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut out = Vec::new();
                index::put(&mut out, &Edit::Header { version: FORMAT_VERSION });
                backend
                    .append(index::PATH, &out)
                    .and_then(|_| backend.sync(index::PATH))
                    .map_err(|e| io_error(format!("creating {}", index::PATH), e))?;
                maint.index_len = out.len() as u64;
            }
            Err(e) => return Err(io_error(format!("reading {}", index::PATH), e)),
        }
        img.finish();
        problems.append(&mut img.problems);
        maint.first_live_wal = img.first_live_wal;

        let mut st = State::default();
        for (id, s) in &img.series {
            let key: SeriesKey = match s.key.parse() {
                Ok(k) => k,
                Err(e) => {
                    problems.push(format!("index: series id {id} has a bad key: {e}"));
                    continue;
                }
            };
            let quantum = QuantumLen::new(s.quantum_ns).ok();
            st.ids.insert(key.clone(), *id);
            st.series.insert(
                *id,
                Series {
                    key,
                    registered: s.registered,
                    quantum,
                    indexed: Some((s.registered, s.quantum_ns)),
                    expired_before: s.expired_before,
                    blocks: BTreeMap::new(),
                },
            );
            st.next_id = st.next_id.max(id + 1);
        }
        let seg_names = backend.list("blocks").map_err(|e| io_error("listing blocks/".into(), e))?;
        for name in &seg_names {
            if let Some(seg) = parse_seg_name(name) {
                let bytes =
                    backend.len(&seg_path(seg)).map_err(|e| io_error(format!("reading {}", seg_path(seg)), e))?;
                st.segs.insert(seg, SegStat { bytes, live: 0 });
            }
        }
        if maint.rewrite_index {
            recover_lost_puts(&*backend, &st.segs, &mut img, &mut problems);
        }
        for (&(id, start), loc) in &img.blocks {
            let Some(s) = st.series.get_mut(&id) else {
                continue;
            };
            match st.segs.get_mut(&loc.seg) {
                Some(seg) if loc.offset + u64::from(loc.len) <= seg.bytes => seg.live += u64::from(loc.len),
                _ => problems.push(format!(
                    "index: the block of {} at quantum {start} points past the end of {}; reading it \
                     will fail until it is re-replicated",
                    s.key,
                    seg_path(loc.seg)
                )),
            }
            s.blocks.insert(start, Block { sealed: Some(*loc), open_min_seg: u64::MAX, ..Block::default() });
            st.blocks += 1;
        }
        // Segments nothing points at hold only data that is also in the log (a seal that
        // crashed before its index edit): drop them.
        let referenced: BTreeSet<u32> = img.blocks.values().map(|l| l.seg).collect();
        let orphans: Vec<u32> = st.segs.keys().filter(|k| !referenced.contains(k)).copied().collect();
        for seg in orphans {
            backend.remove(&seg_path(seg)).map_err(|e| io_error(format!("removing unused {}", seg_path(seg)), e))?;
            st.segs.remove(&seg);
        }
        maint.seg = st.segs.keys().next_back().map_or(1, |s| s + 1);

        // Replay the log.
        let mut wal_segs = BTreeSet::new();
        let mut last_seq = img.first_live_wal.saturating_sub(1);
        let names = backend.list("wal").map_err(|e| io_error("listing wal/".into(), e))?;
        for name in names {
            let Some(seq) = wal::parse_segment_name(&name) else {
                continue;
            };
            let path = wal::segment_path(seq);
            last_seq = last_seq.max(seq);
            if seq < img.first_live_wal {
                // Checkpointed before a crash interrupted its removal.
                backend.remove(&path).map_err(|e| io_error(format!("removing checkpointed {path}"), e))?;
                continue;
            }
            wal_segs.insert(seq);
            let bytes = backend.read_all(&path).map_err(|e| io_error(format!("reading log segment {path}"), e))?;
            replay_segment(&mut st, seq, &path, &bytes, &mut problems)?;
        }

        for p in &problems {
            tracing::warn!(problem = %p, "store opened with a problem");
        }
        let wal = Wal::new(backend.clone(), config.fsync, last_seq, wal_segs);
        let retention = RwLock::new(config.retention.clone());
        Ok(DiskStore {
            backend,
            config,
            state: RwLock::new(st),
            wal,
            maint: Mutex::new(maint),
            retention,
            health: Mutex::new(problems),
            next_expire: AtomicI64::new(i64::MIN),
            decoded: AtomicU64::new(0),
            open_copied: AtomicU64::new(0),
            series_walked: AtomicU64::new(0),
            summaries_used: AtomicU64::new(0),
        })
    }

    /// Replaces the retention rules (applied by the next maintenance steps).
    pub fn set_retention(&self, rules: Vec<RetentionRule>) {
        *self.retention.write().unwrap_or_else(|e| e.into_inner()) = rules;
        self.next_expire.store(i64::MIN, Ordering::Relaxed);
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

    /// The summary of one block (series, quantum start) over all its points, sealed and late,
    /// computed canonically; `None` if the block holds nothing.
    pub fn block_summary(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<Summary>, StoreError> {
        for _ in 0..4 {
            let (id, sealed, open) = {
                let st = self.read_state();
                let Some(&id) = st.ids.get(series) else {
                    return Ok(None);
                };
                let Some(b) = st.series[&id].blocks.get(&quantum_start) else {
                    return Ok(None);
                };
                match (b.sealed, b.open.is_empty()) {
                    (Some(loc), true) => return Ok(Some(loc.summary)),
                    (None, _) => return Ok(Summary::of(&b.open)),
                    (Some(loc), false) => (id, loc, b.open.clone()),
                }
            };
            match self.load(id, quantum_start, &sealed) {
                Ok(pts) => return Ok(Summary::of(&union(pts, &open))),
                Err(Load::Gone) => continue,
                Err(Load::Err(e)) => return Err(e),
            }
        }
        Err(StoreError::Unavailable("block kept moving during compaction; retry".into()))
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

    /// Reads and decodes a sealed block.
    fn load(&self, id: u32, start: i64, loc: &Loc) -> Result<Vec<Point>, Load> {
        let mut out = Vec::new();
        self.load_into(id, start, loc, &mut out)?;
        Ok(out)
    }

    /// Reads and decodes a sealed block, appending its points to `out`.
    fn load_into(&self, id: u32, start: i64, loc: &Loc, out: &mut Vec<Point>) -> Result<(), Load> {
        let path = seg_path(loc.seg);
        let bytes = match self.backend.read_at(&path, loc.offset, loc.len as usize) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Load::Gone),
            Err(e) => {
                return Err(Load::Err(io_error(
                    format!("reading the block of series id {id} at quantum {start} from {path}"),
                    e,
                )));
            }
        };
        self.decoded.fetch_add(1, Ordering::Relaxed);
        let corrupt = |why: String| {
            let key = self.read_state().series.get(&id).map_or_else(|| format!("id {id}"), |s| s.key.to_string());
            Load::Err(StoreError::Corrupt(format!(
                "the block of {key} at quantum {start} ({path}, offset {}, {} bytes) is damaged: {why}; \
                 other blocks are still served; re-replicate this one from a replica",
                loc.offset, loc.len
            )))
        };
        let base = out.len();
        match block::decode_into(&bytes, out) {
            Ok(h) if h.series == id && h.quantum.start == start => Ok(()),
            Ok(h) => {
                out.truncate(base);
                Err(corrupt(format!("it holds series id {} quantum {} instead", h.series, h.quantum.start)))
            }
            Err(e) => Err(corrupt(e.0)),
        }
    }

    fn lookup(&self, series: &SeriesKey) -> Option<(u32, QuantumLen)> {
        let st = self.read_state();
        let id = *st.ids.get(series)?;
        Some((id, st.series[&id].quantum?))
    }

    /// Ids for the series of a write (creating dictionary entries), checking quantum lengths.
    /// Nothing changes if any check fails.
    fn resolve(&self, blocks: &[BlockPoints]) -> Result<Vec<u32>, StoreError> {
        let check = |st: &State, out: &mut Vec<u32>| -> Result<bool, StoreError> {
            let mut complete = true;
            let mut in_batch: HashMap<&SeriesKey, QuantumLen> = HashMap::new();
            for b in blocks {
                let stored = st
                    .ids
                    .get(&b.series)
                    .and_then(|id| st.series[id].quantum)
                    .or_else(|| in_batch.get(&b.series).copied());
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
                match st.ids.get(&b.series) {
                    Some(&id) if st.series[&id].quantum.is_some() => out.push(id),
                    _ => complete = false,
                }
            }
            Ok(complete)
        };
        let mut ids = Vec::with_capacity(blocks.len());
        if check(&self.read_state(), &mut ids)? {
            return Ok(ids);
        }
        let mut st = self.write_state();
        ids.clear();
        check(&st, &mut ids)?;
        ids.clear();
        let new: BTreeSet<&SeriesKey> = blocks.iter().map(|b| &b.series).filter(|k| !st.ids.contains_key(*k)).collect();
        self.check_room(&st, new.len())?;
        for b in blocks {
            let id = ensure_series(&mut st, &b.series);
            let s = st.series.get_mut(&id).expect("just ensured");
            if s.quantum.is_none() {
                s.quantum = Some(b.quantum.len);
                st.unindexed.insert(id);
            }
            ids.push(id);
        }
        Ok(ids)
    }

    /// Refuses to grow the dictionary past `max_series`.
    fn check_room(&self, st: &State, new: usize) -> Result<(), StoreError> {
        let cap = self.config.max_series.min(u32::MAX as usize);
        if st.ids.len() + new > cap {
            return Err(StoreError::Full(format!(
                "the series dictionary holds {} series and {new} more were asked for; the limit is \
                 {cap}: raise max_series, or use fewer distinct tag values",
                st.ids.len()
            )));
        }
        Ok(())
    }

    /// Keys of the sealed parts of the blocks a write touches (to count new points exactly).
    fn sealed_keys(&self, blocks: &[BlockPoints], ids: &[u32]) -> HashMap<(u32, i64), Vec<PointKey>> {
        let locs: Vec<(u32, i64, Loc)> = {
            let st = self.read_state();
            blocks
                .iter()
                .zip(ids)
                .filter_map(|(b, id)| {
                    let loc = st.series[id].blocks.get(&b.quantum.start)?.sealed?;
                    Some((*id, b.quantum.start, loc))
                })
                .collect()
        };
        let mut out = HashMap::new();
        for (id, start, loc) in locs {
            // A block that cannot be read only makes the count approximate.
            if let Ok(pts) = self.load(id, start, &loc) {
                out.insert((id, start), pts.iter().map(Point::key).collect());
            }
        }
        out
    }

    /// Seals blocks until open points drop below the target, if no maintenance is running.
    fn relieve_pressure(&self) {
        let Ok(mut m) = self.maint.try_lock() else {
            return;
        };
        let target = self.config.max_open_points / 4 * 3;
        let mut report = MaintenanceReport::default();
        if let Err(e) = self.seal_step(&mut m, None, Some(target), &mut report) {
            self.problem(format!("sealing to relieve memory pressure failed: {e}"));
        }
    }

    fn index_append(&self, m: &mut Maint, edits: &[Edit]) -> Result<(), StoreError> {
        if edits.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for e in edits {
            index::put(&mut buf, e);
        }
        let ctx = || format!("appending {} edits to {}", edits.len(), index::PATH);
        if m.index_torn {
            self.backend.truncate(index::PATH, m.index_len).map_err(|e| io_error(ctx(), e))?;
            m.index_torn = false;
        }
        let r = self.backend.append(index::PATH, &buf).and_then(|_| self.backend.sync(index::PATH));
        match r {
            Ok(()) => {
                m.index_len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                m.index_torn = true;
                Err(io_error(ctx(), e))
            }
        }
    }

    /// Appends frames to the current block segment and syncs it; returns (segment, offset).
    fn segment_append(&self, m: &mut Maint, buf: &[u8]) -> Result<(u32, u64), StoreError> {
        if m.seg_len > 0 && m.seg_len + buf.len() as u64 > self.config.block_segment_bytes {
            m.seg += 1;
            m.seg_len = 0;
        }
        let path = seg_path(m.seg);
        let r = self.backend.append(&path, buf).and_then(|at| self.backend.sync(&path).map(|()| at));
        match r {
            Ok(at) => {
                m.seg_len = at + buf.len() as u64;
                let mut st = self.write_state();
                st.segs.entry(m.seg).or_default().bytes = m.seg_len;
                Ok((m.seg, at))
            }
            Err(e) => {
                // Never append after torn bytes: the next seal starts a new segment.
                let _ = self.backend.truncate(&path, m.seg_len);
                m.seg += 1;
                m.seg_len = 0;
                Err(io_error(format!("writing {} bytes of sealed blocks to {path}", buf.len()), e))
            }
        }
    }

    /// Seals due blocks (quantum ended plus grace, or over the size cap), or under memory
    /// pressure the oldest blocks until `pressure_target` open points remain.
    fn seal_step(
        &self,
        m: &mut Maint,
        now: Option<Timestamp>,
        pressure_target: Option<usize>,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        let grace = self.config.seal_grace_ns;
        // (quantum start, series id, open points, points the seal decodes and encodes).
        let mut picked: Vec<(i64, u32, usize, usize)> = {
            let st = self.read_state();
            let mut c = Vec::new();
            // Open points the memory valve cannot relieve: blocks the last seal left open.
            let mut stuck = 0;
            for &(id, start) in &st.dirty {
                let s = &st.series[&id];
                let b = &s.blocks[&start];
                if pressure_target.is_some() && b.stuck {
                    // Retried by regular maintenance, not in the write path at every write.
                    stuck += b.open.len();
                    continue;
                }
                let len = s.quantum.map_or(0, QuantumLen::ns);
                let due = now.is_some_and(|n| start.saturating_add(len).saturating_add(grace) <= n)
                    || b.open.len() >= self.config.max_block_points;
                if due || pressure_target.is_some() {
                    let sealed = b.sealed.map_or(0, |l| usize::try_from(l.summary.count).unwrap_or(usize::MAX));
                    c.push((start, id, b.open.len(), b.open.len().saturating_add(sealed)));
                }
            }
            if let Some(target) = pressure_target {
                c.sort_unstable();
                let mut left = st.open_points - stuck;
                let n = c
                    .iter()
                    .take_while(|(_, _, n, _)| {
                        let go = left > target;
                        left = left.saturating_sub(*n);
                        go
                    })
                    .count();
                c.truncate(n);
            }
            c
        };
        // A re-seal holds the whole block, so the budget counts its sealed points too.
        let mut budget = self.config.step_max_points;
        let n = picked
            .iter()
            .take_while(|(_, _, _, n)| {
                let go = budget > 0;
                budget = budget.saturating_sub(*n);
                go
            })
            .count()
            .min(8192);
        if n < picked.len() {
            report.more = true;
            picked.truncate(n);
        }
        if picked.is_empty() {
            return Ok(());
        }

        // Snapshot the open points.
        let snaps: Vec<Snap> = {
            let mut st = self.write_state();
            picked
                .iter()
                .filter_map(|&(start, id, _, _)| {
                    let s = st.series.get_mut(&id)?;
                    let len = s.quantum?;
                    let b = s.blocks.get_mut(&start)?;
                    b.snap_min_seg = Some(u64::MAX);
                    Some((id, start, len, b.sealed, b.open.clone()))
                })
                .collect()
        };

        // Build the new frames, unlocked.
        let mut buf = Vec::new();
        let mut outcome = Vec::with_capacity(snaps.len());
        for (id, start, len, sealed, open) in &snaps {
            let merged = match sealed {
                None => open.clone(),
                Some(loc) => match self.load(*id, *start, loc) {
                    Ok(old) => {
                        let n_old = old.len();
                        let u = union(old, open);
                        if u.len() == n_old {
                            outcome.push(Sealed::Contained);
                            continue;
                        }
                        u
                    }
                    Err(e) => {
                        let why = match e {
                            Load::Gone => "its segment moved".to_string(),
                            Load::Err(e) => e.to_string(),
                        };
                        self.problem(format!(
                            "late points of series id {id} at quantum {start} stay unmerged (in memory \
                             and the log): {why}"
                        ));
                        outcome.push(Sealed::Skip);
                        continue;
                    }
                },
            };
            if merged.len() > block::MAX_POINTS {
                self.problem(format!(
                    "series id {id} quantum {start} holds {} points, more than a block may ({}); its \
                     newest points stay in memory and the log: use a shorter quantum for this class",
                    merged.len(),
                    block::MAX_POINTS
                ));
                outcome.push(Sealed::Skip);
                continue;
            }
            let q = Quantum::at(*start, *len).expect("block starts are aligned");
            let at = buf.len();
            let summary = block::encode(&mut buf, *id, q, &merged, self.config.codec);
            if buf.len() - at > frame::MAX_PAYLOAD {
                // Readers refuse frames this large; keep the points open instead.
                buf.truncate(at);
                self.problem(format!(
                    "series id {id} quantum {start}: {} points encode to more than a block may hold \
                     ({} bytes); they stay in memory and the log: use a shorter quantum for this class",
                    merged.len(),
                    frame::MAX_PAYLOAD
                ));
                outcome.push(Sealed::Skip);
                continue;
            }
            outcome.push(Sealed::Put(at, buf.len() - at, summary));
        }

        let written = if buf.is_empty() { Ok(None) } else { self.segment_append(m, &buf).map(Some) };
        let written = written.and_then(|w| {
            let Some((seg, base)) = w else {
                return Ok(None);
            };
            // A block's series must be in the index before the block is.
            let ids: BTreeSet<u32> = snaps.iter().map(|s| s.0).collect();
            let mut edits = self.unindexed_series(Some(&ids));
            edits.extend(snaps.iter().zip(&outcome).filter_map(|((id, start, ..), o)| match o {
                Sealed::Put(at, n, summary) => Some(Edit::Put {
                    id: *id,
                    start: *start,
                    loc: Loc { seg, offset: base + *at as u64, len: *n as u32, summary: *summary },
                }),
                _ => None,
            }));
            self.index_append(m, &edits)?;
            self.mark_indexed(&edits);
            Ok(Some((seg, base)))
        });

        // Apply (or, after a failure, just end the snapshots: the points stay open).
        let mut st = self.write_state();
        let failed = written.is_err();
        for ((id, start, _, _, snap), o) in snaps.iter().zip(&outcome) {
            let st = &mut *st;
            let Some(b) = st.series.get_mut(id).and_then(|s| s.blocks.get_mut(start)) else {
                continue;
            };
            let min_since = b.snap_min_seg.take().unwrap_or(u64::MAX);
            if failed {
                continue;
            }
            b.stuck = matches!(o, Sealed::Skip);
            if b.stuck {
                continue;
            }
            if let (Sealed::Put(at, n, summary), Ok(Some((seg, base)))) = (o, &written) {
                let loc = Loc { seg: *seg, offset: base + *at as u64, len: *n as u32, summary: *summary };
                if let Some(old) = b.sealed.replace(loc)
                    && let Some(s) = st.segs.get_mut(&old.seg)
                {
                    s.live = s.live.saturating_sub(u64::from(old.len));
                }
                st.segs.entry(*seg).or_default().live += *n as u64;
                report.sealed_blocks += 1;
                report.sealed_points += summary.count;
            }
            let before = b.open.len();
            if b.open.len() == snap.len() {
                // Open points only grow while sealing, so equal length means the same set.
                b.open = Vec::new();
            } else {
                b.open = difference(&b.open, snap);
            }
            st.open_points -= before - b.open.len();
            if b.open.is_empty() {
                b.open_min_seg = u64::MAX;
                st.dirty.remove(&(*id, *start));
            } else {
                b.open_min_seg = min_since;
            }
        }
        written.map(|_| ())
    }

    fn expire_step(&self, m: &mut Maint, now: Timestamp, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        const MAX_BLOCKS: usize = 10_000;
        let rules = self.retention.read().unwrap_or_else(|e| e.into_inner()).clone();
        if rules.is_empty() || now < self.next_expire.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Retention walks every series: run it about every hundredth of the shortest keep
        // (at most once a minute), not at every step.
        let shortest = rules.iter().map(|r| r.keep_ns.max(0)).min().unwrap_or(0);
        let next = now.saturating_add((shortest / 100).min(60_000_000_000));
        self.next_expire.store(next, Ordering::Relaxed);
        let todo: Vec<(u32, i64)> = {
            let st = self.read_state();
            let mut todo = Vec::new();
            let mut blocks = 0;
            self.series_walked.fetch_add(st.series.len() as u64, Ordering::Relaxed);
            for (&id, s) in &st.series {
                let Some(rule) = rules
                    .iter()
                    .filter(|r| s.key.metric().starts_with(&r.metric_prefix))
                    .max_by_key(|r| r.metric_prefix.len())
                else {
                    continue;
                };
                let (Some(len), Some((&first, _))) = (s.quantum, s.blocks.first_key_value()) else {
                    continue;
                };
                let cutoff = now.saturating_sub(rule.keep_ns.max(0));
                if first.saturating_add(len.ns()) > cutoff {
                    continue;
                }
                // Bound the work: stop at the end of the MAX_BLOCKS-th expired block.
                let expired: Vec<i64> = s
                    .blocks
                    .range(..=cutoff.saturating_sub(len.ns()))
                    .map(|(&k, _)| k)
                    .take(MAX_BLOCKS - blocks)
                    .collect();
                let before = match expired.last() {
                    Some(&last) if expired.len() == MAX_BLOCKS - blocks => {
                        report.more = true;
                        last + len.ns()
                    }
                    _ => cutoff,
                };
                blocks += expired.len();
                todo.push((id, before));
                if blocks >= MAX_BLOCKS {
                    report.more = true;
                    break;
                }
            }
            if report.more {
                // Bounded: continue at the next step.
                self.next_expire.store(i64::MIN, Ordering::Relaxed);
            }
            todo
        };
        if todo.is_empty() {
            return Ok(());
        }
        let edits: Vec<Edit> = todo.iter().map(|&(id, before)| Edit::Expire { id, before }).collect();
        self.index_append(m, &edits)?;
        let mut st = self.write_state();
        let st = &mut *st;
        for (id, before) in todo {
            let Some(s) = st.series.get_mut(&id) else {
                continue;
            };
            let len = s.quantum.map_or(1, QuantumLen::ns);
            s.expired_before = s.expired_before.max(before);
            let keep = s.blocks.split_off(&(before - len + 1));
            let gone = std::mem::replace(&mut s.blocks, keep);
            st.blocks -= gone.len();
            for (start, b) in gone {
                st.open_points -= b.open.len();
                st.dirty.remove(&(id, start));
                if let Some(loc) = b.sealed
                    && let Some(seg) = st.segs.get_mut(&loc.seg)
                {
                    seg.live = seg.live.saturating_sub(u64::from(loc.len));
                }
                report.expired_blocks += 1;
            }
        }
        Ok(())
    }

    fn compact_step(&self, m: &mut Maint, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        let (seg, live) = {
            let st = self.read_state();
            let Some((&seg, _)) =
                st.segs.iter().find(|&(&k, s)| k != m.seg && !m.stuck.contains(&k) && s.live * 2 < s.bytes)
            else {
                return Ok(());
            };
            // Every block still pointing into the segment, even when the live byte count says
            // none: that count leaves out blocks found damaged at open, and a segment is only
            // deleted once nothing refers to it.
            let live: Vec<(u32, i64, Loc)> = st
                .series
                .iter()
                .flat_map(|(&id, s)| {
                    s.blocks
                        .iter()
                        .filter_map(move |(&start, b)| b.sealed.filter(|l| l.seg == seg).map(|l| (id, start, l)))
                })
                .collect();
            (seg, live)
        };
        let path = seg_path(seg);
        if !live.is_empty() {
            let mut buf = Vec::new();
            let mut placed = Vec::new();
            for (id, start, loc) in &live {
                // A block that cannot be read or is damaged keeps its segment as it is (for a
                // repair from a replica); failing here instead would stop every later
                // maintenance step, and with it sealing and log checkpoints, for good.
                let checked = self
                    .backend
                    .read_at(&path, loc.offset, loc.len as usize)
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| block::decode_header(&bytes).map(|_| bytes).map_err(|e| e.to_string()));
                let bytes = match checked {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        m.stuck.insert(seg);
                        self.problem(format!(
                            "{path} is kept uncompacted: the block of series id {id} at quantum {start} \
                             (offset {}) is damaged or unreadable: {e}",
                            loc.offset
                        ));
                        report.more = true;
                        return Ok(());
                    }
                };
                placed.push((*id, *start, *loc, buf.len()));
                buf.extend_from_slice(&bytes);
            }
            let (new_seg, base) = self.segment_append(m, &buf)?;
            let edits: Vec<Edit> = placed
                .iter()
                .map(|&(id, start, loc, at)| Edit::Put {
                    id,
                    start,
                    loc: Loc { seg: new_seg, offset: base + at as u64, ..loc },
                })
                .collect();
            self.index_append(m, &edits)?;
            let mut st = self.write_state();
            let st = &mut *st;
            for (id, start, loc, at) in placed {
                if let Some(b) = st.series.get_mut(&id).and_then(|s| s.blocks.get_mut(&start))
                    && b.sealed == Some(loc)
                {
                    b.sealed = Some(Loc { seg: new_seg, offset: base + at as u64, ..loc });
                    st.segs.entry(new_seg).or_default().live += u64::from(loc.len);
                }
            }
        }
        self.write_state().segs.remove(&seg);
        self.backend.remove(&path).map_err(|e| io_error(format!("removing compacted {path}"), e))?;
        report.compacted_segments += 1;
        report.more = true;
        Ok(())
    }

    /// Dictionary entries (of `ids`, or all) whose latest state the index does not hold yet.
    fn unindexed_series(&self, ids: Option<&BTreeSet<u32>>) -> Vec<Edit> {
        let st = self.read_state();
        let ids = ids.unwrap_or(&st.unindexed);
        self.series_walked.fetch_add(ids.len() as u64, Ordering::Relaxed);
        ids.iter()
            .filter_map(|&id| {
                let s = st.series.get(&id)?;
                let now = (s.registered, s.quantum.map_or(0, QuantumLen::ns));
                (s.indexed != Some(now)).then(|| Edit::Series {
                    id,
                    registered: now.0,
                    quantum_ns: now.1,
                    key: s.key.to_string(),
                })
            })
            .collect()
    }

    /// Records that the index now holds these dictionary entries.
    fn mark_indexed(&self, edits: &[Edit]) {
        let mut st = self.write_state();
        for e in edits {
            if let Edit::Series { id, registered, quantum_ns, .. } = e {
                set_indexed(&mut st, *id, (*registered, *quantum_ns));
            }
        }
    }

    /// Logs again, in the current log segment, the open points of blocks that sealing left
    /// open and that hold older segments: otherwise one block that can never be sealed would
    /// keep every log segment since its first late point, and the log would grow without bound.
    /// Only blocks two segments behind are carried, so stuck points are logged again about once
    /// per segment rotation (carrying into the segment just rotated away from would rotate, and
    /// carry, at every step when the stuck points alone fill a segment).
    fn carry_stuck_forward(&self) -> Result<(), StoreError> {
        let pinned = self.wal.first_pinned();
        let todo: Vec<(u32, i64)> = {
            let st = self.read_state();
            st.dirty
                .iter()
                .filter(|(id, start)| {
                    let b = &st.series[id].blocks[start];
                    b.stuck && b.open_min_seg.saturating_add(1) < pinned
                })
                .copied()
                .collect()
        };
        for (id, start) in todo {
            let snap = {
                let mut st = self.write_state();
                let s = st.series.get_mut(&id).expect("dirty blocks exist");
                let (key, len) = (s.key.clone(), s.quantum.expect("a series with blocks has a quantum"));
                let b = s.blocks.get_mut(&start).expect("dirty blocks exist");
                b.snap_min_seg = Some(u64::MAX);
                (key, len, b.open.clone())
            };
            let (key, len, open) = snap;
            let q = Quantum::at(start, len).expect("block starts are aligned");
            let mut data = Vec::with_capacity(open.len() * 12 + 32);
            wal::put_points(&mut data, id, q, &open);
            let r = self.wal.commit(vec![Def { id, registered: false, key }], &data);
            let mut st = self.write_state();
            if let Some(b) = st.series.get_mut(&id).and_then(|s| s.blocks.get_mut(&start)) {
                let since = b.snap_min_seg.take().unwrap_or(u64::MAX);
                if let Ok(seq) = r {
                    // The snapshot is now in `seq`; points added meanwhile are in `since`.
                    b.open_min_seg = seq.min(since);
                }
            }
            drop(st);
            self.wal.applied(r?);
        }
        Ok(())
    }

    fn checkpoint_step(&self, m: &mut Maint, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        self.carry_stuck_forward()?;
        // The log's pins first, then the blocks': a write applied in between is seen by one.
        let pinned = self.wal.first_pinned();
        let (open_min, idle) = {
            let st = self.read_state();
            let open_min =
                st.dirty.iter().map(|(id, start)| st.series[id].blocks[start].open_min_seg).min().unwrap_or(u64::MAX);
            (open_min, st.dirty.is_empty())
        };
        let series_edits = self.unindexed_series(None);
        let first_live = pinned.min(open_min);
        let segs = self.wal.segments();
        if segs.first().is_some_and(|&s| s < first_live) {
            let mut edits = series_edits;
            edits.push(Edit::Checkpoint { first_live_wal: first_live });
            self.index_append(m, &edits)?;
            m.first_live_wal = first_live;
            self.mark_indexed(&edits);
            report.wal_segments_removed += self.wal.remove_before(first_live)?;
        }
        // Rotate a big segment, or an idle one, so a later step can remove it.
        if (self.wal.current_len() > self.config.wal_segment_bytes || idle) && self.wal.rotate() {
            report.more = true;
        }
        Ok(())
    }

    fn rewrite_index_if_bloated(&self, m: &mut Maint, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        let (blocks, series) = {
            let st = self.read_state();
            (st.blocks, st.series.len())
        };
        let live_estimate = (blocks * 90 + series * 60) as u64;
        if !m.rewrite_index && (m.index_len < self.config.index_rewrite_bytes || m.index_len < 4 * live_estimate) {
            return Ok(());
        }
        let mut buf = Vec::new();
        let mut marks = Vec::new();
        {
            let st = self.read_state();
            index::put(&mut buf, &Edit::Header { version: FORMAT_VERSION });
            for (&id, s) in &st.series {
                let q = s.quantum.map_or(0, QuantumLen::ns);
                index::put(
                    &mut buf,
                    &Edit::Series { id, registered: s.registered, quantum_ns: q, key: s.key.to_string() },
                );
                marks.push((id, (s.registered, q)));
                if s.expired_before > 0 {
                    index::put(&mut buf, &Edit::Expire { id, before: s.expired_before });
                }
                for (&start, b) in &s.blocks {
                    if let Some(loc) = b.sealed {
                        index::put(&mut buf, &Edit::Put { id, start, loc });
                    }
                }
            }
            index::put(&mut buf, &Edit::Checkpoint { first_live_wal: m.first_live_wal });
        }
        self.backend.write_atomic(index::PATH, &buf).map_err(|e| io_error(format!("rewriting {}", index::PATH), e))?;
        m.index_len = buf.len() as u64;
        m.index_torn = false;
        m.rewrite_index = false;
        report.index_rewrites += 1;
        let mut st = self.write_state();
        for (id, mark) in marks {
            set_indexed(&mut st, id, mark);
        }
        Ok(())
    }

    /// Collects the points of blocks starting at `cursor`, up to `want` points at or after
    /// `from` and before `end`.
    fn collect(
        &self,
        id: u32,
        mut cursor: i64,
        from: PointKey,
        end: Timestamp,
        want: usize,
    ) -> Result<Vec<Point>, StoreError> {
        let mut out: Vec<Point> = Vec::new();
        let mut retries = 0;
        'outer: while out.len() < want {
            let views: Vec<(i64, Option<Loc>, Vec<Point>)> = {
                let st = self.read_state();
                let Some(s) = st.series.get(&id) else { break };
                // Copy no more open points than the page can still take: the first `left`
                // points of a block's union are among the first `left` of its open points, and
                // once earlier blocks supply `left` points the later ones are not needed. (A
                // copy of the rest of a large open block per page made paging quadratic, all
                // of it under the state lock.)
                let mut left = want - out.len();
                let mut views = Vec::new();
                for (&start, b) in s.blocks.range(cursor..end).take(64) {
                    if left == 0 {
                        break;
                    }
                    let lo = b.open.partition_point(|p| p.key() < from);
                    let hi = b.open.partition_point(|p| p.ts < end).max(lo).min(lo.saturating_add(left));
                    left -= hi - lo;
                    self.open_copied.fetch_add((hi - lo) as u64, Ordering::Relaxed);
                    views.push((start, b.sealed, b.open[lo..hi].to_vec()));
                }
                views
            };
            if views.is_empty() {
                break;
            }
            for (start, sealed, open) in views {
                let base = out.len();
                let r = match (sealed, open.is_empty()) {
                    (None, _) => {
                        out.extend_from_slice(&open);
                        Ok(())
                    }
                    // The common case: decode straight into the result.
                    (Some(loc), true) => self.load_into(id, start, &loc, &mut out),
                    (Some(loc), false) => self.load(id, start, &loc).map(|p| {
                        out.extend_from_slice(&union(p, &open));
                    }),
                };
                match r {
                    Ok(()) => {}
                    Err(Load::Gone) if retries < 8 => {
                        retries += 1;
                        cursor = start;
                        continue 'outer;
                    }
                    Err(Load::Gone) => {
                        return Err(StoreError::Unavailable(
                            "blocks kept moving during compaction; retry the read".into(),
                        ));
                    }
                    Err(Load::Err(e)) => return Err(e),
                }
                // Trim this block's points to [from, end) and to what is still wanted.
                let added = &out[base..];
                let lo = added.partition_point(|p| p.key() < from);
                let hi = added.partition_point(|p| p.ts < end);
                let keep_end = base + hi.min(lo + (want - base));
                out.truncate(keep_end.max(base + lo));
                if lo > 0 {
                    out.drain(base..base + lo);
                }
                cursor = start + 1;
                if out.len() >= want {
                    break 'outer;
                }
            }
        }
        Ok(out)
    }

    fn commit_and_apply(
        &self,
        defs: Vec<Def>,
        data: &[u8],
        apply: impl FnOnce(&mut State, u64) -> u64,
    ) -> Result<u64, StoreError> {
        let seq = self.wal.commit(defs, data)?;
        let n = apply(&mut self.write_state(), seq);
        self.wal.applied(seq);
        Ok(n)
    }
}

/// Records that the index holds `mark` for series `id`.
fn set_indexed(st: &mut State, id: u32, mark: (bool, i64)) {
    if let Some(s) = st.series.get_mut(&id) {
        s.indexed = Some(mark);
        if (s.registered, s.quantum.map_or(0, QuantumLen::ns)) == mark {
            st.unindexed.remove(&id);
        }
    }
}

fn ensure_series(st: &mut State, key: &SeriesKey) -> u32 {
    if let Some(&id) = st.ids.get(key) {
        return id;
    }
    let id = st.next_id;
    st.next_id += 1;
    st.ids.insert(key.clone(), id);
    st.unindexed.insert(id);
    st.series.insert(
        id,
        Series {
            key: key.clone(),
            registered: false,
            quantum: None,
            indexed: None,
            expired_before: 0,
            blocks: BTreeMap::new(),
        },
    );
    id
}

/// Merges sorted, deduplicated `points` into block (id, quantum) as open points logged in
/// segment `seq`. Returns how many were new, not counting those in `sealed` (sorted keys).
fn apply_points(
    st: &mut State,
    id: u32,
    quantum: Quantum,
    points: &[Point],
    seq: u64,
    sealed: Option<&[PointKey]>,
) -> u64 {
    let Some(s) = st.series.get_mut(&id) else {
        return 0;
    };
    if quantum.end() <= s.expired_before || points.is_empty() {
        return 0;
    }
    let b = match s.blocks.entry(quantum.start) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => {
            st.blocks += 1;
            e.insert(Block { open_min_seg: u64::MAX, ..Block::default() })
        }
    };
    let before = b.open.len();
    // Points new to the block: not open yet and, for late data, not in the sealed part.
    let new_vs_sealed = sealed.map(|keys| {
        points.iter().filter(|p| keys.binary_search(&p.key()).is_err() && b.open.binary_search(p).is_err()).count()
            as u64
    });
    b.open = union(std::mem::take(&mut b.open), points);
    let added = b.open.len() - before;
    let new = new_vs_sealed.unwrap_or(added as u64);
    if added > 0 {
        b.open_min_seg = b.open_min_seg.min(seq);
        if let Some(m) = &mut b.snap_min_seg {
            *m = (*m).min(seq);
        }
        st.open_points += added;
        st.dirty.insert((id, quantum.start));
    }
    new
}

/// After damage in the index, finds the sealed blocks whose put edits were lost: block frames
/// name their series and quantum and carry their summary, so every block segment is scanned
/// and the last frame of each (series, quantum) the index no longer lists is listed again.
/// (Without this the block is hidden at once and deleted by the next compaction of its
/// segment.) A frame left by a seal whose put never made it holds acknowledged points too, so
/// taking it is harmless; retention watermarks still apply.
fn recover_lost_puts(
    backend: &dyn Backend,
    segs: &BTreeMap<u32, SegStat>,
    img: &mut Image,
    problems: &mut Vec<String>,
) {
    let mut found: BTreeMap<(u32, i64), (i64, Loc)> = BTreeMap::new();
    for &seg in segs.keys() {
        let path = seg_path(seg);
        let bytes = match backend.read_all(&path) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("{path}: not read to look for blocks the damaged index lost: {e}"));
                continue;
            }
        };
        for f in frame::scan(&bytes, block::MAGIC).frames {
            let Ok(h) = block::decode_header(&bytes[f.offset..f.offset + f.len]) else {
                continue;
            };
            let (Ok(offset), Ok(len)) = (u64::try_from(f.offset), u32::try_from(f.len)) else {
                continue;
            };
            // Frames are appended in order and compaction copies only live ones, so a later
            // frame of a block is a newer version of it.
            found.insert(
                (h.series, h.quantum.start),
                (h.quantum.len.ns(), Loc { seg, offset, len, summary: h.summary }),
            );
        }
    }
    let mut recovered = 0;
    for ((id, start), (len, loc)) in found {
        let Some(s) = img.series.get(&id) else {
            continue;
        };
        if len != s.quantum_ns || start.saturating_add(len) <= s.expired_before {
            continue;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = img.blocks.entry((id, start)) {
            e.insert(loc);
            recovered += 1;
        }
    }
    if recovered > 0 {
        problems.push(format!(
            "{}: {recovered} sealed blocks whose edits were damaged were found again in their segments",
            index::PATH
        ));
    }
}

fn check_format(backend: &dyn Backend, problems: &mut Vec<String>) -> Result<(), StoreError> {
    match backend.read_all(FORMAT_PATH) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let version =
                text.lines().find_map(|l| l.strip_prefix("format ")).and_then(|v| v.trim().parse::<u32>().ok());
            match version {
                Some(v) if v > FORMAT_VERSION => {
                    Err(StoreError::UnsupportedFormat { path: FORMAT_PATH.into(), found: v, supported: FORMAT_VERSION })
                }
                Some(_) => Ok(()),
                None => Err(StoreError::Corrupt(format!(
                    "{FORMAT_PATH} does not name a format version (it reads {text:?}); this does not \
                     look like a timeshard data directory"
                ))),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let existing = backend.list("wal").map_err(|e| io_error("listing wal/".into(), e))?;
            if !existing.is_empty() || backend.len(index::PATH).is_ok() {
                problems.push(format!(
                    "{FORMAT_PATH} was missing in a data directory with data; assumed format {FORMAT_VERSION}"
                ));
            }
            let body = format!("timeshard-store\nformat {FORMAT_VERSION}\n");
            backend
                .write_atomic(FORMAT_PATH, body.as_bytes())
                .map_err(|e| io_error(format!("creating {FORMAT_PATH}"), e))
        }
        Err(e) => Err(io_error(format!("reading {FORMAT_PATH}"), e)),
    }
}

fn replay_segment(
    st: &mut State,
    seq: u64,
    path: &str,
    bytes: &[u8],
    problems: &mut Vec<String>,
) -> Result<(), StoreError> {
    let scan = frame::scan(bytes, wal::MAGIC);
    for (at, n) in &scan.skipped {
        problems
            .push(format!("{path}: {n} damaged bytes at offset {at} skipped; the records after them were replayed"));
    }
    // Ids of this segment's definitions, which may differ from ours if the dictionary lost an
    // entry; map them through the key.
    let mut local: HashMap<u32, u32> = HashMap::new();
    for f in &scan.frames {
        let rec = match wal::decode(f.kind, f.body) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{path}: record at offset {} does not decode ({e}); skipped", f.offset));
                continue;
            }
        };
        match rec {
            Record::Header { version, .. } if version > wal::VERSION => {
                return Err(StoreError::UnsupportedFormat {
                    path: path.into(),
                    found: version,
                    supported: wal::VERSION,
                });
            }
            Record::Header { .. } => {}
            Record::Series { id, registered, key } => match key.parse::<SeriesKey>() {
                Ok(k) => {
                    let ours = match st.series.get(&id) {
                        Some(s) if s.key == k => id,
                        None if !st.ids.contains_key(&k) => {
                            st.ids.insert(k.clone(), id);
                            st.unindexed.insert(id);
                            st.series.insert(
                                id,
                                Series {
                                    key: k.clone(),
                                    registered: false,
                                    quantum: None,
                                    indexed: None,
                                    expired_before: 0,
                                    blocks: BTreeMap::new(),
                                },
                            );
                            st.next_id = st.next_id.max(id + 1);
                            id
                        }
                        _ => ensure_series(st, &k),
                    };
                    if registered && let Some(s) = st.series.get_mut(&ours) {
                        s.registered = true;
                        st.unindexed.insert(ours);
                    }
                    local.insert(id, ours);
                }
                Err(e) => problems.push(format!("{path}: series id {id} has a bad key: {e}")),
            },
            Record::Points { id, quantum, mut points } => {
                let Some(&ours) = local.get(&id) else {
                    problems.push(format!(
                        "{path}: {} points of series id {id}, which the segment never defined; skipped",
                        points.len()
                    ));
                    continue;
                };
                let s = st.series.get_mut(&ours).expect("mapped ids exist");
                match s.quantum {
                    Some(l) if l != quantum.len => {
                        problems.push(format!(
                            "{path}: points of {} in quanta of {} ns, but the series uses {} ns; skipped",
                            s.key,
                            quantum.len.ns(),
                            l.ns()
                        ));
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        s.quantum = Some(quantum.len);
                        st.unindexed.insert(ours);
                    }
                }
                timeshard_proto::point::sort_dedup(&mut points);
                apply_points(st, ours, quantum, &points, seq, None);
            }
        }
    }
    Ok(())
}

impl Store for DiskStore {
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError> {
        let total: usize = blocks.iter().map(|b| b.points.len()).sum();
        if total == 0 {
            return Ok(WriteStats::default());
        }
        if total > self.config.max_write_points {
            return Err(StoreError::InvalidInput(format!(
                "a write of {total} points exceeds the limit of {}; split it into smaller batches",
                self.config.max_write_points
            )));
        }
        for b in blocks {
            for p in &b.points {
                if !b.quantum.contains(p.ts) || check_timestamp(p.ts).is_err() {
                    return Err(StoreError::InvalidInput(format!(
                        "point at {} ns of {} lies outside its quantum [{}, {}) or the accepted \
                         timestamps; nothing of this write was stored",
                        p.ts,
                        b.series,
                        b.quantum.start,
                        b.quantum.end()
                    )));
                }
            }
        }
        let ids = self.resolve(blocks)?;
        let known = self.sealed_keys(blocks, &ids);
        let mut data = Vec::with_capacity(total * 12 + blocks.len() * 48);
        let mut defs: Vec<Def> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut sorted = Vec::with_capacity(blocks.len());
        for (b, &id) in blocks.iter().zip(&ids) {
            if b.points.is_empty() {
                continue;
            }
            if seen.insert(id) {
                defs.push(Def { id, registered: false, key: b.series.clone() });
            }
            wal::put_points(&mut data, id, b.quantum, &b.points);
            let mut pts = b.points.clone();
            timeshard_proto::point::sort_dedup(&mut pts);
            sorted.push((id, b.quantum, pts));
        }
        let new_points = self.commit_and_apply(defs, &data, |st, seq| {
            sorted
                .iter()
                .map(|(id, q, pts)| {
                    let k = known.get(&(*id, q.start)).map(Vec::as_slice);
                    apply_points(st, *id, *q, pts, seq, k)
                })
                .sum()
        })?;
        if self.read_state().open_points > self.config.max_open_points {
            self.relieve_pressure();
        }
        Ok(WriteStats { new_points })
    }

    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let from = page_start(&range, after);
        let Some((id, len)) = self.lookup(series) else {
            return Ok(ReadPage::default());
        };
        if from.ts >= range.end() {
            return Ok(ReadPage::default());
        }
        let cursor = len.quantum_of(from.ts).start;
        let mut points = self.collect(id, cursor, from, range.end(), limit.saturating_add(1))?;
        let more = points.len() > limit;
        points.truncate(limit);
        Ok(ReadPage { points, more })
    }

    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        let todo: Vec<Def> = {
            let mut st = self.write_state();
            let new: BTreeSet<&SeriesKey> = series.iter().filter(|k| !st.ids.contains_key(*k)).collect();
            self.check_room(&st, new.len())?;
            series
                .iter()
                .filter_map(|k| {
                    let id = ensure_series(&mut st, k);
                    (!st.series[&id].registered).then(|| Def { id, registered: true, key: k.clone() })
                })
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        let ids: Vec<u32> = todo.iter().map(|d| d.id).collect();
        self.commit_and_apply(todo, &[], |st, _| {
            for id in ids {
                if let Some(s) = st.series.get_mut(&id) {
                    s.registered = true;
                    st.unindexed.insert(id);
                }
            }
            0
        })?;
        Ok(())
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
        check_windows(&range, window_ns).map_err(StoreError::InvalidInput)?;
        let Some((id, len)) = self.lookup(series) else {
            return Ok(Vec::new());
        };
        let mut agg = Aggregator::new(range, window_ns);
        let mut cursor = len.quantum_of(range.start()).start;
        let mut retries = 0;
        'outer: loop {
            let views: Vec<AggView> = {
                let st = self.read_state();
                let Some(s) = st.series.get(&id) else { break };
                s.blocks
                    .range(cursor..range.end())
                    .take(1024)
                    .map(|(&start, b)| {
                        let whole = agg.fits_one_window(start, start + len.ns());
                        match (b.sealed, b.open.is_empty()) {
                            (Some(loc), true) if whole => AggView::Summary(start, loc.summary),
                            (None, false) if whole => {
                                AggView::Summary(start, Summary::of(&b.open).expect("open is not empty"))
                            }
                            _ => {
                                let lo = b.open.partition_point(|p| p.ts < range.start());
                                let hi = b.open.partition_point(|p| p.ts < range.end());
                                AggView::Raw(start, b.sealed, b.open[lo..hi.max(lo)].to_vec())
                            }
                        }
                    })
                    .collect()
            };
            if views.is_empty() {
                break;
            }
            for v in views {
                match v {
                    AggView::Summary(start, s) => {
                        self.summaries_used.fetch_add(1, Ordering::Relaxed);
                        agg.push_summary(agg.window_of(start), &s);
                        cursor = start + 1;
                    }
                    AggView::Raw(start, sealed, open) => {
                        let pts = match sealed {
                            None => open,
                            Some(loc) => match self.load(id, start, &loc) {
                                Ok(p) => union(p, &open),
                                Err(Load::Gone) if retries < 8 => {
                                    retries += 1;
                                    cursor = start;
                                    continue 'outer;
                                }
                                Err(Load::Gone) => {
                                    return Err(StoreError::Unavailable(
                                        "blocks kept moving during compaction; retry".into(),
                                    ));
                                }
                                Err(Load::Err(e)) => return Err(e),
                            },
                        };
                        agg.push_points(&pts);
                        cursor = start + 1;
                    }
                }
            }
        }
        Ok(agg.finish())
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

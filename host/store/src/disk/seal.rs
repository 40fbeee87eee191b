//! Maintenance that writes block segments and the index log: sealing open points into
//! compressed frames (checkpoint frames while a block's quantum lasts, merged into as few
//! frames as possible once it ended, late data included), compacting segments that are mostly
//! dead, appending index edits (raising the format version first when one needs it), and
//! rewriting a bloated index as a snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use timeshard_proto::{Point, Quantum, QuantumLen, Timestamp};

use super::read::Load;
use super::{Block, DictEntry, DiskStore, Frames, Maint, State, difference, digest_of, seg_path, union};
use crate::agg::Summary;
use crate::backend::io_error;
use crate::block;
use crate::frame;
use crate::index::{self, Edit, Loc};
use crate::{MaintenanceReport, StoreError};

/// A block a seal step may seal. Ordered by quantum start first: under memory pressure the
/// oldest blocks go first.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    /// The block's quantum start.
    start: i64,
    /// Its series id.
    id: u32,
    /// Its open points: what sealing it frees.
    open: usize,
    /// Points the seal decodes and encodes: what it costs the step's budget.
    work: usize,
    /// Frames kept as they are; the newer ones are merged with the open points.
    keep: usize,
    /// The quantum has ended (plus grace): a final seal, not a checkpoint.
    ended: bool,
}

/// A block's open points and frames taken for sealing, with what building its frames needs.
struct Snapshot {
    /// The series id.
    id: u32,
    /// The quantum start.
    start: i64,
    /// The series' quantum length.
    len: QuantumLen,
    /// Every frame of the block when taken, oldest first.
    frames: Vec<Loc>,
    /// `frames[..keep]` stay; `frames[keep..]` are merged with the open points.
    keep: usize,
    /// The frames may share points.
    overlap: bool,
    /// The open points as taken; points written meanwhile stay open.
    open: Vec<Point>,
    /// The block's `open_overlap` flag when taken (cleared meanwhile, restored on failure).
    open_overlap: bool,
    /// The maintenance clock when taken.
    at: i64,
    /// A final seal (the quantum has ended).
    ended: bool,
}

/// What sealing one snapshot came to.
enum Sealed {
    /// New frames replacing `frames[keep..]`: (offset in the step's buffer, length, summary).
    Put(Vec<(usize, usize, Summary)>),
    /// The open points were all in the frames already, and no frames needed merging.
    Contained,
    /// The points stay open: a frame could not be read, or the frame would be too large.
    Skip,
}

/// Where appended frames landed: a block segment and the offset of the first byte.
#[derive(Clone, Copy)]
struct Appended {
    seg: u32,
    offset: u64,
}

/// A sealed frame in a segment being compacted, copied to offset `at` of the new frames.
struct Copied {
    /// The series id.
    id: u32,
    /// The quantum start.
    start: i64,
    /// Where the frame was (compaction moves it only if it is still there).
    from: Loc,
    /// Its offset in the buffer of copied frames.
    at: usize,
}

/// Which frames a checkpoint of `open` new points keeps (a prefix of `counts`, the frames'
/// point counts oldest first); the newer ones are merged with the open points. A frame is
/// merged while it holds at most twice what is merged so far, so a point is only ever
/// rewritten into a frame at least 1.5 times as large as the one it was in: O(log n) rewrites
/// per point, never the whole block at every checkpoint. More are merged while the block would
/// hold over `max_frames` frames; none into a frame of over `max_points`.
pub(super) fn merge_run(counts: &[u64], open: u64, max_frames: usize, max_points: u64) -> usize {
    let mut keep = counts.len();
    let mut acc = open;
    while keep > 0 && counts[keep - 1] <= acc.saturating_mul(2) && acc + counts[keep - 1] <= max_points {
        acc += counts[keep - 1];
        keep -= 1;
    }
    let new_frames = usize::try_from(acc.div_ceil(max_points.max(1)).max(1)).unwrap_or(usize::MAX);
    while keep.saturating_add(new_frames) > max_frames && keep > 0 && acc + counts[keep - 1] <= max_points {
        acc += counts[keep - 1];
        keep -= 1;
    }
    keep
}

/// The location of a frame built at `f` = (offset, length, summary) of a step's buffer that
/// was appended at `to`.
fn placed(to: Appended, (at, len, summary): (usize, usize, Summary)) -> Loc {
    Loc { seg: to.seg, offset: to.offset + at as u64, len: len as u32, summary }
}

/// The index edit that makes a block's frames its first `keep` followed by `locs`: a plain put
/// (readable by format 1) when that is one frame.
pub(super) fn frames_edit(id: u32, start: i64, keep: usize, locs: Vec<Loc>) -> Edit {
    if keep == 0 && locs.len() == 1 {
        return Edit::Put { id, start, loc: locs[0] };
    }
    Edit::Frames { id, start, keep: u32::try_from(keep).unwrap_or(u32::MAX), locs }
}

impl DiskStore {
    /// What maintenance does with block `start` of a series with quanta of `len` ns at clock
    /// `clock`: `None` when nothing is due, else which frames it keeps (see [`Candidate`]).
    /// Blocks whose quantum ended are sealed into as few frames as they fit in; open blocks
    /// are checkpointed once their open points are old, many, pin an old log segment
    /// (before `wal_cut`), may duplicate frames, or memory is short (`pressure`).
    fn plan(&self, b: &Block, start: i64, len: i64, clock: i64, pressure: bool, wal_cut: u64) -> Option<(usize, bool)> {
        let frames = b.frames.as_slice();
        let open = b.open.len() as u64;
        let max = self.config.max_block_points as u64;
        let run = || {
            let counts: Vec<u64> = frames.iter().map(|l| l.summary.count).collect();
            merge_run(&counts, open, self.config.max_block_frames.max(1), max)
        };
        let ended = start.saturating_add(len).saturating_add(self.config.seal_grace_ns) <= clock;
        if b.overlap {
            return Some((0, ended));
        }
        if ended {
            let total = b.frames.count() + open;
            if total <= max {
                return (open > 0 || frames.len() > 1).then_some((0, true));
            }
            if open == 0 {
                // Too many points for one frame: merge only if fewer frames would hold them.
                return (frames.len() as u64 > total.div_ceil(max)).then_some((0, true));
            }
            return Some((run(), true));
        }
        if open == 0 {
            return None;
        }
        let due = pressure
            || b.open_overlap
            || open >= max
            || b.open_since.saturating_add(self.config.max_open_age_ns) <= clock
            || b.open_min_seg < wal_cut;
        due.then(|| (run(), false))
    }

    /// Seals due blocks (see [`DiskStore::plan`]), or under memory pressure the oldest blocks
    /// until `pressure_target` open points remain. Four phases: pick the blocks within the
    /// step's budget, snapshot their open points and frames, build and write the new frames
    /// (unlocked), and apply the result to the state.
    pub(super) fn seal_step(
        &self,
        m: &mut Maint,
        now: Option<Timestamp>,
        pressure_target: Option<usize>,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        let clock = self.clock.load(Ordering::Relaxed).max(now.unwrap_or(i64::MIN));
        let wal_cut = self.wal.cut_for(self.config.max_wal_bytes).unwrap_or(0);
        let mut picked = self.pick(clock, wal_cut, pressure_target);
        // A seal holds every point it merges, so the budget counts frames' points too.
        let mut budget = self.config.step_max_points;
        let n = picked
            .iter()
            .take_while(|c| {
                let go = budget > 0;
                budget = budget.saturating_sub(c.work);
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
        let snaps = self.snapshot(&picked, clock);
        // Build the new frames, unlocked.
        let mut buf = Vec::new();
        let outcome: Vec<Sealed> = snaps.iter().map(|snap| self.build(snap, &mut buf)).collect();
        let written = self.write_sealed(m, &snaps, &outcome, &buf);
        self.apply_sealed(&snaps, &outcome, &written, report);
        written.map(|_| ())
    }

    /// The blocks due for sealing at `clock` (see [`DiskStore::plan`]); under memory pressure,
    /// the oldest until `pressure_target` open points would remain.
    fn pick(&self, clock: i64, wal_cut: u64, pressure_target: Option<usize>) -> Vec<Candidate> {
        let st = self.read_state();
        let mut c = Vec::new();
        // Open points the memory valve cannot relieve: blocks the last seal left open.
        let mut stuck = 0;
        let consider = |id: u32, start: i64, c: &mut Vec<Candidate>| {
            let s = &st.series[&id];
            let b = &s.blocks[&start];
            let len = s.quantum.map_or(0, QuantumLen::ns);
            let Some((keep, ended)) = self.plan(b, start, len, clock, pressure_target.is_some(), wal_cut) else {
                return;
            };
            let frames = b.frames.as_slice();
            let (lo, hi) = (b.open.first(), b.open.last());
            // Kept frames the open points fall in are read to take duplicates out.
            let dedup: u64 = match (lo, hi) {
                (Some(lo), Some(hi)) => frames[..keep]
                    .iter()
                    .filter(|l| l.summary.first <= *hi && *lo <= l.summary.last)
                    .map(|l| l.summary.count)
                    .sum(),
                _ => 0,
            };
            let merged: u64 = frames[keep..].iter().map(|l| l.summary.count).sum();
            let work = usize::try_from(merged + dedup).unwrap_or(usize::MAX).saturating_add(b.open.len());
            c.push(Candidate { start, id, open: b.open.len(), work, keep, ended });
        };
        for &(id, start) in &st.dirty {
            let b = &st.series[&id].blocks[&start];
            if pressure_target.is_some() && b.stuck {
                // Retried by regular maintenance, not in the write path at every write.
                stuck += b.open.len();
                continue;
            }
            consider(id, start, &mut c);
        }
        if pressure_target.is_none() {
            // Blocks of several frames without open points, once their quantum ended.
            for &(_, id, start) in st.merge_due.range(..=(clock, u32::MAX, i64::MAX)) {
                if !st.dirty.contains(&(id, start)) {
                    consider(id, start, &mut c);
                }
            }
        }
        if let Some(target) = pressure_target {
            c.sort_unstable();
            let mut left = st.open_points - stuck;
            let n = c
                .iter()
                .take_while(|c| {
                    let go = left > target;
                    left = left.saturating_sub(c.open);
                    go
                })
                .count();
            c.truncate(n);
        }
        c
    }

    /// Snapshots the open points and frames of the blocks `picked` (those still there).
    fn snapshot(&self, picked: &[Candidate], clock: i64) -> Vec<Snapshot> {
        let mut st = self.write_state();
        picked
            .iter()
            .filter_map(|&Candidate { start, id, keep, ended, .. }| {
                let s = st.series.get_mut(&id)?;
                let len = s.quantum?;
                let b = s.blocks.get_mut(&start)?;
                b.snap_min_seg = Some(u64::MAX);
                let open_overlap = std::mem::take(&mut b.open_overlap);
                Some(Snapshot {
                    id,
                    start,
                    len,
                    frames: b.frames.as_slice().to_vec(),
                    keep,
                    overlap: b.overlap,
                    open: b.open.clone(),
                    open_overlap,
                    at: clock,
                    ended,
                })
            })
            .collect()
    }

    /// Appends the frames built into `buf` to a block segment and their edits to the index;
    /// where they landed, or `None` when nothing was built.
    fn write_sealed(
        &self,
        m: &mut Maint,
        snaps: &[Snapshot],
        outcome: &[Sealed],
        buf: &[u8],
    ) -> Result<Option<Appended>, StoreError> {
        if buf.is_empty() {
            return Ok(None);
        }
        let to = self.segment_append(m, buf)?;
        // A block's series must be in the index before the block is.
        let ids: BTreeSet<u32> = snaps.iter().map(|s| s.id).collect();
        let mut edits = self.unindexed_series(Some(&ids));
        edits.extend(snaps.iter().zip(outcome).filter_map(|(snap, o)| match o {
            Sealed::Put(frames) => {
                let locs: Vec<Loc> = frames.iter().map(|&f| placed(to, f)).collect();
                Some(frames_edit(snap.id, snap.start, snap.keep, locs))
            }
            _ => None,
        }));
        self.index_append(m, &edits)?;
        self.mark_indexed(&edits);
        Ok(Some(to))
    }

    /// Applies what was written to the state: the blocks' new frames, and their open points
    /// minus those sealed. After a failure (`written` is an error) it only ends the
    /// snapshots: the points stay open.
    fn apply_sealed(
        &self,
        snaps: &[Snapshot],
        outcome: &[Sealed],
        written: &Result<Option<Appended>, StoreError>,
        report: &mut MaintenanceReport,
    ) {
        let grace = self.config.seal_grace_ns;
        let mut st = self.write_state();
        let failed = written.is_err();
        for (snap, o) in snaps.iter().zip(outcome) {
            let st = &mut *st;
            let Some(b) = st.series.get_mut(&snap.id).and_then(|s| s.blocks.get_mut(&snap.start)) else {
                continue;
            };
            let min_since = b.snap_min_seg.take().unwrap_or(u64::MAX);
            if failed || matches!(o, Sealed::Skip) {
                b.open_overlap |= snap.open_overlap;
                if !failed {
                    b.stuck = true;
                }
                continue;
            }
            b.stuck = false;
            if let (Sealed::Put(frames), Ok(Some(to))) = (o, written) {
                let mut all = b.frames.as_slice().to_vec();
                for old in all.drain(snap.keep..) {
                    st.frames -= 1;
                    if let Some(s) = st.segs.get_mut(&old.seg) {
                        s.live = s.live.saturating_sub(u64::from(old.len));
                    }
                }
                for &f in frames {
                    let loc = placed(*to, f);
                    st.segs.entry(to.seg).or_default().live += u64::from(loc.len);
                    st.frames += 1;
                    report.sealed_points += loc.summary.count;
                    all.push(loc);
                }
                report.sealed_blocks += 1;
                report.checkpointed_blocks += u64::from(!snap.ended);
                b.frames = Frames::from_vec(all);
                b.frames_gen = b.frames_gen.wrapping_add(1);
                b.overlap = false;
                let ends_at = snap.start.saturating_add(snap.len.ns()).saturating_add(grace);
                State::schedule_merge(
                    &mut st.merge_due,
                    (snap.id, snap.start),
                    b,
                    ends_at,
                    self.config.max_block_points,
                );
            }
            let before = b.open.len();
            if b.open.len() == snap.open.len() {
                // Open points only grow while sealing, so equal length means the same set.
                b.open = Vec::new();
                b.open_digest = 0;
            } else {
                b.open = difference(&b.open, &snap.open);
                b.open_digest = b.open_digest.wrapping_sub(digest_of(&snap.open));
            }
            st.open_points -= before - b.open.len();
            if b.open.is_empty() {
                b.open_min_seg = u64::MAX;
                st.dirty.remove(&(snap.id, snap.start));
            } else {
                b.open_min_seg = min_since;
                b.open_since = snap.at;
            }
        }
    }

    /// Builds the frames of one snapshot into `buf`: the open points without those the kept
    /// frames hold, merged with the frames after `keep`, in frames of at most
    /// `max_block_points`.
    fn build(&self, snap: &Snapshot, buf: &mut Vec<u8>) -> Sealed {
        let &Snapshot { id, start, len, ref frames, keep, overlap, ref open, .. } = snap;
        let (kept, run) = frames.split_at(keep);
        let read = (|| -> Result<(Vec<Point>, Vec<Point>), Load> {
            let mut fresh = open.clone();
            if let (Some(lo), Some(hi)) = (open.first(), open.last()) {
                for l in kept.iter().filter(|l| l.summary.first <= *hi && *lo <= l.summary.last) {
                    fresh = difference(&fresh, &self.load(id, start, l)?);
                }
            }
            Ok((fresh, self.load_union(id, start, run, Vec::new())?))
        })();
        let (fresh, old) = match read {
            Ok(r) => r,
            Err(e) => {
                let why = match e {
                    Load::Gone => "its segment moved".to_string(),
                    Load::Err(e) => e.to_string(),
                };
                self.problem(format!(
                    "points of series id {id} at quantum {start} stay unmerged (in memory and the log): {why}"
                ));
                return Sealed::Skip;
            }
        };
        if fresh.is_empty() && run.len() <= 1 && !overlap {
            return Sealed::Contained;
        }
        let merged = union(old, &fresh);
        if merged.is_empty() {
            return Sealed::Contained;
        }
        let q = Quantum::at(start, len).expect("block starts are aligned");
        let base = buf.len();
        let mut out = Vec::new();
        for chunk in merged.chunks(self.config.max_block_points) {
            let at = buf.len();
            let summary = block::encode(buf, id, q, chunk, self.config.codec);
            if buf.len() - at > frame::MAX_PAYLOAD {
                // Readers refuse frames this large; keep the points open instead.
                buf.truncate(base);
                self.problem(format!(
                    "series id {id} quantum {start}: {} points encode to more than a block may hold \
                     ({} bytes); they stay in memory and the log: use a shorter quantum for this class",
                    chunk.len(),
                    frame::MAX_PAYLOAD
                ));
                return Sealed::Skip;
            }
            out.push((at, buf.len() - at, summary));
        }
        Sealed::Put(out)
    }

    /// Appends frames to the current block segment and syncs it.
    fn segment_append(&self, m: &mut Maint, buf: &[u8]) -> Result<Appended, StoreError> {
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
                Ok(Appended { seg: m.seg, offset: at })
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

    pub(super) fn compact_step(&self, m: &mut Maint, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        let (seg, live) = {
            let st = self.read_state();
            let Some((&seg, _)) =
                st.segs.iter().find(|&(&k, s)| k != m.seg && !m.stuck.contains(&k) && s.live * 2 < s.bytes)
            else {
                return Ok(());
            };
            // Every frame still in the segment, even when the live byte count says none: that
            // count leaves out blocks found damaged at open, and a segment is only deleted once
            // nothing refers to it.
            let mut live: Vec<(u32, i64, Loc)> = Vec::new();
            for (&id, s) in &st.series {
                for (&start, b) in &s.blocks {
                    live.extend(b.frames.as_slice().iter().filter(|l| l.seg == seg).map(|&l| (id, start, l)));
                }
            }
            (seg, live)
        };
        let path = seg_path(seg);
        if !live.is_empty() {
            let mut buf = Vec::new();
            let mut placed = Vec::new();
            for &(id, start, loc) in &live {
                // A frame that cannot be read or is damaged keeps its segment as it is (for a
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
                placed.push(Copied { id, start, from: loc, at: buf.len() });
                buf.extend_from_slice(&bytes);
            }
            let to = self.segment_append(m, &buf)?;
            let moved = |c: &Copied| Loc { seg: to.seg, offset: to.offset + c.at as u64, ..c.from };
            let mut by_block: BTreeMap<(u32, i64), Vec<&Copied>> = BTreeMap::new();
            for c in &placed {
                by_block.entry((c.id, c.start)).or_default().push(c);
            }
            // Each block's frames with the moved ones in their new place (maintenance is the only
            // one to change frames, and it is us).
            let relocated: Vec<(u32, i64, usize, Vec<Loc>)> = {
                let st = self.read_state();
                by_block
                    .iter()
                    .filter_map(|(&(id, start), cs)| {
                        let b = st.series.get(&id)?.blocks.get(&start)?;
                        let mut frames = b.frames.as_slice().to_vec();
                        let mut first = frames.len();
                        for (i, f) in frames.iter_mut().enumerate() {
                            if let Some(c) = cs.iter().find(|c| c.from == *f) {
                                *f = moved(c);
                                first = first.min(i);
                            }
                        }
                        (first < frames.len()).then_some((id, start, first, frames))
                    })
                    .collect()
            };
            let edits: Vec<Edit> = relocated
                .iter()
                .map(|(id, start, first, frames)| frames_edit(*id, *start, *first, frames[*first..].to_vec()))
                .collect();
            self.index_append(m, &edits)?;
            let mut st = self.write_state();
            let st = &mut *st;
            for (id, start, _, frames) in relocated {
                if let Some(b) = st.series.get_mut(&id).and_then(|s| s.blocks.get_mut(&start)) {
                    for l in frames.iter().filter(|l| l.seg == to.seg && !b.frames.as_slice().contains(l)) {
                        st.segs.entry(to.seg).or_default().live += u64::from(l.len);
                    }
                    b.frames = Frames::from_vec(frames);
                }
            }
        }
        self.write_state().segs.remove(&seg);
        self.backend.remove(&path).map_err(|e| io_error(format!("removing compacted {path}"), e))?;
        report.compacted_segments += 1;
        report.more = true;
        Ok(())
    }

    pub(super) fn index_append(&self, m: &mut Maint, edits: &[Edit]) -> Result<(), StoreError> {
        if edits.is_empty() {
            return Ok(());
        }
        self.raise_format(m, edits.iter().map(index::format_of).max().unwrap_or(1))?;
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

    /// Declares format `version` in `FORMAT` before the first edit that an older reader would
    /// misread, so a downgrade is refused instead of losing frames.
    pub(super) fn raise_format(&self, m: &mut Maint, version: u32) -> Result<(), StoreError> {
        if version <= m.format {
            return Ok(());
        }
        let path = super::format_file::PATH;
        self.backend
            .write_atomic(path, super::format_file::body(version).as_bytes())
            .map_err(|e| io_error(format!("raising {path} to format {version}"), e))?;
        m.format = version;
        Ok(())
    }

    /// Dictionary entries (of `ids`, or all) whose latest state the index does not hold yet.
    pub(super) fn unindexed_series(&self, ids: Option<&BTreeSet<u32>>) -> Vec<Edit> {
        let st = self.read_state();
        let ids = ids.unwrap_or(&st.unindexed);
        self.series_walked.fetch_add(ids.len() as u64, Ordering::Relaxed);
        ids.iter()
            .filter_map(|&id| {
                let s = st.series.get(&id)?;
                let now = s.entry();
                (s.indexed != Some(now)).then(|| Edit::Series {
                    id,
                    registered: now.registered,
                    quantum_ns: now.quantum_ns,
                    key: s.key.to_string(),
                })
            })
            .collect()
    }

    /// Records that the index now holds these dictionary entries.
    pub(super) fn mark_indexed(&self, edits: &[Edit]) {
        let mut st = self.write_state();
        for e in edits {
            if let &Edit::Series { id, registered, quantum_ns, .. } = e {
                set_indexed(&mut st, id, DictEntry { registered, quantum_ns });
            }
        }
    }

    pub(super) fn rewrite_index_if_bloated(
        &self,
        m: &mut Maint,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        let (frames, series) = {
            let st = self.read_state();
            (st.frames, st.series.len())
        };
        let live_estimate = (frames * 90 + series * 60) as u64;
        if !m.rewrite_index && (m.index_len < self.config.index_rewrite_bytes || m.index_len < 4 * live_estimate) {
            return Ok(());
        }
        let mut edits = Vec::new();
        let mut marks = Vec::new();
        {
            let st = self.read_state();
            for (&id, s) in &st.series {
                let entry = s.entry();
                edits.push(Edit::Series {
                    id,
                    registered: entry.registered,
                    quantum_ns: entry.quantum_ns,
                    key: s.key.to_string(),
                });
                marks.push((id, entry));
                if s.expired_before > 0 {
                    edits.push(Edit::Expire { id, before: s.expired_before });
                }
                for (&start, b) in &s.blocks {
                    if !b.frames.is_empty() {
                        edits.push(frames_edit(id, start, 0, b.frames.as_slice().to_vec()));
                    }
                }
            }
            for (&(id, start), &wal_seq) in &st.drops {
                if wal_seq > m.first_live_wal {
                    edits.push(Edit::Drop { id, start, wal_seq });
                }
            }
            edits.push(Edit::Checkpoint { first_live_wal: m.first_live_wal });
        }
        self.raise_format(m, edits.iter().map(index::format_of).max().unwrap_or(1))?;
        let mut buf = Vec::new();
        index::put(&mut buf, &Edit::Header { version: m.format });
        for e in &edits {
            index::put(&mut buf, e);
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
}

/// Records that the index holds `entry` for series `id`.
fn set_indexed(st: &mut State, id: u32, entry: DictEntry) {
    if let Some(s) = st.series.get_mut(&id) {
        s.indexed = Some(entry);
        if s.entry() == entry {
            st.unindexed.remove(&id);
        }
    }
}

//! Maintenance that writes block segments and the index log: sealing open points into
//! compressed frames (merging late data into a block's sealed frame), compacting segments that
//! are mostly dead, appending index edits, and rewriting a bloated index as a snapshot.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use timeshard_proto::{Point, Quantum, QuantumLen, Timestamp};

use super::read::Load;
use super::{DictEntry, DiskStore, FORMAT_VERSION, Maint, State, difference, seg_path, union};
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
    /// Points the seal decodes and encodes (open plus sealed): what it costs the step's budget.
    work: usize,
}

/// A block's open points taken for sealing, with what building its frame needs.
struct Snapshot {
    /// The series id.
    id: u32,
    /// The quantum start.
    start: i64,
    /// The series' quantum length.
    len: QuantumLen,
    /// The sealed frame the open points are merged into, if the block has one.
    sealed: Option<Loc>,
    /// The open points as taken; points written meanwhile stay open.
    open: Vec<Point>,
}

/// What sealing one snapshot came to.
enum Sealed {
    /// A new frame of `len` bytes at offset `at` of the step's buffer, summarised by `summary`.
    Put { at: usize, len: usize, summary: Summary },
    /// The late points were all in the sealed block already.
    Contained,
    /// The points stay open: the sealed part could not be read, or they are too many for a block.
    Skip,
}

/// Where appended frames landed: a block segment and the offset of the first byte.
#[derive(Clone, Copy)]
struct Appended {
    seg: u32,
    offset: u64,
}

/// A sealed block in a segment being compacted, copied to offset `at` of the new frames.
struct Copied {
    /// The series id.
    id: u32,
    /// The quantum start.
    start: i64,
    /// Where the block was (compaction moves it only if it is still there).
    from: Loc,
    /// Its offset in the buffer of copied frames.
    at: usize,
}

impl DiskStore {
    /// Seals due blocks (quantum ended plus grace, or over the size cap), or under memory
    /// pressure the oldest blocks until `pressure_target` open points remain.
    pub(super) fn seal_step(
        &self,
        m: &mut Maint,
        now: Option<Timestamp>,
        pressure_target: Option<usize>,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        let grace = self.config.seal_grace_ns;
        let mut picked: Vec<Candidate> = {
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
                    c.push(Candidate { start, id, open: b.open.len(), work: b.open.len().saturating_add(sealed) });
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
        };
        // A re-seal holds the whole block, so the budget counts its sealed points too.
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

        // Snapshot the open points.
        let snaps: Vec<Snapshot> = {
            let mut st = self.write_state();
            picked
                .iter()
                .filter_map(|&Candidate { start, id, .. }| {
                    let s = st.series.get_mut(&id)?;
                    let len = s.quantum?;
                    let b = s.blocks.get_mut(&start)?;
                    b.snap_min_seg = Some(u64::MAX);
                    Some(Snapshot { id, start, len, sealed: b.sealed, open: b.open.clone() })
                })
                .collect()
        };

        // Build the new frames, unlocked.
        let mut buf = Vec::new();
        let mut outcome = Vec::with_capacity(snaps.len());
        for &Snapshot { id, start, len, sealed, ref open } in &snaps {
            let merged = match sealed {
                None => open.clone(),
                Some(loc) => match self.load(id, start, &loc) {
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
            let q = Quantum::at(start, len).expect("block starts are aligned");
            let at = buf.len();
            let summary = block::encode(&mut buf, id, q, &merged, self.config.codec);
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
            outcome.push(Sealed::Put { at, len: buf.len() - at, summary });
        }

        let written = if buf.is_empty() { Ok(None) } else { self.segment_append(m, &buf).map(Some) };
        let written = written.and_then(|w| {
            let Some(to) = w else {
                return Ok(None);
            };
            // A block's series must be in the index before the block is.
            let ids: BTreeSet<u32> = snaps.iter().map(|s| s.id).collect();
            let mut edits = self.unindexed_series(Some(&ids));
            edits.extend(snaps.iter().zip(&outcome).filter_map(|(snap, o)| match *o {
                Sealed::Put { at, len, summary } => Some(Edit::Put {
                    id: snap.id,
                    start: snap.start,
                    loc: Loc { seg: to.seg, offset: to.offset + at as u64, len: len as u32, summary },
                }),
                _ => None,
            }));
            self.index_append(m, &edits)?;
            self.mark_indexed(&edits);
            Ok(Some(to))
        });

        // Apply (or, after a failure, just end the snapshots: the points stay open).
        let mut st = self.write_state();
        let failed = written.is_err();
        for (Snapshot { id, start, open: snap, .. }, o) in snaps.iter().zip(&outcome) {
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
            if let (&Sealed::Put { at, len, summary }, Ok(Some(to))) = (o, &written) {
                let loc = Loc { seg: to.seg, offset: to.offset + at as u64, len: len as u32, summary };
                if let Some(old) = b.sealed.replace(loc)
                    && let Some(s) = st.segs.get_mut(&old.seg)
                {
                    s.live = s.live.saturating_sub(u64::from(old.len));
                }
                st.segs.entry(to.seg).or_default().live += len as u64;
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
            for &(id, start, loc) in &live {
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
                placed.push(Copied { id, start, from: loc, at: buf.len() });
                buf.extend_from_slice(&bytes);
            }
            let to = self.segment_append(m, &buf)?;
            let moved = |c: &Copied| Loc { seg: to.seg, offset: to.offset + c.at as u64, ..c.from };
            let edits: Vec<Edit> =
                placed.iter().map(|c| Edit::Put { id: c.id, start: c.start, loc: moved(c) }).collect();
            self.index_append(m, &edits)?;
            let mut st = self.write_state();
            let st = &mut *st;
            for c in &placed {
                if let Some(b) = st.series.get_mut(&c.id).and_then(|s| s.blocks.get_mut(&c.start))
                    && b.sealed == Some(c.from)
                {
                    b.sealed = Some(moved(c));
                    st.segs.entry(to.seg).or_default().live += u64::from(c.from.len);
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
                let entry = s.entry();
                index::put(
                    &mut buf,
                    &Edit::Series {
                        id,
                        registered: entry.registered,
                        quantum_ns: entry.quantum_ns,
                        key: s.key.to_string(),
                    },
                );
                marks.push((id, entry));
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

//! The write path of [`DiskStore`]: resolving series ids (creating dictionary entries),
//! checking the frames a write's points may already be in, logging a write with group commit
//! and applying it to the open points, registrations, and the memory valve that seals blocks
//! when open points pile up.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use timeshard_proto::point::BlockPoints;
use timeshard_proto::time::check_timestamp;
use timeshard_proto::{Point, PointKey, Quantum, QuantumLen, SeriesKey};

use super::{Block, DiskStore, Series, State, digest_of, in_range, union};
use crate::index::Loc;
use crate::wal::{self, Def};
use crate::{MaintenanceReport, StoreError, WriteStats};

impl DiskStore {
    /// Validates, logs and applies a write ([`crate::Store::write`]).
    pub(super) fn write_blocks(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError> {
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
        let checked = self.check_frames(&sorted);
        let clock = self.clock.load(std::sync::atomic::Ordering::Relaxed);
        let new_points = self.commit_and_apply(defs, &data, |st, seq| {
            sorted
                .iter()
                .map(|(id, q, pts)| apply_points(st, *id, *q, pts, seq, checked.get(&(*id, q.start)), clock))
                .sum()
        })?;
        if self.read_state().open_points > self.config.max_open_points {
            self.relieve_pressure();
        }
        if self.wal.bytes() > self.log_hard_limit() {
            self.relieve_log()?;
        }
        Ok(WriteStats { new_points })
    }

    /// Registers series ([`crate::Store::register_series`]).
    pub(super) fn register(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
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

    /// What the frames of the blocks a write touches hold of its points: only frames whose key
    /// range the points fall in are read (none for live data, which lands after them), so a
    /// write neither decodes a long block nor adds points its frames already hold.
    fn check_frames(&self, sorted: &[(u32, Quantum, Vec<Point>)]) -> HashMap<(u32, i64), Checked> {
        let mut out: HashMap<(u32, i64), Checked> = HashMap::new();
        let mut loads: Vec<(u32, i64, Loc)> = Vec::new();
        {
            let st = self.read_state();
            for (id, q, pts) in sorted {
                let Some(b) = st.series.get(id).and_then(|s| s.blocks.get(&q.start)) else {
                    continue;
                };
                out.entry((*id, q.start)).or_insert(Checked {
                    seen_gen: b.frames_gen,
                    keys: Vec::new(),
                    complete: true,
                });
                let (Some(lo), Some(hi)) = (pts.first(), pts.last()) else { continue };
                for l in b.frames.as_slice() {
                    if l.summary.first <= *hi && *lo <= l.summary.last && !loads.contains(&(*id, q.start, *l)) {
                        loads.push((*id, q.start, *l));
                    }
                }
            }
        }
        for (id, start, loc) in loads {
            let c = out.get_mut(&(id, start)).expect("checked above");
            match self.load(id, start, &loc) {
                Ok(pts) => c.keys.extend(pts.iter().map(Point::key)),
                // Unread: the write cannot tell which of its points the frame holds; it adds
                // them all and flags the block for maintenance to take duplicates out.
                Err(_) => c.complete = false,
            }
        }
        for c in out.values_mut() {
            c.keys.sort_unstable();
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

    /// Log bytes past which a writer checkpoints itself (twice `max_wal_bytes`).
    fn log_hard_limit(&self) -> u64 {
        self.config.max_wal_bytes.saturating_mul(2)
    }

    /// Checkpoints until the log is back under its hard limit, waiting for a maintenance step
    /// in progress first: the back-pressure that keeps the log (and the replay after a crash)
    /// bounded when maintenance falls behind ingest. Each pass seals the blocks pinning the
    /// log's older half and removes the segments they freed; it stops when a pass frees nothing.
    fn relieve_log(&self) -> Result<(), StoreError> {
        let mut m = self.lock_maint();
        let mut report = MaintenanceReport::default();
        for _ in 0..8 {
            let before = self.wal.bytes();
            if before <= self.log_hard_limit() {
                break;
            }
            self.seal_step(&mut m, None, None, &mut report)?;
            self.checkpoint_step(&mut m, &mut report)?;
            if self.wal.bytes() >= before {
                break;
            }
        }
        Ok(())
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

pub(super) fn ensure_series(st: &mut State, key: &SeriesKey) -> u32 {
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

/// What a write found in the frames of one block before it was logged.
#[derive(Debug)]
pub(super) struct Checked {
    /// The block's `frames_gen` when looked at.
    seen_gen: u32,
    /// Sorted keys of the frames the write's points fall in (the others cannot hold them).
    keys: Vec<PointKey>,
    /// Every such frame was read.
    complete: bool,
}

/// Merges sorted, deduplicated `points` into block (id, quantum) as open points logged in
/// segment `seq`, at maintenance clock `clock`. Points `checked` found in the frames are left
/// out while the frames are still the ones checked; without that knowledge (`None` on replay,
/// a changed or unread frame) points within a frame's key range flag the block so maintenance
/// takes duplicates out. Returns how many points were new to the block.
pub(super) fn apply_points(
    st: &mut State,
    id: u32,
    quantum: Quantum,
    points: &[Point],
    seq: u64,
    checked: Option<&Checked>,
    clock: i64,
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
    let in_frames = |p: &Point| checked.is_some_and(|c| c.keys.binary_search(&p.key()).is_ok());
    let trusted = checked.is_some_and(|c| c.complete && c.seen_gen == b.frames_gen);
    // Live data lands after every open point: no search.
    let after_open = b.open.last().is_none_or(|l| *l < points[0]);
    let not_open = |p: &&Point| after_open || b.open.binary_search(p).is_err();
    let new = points.iter().filter(not_open).filter(|p| !in_frames(p)).count() as u64;
    let add: Vec<Point> = points.iter().filter(not_open).filter(|p| !trusted || !in_frames(p)).copied().collect();
    if add.is_empty() {
        return new;
    }
    if !trusted && add.iter().any(|p| b.frames.as_slice().iter().any(|l| in_range(l, p))) {
        b.open_overlap = true;
    }
    if b.open.is_empty() {
        b.open_since = clock;
    }
    b.open_digest = b.open_digest.wrapping_add(digest_of(&add));
    b.last_write = clock;
    b.open = union(std::mem::take(&mut b.open), &add);
    b.open_min_seg = b.open_min_seg.min(seq);
    if let Some(m) = &mut b.snap_min_seg {
        *m = (*m).min(seq);
    }
    st.open_points += add.len();
    st.dirty.insert((id, quantum.start));
    new
}

//! The write path of [`DiskStore`]: resolving series ids (creating dictionary entries),
//! logging a write with group commit and applying it to the open points, registrations, and
//! the memory valve that seals blocks when open points pile up.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use timeshard_proto::time::check_timestamp;
use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, PointKey, Quantum, QuantumLen, SeriesKey};

use super::{Block, DiskStore, Series, State, union};
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

/// Merges sorted, deduplicated `points` into block (id, quantum) as open points logged in
/// segment `seq`. Returns how many were new, not counting those in `sealed` (sorted keys).
pub(super) fn apply_points(
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

//! Whole blocks for repair and handoff: listing every block with its count, digest and last
//! write (from memory, paged by series number), reading one block, dropping one block if it
//! still has the digest the new owners confirmed, and listing registrations.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use timeshard_proto::point::BlockPoints;
use timeshard_proto::{Point, PointKey, Quantum, SeriesKey, TimeRange, Timestamp};

use super::read::Load;
use super::{Block, DiskStore, Frames, Series, State, difference, digest_of};
use crate::index::Edit;
use crate::{
    BlockInfo, BlockPage, DamagedBlock, LIST_SCAN_SLACK, ListCursor, ReadPage, ScrubPage, SeriesPage, StoreError,
};

/// How long a drop waits for writes logged before it to be applied.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// A block's count and digest: sums over its parts, which are disjoint unless flagged.
fn count_and_digest(b: &Block) -> (u64, u64) {
    (b.frames.count() + b.open.len() as u64, b.frames.digest().wrapping_add(b.open_digest))
}

/// Walks the blocks in (series number, quantum start) order from cursor `after`, handing each
/// to `take`, which answers how many items the page holds now. Stops when the page holds
/// `limit` items, or after `limit` plus [`LIST_SCAN_SLACK`] blocks and series numbers visited
/// (empty series and empty blocks cost a step too), returning the cursor to go on from; `None`
/// once every block was walked.
fn walk_blocks(
    st: &State,
    after: Option<ListCursor>,
    limit: usize,
    mut take: impl FnMut(u32, &Series, i64, &Block) -> usize,
) -> Option<ListCursor> {
    let (mut id, mut from) = after.map_or((0, None), |c| (c.series, c.after));
    let (mut held, mut visited) = (0usize, 0usize);
    while id < st.next_id {
        if held >= limit || visited >= limit.saturating_add(LIST_SCAN_SLACK) {
            return Some(ListCursor { series: id, after: from });
        }
        if let Some(s) = st.series.get(&id) {
            let range = (from.map_or(Bound::Unbounded, Bound::Excluded), Bound::Unbounded);
            for (&start, b) in s.blocks.range(range) {
                if held >= limit {
                    return Some(ListCursor { series: id, after: from });
                }
                visited += 1;
                held = take(id, s, start, b);
                from = Some(start);
            }
        }
        visited += 1;
        id += 1;
        from = None;
    }
    None
}

impl DiskStore {
    /// The report of block `start` of `s`, with `opened` standing in for older write times.
    fn info(s: &Series, start: i64, b: &Block, opened: i64) -> Option<BlockInfo> {
        let quantum = Quantum::at(start, s.quantum?)?;
        let (count, digest) = count_and_digest(b);
        (count > 0).then(|| BlockInfo {
            series: s.key.clone(),
            quantum,
            count,
            digest,
            last_write: b.last_write.max(opened),
            bytes: b.bytes(),
        })
    }

    /// The first maintenance time since open (0 before it).
    fn opened(&self) -> i64 {
        self.opened_at.load(Ordering::Relaxed).max(0)
    }

    /// One page of [`crate::Store::list_blocks`]: by series number, then quantum start.
    pub(super) fn list_blocks_page(&self, after: Option<ListCursor>, limit: usize) -> BlockPage {
        let opened = self.opened();
        let st = self.read_state();
        let mut blocks = Vec::new();
        let next = walk_blocks(&st, after, limit, |_, s, start, b| {
            blocks.extend(Self::info(s, start, b, opened));
            blocks.len()
        });
        BlockPage { blocks, next }
    }

    /// [`crate::Store::block_info`].
    pub(super) fn block_info_of(&self, series: &SeriesKey, start: Timestamp) -> Option<BlockInfo> {
        let opened = self.opened();
        let st = self.read_state();
        let s = &st.series[st.ids.get(series)?];
        Self::info(s, start, s.blocks.get(&start)?, opened)
    }

    /// [`crate::Store::read_block`]: a read over the block's quantum.
    pub(super) fn read_block_page(
        &self,
        series: &SeriesKey,
        start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let Some(len) = self.lookup(series).map(|(_, len)| len) else {
            return Ok(ReadPage::default());
        };
        let Some(q) = Quantum::at(start, len) else {
            return Err(StoreError::InvalidInput(format!(
                "{start} is not the start of a quantum of {series} (quanta of {} ns)",
                len.ns()
            )));
        };
        let range = TimeRange::new(q.start, q.end())
            .map_err(|e| StoreError::InvalidInput(format!("block {start} of {series}: {e}")))?;
        self.read_page(series, range, after, limit)
    }

    /// [`crate::Store::scrub`]: the frames of the blocks after `after` are listed under the
    /// state lock (bounded like a listing), then read and their checksums checked without it
    /// (no point is decoded); a damaged one is recorded by [`DiskStore::check_frame`]. A frame whose segment compaction removed meanwhile is
    /// skipped (its new copy is checked next pass).
    pub(super) fn scrub_page(&self, after: Option<ListCursor>, max_frames: usize) -> ScrubPage {
        let mut frames = Vec::new();
        let next = walk_blocks(&self.read_state(), after, max_frames, |id, _, start, b| {
            frames.extend(b.frames.as_slice().iter().map(|loc| (id, start, *loc)));
            frames.len()
        });
        let mut page = ScrubPage { next, ..ScrubPage::default() };
        for (id, start, loc) in frames {
            match self.check_frame(id, start, &loc) {
                Ok(_) => page.checked += 1,
                Err(Load::Gone) => {}
                Err(Load::Err(StoreError::Corrupt(_))) => {
                    page.checked += 1;
                    page.damaged += 1;
                }
                // A passing I/O failure: the next pass tries again.
                Err(Load::Err(_)) => {}
            }
        }
        page
    }

    /// [`crate::Store::take_damaged`]: the damaged blocks recorded by reads; those gone since
    /// are left out.
    pub(super) fn take_damaged_blocks(&self) -> Vec<DamagedBlock> {
        let taken = std::mem::take(&mut *self.damaged.lock().expect("damaged lock"));
        let st = self.read_state();
        taken
            .into_iter()
            .filter_map(|(id, start)| {
                let s = st.series.get(&id)?;
                s.blocks.get(&start)?;
                Some(DamagedBlock { series: s.key.clone(), quantum: s.quantum?.quantum_of(start) })
            })
            .collect()
    }

    /// [`crate::Store::drop_block`]. Under the maintenance lock, so frames do not change while
    /// it works. The log is rotated and the writes logged before the rotation are waited for,
    /// so that every write applied after the drop is logged at or after the segment the drop
    /// edit names: replay drops the block's older points and keeps the newer ones, as memory
    /// does.
    pub(super) fn drop_block_if(
        &self,
        series: &SeriesKey,
        start: Timestamp,
        expected: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.drop_block_where(series, start, Some(expected))?.is_some())
    }

    /// [`crate::Store::drop_damaged`]: drops the block whatever it holds, then writes back the
    /// points it held in memory (readable, and logged again after the drop, so they stay):
    /// only its damaged sealed frames go, for a replica's copy to replace.
    pub(super) fn drop_damaged_block(&self, series: &SeriesKey, start: Timestamp) -> Result<bool, StoreError> {
        let Some((quantum, open)) = self.drop_block_where(series, start, None)? else { return Ok(false) };
        if !open.is_empty() {
            crate::Store::write(self, &[BlockPoints { series: series.clone(), quantum, points: open }])?;
        }
        Ok(true)
    }

    /// Drops block `start` of `series` if its digest is `expected` (and settled), or whatever
    /// it holds without one; returns its quantum and the open points dropped with it.
    fn drop_block_where(
        &self,
        series: &SeriesKey,
        start: Timestamp,
        expected: Option<u64>,
    ) -> Result<Option<(Quantum, Vec<Point>)>, StoreError> {
        let mut m = self.lock_maint();
        let Some(&id) = self.read_state().ids.get(series) else {
            return Ok(None);
        };
        let matches = |st: &State| {
            st.series.get(&id).and_then(|s| s.blocks.get(&start)).is_some_and(|b| match expected {
                Some(expected) => {
                    !b.overlap && !b.open_overlap && count_and_digest(b).0 > 0 && count_and_digest(b).1 == expected
                }
                None => true,
            })
        };
        let Some(quantum) = self.read_state().series.get(&id).and_then(|s| s.quantum).map(|q| q.quantum_of(start))
        else {
            return Ok(None);
        };
        if !matches(&self.read_state()) {
            return Ok(None);
        }
        let boundary = self.wal.rotate_boundary();
        let deadline = Instant::now() + DRAIN_WAIT;
        while self.wal.first_pinned() < boundary {
            if Instant::now() > deadline {
                return Err(StoreError::Unavailable(format!(
                    "block {start} of {series} was not dropped: writes logged before the drop did not finish \
                     within {DRAIN_WAIT:?}; retry"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // What is dropped: the frames and the open points as they are now.
        let open = {
            let st = self.read_state();
            if !matches(&st) {
                return Ok(None);
            }
            st.series[&id].blocks[&start].open.clone()
        };
        self.index_append(&mut m, &[Edit::Drop { id, start, wal_seq: boundary }])?;
        let mut st = self.write_state();
        let st = &mut *st;
        let d = st.drops.entry((id, start)).or_default();
        *d = (*d).max(boundary);
        let Some(mut b) = st.series.get_mut(&id).and_then(|s| s.blocks.remove(&start)) else {
            return Ok(Some((quantum, open)));
        };
        st.blocks -= 1;
        st.forget_block(id, start, &b);
        // Points written since the check stay, as a block of their own.
        let rest = if b.open.len() == open.len() { Vec::new() } else { difference(&b.open, &open) };
        if !rest.is_empty() {
            b.frames = Frames::Empty;
            b.frames_gen = b.frames_gen.wrapping_add(1);
            b.merge_at = None;
            b.open_digest = digest_of(&rest);
            b.open = rest;
            st.open_points += b.open.len();
            st.dirty.insert((id, start));
            st.series.get_mut(&id).expect("held above").blocks.insert(start, b);
            st.blocks += 1;
        }
        Ok(Some((quantum, open)))
    }

    /// One page of [`crate::Store::list_registered`]: by series number.
    pub(super) fn list_registered_page(&self, after: Option<ListCursor>, limit: usize) -> SeriesPage {
        let st = self.read_state();
        let mut id = after.map_or(0, |c| c.series);
        let mut series = Vec::new();
        let mut visited = 0usize;
        while id < st.next_id {
            if series.len() >= limit || visited >= limit.saturating_add(LIST_SCAN_SLACK) {
                return SeriesPage { series, next: Some(ListCursor { series: id, after: None }) };
            }
            if let Some(s) = st.series.get(&id)
                && s.registered
            {
                series.push(s.key.clone());
            }
            visited += 1;
            id += 1;
        }
        SeriesPage { series, next: None }
    }
}

//! The read paths of [`DiskStore`]: raw range reads, window aggregates and block summaries.
//! Each merges a block's sealed frames (only those whose key range the read needs) with its
//! open points, and starts over from a block whose segment compaction removed while it was
//! being read.

use std::io;
use std::sync::atomic::Ordering;

use timeshard_proto::window::{Grid, check_windows};
use timeshard_proto::{Point, PointKey, QuantumLen, SeriesKey, TimeRange, Timestamp};

use super::{DiskStore, seg_path, union};
use crate::agg::{Aggregator, Summary, WindowAggregate};
use crate::backend::io_error;
use crate::block;
use crate::index::Loc;
use crate::{PackedBlock, ReadPage, StoreError, page_start};

/// Why reading a sealed block failed.
pub(super) enum Load {
    /// The segment is gone (compacted since the location was read): look it up again.
    Gone,
    /// Any other failure, for the caller.
    Err(StoreError),
}

/// What a read copied of one block under the state lock, to read the sealed part unlocked.
struct BlockView {
    /// The block's quantum start.
    start: i64,
    /// The frames that may hold points the read needs.
    frames: Vec<Loc>,
    /// The open points the read needs, sorted.
    open: Vec<Point>,
}

/// How an aggregate takes one block.
enum AggView {
    /// The block lies within one window and the range: its summary stands for its points.
    Summary { start: i64, summary: Option<Summary> },
    /// A window or the range cuts the block, or its parts may overlap: its points are needed.
    Points(BlockView),
}

/// The summary of a block whose parts are disjoint, from its frames' summaries and its open
/// points.
pub(super) fn merged_summary(frames: &[Loc], open: &[Point]) -> Option<Summary> {
    frames.iter().map(|l| l.summary).chain(Summary::of(open)).reduce(|a, b| a.merge(&b))
}

/// The frames of `frames` whose key range meets `[from, end)`.
fn frames_in(frames: &[Loc], from: PointKey, end: Timestamp) -> Vec<Loc> {
    frames.iter().filter(|l| l.summary.last.key() >= from && l.summary.first.ts < end).copied().collect()
}

/// Most times one read starts over at a block that compaction moved while it was read.
const MOVED_RETRIES: u32 = 8;

/// Runs `pass` until it finishes, again each time it stops at a block whose segment compaction
/// removed ([`Load::Gone`]), at most [`MOVED_RETRIES`] times. A pass keeps its progress (a
/// cursor, what it has collected) in captured state, so the next one looks up the moved block's
/// new location and goes on from there.
fn retry_moved<T>(mut pass: impl FnMut() -> Result<T, Load>) -> Result<T, StoreError> {
    let mut retries = 0;
    loop {
        match pass() {
            Ok(v) => return Ok(v),
            Err(Load::Gone) if retries < MOVED_RETRIES => retries += 1,
            Err(Load::Gone) => {
                return Err(StoreError::Unavailable("blocks kept moving during compaction; retry the read".into()));
            }
            Err(Load::Err(e)) => return Err(e),
        }
    }
}

impl DiskStore {
    /// One page of a raw read ([`crate::Store::read`]).
    pub(super) fn read_page(
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

    /// Window aggregates ([`crate::Store::aggregate`]): whole-window blocks by their summary,
    /// the others from their points.
    pub(super) fn aggregate_windows(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        grid: Grid,
    ) -> Result<Vec<WindowAggregate>, StoreError> {
        check_windows(&range, grid).map_err(StoreError::InvalidInput)?;
        let Some((id, len)) = self.lookup(series) else {
            return Ok(Vec::new());
        };
        let mut agg = Aggregator::new(range, grid);
        // The first block not yet added.
        let mut cursor = len.quantum_of(range.start()).start;
        retry_moved(|| {
            loop {
                let views: Vec<AggView> = {
                    let st = self.read_state();
                    let Some(s) = st.series.get(&id) else { return Ok(()) };
                    s.blocks
                        .range(cursor..range.end())
                        .take(1024)
                        .map(|(&start, b)| {
                            let whole = agg.fits_one_window(start, start + len.ns());
                            if whole && !b.overlap && !b.open_overlap {
                                AggView::Summary { start, summary: merged_summary(b.frames.as_slice(), &b.open) }
                            } else {
                                let lo = b.open.partition_point(|p| p.ts < range.start());
                                let hi = b.open.partition_point(|p| p.ts < range.end());
                                let open = b.open[lo..hi.max(lo)].to_vec();
                                let from = PointKey { ts: range.start(), event: 0, value_bits: 0 };
                                let frames = frames_in(b.frames.as_slice(), from, range.end());
                                AggView::Points(BlockView { start, frames, open })
                            }
                        })
                        .collect()
                };
                if views.is_empty() {
                    return Ok(());
                }
                for v in views {
                    match v {
                        AggView::Summary { start, summary } => {
                            if let Some(summary) = summary {
                                self.summaries_used.fetch_add(1, Ordering::Relaxed);
                                agg.push_summary(agg.window_of(start), &summary);
                            }
                            cursor = start + 1;
                        }
                        AggView::Points(BlockView { start, frames, open }) => {
                            let pts = match self.load_union(id, start, &frames, open) {
                                Ok(p) => p,
                                Err(e) => {
                                    // Moved: the next pass starts at this block.
                                    cursor = start;
                                    return Err(e);
                                }
                            };
                            agg.push_points(&pts);
                            cursor = start + 1;
                        }
                    }
                }
            }
        })?;
        Ok(agg.finish())
    }

    /// The summary of one block (series, quantum start) over all its points, sealed and late,
    /// computed canonically; `None` if the block holds nothing.
    pub fn block_summary(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<Summary>, StoreError> {
        retry_moved(|| {
            let (id, sealed, open) = {
                let st = self.read_state();
                let Some(&id) = st.ids.get(series) else {
                    return Ok(None);
                };
                let Some(b) = st.series[&id].blocks.get(&quantum_start) else {
                    return Ok(None);
                };
                match (b.frames.as_slice(), b.open.is_empty()) {
                    ([], _) => return Ok(Summary::of(&b.open)),
                    ([loc], true) => return Ok(Some(loc.summary)),
                    (frames, _) => (id, frames.to_vec(), b.open.clone()),
                }
            };
            Ok(Summary::of(&self.load_union(id, quantum_start, &sealed, open)?))
        })
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
        retry_moved(|| {
            while out.len() < want {
                let views: Vec<BlockView> = {
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
                        let frames = frames_in(b.frames.as_slice(), from, end);
                        views.push(BlockView { start, frames, open: b.open[lo..hi].to_vec() });
                    }
                    views
                };
                if views.is_empty() {
                    break;
                }
                for BlockView { start, frames, open } in views {
                    let base = out.len();
                    let r = match (frames.as_slice(), open.is_empty()) {
                        ([], _) => {
                            out.extend_from_slice(&open);
                            Ok(())
                        }
                        // The common case: decode straight into the result.
                        ([loc], true) => self.load_into(id, start, loc, &mut out),
                        (frames, _) => self.load_union(id, start, frames, open).map(|p| out.extend_from_slice(&p)),
                    };
                    if let Err(e) = r {
                        // Moved: the next pass starts at this block.
                        cursor = start;
                        return Err(e);
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
                        return Ok(());
                    }
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The union of the points of `frames` (of block `start` of series `id`) and `open`.
    pub(super) fn load_union(&self, id: u32, start: i64, frames: &[Loc], open: Vec<Point>) -> Result<Vec<Point>, Load> {
        // In key order, so disjoint frames of live data append instead of merging.
        let mut frames = frames.to_vec();
        frames.sort_by_key(|l| l.summary.first);
        let mut acc: Vec<Point> = Vec::new();
        for l in &frames {
            let pts = self.load(id, start, l)?;
            acc = if acc.is_empty() { pts } else { union(acc, &pts) };
        }
        Ok(if acc.is_empty() { open } else { union(acc, &open) })
    }

    /// Reads and decodes one frame of a sealed block.
    pub(super) fn load(&self, id: u32, start: i64, loc: &Loc) -> Result<Vec<Point>, Load> {
        let mut out = Vec::new();
        self.load_into(id, start, loc, &mut out)?;
        Ok(out)
    }

    /// Reads and decodes a sealed block, appending its points to `out`.
    fn load_into(&self, id: u32, start: i64, loc: &Loc, out: &mut Vec<Point>) -> Result<(), Load> {
        let bytes = self.read_frame(id, start, loc)?;
        self.decoded.fetch_add(1, Ordering::Relaxed);
        let base = out.len();
        match block::decode_into(&bytes, out) {
            Ok(h) if h.series == id && h.quantum.start == start => Ok(()),
            Ok(h) => {
                out.truncate(base);
                Err(self.corrupt(
                    id,
                    start,
                    loc,
                    format!("it holds series id {} quantum {} instead", h.series, h.quantum.start),
                ))
            }
            Err(e) => Err(self.corrupt(id, start, loc, e.0)),
        }
    }

    /// Checks the sealed frame at `loc` (of block `start` of series `id`) without decoding its
    /// points: its checksum, and that it is that block's (what a scrub needs; a damaged one is
    /// recorded as a read would record it).
    pub(super) fn check_frame(&self, id: u32, start: i64, loc: &Loc) -> Result<(), Load> {
        let bytes = self.read_frame(id, start, loc)?;
        match block::decode_header(&bytes) {
            Ok(h) if h.series == id && h.quantum.start == start => Ok(()),
            Ok(h) => Err(self.corrupt(
                id,
                start,
                loc,
                format!("it holds series id {} quantum {} instead", h.series, h.quantum.start),
            )),
            Err(e) => Err(self.corrupt(id, start, loc, e.0)),
        }
    }

    /// The bytes of the sealed frame at `loc` (of block `start` of series `id`).
    fn read_frame(&self, id: u32, start: i64, loc: &Loc) -> Result<Vec<u8>, Load> {
        let path = seg_path(loc.seg);
        match self.backend.read_at(&path, loc.offset, loc.len as usize) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Load::Gone),
            // The index places the frame beyond the segment's end (a misdirected or lost
            // append): damage, as a failed checksum is, not a passing I/O failure.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.corrupt(id, start, loc, format!("{path} ends before the frame ({e})")))
            }
            Err(e) => Err(Load::Err(io_error(
                format!("reading the block of series id {id} at quantum {start} from {path}"),
                e,
            ))),
        }
    }

    /// The error for a damaged frame at `loc`, saying which block and what to do.
    fn corrupt(&self, id: u32, start: i64, loc: &Loc, why: String) -> Load {
        self.damaged.lock().expect("damaged lock").insert((id, start));
        let key = self.read_state().series.get(&id).map_or_else(|| format!("id {id}"), |s| s.key.to_string());
        Load::Err(StoreError::Corrupt(format!(
            "the block of {key} at quantum {start} ({}, offset {}, {} bytes) is damaged: {why}; \
             other blocks are still served; re-replicate this one from a replica",
            seg_path(loc.seg),
            loc.offset,
            loc.len
        )))
    }

    /// [`crate::Store::read_packed`]: the block's one sealed pco frame, its columns cut out
    /// (checksum verified) without decoding a point.
    pub(super) fn read_packed_block(
        &self,
        series: &SeriesKey,
        start: Timestamp,
        max_points: u64,
    ) -> Result<Option<PackedBlock>, StoreError> {
        retry_moved(|| {
            let (id, loc) = {
                let st = self.read_state();
                let Some(&id) = st.ids.get(series) else { return Ok(None) };
                let Some(b) = st.series[&id].blocks.get(&start) else { return Ok(None) };
                match (b.frames.as_slice(), b.open.is_empty() && !b.overlap && !b.open_overlap) {
                    ([loc], true) if loc.summary.count <= max_points => (id, *loc),
                    _ => return Ok(None),
                }
            };
            let bytes = self.read_frame(id, start, &loc)?;
            match block::packed_columns(&bytes) {
                Ok(Some((h, columns))) if h.series == id && h.quantum.start == start => {
                    self.packed_sent.fetch_add(1, Ordering::Relaxed);
                    Ok(Some(PackedBlock { count: h.summary.count, digest: h.summary.digest, columns }))
                }
                Ok(Some((h, _))) => Err(self.corrupt(
                    id,
                    start,
                    &loc,
                    format!("it holds series id {} quantum {} instead", h.series, h.quantum.start),
                )),
                Ok(None) => Ok(None),
                Err(e) => Err(self.corrupt(id, start, &loc, e.0)),
            }
        })
    }

    pub(super) fn lookup(&self, series: &SeriesKey) -> Option<(u32, QuantumLen)> {
        let st = self.read_state();
        let id = *st.ids.get(series)?;
        Some((id, st.series[&id].quantum?))
    }
}

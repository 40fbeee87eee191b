//! Queries over the archive: paged reads, window aggregates answered from block summaries where
//! whole quanta fit a window, and the confirmation that the archive covers hot blocks.

use std::ops::Range;
use std::sync::Arc;

use parquet::data_type::{DoubleType, Int64Type};
use timeshard_proto::point::{page_start, sort_dedup};
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, PointKey, Quantum, SeriesClass, SeriesKey, TimeRange, Timestamp};
use timeshard_store::agg::Aggregator;
use timeshard_store::{ReadPage, WindowAggregate};

use crate::Archive;
use crate::catalog::{ArchivedBlock, Part};
use crate::error::Error;
use crate::layout::{self, DAY_NS, Day, FileId, Kind};
use crate::read::ParquetFile;
use crate::schema::points as col;

/// Rows decoded inline; larger spans are decoded on the blocking pool so a big read does not
/// stall the caller's runtime.
const INLINE_ROWS: usize = 16_384;
/// Fewest rows a read batch asks for (small pages would otherwise read block by block).
const MIN_BATCH_ROWS: u64 = 4096;
/// Rows of blocks an aggregate reads at once at most.
const AGG_BATCH_ROWS: u64 = 1 << 20;

/// The one part of `b` that holds rows, if exactly one does.
fn single(b: &ArchivedBlock) -> Option<&Part> {
    let mut parts = b.parts.iter().filter(|p| p.summary.count > 0);
    match (parts.next(), parts.next()) {
        (Some(p), None) => Some(p),
        _ => None,
    }
}

/// Blocks read together: one run of single-part blocks stored contiguously in one file, or one
/// block with several parts (read part by part and merged).
pub(crate) enum Batch<'a> {
    /// `parts` are the blocks' parts, in row order.
    Run {
        file: Arc<FileId>,
        rows: Range<u64>,
        parts: Vec<&'a Part>,
    },
    Merged(&'a ArchivedBlock),
}

/// The batch starting at `blocks[0]` and how many blocks it takes: at least one, and as many
/// more as continue the same run while the run holds fewer than `budget` rows.
fn next_batch(blocks: &[ArchivedBlock], budget: u64) -> (Batch<'_>, usize) {
    let Some(first) = single(&blocks[0]) else { return (Batch::Merged(&blocks[0]), 1) };
    let (file, start) = (Arc::clone(&first.file), first.row_start);
    let mut end = start + first.summary.count;
    let mut parts = vec![first];
    while parts.len() < blocks.len() && end - start < budget {
        match single(&blocks[parts.len()]) {
            Some(p) if p.file == file && p.row_start == end => {
                end += p.summary.count;
                parts.push(p);
            }
            _ => break,
        }
    }
    let taken = parts.len();
    (Batch::Run { file, rows: start..end, parts }, taken)
}

/// Checks the points read from the rows of `parts` (one series, in row order) against the
/// digests their manifest recorded: zstd pages carry no checksum, so a flipped byte in a points
/// file can decode to other values. The points are the last rows before `end` (pages wholly
/// before a read's floor are skipped, a prefix); a part only partly read is not checked.
fn verify(file: &FileId, end: u64, parts: &[&Part], points: &[Point]) -> Result<(), Error> {
    let first_row = end.saturating_sub(points.len() as u64);
    for p in parts.iter().filter(|p| p.row_start >= first_row) {
        let at = (p.row_start - first_row) as usize;
        let Some(rows) = points.get(at..at + p.summary.count as usize) else { continue };
        let digest = timeshard_proto::point::set_digest(rows);
        if digest != p.summary.digest {
            return Err(Error::corrupt(
                file.path(Kind::Points),
                format!(
                    "rows {}..{} decode to points whose digest {digest:#x} is not the {:#x} its manifest recorded",
                    p.row_start,
                    p.row_start + p.summary.count,
                    p.summary.digest
                ),
            ));
        }
    }
    Ok(())
}

/// What the archive may hold of a class, as its last listing says (see [`Archive::horizon`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizon {
    /// Every archived point of the class is earlier than this ([`Timestamp::MIN`] when the
    /// archive holds none): a range starting here or later has nothing cold.
    pub cold_until: Timestamp,
    /// Age of the listing it comes from; past the listing TTL, [`Archive::relist`] renews it.
    pub age: std::time::Duration,
}

impl Archive {
    /// The [`Horizon`] of `class` from the cached listing, without I/O; `None` when the class
    /// was never listed by this handle. Exports of this handle move it at once; exports of
    /// other nodes show after a relisting.
    pub fn horizon(&self, class: &SeriesClass) -> Option<Horizon> {
        let (newest, age) = self.inner.catalog.newest_day(&class.name)?;
        // A block lives in the partition of its quantum's start, so its points end before the
        // next day plus one quantum.
        let cold_until = newest.map_or(Timestamp::MIN, |d| (d.start() + DAY_NS).saturating_add(class.quantum.ns()));
        Some(Horizon { cold_until, age })
    }

    /// Lists the committed exports of `class` now (what [`Archive::horizon`] and queries go
    /// by); on failure the previous listing stays in use.
    pub async fn relist(&self, class: &SeriesClass) -> Result<(), Error> {
        layout::check_class(&class.name)?;
        self.inner.catalog.relist(&class.name).await
    }

    /// The days whose partitions may hold points of `range` for `class`: from the day of the
    /// quantum holding the range's start (a block lives in the partition of its quantum's
    /// start) to the day of its end.
    fn days_of(class: &SeriesClass, range: &TimeRange) -> (Day, Day) {
        (Day::of(class.quantum.quantum_of(range.start()).start), Day::of(range.end() - 1))
    }

    /// Archived blocks of `series` whose quanta overlap `range`, in time order.
    pub async fn blocks(
        &self,
        class: &SeriesClass,
        series: &SeriesKey,
        range: TimeRange,
    ) -> Result<Vec<ArchivedBlock>, Error> {
        layout::check_class(&class.name)?;
        let (from, to) = Archive::days_of(class, &range);
        let mut out = Vec::new();
        for (day, ids) in self.inner.catalog.manifests(&class.name, from, to).await? {
            let blocks =
                self.live_blocks(&class.name, self.inner.catalog.blocks(&class.name, day, series, &ids).await?);
            out.extend(
                blocks.iter().filter(|b| b.quantum.end() > range.start() && b.quantum.start < range.end()).cloned(),
            );
        }
        Ok(out)
    }

    /// Points of `series` within `range` in the archive, sorted by identity, strictly after
    /// `after`, at most `limit` of them: the same page as [`timeshard_store::Store::read`]
    /// gives for the hot tier, so the node can merge the two.
    pub async fn read(
        &self,
        class: &SeriesClass,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, Error> {
        layout::check_class(&class.name)?;
        let start = page_start(&range, after);
        let (from, to) = Archive::days_of(class, &range);
        let mut out: Vec<Point> = Vec::new();
        for (day, ids) in self.inner.catalog.manifests(&class.name, from, to).await? {
            let blocks =
                self.live_blocks(&class.name, self.inner.catalog.blocks(&class.name, day, series, &ids).await?);
            let mut i = blocks.partition_point(|b| b.quantum.end() <= start.ts);
            while i < blocks.len() && blocks[i].quantum.start < range.end() {
                let budget = (limit as u64 + 1).saturating_sub(out.len() as u64).max(MIN_BATCH_ROWS);
                let (batch, taken) = next_batch(&blocks[i..], budget);
                let points = self.load(&batch, start.ts).await?;
                out.extend(points.into_iter().filter(|p| range.contains(p.ts) && p.key() >= start));
                if out.len() > limit {
                    out.truncate(limit);
                    return Ok(ReadPage { points: out, more: true });
                }
                i += taken;
            }
        }
        Ok(ReadPage { points: out, more: false })
    }

    /// Window aggregates of `series` over `range` in the archive, in the windows of `grid`, as
    /// [`timeshard_store::Store::aggregate`] computes them for the hot tier: a block whose
    /// quantum lies within one window and the range is answered from its manifest summary;
    /// only blocks cut by a window or range edge (or with racing parts) are read.
    pub async fn aggregate(
        &self,
        class: &SeriesClass,
        series: &SeriesKey,
        range: TimeRange,
        grid: Grid,
    ) -> Result<Vec<WindowAggregate>, Error> {
        layout::check_class(&class.name)?;
        timeshard_proto::window::check_windows(&range, grid).map_err(Error::InvalidInput)?;
        let mut agg = Aggregator::new(range, grid);
        let mut pending: Vec<ArchivedBlock> = Vec::new();
        let (from, to) = Archive::days_of(class, &range);
        for (day, ids) in self.inner.catalog.manifests(&class.name, from, to).await? {
            let blocks =
                self.live_blocks(&class.name, self.inner.catalog.blocks(&class.name, day, series, &ids).await?);
            for b in blocks.iter().filter(|b| b.quantum.end() > range.start() && b.quantum.start < range.end()) {
                let whole = agg.fits_one_window(b.quantum.start, b.quantum.end());
                match b.summary().filter(|_| whole) {
                    Some(s) => {
                        self.flush_points(&mut agg, &mut pending).await?;
                        agg.push_summary(agg.window_of(b.quantum.start), &s);
                    }
                    None if b.rows() > 0 => {
                        pending.push(b.clone());
                        if pending.iter().map(ArchivedBlock::rows).sum::<u64>() >= AGG_BATCH_ROWS {
                            self.flush_points(&mut agg, &mut pending).await?;
                        }
                    }
                    None => {}
                }
            }
        }
        self.flush_points(&mut agg, &mut pending).await?;
        Ok(agg.finish())
    }

    async fn flush_points(&self, agg: &mut Aggregator, pending: &mut Vec<ArchivedBlock>) -> Result<(), Error> {
        let mut i = 0;
        while i < pending.len() {
            let (batch, taken) = next_batch(&pending[i..], AGG_BATCH_ROWS);
            agg.push_points(&self.load(&batch, Timestamp::MIN).await?);
            i += taken;
        }
        pending.clear();
        Ok(())
    }

    /// Whether the archive holds every point of each hot block (`series`, `quantum`,
    /// `digest`), in the order asked: what a replica checks before dropping its hot copy.
    /// Lists each partition afresh, so the answer does not lag the archive.
    pub async fn confirmed(
        &self,
        class: &SeriesClass,
        blocks: &[(SeriesKey, Quantum, u64)],
    ) -> Result<Vec<bool>, Error> {
        layout::check_class(&class.name)?;
        let mut out = Vec::with_capacity(blocks.len());
        let mut listed: Option<(Day, Vec<FileId>)> = None;
        for (series, quantum, digest) in blocks {
            let day = Day::of(quantum.start);
            if listed.as_ref().is_none_or(|(d, _)| *d != day) {
                listed = Some((day, self.inner.catalog.manifests_now(&class.name, day).await?));
            }
            let ids = &listed.as_ref().expect("listed above").1;
            let archived = self.inner.catalog.blocks(&class.name, day, series, ids).await?;
            let hit = archived
                .binary_search_by_key(&quantum.start, |b| b.quantum.start)
                .is_ok_and(|i| archived[i].covers(*digest));
            out.push(hit);
        }
        Ok(out)
    }

    /// [`Archive::confirmed`] for one block.
    pub async fn contains(
        &self,
        class: &SeriesClass,
        series: &SeriesKey,
        quantum: Quantum,
        digest: u64,
    ) -> Result<bool, Error> {
        Ok(self.confirmed(class, &[(series.clone(), quantum, digest)]).await?[0])
    }

    /// The points of a batch, sorted by identity; rows whose page lies wholly before `floor`
    /// (by the timestamp page index) may be left out.
    pub(crate) async fn load(&self, batch: &Batch<'_>, floor: Timestamp) -> Result<Vec<Point>, Error> {
        match batch {
            Batch::Run { file, rows, parts } => {
                let points = self.read_rows(file, rows.clone(), floor).await?;
                verify(file, rows.end, parts, &points)?;
                Ok(points)
            }
            Batch::Merged(block) => {
                let mut all = Vec::new();
                for p in block.parts.iter().filter(|p| p.summary.count > 0) {
                    let end = p.row_start + p.summary.count;
                    let points = self.read_rows(&p.file, p.row_start..end, floor).await?;
                    verify(&p.file, end, &[p], &points)?;
                    all.extend(points);
                }
                sort_dedup(&mut all);
                Ok(all)
            }
        }
    }

    /// Rows `rows` of the points file of `file` as points.
    pub(crate) async fn read_rows(
        &self,
        file: &FileId,
        rows: Range<u64>,
        floor: Timestamp,
    ) -> Result<Vec<Point>, Error> {
        let pf = self.inner.catalog.points(file).await?;
        let mut out = Vec::with_capacity((rows.end - rows.start) as usize);
        for mut span in pf.spans(rows) {
            span.start = pf.first_row_from(&span, col::TIMESTAMP, floor);
            if span.start >= span.end {
                continue;
            }
            let pages = pf.fetch(&**self.store(), &span, &[col::TIMESTAMP, col::VALUE, col::EVENT_ID]).await?;
            let decode = move |pf: &ParquetFile| -> Result<Vec<Point>, Error> {
                let ts = pf.decode::<Int64Type>(&pages, &span, col::TIMESTAMP)?;
                let values = pf.decode::<DoubleType>(&pages, &span, col::VALUE)?;
                let events = pf.decode::<Int64Type>(&pages, &span, col::EVENT_ID)?;
                Ok(ts
                    .iter()
                    .zip(&values)
                    .zip(&events)
                    .map(|((&ts, &value), &e)| Point { ts, value, event: e as u64 })
                    .collect())
            };
            let points = if span.end - span.start <= INLINE_ROWS {
                decode(&pf)?
            } else {
                let pf = Arc::clone(&pf);
                timeshard_clock::spawn_blocking(move || decode(&pf))
                    .await
                    .map_err(|e| Error::Internal(format!("decoding task failed: {e}")))??
            };
            out.extend(points);
        }
        Ok(out)
    }
}

//! The store a node with an archive serves from: its hot store, with the reads and window
//! aggregates of archived classes merged with what the archive holds, so a replica answers the
//! same whether a block is hot, cold, or both.
//!
//! # How the tiers merge
//!
//! - Reads: the hot page and the archive's page of the same range are merged as sets (sorted,
//!   duplicates dropped) and cut to the limit. The archive only ever holds points that were
//!   written, so the union is exact while a block is in both tiers (exported, not yet dropped)
//!   and when late data arrived for an archived quantum.
//! - Aggregates: quanta the archive does not hold come from the hot store, quanta it holds in
//!   full (no hot copy left, or the hot copy's digest is covered) from the archive's block
//!   summaries (no Parquet read for whole quanta in a window), and quanta with points in both
//!   tiers that the archive does not cover (late data) from the union of their points.
//! - Only ranges that may hold cold points ask the archive: those starting before its horizon
//!   ([`timeshard_tier::Archive::horizon`], from the last listing, renewed in the background
//!   once older than the listing TTL). Reads of recent data never wait for the object store,
//!   reachable or not. Before the first listing succeeds (the archive unreachable since the
//!   node started), ranges after the newest block this node ever dropped (its drop horizon,
//!   kept on disk) are answered from the hot store alone: they are all still there.
//!
//! Repair (anti-entropy and handoff, which list blocks through this store) does not see the
//! blocks of archived classes past their hot window: those are the tier's. Each replica exports
//! what the archive lacks of its copy and then drops it; copying such a block between replicas
//! would only bring back copies they just dropped. Everything else (writes, registrations,
//! maintenance, the other block-level calls) goes to the hot store unchanged. The [`Store`] calls are blocking; the node
//! makes them on blocking threads, where this store waits for the archive on the runtime.

use std::sync::Arc;

use timeshard_clock::now_ns;
use timeshard_proto::point::sort_dedup;
use timeshard_proto::window::{Grid, check_windows, merge_windows};
use timeshard_proto::{Point, PointKey, SeriesClass, SeriesKey, TimeRange, Timestamp};
use timeshard_store::agg::Aggregator;
use timeshard_store::{
    BlockInfo, BlockPage, DamagedBlock, ListCursor, MaintenanceReport, ReadPage, RetentionRule, ScrubPage, SeriesPage,
    Store, StoreError, WindowAggregate, WriteStats,
};
use timeshard_tier::ArchivedBlock;

use super::Tier;

/// Points per page when a quantum's points are gathered whole.
const GATHER_PAGE: usize = 65_536;

/// The hot store with the archive merged into reads and aggregates (see the module docs).
#[derive(Debug)]
pub struct TieredStore {
    tier: Arc<Tier>,
}

/// A failure of the archive as the hot store's callers know failures.
fn from_tier(e: timeshard_tier::Error) -> StoreError {
    match e {
        timeshard_tier::Error::Hot(e) => e,
        timeshard_tier::Error::Corrupt { .. } => StoreError::Corrupt(e.to_string()),
        timeshard_tier::Error::InvalidInput(m) => StoreError::InvalidInput(m),
        other => StoreError::Unavailable(format!("the archive failed: {other}")),
    }
}

/// The union of two pages of the same range after the same cursor, cut to `limit`: each holds
/// the first points of its set, so the first `limit` of their union are the union's.
fn merge_pages(hot: ReadPage, cold: ReadPage, limit: usize) -> ReadPage {
    if cold.points.is_empty() {
        return ReadPage { points: hot.points, more: hot.more || cold.more };
    }
    let mut points = hot.points;
    points.extend(cold.points);
    sort_dedup(&mut points);
    let more = hot.more || cold.more || points.len() > limit;
    points.truncate(limit);
    ReadPage { points, more }
}

impl TieredStore {
    /// Serves the hot store of `tier` merged with its archive.
    pub fn new(tier: Arc<Tier>) -> TieredStore {
        TieredStore { tier }
    }

    fn hot(&self) -> &dyn Store {
        &**self.tier.hot()
    }

    /// The archive's answer to `f`. Store calls run on blocking threads, which wait for it on
    /// the runtime. A simulated host has no thread to spare: the simulated object store
    /// answers from memory at once, so its answer is taken at the first poll, and one that
    /// has to wait (an injected failure retried after a backoff, a listing another task
    /// holds) fails the call retryably.
    fn wait<F: std::future::Future>(&self, f: F) -> Result<F::Output, StoreError> {
        if timeshard_clock::sim::active() {
            return futures::FutureExt::now_or_never(f).ok_or_else(|| {
                StoreError::Unavailable("the archive did not answer at once (simulated host); try again".into())
            });
        }
        Ok(self.tier.runtime.block_on(f))
    }

    /// The class of `series` when `range` may hold cold points of it. Classes that are not
    /// archived (any more) are asked too: history a class exported before it was switched to
    /// `archive = false` stays readable; a class the archive never held costs one listing per
    /// listing TTL, in the background.
    fn cold_class(&self, series: &SeriesKey, range: TimeRange) -> Result<Option<SeriesClass>, StoreError> {
        let Some(archive) = self.tier.archive() else { return Ok(None) };
        let policy = self.tier.policy();
        let Some(class) = policy.class_in_archive(series) else { return Ok(None) };
        let horizon = match archive.horizon(class) {
            Some(h) => h,
            // Not listed yet (the archive may be unreachable): this replica's hot copies of
            // a range it never dropped anything from are its whole answer.
            None if range.start() >= self.tier.drop_horizon(&class.name) => return Ok(None),
            None => {
                self.wait(self.tier.relist(class))?.map_err(|e| {
                    StoreError::Unavailable(format!(
                        "the archive cannot be listed, so its cold ranges cannot be read: {e}"
                    ))
                })?;
                archive.horizon(class).ok_or_else(|| StoreError::Unavailable("the archive is not listed".into()))?
            }
        };
        if horizon.age > self.tier.config.listing_ttl {
            self.tier.relist_soon(class);
        }
        Ok((range.start() < horizon.cold_until).then(|| class.clone()))
    }

    /// Every point of `series` in `range`, from both tiers.
    fn gather(&self, class: &SeriesClass, series: &SeriesKey, range: TimeRange) -> Result<Vec<Point>, StoreError> {
        let archive = self.tier.archive().ok_or_else(|| StoreError::Unavailable("no archive".into()))?;
        let mut all = Vec::new();
        let mut after: Option<PointKey> = None;
        loop {
            let page = self.hot().read(series, range, after, GATHER_PAGE)?;
            after = page.points.last().map(Point::key);
            all.extend(page.points);
            if !page.more {
                break;
            }
        }
        after = None;
        loop {
            let page = self.wait(archive.read(class, series, range, after, GATHER_PAGE))?.map_err(from_tier)?;
            after = page.points.last().map(Point::key);
            all.extend(page.points);
            if !page.more {
                break;
            }
        }
        sort_dedup(&mut all);
        Ok(all)
    }

    fn aggregate_tiers(
        &self,
        class: &SeriesClass,
        series: &SeriesKey,
        range: TimeRange,
        grid: Grid,
    ) -> Result<Vec<WindowAggregate>, StoreError> {
        let archive = self.tier.archive().ok_or_else(|| StoreError::Unavailable("no archive".into()))?;
        let archived: Vec<ArchivedBlock> = self.wait(archive.blocks(class, series, range))?.map_err(from_tier)?;
        if archived.is_empty() {
            return self.hot().aggregate(series, range, grid);
        }
        let span = |from: Timestamp, to: Timestamp| {
            TimeRange::new(from, to).map_err(|e| StoreError::InvalidInput(e.to_string()))
        };
        let mut parts: Vec<Vec<WindowAggregate>> = Vec::new();
        // Consecutive quanta the archive answers alone, asked of it in one call.
        let mut cold_run: Option<(Timestamp, Timestamp)> = None;
        let flush = |run: &mut Option<(Timestamp, Timestamp)>, parts: &mut Vec<Vec<WindowAggregate>>| {
            if let Some((from, to)) = run.take() {
                let windows = self.wait(archive.aggregate(class, series, span(from, to)?, grid))?;
                parts.push(windows.map_err(from_tier)?);
            }
            Ok::<(), StoreError>(())
        };
        let mut cursor = range.start();
        for block in &archived {
            let (from, to) = (block.quantum.start.max(range.start()), block.quantum.end().min(range.end()));
            if from >= to {
                continue;
            }
            if cursor < from {
                flush(&mut cold_run, &mut parts)?;
                parts.push(self.hot().aggregate(series, span(cursor, from)?, grid)?);
            }
            let hot = self.hot().block_info(series, block.quantum.start)?;
            if hot.is_none_or(|h| block.covers(h.digest)) {
                cold_run = Some((cold_run.map_or(from, |(start, _)| start), to));
            } else {
                flush(&mut cold_run, &mut parts)?;
                let mut agg = Aggregator::new(span(from, to)?, grid);
                agg.push_points(&self.gather(class, series, span(from, to)?)?);
                parts.push(agg.finish());
            }
            cursor = to;
        }
        flush(&mut cold_run, &mut parts)?;
        if cursor < range.end() {
            parts.push(self.hot().aggregate(series, span(cursor, range.end())?, grid)?);
        }
        Ok(merge_windows(&range, grid, parts))
    }
}

impl Store for TieredStore {
    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        let hot = self.hot().read(series, range, after, limit)?;
        let Some(class) = self.cold_class(series, range)? else { return Ok(hot) };
        let archive = self.tier.archive().ok_or_else(|| StoreError::Unavailable("no archive".into()))?;
        let cold = self.wait(archive.read(&class, series, range, after, limit))?.map_err(from_tier)?;
        Ok(merge_pages(hot, cold, limit))
    }

    fn aggregate(&self, series: &SeriesKey, range: TimeRange, grid: Grid) -> Result<Vec<WindowAggregate>, StoreError> {
        check_windows(&range, grid).map_err(StoreError::InvalidInput)?;
        match self.cold_class(series, range)? {
            Some(class) => self.aggregate_tiers(&class, series, range, grid),
            None => self.hot().aggregate(series, range, grid),
        }
    }

    fn write(&self, blocks: &[timeshard_proto::wire::BlockPoints]) -> Result<WriteStats, StoreError> {
        self.tier.note_writes(blocks)?;
        self.hot().write(blocks)
    }

    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError> {
        self.hot().register_series(series)
    }

    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError> {
        self.hot().has_series(series)
    }

    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError> {
        self.hot().list_series(metric_prefix)
    }

    fn find_series(&self, filter: &timeshard_store::SeriesFilter) -> Result<Vec<SeriesKey>, StoreError> {
        self.hot().find_series(filter)
    }

    fn find_series_page(
        &self,
        filter: &timeshard_store::SeriesFilter,
        limit: usize,
    ) -> Result<(Vec<SeriesKey>, bool), StoreError> {
        self.hot().find_series_page(filter, limit)
    }

    fn maintain(&self, now: Timestamp) -> Result<MaintenanceReport, StoreError> {
        self.hot().maintain(now)
    }

    /// The hot store's blocks but those leaving for the archive (see the module docs).
    fn list_blocks(&self, after: Option<ListCursor>, limit: usize) -> Result<BlockPage, StoreError> {
        let mut page = self.hot().list_blocks(after, limit)?;
        let (policy, now) = (self.tier.policy(), now_ns());
        page.blocks = std::mem::take(&mut page.blocks)
            .into_iter()
            .map(|b| self.tier.with_write_time(&policy, b))
            .filter(|b| !self.tier.leaving(&policy, b, now))
            .collect();
        Ok(page)
    }

    /// The hot store's block, with its durable write time (see [`Tier::with_write_time`]).
    fn block_info(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<Option<BlockInfo>, StoreError> {
        let info = self.hot().block_info(series, quantum_start)?;
        Ok(info.map(|b| self.tier.with_write_time(&self.tier.policy(), b)))
    }

    fn read_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError> {
        self.hot().read_block(series, quantum_start, after, limit)
    }

    fn drop_block(
        &self,
        series: &SeriesKey,
        quantum_start: Timestamp,
        expected_digest: u64,
    ) -> Result<bool, StoreError> {
        self.hot().drop_block(series, quantum_start, expected_digest)
    }

    fn take_damaged(&self) -> Vec<DamagedBlock> {
        self.hot().take_damaged()
    }

    fn scrub(&self, after: Option<ListCursor>, max_frames: usize) -> Result<ScrubPage, StoreError> {
        self.hot().scrub(after, max_frames)
    }

    fn drop_damaged(&self, series: &SeriesKey, quantum_start: Timestamp) -> Result<bool, StoreError> {
        self.hot().drop_damaged(series, quantum_start)
    }

    fn list_registered(&self, after: Option<ListCursor>, limit: usize) -> Result<SeriesPage, StoreError> {
        self.hot().list_registered(after, limit)
    }

    fn set_retention(&self, rules: Vec<RetentionRule>) {
        self.hot().set_retention(rules);
    }

    fn set_quotas(&self, rules: Vec<timeshard_store::QuotaRule>) {
        self.hot().set_quotas(rules);
    }

    fn quota_use(&self) -> Vec<timeshard_store::QuotaUse> {
        self.hot().quota_use()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ts: &[i64], more: bool) -> ReadPage {
        ReadPage { points: ts.iter().map(|&t| Point::new(t, t as f64)).collect(), more }
    }

    #[test]
    fn pages_merge_as_sets_cut_to_the_limit() {
        let merged = merge_pages(page(&[1, 2, 5], false), page(&[2, 3], false), 10);
        assert_eq!(merged, page(&[1, 2, 3, 5], false));
        // Both full: the union is cut, and says more follow.
        let merged = merge_pages(page(&[1, 4, 6], true), page(&[2, 3, 4], true), 3);
        assert_eq!(merged, page(&[1, 2, 3], true));
        // One side done, the other not.
        let merged = merge_pages(page(&[7], false), page(&[1, 2], true), 2);
        assert_eq!(merged, page(&[1, 2], true));
        assert_eq!(merge_pages(page(&[1], true), page(&[], false), 1), page(&[1], true));
    }
}

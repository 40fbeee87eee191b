//! The read path: one page of a range read, fetched quantum by quantum from R replicas each,
//! and the scan of a series' quantum index that lets long, sparse reads (and queries) skip
//! quanta without data.
//!
//! What a page scans, how many quanta it fetches at once and where the next page continues is
//! decided by [`timeshard_proto::read::Page`]; this module runs the fetches.

use std::sync::Arc;

use timeshard_proto::key;
use timeshard_proto::placement::placement_id;
use timeshard_proto::quantum_index::Scan;
use timeshard_proto::read::{self, Page};
use timeshard_proto::wire::{ErrorCode, ErrorReply};
use timeshard_proto::{Point, PointKey, Quantum, SeriesClass, SeriesKey, TimeRange};

use super::Coordinator;

impl Coordinator {
    /// One page of a read: points of `series` in `range` strictly after `after`, at most
    /// `limit`, and the cursor to continue from if there are more.
    pub async fn read(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: u32,
    ) -> Result<(Vec<Point>, Option<PointKey>), ErrorReply> {
        let classes = self.classes();
        let class = classes.of(&series).clone();
        let limits = self.limits();
        let Some(scan) = read::scan_range(&range, after) else {
            return Ok((Vec::new(), None));
        };
        let page_quanta = limits.max_quanta_per_page;
        // Long scans skip the quanta that hold no data, as the quantum index says.
        let (parts, more_quanta) = if read::uses_index(scan, class.quantum) {
            let (indexed, more) = self.indexed_quanta(&series, &class, scan, page_quanta).await?;
            (read::block_parts(indexed, &scan), more)
        } else {
            read::first_parts(scan, class.quantum, page_quanta)
        };
        let mut page = Page::new(parts, more_quanta, limit as usize, limits.read_parallelism);
        while let Some((window, remaining)) = page.next_fetches() {
            let targets = window
                .iter()
                .map(|part| self.target(&series, placement_id(&series, &part.quantum, &classes), &class))
                .collect::<Result<Vec<_>, _>>()?;
            let fetches = window.iter().zip(&targets).map(|(part, target)| {
                self.fetch_block(&series, &series, &class, target, part.quantum, part.range, after, remaining)
            });
            for result in futures::future::join_all(fetches).await {
                if page.push(result?) {
                    break;
                }
            }
        }
        let page = page.finish();
        if page.reached_end && page.points.is_empty() && after.is_none() && !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok((page.points, page.next))
    }

    /// The quanta of `series` overlapping `scan` that hold data, in time order, from the
    /// series' quantum index (read from R of its replicas and merged, like any block); at most
    /// `limit` of them, and whether more follow.
    pub(super) async fn indexed_quanta(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        scan: TimeRange,
        limit: usize,
    ) -> Result<(Vec<Quantum>, bool), ErrorReply> {
        let index = key::quantum_index_series(series);
        let classes = self.classes();
        let mut found = Scan::new(scan, class.quantum, limit);
        for (q, part) in found.index_parts() {
            let at = self.target(series, placement_id(&index, &q, &classes), class)?;
            let entries = self.fetch_block(&index, series, class, &at, q, part, None, usize::MAX).await?;
            if found.push(&entries) {
                break;
            }
        }
        Ok(found.finish())
    }
}

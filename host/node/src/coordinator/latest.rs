//! The newest point of a series, found from the newest data backwards without scanning older
//! quanta: the series' quantum index says which index blocks hold entries (one window
//! aggregate per index block, in one request per replica), the newest entries name the spans
//! of quanta holding data, a window aggregate over the newest span gives the time of its last
//! point (from block summaries), and a read of that instant gives the point itself.

use std::sync::Arc;

use timeshard_proto::key::{self, series_meta_id};
use timeshard_proto::quantum_index::span_ns;
use timeshard_proto::time::{self, MAX_TIMESTAMP, MIN_TIMESTAMP};
use timeshard_proto::window::Grid;
use timeshard_proto::window::WindowStats;
use timeshard_proto::wire::{BlockPart, ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Contact, Point, Quantum, SeriesKey, TimeRange, Timestamp};

use super::{Coordinator, unavailable};

impl Coordinator {
    /// The newest point of `series` strictly before `before` (the last in identity order when
    /// several share its timestamp), or `None` if it holds none there.
    pub async fn latest(self: &Arc<Self>, series: SeriesKey, before: Timestamp) -> Result<Option<Point>, ErrorReply> {
        let before = before.clamp(MIN_TIMESTAMP + 1, MAX_TIMESTAMP);
        let class = self.classes().of(&series).clone();
        let index = key::quantum_index_series(&series);
        let meta = series_meta_id(&series);
        let whole = TimeRange::new(MIN_TIMESTAMP, before)
            .map_err(|e| ErrorReply::new(ErrorCode::InvalidRange, e.to_string()))?;
        let parts: Vec<BlockPart> =
            time::quanta(whole, key::index_quantum()).map(|(quantum, range)| BlockPart { quantum, range }).collect();

        // Which index blocks hold entries: one window per block, from R settled replicas
        // (further candidates while owners catch up; inside the CoI every in-CoI owner,
        // settled), merged.
        let at = self.target(&series, meta, &class)?;
        let plan = self.read_plan(&at, &class);
        let (candidates, r) = (plan.candidates, plan.r);
        let in_coi = plan.strict.then(|| series.clone());
        let width = key::index_quantum().ns();
        let n = parts.len();
        let ask = |c: Contact| {
            let in_coi = in_coi.clone();
            let req =
                Request::FetchWindows { series: index.clone(), parts: parts.clone(), grid: Grid::epoch(width), in_coi };
            async move {
                match self.replica_call(&c, req).await? {
                    Response::BlockWindows { parts: p, settled } if p.len() == n => Ok((p, settled)),
                    other => Err(unavailable(format!("unexpected answer to an index window fetch: {other:?}"))),
                }
            }
        };
        let what = || format!("the quantum index of {series}");
        let answers = Self::ask_candidates(&candidates, r, plan.strict, what, ask).await?;
        let held = |i: usize| answers.iter().any(|a| a.value[i].iter().any(|w: &WindowStats| w.count > 0));

        let span = span_ns(class.quantum);
        for i in (0..parts.len()).rev().filter(|&i| held(i)) {
            let part = parts[i];
            let entries =
                self.fetch_block(&index, &series, &class, &at, part.quantum, part.range, None, usize::MAX).await?;
            // Entries of an older quantum length cannot be read under the current one.
            let spans = entries.iter().rev().filter(|e| Quantum::at(e.ts, class.quantum).is_some());
            for entry in spans {
                let Ok(range) = TimeRange::new(entry.ts, entry.ts.saturating_add(span).min(before)) else { continue };
                let windows = self.aggregate(series.clone(), range, Grid::epoch(span)).await?;
                let Some(last_ts) = windows.iter().filter(|w| w.count > 0).map(|w| w.last_ts).max() else { continue };
                let instant = TimeRange::new(last_ts, last_ts + 1).map_err(|e| unavailable(e.to_string()))?;
                let (points, _) = self.read(series.clone(), instant, None, self.limits().max_page_points).await?;
                return Ok(points.into_iter().next_back());
            }
        }
        if !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok(None)
    }
}

//! Computations pushed down to the owners of each block: window aggregates and query policies.
//!
//! Each owner node gets one request carrying every block part it is asked about, computes its
//! answers from its own points (block summaries, or a policy's partials), and only those small
//! answers travel here to be merged. R owners answer for each part; when they disagree (a
//! replica missed a write), the part is reconciled on its own: asked of further replicas and,
//! if they still differ, computed here over the union of their raw points, so the answer covers
//! every acknowledged point. Which owner is asked about what and when answers agree is decided
//! by `timeshard_proto::agreement`.

use std::sync::Arc;

use timeshard_policy::Registry;
use timeshard_proto::agreement::{self, OwnerAnswers};
use timeshard_proto::placement::placement_id;
use timeshard_proto::point::set_digest;
use timeshard_proto::read::{self, MAX_QUERY_QUANTA};
use timeshard_proto::window::{Grid, WindowStats, merge_windows};
use timeshard_proto::wire::{
    BlockPart, ErrorCode, ErrorReply, MAX_BLOCK_PARTS, PartialResult, QueryOutput, Request, Response, Summarized,
};
use timeshard_proto::{Contact, Point, SeriesClass, SeriesKey, TimeRange};
use timeshard_store::agg::Aggregator;

use super::{Coordinator, OWNER_PARALLELISM, bounded_in_order, unavailable};
use crate::policies;

/// A computation pushed down to the owners of block parts: what to ask them, how to read and
/// compare their answers, and how to compute an answer here from merged raw points.
trait PushDown: Sync {
    type Answer: Send;

    /// The request asking one owner about `parts`, counted as an in-CoI owner when `in_coi`
    /// names the series placing them (see `Request::Fetch`).
    fn request(&self, parts: Vec<BlockPart>, in_coi: Option<SeriesKey>) -> Request;

    /// The per-part answers in `resp`, checked against the number of parts asked, and whether
    /// the owner said it is settled.
    fn parse(&self, resp: Response, parts: usize) -> Result<(Vec<Self::Answer>, bool), ErrorReply>;

    /// Whether two owners' answers come from the same points.
    fn agree(&self, a: &Self::Answer, b: &Self::Answer) -> bool;

    /// The answer for `part` computed here from `points`, its replicas' points merged.
    fn compute_here(
        &self,
        part: BlockPart,
        points: Vec<Point>,
    ) -> impl Future<Output = Result<Self::Answer, ErrorReply>> + Send;
}

/// Window aggregates of block parts in the windows of `grid`. Equal answers (digests included)
/// mean the owners hold the same points.
struct Windows {
    series: SeriesKey,
    grid: Grid,
}

impl PushDown for Windows {
    type Answer = Vec<WindowStats>;

    fn request(&self, parts: Vec<BlockPart>, in_coi: Option<SeriesKey>) -> Request {
        Request::FetchWindows { series: self.series.clone(), parts, grid: self.grid, in_coi }
    }

    fn parse(&self, resp: Response, parts: usize) -> Result<(Vec<Vec<WindowStats>>, bool), ErrorReply> {
        match resp {
            Response::BlockWindows { parts: p, settled } if p.len() == parts => Ok((p, settled)),
            other => Err(unavailable(format!("unexpected answer to a window fetch of {parts} parts: {other:?}"))),
        }
    }

    fn agree(&self, a: &Vec<WindowStats>, b: &Vec<WindowStats>) -> bool {
        a == b
    }

    async fn compute_here(&self, part: BlockPart, points: Vec<Point>) -> Result<Vec<WindowStats>, ErrorReply> {
        let mut aggregator = Aggregator::new(part.range, self.grid);
        aggregator.push_points(&points);
        Ok(aggregator.finish())
    }
}

/// Query policy `policy`'s partials over block parts. Owners that report the same points
/// (count and digest) agree, and one owner's partials stand for all.
struct Summaries {
    series: SeriesKey,
    registry: Arc<Registry>,
    /// `name@version`: every owner runs this version or refuses.
    policy: String,
    params: Vec<(String, String)>,
}

impl PushDown for Summaries {
    type Answer = Summarized;

    fn request(&self, parts: Vec<BlockPart>, in_coi: Option<SeriesKey>) -> Request {
        Request::Summarize {
            series: self.series.clone(),
            parts,
            policy: self.policy.clone(),
            params: self.params.clone(),
            in_coi,
        }
    }

    fn parse(&self, resp: Response, parts: usize) -> Result<(Vec<Summarized>, bool), ErrorReply> {
        match resp {
            Response::Partials { parts: p, settled } if p.len() == parts => Ok((p, settled)),
            other => Err(unavailable(format!("unexpected answer to a summarize of {parts} parts: {other:?}"))),
        }
    }

    fn agree(&self, a: &Summarized, b: &Summarized) -> bool {
        agreement::same_points(a, b)
    }

    async fn compute_here(&self, part: BlockPart, points: Vec<Point>) -> Result<Summarized, ErrorReply> {
        let (count, digest) = (points.len() as u64, set_digest(&points));
        let params = self.params.iter().cloned().collect();
        let partials = policies::summarize_points(
            self.registry.clone(),
            self.series.clone(),
            part.range,
            points,
            self.policy.clone(),
            params,
        )
        .await?;
        Ok(Summarized { partials, points: count, digest })
    }
}

impl Coordinator {
    /// Runs query policy `policy` over `range` of `series`: pushed down to the owners of each
    /// quantum, merged here.
    pub async fn query(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        policy: String,
        params: Vec<(String, String)>,
    ) -> Result<QueryOutput, ErrorReply> {
        let registry = self.registry()?;
        let bound = registry.query_policies(&series);
        // The version bound here runs on every owner, or the query fails naming both versions
        // (during a rollout): partials of different versions are never merged.
        let Some(pinned) = bound.iter().find(|p| p.name == policy).cloned() else {
            let bound: Vec<String> = bound.iter().map(ToString::to_string).collect();
            return Err(ErrorReply::new(
                ErrorCode::Policy,
                format!(
                    "query policy {policy} is not bound to {series} (bound: {}); add it to a [[policy.bindings]] entry \
                     on every node",
                    if bound.is_empty() { "none".to_string() } else { bound.join(", ") }
                ),
            ));
        };
        let class = self.classes().of(&series).clone();
        let parts = self.query_parts(&series, &class, range).await?;
        let summaries =
            Summaries { series: series.clone(), registry: registry.clone(), policy: pinned.to_string(), params };
        let answers = self.ask_owners(&series, &class, &parts, &summaries).await?;
        let partials: Vec<PartialResult> = answers.into_iter().flat_map(|s| s.partials).collect();
        let Summaries { params, .. } = summaries;
        let result = policies::merge(registry, pinned.name, partials, params.into_iter().collect()).await?;
        Ok(QueryOutput {
            policy: result.policy.name,
            version: result.policy.version,
            values: result.values.into_iter().map(|v| (v.name, v.value)).collect(),
            points: result.points,
        })
    }

    /// Window aggregates of `range` of `series` in the windows of `grid`: every owner answers
    /// for its quanta (from block summaries where a window covers whole quanta), and the
    /// windows are merged across quanta here.
    pub async fn aggregate(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        grid: Grid,
    ) -> Result<Vec<WindowStats>, ErrorReply> {
        let class = self.classes().of(&series).clone();
        let parts = self.query_parts(&series, &class, range).await?;
        let per_part = self.ask_owners(&series, &class, &parts, &Windows { series: series.clone(), grid }).await?;
        let windows = merge_windows(&range, grid, per_part);
        if windows.is_empty() && !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok(windows)
    }

    /// The parts of `range` in each quantum of `class` that may hold data of `series` (all of
    /// them for short ranges, those in the quantum index for long ones); refuses more than
    /// [`MAX_QUERY_QUANTA`].
    async fn query_parts(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        range: TimeRange,
    ) -> Result<Vec<BlockPart>, ErrorReply> {
        if !read::uses_index(range, class.quantum) {
            return Ok(read::first_parts(range, class.quantum, usize::MAX).0);
        }
        let (quanta, more) = self.indexed_quanta(series, class, range, MAX_QUERY_QUANTA as usize).await?;
        if more {
            return Err(ErrorReply::new(
                ErrorCode::InvalidRange,
                format!(
                    "the range spans more than {MAX_QUERY_QUANTA} quanta holding data; a query may span \
                     {MAX_QUERY_QUANTA}: split it"
                ),
            ));
        }
        Ok(read::block_parts(quanta, &range))
    }

    /// One answer per block part, each from R of the part's owners, with one request per owner
    /// node carrying every part that node is asked about (up to [`MAX_BLOCK_PARTS`] each):
    /// a long range costs a few requests per node instead of R per quantum. A part whose R
    /// owners did not all answer, or answered differently, is redone on its own by
    /// [`Coordinator::reconcile_part`].
    async fn ask_owners<Q: PushDown>(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        parts: &[BlockPart],
        push_down: &Q,
    ) -> Result<Vec<Q::Answer>, ErrorReply> {
        let classes = self.classes();
        let targets = parts
            .iter()
            .map(|p| self.target(series, placement_id(series, &p.quantum, &classes), class))
            .collect::<Result<Vec<_>, _>>()?;
        let replicas: Vec<Vec<Contact>> = targets.iter().map(|t| self.ordered_replicas(t, class)).collect();
        let (r, in_coi) =
            targets.first().map_or((usize::from(class.replication.r), false), |t| self.read_quorum(t, class));
        // Answers are kept in request order, and the first of agreeing answers is used: the
        // local node's first, then a fixed order, so the same query picks the same replicas.
        let requests = agreement::owner_requests(&replicas, r, self.dht.me().id, MAX_BLOCK_PARTS);
        let calls: Vec<_> = requests
            .into_iter()
            .map(|(c, idx)| {
                let req = push_down.request(idx.iter().map(|&i| parts[i]).collect(), in_coi.then(|| series.clone()));
                async move {
                    let answer = match self.replica_call(&c, req).await {
                        Ok(resp) => push_down.parse(resp, idx.len()),
                        Err(e) => Err(e),
                    };
                    (idx, answer)
                }
            })
            .collect();
        let results = bounded_in_order(calls, OWNER_PARALLELISM).await;
        let mut answers = OwnerAnswers::new(parts.len(), r);
        for (idx, result) in results {
            match result {
                Ok((values, true)) => answers.record(idx, values),
                // An owner still catching up does not count: its parts are redone below,
                // asking further candidates.
                Ok((_, false)) => {}
                // A request that is itself wrong fails the same way on every owner.
                Err(e) if !e.code.is_replica_fault() => return Err(e),
                // The parts of a failed owner are redone below, on other replicas.
                Err(_) => {}
            }
        }
        let settled = answers.settle(|a, b| push_down.agree(a, b));
        let redone = bounded_in_order(
            settled.redo().iter().map(|&i| self.reconcile_part(series, class, parts[i], push_down)).collect(),
            self.limits().read_parallelism,
        )
        .await;
        let redone = redone.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(settled.complete(redone))
    }

    /// One block part's answer from R settled replicas, asked on their own: the fallback of
    /// [`Coordinator::ask_owners`]. If R settled owners answered alike, one answer stands for
    /// all; if they differ (a replica missed a write) or some owner is still catching up, the
    /// raw points of the block's candidates are merged here and the answer is computed over the
    /// union instead.
    async fn reconcile_part<Q: PushDown>(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        part: BlockPart,
        push_down: &Q,
    ) -> Result<Q::Answer, ErrorReply> {
        let target = self.target(series, placement_id(series, &part.quantum, &self.classes()), class)?;
        let plan = self.read_plan(&target, class);
        let ask = |c: Contact| async move {
            let resp =
                self.replica_call(&c, push_down.request(vec![part], plan.strict.then(|| series.clone()))).await?;
            push_down.parse(resp, 1).map(|(mut answers, settled)| (answers.swap_remove(0), settled))
        };
        let r = plan.r;
        let what = || format!("{series} at quantum {}", part.quantum.start);
        let answers = Self::ask_candidates(&plan.candidates, r, plan.strict, what, ask).await?;
        if answers.iter().all(|a| a.settled) {
            let values = answers.into_iter().map(|a| a.value).collect();
            if let Some(answer) = agreement::agreed(values, r, |a, b| push_down.agree(a, b)) {
                return Ok(answer);
            }
        }
        let points =
            self.fetch_block(series, series, class, &target, part.quantum, part.range, None, usize::MAX).await?;
        push_down.compute_here(part, points).await
    }
}

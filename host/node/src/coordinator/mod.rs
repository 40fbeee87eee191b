//! Coordinating client writes, reads and queries across replicas.
//!
//! One module per path: `write` (placing a batch on RF replicas each and waiting for W
//! acknowledgements, with series registrations and quantum index entries in the same round),
//! `replicas` (replica requests that run on after their write was answered, bounded, and handed
//! to hints when they cannot complete),
//! `read` (paged range reads from R replicas of each quantum, and the quantum index scan),
//! `query` (window aggregates and query policies pushed down to the owners of each block and
//! merged here), `series` (listing the cluster's series, whether one was ever written) and
//! `latest` (the newest point of a series, from its newest quanta backwards); `client_at`
//! holds the location a client declared for the request being served.
//!
//! This module holds the [`Coordinator`] and what the paths share: calling one replica (served
//! by [`crate::replica`] without the network when it is this node), ordering and asking R
//! replicas of a block, and fetching one block's points. The replicas of a block are its owners
//! in the membership view ([`crate::membership::View::owners`]), computed locally: no network
//! lookups on the data path. The decisions themselves (placement and quorum, replica
//! agreement, paging, the quantum index) live sans I/O in `timeshard_proto::{placement,
//! agreement, read, quantum_index}`; the coordinator runs them over the network.

pub mod client_at;
mod latest;
mod query;
mod read;
pub mod replicas;
mod series;
pub mod stream;
mod write;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use timeshard_policy::Registry;
use timeshard_proto::agreement::{ReadOutcome, ReadQuorum, merge_replica_answers};
use timeshard_proto::placement::{self, Target};
use timeshard_proto::repair::missing_from;
use timeshard_proto::wire::{BlockPoints, ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, Quantum, SeriesClass, SeriesKey, TimeRange};

use crate::config::LimitsConfig;
use crate::dht::Dht;
use crate::membership::View;
use crate::repair::state::RepairState;
use crate::replica::Replica;

pub use replicas::ReplicaWrites;
pub use stream::{BatchSender, STREAM_PAGE_POINTS};
pub use write::WriteOutcome;

/// Owner requests a query keeps in flight.
const OWNER_PARALLELISM: usize = 16;

/// Coordinates the writes and reads clients send to this node.
#[derive(Debug)]
pub struct Coordinator {
    dht: Arc<Dht>,
    view: Arc<View>,
    replica_writes: Arc<ReplicaWrites>,
    /// This node as a replica: requests to it are served here, not sent.
    replica: Replica,
    /// Swapped whole when the control plane changes the classes: a request takes one table
    /// and uses it throughout. Prefix, format and quantum of a class never change (the control
    /// plane and the node refuse that), so where stored blocks live stays valid.
    classes: RwLock<Arc<Classes>>,
    /// Swapped whole, like the classes; only the per-node limits change (read parallelism,
    /// quanta per page), never the wire limits.
    limits: RwLock<Arc<LimitsConfig>>,
    registered: Mutex<HashSet<SeriesKey>>,
    /// (series, index span start) pairs this node has seen indexed, to skip writing them again.
    indexed: Mutex<HashSet<(SeriesKey, i64)>>,
    policies: Option<Arc<Registry>>,
    /// What this node shares with repair: the read repair queue.
    repair: Arc<RepairState>,
    /// The memory budget client writes are admitted against, and the caches' share of it.
    budget: Option<Arc<crate::budget::Ledger>>,
}

fn unavailable(message: String) -> ErrorReply {
    ErrorReply::new(ErrorCode::Unavailable, message)
}

/// Runs `futures` with at most `limit` in flight; returns their outputs in the order given.
// Takes a Vec, not an iterator: an iterator adapter's closure held across the awaits below
// trips rustc's `Send` inference for the spawned request tasks.
async fn bounded_in_order<F: std::future::Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    let mut pending = futures.into_iter().enumerate();
    let mut in_flight = FuturesUnordered::new();
    let mut out = Vec::new();
    loop {
        while in_flight.len() < limit.max(1) {
            let Some((i, f)) = pending.next() else { break };
            in_flight.push(async move { (i, f.await) });
        }
        match in_flight.next().await {
            Some((i, v)) => out.push((i, v)),
            None => break,
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, v)| v).collect()
}

impl Coordinator {
    /// A coordinator placing data on its owners in `view`, talking to them through `dht`,
    /// serving this node's share as `replica`, and running replica writes as `replica_writes`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dht: Arc<Dht>,
        view: Arc<View>,
        replica_writes: Arc<ReplicaWrites>,
        replica: Replica,
        classes: Classes,
        limits: LimitsConfig,
        policies: Option<Arc<Registry>>,
        repair: Arc<RepairState>,
    ) -> Coordinator {
        Coordinator {
            dht,
            view,
            replica_writes,
            replica,
            classes: RwLock::new(Arc::new(classes)),
            limits: RwLock::new(Arc::new(limits)),
            registered: Mutex::new(HashSet::new()),
            indexed: Mutex::new(HashSet::new()),
            policies,
            repair,
            budget: None,
        }
    }

    /// Admits client writes against `ledger` (see `crate::budget`) and sizes the caches of
    /// known series and index spans from its caches' share.
    pub fn with_budget(mut self, ledger: Arc<crate::budget::Ledger>) -> Coordinator {
        self.budget = Some(ledger);
        self
    }

    /// The memory budget, when the node keeps one (the HTTP side charges bodies to it).
    pub fn budget(&self) -> Option<&Arc<crate::budget::Ledger>> {
        self.budget.as_ref()
    }

    /// The policy registry, if this node runs policies.
    pub fn policies(&self) -> Option<&Arc<Registry>> {
        self.policies.as_ref()
    }

    fn registry(&self) -> Result<Arc<Registry>, ErrorReply> {
        crate::policies::required(self.policies.as_ref())
    }

    /// The class table in force now.
    pub fn classes(&self) -> Arc<Classes> {
        self.classes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the class table; requests already running finish with the one they took.
    pub fn set_classes(&self, classes: Classes) {
        *self.classes.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(classes);
    }

    /// The limits in force now.
    pub fn limits(&self) -> Arc<LimitsConfig> {
        self.limits.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the limits (for requests that start from now on).
    pub fn set_limits(&self, limits: LimitsConfig) {
        *self.limits.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(limits);
    }

    /// What this node shares with repair: whether it is settled, the read repair queue.
    pub fn repair(&self) -> &Arc<RepairState> {
        &self.repair
    }

    /// The membership view placement is computed from.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// Replica writes running on after their write was answered, and the hints.
    pub fn replica_writes(&self) -> &Arc<ReplicaWrites> {
        &self.replica_writes
    }

    /// Sends `req` to `contact`, or serves it locally if that is this node.
    async fn replica_call(&self, contact: &Contact, req: Request) -> Result<Response, ErrorReply> {
        if contact.id == self.dht.me().id {
            return match self.replica.serve(req).await {
                Response::Error(e) => Err(e),
                r => Ok(r),
            };
        }
        match self.dht.call(contact, &req).await {
            Ok(resp) => Ok(resp),
            // The replica answered: its error says what is wrong, with its own code.
            Err(crate::net::NetError::Call { source: timeshard_sdk::transport::CallError::Remote(reply), .. }) => {
                Err(reply)
            }
            Err(e) => Err(unavailable(e.to_string())),
        }
    }

    /// Where the blocks of `base` placed at `id` go (see [`placement::target`]): `base` is the
    /// series the block belongs to, the indexed or registered one for an index block or a
    /// registration. A series of a CoI class without a usable location is refused.
    pub(crate) fn target(&self, base: &SeriesKey, id: Id, class: &SeriesClass) -> Result<Target, ErrorReply> {
        placement::target(base, id, class).map_err(|e| ErrorReply::new(ErrorCode::InvalidSeries, e.to_string()))
    }

    /// Whom a read of a block asks and how many must answer: the owners in the order to ask,
    /// the further candidates after them, and R.
    ///
    /// For a DHT block: the local node first (no network), then those up, and peers that are
    /// down or failed lately last; R of the class. For a CoI block read by a coordinator
    /// inside the context of interest: only the in-CoI replicas, every one of them settled
    /// (R = n_in, strict), so the read overlaps every write quorum even across views that
    /// differ for a moment; from outside, every owner by distance from
    /// this node and R = 1 (the fastest replica: eventual). Inside or outside is decided by
    /// the location the client declared ([`client_at`]), else by this node's.
    fn read_plan(&self, target: &Target, class: &SeriesClass) -> ReadPlan {
        let me = self.dht.me().id;
        let rank = |c: &Contact| (c.id != me, !self.view.is_up(&c.id), self.dht.is_suspect(&c.id));
        let Some(site) = &target.site else {
            let mut owners = self.view.owners(target.id, target.rf);
            owners.sort_by_key(rank);
            let candidates = self.view.read_candidates(&owners, &target.id, target.rf);
            return ReadPlan { owners, candidates, r: usize::from(class.replication.r), strict: false };
        };
        let placed = self.view.owners_of(target);
        let here = self.view.location();
        let client = client_at::declared().or(here);
        let inside = client.is_some_and(|p| site.contains(&p));
        let far = |c: &Contact| match (here, self.view.location_of(&c.id)) {
            (Some(a), Some(b)) => (a.distance_km(&b) * 1_000.0) as u64,
            _ => u64::MAX,
        };
        let mut owners = placed.owners.clone();
        let mut fallback = placed.fallback;
        let bound = 2 * target.rf + 2;
        if inside {
            // Only the in-CoI owners are asked, every one must answer settled (R = n_in), and
            // the merge of unsettled answers never stands (strict): with one unreachable or
            // catching up the read fails, retryably, rather than answer stale. Writes count
            // only in-CoI owners (write.rs), so R = n_in - W + 1 would meet them too; asking
            // every owner also covers an owner a write placed by a view that differed
            // (a location or membership change gossip had not spread yet).
            let (near, rest) = owners.split_at_mut(placed.synchronous);
            near.sort_by_key(rank);
            rest.sort_by_key(|c| (rank(c), far(c)));
            let candidates = near.to_vec();
            let r = placed.synchronous.max(1);
            return ReadPlan { owners, candidates, r, strict: true };
        }
        owners.sort_by_key(|c| (rank(c), far(c)));
        fallback.sort_by_key(|c| (rank(c), far(c)));
        let candidates = owners.iter().chain(&fallback).take(bound.max(owners.len())).copied().collect();
        ReadPlan { owners, candidates, r: 1, strict: false }
    }

    /// Asks the `candidates` of a block in order with `ask` until `r` settled replicas answered
    /// ([`ReadQuorum`]): an unsettled answer (a node still catching up) is kept but makes the
    /// read ask the next candidate, as does a failure. Returns every answer with who gave it;
    /// fails if fewer than `r` answered at all, or, for a `strict` read (in-CoI), fewer than
    /// `r` settled.
    async fn ask_candidates<T, F, Fut>(
        candidates: &[Contact],
        r: usize,
        strict: bool,
        what: impl FnOnce() -> String,
        ask: F,
    ) -> Result<Vec<Answer<T>>, ErrorReply>
    where
        F: Fn(Contact) -> Fut,
        Fut: std::future::Future<Output = Result<(T, bool), ErrorReply>>,
    {
        let mut quorum =
            if strict { ReadQuorum::strict(candidates.len(), r) } else { ReadQuorum::new(candidates.len(), r) };
        let mut in_flight = FuturesUnordered::new();
        let launch = |i: usize| {
            let c = candidates[i];
            let fut = ask(c);
            async move { (c, fut.await) }
        };
        in_flight.extend(quorum.to_ask().map(launch));
        let mut answers = Vec::with_capacity(r);
        let mut last_error = None;
        while let Some((from, result)) = in_flight.next().await {
            match result {
                Ok((value, settled)) => {
                    quorum.on_answer(settled);
                    answers.push(Answer { from, value, settled });
                }
                // Another replica cannot do better with a request that is itself wrong.
                Err(e) if !e.code.is_replica_fault() => return Err(e),
                Err(e) => {
                    quorum.on_failure();
                    last_error = Some(e);
                }
            }
            if quorum.is_done() {
                break;
            }
            in_flight.extend(quorum.to_ask().map(launch));
        }
        match quorum.outcome() {
            ReadOutcome::Settled | ReadOutcome::Merged => Ok(answers),
            ReadOutcome::Short => Err(unavailable(format!(
                "only {} of the {r} replicas needed answered for {}{}",
                answers.len(),
                what(),
                last_error.map(|e| format!(": {}", e.message)).unwrap_or_default()
            ))),
            ReadOutcome::Unsettled => Err(unavailable(format!(
                "only {} of the {r} in-CoI owners needed answered settled for {} (the others are catching up \
                 after a start, a departure or a location change, and may lack acknowledged writes); retry shortly",
                answers.iter().filter(|a| a.settled).count(),
                what(),
            ))),
        }
    }

    /// The nodes a read of block `target` asks, in order: its owners (local first, those up
    /// next), then further candidates, for when owners are still catching up or down.
    fn read_candidates(&self, target: &Target, class: &SeriesClass) -> Vec<Contact> {
        self.read_plan(target, class).candidates
    }

    /// Settled answers a read of block `target` needs, and whether they must come from in-CoI
    /// owners (a strict read: each is asked as one, see `Request::Fetch`).
    fn read_quorum(&self, target: &Target, class: &SeriesClass) -> (usize, bool) {
        let plan = self.read_plan(target, class);
        (plan.r, plan.strict)
    }

    /// The owners of block `target` in the order a read asks them.
    fn ordered_replicas(&self, target: &Target, class: &SeriesClass) -> Vec<Contact> {
        self.read_plan(target, class).owners
    }

    /// Reads one block of `series`, placed by `placed_by` (itself, or the series an index
    /// series indexes), from R settled replicas (further candidates when owners are catching
    /// up) and merges every answer.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_block(
        &self,
        series: &SeriesKey,
        placed_by: &SeriesKey,
        class: &SeriesClass,
        target: &Target,
        quantum: Quantum,
        part: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<Vec<Point>, ErrorReply> {
        let ReadPlan { owners, candidates, r, strict } = self.read_plan(target, class);
        let limit_u32 = u32::try_from(limit).unwrap_or(u32::MAX).min(self.limits().max_page_points);
        // Each answer: its points, and whether they are everything the replica holds of the
        // part (it was not cut at the limit).
        let fetch = |c: Contact| async move {
            let mut points = Vec::new();
            let mut cursor = after;
            let mut all_settled = true;
            loop {
                let req = Request::Fetch {
                    series: series.clone(),
                    quantum,
                    range: part,
                    after: cursor,
                    limit: limit_u32,
                    in_coi: strict.then(|| placed_by.clone()),
                };
                match self.replica_call(&c, req).await? {
                    Response::Points { points: page, more, settled } => {
                        all_settled &= settled;
                        cursor = page.last().map(Point::key).or(cursor);
                        points.extend(page);
                        if !more || points.len() >= limit {
                            return Ok(((points, !more), all_settled));
                        }
                    }
                    other => return Err(unavailable(format!("unexpected answer to a fetch: {other:?}"))),
                }
            }
        };
        let what = || format!("{series} at quantum {}", quantum.start);
        let answers = Self::ask_candidates(&candidates, r, strict, what, fetch).await?;
        let mut union = merge_replica_answers(answers.iter().map(|a| a.value.0.clone()), &part);
        if let Some(a) = after {
            union.retain(|p| p.key() > a);
        }
        // Owners that lacked points others returned get them back, off the read path.
        for a in answers.iter().filter(|a| owners.iter().any(|o| o.id == a.from.id)) {
            let (points, complete) = &a.value;
            let lacking = missing_from(&union, points, *complete);
            if !lacking.is_empty() {
                self.repair.read_repair(a.from, BlockPoints { series: series.clone(), quantum, points: lacking });
            }
        }
        union.truncate(limit);
        Ok(union)
    }
}

/// Whom a read of one block asks ([`Coordinator::read_plan`]).
#[derive(Debug)]
struct ReadPlan {
    /// The owners, in the order to ask.
    owners: Vec<Contact>,
    /// The owners, then further candidates.
    candidates: Vec<Contact>,
    /// Settled answers needed.
    r: usize,
    /// Whether only settled answers may stand (an in-CoI read, [`ReadQuorum::strict`]).
    strict: bool,
}

/// One candidate's answer to a read.
#[derive(Debug)]
struct Answer<T> {
    from: Contact,
    value: T,
    settled: bool,
}

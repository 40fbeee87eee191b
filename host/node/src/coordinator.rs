//! Coordinating client writes and reads across replicas.
//!
//! A write is split into blocks, one per (series, quantum); each goes to the RF nodes closest to
//! its time-factored id, and the write is acknowledged once every block has W acknowledgements.
//! Series seen for the first time are registered in the series dictionary (also RF replicas,
//! W acknowledgements) in the same round. A read sends one request per quantum, in parallel, to
//! R replicas each, and merges, deduplicates, sorts and trims the answers exactly to the range.
//!
//! With policies configured, a write first runs the ingest policy bound to each series, and a
//! query policy is pushed down: the owners of each block reduce its raw points to a partial,
//! and only partials travel to this node, which merges them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use timeshard_policy::Registry;
use timeshard_proto::agreement::merge_replica_answers;
use timeshard_proto::class::{Replication, SeriesClass};
use timeshard_proto::key::{self, series_meta_id};
use timeshard_proto::placement::{WritePlan, WriteProgress, split_batch};
use timeshard_proto::point::{page_start, set_digest};
use timeshard_proto::time::{self, Quantum};
use timeshard_proto::window::{WindowStats, merge_windows};
use timeshard_proto::wire::{
    BlockPart, BlockPoints, ErrorCode, ErrorReply, MAX_BLOCK_PARTS, PartialResult, QueryOutput, RejectedPoint, Request,
    Response, SeriesFilter, SeriesPoints, Summarized,
};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, QuantumLen, SeriesKey, TimeRange};
use timeshard_store::Store;
use timeshard_store::agg::Aggregator;
use tokio::sync::mpsc;
use tracing::warn;

use crate::config::LimitsConfig;
use crate::dht::Dht;
use crate::policies;
use crate::server::serve_replica;

/// Placement lookups a write or query runs at once.
const PLACEMENT_PARALLELISM: usize = 32;
/// Owner requests a query keeps in flight.
const OWNER_PARALLELISM: usize = 16;
/// Series remembered as registered before the memory is cleared.
const REGISTERED_CACHE_MAX: usize = 100_000;
/// (series, quantum) pairs remembered as indexed before the memory is cleared.
const INDEXED_CACHE_MAX: usize = 1_000_000;
/// Reads, aggregates and queries spanning more quanta than this ask the quantum index first
/// and then touch only the spans that hold data; shorter ones go straight to the blocks.
const INDEX_SCAN_THRESHOLD: u64 = 64;
/// Quanta one index entry stands for. One entry per quantum cost a write to the index
/// replicas every few batches of live data (a third of all batches with 4 in flight, whose
/// coordinator had not yet seen the entry acknowledged); a span of 64 makes that rare, and a
/// sparse read touches at most 64 quanta per entry.
const INDEX_SPAN_QUANTA: i64 = 64;

/// Length of the index span of a class's quanta.
fn index_span_ns(quantum: QuantumLen) -> i64 {
    quantum.ns().saturating_mul(INDEX_SPAN_QUANTA)
}

/// Start of the index span holding quantum `q`: the timestamp of its index entry.
fn index_span_of(q: &Quantum) -> i64 {
    let span = index_span_ns(q.len);
    q.start.div_euclid(span) * span
}
/// Points a read may hold in flight across the quanta it fetches in parallel.
const READ_POINT_BUDGET: usize = 2_000_000;
/// Most quanta one policy query may span.
const MAX_QUERY_QUANTA: u64 = 1_000_000;

/// Where one part of a write goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Target {
    /// Blocks stored on a node.
    Blocks(Id),
    /// Series registrations stored on a node.
    Registrations(Id),
}

/// Coordinates the writes and reads clients send to this node.
#[derive(Debug)]
pub struct Coordinator {
    dht: Arc<Dht>,
    store: Arc<dyn Store>,
    classes: Classes,
    limits: LimitsConfig,
    registered: Mutex<HashSet<SeriesKey>>,
    /// (series, index span start) pairs this node has seen indexed, to skip writing them again.
    indexed: Mutex<HashSet<(SeriesKey, i64)>>,
    policies: Option<Arc<Registry>>,
}

/// What a coordinated write did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteOutcome {
    /// Points stored (after policies and deduplication within the batch).
    pub points: u64,
    /// (series, quantum) blocks they fell into.
    pub blocks: u64,
    /// Points an ingest policy refused, and the first of them with reasons.
    pub rejected: u64,
    pub rejections: Vec<RejectedPoint>,
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

/// The per-part answers of a window fetch, checked against the number of parts asked.
fn parse_windows(resp: Response, parts: usize) -> Result<Vec<Vec<WindowStats>>, ErrorReply> {
    match resp {
        Response::BlockWindows { parts: p } if p.len() == parts => Ok(p),
        other => Err(unavailable(format!("unexpected answer to a window fetch of {parts} parts: {other:?}"))),
    }
}

/// The per-part answers of a summarize, checked against the number of parts asked.
fn parse_partials(resp: Response, parts: usize) -> Result<Vec<Summarized>, ErrorReply> {
    match resp {
        Response::Partials { parts: p } if p.len() == parts => Ok(p),
        other => Err(unavailable(format!("unexpected answer to a summarize of {parts} parts: {other:?}"))),
    }
}

/// Whether two owners' partials were computed from the same points.
fn same_points(a: &Summarized, b: &Summarized) -> bool {
    (a.points, a.digest) == (b.points, b.digest)
}

/// Whether an error from one replica may not recur at another (so asking the next helps).
fn is_replica_fault(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Unavailable | ErrorCode::Overloaded | ErrorCode::Storage | ErrorCode::Internal | ErrorCode::TooLarge
    )
}

impl Coordinator {
    /// A coordinator placing data through `dht` and storing this node's share in `store`.
    pub fn new(
        dht: Arc<Dht>,
        store: Arc<dyn Store>,
        classes: Classes,
        limits: LimitsConfig,
        policies: Option<Arc<Registry>>,
    ) -> Coordinator {
        Coordinator {
            dht,
            store,
            classes,
            limits,
            registered: Mutex::new(HashSet::new()),
            indexed: Mutex::new(HashSet::new()),
            policies,
        }
    }

    /// The policy registry, if this node runs policies.
    pub fn policies(&self) -> Option<&Arc<Registry>> {
        self.policies.as_ref()
    }

    fn registry(&self) -> Result<Arc<Registry>, ErrorReply> {
        self.policies.clone().ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::Policy,
                "this node runs no policies: configure [policy] with trusted keys, modules and bindings",
            )
        })
    }

    /// Answers a peer's request to run a query policy over this node's parts of some blocks.
    pub async fn summarize_local(&self, req: Request) -> Response {
        let Request::Summarize { series, parts, policy, params } = req else {
            return Response::Error(ErrorReply::new(ErrorCode::Internal, "not a summarize request"));
        };
        let registry = match self.registry() {
            Ok(r) => r,
            Err(e) => return Response::Error(e),
        };
        let params = params.into_iter().collect();
        match policies::summarize(self.store.clone(), registry, series, parts, policy, params).await {
            Ok(parts) => Response::Partials { parts },
            Err(e) => Response::Error(e),
        }
    }

    /// The class table.
    pub fn classes(&self) -> &Classes {
        &self.classes
    }

    /// Sends `req` to `contact`, or serves it locally if that is this node.
    async fn replica_call(&self, contact: &Contact, req: Request) -> Result<Response, ErrorReply> {
        if contact.id == self.dht.me().id {
            let local = match req {
                Request::Summarize { .. } => self.summarize_local(req).await,
                req => serve_replica(&self.store, req).await,
            };
            return match local {
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

    /// Writes a validated batch: runs ingest policies, then returns once every block has W
    /// acknowledgements.
    pub async fn write(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<WriteOutcome, ErrorReply> {
        let (batch, rejected, rejections) = match &self.policies {
            Some(registry) => {
                let ingested = policies::ingest(registry.clone(), batch).await?;
                (ingested.batch, ingested.rejected, ingested.rejections)
            }
            None => (batch, 0, Vec::new()),
        };
        if batch.is_empty() {
            return Ok(WriteOutcome { rejected, rejections, ..WriteOutcome::default() });
        }
        let (points, blocks) = self.replicate(batch).await?;
        Ok(WriteOutcome { points, blocks, rejected, rejections })
    }

    /// Places and stores a batch; returns (points, blocks) once every block has W acks. Series
    /// seen for the first time are registered, and quanta that hold data for the first time
    /// are added to the series' quantum index, in the same round and under the same quorum.
    async fn replicate(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<(u64, u64), ErrorReply> {
        let new_series: Vec<SeriesKey> = {
            let known = self.registered.lock().expect("registered lock");
            let mut seen = HashSet::new();
            batch.iter().map(|s| &s.series).filter(|s| !known.contains(*s) && seen.insert(*s)).cloned().collect()
        };
        let data = split_batch(batch, &self.classes);
        let points: u64 = data.iter().map(|b| b.block.points.len() as u64).sum();
        let n_data = data.len();
        let new_spans: Vec<(SeriesKey, i64)> = {
            let indexed = self.indexed.lock().expect("indexed lock");
            let mut seen = HashSet::new();
            data.iter()
                .map(|b| (b.block.series.clone(), index_span_of(&b.block.quantum)))
                .filter(|k| !indexed.contains(k) && seen.insert(k.clone()))
                .collect()
        };

        // Everything stored: the data blocks, then the index blocks, each with where it goes.
        let mut stored: Vec<(Id, Replication, BlockPoints)> =
            data.into_iter().map(|b| (b.id, b.replication, b.block)).collect();
        let mut index: BTreeMap<(SeriesKey, Quantum), Vec<Point>> = BTreeMap::new();
        for (series, start) in &new_spans {
            let q = key::index_quantum().quantum_of(*start);
            index.entry((series.clone(), q)).or_default().push(Point::new(*start, 0.0));
        }
        for ((series, quantum), points) in index {
            let replication = self.classes.of(&series).replication;
            let block = BlockPoints { series: key::quantum_index_series(&series), quantum, points };
            stored.push((series_meta_id(&series), replication, block));
        }
        let n_stored = stored.len();
        let registrations: Vec<(Id, Replication)> =
            new_series.iter().map(|s| (series_meta_id(s), self.classes.of(s).replication)).collect();

        // Where everything goes: one lookup per block and per new series, a few at a time.
        let lookups: Vec<(Id, usize)> = stored
            .iter()
            .map(|(id, r, _)| (*id, usize::from(r.rf)))
            .chain(registrations.iter().map(|(id, r)| (*id, usize::from(r.rf))))
            .collect();
        let placements: Vec<Vec<Contact>> = futures::stream::iter(lookups)
            .map(|(id, rf)| self.dht.replicas(id, rf))
            .buffered(PLACEMENT_PARALLELISM)
            .collect()
            .await;
        let contacts: HashMap<Id, Contact> = placements.iter().flatten().map(|c| (c.id, *c)).collect();

        let needs = stored.iter().map(|(_, r, _)| r.w).chain(registrations.iter().map(|(_, r)| r.w));
        let items = needs.zip(placements.iter()).enumerate().map(|(i, (need, replicas))| {
            let target = |c: &Contact| if i < n_stored { Target::Blocks(c.id) } else { Target::Registrations(c.id) };
            (usize::from(need), replicas.iter().map(target).collect::<Vec<_>>())
        });
        let mut plan = WritePlan::new(items);
        if plan.progress() == WriteProgress::Failed {
            let known = self.dht.peer_count() + 1;
            return Err(unavailable(format!(
                "this node knows {known} node(s), fewer than a write quorum needs; start more nodes or lower rf/w \
                 in the series class"
            )));
        }

        let (tx, mut rx) = mpsc::channel(plan.requests().count().max(1));
        for (target, idx) in plan.requests() {
            let (id, req) = match *target {
                Target::Blocks(id) => {
                    (id, Request::Store { blocks: idx.iter().map(|&i| stored[i].2.clone()).collect() })
                }
                Target::Registrations(id) => (
                    id,
                    Request::RegisterSeries { series: idx.iter().map(|&i| new_series[i - n_stored].clone()).collect() },
                ),
            };
            let contact = contacts[&id];
            let (me, tx, target) = (self.clone(), tx.clone(), *target);
            // Each replica request runs to completion even after the quorum answered, so slow
            // replicas still get the data.
            tokio::spawn(async move {
                let outcome = match me.replica_call(&contact, req).await {
                    Ok(Response::Stored { .. }) => Ok(()),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                    Err(e) => Err(e.message),
                };
                let _ = tx.send((target, outcome)).await;
            });
        }
        drop(tx);

        let mut errors = Vec::new();
        while let Some((target, outcome)) = rx.recv().await {
            let progress = match outcome {
                Ok(()) => plan.on_ack(&target),
                Err(e) => {
                    errors.push(e);
                    plan.on_failure(&target)
                }
            };
            match progress {
                WriteProgress::Pending => {}
                WriteProgress::Acknowledged => {
                    let mut known = self.registered.lock().expect("registered lock");
                    if known.len() + new_series.len() > REGISTERED_CACHE_MAX {
                        known.clear();
                    }
                    known.extend(new_series);
                    let mut indexed = self.indexed.lock().expect("indexed lock");
                    if indexed.len() + new_spans.len() > INDEXED_CACHE_MAX {
                        indexed.clear();
                    }
                    indexed.extend(new_spans);
                    return Ok((points, n_data as u64));
                }
                WriteProgress::Failed => break,
            }
        }
        Err(unavailable(format!(
            "too few replicas acknowledged the write ({}); some points may be stored, and retrying is safe \
             because writes are idempotent",
            errors.first().map(String::as_str).unwrap_or("no answer")
        )))
    }

    /// One page of a read: points of `series` in `range` strictly after `after`, at most
    /// `limit`, and the cursor to continue from if there are more.
    pub async fn read(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: u32,
    ) -> Result<(Vec<Point>, Option<PointKey>), ErrorReply> {
        let class = self.classes.of(&series).clone();
        let limit = limit as usize;
        let start = page_start(&range, after);
        let Ok(scan) = TimeRange::new(start.ts, range.end()) else {
            return Ok((Vec::new(), None));
        };
        let series_hash = key::series_hash(&series);
        let page_quanta = self.limits.max_quanta_per_page;
        // Long scans skip the quanta that hold no data, as the quantum index says.
        let (quanta, more_quanta) = if time::quanta_count(scan, class.quantum) > INDEX_SCAN_THRESHOLD {
            let (indexed, more) = self.indexed_quanta(&series, &class, scan, page_quanta).await?;
            (indexed.into_iter().filter_map(|q| q.clip(&scan).map(|part| (q, part))).collect::<Vec<_>>(), more)
        } else {
            let all: Vec<(Quantum, TimeRange)> = time::quanta(scan, class.quantum).collect();
            let more = all.len() > page_quanta;
            (all.into_iter().take(page_quanta).collect(), more)
        };
        let mut out: Vec<Point> = Vec::new();
        let mut rest = quanta.as_slice();
        while !rest.is_empty() {
            let remaining = limit - out.len();
            let window_len =
                (READ_POINT_BUDGET / remaining.max(1)).clamp(1, self.limits.read_parallelism).min(rest.len());
            let (window, later) = rest.split_at(window_len);
            rest = later;
            let fetches = window.iter().map(|(q, part)| {
                let id = key::block_id_from_hashes(class.format, &series_hash, q);
                self.fetch_block(&series, &class, id, *q, *part, after, remaining)
            });
            for result in futures::future::join_all(fetches).await {
                out.extend(result?);
                if out.len() >= limit {
                    out.truncate(limit);
                    let next = out.last().map(Point::key);
                    return Ok((out, next));
                }
            }
        }
        if more_quanta && let Some((last, _)) = quanta.last() {
            // Continue on the next page from the end of the last quantum scanned.
            return Ok((out, Some(PointKey { ts: last.end() - 1, event: u64::MAX, value_bits: u64::MAX })));
        }
        if out.is_empty() && after.is_none() && !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok((out, None))
    }

    /// The replicas of block `id`, the local node first (no network) and peers that failed
    /// lately last.
    async fn ordered_replicas(&self, id: Id, class: &SeriesClass) -> Vec<Contact> {
        let mut replicas = self.dht.replicas(id, usize::from(class.replication.rf)).await;
        let me = self.dht.me().id;
        replicas.sort_by_key(|c| (c.id != me, self.dht.is_suspect(&c.id)));
        replicas
    }

    /// Asks `r` of `replicas` with `ask`, moving on to the next replica whenever one fails.
    /// Fails if fewer than `r` answer.
    async fn ask_replicas<T, F, Fut>(
        replicas: &[Contact],
        r: usize,
        what: impl FnOnce() -> String,
        ask: F,
    ) -> Result<Vec<T>, ErrorReply>
    where
        F: Fn(Contact) -> Fut,
        Fut: std::future::Future<Output = Result<T, ErrorReply>>,
    {
        let mut candidates = replicas.iter().copied();
        let mut in_flight: FuturesUnordered<_> = candidates.by_ref().take(r).map(&ask).collect();
        let mut answers = Vec::with_capacity(r);
        let mut last_error = None;
        while let Some(result) = in_flight.next().await {
            match result {
                Ok(answer) => {
                    answers.push(answer);
                    if answers.len() == r {
                        return Ok(answers);
                    }
                }
                // Another replica cannot do better with a request that is itself wrong.
                Err(e) if !is_replica_fault(e.code) => return Err(e),
                Err(e) => {
                    last_error = Some(e);
                    if let Some(next) = candidates.next() {
                        in_flight.push(ask(next));
                    }
                }
            }
        }
        Err(unavailable(format!(
            "only {} of the {r} replicas needed answered for {}{}",
            answers.len(),
            what(),
            last_error.map(|e| format!(": {}", e.message)).unwrap_or_default()
        )))
    }

    /// Reads one block from R of its replicas and merges the answers.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_block(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        id: Id,
        quantum: Quantum,
        part: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<Vec<Point>, ErrorReply> {
        let replicas = self.ordered_replicas(id, class).await;
        let limit_u32 = u32::try_from(limit).unwrap_or(u32::MAX).min(self.limits.max_page_points);
        let fetch = |c: Contact| async move {
            let mut points = Vec::new();
            let mut cursor = after;
            loop {
                let req =
                    Request::Fetch { series: series.clone(), quantum, range: part, after: cursor, limit: limit_u32 };
                match self.replica_call(&c, req).await? {
                    Response::Points { points: page, more } => {
                        cursor = page.last().map(Point::key).or(cursor);
                        points.extend(page);
                        if !more || points.len() >= limit {
                            return Ok(points);
                        }
                    }
                    other => return Err(unavailable(format!("unexpected answer to a fetch: {other:?}"))),
                }
            }
        };
        let r = usize::from(class.replication.r);
        let what = || format!("{series} at quantum {}", quantum.start);
        let answers = Self::ask_replicas(&replicas, r, what, fetch).await?;
        let mut merged = merge_replica_answers(answers, &part);
        if let Some(a) = after {
            merged.retain(|p| p.key() > a);
        }
        merged.truncate(limit);
        Ok(merged)
    }

    /// Runs query policy `policy` over one block part on R of its owners: the fallback of
    /// [`Coordinator::ask_owners`]. If the owners report the same points (count and digest),
    /// one owner's partials stand for all; if they differ (a replica missed a write), their raw
    /// points are merged here and the policy runs over the union instead, so the answer covers
    /// every acknowledged point.
    async fn summarize_block(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        part: BlockPart,
        policy: &str,
        params: &[(String, String)],
    ) -> Result<Summarized, ErrorReply> {
        let id = key::block_id(class.format, series, &part.quantum);
        let replicas = self.ordered_replicas(id, class).await;
        let summarize = |c: Contact| async move {
            let req = Request::Summarize {
                series: series.clone(),
                parts: vec![part],
                policy: policy.to_string(),
                params: params.to_vec(),
            };
            let resp = self.replica_call(&c, req).await?;
            parse_partials(resp, 1).map(|mut p| p.swap_remove(0))
        };
        let r = usize::from(class.replication.r);
        let what = || format!("{series} at quantum {}", part.quantum.start);
        let mut answers = Self::ask_replicas(&replicas, r, what, summarize).await?;
        if answers.windows(2).all(|w| same_points(&w[0], &w[1])) {
            return Ok(answers.swap_remove(0));
        }
        let points = self.fetch_block(series, class, id, part.quantum, part.range, None, usize::MAX).await?;
        let (count, digest) = (points.len() as u64, set_digest(&points));
        let params = params.iter().cloned().collect();
        let partials = policies::summarize_points(
            self.registry()?,
            series.clone(),
            part.range,
            points,
            policy.to_string(),
            params,
        )
        .await?;
        Ok(Summarized { partials, points: count, digest })
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
        let too_many = |count: String| {
            ErrorReply::new(
                ErrorCode::InvalidRange,
                format!("the range spans {count} quanta holding data; a query may span {MAX_QUERY_QUANTA}: split it"),
            )
        };
        let quanta: Vec<Quantum> = if time::quanta_count(range, class.quantum) > INDEX_SCAN_THRESHOLD {
            let (quanta, more) = self.indexed_quanta(series, class, range, MAX_QUERY_QUANTA as usize).await?;
            if more {
                return Err(too_many(format!("more than {MAX_QUERY_QUANTA}")));
            }
            quanta
        } else {
            time::quanta(range, class.quantum).map(|(q, _)| q).collect()
        };
        Ok(quanta
            .into_iter()
            .filter_map(|quantum| quantum.clip(&range).map(|range| BlockPart { quantum, range }))
            .collect())
    }

    /// The quanta of `series` overlapping `scan` that hold data, in time order, from the
    /// series' quantum index (read from R of its replicas and merged, like any block); at most
    /// `limit` of them, and whether more follow.
    async fn indexed_quanta(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        scan: TimeRange,
        limit: usize,
    ) -> Result<(Vec<Quantum>, bool), ErrorReply> {
        let index = key::quantum_index_series(series);
        let at = series_meta_id(series);
        let span_ns = index_span_ns(class.quantum);
        // The index holds span starts, and the span holding the scan's start starts before it.
        let first = scan.start().div_euclid(span_ns) * span_ns;
        let Ok(indexed) = TimeRange::new(first, scan.end()) else { return Ok((Vec::new(), false)) };
        let mut out = Vec::new();
        for (q, part) in time::quanta(indexed, key::index_quantum()) {
            let entries = self.fetch_block(&index, class, at, q, part, None, usize::MAX).await?;
            for entry in entries {
                // Every quantum of the span may hold data; an entry that does not start a
                // quantum of the class is from an older quantum length, whose blocks cannot be
                // read under the current one anyway.
                let Ok(span) = TimeRange::new(entry.ts, entry.ts.saturating_add(span_ns)) else { continue };
                let Some(span) = span.intersect(&scan) else { continue };
                if Quantum::at(entry.ts, class.quantum).is_none() {
                    continue;
                }
                out.extend(time::quanta(span, class.quantum).map(|(q, _)| q));
                if out.len() > limit {
                    out.truncate(limit);
                    return Ok((out, true));
                }
            }
        }
        Ok((out, false))
    }

    /// One answer per block part, each from R of the part's owners, with one request per owner
    /// node carrying every part that node is asked about (up to [`MAX_BLOCK_PARTS`] each):
    /// a long range costs a few requests per node instead of R per quantum. A part whose R
    /// owners did not all answer, or answered differently (`agree`), is redone on its own by
    /// `reconcile`, which asks further replicas and merges raw points where needed.
    #[allow(clippy::too_many_arguments)]
    async fn ask_owners<T, MakeReq, Parse, Agree, Reconcile, ReconcileFut>(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        parts: &[BlockPart],
        make_request: MakeReq,
        parse: Parse,
        agree: Agree,
        reconcile: Reconcile,
    ) -> Result<Vec<T>, ErrorReply>
    where
        MakeReq: Fn(Vec<BlockPart>) -> Request,
        Parse: Fn(Response, usize) -> Result<Vec<T>, ErrorReply>,
        Agree: Fn(&T, &T) -> bool,
        Reconcile: Fn(BlockPart) -> ReconcileFut,
        ReconcileFut: std::future::Future<Output = Result<T, ErrorReply>>,
    {
        let r = usize::from(class.replication.r);
        let ids: Vec<Id> = parts.iter().map(|p| key::block_id(class.format, series, &p.quantum)).collect();
        let replicas: Vec<Vec<Contact>> = bounded_in_order(
            ids.into_iter().map(|id| self.ordered_replicas(id, class)).collect(),
            PLACEMENT_PARALLELISM,
        )
        .await;
        let mut by_node: HashMap<Id, (Contact, Vec<usize>)> = HashMap::new();
        for (i, owners) in replicas.iter().enumerate() {
            for c in owners.iter().take(r) {
                by_node.entry(c.id).or_insert_with(|| (*c, Vec::new())).1.push(i);
            }
        }
        let mut requests: Vec<(Contact, Vec<usize>)> = by_node
            .into_values()
            .flat_map(|(c, idx)| idx.chunks(MAX_BLOCK_PARTS).map(|chunk| (c, chunk.to_vec())).collect::<Vec<_>>())
            .collect();
        // Answers are kept in request order, and the first of agreeing answers is used: the
        // local node's first, then a fixed order, so the same query picks the same replicas.
        let me = self.dht.me().id;
        requests.sort_by_key(|(c, idx)| (c.id != me, c.id, idx.first().copied()));
        let calls: Vec<_> = requests
            .into_iter()
            .map(|(c, idx)| {
                let req = make_request(idx.iter().map(|&i| parts[i]).collect());
                let parse = &parse;
                async move {
                    let answer = match self.replica_call(&c, req).await {
                        Ok(resp) => parse(resp, idx.len()),
                        Err(e) => Err(e),
                    };
                    (idx, answer)
                }
            })
            .collect();
        let results = bounded_in_order(calls, OWNER_PARALLELISM).await;
        let mut answers: Vec<Vec<T>> = (0..parts.len()).map(|_| Vec::with_capacity(r)).collect();
        for (idx, result) in results {
            match result {
                Ok(values) => {
                    for (i, v) in idx.into_iter().zip(values) {
                        answers[i].push(v);
                    }
                }
                // A request that is itself wrong fails the same way on every owner.
                Err(e) if !is_replica_fault(e.code) => return Err(e),
                // The parts of a failed owner are redone below, on other replicas.
                Err(_) => {}
            }
        }
        let mut out: Vec<Option<T>> = Vec::with_capacity(parts.len());
        let mut redo = Vec::new();
        for (i, mut a) in answers.into_iter().enumerate() {
            if a.len() == r && a.windows(2).all(|w| agree(&w[0], &w[1])) {
                out.push(Some(a.swap_remove(0)));
            } else {
                out.push(None);
                redo.push(i);
            }
        }
        let redone =
            bounded_in_order(redo.iter().map(|&i| reconcile(parts[i])).collect(), self.limits.read_parallelism).await;
        for (i, result) in redo.into_iter().zip(redone) {
            out[i] = Some(result?);
        }
        Ok(out.into_iter().map(|v| v.expect("every part answered or reconciled")).collect())
    }

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
        if !registry.query_policies(&series).iter().any(|p| p.name == policy) {
            let bound: Vec<String> = registry.query_policies(&series).iter().map(ToString::to_string).collect();
            return Err(ErrorReply::new(
                ErrorCode::Policy,
                format!(
                    "query policy {policy} is not bound to {series} (bound: {}); add it to a [[policy.bindings]] entry \
                     on every node",
                    if bound.is_empty() { "none".to_string() } else { bound.join(", ") }
                ),
            ));
        }
        let class = self.classes.of(&series).clone();
        let parts = self.query_parts(&series, &class, range).await?;
        let summaries = self
            .ask_owners(
                &series,
                &class,
                &parts,
                |parts| Request::Summarize {
                    series: series.clone(),
                    parts,
                    policy: policy.clone(),
                    params: params.clone(),
                },
                parse_partials,
                same_points,
                |part| self.summarize_block(&series, &class, part, &policy, &params),
            )
            .await?;
        let partials: Vec<PartialResult> = summaries.into_iter().flat_map(|s| s.partials).collect();
        let result = policies::merge(registry, policy, partials, params.into_iter().collect()).await?;
        Ok(QueryOutput {
            policy: result.policy.name,
            version: result.policy.version,
            values: result.values.into_iter().map(|v| (v.name, v.value)).collect(),
            points: result.points,
        })
    }

    /// Window aggregates of one block part from R of its owners: the fallback of
    /// [`Coordinator::ask_owners`]. Equal answers (digests included) mean the owners hold the
    /// same points; otherwise their raw points are merged and aggregated here.
    async fn windows_of_block(
        &self,
        series: &SeriesKey,
        class: &SeriesClass,
        part: BlockPart,
        width_ns: i64,
    ) -> Result<Vec<WindowStats>, ErrorReply> {
        let id = key::block_id(class.format, series, &part.quantum);
        let replicas = self.ordered_replicas(id, class).await;
        let fetch = |c: Contact| async move {
            let req = Request::FetchWindows { series: series.clone(), parts: vec![part], width_ns };
            let resp = self.replica_call(&c, req).await?;
            parse_windows(resp, 1).map(|mut w| w.swap_remove(0))
        };
        let r = usize::from(class.replication.r);
        let what = || format!("{series} at quantum {}", part.quantum.start);
        let mut answers = Self::ask_replicas(&replicas, r, what, fetch).await?;
        if answers.windows(2).all(|w| w[0] == w[1]) {
            return Ok(answers.swap_remove(0));
        }
        let points = self.fetch_block(series, class, id, part.quantum, part.range, None, usize::MAX).await?;
        let mut aggregator = Aggregator::new(part.range, width_ns);
        aggregator.push_points(&points);
        Ok(aggregator.finish())
    }

    /// Window aggregates of `range` of `series` in windows of `width_ns`: every owner answers
    /// for its quanta (from block summaries where a window covers whole quanta), and the
    /// windows are merged across quanta here.
    pub async fn aggregate(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        width_ns: i64,
    ) -> Result<Vec<WindowStats>, ErrorReply> {
        let class = self.classes.of(&series).clone();
        let parts = self.query_parts(&series, &class, range).await?;
        let per_part = self
            .ask_owners(
                &series,
                &class,
                &parts,
                |parts| Request::FetchWindows { series: series.clone(), parts, width_ns },
                parse_windows,
                |a, b| a == b,
                |part| self.windows_of_block(&series, &class, part, width_ns),
            )
            .await?;
        let windows = merge_windows(&range, width_ns, per_part);
        if windows.is_empty() && !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok(windows)
    }

    /// The series of the whole cluster passing `filter`: every known node lists the
    /// registrations it holds (each series is registered on RF nodes), and the answers are
    /// merged. Fails if so many nodes failed to answer that a series could be missing.
    pub async fn list_series(&self, filter: SeriesFilter, limit: u32) -> Result<(Vec<SeriesKey>, bool), ErrorReply> {
        let mut nodes = self.dht.all_known();
        nodes.push(self.dht.me());
        let ask = |c: Contact| {
            let req = Request::FindSeries { filter: filter.clone(), limit };
            async move { self.replica_call(&c, req).await }
        };
        let answers = bounded_in_order(nodes.iter().map(|c| ask(*c)).collect(), OWNER_PARALLELISM).await;
        let mut all = std::collections::BTreeSet::new();
        let mut more = false;
        let mut failed = Vec::new();
        for (node, answer) in nodes.iter().zip(answers) {
            match answer {
                Ok(Response::SeriesList { series, more: m }) => {
                    more |= m;
                    all.extend(series);
                }
                Ok(other) => failed.push(format!("{}: unexpected answer {other:?}", node.addr)),
                Err(e) => failed.push(format!("{}: {}", node.addr, e.message)),
            }
        }
        let min_rf = self.classes.iter().map(|c| c.replication.rf).min().unwrap_or(1) as usize;
        if failed.len() >= min_rf {
            return Err(unavailable(format!(
                "{} nodes did not answer, so the list could miss series: {}",
                failed.len(),
                failed.join("; ")
            )));
        }
        more |= all.len() > limit as usize;
        Ok((all.into_iter().take(limit as usize).collect(), more))
    }

    /// Whether `series` is registered in the series dictionary.
    async fn series_known(&self, series: &SeriesKey) -> Result<bool, ErrorReply> {
        if self.registered.lock().expect("registered lock").contains(series) {
            return Ok(true);
        }
        let rf = usize::from(self.classes.of(series).replication.rf);
        let replicas = self.dht.replicas(series_meta_id(series), rf).await;
        let mut asks: FuturesUnordered<_> =
            replicas.iter().map(|c| self.replica_call(c, Request::HasSeries { series: series.clone() })).collect();
        let mut answered = 0;
        while let Some(result) = asks.next().await {
            match result {
                Ok(Response::SeriesKnown { known: true }) => {
                    self.registered.lock().expect("registered lock").insert(series.clone());
                    return Ok(true);
                }
                Ok(_) => answered += 1,
                Err(e) => warn!(%series, error = %e.message, "series dictionary replica did not answer"),
            }
        }
        if answered == 0 {
            return Err(unavailable(format!("no replica of the series dictionary answered for {series}")));
        }
        Ok(false)
    }
}

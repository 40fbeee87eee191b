//! Coordinating client writes and reads across replicas.
//!
//! A write is split into blocks, one per (series, quantum); each goes to the RF nodes closest to
//! its time-factored id, and the write is acknowledged once every block has W acknowledgements.
//! Series seen for the first time are registered in the series dictionary (also RF replicas,
//! W acknowledgements) in the same round. A read sends one request per quantum, in parallel, to
//! R replicas each, and merges, deduplicates, sorts and trims the answers exactly to the range.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use timeshard_proto::class::SeriesClass;
use timeshard_proto::key::{self, series_meta_id};
use timeshard_proto::placement::{WritePlan, WriteProgress, merge_replica_answers, split_batch};
use timeshard_proto::point::page_start;
use timeshard_proto::time::{self, Quantum};
use timeshard_proto::wire::{ErrorCode, ErrorReply, Request, Response, SeriesPoints};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, SeriesKey, TimeRange};
use timeshard_store::Store;
use tokio::sync::mpsc;
use tracing::warn;

use crate::config::LimitsConfig;
use crate::dht::Dht;
use crate::server::serve_replica;

/// Placement lookups a write runs at once.
const PLACEMENT_PARALLELISM: usize = 32;
/// Series remembered as registered before the memory is cleared.
const REGISTERED_CACHE_MAX: usize = 100_000;
/// Points a read may hold in flight across the quanta it fetches in parallel.
const READ_POINT_BUDGET: usize = 2_000_000;

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
}

fn unavailable(message: String) -> ErrorReply {
    ErrorReply::new(ErrorCode::Unavailable, message)
}

impl Coordinator {
    /// A coordinator placing data through `dht` and storing this node's share in `store`.
    pub fn new(dht: Arc<Dht>, store: Arc<dyn Store>, classes: Classes, limits: LimitsConfig) -> Coordinator {
        Coordinator { dht, store, classes, limits, registered: Mutex::new(HashSet::new()) }
    }

    /// The class table.
    pub fn classes(&self) -> &Classes {
        &self.classes
    }

    /// Sends `req` to `contact`, or serves it locally if that is this node.
    async fn replica_call(&self, contact: &Contact, req: Request) -> Result<Response, ErrorReply> {
        if contact.id == self.dht.me().id {
            return match serve_replica(&self.store, req).await {
                Response::Error(e) => Err(e),
                r => Ok(r),
            };
        }
        self.dht.call(contact, &req).await.map_err(|e| unavailable(e.to_string()))
    }

    /// Writes a validated batch. Returns (points, blocks) once every block has W acks.
    pub async fn write(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<(u64, u64), ErrorReply> {
        let new_series: Vec<SeriesKey> = {
            let known = self.registered.lock().expect("registered lock");
            let mut seen = HashSet::new();
            batch.iter().map(|s| &s.series).filter(|s| !known.contains(*s) && seen.insert(*s)).cloned().collect()
        };
        let blocks = split_batch(batch, &self.classes);
        let points: u64 = blocks.iter().map(|b| b.block.points.len() as u64).sum();
        let n_blocks = blocks.len();

        // Where everything goes: one lookup per block and per new series, a few at a time.
        let lookups = blocks
            .iter()
            .map(|b| (b.id, usize::from(b.replication.rf)))
            .chain(new_series.iter().map(|s| (series_meta_id(s), usize::from(self.classes.of(s).replication.rf))))
            .collect::<Vec<_>>();
        let placements: Vec<Vec<Contact>> = futures::stream::iter(lookups)
            .map(|(id, rf)| self.dht.replicas(id, rf))
            .buffered(PLACEMENT_PARALLELISM)
            .collect()
            .await;
        let contacts: HashMap<Id, Contact> = placements.iter().flatten().map(|c| (c.id, *c)).collect();

        let needs = blocks
            .iter()
            .map(|b| usize::from(b.replication.w))
            .chain(new_series.iter().map(|s| usize::from(self.classes.of(s).replication.w)));
        let items = needs.zip(placements.iter()).enumerate().map(|(i, (need, replicas))| {
            let target = |c: &Contact| if i < n_blocks { Target::Blocks(c.id) } else { Target::Registrations(c.id) };
            (need, replicas.iter().map(target).collect::<Vec<_>>())
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
                    (id, Request::Store { blocks: idx.iter().map(|&i| blocks[i].block.clone()).collect() })
                }
                Target::Registrations(id) => (
                    id,
                    Request::RegisterSeries { series: idx.iter().map(|&i| new_series[i - n_blocks].clone()).collect() },
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
                    return Ok((points, n_blocks as u64));
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
        let mut quanta = time::quanta(scan, class.quantum).peekable();
        let mut out: Vec<Point> = Vec::new();
        let mut scanned = 0;
        while quanta.peek().is_some() {
            let remaining = limit - out.len();
            let window_len = (READ_POINT_BUDGET / remaining.max(1))
                .clamp(1, self.limits.read_parallelism)
                .min(self.limits.max_quanta_per_page - scanned);
            let window: Vec<(Quantum, TimeRange)> = quanta.by_ref().take(window_len).collect();
            scanned += window.len();
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
            if scanned >= self.limits.max_quanta_per_page && quanta.peek().is_some() {
                // Continue on the next page from the end of the last quantum scanned.
                let end = window.last().expect("window is never empty").0.end();
                return Ok((out, Some(PointKey { ts: end - 1, event: u64::MAX, value_bits: u64::MAX })));
            }
        }
        if out.is_empty() && after.is_none() && !self.series_known(&series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok((out, None))
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
        let mut replicas = self.dht.replicas(id, usize::from(class.replication.rf)).await;
        // Local first (no network), peers that failed lately last.
        let me = self.dht.me().id;
        replicas.sort_by_key(|c| (c.id != me, self.dht.is_suspect(&c.id)));
        let r = usize::from(class.replication.r);
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
        let mut candidates = replicas.iter().copied();
        let mut in_flight: FuturesUnordered<_> = candidates.by_ref().take(r).map(fetch).collect();
        let mut answers = Vec::with_capacity(r);
        let mut last_error = None;
        while let Some(result) = in_flight.next().await {
            match result {
                Ok(points) => {
                    answers.push(points);
                    if answers.len() == r {
                        break;
                    }
                }
                Err(e) => {
                    last_error = Some(e);
                    if let Some(next) = candidates.next() {
                        in_flight.push(fetch(next));
                    }
                }
            }
        }
        if answers.len() < r {
            return Err(unavailable(format!(
                "only {} of the {r} replicas a read needs answered for {series} at quantum {}{}",
                answers.len(),
                quantum.start,
                last_error.map(|e| format!(": {}", e.message)).unwrap_or_default()
            )));
        }
        let mut merged = merge_replica_answers(answers, &part);
        if let Some(a) = after {
            merged.retain(|p| p.key() > a);
        }
        merged.truncate(limit);
        Ok(merged)
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

//! The write path: ingest policies, then placing every block of a batch on its RF owners (from
//! the membership view) and returning once each has W acknowledgements.
//!
//! Series seen for the first time are registered in the series dictionary, and index spans
//! holding data for the first time are added to the series' quantum index, in the same round
//! and under the same quorum. This node remembers (boundedly) what it saw acknowledged, so
//! live data does not register or index the same thing again.
//!
//! What one owner gets is packed into requests within `max_batch_points` and the message size
//! (a full client batch plus its index entries does not fit one). Owners the view says are
//! down get hints instead of requests; a write whose blocks cannot reach W owners that are up
//! is refused at once, before anything is sent. Requests still running once the write has its
//! quorum run on, bounded, as [`super::replicas::ReplicaWrites`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use timeshard_proto::class::Replication;
use timeshard_proto::key::series_meta_id;
use timeshard_proto::placement::{
    self, WritePlan, WriteProgress, block_bytes, pack, placement_id, split_batch, split_block,
};
use timeshard_proto::quantum_index;
use timeshard_proto::wire::{BlockPoints, ErrorCode, ErrorReply, RejectedPoint, Request, Response, SeriesPoints};
use timeshard_proto::{Contact, Id, SeriesKey};
use tokio::sync::mpsc;

use super::{Coordinator, unavailable};
use crate::policies;

/// Series remembered as registered before the memory is cleared.
const REGISTERED_CACHE_MAX: usize = 100_000;
/// (series, index span) pairs remembered as indexed before the memory is cleared.
const INDEXED_CACHE_MAX: usize = 1_000_000;

/// One request of a write: to a node, blocks or registrations, one of several if they did not
/// fit one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Target {
    node: Id,
    registrations: bool,
    part: usize,
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

/// One thing a write must get W owners to store: a piece of a block, or a registration.
#[derive(Debug)]
struct Item {
    target: placement::Target,
    replication: Replication,
    what: What,
}

#[derive(Debug)]
enum What {
    Block(BlockPoints),
    Registration(SeriesKey),
}

impl Item {
    fn describe(&self) -> String {
        match &self.what {
            What::Block(b) => format!("block {} at quantum {}", b.series, b.quantum.start),
            What::Registration(s) => format!("the registration of {s}"),
        }
    }
}

/// The error a failed write reports: a replica's own error when the request itself was wrong
/// (every replica would refuse it; its code says why), otherwise `Unavailable` with the causes.
fn write_failure(errors: &[(Contact, ErrorReply)]) -> ErrorReply {
    if let Some((c, e)) = errors.iter().find(|(_, e)| !e.code.is_replica_fault()) {
        return ErrorReply::new(e.code, format!("replica {} refused the write: {}", c.addr, e.message));
    }
    let mut causes: Vec<String> = Vec::new();
    for (c, e) in errors {
        let cause = format!("{}: {}", c.addr, e.message);
        if !causes.contains(&cause) && causes.len() < 3 {
            causes.push(cause);
        }
    }
    unavailable(format!(
        "too few replicas acknowledged the write ({} replica request(s) failed: {}); some points may be stored, \
         and retrying is safe because writes are idempotent",
        errors.len(),
        if causes.is_empty() { "no answer".to_string() } else { causes.join("; ") }
    ))
}

impl Coordinator {
    /// Writes a validated batch: runs ingest policies, then returns once every block has W
    /// acknowledgements.
    pub async fn write(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<WriteOutcome, ErrorReply> {
        // Held until the write is answered: past the budget the write is refused (retryable)
        // before anything of it is stored.
        let _admitted = match &self.budget {
            Some(ledger) => {
                let points = batch.iter().map(|s| s.points.len() as u64).sum();
                Some(ledger.admit(points, crate::budget::recent_resident_bytes())?)
            }
            None => None,
        };
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

    /// Entries the caches of registered series and of index spans may hold: the constants, or
    /// less when the memory budget's caches share is smaller (a quarter for series, the rest
    /// for spans).
    fn cache_caps(&self) -> (usize, usize) {
        match &self.budget {
            Some(ledger) => {
                let entries = ledger.shares().cache_entries();
                (REGISTERED_CACHE_MAX.min(entries / 4), INDEXED_CACHE_MAX.min(entries - entries / 4))
            }
            None => (REGISTERED_CACHE_MAX, INDEXED_CACHE_MAX),
        }
    }

    /// Everything a batch stores: its blocks (split to fit a request), the index blocks of
    /// spans it fills first, and the registrations of series it writes first, each with where
    /// it goes. Returns them with (points, blocks) of the data and the new series and spans.
    #[allow(clippy::type_complexity)]
    fn items(
        &self,
        batch: Vec<SeriesPoints>,
    ) -> Result<(Vec<Item>, u64, u64, Vec<SeriesKey>, Vec<(SeriesKey, i64)>), ErrorReply> {
        let new_series: Vec<SeriesKey> = {
            let known = self.registered.lock().expect("registered lock");
            let mut seen = HashSet::new();
            batch.iter().map(|s| &s.series).filter(|s| !known.contains(*s) && seen.insert(*s)).cloned().collect()
        };
        let classes = self.classes();
        let data = split_batch(batch, &classes);
        let points: u64 = data.iter().map(|b| b.block.points.len() as u64).sum();
        let n_data = data.len() as u64;
        let new_spans: Vec<(SeriesKey, i64)> = {
            let indexed = self.indexed.lock().expect("indexed lock");
            let mut seen = HashSet::new();
            data.iter()
                .map(|b| (b.block.series.clone(), quantum_index::span_of(&b.block.quantum)))
                .filter(|k| !indexed.contains(k) && seen.insert(k.clone()))
                .collect()
        };
        let limits = self.limits();
        let (max_points, max_bytes) = (limits.max_batch_points as usize, limits.max_message_bytes as usize);
        // (the series that places it, the block)
        let mut blocks: Vec<(SeriesKey, BlockPoints)> =
            data.into_iter().map(|b| (b.block.series.clone(), b.block)).collect();
        // Index blocks are placed like the series they index (its replication, its location).
        blocks.extend(quantum_index::blocks(&new_spans));
        let mut items = Vec::new();
        for (base, block) in blocks {
            let class = classes.of(&base);
            let target = self.target(&base, placement_id(&block.series, &block.quantum, &classes), class)?;
            for piece in split_block(block, max_points, max_bytes) {
                items.push(Item { target: target.clone(), replication: class.replication, what: What::Block(piece) });
            }
        }
        for s in &new_series {
            let class = classes.of(s);
            let target = self.target(s, series_meta_id(s), class)?;
            items.push(Item { target, replication: class.replication, what: What::Registration(s.clone()) });
        }
        Ok((items, points, n_data, new_series, new_spans))
    }

    /// The nodes a write of `item` goes to, and those of them whose acknowledgements count
    /// towards its W. For a DHT block: its owners, all counted. For a CoI block: every owner
    /// (out-of-CoI ones are written asynchronously: not counted, hinted when they fail), and
    /// only the in-CoI ones counted ([`placement::in_coi_write_quorum`]). No stand-in counts
    /// for an in-CoI owner that is down: an in-CoI read asks the in-CoI owners and would miss
    /// a write only a stand-in holds. While fewer than W in-CoI owners are up (their region is
    /// down or cut off from this node) the write is refused, retryably, before anything is
    /// sent; the owners down get hints of writes that did reach W.
    fn write_owners(&self, item: &Item) -> Result<(Vec<Contact>, Vec<Contact>), ErrorReply> {
        let placed = self.view.owners_of(&item.target);
        let Some(site) = &item.target.site else {
            return Ok((placed.owners.clone(), placed.owners));
        };
        let need = usize::from(item.replication.w);
        let located = placed.owners.len() + placed.fallback.len();
        if placed.owners.len() < item.target.rf {
            return Err(unavailable(format!(
                "{} needs {} replicas ({} in-CoI, {} out-of-CoI) on nodes with a location, but this node's \
                 membership view holds {located} such node(s); give more nodes a `location` or lower n_in/n_out \
                 of the class",
                item.describe(),
                item.target.rf,
                site.coi.n_in,
                site.coi.n_out,
            )));
        }
        let counted = placement::in_coi_write_quorum(&placed, need, |id| self.view.is_up(id)).map_err(|short| {
            let down: Vec<String> = short.down.iter().map(|c| c.addr.to_string()).collect();
            unavailable(format!(
                "only {} of the {} in-CoI owners of {} are up ({} down: {}); an in-CoI write needs {} of them \
                 (other nodes do not stand in, so that every in-CoI quorum read sees it): nothing was written; \
                 retry once they are back",
                short.up,
                short.n_in,
                item.describe(),
                down.len(),
                down.join(", "),
                short.w,
            ))
        })?;
        Ok((placed.owners, counted))
    }

    /// The requests of a write: per owner node, its blocks packed within the limits and its
    /// registrations, each with the indices of the items it carries.
    fn requests(&self, items: &[Item], owners: &[Vec<Contact>]) -> Vec<(Target, Vec<usize>)> {
        // Ordered by node, so requests go out in the same order every time (a seed replays).
        let mut per_node: std::collections::BTreeMap<Id, (Vec<usize>, Vec<usize>)> = Default::default();
        for (i, item) in items.iter().enumerate() {
            for c in &owners[i] {
                let (blocks, regs) = per_node.entry(c.id).or_default();
                match item.what {
                    What::Block(_) => blocks.push(i),
                    What::Registration(_) => regs.push(i),
                }
            }
        }
        let limits = self.limits();
        let (max_points, max_bytes) = (limits.max_batch_points as usize, limits.max_message_bytes as usize);
        let max_series = limits.max_batch_series.max(1) as usize;
        let mut out = Vec::new();
        for (node, (blocks, regs)) in per_node {
            let sizes: Vec<(usize, usize)> = blocks
                .iter()
                .map(|&i| match &items[i].what {
                    What::Block(b) => (b.points.len(), block_bytes(b)),
                    What::Registration(_) => (0, 0),
                })
                .collect();
            for (part, idx) in pack(&sizes, max_points, max_bytes).into_iter().enumerate() {
                let target = Target { node, registrations: false, part };
                out.push((target, idx.into_iter().map(|j| blocks[j]).collect()));
            }
            for (part, idx) in regs.chunks(max_series).enumerate() {
                out.push((Target { node, registrations: true, part }, idx.to_vec()));
            }
        }
        out
    }

    /// Places and stores a batch; returns (points, blocks) once every block has W acks. Series
    /// seen for the first time are registered, and quanta that hold data for the first time
    /// are added to the series' quantum index, in the same round and under the same quorum.
    async fn replicate(self: &Arc<Self>, batch: Vec<SeriesPoints>) -> Result<(u64, u64), ErrorReply> {
        let (items, points, n_data, new_series, new_spans) = self.items(batch)?;
        // Per item: every node it goes to, and those whose acknowledgements count.
        let mut owners: Vec<Vec<Contact>> = Vec::with_capacity(items.len());
        let mut counted: Vec<HashSet<Id>> = Vec::with_capacity(items.len());
        for item in &items {
            let (all, sync) = self.write_owners(item)?;
            counted.push(sync.iter().map(|c| c.id).collect());
            owners.push(all);
        }

        // Refuse at once what cannot reach W owners that are up: nothing is sent then.
        for (item, owners) in items.iter().zip(&owners) {
            if item.target.site.is_some() {
                continue; // checked by write_owners
            }
            let need = usize::from(item.replication.w);
            if owners.len() < need {
                return Err(unavailable(format!(
                    "this node's membership view holds {} node(s) that own data, fewer than the write quorum of {} \
                     needs ({need}); start more nodes or lower rf/w in the series class",
                    self.view.eligible().len(),
                    item.describe()
                )));
            }
            let up = owners.iter().filter(|c| self.view.is_up(&c.id)).count();
            if up < need {
                let down: Vec<String> =
                    owners.iter().filter(|c| !self.view.is_up(&c.id)).map(|c| c.addr.to_string()).collect();
                return Err(unavailable(format!(
                    "only {up} of the {} owners of {} are up ({} down: {}); the write needs {need}: nothing was \
                     written; retry once they are back",
                    owners.len(),
                    item.describe(),
                    down.len(),
                    down.join(", ")
                )));
            }
        }

        let contacts: HashMap<Id, Contact> = owners.iter().flatten().map(|c| (c.id, *c)).collect();
        let requests = self.requests(&items, &owners);
        let mut per_item: Vec<Vec<Target>> = vec![Vec::new(); items.len()];
        for (target, idx) in &requests {
            for &i in idx {
                if counted[i].contains(&target.node) {
                    per_item[i].push(*target);
                }
            }
        }
        let mut plan =
            WritePlan::new(items.iter().zip(per_item).map(|(it, targets)| (usize::from(it.replication.w), targets)));

        let (tx, mut rx) = mpsc::channel(requests.len().max(1));
        let mut running = HashMap::new();
        let mut errors: Vec<(Contact, ErrorReply)> = Vec::new();
        let mut down_targets = Vec::new();
        for (target, idx) in requests {
            let req = if target.registrations {
                let series = idx.iter().filter_map(|&i| match &items[i].what {
                    What::Registration(s) => Some(s.clone()),
                    What::Block(_) => None,
                });
                Request::RegisterSeries { series: series.collect() }
            } else {
                let blocks = idx.iter().filter_map(|&i| match &items[i].what {
                    What::Block(b) => Some(b.clone()),
                    What::Registration(_) => None,
                });
                Request::Store { blocks: blocks.collect() }
            };
            let contact = contacts[&target.node];
            if !self.view.is_up(&target.node) {
                // Down owners get the data when they are back.
                self.replica_writes.hint(target.node, &req);
                down_targets.push(target);
                continue;
            }
            let req = Arc::new(req);
            let me = self.clone();
            let call_req = req.clone();
            let call = async move {
                match me.replica_call(&contact, (*call_req).clone()).await {
                    Ok(Response::Stored { .. }) => Ok(()),
                    Ok(other) => Err(ErrorReply::new(ErrorCode::Internal, format!("unexpected answer {other:?}"))),
                    Err(e) => Err(e),
                }
            };
            let tx = tx.clone();
            let key = self.replica_writes.spawn(target.node, req, call, move |outcome| {
                // The write may have been answered already; then nobody listens.
                let _ = tx.try_send((target, outcome));
            });
            running.insert(target, key);
        }
        drop(tx);
        for target in &down_targets {
            plan.on_failure(target);
        }

        let mut progress = plan.progress();
        while progress == WriteProgress::Pending {
            let Some((target, outcome)) = rx.recv().await else { break };
            running.remove(&target);
            progress = match outcome {
                Ok(()) => plan.on_ack(&target),
                Err(e) => {
                    errors.push((contacts[&target.node], e));
                    plan.on_failure(&target)
                }
            };
        }
        // What still runs goes on in the background (or becomes a hint).
        self.replica_writes.detach(running.into_values());
        match progress {
            WriteProgress::Acknowledged => {
                let mut known = self.registered.lock().expect("registered lock");
                let (registered_max, indexed_max) = self.cache_caps();
                if known.len() + new_series.len() > registered_max {
                    known.clear();
                }
                known.extend(new_series);
                let mut indexed = self.indexed.lock().expect("indexed lock");
                if indexed.len() + new_spans.len() > indexed_max {
                    indexed.clear();
                }
                indexed.extend(new_spans);
                Ok((points, n_data))
            }
            WriteProgress::Pending | WriteProgress::Failed => Err(write_failure(&errors)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_reports_the_replicas_cause() {
        let c = Contact { id: Id::sha1(b"a"), addr: "127.0.0.1:7401".parse().unwrap() };
        let full = ErrorReply::new(ErrorCode::Unavailable, "this node's store failed: store is full");
        let e = write_failure(&[(c, full.clone()), (c, full)]);
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.message.contains("store is full") && e.message.contains("2 replica request(s)"), "{}", e.message);
        // A request every replica would refuse keeps its own code.
        let too_big = ErrorReply::new(ErrorCode::BatchTooLarge, "batch holds 100064 points; the limit is 100000");
        let e = write_failure(&[(c, ErrorReply::new(ErrorCode::Overloaded, "busy")), (c, too_big)]);
        assert_eq!(e.code, ErrorCode::BatchTooLarge);
        assert!(e.message.contains("100064") && e.message.contains("127.0.0.1:7401"), "{}", e.message);
    }
}

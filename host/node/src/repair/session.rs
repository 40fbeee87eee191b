//! One pull session: this node (the initiator) compares its digest tree with a peer's, lists
//! the peer's entries of the leaves that differ, and fetches and stores the blocks it lacks or
//! holds with another digest ([`timeshard_proto::repair::to_fetch`]). Equal trees cost one
//! small message each way; otherwise bytes follow what differs. Fetched data is paced by the
//! node's repair token bucket (by bytes), and stored as a union (stores are idempotent sets of
//! points) by a [`super::pipeline`] storer that runs alongside the fetches.
//!
//! A block the peer listed but sent nothing of (its copy is damaged, or went meanwhile) is not
//! taken: the round's other sessions may fetch it, the session fails (the round does not
//! count towards settling), and the next rounds leave it to other replicas a while
//! ([`timeshard_proto::repair::undelivered`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use timeshard_proto::repair::tree::{self, Descent};
use timeshard_proto::repair::{BlockRef, MAX_LEAF_ENTRIES, MAX_REQUEST_BLOCKS, RepairEntry, RepairScope, to_fetch};
use timeshard_proto::wire::{self, Request, Response};
use timeshard_proto::{Contact, Id, Quantum, SeriesKey};
use tokio::sync::mpsc;

use super::Repair;
use super::inventory::Inventory;
use super::pipeline::{self, Page, STORE_BATCH_POINTS};
use super::state::Counters;

/// Why a session stopped before it compared everything.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the peer places blocks by another membership view (gossip has not converged yet)")]
    ViewMismatch,
    #[error("the peer did not answer: {0}")]
    Call(String),
    #[error("unexpected answer from the peer: {0}")]
    Unexpected(String),
    #[error("cannot store what was fetched: {0}")]
    Store(String),
    #[error(
        "the peer listed {0} blocks it then did not send (damaged or dropped there); other replicas are asked next"
    )]
    Undelivered(usize),
}

/// Blocks a round's sessions fetched, with the digest and count of the copy fetched.
pub type Taken = std::sync::Mutex<HashMap<BlockRef, (u64, u64)>>;

/// What one session did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionReport {
    pub leaves_differing: usize,
    pub blocks_fetched: u64,
    pub registrations: u64,
}

impl Repair {
    async fn call(&self, peer: &Contact, req: &Request) -> Result<Response, SessionError> {
        match self.dht.call(peer, req).await {
            Ok(Response::Error(e)) => Err(SessionError::Call(e.message)),
            Ok(r) => Ok(r),
            Err(e) => Err(SessionError::Call(e.to_string())),
        }
    }

    /// A compare message: counted both ways.
    async fn compare(&self, peer: &Contact, req: &Request) -> Result<Response, SessionError> {
        let resp = self.call(peer, req).await?;
        Counters::add(&self.state.counters.compare_bytes, wire::frame_bytes(req) + wire::frame_bytes(&resp));
        Ok(resp)
    }

    /// Pulls from `peer` what this node owns and lacks, comparing the blocks of `inv` (this
    /// node's inventory) last written up to `cutoff`. `taken` holds what the round's other
    /// sessions already fetched (block, digest, count), so a block several peers list alike is
    /// fetched once.
    pub async fn pull(
        &self,
        inv: &Arc<Inventory>,
        peer: Contact,
        cutoff: i64,
        taken: &Taken,
    ) -> Result<SessionReport, SessionError> {
        // Fetching and storing overlap: the comparison and the fetches run while the storer
        // makes earlier pages durable. Either failing stops both.
        let (pages, queued) = pipeline::queue();
        let storer = async {
            pipeline::store_pages(self.store.clone(), queued, STORE_BATCH_POINTS)
                .await
                .map_err(|e| SessionError::Store(e.0))
        };
        let (report, _) = tokio::try_join!(self.compare_and_fetch(inv, peer, cutoff, taken, pages), storer)?;
        // Counted once the storer returned: every page fetched is durable.
        Counters::add(&self.state.counters.blocks_fetched, report.blocks_fetched);
        Counters::add(&self.state.counters.sessions, 1);
        Ok(report)
    }

    /// The producing half of [`Repair::pull`]: compares trees, lists differing leaves and
    /// fetches what differs into `pages`.
    async fn compare_and_fetch(
        &self,
        inv: &Arc<Inventory>,
        peer: Contact,
        cutoff: i64,
        taken: &Taken,
        pages: mpsc::Sender<Page>,
    ) -> Result<SessionReport, SessionError> {
        let scope = RepairScope { view: inv.view_digest, cutoff };
        let inv2 = inv.clone();
        let local = timeshard_clock::spawn_blocking(move || inv2.tree(&peer.id, false, cutoff))
            .await
            .map_err(|e| SessionError::Store(e.to_string()))?;
        let descent = Descent::new(&local);
        let mut ask = descent.start();
        let mut leaves: Vec<u16> = Vec::new();
        // Each answer reaches at least a level deeper, so the leaves come within the depth.
        for _ in 0..=tree::DEPTH {
            if ask.is_empty() {
                break;
            }
            let mut next = Vec::new();
            for chunk in ask.chunks(tree::LEAVES) {
                let req = Request::RepairTree { scope, nodes: chunk.to_vec(), descend: tree::MAX_DESCEND };
                match self.compare(&peer, &req).await? {
                    Response::RepairTree { view_matches: false, .. } => return Err(SessionError::ViewMismatch),
                    Response::RepairTree { hashes, .. } => {
                        let step = descent.on_answer(&hashes);
                        leaves.extend(step.leaves);
                        next.extend(step.ask);
                    }
                    other => return Err(SessionError::Unexpected(format!("{other:?}"))),
                }
            }
            ask = next;
        }
        leaves.sort_unstable();
        leaves.dedup();
        let mut report = SessionReport { leaves_differing: leaves.len(), ..SessionReport::default() };
        let mut rest: &[u16] = &leaves;
        while !rest.is_empty() {
            let asked = &rest[..rest.len().min(tree::LEAVES)];
            let req = Request::RepairLeaves { scope, leaves: asked.to_vec(), limit: MAX_LEAF_ENTRIES };
            let (entries, done) = match self.compare(&peer, &req).await? {
                Response::RepairLeaves { view_matches: false, .. } => return Err(SessionError::ViewMismatch),
                Response::RepairLeaves { entries, done, .. } => (entries, (done as usize).clamp(1, asked.len())),
                other => return Err(SessionError::Unexpected(format!("{other:?}"))),
            };
            let (registrations, blocks) = self.plan(inv, &peer.id, &asked[..done], entries, taken);
            report.registrations += registrations.len() as u64;
            if !registrations.is_empty() {
                let store = self.store.clone();
                timeshard_clock::spawn_blocking(move || store.register_series(&registrations))
                    .await
                    .map_err(|e| SessionError::Store(e.to_string()))?
                    .map_err(|e| SessionError::Store(e.to_string()))?;
            }
            for chunk in blocks.chunks(MAX_REQUEST_BLOCKS) {
                let mut delivered = HashSet::new();
                let fetched = self.fetch(&peer, chunk.to_vec(), &pages, &mut delivered).await;
                // What did not arrive is not taken: the round's other sessions may fetch it.
                // What the peer answered without (not a failed call) is left to other
                // replicas by the next rounds too.
                let missing: Vec<&(SeriesKey, Quantum)> = chunk.iter().filter(|b| !delivered.contains(*b)).collect();
                if !missing.is_empty() {
                    let now = timeshard_clock::instant();
                    let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
                    let mut undelivered = self.undelivered.lock().unwrap_or_else(|e| e.into_inner());
                    for (series, quantum) in &missing {
                        let block = BlockRef::Points { series: series.clone(), quantum: *quantum };
                        taken.remove(&block);
                        if fetched.is_ok() {
                            undelivered.note(peer.id, block, now);
                        }
                    }
                }
                report.blocks_fetched += fetched? - missing.len() as u64;
                if !missing.is_empty() {
                    return Err(SessionError::Undelivered(missing.len()));
                }
            }
            rest = &rest[done..];
        }
        Ok(report)
    }

    /// What to take of a peer's `entries` of `leaves`: registrations to record, and blocks to
    /// fetch (those this node owns and lacks, or holds with another digest).
    fn plan(
        &self,
        inv: &Inventory,
        peer: &Id,
        leaves: &[u16],
        entries: Vec<RepairEntry>,
        taken: &Taken,
    ) -> (Vec<SeriesKey>, Vec<(SeriesKey, Quantum)>) {
        let mut mine: HashMap<BlockRef, (u64, u64)> =
            inv.held(leaves).into_iter().map(|(b, i)| (b, (i.digest, i.count))).collect();
        let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
        for e in &entries {
            if let Some(t) = taken.get(&e.block) {
                mine.insert(e.block.clone(), *t);
            }
        }
        let classes = self.classes();
        let me = self.me.id;
        // The peer lists what it places on this node; a block this node's view does not place
        // here (an index block whose registration is not here yet cannot be placed) is not taken.
        let not_mine = |b: &BlockRef| inv.place(b, &classes).is_some_and(|owners| !owners.iter().any(|c| c.id == me));
        // A block this peer listed and then did not send lately is left to other replicas.
        let now = timeshard_clock::instant();
        let undelivered = self.undelivered.lock().unwrap_or_else(|e| e.into_inner());
        let skip = |b: &BlockRef| not_mine(b) || undelivered.pass_over(peer, b, now);
        let mut registrations = Vec::new();
        let mut blocks = Vec::new();
        for e in to_fetch(entries, &mine, skip) {
            taken.insert(e.block.clone(), (e.digest, e.count));
            match e.block {
                BlockRef::Registration { series } => registrations.push(series),
                BlockRef::Points { series, quantum } => blocks.push((series, quantum)),
            }
        }
        (registrations, blocks)
    }

    /// Fetches `blocks` whole from `peer`, page by page, handing each page to the storer
    /// behind `pages` (the next page is fetched while it stores); returns how many blocks were
    /// asked for, and adds to `delivered` each block of which a point arrived (the peer leaves
    /// out a block it finds damaged). Pacing follows the bytes fetched.
    async fn fetch(
        &self,
        peer: &Contact,
        blocks: Vec<(SeriesKey, Quantum)>,
        pages: &mpsc::Sender<Page>,
        delivered: &mut HashSet<(SeriesKey, Quantum)>,
    ) -> Result<u64, SessionError> {
        let limit = self.limits.max_page_points.min(self.limits.max_batch_points);
        let mut after = None;
        loop {
            let req = Request::ReadBlocks { blocks: blocks.clone(), after, limit };
            let resp = self.call(peer, &req).await?;
            // What crossed the wire both ways, as the transport framed it.
            let bytes = wire::frame_bytes(&req) + wire::frame_bytes(&resp);
            let (page, next) = match resp {
                Response::Blocks { blocks, next } => (blocks, next),
                other => return Err(SessionError::Unexpected(format!("{other:?}"))),
            };
            delivered.extend(page.iter().filter(|b| !b.points.is_empty()).map(|b| (b.series.clone(), b.quantum)));
            Counters::add(&self.state.counters.bytes_fetched, bytes);
            // A closed queue means the storer failed; `pull` reports its error.
            if !page.is_empty() && pages.send(page).await.is_err() {
                return Err(SessionError::Store("the storer stopped".into()));
            }
            self.pace(bytes).await;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok(blocks.len() as u64)
    }
}

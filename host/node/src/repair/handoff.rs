//! Handoff of blocks this node holds but no longer owns (others joined closer to them, or this
//! node is leaving): each current owner is asked for its digest of the block (batched
//! `BlockDigests`); owners whose copy differs get ours pushed (`Store`, paged, paced); once
//! every owner confirmed (an equal digest, or a push it stored), the local copy is dropped if
//! its digest is still the one confirmed (the store's conditional drop). An owner that is down
//! or fails keeps the copy here until a later pass.
//!
//! Registrations in the series dictionary are handed off the same way but never dropped (they
//! are small, and the coordinator's write path may register again); once every owner holds
//! one, it is not asked about again while the view stays the same.
//!
//! Blocks written within `settle_for` are left for a later pass (coordinators may still be
//! writing them by a previous view), except while leaving.
//!
//! A displaced block the store finds damaged has nothing readable to push: it counts as
//! confirmed by each owner that holds a copy of its own, and stays while one lacks it.

use std::collections::HashSet;
use std::sync::Arc;

use timeshard_clock::now_ns;
use timeshard_proto::repair::{BlockRef, Handoff, MAX_REQUEST_BLOCKS, OwnerCopy};
use timeshard_proto::wire::{self, BlockPoints, Request, Response};
use timeshard_proto::{Contact, Id, Point, SeriesKey};
use timeshard_store::StoreError;
use tracing::{debug, info, warn};

use super::Repair;
use super::inventory::Inventory;
use super::state::Counters;
use crate::hints::HintPayload;
use crate::hints::replay::requests;

/// What a handoff pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffReport {
    /// Displaced blocks (with points) it looked at, and those it dropped.
    pub blocks: u64,
    pub dropped: u64,
    /// Blocks and bytes pushed to owners that lacked them.
    pub pushed: u64,
    pub bytes: u64,
    /// Displaced registrations not yet confirmed by every owner.
    pub registrations_pending: u64,
}

impl HandoffReport {
    /// Whether nothing is left to hand off.
    pub fn is_done(&self) -> bool {
        self.blocks == self.dropped && self.registrations_pending == 0
    }
}

/// Pages of blocks on their way to one owner in one `Store` request, and the blocks whose last
/// page is among them.
#[derive(Default)]
struct PushBatch {
    blocks: Vec<BlockPoints>,
    points: usize,
    complete: Vec<usize>,
}

/// One displaced block or registration being handed off.
struct Displaced {
    block: BlockRef,
    count: u64,
    owners: Vec<Contact>,
    handoff: Handoff,
}

impl Repair {
    /// One handoff pass over the blocks this node holds but does not own, those written within
    /// `settle_for` left out unless `everything` (leaving).
    pub(super) async fn handoff_pass(&self, everything: bool) -> Result<HandoffReport, StoreError> {
        let inv = self.inventory().await?;
        let now = now_ns();
        let cutoff = if everything { i64::MAX } else { now.saturating_sub(self.cfg.settle_for.as_nanos() as i64) };
        let report = self.hand_off(&inv, cutoff, now).await;
        Counters::set(&self.state.counters.handoff_pending, report.blocks - report.dropped);
        if report.dropped > 0 || report.pushed > 0 {
            info!(
                displaced = report.blocks,
                pushed = report.pushed,
                bytes = report.bytes,
                dropped = report.dropped,
                "handed off blocks this node no longer owns"
            );
        }
        Ok(report)
    }

    /// Hands off the displaced blocks last written up to `cutoff`, and those last written after
    /// `now`: this node's clock has jumped back since (a write time ahead of the clock says
    /// nothing about how recent the write is), and waiting for the clock to pass it again
    /// would keep a stale copy the length of the jump (issue 24: a minute, in ten seeds). An
    /// early handoff loses nothing: the drop checks the digest, and later points stay.
    async fn hand_off(&self, inv: &Arc<Inventory>, cutoff: i64, now: i64) -> HandoffReport {
        let mut report = HandoffReport::default();
        let confirmed = self.confirmed_registrations(inv.generation);
        let mut work: Vec<Displaced> = Vec::new();
        for item in inv.displaced() {
            let registration = matches!(item.block, BlockRef::Registration { .. });
            let recent = item.last_write > cutoff && item.last_write <= now;
            if (!registration && recent) || (registration && confirmed.contains(item.block.series())) {
                continue;
            }
            let owners: Vec<Contact> =
                inv.owners_of(item).owners.iter().filter(|c| c.id != self.me.id).copied().collect();
            let handoff = Handoff::new(item.digest, owners.iter().map(|c| c.id));
            work.push(Displaced { block: item.block.clone(), count: item.count, owners, handoff });
        }
        report.blocks = work.iter().filter(|d| matches!(d.block, BlockRef::Points { .. })).count() as u64;
        // Ordered by owner, so a pass runs the same way every time (a seed replays).
        let mut by_owner: std::collections::BTreeMap<Id, (Contact, Vec<usize>)> = Default::default();
        for (i, d) in work.iter().enumerate() {
            for o in &d.owners {
                by_owner.entry(o.id).or_insert_with(|| (*o, Vec::new())).1.push(i);
            }
        }
        for (owner, items) in by_owner.into_values() {
            if !self.view.is_up(&owner.id) {
                continue;
            }
            if let Err(e) = self.confirm_with(owner, &items, &mut work, &mut report).await {
                debug!(peer = %owner.id.short(), error = %e, "handoff to an owner stopped; will retry");
            }
        }
        let mut newly_confirmed = Vec::new();
        for d in work {
            if !d.handoff.may_drop() {
                report.registrations_pending += u64::from(matches!(d.block, BlockRef::Registration { .. }));
                continue;
            }
            match d.block {
                BlockRef::Registration { series } => newly_confirmed.push(series),
                BlockRef::Points { series, quantum } => {
                    let store = self.store.clone();
                    let digest = d.handoff.digest;
                    let dropped =
                        timeshard_clock::spawn_blocking(move || store.drop_block(&series, quantum.start, digest)).await;
                    match dropped {
                        Ok(Ok(true)) => report.dropped += 1,
                        // Written since: its new points go on the next pass.
                        Ok(Ok(false)) => {}
                        Ok(Err(e)) => debug!(error = %e, "cannot drop a handed-off block; will retry"),
                        Err(e) => debug!(error = %e, "drop task failed"),
                    }
                }
            }
        }
        self.add_confirmed_registrations(inv.generation, newly_confirmed);
        Counters::add(&self.state.counters.handoff_blocks_dropped, report.dropped);
        report
    }

    /// Asks `owner` for its digests of `items` and pushes those that differ.
    async fn confirm_with(
        &self,
        owner: Contact,
        items: &[usize],
        work: &mut [Displaced],
        report: &mut HandoffReport,
    ) -> Result<(), String> {
        for chunk in items.chunks(MAX_REQUEST_BLOCKS) {
            let blocks: Vec<BlockRef> = chunk.iter().map(|&i| work[i].block.clone()).collect();
            let digests = match self.dht.call(&owner, &Request::BlockDigests { blocks }).await {
                Ok(Response::BlockDigests { digests }) if digests.len() == chunk.len() => digests,
                Ok(other) => return Err(format!("unexpected answer to block digests: {other:?}")),
                Err(e) => return Err(e.to_string()),
            };
            let mut push_blocks = Vec::new();
            let mut push_series = Vec::new();
            for (&i, theirs) in chunk.iter().zip(digests) {
                let d = &mut work[i];
                let holds = theirs.is_some();
                if d.handoff.on_digest(&owner.id, theirs, d.count) == OwnerCopy::Differs {
                    match &d.block {
                        BlockRef::Points { .. } => push_blocks.push((i, holds)),
                        BlockRef::Registration { series } => push_series.push((i, series.clone())),
                    }
                }
            }
            if !push_series.is_empty() {
                let series: Vec<SeriesKey> = push_series.iter().map(|(_, s)| s.clone()).collect();
                for req in requests(vec![HintPayload::Registrations(series)], &self.limits) {
                    self.send(&owner, &req).await?;
                }
                for (i, _) in push_series {
                    work[i].handoff.confirmed(&owner.id);
                }
            }
            self.push_blocks(&owner, &push_blocks, work, report).await?;
        }
        Ok(())
    }

    /// Sends the blocks `items` of `work` (each with whether `owner` holds a copy of it) whole
    /// from the local store to `owner`, several small blocks (or pages of a large one) per
    /// `Store` request, and marks each confirmed by `owner` once the request holding its last
    /// page was stored.
    ///
    /// A block the store finds damaged has nothing to send, and must not stop the others
    /// (issue 24, seed 1005: a displaced copy a misdirected write left unreadable kept every
    /// other block of its owners here, and itself for good). It counts as confirmed by an
    /// owner that holds a copy: nothing readable of it is lost when it goes. Where an owner
    /// lacks it, it stays here.
    async fn push_blocks(
        &self,
        owner: &Contact,
        items: &[(usize, bool)],
        work: &mut [Displaced],
        report: &mut HandoffReport,
    ) -> Result<(), String> {
        let limit = self.limits.max_batch_points.min(self.limits.max_page_points) as usize;
        let mut batch = PushBatch::default();
        'blocks: for &(i, owner_holds) in items {
            let BlockRef::Points { series, quantum } = work[i].block.clone() else { continue };
            let mut after = None;
            loop {
                let (store, s, room) = (self.store.clone(), series.clone(), limit.saturating_sub(batch.points).max(1));
                let read = timeshard_clock::spawn_blocking(move || store.read_block(&s, quantum.start, after, room))
                    .await
                    .map_err(|e| e.to_string())?;
                let page = match read {
                    Ok(page) => page,
                    Err(StoreError::Corrupt(why)) => {
                        warn!(peer = %owner.id.short(), series = %series, quantum = quantum.start, owner_holds, error = %why,
                            "a displaced block is damaged here: nothing of it to hand off");
                        if owner_holds {
                            work[i].handoff.confirmed(&owner.id);
                        }
                        continue 'blocks;
                    }
                    Err(e) => return Err(e.to_string()),
                };
                if page.points.is_empty() {
                    break;
                }
                after = page.points.last().map(Point::key).or(after);
                batch.points += page.points.len();
                batch.blocks.push(BlockPoints { series: series.clone(), quantum, points: page.points });
                if !page.more {
                    break;
                }
                if batch.points >= limit {
                    self.flush(owner, &mut batch, work, report).await?;
                }
            }
            batch.complete.push(i);
            if batch.points >= limit {
                self.flush(owner, &mut batch, work, report).await?;
            }
        }
        self.flush(owner, &mut batch, work, report).await
    }

    /// Stores `batch` on `owner` (paced), then confirms the blocks it completed.
    async fn flush(
        &self,
        owner: &Contact,
        batch: &mut PushBatch,
        work: &mut [Displaced],
        report: &mut HandoffReport,
    ) -> Result<(), String> {
        let PushBatch { blocks, complete, .. } = std::mem::take(batch);
        // What crosses the wire, as the transport frames it.
        let mut bytes = 0u64;
        if !blocks.is_empty() {
            for req in requests(vec![HintPayload::Blocks(blocks)], &self.limits) {
                bytes += wire::frame_bytes(&req);
                self.send(owner, &req).await?;
            }
        }
        report.bytes += bytes;
        Counters::add(&self.state.counters.handoff_bytes_pushed, bytes);
        for i in complete {
            work[i].handoff.confirmed(&owner.id);
            report.pushed += 1;
            Counters::add(&self.state.counters.handoff_blocks_pushed, 1);
        }
        super::wait_for(&self.push_pace, bytes).await;
        Ok(())
    }

    async fn send(&self, owner: &Contact, req: &Request) -> Result<(), String> {
        match self.dht.call(owner, req).await {
            Ok(Response::Stored { .. }) => Ok(()),
            Ok(other) => Err(format!("unexpected answer to a handoff push: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Registrations every owner confirmed in view `generation`.
    fn confirmed_registrations(&self, generation: u64) -> HashSet<SeriesKey> {
        let mut c = self.handed_off.lock().unwrap_or_else(|e| e.into_inner());
        if c.0 != generation {
            *c = (generation, HashSet::new());
        }
        c.1.clone()
    }

    fn add_confirmed_registrations(&self, generation: u64, series: Vec<SeriesKey>) {
        let mut c = self.handed_off.lock().unwrap_or_else(|e| e.into_inner());
        if c.0 == generation {
            c.1.extend(series);
        }
    }
}

/// Passes of a graceful leave run this far apart while blocks remain.
const LEAVE_PASS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Repair {
    /// Starts leaving the cluster, unless already leaving: announces `Leaving` (placement
    /// stops choosing this node; reads still ask it), waits `catch_up_delay` for the change to
    /// reach every coordinator, hands every block off, announces `Left`, and calls `left` once
    /// peers had a few gossip rounds to learn it. Returns where the leave stands.
    pub fn leave(
        self: &Arc<Self>,
        gossip_interval: std::time::Duration,
        left: impl FnOnce() + Send + 'static,
    ) -> timeshard_proto::repair::LeaveProgress {
        if self.state.start_leaving() {
            info!("leaving the cluster: handing every block off first");
            self.view.set_status(timeshard_proto::membership::MemberStatus::Leaving);
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(me.cfg.catch_up_delay).await;
                me.hand_off_everything().await;
                me.view.set_status(timeshard_proto::membership::MemberStatus::Left);
                me.state.update_leave(|p| p.left = true);
                info!("every block handed off; announced that this node left");
                tokio::time::sleep(gossip_interval * 5).await;
                left();
            });
        }
        self.state.leave_progress()
    }

    /// Handoff passes of every block until none is left.
    async fn hand_off_everything(&self) {
        let mut first = true;
        loop {
            match self.handoff_pass(true).await {
                Ok(report) => {
                    self.state.update_leave(|p| {
                        if first {
                            p.blocks_total = report.blocks;
                        }
                        p.blocks_done = p.blocks_total.saturating_sub(report.blocks - report.dropped);
                        p.bytes_pushed += report.bytes;
                    });
                    first = false;
                    if report.is_done() {
                        return;
                    }
                }
                Err(e) => debug!(error = %e, "cannot list this node's blocks for leaving; will retry"),
            }
            tokio::time::sleep(LEAVE_PASS_EVERY).await;
        }
    }
}

//! When this node pulls from whom, and when it is settled.
//!
//! Every `anti_entropy_interval` (jittered by up to a tenth) the node runs a **round**: a pull
//! session ([`super::session`]) with each neighbour that is up (every serving member when the
//! view holds at most [`timeshard_proto::repair::MAX_NEIGHBOURS`], else that many closest),
//! comparing blocks last written more than `settle_for` ago. A change of the view starts a
//! round at once (after a short pause that lets a burst of changes pass), then a handoff pass
//! ([`super::handoff`]).
//!
//! Settledness ([`repair::Settle`]): the node starts unsettled, and becomes unsettled whenever the view
//! drops a member (gone, left, leaving, revoked: its blocks may now be this node's) or a
//! location changes so that it may own CoI series it lacks, at once, inside the view's update
//! (`follow_view`), so no read placed by the new view counts it as settled. Once
//! `catch_up_delay` has passed since, it runs **catch-up** rounds that include recently
//! written blocks, retried every few seconds until one has pulled from every neighbour, none
//! of them down to it (crashed or cut off: it may hold the only copies of blocks this node now
//! owns; it counts again once back, or once gone); then it is settled and says so in its
//! replica answers.
//!
//! The inventory of the store (every block placed by the current view) is shared by the
//! rounds, the handoff passes and the sessions this node answers. A round builds a fresh one;
//! an answered session reuses one built after its cutoff (it holds every block last written
//! before), so the peers of a regular round share one; otherwise it is rebuilt when the view
//! changed or it is older than [`super::INVENTORY_MAX_AGE`].

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use timeshard_clock::instant;

use futures::StreamExt;
use timeshard_clock::now_ns;
use timeshard_proto::placement::coi::Located;
use timeshard_proto::repair;
use timeshard_proto::{Contact, Id};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Repair;
use super::session::Taken;
use super::state::Counters;

/// How long the driver waits after a view change before its round, so a burst of changes
/// (several nodes joining) makes one round.
const VIEW_CHANGE_PAUSE: Duration = Duration::from_secs(1);
/// How soon an incomplete catch-up round is retried.
const CATCH_UP_RETRY: Duration = Duration::from_secs(2);
/// Sessions a round runs at once.
const SESSIONS_AT_ONCE: usize = 2;

/// What settledness follows of a view: the members that own blocks, and the located ones
/// with where they are.
#[allow(clippy::type_complexity)]
fn snapshot(eligible: &[Contact], located: &[Located]) -> (Vec<Id>, Vec<(Id, f64, f64)>) {
    let owners = eligible.iter().map(|c| c.id).collect();
    let located = located.iter().map(|l| (l.contact.id, l.at.lat, l.at.lon)).collect();
    (owners, located)
}

impl Repair {
    /// Runs rounds until `stop` fires.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut changes = self.view.subscribe();
        self.follow_view();
        let jitter = |d: Duration| d + d.mul_f64(timeshard_clock::rng().random_range(0.0..0.1));
        let mut next_round = instant() + jitter(self.cfg.anti_entropy_interval);
        let mut last_round = instant();
        let mut hurried = false;
        loop {
            let due = match self.settle().catch_up_at() {
                // The catch-up round starts at `at`; once one ran and did not complete (no
                // neighbour answered), the next waits for `next_round` instead of spinning.
                Some(at) if at > last_round => next_round.min(at),
                _ => next_round,
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Settledness already followed the change (`follow_view`); a round soon.
                    next_round = next_round.min(instant() + VIEW_CHANGE_PAUSE);
                    continue;
                }
                _ = tokio::time::sleep_until(due.into()) => {}
            }
            // A copy found damaged goes first, so this round fetches it again.
            self.drop_damaged().await;
            last_round = instant();
            let complete = self.round(&stop).await;
            let damage = self.scrub_step().await;
            let now = instant();
            next_round = match self.settle().catch_up_at() {
                Some(_) if !complete => now + CATCH_UP_RETRY,
                _ => now + jitter(self.cfg.anti_entropy_interval),
            };
            // Damage the scrub found is dropped and fetched by a round at once, but never by two
            // such rounds in a row: a damaged block no other member owns is kept, the next scrub
            // pass finds it again, and a node whose rounds reached nobody ran them back to back
            // without simulated time passing (issue 24, seed 20075).
            hurried = damage && !hurried;
            if hurried {
                next_round = now;
            }
            // A leaving node hands off everything in its own passes.
            if stop.is_cancelled() || self.state.is_leaving() {
                continue;
            }
            if let Err(e) = self.handoff_pass(false).await {
                debug!(error = %e, "cannot list this node's blocks for handoff; will retry");
            }
        }
    }

    /// Makes this node unsettled the moment its view changes in a way that may give it blocks
    /// it does not hold ([`repair::Settle::on_view_change`], [`repair::Settle::on_locations_change`]),
    /// from inside the view's update: a read that places a block by the new view never counts
    /// this node as settled for it, which a task noticing the change later (after a round
    /// in progress, say) could not promise (issue 24, seed 109).
    fn follow_view(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        let (_, eligible, located) = self.view.placement();
        let first = snapshot(&eligible, &located);
        let last = std::sync::Mutex::new(first);
        let hooked = self.view.on_change(move |m| {
            let Some(this) = this.upgrade() else { return };
            let (owners, located) = snapshot(m.eligible(), m.located());
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            let now = instant();
            let mut settle = this.settle();
            if settle.on_view_change(&last.0, &owners, now) {
                this.state.set_settled(false);
                info!(members = owners.len(), "a member left the owners: catching up before reads count on this node");
            }
            if settle.on_locations_change(&this.me.id, &last.1, &located, now) {
                this.state.set_settled(false);
                info!(located = located.len(), "a location changed: catching up before reads count on this node");
            }
            *last = (owners, located);
        });
        if !hooked {
            warn!("another repair already follows this view; this one's settledness does not follow it");
        }
    }

    /// One round: a pull from every neighbour that is up. Returns whether every pull completed
    /// and no neighbour was down.
    async fn round(&self, stop: &CancellationToken) -> bool {
        let started = instant();
        let catching = self.settle().catch_up_at().is_some_and(|at| at <= started);
        let cutoff = if catching { i64::MAX } else { now_ns().saturating_sub(self.cfg.settle_for.as_nanos() as i64) };
        let inv = match self.inventory_since(started).await {
            Ok(inv) => inv,
            Err(e) => {
                info!(error = %e, "cannot list this node's blocks for anti-entropy; will retry");
                return false;
            }
        };
        let (neighbours, down): (Vec<Contact>, Vec<Contact>) =
            repair::neighbours(&self.view.serving(), &self.me.id).into_iter().partition(|c| self.view.is_up(&c.id));
        // A Vec, not an iterator adapter: a closure held across the awaits trips rustc's `Send`
        // inference for the spawned driver task.
        let taken = Taken::default();
        let mut sessions = Vec::with_capacity(neighbours.len());
        for &peer in &neighbours {
            let (inv, taken) = (inv.clone(), &taken);
            sessions.push(async move { (peer, self.pull(&inv, peer, cutoff, taken).await) });
        }
        let results: Vec<_> = futures::stream::iter(sessions)
            .buffer_unordered(SESSIONS_AT_ONCE)
            .take_until(stop.cancelled())
            .collect()
            .await;
        self.peers_seen.note_neighbours(neighbours.len() + down.len());
        let mut complete = timeshard_proto::repair::Settle::round_complete(
            neighbours.len(),
            results.len(),
            down.len(),
            self.peers_seen.alone_ever(),
        );
        let mut fetched = 0;
        for (peer, result) in results {
            match result {
                Ok(r) => fetched += r.blocks_fetched,
                Err(e) => {
                    complete = false;
                    debug!(peer = %peer.id.short(), error = %e, "anti-entropy session stopped; will retry");
                }
            }
        }
        if fetched > 0 {
            info!(blocks = fetched, peers = neighbours.len(), catching_up = catching, "anti-entropy fetched blocks");
        }
        if complete {
            Counters::add(&self.state.counters.rounds, 1);
            if self.settle().round_completed(started, catching) && !self.state.is_settled() {
                self.state.set_settled(true);
                info!(
                    peers = neighbours.len(),
                    took_ms = started.elapsed().as_millis() as u64,
                    "caught up: this node holds every block it owns"
                );
            }
        }
        complete
    }
}

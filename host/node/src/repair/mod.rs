//! Data follows membership: anti-entropy between replicas, handoff of blocks this node no
//! longer owns, read repair, and leaving the cluster gracefully. The decisions (digest trees,
//! what to fetch, settledness, pacing, when a copy may be dropped) are sans I/O in
//! `timeshard_proto::repair`; this module runs them against the store and the network.
//!
//! - [`state`]: what the read path shares with repair ([`RepairState`]): whether this node is
//!   settled (holds every block it owns), the counters `timeshard status` shows, and the queue
//!   of read repairs. A leaf, apart from the tasks below (which use the coordinator).
//! - [`Repair`] (here): one node's repair: the handles its tasks use, the inventory of the
//!   store they share, the pacing of what it fetches and pushes.
//! - [`inventory`]: one pass over the store, every block placed by one view.
//! - [`serve`]: answering a peer's pull session (trees, leaf listings, bulk block reads, which
//!   leave a damaged block out, digests) and listings of this node's blocks.
//! - [`session`]: pulling from one peer: compare trees, list differing leaves, fetch and store
//!   what differs.
//! - [`pipeline`]: storing what a session fetched while the next page is on the way, several
//!   pages per durable write.
//! - [`driver`]: when to pull from whom (rounds every `anti_entropy_interval`, at once when the
//!   view changes), and when this node becomes settled again.
//! - [`handoff`]: pushing blocks this node holds but no longer owns to their owners, dropping
//!   a copy once every owner confirmed it by digest; a graceful leave is a handoff of
//!   everything.
//! - [`read_repair`]: the task that sends the queued read repairs.
//! - `damaged`: dropping a copy a read found damaged, when replicas hold the block, so the
//!   next round fetches it again.

pub mod alone;
mod damaged;
pub mod driver;
pub mod handoff;
pub mod inventory;
pub mod pipeline;
pub mod read_repair;
pub mod serve;
pub mod session;
pub mod state;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timeshard_proto::repair::{Pace, Settle, Undelivered};
use timeshard_proto::wire::Limits;
use timeshard_proto::{Classes, Contact, SeriesKey};
use timeshard_store::{Store, StoreError};

use crate::config::RepairConfig;
use crate::coordinator::Coordinator;
use crate::dht::Dht;
use crate::membership::View;
use inventory::Inventory;
pub use state::{Counters, ReadRepairs, RepairState};

/// How old an inventory may be before a session rebuilds it.
pub const INVENTORY_MAX_AGE: Duration = Duration::from_secs(2);

/// The repair of one node: the handles its tasks use, the inventory they share, their pacing
/// and settledness.
#[derive(Debug)]
pub struct Repair {
    me: Contact,
    dht: Arc<Dht>,
    view: Arc<View>,
    store: Arc<dyn Store>,
    coordinator: Arc<Coordinator>,
    state: Arc<RepairState>,
    cfg: RepairConfig,
    limits: Limits,
    inventory: tokio::sync::Mutex<Option<Arc<Inventory>>>,
    fetch_pace: Mutex<Pace>,
    push_pace: Mutex<Pace>,
    settle: Mutex<Settle>,
    /// Blocks peers listed but did not send, left to other replicas a while.
    undelivered: Mutex<Undelivered>,
    /// Whether this node has been alone since its data began.
    peers_seen: alone::PeersSeen,
    /// Registrations every owner confirmed, in the view of this generation.
    handed_off: Mutex<(u64, HashSet<SeriesKey>)>,
    /// Where the next scrub step starts (`damaged::scrub_step`).
    scrub_cursor: Mutex<Option<timeshard_store::ListCursor>>,
    /// Damaged blocks kept because no other member owns them, already reported once
    /// (`damaged::KeptDamaged`).
    kept_damaged: Mutex<damaged::KeptDamaged>,
    /// Peer requests refused because placement does not give their blocks (see
    /// [`crate::peer_scope`]).
    refusals: crate::peer_scope::Refusals,
}

impl Repair {
    /// The repair driver of the node `me` that has just started.
    pub fn new(
        me: Contact,
        dht: Arc<Dht>,
        view: Arc<View>,
        store: Arc<dyn Store>,
        coordinator: Arc<Coordinator>,
        cfg: RepairConfig,
        limits: Limits,
    ) -> Repair {
        let now = timeshard_clock::instant();
        let state = coordinator.repair().clone();
        Repair {
            me,
            dht,
            view,
            store,
            state,
            limits,
            inventory: tokio::sync::Mutex::new(None),
            fetch_pace: Mutex::new(Pace::new(cfg.bytes_per_sec, now)),
            push_pace: Mutex::new(Pace::new(cfg.bytes_per_sec, now)),
            settle: Mutex::new(Settle::new(cfg.catch_up_delay, now)),
            undelivered: Mutex::new(Undelivered::default()),
            peers_seen: alone::PeersSeen::not_alone(),
            handed_off: Mutex::new((0, HashSet::new())),
            scrub_cursor: Mutex::new(None),
            kept_damaged: Mutex::default(),
            refusals: Default::default(),
            cfg,
            coordinator,
        }
    }

    /// The record of whether this node has been alone since its data began (without it, the
    /// node counts as one that has had peers).
    pub fn with_peers_seen(mut self, peers_seen: alone::PeersSeen) -> Repair {
        self.peers_seen = peers_seen;
        self
    }

    /// Peer requests refused by placement, by kind (counted here and by the server).
    pub fn refusals(&self) -> &crate::peer_scope::Refusals {
        &self.refusals
    }

    /// What the read path shares with repair.
    pub fn state(&self) -> &Arc<RepairState> {
        &self.state
    }

    fn classes(&self) -> Arc<Classes> {
        self.coordinator.classes()
    }

    fn settle(&self) -> std::sync::MutexGuard<'_, Settle> {
        self.settle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits as long as `bytes` fetched take at the configured rate.
    async fn pace(&self, bytes: u64) {
        wait_for(&self.fetch_pace, bytes).await;
    }

    /// The inventory of this node's blocks, at most [`INVENTORY_MAX_AGE`] old.
    pub async fn inventory(&self) -> Result<Arc<Inventory>, StoreError> {
        self.inventory_since(
            timeshard_clock::instant().checked_sub(INVENTORY_MAX_AGE).unwrap_or_else(timeshard_clock::instant),
        )
        .await
    }

    /// The inventory a peer's session with `cutoff` compares: one built after the cutoff holds
    /// every block last written before it, so a regular round's sessions share an inventory
    /// for up to `settle_for`; a catch-up (nothing left out) needs a fresh one.
    pub async fn inventory_for(&self, cutoff: i64) -> Result<Arc<Inventory>, StoreError> {
        {
            let slot = self.inventory.lock().await;
            if let Some(inv) = slot.as_ref()
                && inv.generation == self.view.generation()
                && inv.built_at_ns > cutoff
            {
                return Ok(inv.clone());
            }
        }
        self.inventory().await
    }

    /// The inventory of this node's blocks, built at `fresh_after` or later, placed by the
    /// current view.
    pub async fn inventory_since(&self, fresh_after: Instant) -> Result<Arc<Inventory>, StoreError> {
        let mut slot = self.inventory.lock().await;
        let (generation, eligible, located) = self.view.placement();
        if let Some(inv) = slot.as_ref()
            && inv.generation == generation
            && inv.built_at >= fresh_after
        {
            return Ok(inv.clone());
        }
        let (store, classes, me) = (self.store.clone(), self.classes(), self.me.id);
        let built = timeshard_clock::spawn_blocking(move || {
            Inventory::build(&*store, &classes, eligible, located, me, generation)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("inventory task failed: {e}")))??;
        let inv = Arc::new(built);
        *slot = Some(inv.clone());
        Ok(inv)
    }
}

/// Waits as long as `bytes` on the wire take at the rate of `pace` (repair's fetches, or
/// handoff's pushes).
async fn wait_for(pace: &Mutex<Pace>, bytes: u64) {
    let wait = pace.lock().unwrap_or_else(|e| e.into_inner()).take(bytes, timeshard_clock::instant());
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

//! The [`Node`] handle: the parts of a running node that the request server, the HTTP side, a
//! reconfiguration and the control plane's follower share, and what the node reports about
//! itself ([`Node::status`]). The tasks of a node take the narrower handles they use (the DHT,
//! the view, the store, the tier), not the node.
//!
//! How the parts are built and wired, and which tasks run, is the `start` module; what may
//! change while the node runs is `reconfigure`; following the control plane is `control`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use timeshard_proto::wire::{Limits, NodeStatus, StorageStatus};
use timeshard_store::{DiskStore, Store};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Caller, Connections, RequestSlots};
use crate::config::{Live, NodeConfig};
use crate::control::policies::Applied as AppliedPolicies;
use crate::coordinator::Coordinator;
use crate::dht::Dht;
use crate::handshakes::HandshakeLimiter;
use crate::hints::Hints;
use crate::http::auth::Tokens;
use crate::membership::View;
use crate::metrics::Metrics;
use crate::net::Net;
use crate::repair::Repair;
use crate::replica::Replica;
use crate::tier::Tier;

/// The parts of a node, shared by its request server, HTTP side, reconfiguration and control
/// plane follower. Built by the `start` module.
#[derive(Debug)]
pub struct Node {
    /// The configuration in force; replaced whole by [`Node::reconfigure`].
    pub(crate) config: Live,
    /// Wire limits: the same on every node, fixed while it runs.
    pub(crate) limits: Limits,
    pub(crate) dht: Arc<Dht>,
    pub(crate) view: Arc<View>,
    /// The store when it is the disk engine, for what only it has (its health).
    pub(crate) disk: Option<Arc<DiskStore>>,
    /// This node's side of replica requests, and the store they are served from.
    pub(crate) replica: Replica,
    pub(crate) coordinator: Arc<Coordinator>,
    pub(crate) repair: Arc<Repair>,
    /// The cold tier (idle without an archive or write-time retention).
    pub(crate) tier: Arc<Tier>,
    /// Requests served at once, apart for peers and clients.
    pub(crate) slots: RequestSlots,
    /// Connections established with the node, per identity.
    pub(crate) connections: Arc<Connections>,
    /// New handshakes per source address, asked before any crypto.
    pub(crate) handshakes: Mutex<HandshakeLimiter>,
    pub(crate) config_generation: AtomicU64,
    /// Shared with the membership view, which gossips it with this node's entry.
    pub(crate) config_digest: Arc<AtomicU64>,
    pub(crate) enrolled: bool,
    /// The control plane's policy modules this node runs, and what did not load.
    pub(crate) control_policies: Mutex<AppliedPolicies>,
    pub(crate) stop_reason: Mutex<Option<String>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) http_tokens: Arc<Tokens>,
    pub(crate) tasks: TaskTracker,
    pub(crate) shutdown: CancellationToken,
}

impl Node {
    /// The configuration in force now.
    pub fn config(&self) -> Arc<NodeConfig> {
        self.config.get()
    }
    /// Generation of the control plane's desired state this node runs (0: configured by hand).
    pub fn config_generation(&self) -> u64 {
        self.config_generation.load(Ordering::Acquire)
    }
    /// First 64 bits of the digest of what every node must agree on (classes, revocations):
    /// see `control::config_digest`. Nodes exchange it to see who runs what.
    pub fn config_digest(&self) -> u64 {
        self.config_digest.load(Ordering::Acquire)
    }
    /// Whether the node follows a control plane (its classes come from there, not its file).
    pub fn is_enrolled(&self) -> bool {
        self.enrolled
    }
    pub(crate) fn set_applied(&self, generation: u64, digest: u64) {
        self.config_digest.store(digest, Ordering::Release);
        self.config_generation.store(generation, Ordering::Release);
    }
    /// The control plane's policy modules this node runs, and what did not load.
    pub(crate) fn control_policies(&self) -> MutexGuard<'_, AppliedPolicies> {
        self.control_policies.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Stops the node for `reason` (logged by the caller); [`Node::stop_reason`] says why.
    pub fn stop(&self, reason: String) {
        self.stop_reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(reason);
        self.shutdown.cancel();
    }
    /// Why the node stopped itself, if it did (a revoked certificate).
    pub fn stop_reason(&self) -> Option<String> {
        self.stop_reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn limits(&self) -> Limits {
        self.limits
    }
    pub fn dht(&self) -> &Arc<Dht> {
        &self.dht
    }
    pub fn net(&self) -> &Arc<Net> {
        self.dht.net()
    }
    /// The membership view: who is in the cluster, who is up, who owns what.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }
    /// The hints this node keeps for replicas that missed writes.
    pub fn hints(&self) -> &Arc<Hints> {
        self.coordinator.replica_writes().hints()
    }
    /// Whether a test cut this node off from the node `id` at `addr` (`[testing] fault_file`).
    pub fn is_cut_off(&self, id: Option<&timeshard_proto::Id>, addr: SocketAddr) -> bool {
        self.net().is_cut_off(id, addr)
    }
    /// The store replica requests are served from (with an archive: hot and cold merged).
    pub fn store(&self) -> &Arc<dyn Store> {
        self.replica.store()
    }
    /// The cold tier.
    pub fn tier(&self) -> &Arc<Tier> {
        &self.tier
    }
    /// This node as a replica: what it answers to the coordinators of writes and reads.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }
    pub fn coordinator(&self) -> &Arc<Coordinator> {
        &self.coordinator
    }
    /// Anti-entropy, handoff, read repair and leaving; whether this node is settled.
    pub fn repair(&self) -> &Arc<Repair> {
        &self.repair
    }
    /// The clients' request slots (the peers' are apart: [`Node::slots`]).
    pub fn request_slots(&self) -> &Arc<Semaphore> {
        self.slots.of(Caller::Client)
    }
    /// Request slots for peers and for clients.
    pub fn slots(&self) -> &RequestSlots {
        &self.slots
    }
    /// Connections established with the node, per identity.
    pub fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }
    /// New handshakes per source address.
    pub fn handshakes(&self) -> MutexGuard<'_, HandshakeLimiter> {
        self.handshakes.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The disk store, when the node runs the disk engine.
    pub fn disk_store(&self) -> Option<&Arc<DiskStore>> {
        self.disk.as_ref()
    }
    /// What the node counts for `/metrics`.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
    /// The tokens the HTTP side accepts; [`Tokens::set_issued`] adds tokens issued elsewhere.
    pub fn http_tokens(&self) -> &Arc<Tokens> {
        &self.http_tokens
    }
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }
    /// Fires when the node starts shutting down.
    pub fn shutdown_signal(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// What this node reports about itself (`timeshard status`, and `/metrics`).
    pub fn status(&self) -> NodeStatus {
        let members = self.view().counts();
        let (hints_pending, hints_pending_bytes) = self.hints().pending();
        NodeStatus {
            id: self.dht().me().id,
            addr: self.dht().me().addr,
            peers: self.dht().peer_count() as u32,
            bytes_sent: self.net().traffic().totals().0,
            bytes_received: self.net().traffic().totals().1,
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_generation: self.config_generation(),
            config_digest: self.config_digest(),
            members_up: members.up,
            members_down: members.down,
            members_gone: members.gone,
            view_generation: self.view().generation(),
            hints_pending,
            hints_pending_bytes,
            hints_replayed: self.hints().replayed(),
            hints_dropped: self.hints().dropped(),
            replica_writes_in_flight: self.coordinator().replica_writes().detached() as u32,
            repair: self.repair().state().status(),
            wal_bytes: self.disk.as_ref().map_or(0, |d| d.stats().wal_bytes),
            policies: crate::policies::usage(self.coordinator().policies().map(|r| &**r)),
            storage: self.storage_status(),
        }
    }

    /// How full this node is and how far behind (see [`StorageStatus`]).
    pub fn storage_status(&self) -> StorageStatus {
        let config = self.config();
        let disk = crate::storage::DiskSpace::of(&config.data_dir);
        let usage = self.replica().usage();
        let mut status = StorageStatus {
            disk_size_bytes: disk.map_or(0, |d| d.size),
            disk_available_bytes: disk.map_or(0, |d| d.available),
            store_max_bytes: config.store_max_bytes().unwrap_or(0),
            classes: usage.classes().iter().map(crate::storage::ClassUse::status).collect(),
            control_plane_contact_ms: self.metrics().control_plane_contact_ms().unwrap_or(0),
            ..StorageStatus::default()
        };
        if self.tier().archive().is_some() {
            let progress = self.tier().progress();
            status.export_pending_blocks = progress.classes.values().map(|c| c.pending_blocks).sum();
            status.export_pending_points = progress.classes.values().map(|c| c.pending_points).sum();
            status.export_pending_bytes = progress.classes.values().map(|c| c.pending_bytes).sum();
            status.export_oldest_due_ms = progress
                .classes
                .values()
                .filter(|c| c.oldest_due_ns > 0)
                .map(|c| u64::try_from(c.oldest_due_ns / 1_000_000).unwrap_or(0))
                .min()
                .unwrap_or(0);
            status.export_failed_rounds = progress.failed_rounds;
            status.export_last_success_ms = u64::try_from(progress.last_success_ns / 1_000_000).unwrap_or(0);
            status.export_last_error = progress.last_error.clone();
        }
        status
    }
}

//! A running node: wires the endpoint, DHT, membership view, store, hints and coordinator
//! together, joins the network and learns the view, keeps both fresh, and shuts down cleanly.
//! What may change while it runs, and how, is in [`crate::reconfigure`]; following the control
//! plane is [`crate::control`].

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::wire::Limits;
use timeshard_proto::{Contact, Id};
use timeshard_sdk::tls::Identity;
use timeshard_store::{DiskConfig, DiskStore, FsyncPolicy, MemStore, Store};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{ConfigError, Fsync, Live, NodeConfig, StoreEngine};
use crate::coordinator::{Coordinator, ReplicaWrites};
use crate::dht::Dht;
use crate::faults::Faults;
use crate::hints::{Hints, replay};
use crate::http::{self, HttpStartError, Tokens};
use crate::membership::View;
use crate::metrics::Metrics;
use crate::net::{BindError, Net};
use crate::repair::{Repair, RepairState};
use crate::replica::Replica;
use crate::server;

/// How often the node checks whether buckets need refreshing or it must rejoin.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The parts of a node, shared by its tasks.
#[derive(Debug)]
pub struct Node {
    /// The configuration in force; replaced whole by [`Node::reconfigure`].
    pub(crate) config: Live,
    /// Wire limits: the same on every node, fixed while it runs.
    limits: Limits,
    dht: Arc<Dht>,
    view: Arc<View>,
    faults: Option<Arc<Faults>>,
    store: Arc<dyn Store>,
    /// The same store when it is the disk engine, for what only it has (its health).
    pub(crate) disk: Option<Arc<DiskStore>>,
    /// This node's side of replica requests.
    replica: Replica,
    coordinator: Arc<Coordinator>,
    repair: Arc<Repair>,
    /// The cold tier (idle without an archive or write-time retention).
    tier: Arc<crate::tier::Tier>,
    request_slots: Arc<Semaphore>,
    /// Permits `request_slots` is meant to hold (it lags while a shrink waits for requests).
    pub(crate) request_capacity: Mutex<usize>,
    config_generation: AtomicU64,
    /// Shared with the membership view, which gossips it with this node's entry.
    config_digest: Arc<AtomicU64>,
    enrolled: bool,
    /// The control plane's policy modules this node runs, and what did not load.
    pub(crate) control_policies: Mutex<crate::control::policies::Applied>,
    stop_reason: Mutex<Option<String>>,
    metrics: Arc<Metrics>,
    http_tokens: Arc<Tokens>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
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
    /// see [`crate::control::config_digest`]. Nodes exchange it to see who runs what.
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
        self.faults.as_ref().is_some_and(|f| f.blocks(id, addr))
    }
    /// The store replica requests are served from (with an archive: hot and cold merged).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    /// The cold tier.
    pub fn tier(&self) -> &Arc<crate::tier::Tier> {
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
    pub fn request_slots(&self) -> &Arc<Semaphore> {
        &self.request_slots
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
}

/// A started node; drop it only after [`RunningNode::shutdown`].
#[derive(Debug)]
pub struct RunningNode {
    node: Arc<Node>,
    http_addr: Option<SocketAddr>,
}

/// A node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] timeshard_sdk::tls::TlsError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store in {path}: {source}")]
    Store {
        path: std::path::PathBuf,
        #[source]
        source: timeshard_store::StoreError,
    },
    #[error("cannot set up the policy host: {0}")]
    Policy(#[from] timeshard_policy::PolicyError),
    #[error("the last applied desired state cannot be used: {0}")]
    Desired(#[from] crate::reconfigure::ReconfigureError),
    #[error(transparent)]
    Tier(#[from] crate::tier::TierError),
    #[error("cannot open the hints in {path}: {source}")]
    Hints {
        path: std::path::PathBuf,
        #[source]
        source: crate::hints::HintError,
    },
    #[error(transparent)]
    Http(#[from] HttpStartError),
}

type Stores = (Arc<dyn Store>, Option<Arc<DiskStore>>);

fn open_store(config: &NodeConfig) -> Result<Stores, StartError> {
    Ok(match config.store.engine {
        StoreEngine::Memory => (Arc::new(MemStore::new(config.store.memory_max_points)), None),
        StoreEngine::Disk => {
            let dir = config.data_dir.join("store");
            std::fs::create_dir_all(&dir).map_err(|source| StartError::DataDir { path: dir.clone(), source })?;
            let disk = DiskConfig {
                fsync: match config.store.fsync {
                    Fsync::Durable => FsyncPolicy::Durable,
                    Fsync::OsBuffered => FsyncPolicy::OsBuffered,
                },
                seal_grace_ns: i64::try_from(config.store.seal_grace.as_nanos()).unwrap_or(i64::MAX),
                retention: config.retention_rules(),
                max_open_age_ns: i64::try_from(config.store.max_open_age.as_nanos()).unwrap_or(i64::MAX),
                max_wal_bytes: config.store.max_wal_bytes,
                // Open points past the budget's share are sealed early by the writes themselves.
                max_open_points: DiskConfig::default()
                    .max_open_points
                    .min(crate::budget::Shares::of(config.memory.budget.0).max_open_points()),
                ..DiskConfig::default()
            };
            let store =
                DiskStore::open(&dir, disk).map_err(|source| StartError::Store { path: dir.clone(), source })?;
            for problem in store.health() {
                warn!(%problem, "store health");
            }
            let store = Arc::new(store);
            (store.clone(), Some(store))
        }
    })
}

/// Runs the store's maintenance (sealing, late data, retention, log checkpoints) in bounded
/// steps on a blocking thread, so ingest never waits for it.
async fn maintain_store(node: Arc<Node>) {
    let mut tick = tokio::time::interval(node.config().store.maintenance_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = node.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        loop {
            let store = node.store.clone();
            match tokio::task::spawn_blocking(move || store.maintain(now_ns())).await {
                Ok(Ok(report)) if report.more => continue,
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    warn!(error = %e, "store maintenance failed; will retry");
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "store maintenance task failed");
                    break;
                }
            }
        }
    }
}

async fn resolve(seeds: &[String]) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for s in seeds {
        match tokio::net::lookup_host(s.as_str()).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => warn!(seed = %s, error = %e, "cannot resolve bootstrap address"),
        }
    }
    out
}

/// What a node starts from besides its configuration: whether it follows a control plane, and
/// the generation, revocations and policy modules of the desired state it runs (none for a
/// node configured by hand).
#[derive(Clone, Debug, Default)]
pub struct Applied {
    pub enrolled: bool,
    pub generation: u64,
    pub revoked: HashSet<Id>,
    /// The control plane's modules, installed from the node's cache before it serves.
    pub policies: Option<crate::control::policies::ControlPolicies>,
    /// HTTP tokens the control plane issued, accepted from the first request on.
    pub http_tokens: Vec<timeshard_control_api::HttpTokenGrant>,
}

impl RunningNode {
    /// Starts a node: binds, begins serving, and joins through the bootstrap peers.
    pub async fn start(config: NodeConfig) -> Result<RunningNode, StartError> {
        RunningNode::start_from(config, Applied::default()).await
    }

    /// [`RunningNode::start`] with the revocations and generation of a desired state.
    pub async fn start_from(config: NodeConfig, applied: Applied) -> Result<RunningNode, StartError> {
        config.validate()?;
        let identity = Identity::load(&config.tls_files())?;
        let id = identity.id()?;
        let net = Arc::new(Net::bind(&config, &identity)?);
        net.set_revoked(applied.revoked.clone());
        let addr = net.local_addr().map_err(|source| BindError::Listen { addr: config.listen, source })?;
        let me = Contact { id, addr };
        // Bound before anything starts, so a taken HTTP port fails the start cleanly.
        let http_listener = if config.http.enabled { Some(http::bind(&config.http).await?) } else { None };
        let (store, disk) = open_store(&config)?;
        // Tier hook: with an archive, replicas serve hot and cold merged (crate::tier).
        let tier = crate::tier::Tier::open(&config, &id.to_hex(), store.clone())?;
        let store: Arc<dyn Store> = match tier.archive() {
            Some(_) => Arc::new(crate::tier::store::TieredStore::new(tier.clone())),
            None => store,
        };
        let classes = config.class_table()?;
        let faults = config.testing.fault_file.clone().map(|f| Arc::new(Faults::new(f)));
        if let Some(f) = &faults {
            warn!(file = %f.file().display(), "fault injection is on ([testing] fault_file)");
            net.set_faults(f.clone());
        }
        let dht = Arc::new(Dht::new(me, net, config.dht.clone()));
        let digest = Arc::new(AtomicU64::new(crate::control::config_digest_u64(&config.classes, &applied.revoked)));
        let view = Arc::new(View::new(me, &config.membership, digest.clone()));
        view.set_location(config.location()?);
        if let Some(wan) = config.testing.wan_emulation {
            warn!(
                per_hop_ms = wan.per_hop_ms,
                route_factor = wan.route_factor,
                "WAN emulation is on ([testing] wan_emulation)"
            );
            // The view's own location, not the file's: the control plane may set or move it.
            let peers = view.clone();
            dht.set_wan_emulation(crate::dht::WanDelay(Box::new(move |id| {
                let here = peers.location()?;
                let there = peers.location_of(id)?;
                let ms = timeshard_proto::geo::wan_one_way_ms(&here, &there, wan.per_hop_ms, wan.route_factor);
                Some(Duration::from_secs_f64(ms / 1_000.0))
            })));
        }
        view.set_excluded(applied.revoked.clone());
        let hints_dir = config.data_dir.join("hints");
        let hints = Arc::new(
            Hints::open(&hints_dir, config.hints.clone())
                .map_err(|source| StartError::Hints { path: hints_dir.clone(), source })?,
        );
        let replica_writes = Arc::new(ReplicaWrites::new(id, hints.clone(), config.hints.max_replica_writes));
        let policies = crate::policies::open(&config, applied.enrolled)?;
        let control_policies = match (&policies, &applied.policies) {
            (Some(registry), Some(control)) => crate::control::policies::from_cache(registry, &config, control),
            _ => crate::control::policies::Applied::default(),
        };
        let repair = Arc::new(RepairState::new(config.repair.read_repair_queue));
        let budget = Arc::new(crate::budget::Ledger::new(crate::budget::Shares::of(config.memory.budget.0)));
        let replica = Replica::new(store.clone(), repair.clone(), policies.clone());
        let coordinator = Arc::new(
            Coordinator::new(
                dht.clone(),
                view.clone(),
                replica_writes,
                replica.clone(),
                classes,
                config.limits.clone(),
                policies,
                repair,
            )
            .with_budget(budget),
        );
        let repair = Arc::new(Repair::new(
            me,
            dht.clone(),
            view.clone(),
            store.clone(),
            coordinator.clone(),
            config.repair.clone(),
            config.limits.wire(),
        ));
        let node = Arc::new(Node {
            limits: config.limits.wire(),
            request_slots: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
            metrics: Arc::new(Metrics::default()),
            http_tokens: {
                let tokens = Tokens::new(config.http.tokens.clone(), !config.http.listen.ip().is_loopback());
                tokens.set_issued(applied.http_tokens.clone());
                Arc::new(tokens)
            },
            request_capacity: Mutex::new(config.limits.max_concurrent_requests),
            config: Live::new(config),
            dht,
            view,
            faults,
            store,
            disk,
            replica,
            coordinator,
            repair,
            tier,
            config_generation: AtomicU64::new(applied.generation),
            config_digest: digest,
            enrolled: applied.enrolled,
            control_policies: Mutex::new(control_policies),
            stop_reason: Mutex::new(None),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        });
        if let Some(f) = node.faults.clone() {
            let stop = node.shutdown.clone();
            node.tasks.spawn(async move { f.watch(stop).await });
        }
        let http_addr = match http_listener {
            Some((listener, addr)) => {
                if let Err(e) = http::spawn(node.clone(), listener, node.http_tokens.clone()) {
                    node.shutdown.cancel();
                    return Err(e.into());
                }
                Some(addr)
            }
            None => None,
        };
        node.tasks.spawn(server::accept_loop(node.clone()));
        // A weak reference: the endpoint (inside the node) must not keep the node alive.
        let weak = Arc::downgrade(&node);
        node.net().on_dialed(Box::new(move |conn| {
            if let Some(node) = weak.upgrade() {
                server::serve_dialed(&node, conn);
            }
        }));
        info!(id = %id, %addr, generation = applied.generation, "node listening");

        join(&node).await;
        node.view.join(&node.dht).await;
        node.tasks.spawn(maintain(node.clone()));
        node.tasks.spawn(maintain_store(node.clone()));
        node.tasks.spawn(node.view.clone().run(node.dht.clone(), node.shutdown.clone()));
        node.tasks.spawn(node.repair.clone().run(node.shutdown.clone()));
        node.tasks.spawn(crate::repair::read_repair::run(
            node.repair.state().clone(),
            node.dht.clone(),
            node.store.clone(),
            node.limits,
            node.shutdown.clone(),
        ));
        let replayer = replay::Replayer {
            hints,
            view: node.view.clone(),
            dht: node.dht.clone(),
            limits: node.limits,
            bytes_per_sec: node.config().hints.replay_bytes_per_sec,
        };
        node.tasks.spawn(replayer.run(node.shutdown.clone()));
        node.tasks.spawn(replay::sync_loop(node.hints().clone(), node.shutdown.clone()));
        node.tasks.spawn(crate::tier::run_mover(node.tier.clone(), node.clone()));
        Ok(RunningNode { node, http_addr })
    }

    /// The node.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The address the node listens on.
    pub fn addr(&self) -> SocketAddr {
        self.node.dht.me().addr
    }

    /// The address the HTTP side listens on, if it is enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Stops accepting, lets requests in flight finish (up to a grace period), closes every
    /// connection.
    pub async fn shutdown(self) {
        self.node.shutdown.cancel();
        self.node.tasks.close();
        let grace = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        if tokio::time::timeout_at(grace, self.node.tasks.wait()).await.is_err() {
            warn!("requests still running after the grace period; closing anyway");
        }
        // Replica writes that outlived their client's write get the rest of the grace period;
        // what still runs then is kept as hints.
        let left = grace.saturating_duration_since(tokio::time::Instant::now());
        self.node.coordinator.replica_writes().shutdown(left.max(Duration::from_millis(100))).await;
        self.node.net().close();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.node.net().wait_idle()).await;
        info!("node stopped");
    }
}

/// Joins the network through the bootstrap peers in force (they may change while the node
/// runs); returns the peers known.
pub(crate) async fn join(node: &Node) -> usize {
    let seeds = resolve(&node.config().bootstrap).await;
    if seeds.is_empty() {
        return node.dht.peer_count();
    }
    let peers = node.dht.bootstrap(&seeds).await;
    if peers > 0 {
        info!(peers, "joined the network");
    }
    peers
}

/// Rejoins when the node lost every peer, and refreshes stale buckets.
async fn maintain(node: Arc<Node>) {
    let shutdown = node.shutdown.clone();
    let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if node.dht.peer_count() == 0 {
            join(&node).await;
        } else {
            node.dht.refresh(8).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn start_failures_are_typed_and_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig { listen: "127.0.0.1:0".parse().unwrap(), ..NodeConfig::default() };
        config.http.listen = "127.0.0.1:0".parse().unwrap();
        config.resolve_paths(dir.path());
        let err = RunningNode::start(config.clone()).await.unwrap_err();
        assert!(matches!(err, StartError::Tls(_)), "{err}");
        assert!(err.to_string().contains("timeshard pki"), "{err}");

        crate::pki::dev_pki(&dir.path().join("pki"), 1).unwrap();
        let files = timeshard_sdk::tls::TlsFiles::in_dir(&dir.path().join("pki"), "node-0");
        config.tls = crate::config::TlsConfig { ca: files.ca, cert: files.cert, key: files.key };
        let first = RunningNode::start(config.clone()).await.unwrap();
        // The same address twice: the second cannot listen.
        config.listen = first.addr();
        config.data_dir = dir.path().join("other");
        let err = RunningNode::start(config.clone()).await.unwrap_err();
        assert!(matches!(err, StartError::Bind(BindError::Listen { .. })), "{err}");
        // The same data directory twice: the store's lock refuses the second node.
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.data_dir = first.node().config().data_dir.clone();
        let err = RunningNode::start(config).await.unwrap_err();
        assert!(matches!(err, StartError::Store { .. }), "{err}");
        first.shutdown().await;
    }
}

//! Starting a node: the wiring of its parts, and the tasks that keep it running.
//!
//! [`RunningNode::start_from`] goes through its phases in order, each a function below:
//! 1. `bind`: the identity, the QUIC endpoint, and the HTTP listener (bound before anything
//!    starts, so a taken port fails the start cleanly);
//! 2. `open_stores`: the local store, and the cold tier over it;
//! 3. `discovery`: fault injection, the DHT, the membership view (location, WAN emulation,
//!    revoked nodes);
//! 4. `data_path`: hints, policies, the local replica, the coordinator and repair;
//! 5. the [`Node`] handle that gathers them;
//! 6. `serve`: HTTP, the QUIC accept loop, and requests on connections this node dials;
//! 7. `join_and_run`: joining the network and the view, then every task, each with the narrow
//!    handles it uses.
//!
//! A [`RunningNode`] is a started node; [`RunningNode::shutdown`] stops it cleanly.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timeshard_proto::{Contact, Id};
use timeshard_sdk::tls::Identity;
use timeshard_store::{DiskStore, Store};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::admission::{Connections, RequestSlots};
use crate::budget::{Ledger, Shares};
use crate::config::{ConfigError, Live, NodeConfig};
use crate::control::apply::config_digest_u64;
use crate::control::policies::{self as control_policies, ControlPolicies};
use crate::coordinator::{Coordinator, ReplicaWrites};
use crate::dht::{Dht, WanDelay};
use crate::faults::Faults;
use crate::handshakes::HandshakeLimiter;
use crate::hints::{HintError, Hints, replay};
use crate::http::{self, HttpStartError, Tokens};
use crate::membership::View;
use crate::metrics::Metrics;
use crate::net::{BindError, Net};
use crate::node::Node;
use crate::reconfigure::ReconfigureError;
use crate::repair::state::RepairState;
use crate::repair::{Repair, read_repair};
use crate::replica::Replica;
use crate::seams::Seams;
use crate::storage::{self, StoreUse};
use crate::tier::{Tier, TierError, store::TieredStore};

/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
    Desired(#[from] ReconfigureError),
    #[error(transparent)]
    Tier(#[from] TierError),
    #[error("cannot open the hints in {path}: {source}")]
    Hints {
        path: std::path::PathBuf,
        #[source]
        source: HintError,
    },
    #[error(transparent)]
    Http(#[from] HttpStartError),
    #[error("cannot use {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<storage::OpenError> for StartError {
    fn from(e: storage::OpenError) -> StartError {
        match e {
            storage::OpenError::DataDir { path, source } => StartError::DataDir { path, source },
            storage::OpenError::Store { path, source } => StartError::Store { path, source },
        }
    }
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
    pub policies: Option<ControlPolicies>,
    /// HTTP tokens the control plane issued, accepted from the first request on.
    pub http_tokens: Vec<timeshard_control_api::HttpTokenGrant>,
    /// `revoked` as the control plane signed it, passed on to peers by gossip.
    pub revocations: Option<timeshard_proto::membership::SignedRevocations>,
}

impl RunningNode {
    /// Starts a node: binds, begins serving, and joins through the bootstrap peers.
    pub async fn start(config: NodeConfig) -> Result<RunningNode, StartError> {
        RunningNode::start_from(config, Applied::default()).await
    }

    /// [`RunningNode::start`] with the revocations and generation of a desired state.
    pub async fn start_from(config: NodeConfig, applied: Applied) -> Result<RunningNode, StartError> {
        RunningNode::start_on(config, applied, Seams::default()).await
    }

    /// [`RunningNode::start_from`] on `seams`: a simulator's socket and disk.
    pub async fn start_on(config: NodeConfig, applied: Applied, seams: Seams) -> Result<RunningNode, StartError> {
        config.validate()?;
        let Endpoint { net, me, http_listener } = bind(&config, &applied, &seams).await?;
        let Stores { store, disk, tier } = open_stores(&config, &me.id, seams.disk, seams.archive)?;
        let Discovery { dht, view, faults, digest } = discovery(&config, &applied, me, net)?;
        let data = data_path(&config, &applied, &dht, &view, &store)?;
        let node = Arc::new(Node {
            limits: config.limits.wire(),
            slots: RequestSlots::new(config.limits.max_concurrent_requests, config.limits.max_concurrent_peer_requests),
            connections: Connections::new(config.limits.connections()),
            handshakes: Mutex::new(HandshakeLimiter::new(
                config.limits.handshakes(),
                tokio::time::Instant::now().into_std(),
            )),
            metrics: Arc::new(Metrics::default()),
            http_tokens: {
                let tokens = Tokens::new(http_tokens(&config)?, !config.http.anonymous, config.http.tokens_in_urls);
                tokens.set_issued(applied.http_tokens.clone());
                Arc::new(tokens)
            },
            config: Live::new(config),
            dht,
            view,
            disk,
            replica: data.replica,
            coordinator: data.coordinator,
            repair: data.repair,
            tier,
            config_generation: AtomicU64::new(applied.generation),
            config_digest: digest,
            enrolled: applied.enrolled,
            control_policies: Mutex::new(data.control_policies),
            stop_reason: Mutex::new(None),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        });
        let http_addr = serve(&node, faults, http_listener)?;
        info!(id = %me.id, addr = %me.addr, generation = applied.generation, "node listening");
        join_and_run(&node, data.hints).await;
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

/// What phase 1 binds.
struct Endpoint {
    net: Arc<Net>,
    me: Contact,
    http_listener: Option<(TcpListener, SocketAddr)>,
}

/// Phase 1: loads the node's identity, binds the QUIC endpoint (on `seams`' socket if it has
/// one; refusing `applied`'s revoked nodes from the first handshake), and binds the HTTP
/// listener if it is enabled.
async fn bind(config: &NodeConfig, applied: &Applied, seams: &Seams) -> Result<Endpoint, StartError> {
    let identity = Identity::load(&config.tls_files())?;
    let id = identity.id()?;
    let net = match seams.endpoint(config, &identity)? {
        Some(endpoint) => Arc::new(Net::on_endpoint(config, &identity, endpoint)?),
        None => Arc::new(Net::bind(config, &identity)?),
    };
    net.set_revoked(applied.revoked.clone());
    let addr = net.local_addr().map_err(|source| BindError::Listen { addr: config.listen, source })?;
    let me = Contact { id, addr };
    // Bound before anything starts, so a taken HTTP port fails the start cleanly.
    let http_listener = if config.http.enabled { Some(http::bind(&config.http).await?) } else { None };
    Ok(Endpoint { net, me, http_listener })
}

/// What phase 2 opens.
struct Stores {
    /// The store replica requests are served from.
    store: Arc<dyn Store>,
    /// The same hot store when it is the disk engine.
    disk: Option<Arc<DiskStore>>,
    tier: Arc<Tier>,
}

/// Phase 2: the local store (on `disk` if given) and the cold tier over it. With an archive,
/// replicas serve hot and cold merged (the tier's hook: [`TieredStore`]).
fn open_stores(
    config: &NodeConfig,
    id: &Id,
    disk: Option<Arc<dyn timeshard_store::backend::Backend>>,
    archive: Option<Arc<dyn timeshard_tier::object_store::ObjectStore>>,
) -> Result<Stores, StartError> {
    let (store, disk) = storage::open(config, disk)?;
    // The identity again (phase 1 gave it to the network): its key seals archive manifests.
    let identity = Identity::load(&config.tls_files())?;
    if identity.id()? != *id {
        return Err(StartError::Io {
            what: "the node certificate".into(),
            source: std::io::Error::other("it changed while the node started; start it again"),
        });
    }
    let tier = Tier::open(config, &identity, store.clone(), archive)?;
    let store: Arc<dyn Store> = match tier.archive() {
        Some(_) => Arc::new(TieredStore::new(tier.clone())),
        None => store,
    };
    Ok(Stores { store, disk, tier })
}

/// The tokens the HTTP side takes from the configuration: `[http] tokens`, or, with none (and
/// `anonymous` off), the one in `<data_dir>/http.token`, made at the first start.
fn http_tokens(config: &NodeConfig) -> Result<Vec<String>, StartError> {
    if !config.http.tokens.is_empty() || config.http.anonymous || !config.http.enabled {
        return Ok(config.http.tokens.clone());
    }
    let path = config.data_dir.join(HTTP_TOKEN_FILE);
    let io = |source| StartError::Io { what: format!("the HTTP token {}", path.display()), source };
    if !path.exists() {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let mut secret = [0u8; 24];
        getrandom::fill(&mut secret).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        let token = timeshard_control_api::token::hex(&secret);
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(io)?;
        writeln!(file, "{token}").and_then(|()| file.sync_all()).map_err(io)?;
        info!(path = %path.display(), "made this node's HTTP token; send it as `Authorization: Bearer <token>`");
    }
    let token = std::fs::read_to_string(&path).map_err(io)?.trim().to_string();
    if token.len() < crate::config::MIN_TOKEN_CHARS {
        return Err(io(std::io::Error::other("it is shorter than 16 characters; delete it to make a new one")));
    }
    Ok(vec![token])
}

/// The file under the data directory that holds the HTTP token made when none is configured.
pub const HTTP_TOKEN_FILE: &str = "http.token";

/// What phase 3 sets up.
struct Discovery {
    dht: Arc<Dht>,
    view: Arc<View>,
    faults: Option<Arc<Faults>>,
    /// The configuration digest, shared by the node and its view (which gossips it).
    digest: Arc<AtomicU64>,
}

/// Phase 3: fault injection (tests), the DHT over `net`, and the membership view with this
/// node's location, the WAN emulation (tests) and `applied`'s revoked nodes excluded.
fn discovery(config: &NodeConfig, applied: &Applied, me: Contact, net: Arc<Net>) -> Result<Discovery, StartError> {
    let faults = config.testing.fault_file.clone().map(|f| Arc::new(Faults::new(f)));
    if let Some(f) = &faults {
        warn!(file = %f.file().display(), "fault injection is on ([testing] fault_file)");
        net.set_faults(f.clone());
    }
    let attest = net.attest();
    let dht = Arc::new(Dht::new(me, net, config.dht.clone()));
    let digest = Arc::new(AtomicU64::new(config_digest_u64(&config.classes, &applied.revoked)));
    let view = Arc::new(View::new(me, &config.membership, digest.clone(), attest));
    view.set_location(config.location()?);
    if let Some(wan) = config.testing.wan_emulation {
        warn!(
            per_hop_ms = wan.per_hop_ms,
            route_factor = wan.route_factor,
            "WAN emulation is on ([testing] wan_emulation)"
        );
        // The view's own location, not the file's: the control plane may set or move it.
        let peers = view.clone();
        dht.set_wan_emulation(WanDelay(Box::new(move |id| {
            let here = peers.location()?;
            let there = peers.location_of(id)?;
            let ms = timeshard_proto::geo::wan_one_way_ms(&here, &there, wan.per_hop_ms, wan.route_factor);
            Some(Duration::from_secs_f64(ms / 1_000.0))
        })));
    }
    view.set_excluded(applied.revoked.clone());
    if let Some(list) = applied.revocations.clone()
        && let Err(e) = view.revocations().offer(list)
    {
        warn!(error = %e, "the stored revocation list is not usable; peers will pass on theirs");
    }
    // The newest list this node took before it stopped, from a peer's gossip perhaps.
    if let Err(e) = view.revocations().load(&config.data_dir) {
        warn!(error = %e, "the revocation list kept in the data directory is not usable; peers will pass on theirs");
    }
    Ok(Discovery { dht, view, faults, digest })
}

/// What phase 4 builds.
struct DataPath {
    hints: Arc<Hints>,
    replica: Replica,
    coordinator: Arc<Coordinator>,
    repair: Arc<Repair>,
    /// The control plane's policy modules installed from the cache, and what did not load.
    control_policies: control_policies::Applied,
}

/// Phase 4: the hints, the policy host (with the control plane's modules from the cache), the
/// local replica, the coordinator (admitting client writes against the memory budget) and
/// repair.
fn data_path(
    config: &NodeConfig,
    applied: &Applied,
    dht: &Arc<Dht>,
    view: &Arc<View>,
    store: &Arc<dyn Store>,
) -> Result<DataPath, StartError> {
    let me = dht.me();
    let classes = config.class_table()?;
    let hints_dir = config.data_dir.join("hints");
    let hints = Arc::new(
        Hints::open(&hints_dir, config.hints.clone())
            .map_err(|source| StartError::Hints { path: hints_dir.clone(), source })?,
    );
    let replica_writes = Arc::new(ReplicaWrites::new(me.id, hints.clone(), config.hints.max_replica_writes));
    let policies = crate::policies::open(config, applied.enrolled)?;
    let control_policies = match (&policies, &applied.policies) {
        (Some(registry), Some(control)) => control_policies::from_cache(registry, config, control),
        _ => control_policies::Applied::default(),
    };
    let state = Arc::new(RepairState::new(config.repair.read_repair_queue));
    let budget = Arc::new(Ledger::new(Shares::of(config.memory.budget.0)));
    // The limit is the disk engine's; the memory engine has its own (`memory_max_points`).
    let max_bytes = config.store_max_bytes();
    let usage = Arc::new(StoreUse::new(config.data_dir.join("store"), max_bytes, &config.classes));
    let replica = Replica::new(store.clone(), usage, state.clone(), policies.clone());
    let coordinator = Arc::new(
        Coordinator::new(
            dht.clone(),
            view.clone(),
            replica_writes,
            replica.clone(),
            classes,
            config.limits.clone(),
            policies,
            state,
        )
        .with_budget(budget),
    );
    let repair = Arc::new(
        Repair::new(
            me,
            dht.clone(),
            view.clone(),
            store.clone(),
            coordinator.clone(),
            config.repair.clone(),
            config.limits.wire(),
        )
        .with_peers_seen(crate::repair::alone::PeersSeen::load(&config.data_dir, !config.bootstrap.is_empty())),
    );
    Ok(DataPath { hints, replica, coordinator, repair, control_policies })
}

/// Phase 6: starts serving: the fault file's watcher (`faults`), the HTTP side on
/// `http_listener` (if any; returns its address), the QUIC accept loop, and requests peers send
/// on connections this node dialed.
fn serve(
    node: &Arc<Node>,
    faults: Option<Arc<Faults>>,
    http_listener: Option<(TcpListener, SocketAddr)>,
) -> Result<Option<SocketAddr>, StartError> {
    if let Some(f) = faults {
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
    node.tasks.spawn(crate::server::accept_loop(node.clone()));
    // A weak reference: the endpoint (inside the node) must not keep the node alive.
    let weak = Arc::downgrade(node);
    node.net().on_dialed(Box::new(move |conn| {
        if let Some(node) = weak.upgrade() {
            crate::server::serve_dialed(&node, conn);
        }
    }));
    Ok(http_addr)
}

/// Phase 7: joins the network through the bootstrap peers and learns the membership view, then
/// spawns the tasks that keep the node running: DHT upkeep, store maintenance, gossip, repair,
/// read repair, hint replay and sync, and the cold tier's export loop.
async fn join_and_run(node: &Arc<Node>, hints: Arc<Hints>) {
    let (dht, view, stop) = (&node.dht, &node.view, &node.shutdown);
    dht.join(&node.config().bootstrap).await;
    view.join(dht).await;
    node.tasks.spawn(dht.clone().maintain(node.config.clone(), stop.clone()));
    let interval = node.config().store.maintenance_interval;
    node.tasks.spawn(storage::maintain(node.store().clone(), node.replica().usage().clone(), interval, stop.clone()));
    node.tasks.spawn(view.clone().run(dht.clone(), stop.clone()));
    node.tasks.spawn(crate::reconfigure::follow_revocations(node.clone(), stop.clone()));
    node.tasks.spawn(node.repair.clone().run(stop.clone()));
    let state = node.repair.state().clone();
    node.tasks.spawn(read_repair::run(state, dht.clone(), node.store().clone(), node.limits, stop.clone()));
    let replayer = replay::Replayer {
        hints: hints.clone(),
        view: view.clone(),
        dht: dht.clone(),
        limits: node.limits,
        bytes_per_sec: node.config().hints.replay_bytes_per_sec,
    };
    node.tasks.spawn(replayer.run(stop.clone()));
    node.tasks.spawn(replay::sync_loop(hints, stop.clone()));
    node.tasks.spawn(crate::tier::run_mover(node.tier.clone(), dht.me().id, view.clone(), stop.clone()));
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

//! The simulated fleet: real nodes (`timeshard_node::RunningNode`) on simulated hosts, each
//! with its socket on the simulated network and its store on a faulty disk that outlives
//! crashes, enrolled in the simulated control plane and following it; starting, crashing,
//! restarting, joining and departing them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use timeshard_control_api::Agent;
use timeshard_node::config::{ClassConfig, CoiConfig, Fsync, StoreEngine};
use timeshard_node::seams::Seams;
use timeshard_node::{Node, NodeConfig, RunningNode};
use timeshard_proto::geo::GeoPoint;
use timeshard_sdk::tls::TlsFiles;
use timeshard_store::faulty_disk::{FailKind, FaultyDisk};
use timeshard_tier::object_store::ObjectStore;

use crate::control::ControlPlane;
use crate::host::Host;
use crate::net::Network;

/// Where the first nodes stand: four around Atlanta (where the CoI series live), then Houston,
/// San Francisco, Chicago and Seattle (the topology of `timeshard bench coi`).
pub const LOCATIONS: [&str; 8] = [
    "33.749,-84.388",
    "33.775,-84.396",
    "33.700,-84.350",
    "33.850,-84.300",
    "29.760,-95.370",
    "37.775,-122.419",
    "41.878,-87.630",
    "47.606,-122.332",
];
/// Where nodes that join later stand, in turn: Atlanta again, Denver, Atlanta.
pub const JOIN_LOCATIONS: [&str; 3] = ["33.760,-84.420", "39.739,-104.990", "33.790,-84.380"];
/// Where the clients are: Atlanta.
pub const CLIENT_LOCATION: (f64, f64) = (33.749, -84.388);

/// The series classes every node runs: a DHT class, the same archived, and a
/// context-of-interest class (n_in 2: W 2 of the in-CoI replicas, R 1 derived; reads inside
/// the CoI ask both, settled).
pub fn classes() -> Vec<ClassConfig> {
    vec![
        ClassConfig {
            name: "load".into(),
            metric_prefix: "m.load".into(),
            quantum: Duration::from_secs(5),
            rf: 3,
            w: 2,
            r: 2,
            ..ClassConfig::default()
        },
        // The same, exported to the archive once 20 s old and then dropped from every
        // replica: by the end of a run its points are read back from the archive.
        ClassConfig {
            name: "cold".into(),
            metric_prefix: "m.cold".into(),
            quantum: Duration::from_secs(5),
            rf: 3,
            w: 2,
            r: 2,
            hot: Some(Duration::from_secs(20)),
            archive: true,
            ..ClassConfig::default()
        },
        ClassConfig {
            name: "traffic".into(),
            metric_prefix: "traffic.".into(),
            quantum: Duration::from_secs(5),
            coi: Some(CoiConfig {
                n_in: 2,
                n_out: 1,
                in_coi_dist: "50km".into(),
                out_coi_dist: "1000km".into(),
                coi_size: "50km".into(),
                precision: 5,
                location: None,
            }),
            ..ClassConfig::default()
        },
    ]
}

/// The address of node `i` (no packet leaves the process; loopback all the same).
pub fn node_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 77, 0, 1 + i as u8], 7400))
}

/// What a node is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    /// Never started yet (a node that joins later).
    Unborn,
    Up,
    /// Crashed; restarts later.
    Down,
    /// Crashed and never coming back.
    Departed,
    /// Left the cluster gracefully (handed off its blocks, then stopped).
    Left,
}

/// One node of the fleet.
pub struct SimNode {
    pub index: usize,
    pub addr: SocketAddr,
    pub config: NodeConfig,
    pub tls: TlsFiles,
    /// Its id, as the control plane knows the device.
    pub node_id: String,
    /// Where it stands (the network's latencies follow it at once; the node learns it from
    /// the control plane).
    pub location: Option<GeoPoint>,
    pub life: Life,
    /// The disk: survives crashes as its crash image.
    pub disk: FaultyDisk,
    pub host: Option<Host>,
    running: Arc<Mutex<Option<RunningNode>>>,
    start_error: Arc<Mutex<Option<String>>>,
    pub incarnation: u32,
}

impl SimNode {
    /// Whether its process runs: up, or leaving and not yet stopped (seed 12001: a node that
    /// left with a full disk never got it back, could not record its drops, and kept stale
    /// displaced copies to the end).
    pub fn running(&self) -> bool {
        self.life == Life::Up || (self.life == Life::Left && self.host.is_some())
    }
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode").field("index", &self.index).field("life", &self.life).finish_non_exhaustive()
    }
}

/// Timings of a simulated node: the defaults, compressed so that suspicion, repair and
/// handoff happen within a run of a couple of simulated minutes.
pub fn node_config(i: usize, dir: &std::path::Path, tls: &TlsFiles, location: Option<&str>) -> NodeConfig {
    let mut c = NodeConfig {
        listen: node_addr(i),
        data_dir: dir.join(format!("node-{i}")),
        bootstrap: if i == 0 { Vec::new() } else { vec![node_addr(0).to_string(), node_addr(1).to_string()] },
        location: location.map(str::to_string),
        classes: classes(),
        base_dir: dir.to_path_buf(),
        ..NodeConfig::default()
    };
    c.tls.ca = tls.ca.clone();
    c.tls.cert = tls.cert.clone();
    c.tls.key = tls.key.clone();
    c.http.enabled = false;
    c.store.engine = StoreEngine::Disk;
    c.store.fsync = Fsync::Durable;
    c.store.maintenance_interval = Duration::from_secs(1);
    c.dht.request_timeout = Duration::from_secs(2);
    c.dht.connect_timeout = Duration::from_secs(1);
    c.dht.idle_timeout = Duration::from_secs(6);
    c.membership.gossip_interval = Duration::from_millis(500);
    c.membership.suspect_after = Duration::from_secs(3);
    c.membership.gone_after = Duration::from_secs(20);
    c.repair.anti_entropy_interval = Duration::from_secs(5);
    c.repair.settle_for = Duration::from_secs(3);
    c.repair.catch_up_delay = Duration::from_secs(3);
    // The archive is the simulator's bucket (`Seams::archive`); `memory://` says there is one.
    c.tier.url = "memory://".into();
    c.tier.interval = Duration::from_secs(20);
    c.tier.listing_ttl = Duration::from_secs(5);
    c.tier.takeover_after = Duration::from_secs(10);
    c.tier.max_backoff = Duration::from_secs(40);
    c.tier.row_group_rows = 4096;
    c
}

impl SimNode {
    /// A node not started yet, enrolled in `control` at the location its configuration names.
    pub fn new(index: usize, config: NodeConfig, tls: TlsFiles, control: &ControlPlane) -> Result<SimNode> {
        let location = config.location().ok().flatten();
        let node_id = control.enroll(&config.data_dir, &tls, location)?;
        Ok(SimNode {
            index,
            addr: config.listen,
            config,
            tls,
            node_id,
            location,
            life: Life::Unborn,
            disk: FaultyDisk::new(),
            host: None,
            running: Arc::default(),
            start_error: Arc::default(),
            incarnation: 0,
        })
    }

    /// Boots the node's host at `now_ns` and starts the node on it, as an enrolled node: from
    /// the desired state it applied last, following `control` (it joins as it runs).
    pub fn start(
        &mut self,
        net: &Arc<Network>,
        control: &Arc<ControlPlane>,
        archive: Arc<dyn ObjectStore>,
        now_ns: u64,
        epoch_ns: i64,
        seed: u64,
    ) -> Result<()> {
        self.incarnation += 1;
        let host = Host::boot(format!("node-{}#{}", self.index, self.incarnation), now_ns, epoch_ns, seed);
        net.set_location(self.index, self.location);
        let socket = host.enter(|| net.bind(self.index, self.addr, host.clock()));
        let mut endpoint = quinn::EndpointConfig::default();
        let mut rng_seed = [0u8; 32];
        let mut s = timeshard_store::faulty_disk::SplitMix64(seed ^ 0x0051_C0DE);
        for chunk in rng_seed.chunks_mut(8) {
            chunk.copy_from_slice(&s.next_u64().to_le_bytes());
        }
        endpoint.rng_seed(Some(rng_seed));
        let seams = Seams {
            socket: Some(socket),
            endpoint: Some(endpoint),
            disk: Some(Arc::new(self.disk.clone())),
            archive: Some(archive),
        };
        // Its location is the control plane's, as for any enrolled device.
        let config = NodeConfig { location: None, ..self.config.clone() };
        let agent = Agent::open_through(&config.data_dir, Some(control.link(self.node_id.clone())))?;
        let running = self.running.clone();
        let failed = self.start_error.clone();
        host.spawn(async move {
            match timeshard_node::control::start_on(config, agent, seams).await {
                Ok(node) => *running.lock().unwrap_or_else(|e| e.into_inner()) = Some(node),
                Err(e) => *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string()),
            }
        });
        self.host = Some(host);
        self.life = Life::Up;
        Ok(())
    }

    /// The running node, once started.
    pub fn node(&self) -> Option<Arc<Node>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|r| r.node().clone())
    }

    /// Why the node could not start, if it could not.
    pub fn start_error(&self) -> Option<String> {
        self.start_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Power cut: the host stops wherever its tasks were, and the disk keeps what a power cut
    /// keeps (synced bytes, maybe part of the rest, maybe torn).
    pub fn crash(&mut self, net: &Network, image_seed: u64, life: Life) {
        let Some(host) = self.host.take() else { return };
        net.close(self.addr);
        let image = self.disk.crash(image_seed);
        // Nothing the dying tasks do reaches the disk any more.
        self.disk.fail_writes(FailKind::Crashed);
        self.disk.fail_reads(FailKind::Crashed);
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner()).take();
        host.enter(|| drop(running));
        host.crash();
        self.disk = image;
        self.life = life;
    }

    /// Whether the node has stopped itself (it left the cluster).
    pub fn stopped(&self) -> bool {
        self.node().is_some_and(|n| n.stop_reason().is_some())
    }

    /// The node's data directory (hints live there, on the real file system).
    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir.clone()
    }
}

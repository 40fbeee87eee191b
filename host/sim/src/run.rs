//! One run of a seed: the fleet boots, clients write and read while the plan's faults strike,
//! everything heals, the fleet settles, the clients read everything back and the oracle looks
//! at every store; then the checker reads the history.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use timeshard_proto::{SeriesKey, TimeRange};
use timeshard_sdk::tls::Identity;
use timeshard_sdk::{Client, ClientOptions};
use timeshard_store::faulty_disk::{FailKind, SplitMix64};

use crate::archive::Bucket;
use crate::check::{self, Failure};
use crate::control::ControlPlane;
use crate::faults::{Action, Faults, Plan, PlanSpec};
use crate::fleet::{self, CLIENT_LOCATION, JOIN_LOCATIONS, LOCATIONS, Life, SimNode};
use crate::history::{Copy, Event, History, Pt};
use crate::host::Host;
use crate::net::{LinkFaults, Network};
use crate::pki::Pki;
use crate::watchdog::Watchdog;
use crate::workload::{self, Clients};

/// What the wall clocks of the fleet read at simulation time 0: 2025-06-15.
pub const EPOCH_NS: i64 = 1_749_945_600_000_000_000;
const SEC: u64 = 1_000_000_000;

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct Options {
    pub faults: Faults,
    /// Nodes of the fleet at the start.
    pub nodes: usize,
    /// Nodes that may join during the faults.
    pub joiners: usize,
    /// How long faults strike.
    pub fault_secs: u64,
    /// How long the fleet settles after they stop, before the final reads.
    pub quiet_secs: u64,
    pub writers: usize,
    pub readers: usize,
    /// The simulator's window: the network's shortest latency.
    pub window: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            faults: Faults::all(),
            nodes: 8,
            joiners: 2,
            fault_secs: 40,
            quiet_secs: 45,
            writers: 3,
            readers: 2,
            window: Duration::from_millis(2),
        }
    }
}

/// What a run gives.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub plan: Plan,
    pub history: History,
    pub failures: Vec<Failure>,
    /// Simulated time covered.
    pub sim: Duration,
    /// Wall-clock time it took.
    pub wall: Duration,
}

/// When the clients start writing: after the fleet formed.
const WORKLOAD_AT: u64 = 8 * SEC;
/// Between two looks of the oracle at memory.
const AUDIT_EVERY: u64 = 5 * SEC;

struct World {
    seed: u64,
    net: Arc<Network>,
    control: Arc<ControlPlane>,
    bucket: Bucket,
    nodes: Vec<SimNode>,
    clients_host: Host,
    clients: Arc<Clients>,
    sim_events: Vec<Event>,
    rng: SplitMix64,
    skews: Vec<i64>,
    reported_errors: BTreeSet<usize>,
}

/// Runs seed `seed`.
pub fn run(seed: u64, opts: &Options) -> Result<Outcome> {
    let wall = Instant::now();
    let dir = scratch_dir().context("a temporary directory for the run")?;
    let mut pki = Pki::new(&dir.path().join("pki"), seed)?;
    let net = Network::new(seed, opts.window);
    let total = opts.nodes + opts.joiners;
    let control = ControlPlane::new(fleet::classes().iter().map(timeshard_node::control::class_spec).collect());
    let mut nodes = Vec::with_capacity(total);
    for i in 0..total {
        let tls = pki.issue(&format!("node-{i}"), true)?;
        let location =
            if i < opts.nodes { LOCATIONS.get(i % LOCATIONS.len()) } else { JOIN_LOCATIONS.get(i - opts.nodes) };
        let config = fleet::node_config(i, dir.path(), &tls, location.copied());
        nodes.push(SimNode::new(i, config, tls, &control)?);
    }
    let client_tls = pki.issue("client", false)?;
    let clients_host = Host::boot("clients".into(), 0, EPOCH_NS, seed ^ 0xC11E_0000);
    net.set_location(total, timeshard_proto::geo::GeoPoint::new(CLIENT_LOCATION.0, CLIENT_LOCATION.1).ok());
    let client_addr = SocketAddr::from(([127, 77, 1, 1], 9000));
    let socket = clients_host.enter(|| net.bind(total, client_addr, clients_host.clock()));
    let endpoint = clients_host.enter(|| {
        quinn::Endpoint::new_with_abstract_socket(
            endpoint_config(seed ^ 0xC11E),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
    })?;
    let clients = Arc::new(Clients {
        endpoint,
        identity: Identity::load(&client_tls)?,
        nodes: Mutex::new(nodes.iter().map(|n| n.addr).collect()),
        up: Mutex::new(vec![false; total]),
        events: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        clock: clients_host.clock(),
    });
    let plan = Plan::draw(seed, &plan_spec(opts));
    let heal_at = WORKLOAD_AT + 2 * SEC + opts.fault_secs * SEC;
    let stop_writes_at = heal_at + 5 * SEC;
    let final_at = heal_at + opts.quiet_secs * SEC;

    let mut world = World {
        seed,
        net,
        control,
        bucket: Bucket::new(total),
        nodes,
        clients_host,
        clients,
        sim_events: Vec::new(),
        rng: SplitMix64(seed ^ 0x0000_5107),
        skews: vec![0; total],
        reported_errors: BTreeSet::new(),
    };
    let window = opts.window.as_nanos() as u64;
    let watchdog = Watchdog::start(seed);
    let mut t = 0u64;
    let mut starts: Vec<(u64, usize)> = (0..opts.nodes).map(|i| (i as u64 * 300_000_000, i)).collect();
    let mut step = 0;
    let mut workload_started = false;
    let mut next_audit = WORKLOAD_AT;
    while t < final_at {
        t += window;
        world.run_hosts(t);
        watchdog.beat(t);
        starts.retain(|&(at, i)| {
            if at <= t {
                world.start(i, t);
                false
            } else {
                true
            }
        });
        if !workload_started && t >= WORKLOAD_AT {
            workload_started = true;
            for w in 0..opts.writers {
                world.clients_host.spawn(workload::writer(world.clients.clone(), w));
            }
            for r in 0..opts.readers {
                world.clients_host.spawn(workload::reader(world.clients.clone(), 100 + r));
            }
        }
        while step < plan.steps.len() && plan.steps[step].0 <= t {
            let action = plan.steps[step].1.clone();
            world.apply(t, &action);
            step += 1;
        }
        if t >= stop_writes_at {
            world.clients.stop.store(true, Ordering::Relaxed);
        }
        if t >= next_audit {
            next_audit += AUDIT_EVERY;
            world.audit_memory(t);
        }
        world.upkeep(t);
    }
    // The final reads, through every running node in turn.
    let via: Vec<usize> =
        world.nodes.iter().filter(|n| n.life == Life::Up && n.node().is_some()).map(|n| n.index).collect();
    if via.is_empty() {
        world.sim_events.push(Event::NodeError {
            t,
            node: usize::MAX,
            error: "no node runs for the final reads".into(),
        });
    }
    let reads = world.clients_host.spawn(workload::final_reads(world.clients.clone(), via));
    let give_up = t + 120 * SEC;
    while !reads.is_finished() && t < give_up {
        t += window;
        world.run_hosts(t);
        watchdog.beat(t);
        world.upkeep(t);
    }
    if !reads.is_finished() {
        world.sim_events.push(Event::NodeError {
            t,
            node: usize::MAX,
            error: "the final reads did not finish within 120 s".into(),
        });
    }
    world.audit_end(t);
    let stats = world.net.stats();
    world.sim_events.push(Event::Totals {
        t,
        sent: stats.sent,
        delivered: stats.delivered,
        dropped: stats.dropped,
        duplicated: stats.duplicated,
        partitioned: stats.partitioned,
    });
    let mut events = std::mem::take(&mut world.sim_events);
    events.extend(std::mem::take(&mut *world.clients.events.lock().unwrap_or_else(|e| e.into_inner())));
    let history = History { events };
    let failures = check::check(&history);
    world.shutdown();
    Ok(Outcome { seed, plan, history, failures, sim: Duration::from_nanos(t), wall: wall.elapsed() })
}

/// Where the nodes keep what lives on the real file system (hints, their enrollment and
/// desired state): in memory where the machine has a tmpfs. No simulated fault reaches these
/// files, and their fsyncs on a disk cost a run about a tenth of its wall time.
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("timeshard-sim-").tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::tempdir()
}

/// What the plan of a run with `opts` is drawn for (`Plan::draw` with it gives a seed's plan
/// without running it).
pub fn plan_spec(opts: &Options) -> PlanSpec {
    PlanSpec {
        faults: opts.faults.clone(),
        nodes: opts.nodes,
        joiners: opts.joiners,
        start: Duration::from_nanos(WORKLOAD_AT + 2 * SEC),
        length: Duration::from_secs(opts.fault_secs),
    }
}

fn endpoint_config(seed: u64) -> quinn::EndpointConfig {
    let mut config = quinn::EndpointConfig::default();
    let mut bytes = [0u8; 32];
    let mut rng = SplitMix64(seed);
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    config.rng_seed(Some(bytes));
    config
}

impl World {
    fn run_hosts(&mut self, t: u64) {
        for n in &self.nodes {
            if let Some(h) = &n.host {
                h.run_until(t);
            }
        }
        self.clients_host.run_until(t);
    }

    fn host_seed(&self, i: usize, incarnation: u32) -> u64 {
        self.seed ^ ((i as u64 + 1) << 40) ^ u64::from(incarnation)
    }

    fn start(&mut self, i: usize, t: u64) {
        let seed = self.host_seed(i, self.nodes[i].incarnation + 1);
        let archive = self.bucket.link(i);
        if let Err(e) = self.nodes[i].start(&self.net, &self.control, archive, t, EPOCH_NS, seed) {
            self.sim_events.push(Event::NodeError { t, node: i, error: format!("{e:#}") });
        }
        if let Some(h) = &self.nodes[i].host {
            h.seams().set_skew_ns(self.skews[i]);
        }
    }

    fn fault(&mut self, t: u64, what: String) {
        self.sim_events.push(Event::Fault { t, what });
    }

    fn crash(&mut self, i: usize, life: Life) {
        let image_seed = self.rng.next_u64();
        self.nodes[i].crash(&self.net, image_seed, life);
    }

    fn apply(&mut self, t: u64, action: &Action) {
        self.fault(t, format!("{action:?}"));
        match action {
            Action::Links(f) => self.net.set_faults(*f),
            Action::Partition { a, b, one_way } => {
                for &x in a {
                    for &y in b {
                        self.net.cut(x, y);
                        if !one_way {
                            self.net.cut(y, x);
                        }
                    }
                }
            }
            Action::HealPartitions => self.net.heal(),
            Action::Crash(i) => {
                if self.nodes[*i].life == Life::Up {
                    self.crash(*i, Life::Down);
                }
            }
            Action::Restart(i) => {
                if self.nodes[*i].life == Life::Down {
                    self.start(*i, t);
                }
            }
            Action::Depart(i) => {
                if self.nodes[*i].life == Life::Up {
                    self.crash(*i, Life::Departed);
                }
            }
            Action::Join(i) => {
                if self.nodes[*i].life == Life::Unborn {
                    // As an operator would: the joiner's seeds are members still in the
                    // cluster, not the first two of the plan (seed 10993: both had gone, and
                    // the joiner stayed alone, rightly never settled, to the end).
                    let seeds: Vec<String> = (0..self.nodes.len())
                        .filter(|&k| k != *i && self.nodes[k].life == Life::Up)
                        .take(2)
                        .map(|k| crate::fleet::node_addr(k).to_string())
                        .collect();
                    if !seeds.is_empty() {
                        self.nodes[*i].config.bootstrap = seeds;
                    }
                    self.start(*i, t);
                }
            }
            Action::Leave(i) => self.leave(*i),
            Action::Relocate(i, to) => {
                let to = to.and_then(|(lat, lon)| timeshard_proto::geo::GeoPoint::new(lat, lon).ok());
                self.relocate(&[(*i, to)]);
            }
            Action::ClearLocations => {
                let moves: Vec<_> = (0..self.nodes.len()).map(|i| (i, None)).collect();
                self.relocate(&moves);
            }
            Action::ControlDown => self.control.set_reachable(false),
            Action::ControlUp => self.control.set_reachable(true),
            Action::ArchiveFails(i, fault) => self.bucket.fail(*i, *fault),
            Action::ArchiveHeals(i) => self.bucket.heal(*i),
            Action::Skew(i, skew) => {
                self.skews[*i] = *skew;
                if let Some(h) = &self.nodes[*i].host {
                    h.seams().set_skew_ns(*skew);
                }
            }
            Action::DiskFull(i) => self.nodes[*i].disk.fail_writes(FailKind::DiskFull),
            Action::DiskHeal(i) => {
                if self.nodes[*i].running() {
                    self.nodes[*i].disk.heal();
                }
            }
            Action::FsyncFails(i) => self.nodes[*i].disk.fail_syncs(1 + self.rng.below(3)),
            Action::Misdirect(i) => self.nodes[*i].disk.misdirect_appends(1),
            Action::BitFlip(i) => {
                let files = self.nodes[*i].disk.files();
                let sizable: Vec<&(String, usize)> = files.iter().filter(|(_, len)| *len > 0).collect();
                if !sizable.is_empty() {
                    let (path, len) = sizable[self.rng.below(sizable.len() as u64) as usize];
                    let offset = self.rng.below(*len as u64) as usize;
                    let bit = 1u8 << self.rng.below(8);
                    self.fault(t, format!("flipped bit {bit:#04x} at {offset} of {path} on node {i}"));
                    self.nodes[*i].disk.corrupt(path, offset, bit);
                }
            }
            Action::HealAll => {
                self.net.set_faults(LinkFaults::default());
                self.net.heal();
                self.control.set_reachable(true);
                for i in 0..self.nodes.len() {
                    self.bucket.heal(i);
                }
                let back: Vec<_> = (0..self.nodes.len())
                    .map(|i| (i, self.nodes[i].config.location().ok().flatten()))
                    .filter(|(i, original)| self.nodes[*i].location != *original)
                    .collect();
                self.relocate(&back);
                for i in 0..self.nodes.len() {
                    if self.nodes[i].running() {
                        self.nodes[i].disk.heal();
                    }
                    if self.nodes[i].life == Life::Down {
                        self.start(i, t);
                    }
                }
            }
        }
    }

    /// Moves devices, as an operator does through the control plane: one new generation for
    /// all of them, which each node applies when its follower gets it. The network's
    /// latencies follow the devices at once.
    fn relocate(&mut self, moves: &[(usize, Option<timeshard_proto::geo::GeoPoint>)]) {
        let mut changes = Vec::new();
        for &(i, to) in moves {
            let n = &mut self.nodes[i];
            if matches!(n.life, Life::Unborn | Life::Departed | Life::Left) {
                continue;
            }
            n.location = to;
            self.net.set_location(i, to);
            changes.push((n.node_id.clone(), to));
        }
        self.control.set_locations(&changes);
    }

    /// A graceful leave, asked the way an operator does: with the node's own certificate.
    fn leave(&mut self, i: usize) {
        if self.nodes[i].life != Life::Up {
            return;
        }
        let Ok(identity) = Identity::load(&self.nodes[i].tls) else { return };
        let endpoint = self.clients.endpoint.clone();
        let addr = self.nodes[i].addr;
        let options = ClientOptions { connect_timeout: Duration::from_secs(2), ..ClientOptions::default() };
        self.clients_host.spawn(async move {
            if let Ok(c) = Client::connect_on(endpoint, addr, &identity, options).await {
                let _ = c.leave().await;
            }
        });
        self.clients.up.lock().unwrap_or_else(|e| e.into_inner())[i] = false;
        self.nodes[i].life = Life::Left;
    }

    /// After each window: who is up for the clients, nodes that stopped after leaving, and
    /// nodes that failed to start.
    fn upkeep(&mut self, t: u64) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].life == Life::Left && self.nodes[i].host.is_some() && self.nodes[i].stopped() {
                self.fault(t, format!("node {i} left the cluster and stopped"));
                self.crash(i, Life::Left);
            }
            if let Some(e) = self.nodes[i].start_error()
                && self.reported_errors.insert(i)
            {
                self.sim_events.push(Event::NodeError { t, node: i, error: format!("could not start: {e}") });
            }
        }
        let mut up = self.clients.up.lock().unwrap_or_else(|e| e.into_inner());
        for (i, n) in self.nodes.iter().enumerate() {
            up[i] = n.life == Life::Up && n.node().is_some();
        }
    }

    fn audit_memory(&mut self, t: u64) {
        for n in &self.nodes {
            let Some(node) = n.node() else { continue };
            if let Some(disk) = node.disk_store() {
                let open = disk.stats().open_points;
                let limit = timeshard_node::budget::Shares::of(n.config.memory.budget.0).max_open_points() as u64;
                // The store seals early past its share; a write's batch may overshoot it once.
                let slack = u64::from(n.config.limits.max_batch_points);
                self.sim_events.push(Event::Memory {
                    t,
                    node: n.index,
                    what: "open points".into(),
                    used: open,
                    limit: limit + slack,
                });
            }
        }
    }

    /// The oracle's last look: what every running node's store holds of each series, and
    /// every copy of each block that holds acknowledged points.
    fn audit_end(&mut self, t: u64) {
        let latest = self.control.generation();
        for n in &self.nodes {
            let Some(node) = n.node() else { continue };
            if n.life != Life::Up {
                continue;
            }
            self.sim_events.push(Event::Config {
                t,
                node: n.index,
                running: node.config_generation(),
                reported: self.control.reported(&n.node_id),
                latest,
            });
        }
        let range = workload::written_range();
        let series: Vec<SeriesKey> = workload::series();
        let classes = self.nodes[0].config.class_table().expect("the simulated classes are valid");
        for s in &series {
            let mut held: BTreeSet<Pt> = BTreeSet::new();
            let mut quanta: BTreeSet<i64> = BTreeSet::new();
            let class = classes.of(s);
            let q = class.quantum;
            // The archive's copies: what the bucket's committed exports hold.
            let mut archived: BTreeMap<i64, u64> = BTreeMap::new();
            let archived_class = self.nodes[0].config.classes.iter().any(|c| c.name == class.name && c.archive);
            if archived_class {
                match self.bucket.points(&self.nodes[0].tls, class, s, range) {
                    Ok(points) => {
                        for p in points {
                            *archived.entry(p.ts.div_euclid(q.ns()) * q.ns()).or_default() += 1;
                            held.insert((p.ts, p.event));
                        }
                    }
                    Err(e) => self.sim_events.push(Event::NodeError {
                        t,
                        node: usize::MAX,
                        error: format!("the oracle cannot read {s} from the archive: {e:#}"),
                    }),
                }
            }
            let mut per_node = Vec::new();
            for n in &self.nodes {
                let (Some(host), Some(node)) = (&n.host, n.node()) else { continue };
                let store = node.store().clone();
                let points = host.enter(|| read_all(&*store, s, range));
                per_node.push((n.index, store));
                for p in points {
                    held.insert((p.ts, p.event));
                }
            }
            for (ts, _) in &held {
                quanta.insert(ts.div_euclid(q.ns()) * q.ns());
            }
            for quantum in quanta {
                let copies: Vec<Copy> = per_node
                    .iter()
                    .filter_map(|(i, store)| {
                        let info = store.block_info(s, quantum).ok().flatten()?;
                        Some(Copy { node: *i, up: true, count: info.count, digest: info.digest })
                    })
                    .collect();
                let archived = archived.get(&quantum).copied().unwrap_or(0);
                self.sim_events.push(Event::Copies {
                    t,
                    why: "end".into(),
                    series: s.to_string(),
                    quantum,
                    copies,
                    archived,
                });
            }
            self.sim_events.push(Event::Held { t, series: s.to_string(), points: held.into_iter().collect() });
        }
    }

    fn shutdown(mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].host.is_some() {
                self.crash(i, Life::Down);
            }
        }
        let World { clients_host, clients, .. } = self;
        clients_host.enter(|| drop(clients));
        clients_host.crash();
    }
}

fn read_all(store: &dyn timeshard_store::Store, series: &SeriesKey, range: TimeRange) -> Vec<timeshard_proto::Point> {
    let mut out = Vec::new();
    let mut after = None;
    while let Ok(page) = store.read(series, range, after, 10_000) {
        out.extend(page.points.iter().copied());
        match (page.more, page.points.last()) {
            (true, Some(last)) => after = Some(last.key()),
            _ => break,
        }
    }
    out
}

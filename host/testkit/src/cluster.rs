//! A local cluster of separate node processes on loopback, for the demo, the benchmarks and
//! the end-to-end tests. Each node gets its own directory, config file, certificate and log.
//! The certificates come from a development PKI, or, with [`Enrollment`], each node enrolls
//! with a control plane at its first start (`timeshard node --enroll`). With
//! [`ClusterOptions::fault_injection`], each node also watches a fault file, and
//! [`LocalCluster::partition`] cuts the cluster into groups that cannot talk to each other.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use timeshard_node::budget::MemoryConfig;
use timeshard_node::config::{
    ClassConfig, DhtConfig, HintsConfig, LimitsConfig, MembershipConfig, NodeConfig, RepairConfig, StoreConfig,
    TestingConfig, TierConfig, TlsConfig,
};
use timeshard_node::http::HttpConfig;
use timeshard_node::pki;
use timeshard_node::process::Ready;
use timeshard_proto::{Contact, Id};
use timeshard_sdk::tls::TlsFiles;
use timeshard_sdk::{Client, NodeStatus};
use tokio::process::{Child, Command};

/// How long a node may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a killed node may take to be gone.
const KILL_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits up to `timeout` for `child` to exit, by polling: a fixture's wait for a node is
/// bounded whether or not tokio's reaper wakes it (a scenario once hung in CI for over an
/// hour, where is not known; this rules the reaper out). `None` if it still runs.
async fn wait_polling(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The HTTP token every node of a local cluster accepts unless its options say otherwise.
pub const HTTP_TOKEN: &str = "timeshard-local-cluster-http-token";
/// The header that carries [`HTTP_TOKEN`], for hand-made requests.
pub const HTTP_AUTHORIZATION: &str = "Authorization: Bearer timeshard-local-cluster-http-token";

/// How to build a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Number of node processes.
    pub nodes: usize,
    /// Directory for certificates, configs, data and logs.
    pub dir: PathBuf,
    /// The `timeshard` binary to run.
    pub binary: PathBuf,
    /// Series classes of every node.
    pub classes: Vec<ClassConfig>,
    pub store: StoreConfig,
    pub dht: DhtConfig,
    pub limits: LimitsConfig,
    /// The memory budget of every node.
    pub memory: MemoryConfig,
    pub membership: MembershipConfig,
    pub hints: HintsConfig,
    pub repair: RepairConfig,
    /// The cold tier of every node (the same archive for all).
    pub tier: TierConfig,
    /// Whether every node watches a fault file (`node-<i>/faults`), so tests can partition the
    /// cluster with [`LocalCluster::partition`].
    pub fault_injection: bool,
    /// Policies of every node (use absolute paths for the modules).
    pub policy: timeshard_policy::Config,
    /// The HTTP side of every node; its `listen` port is replaced by a free one per node.
    pub http: HttpConfig,
    /// Log filter of the nodes (`TIMESHARD_LOG`).
    pub log: String,
    /// Enroll with a control plane instead of using a development PKI.
    pub enroll: Option<Enrollment>,
    /// Node `i`'s location (`LAT,LON`), if `locations[i]` is given: for classes with `coi`.
    pub locations: Vec<Option<String>>,
    /// WAN emulation between located nodes (`[testing] wan_emulation`).
    pub wan_emulation: Option<timeshard_node::config::WanEmulation>,
    /// Derive every key of the development PKI from this seed ([`pki::dev_pki_seeded`]), so
    /// that node ids, and with them placement, repeat from run to run; `None`: random keys.
    pub pki_seed: Option<u64>,
}

/// Nodes that enroll with a control plane at their first start.
#[derive(Clone, Debug)]
pub struct Enrollment {
    /// Node `i` enrolls with (and then follows) `urls[i % urls.len()]`.
    pub urls: Vec<String>,
    /// One single-use enrollment token per node.
    pub tokens: Vec<String>,
    /// Node 0 listens here and no node gets `--bootstrap`: the control plane's node
    /// configuration names this address as the bootstrap peer. `None`: the nodes join
    /// through node 0 with `--bootstrap`, as without a control plane.
    pub first_addr: Option<SocketAddr>,
}

impl ClusterOptions {
    /// `nodes` nodes of `binary` in `dir`, with default settings.
    pub fn new(nodes: usize, dir: impl Into<PathBuf>, binary: impl Into<PathBuf>) -> ClusterOptions {
        ClusterOptions {
            nodes,
            dir: dir.into(),
            binary: binary.into(),
            classes: Vec::new(),
            store: StoreConfig::default(),
            dht: DhtConfig::default(),
            limits: LimitsConfig::default(),
            memory: MemoryConfig::default(),
            membership: MembershipConfig::default(),
            hints: HintsConfig::default(),
            repair: RepairConfig::default(),
            tier: TierConfig::default(),
            fault_injection: false,
            policy: timeshard_policy::Config::default(),
            http: HttpConfig { tokens: vec![HTTP_TOKEN.into()], ..HttpConfig::default() },
            log: std::env::var("TIMESHARD_NODE_LOG").unwrap_or_else(|_| "info".into()),
            enroll: None,
            locations: Vec::new(),
            wan_emulation: None,
            pki_seed: None,
        }
    }
}

impl ClusterOptions {
    /// Options for a test cluster of `nodes` processes of `binary` in a fresh temporary directory
    /// (removed when the returned guard drops). Timeouts and gossip are shortened so failures
    /// are detected within seconds, and repair runs every few seconds.
    pub fn for_tests(nodes: usize, binary: impl Into<PathBuf>) -> (ClusterOptions, tempfile::TempDir) {
        let dir = tempfile::Builder::new().prefix("timeshard-e2e-").tempdir().expect("temp dir");
        let mut options = ClusterOptions::new(nodes, dir.path(), binary);
        options.dht = DhtConfig {
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(3),
            ..DhtConfig::default()
        };
        options.membership = MembershipConfig {
            gossip_interval: Duration::from_millis(200),
            suspect_after: Duration::from_secs(3),
            ..MembershipConfig::default()
        };
        options.repair = RepairConfig {
            anti_entropy_interval: Duration::from_secs(5),
            settle_for: Duration::from_secs(5),
            catch_up_delay: Duration::from_secs(3),
            ..RepairConfig::default()
        };
        (options, dir)
    }
}

#[derive(Debug)]
struct NodeProcess {
    config: PathBuf,
    ready_file: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    ready: Ready,
}

/// A running local cluster. Dropping it kills every node; call [`LocalCluster::shutdown`] to
/// stop them cleanly.
#[derive(Debug)]
pub struct LocalCluster {
    options: ClusterOptions,
    nodes: Vec<NodeProcess>,
}

impl LocalCluster {
    /// Creates the PKI and configs, starts node 0, then the others bootstrapping through it.
    pub async fn start(options: ClusterOptions) -> Result<LocalCluster> {
        if options.nodes == 0 {
            bail!("a cluster needs at least one node");
        }
        std::fs::create_dir_all(&options.dir).with_context(|| format!("cannot create {}", options.dir.display()))?;
        let first_addr = match &options.enroll {
            Some(e) if e.tokens.len() < options.nodes => {
                bail!("{} enrollment tokens for {} nodes", e.tokens.len(), options.nodes)
            }
            Some(e) => e.first_addr,
            None => {
                let dir = options.dir.join("pki");
                match options.pki_seed {
                    Some(seed) => pki::dev_pki_seeded(&dir, options.nodes, seed)?,
                    None => pki::dev_pki(&dir, options.nodes)?,
                };
                None
            }
        };
        let mut cluster = LocalCluster { options, nodes: Vec::new() };
        let first = cluster.spawn(0, first_addr, Vec::new()).await?;
        cluster.nodes.push(first);
        let seeds = match first_addr {
            Some(_) => Vec::new(),
            None => vec![cluster.nodes[0].ready.addr.to_string()],
        };
        let mut starting = Vec::new();
        for i in 1..cluster.options.nodes {
            starting.push(cluster.spawn(i, None, seeds.clone()));
        }
        for node in futures::future::join_all(starting).await {
            cluster.nodes.push(node?);
        }
        Ok(cluster)
    }

    /// Starts the cluster and waits (up to a minute) until every node knows the others.
    pub async fn start_converged(options: ClusterOptions) -> Result<LocalCluster> {
        let cluster = LocalCluster::start(options).await?;
        cluster.wait_converged(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    fn node_config(&self, i: usize, listen: Option<SocketAddr>, bootstrap: Vec<String>) -> NodeConfig {
        let o = &self.options;
        let pki = TlsFiles::in_dir(&o.dir.join("pki"), &format!("node-{i}"));
        NodeConfig {
            listen: listen.unwrap_or_else(|| "127.0.0.1:0".parse().expect("literal")),
            data_dir: self.data_dir(i),
            bootstrap,
            location: o.locations.get(i).cloned().flatten(),
            tls: TlsConfig { ca: pki.ca, cert: pki.cert, key: pki.key },
            dht: o.dht.clone(),
            limits: o.limits.clone(),
            memory: o.memory.clone(),
            store: o.store.clone(),
            membership: o.membership.clone(),
            hints: o.hints.clone(),
            repair: o.repair.clone(),
            tier: o.tier.clone(),
            testing: TestingConfig {
                fault_file: o.fault_injection.then(|| self.fault_file(i)),
                wan_emulation: o.wan_emulation,
            },
            // An enrolled node takes its classes from the control plane.
            classes: if o.enroll.is_some() { Vec::new() } else { o.classes.clone() },
            policy: o.policy.clone(),
            http: HttpConfig { listen: SocketAddr::new(o.http.listen.ip(), 0), ..o.http.clone() },
            base_dir: o.dir.join(format!("node-{i}")),
        }
    }

    fn fault_file(&self, i: usize) -> PathBuf {
        self.options.dir.join(format!("node-{i}")).join("faults")
    }

    async fn spawn(&self, i: usize, listen: Option<SocketAddr>, bootstrap: Vec<String>) -> Result<NodeProcess> {
        let dir = self.options.dir.join(format!("node-{i}"));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("node.toml");
        // A restarted node keeps what `edit_config` changed in its file; only where it listens
        // and whom it bootstraps from are set anew.
        let node_config = match NodeConfig::load(&config) {
            Ok(mut edited) => {
                edited.listen = listen.unwrap_or_else(|| "127.0.0.1:0".parse().expect("literal"));
                edited.bootstrap = bootstrap;
                edited
            }
            Err(_) => self.node_config(i, listen, bootstrap),
        };
        std::fs::write(&config, toml::to_string(&node_config)?)?;
        let ready_file = dir.join("ready.json");
        let _ = std::fs::remove_file(&ready_file);
        let log = dir.join("node.log");
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let mut command = Command::new(&self.options.binary);
        command.arg("node").arg("--config").arg(&config).arg("--ready-file").arg(&ready_file);
        if let Some(e) = &self.options.enroll
            && !timeshard_control_api::Agent::is_enrolled(&self.data_dir(i))
        {
            command.arg("--enroll").arg(&e.urls[i % e.urls.len()]).arg("--token").arg(&e.tokens[i]);
        }
        let child = command
            .env("TIMESHARD_LOG", &self.options.log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {}", self.options.binary.display()))?;
        let mut node = NodeProcess {
            config,
            ready_file,
            log,
            child: Some(child),
            ready: Ready { id: Id::ZERO, addr: "0.0.0.0:0".parse().expect("literal"), pid: 0, http_addr: None },
        };
        node.ready = wait_ready(&mut node).await.with_context(|| format!("node {i} did not start"))?;
        Ok(node)
    }

    /// Starts one more node, enrolling with `token` (the cluster must have been enrolled with a
    /// control plane); returns its index.
    pub async fn add_enrolled(&mut self, token: String) -> Result<usize> {
        let i = self.nodes.len();
        match &mut self.options.enroll {
            Some(e) => e.tokens.push(token),
            None => bail!("the cluster is not enrolled with a control plane"),
        }
        self.options.nodes += 1;
        let node = self.spawn(i, None, Vec::new()).await?;
        self.nodes.push(node);
        Ok(i)
    }

    /// Number of nodes (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].ready.addr
    }

    /// Node `i`'s HTTP address (`None` if its HTTP side is disabled).
    pub fn http_addr(&self, i: usize) -> Option<SocketAddr> {
        self.nodes[i].ready.http_addr
    }

    /// Node `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().and_then(Child::id)
    }

    /// Node `i`'s id.
    pub fn id(&self, i: usize) -> Id {
        self.nodes[i].ready.id
    }

    /// Every node's contact (running or not), in node order.
    pub fn contacts(&self) -> Vec<Contact> {
        self.nodes.iter().map(|n| Contact { id: n.ready.id, addr: n.ready.addr }).collect()
    }

    /// Node `i`'s log file.
    pub fn log(&self, i: usize) -> &Path {
        &self.nodes[i].log
    }

    /// Node `i`'s config file.
    pub fn config(&self, i: usize) -> &Path {
        &self.nodes[i].config
    }

    /// Node `i`'s data directory (an enrolled node keeps its enrollment in `control/` there).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.options.dir.join(format!("node-{i}")).join("data")
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// The directory holding the CA and the certificates.
    pub fn pki_dir(&self) -> PathBuf {
        self.options.dir.join("pki")
    }

    /// The client certificate files.
    pub fn client_tls(&self) -> TlsFiles {
        TlsFiles::in_dir(&self.pki_dir(), "client")
    }

    /// The certificate a client of node `i` uses: the development PKI's client certificate,
    /// or, for enrolled nodes (the control plane issues node certificates only), node `i`'s
    /// own, which it knows as itself and never takes for a peer.
    pub fn client_tls_of(&self, i: usize) -> TlsFiles {
        match &self.options.enroll {
            Some(_) => TlsFiles::in_dir(&self.data_dir(i).join("control"), "node"),
            None => self.client_tls(),
        }
    }

    /// Node `i`'s own certificate: from the control plane when enrolled, else the
    /// development PKI's `node-<i>`.
    pub fn node_tls(&self, i: usize) -> TlsFiles {
        match &self.options.enroll {
            Some(_) => TlsFiles::in_dir(&self.data_dir(i).join("control"), "node"),
            None => TlsFiles::in_dir(&self.pki_dir(), &format!("node-{i}")),
        }
    }

    /// A client connected to node `i`.
    pub async fn client(&self, i: usize) -> Result<Client> {
        Ok(Client::connect(self.addr(i), &self.client_tls_of(i)).await?)
    }

    /// Whether node `i` is running.
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// What node `i` reports about itself.
    pub async fn status(&self, i: usize) -> Result<NodeStatus> {
        let client = self.client(i).await?;
        let status = client.status().await;
        client.close().await;
        Ok(status?)
    }

    /// Cuts the cluster into `groups` of node indices: from then on, a node talks only to the
    /// nodes of its own group (nodes in no group talk to everyone). Needs
    /// [`ClusterOptions::fault_injection`]. The nodes see it within 200 ms.
    pub fn partition(&self, groups: &[&[usize]]) -> Result<()> {
        if !self.options.fault_injection {
            bail!("the cluster was started without fault_injection");
        }
        for (g, group) in groups.iter().enumerate() {
            let others: Vec<String> = groups
                .iter()
                .enumerate()
                .filter(|(h, _)| *h != g)
                .flat_map(|(_, other)| other.iter().map(|&j| self.id(j).to_hex()))
                .collect();
            for &i in group.iter() {
                write_atomically(&self.fault_file(i), &others.join("\n"))?;
            }
        }
        Ok(())
    }

    /// Lifts every partition.
    pub fn heal(&self) -> Result<()> {
        for i in 0..self.len() {
            write_atomically(&self.fault_file(i), "")?;
        }
        Ok(())
    }

    /// Waits until every running node knows every other running node (or `k` of them) and
    /// holds every running node as up in its membership view.
    pub async fn wait_converged(&self, timeout: Duration) -> Result<Vec<NodeStatus>> {
        let running: Vec<usize> = (0..self.len()).filter(|&i| self.is_running(i)).collect();
        let want = (running.len() - 1).min(self.options.dht.k) as u32;
        let deadline = Instant::now() + timeout;
        let mut clients = Vec::new();
        for &i in &running {
            clients.push(self.client(i).await?);
        }
        loop {
            let mut statuses = Vec::new();
            for c in &clients {
                statuses.push(c.status().await?);
            }
            let members = running.len() as u32;
            if statuses.iter().all(|s| s.peers >= want && s.members_up >= members) {
                for c in clients {
                    c.close().await;
                }
                return Ok(statuses);
            }
            if Instant::now() > deadline {
                let peers: Vec<u32> = statuses.iter().map(|s| s.peers).collect();
                let up: Vec<u32> = statuses.iter().map(|s| s.members_up).collect();
                bail!(
                    "nodes did not learn of each other within {timeout:?}: peers known {peers:?}, want {want}; \
                     members up {up:?}, want {members}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running node reports itself settled (it holds every block it owns)
    /// with no handoff pending; returns their statuses.
    pub async fn wait_settled(&self, timeout: Duration) -> Result<Vec<NodeStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut statuses = Vec::new();
            for i in (0..self.len()).filter(|&i| self.is_running(i)) {
                statuses.push(self.status(i).await?);
            }
            if statuses.iter().all(|s| s.repair.settled && s.repair.handoff_pending == 0) {
                return Ok(statuses);
            }
            if Instant::now() > deadline {
                let state: Vec<(bool, u64)> =
                    statuses.iter().map(|s| (s.repair.settled, s.repair.handoff_pending)).collect();
                bail!("nodes not settled within {timeout:?}: (settled, handoff pending) {state:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Rewrites node `i`'s config file with `edit` applied; [`LocalCluster::reload`] makes the
    /// running node read it, and a restart keeps it.
    pub fn edit_config(&self, i: usize, edit: impl FnOnce(&mut NodeConfig)) -> Result<()> {
        let path = self.config(i);
        let mut config = NodeConfig::load(path).with_context(|| format!("cannot load {}", path.display()))?;
        edit(&mut config);
        std::fs::write(path, toml::to_string(&config)?).with_context(|| format!("cannot write {}", path.display()))
    }

    /// Node `i`'s `/metrics` sample `name` (labels included, as the exposition writes them:
    /// `name{class="pmu"}`), if it shows one; asked over HTTP with [`HTTP_TOKEN`].
    pub async fn metric(&self, i: usize, name: &str) -> Result<Option<f64>> {
        let addr = self.http_addr(i).with_context(|| format!("node {i} serves no HTTP"))?;
        let mut c = crate::http_client::HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
        let answer = c.get("/metrics").await?;
        ensure!(answer.status == 200, "/metrics of node {i} answered {}: {}", answer.status, answer.text());
        let prefix = format!("{name} ");
        let text = answer.text();
        let value = text.lines().find_map(|l| l.strip_prefix(&prefix));
        value.map(|v| v.parse().with_context(|| format!("{name} {v}"))).transpose()
    }

    /// Sends node `i` SIGHUP: it re-reads its config file and applies what can change while it
    /// runs (retention, policies).
    pub fn reload(&self, i: usize) -> Result<()> {
        let pid =
            self.nodes[i].child.as_ref().and_then(Child::id).with_context(|| format!("node {i} is not running"))?;
        kill(Pid::from_raw(pid as i32), Signal::SIGHUP).context("cannot signal the node")?;
        Ok(())
    }

    /// Kills node `i` with SIGKILL (no chance to clean up).
    pub async fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.start_kill();
            wait_polling(&mut child, KILL_TIMEOUT)
                .await?
                .with_context(|| format!("node {i} still runs {KILL_TIMEOUT:?} after SIGKILL"))?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for node `i` to exit on its own; returns how it exited.
    pub async fn wait_exit(&mut self, i: usize, timeout: Duration) -> Result<ExitStatus> {
        let Some(child) = self.nodes[i].child.as_mut() else { bail!("node {i} is not running") };
        let status =
            wait_polling(child, timeout).await?.with_context(|| format!("node {i} still runs after {timeout:?}"))?;
        self.nodes[i].child = None;
        Ok(status)
    }

    /// Stops node `i` with SIGTERM and waits for it; returns whether it exited cleanly.
    pub async fn terminate(&mut self, i: usize) -> Result<bool> {
        let Some(mut child) = self.nodes[i].child.take() else { return Ok(true) };
        if let Some(pid) = child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        if let Some(status) = wait_polling(&mut child, STOP_TIMEOUT).await? {
            return Ok(status.success());
        }
        let _ = child.start_kill();
        wait_polling(&mut child, KILL_TIMEOUT)
            .await?
            .with_context(|| format!("node {i} still runs {KILL_TIMEOUT:?} after SIGKILL"))?;
        Ok(false)
    }

    /// Restarts a stopped node `i` on its old address, joining through another running node.
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        if self.is_running(i) {
            bail!("node {i} is running");
        }
        let seeds: Vec<String> = (0..self.len())
            .filter(|&j| j != i && self.is_running(j))
            .map(|j| self.addr(j).to_string())
            .take(3)
            .collect();
        let node = self.spawn(i, Some(self.addr(i)), seeds).await?;
        self.nodes[i] = node;
        Ok(())
    }

    /// Starts `n` more nodes (with new certificates from the cluster's PKI), joining through
    /// up to three running nodes; returns their indices. Not for enrolled clusters.
    pub async fn add_nodes(&mut self, n: usize) -> Result<Vec<usize>> {
        if self.options.enroll.is_some() {
            bail!("nodes of an enrolled cluster join with enrollment tokens");
        }
        let seeds: Vec<String> =
            (0..self.len()).filter(|&j| self.is_running(j)).map(|j| self.addr(j).to_string()).take(3).collect();
        let first = self.len();
        let mut starting = Vec::new();
        for i in first..first + n {
            pki::issue(&self.pki_dir(), &format!("node-{i}"), pki::Role::Node)?;
            starting.push(self.spawn(i, None, seeds.clone()));
        }
        for node in futures::future::join_all(starting).await {
            self.nodes.push(node?);
        }
        self.options.nodes = self.nodes.len();
        Ok((first..first + n).collect())
    }

    /// Stops every node with SIGTERM; returns how many exited cleanly.
    pub async fn shutdown(mut self) -> Result<usize> {
        let mut clean = 0;
        let stops: Vec<_> = (0..self.len()).filter(|&i| self.is_running(i)).collect();
        // Signal all first so they stop in parallel.
        for &i in &stops {
            if let Some(pid) = self.nodes[i].child.as_ref().and_then(Child::id) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
        for i in stops {
            clean += usize::from(self.terminate(i).await?);
        }
        Ok(clean)
    }
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

async fn wait_ready(node: &mut NodeProcess) -> Result<Ready> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&node.ready_file)
            && let Ok(ready) = serde_json::from_str::<Ready>(&text)
        {
            return Ok(ready);
        }
        if let Some(child) = node.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
            bail!(
                "node exited with {status} before it was ready; its log ({}) ends:\n{}",
                node.log.display(),
                tail.join("\n")
            );
        }
        if Instant::now() > deadline {
            bail!("no ready file {} within {START_TIMEOUT:?}", node.ready_file.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod http_token_tests {
    #[test]
    fn the_authorization_header_carries_the_token() {
        assert_eq!(super::HTTP_AUTHORIZATION, format!("Authorization: Bearer {}", super::HTTP_TOKEN));
    }
}

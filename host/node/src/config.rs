//! The node's TOML configuration. Every setting has a default, so an empty file (or none) is a
//! valid configuration; `timeshard node --print-config` prints them all.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::class::{AgeBy, Classes, Replication, SeriesClass};
use timeshard_proto::wire::Limits;
use timeshard_proto::{KeyFormat, QuantumLen};
use timeshard_sdk::tls::TlsFiles;

/// The whole configuration of a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// UDP address the node listens on for peers and clients. Port 0 picks a free port.
    pub listen: SocketAddr,
    /// Directory for this node's data. Relative paths are relative to the config file.
    pub data_dir: PathBuf,
    /// Addresses (`host:port`) of nodes to join through. Empty for the first node.
    pub bootstrap: Vec<String>,
    /// Where this node is, `LAT,LON` in degrees (e.g. `33.75,-84.39`): gossiped to the fleet,
    /// it places the series of classes with `coi`. A node without one holds none of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub tls: TlsConfig,
    pub dht: DhtConfig,
    pub limits: LimitsConfig,
    /// The one memory budget, split over open points, caches, policy pools and queues (see
    /// `crate::budget`).
    pub memory: crate::budget::MemoryConfig,
    pub store: StoreConfig,
    pub membership: MembershipConfig,
    pub hints: HintsConfig,
    pub repair: RepairConfig,
    pub tier: TierConfig,
    pub testing: TestingConfig,
    /// Series classes; a catch-all class (QFI, 10 s quanta, RF 3, W 2, R 2) is added when none
    /// has an empty `metric_prefix`. Every node of a cluster must have the same classes.
    #[serde(rename = "class")]
    pub classes: Vec<ClassConfig>,
    /// WebAssembly policies: trusted signing keys, modules and their bindings to series (see
    /// `timeshard_policy::Config`). Every node of a cluster must have the same query policies.
    pub policy: timeshard_policy::Config,
    /// The HTTP side: InfluxDB line protocol and `/query`, Prometheus remote write, the JSON
    /// API and `/metrics` (see `crate::http`).
    pub http: crate::http::HttpConfig,
    /// Directory that relative paths resolve against: the config file's. Not part of the file.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            listen: "127.0.0.1:7400".parse().expect("literal address"),
            data_dir: PathBuf::from("timeshard-data"),
            bootstrap: Vec::new(),
            location: None,
            tls: TlsConfig::default(),
            dht: DhtConfig::default(),
            limits: LimitsConfig::default(),
            memory: crate::budget::MemoryConfig::default(),
            store: StoreConfig::default(),
            membership: MembershipConfig::default(),
            hints: HintsConfig::default(),
            repair: RepairConfig::default(),
            tier: TierConfig::default(),
            testing: TestingConfig::default(),
            classes: Vec::new(),
            policy: timeshard_policy::Config::default(),
            http: crate::http::HttpConfig::default(),
            base_dir: PathBuf::from("."),
        }
    }
}

/// Certificate files; relative paths are relative to the config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The fleet CA certificate: peers and clients must present certificates it signed.
    pub ca: PathBuf,
    /// This node's certificate (must name `node.timeshard`).
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig { ca: "pki/ca.pem".into(), cert: "pki/node.pem".into(), key: "pki/node.key".into() }
    }
}

/// The DHT: Kademlia parameters and timeouts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DhtConfig {
    /// Contacts per k-bucket and per lookup answer.
    pub k: usize,
    /// Requests a lookup keeps in flight.
    pub alpha: usize,
    /// Consecutive failed requests after which a peer is evicted (doubled if no replacement waits).
    pub max_failures: u32,
    /// How often a bucket no lookup touched is refreshed.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// How long a request to a peer may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a QUIC handshake with a peer may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// A connection with no traffic for this long is closed (keep-alives are sent at a third of it).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for DhtConfig {
    fn default() -> Self {
        DhtConfig {
            k: timeshard_proto::K,
            alpha: timeshard_proto::ALPHA,
            max_failures: 2,
            refresh_interval: Duration::from_secs(600),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(6),
        }
    }
}

/// Hard limits on what peers and clients may send, and on concurrent work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest message accepted, in bytes.
    pub max_message_bytes: u32,
    /// Most points in one write.
    pub max_batch_points: u32,
    /// Most series in one write.
    pub max_batch_series: u32,
    /// Most points in one page of a read.
    pub max_page_points: u32,
    /// Requests served at once; beyond it requests are refused as overloaded.
    pub max_concurrent_requests: usize,
    /// Streams (requests) one connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Connections accepted at once.
    pub max_connections: usize,
    /// Quanta a read fetches in parallel.
    pub read_parallelism: usize,
    /// Quanta one page of a read scans at most; a longer range continues on the next page.
    pub max_quanta_per_page: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = Limits::default();
        LimitsConfig {
            max_message_bytes: l.max_message_bytes,
            max_batch_points: l.max_batch_points,
            max_batch_series: l.max_batch_series,
            max_page_points: l.max_page_points,
            max_concurrent_requests: 1024,
            max_streams_per_connection: 256,
            max_connections: 4096,
            read_parallelism: 64,
            max_quanta_per_page: 4096,
        }
    }
}

impl LimitsConfig {
    /// The wire limits.
    pub fn wire(&self) -> Limits {
        Limits {
            max_message_bytes: self.max_message_bytes,
            max_batch_points: self.max_batch_points,
            max_batch_series: self.max_batch_series,
            max_page_points: self.max_page_points,
            max_contacts: Limits::default().max_contacts,
        }
    }
}

/// Which storage engine holds this node's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `disk`: the durable engine in `<data_dir>/store` (write-ahead log, compressed blocks).
    /// `memory`: everything in RAM, lost on restart (tests, throwaway clusters).
    pub engine: StoreEngine,
    /// When the disk engine acknowledges a write: `durable` (after fsync; survives power loss)
    /// or `os-buffered` (after the OS has it; survives a crash of the node, not of the machine).
    pub fsync: Fsync,
    /// The disk engine seals (compresses) a block once its quantum ended this long ago; later
    /// points still merge in as late data.
    #[serde(with = "humantime_serde")]
    pub seal_grace: Duration,
    /// How often the disk engine's maintenance runs (sealing, retention, log checkpoints).
    #[serde(with = "humantime_serde")]
    pub maintenance_interval: Duration,
    /// Most points the memory engine holds before refusing writes.
    pub memory_max_points: u64,
    /// The disk engine checkpoints a block's open points (writes them as a sealed frame) once
    /// they are this old, so no open block pins the write-ahead log longer than this, even one
    /// whose quantum lasts a year.
    #[serde(with = "humantime_serde")]
    pub max_open_age: Duration,
    /// Once the write-ahead log holds this many bytes, the disk engine checkpoints the open
    /// points of its older half early. Bounds the log on disk and the replay after a crash
    /// (and so the memory a restart needs).
    pub max_wal_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            engine: StoreEngine::Disk,
            fsync: Fsync::Durable,
            seal_grace: Duration::from_secs(30),
            maintenance_interval: Duration::from_secs(1),
            memory_max_points: 200_000_000,
            max_open_age: Duration::from_secs(60),
            max_wal_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The membership view: gossip and when a silent node counts as down or gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipConfig {
    /// How often this node bumps its heartbeat and gossips with a few peers.
    #[serde(with = "humantime_serde")]
    pub gossip_interval: Duration,
    /// A node whose heartbeat did not advance for this long is down: writes to it become hints.
    #[serde(with = "humantime_serde")]
    pub suspect_after: Duration,
    /// A node silent for this long is gone: it no longer owns blocks, and the next closest
    /// nodes take over.
    #[serde(with = "humantime_serde")]
    pub gone_after: Duration,
    /// Most nodes the view holds.
    pub max_members: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        let d = timeshard_proto::membership::Config::default();
        MembershipConfig {
            gossip_interval: Duration::from_secs(1),
            suspect_after: d.suspect_after,
            gone_after: d.gone_after,
            max_members: d.max_members,
        }
    }
}

impl MembershipConfig {
    /// The settings of the sans-IO view.
    pub fn view(&self) -> timeshard_proto::membership::Config {
        timeshard_proto::membership::Config {
            suspect_after: self.suspect_after,
            gone_after: self.gone_after,
            max_members: self.max_members,
            ..timeshard_proto::membership::Config::default()
        }
    }
}

/// Hinted handoff: writes a replica missed, kept by the coordinator in `<data_dir>/hints`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HintsConfig {
    /// Hints older than this are dropped (anti-entropy repairs what they held).
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Most bytes of hints kept; a hint beyond it is dropped.
    pub max_bytes: u64,
    /// Bytes per second replayed to replicas that are back.
    pub replay_bytes_per_sec: u64,
    /// Writes to replicas that may still run after their write was answered; beyond it they
    /// become hints.
    pub max_replica_writes: usize,
}

impl Default for HintsConfig {
    fn default() -> Self {
        HintsConfig {
            max_age: Duration::from_secs(3 * 3600),
            max_bytes: 256 << 20,
            replay_bytes_per_sec: 16 << 20,
            max_replica_writes: 256,
        }
    }
}

/// The cold tier: the archive that classes with `archive = true` export their history to (see
/// `host/tier/FORMAT.md`), and how the node exports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// The archive: a directory (relative to the config file), `file:///path`, or
    /// `s3://bucket/prefix` (credentials from the usual `AWS_*` environment variables).
    /// Empty: no archive. Every node of a cluster must name the same archive.
    pub url: String,
    /// Settings of an `s3://` archive over the environment's, as object_store names them:
    /// `aws_endpoint`, `aws_region`, `aws_allow_http`, ...
    pub options: BTreeMap<String, String>,
    /// How often the node looks for blocks past their hot window (and applies write-time
    /// retention).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Upload rate of exports in bytes per second; 0 for no limit.
    pub rate_limit_bytes_per_sec: u64,
    /// Rows an export holds in memory at once (one Parquet row group, about 24 bytes a row).
    pub row_group_rows: usize,
    /// Blocks one export round takes at most (oldest days first); the rest wait for the next.
    pub max_blocks_per_round: usize,
    /// A block past its hot window that the archive still lacks this long after it became due
    /// is exported by the next owner in line (the first may be down, or lack some points).
    #[serde(with = "humantime_serde")]
    pub takeover_after: Duration,
    /// Points files no manifest commits (interrupted exports) are removed once this old: far
    /// longer than an export of one file takes, or a slow export loses its file to the cleanup
    /// and fails (a day is safe).
    #[serde(with = "humantime_serde")]
    pub cleanup_grace: Duration,
    /// How long a listing of the archive is trusted before queries list it again.
    #[serde(with = "humantime_serde")]
    pub listing_ttl: Duration,
    /// Longest wait between export rounds while the archive keeps failing (the wait doubles
    /// from `interval` with each failed round).
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            url: String::new(),
            options: BTreeMap::new(),
            interval: Duration::from_secs(60),
            rate_limit_bytes_per_sec: 0,
            row_group_rows: 1 << 20,
            max_blocks_per_round: 100_000,
            takeover_after: Duration::from_secs(3600),
            cleanup_grace: Duration::from_secs(86_400),
            listing_ttl: Duration::from_secs(10),
            max_backoff: Duration::from_secs(600),
        }
    }
}

/// Anti-entropy, handoff of displaced blocks, and read repair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairConfig {
    /// How often a node pulls from each of its neighbours (every member when the view holds
    /// at most 64, else the 64 closest), jittered by up to a tenth. A change of the view
    /// starts a round at once.
    #[serde(with = "humantime_serde")]
    pub anti_entropy_interval: Duration,
    /// Blocks written within this long are left out of comparisons (live ingest keeps
    /// replicas briefly apart; hints and read repair cover them), and a displaced block is
    /// handed off once it was not written for this long.
    #[serde(with = "humantime_serde")]
    pub settle_for: Duration,
    /// How long after a change that may have given this node blocks (its start, a member
    /// gone, left or leaving) its catch-up round starts: long enough for the change to reach
    /// every coordinator and for the writes placed by the previous view to end. Until that
    /// round has pulled from every neighbour, this node answers reads as unsettled.
    #[serde(with = "humantime_serde")]
    pub catch_up_delay: Duration,
    /// Most bytes per second anti-entropy fetches and handoff pushes, each.
    pub bytes_per_sec: u64,
    /// Read repairs waiting to be sent, at most; more are dropped and counted (anti-entropy
    /// repairs them later).
    pub read_repair_queue: usize,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            anti_entropy_interval: Duration::from_secs(60),
            settle_for: Duration::from_secs(30),
            catch_up_delay: Duration::from_secs(15),
            bytes_per_sec: 64 << 20,
            read_repair_queue: 1_024,
        }
    }
}

/// Fault injection for tests. Only the node's own config file sets it; no peer can.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TestingConfig {
    /// A file naming nodes (ids in hex, or `ip:port` addresses), one per line, that this node
    /// must not talk to: requests to them fail as unreachable, and requests from them are
    /// dropped. Re-read every 200 ms; absent or empty means no fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_file: Option<PathBuf>,
    /// WAN emulation for tests and benchmarks on one machine: requests to a peer with a
    /// location (and their answers) are each delayed by
    /// `haversine_km * route_factor / 200 + per_hop_ms`. Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wan_emulation: Option<WanEmulation>,
}

/// The WAN emulation's parameters (`[testing] wan_emulation = { per_hop_ms = 0.2,
/// route_factor = 1.5 }`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanEmulation {
    /// Fixed cost of every message, in milliseconds.
    pub per_hop_ms: f64,
    /// How much longer routes are than great circles.
    pub route_factor: f64,
}

/// Storage engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    Disk,
    Memory,
}

/// When writes are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fsync {
    Durable,
    OsBuffered,
}

/// One series class as written in the config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassConfig {
    pub name: String,
    /// Series whose metric starts with this belong to the class (longest prefix wins).
    pub metric_prefix: String,
    /// `qfi` (quanta-first: history spread over the network) or `kfi` (key-first: history on
    /// the same few nodes).
    pub format: KeyFormat,
    /// Quantum length, e.g. `10s`.
    #[serde(with = "humantime_serde")]
    pub quantum: Duration,
    /// Replicas per block.
    pub rf: u8,
    /// Acknowledgements a write waits for.
    pub w: u8,
    /// Replicas a read asks.
    pub r: u8,
    /// How long points are kept, by `age_by` (e.g. `30days`); unset keeps them forever. With
    /// `archive = true` it applies to the archive too, and must be longer than `hot`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
    /// With `archive = true`: sealed blocks older than this, by `age_by`, are exported to the
    /// archive (`[tier] url`) and dropped from the hot store once the archive holds them
    /// (default 30 days).
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub hot: Option<Duration>,
    /// Export this class's history to the archive; reads span both tiers.
    pub archive: bool,
    /// What the hot window and retention measure: `event` time (default) or `write` time.
    pub age_by: AgeBy,
    /// Context-of-interest replication (placement by the series' location); `rf`, `w` and `r`
    /// are then derived from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coi: Option<CoiConfig>,
}

/// A class's context-of-interest parameters as written in the config file:
/// `coi = { n_in = 2, n_out = 1, in_coi_dist = "50km", out_coi_dist = "1000km", coi_size = "50km",
/// precision = 5 }`. The control plane's class spec carries the same type, checked the same way.
pub type CoiConfig = timeshard_control_api::class::CoiSpec;

impl ClassConfig {
    /// The hot window in force: `hot`, or 30 days for an archived class without one; `None`
    /// for a class that is not archived.
    pub fn hot_window(&self) -> Option<Duration> {
        self.archive.then(|| self.hot.unwrap_or(timeshard_control_api::class::DEFAULT_HOT))
    }
}

impl Default for ClassConfig {
    fn default() -> Self {
        let d = SeriesClass::default();
        ClassConfig {
            name: d.name,
            metric_prefix: d.metric_prefix,
            format: d.format,
            quantum: Duration::from_nanos(d.quantum.ns() as u64),
            rf: d.replication.rf,
            w: d.replication.w,
            r: d.replication.r,
            retention: None,
            hot: None,
            archive: false,
            age_by: AgeBy::Event,
            coi: None,
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {setting}: {message}")]
    Invalid { setting: String, message: String },
}

impl NodeConfig {
    /// Reads `path`, resolving relative paths in it against the file's directory.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut cfg: NodeConfig =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve_paths(base);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Makes relative paths absolute against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        self.base_dir = base.to_path_buf();
        for p in [&mut self.data_dir, &mut self.tls.ca, &mut self.tls.cert, &mut self.tls.key]
            .into_iter()
            .chain(self.testing.fault_file.as_mut())
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        for p in [&mut self.http.cert, &mut self.http.key].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        // An archive given as a relative directory (no scheme) is relative to the file too.
        let url = &self.tier.url;
        if !url.is_empty() && !url.contains("://") && Path::new(url).is_relative() {
            self.tier.url = base.join(url).to_string_lossy().into_owned();
        }
    }

    /// The certificate files.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles { ca: self.tls.ca.clone(), cert: self.tls.cert.clone(), key: self.tls.key.clone() }
    }

    /// The class table.
    pub fn class_table(&self) -> Result<Classes, ConfigError> {
        let mut classes = Vec::with_capacity(self.classes.len());
        for c in &self.classes {
            let invalid = |message: String| ConfigError::Invalid { setting: format!("class {:?}", c.name), message };
            let ns = i64::try_from(c.quantum.as_nanos()).map_err(|_| invalid("quantum too long".into()))?;
            let quantum = QuantumLen::new(ns).map_err(|e| invalid(e.to_string()))?;
            let coi = c.coi.as_ref().map(|c| c.coi()).transpose().map_err(invalid)?;
            let replication = match &coi {
                Some(coi) => coi.replication(),
                None => Replication { rf: c.rf, w: c.w, r: c.r }.validate().map_err(|e| invalid(e.to_string()))?,
            };
            classes.push(SeriesClass {
                name: c.name.clone(),
                metric_prefix: c.metric_prefix.clone(),
                format: c.format,
                quantum,
                replication,
                coi,
            });
        }
        Classes::new(classes).map_err(|e| ConfigError::Invalid { setting: "class".into(), message: e.to_string() })
    }

    /// Retention rules of the store: one per class, the catch-all class (prefix `""`, added
    /// with no retention when the file has none) and classes that keep forever included, so
    /// the class that owns a series decides (the store takes the longest matching prefix).
    /// Timeshard's own series (`_timeshard.`, e.g. the quantum index of every class) are kept
    /// as long as the longest-lived class, forever if any class keeps forever.
    pub fn retention_rules(&self) -> Vec<timeshard_store::RetentionRule> {
        use timeshard_store::RetentionRule;
        let keep = |c: &ClassConfig| c.retention.map(|r| i64::try_from(r.as_nanos()).unwrap_or(i64::MAX));
        // The store measures event time; write-time retention is the tier's (crate::tier).
        let store_keep = |c: &ClassConfig| if c.age_by == AgeBy::Write { None } else { keep(c) };
        let mut rules: Vec<RetentionRule> = self
            .classes
            .iter()
            .map(|c| RetentionRule { metric_prefix: c.metric_prefix.clone(), keep_ns: store_keep(c) })
            .collect();
        if !self.classes.iter().any(|c| c.metric_prefix.is_empty()) {
            rules.push(RetentionRule::forever(""));
        }
        let reserved = timeshard_proto::key::RESERVED_METRIC_PREFIX;
        if !rules.iter().any(|r| r.metric_prefix == reserved) {
            // Any rule that keeps forever (the implicit catch-all too) makes this forever, and
            // so do classes whose data outlives their event-time age: archived ones (the index
            // finds cold quanta too) and those aged by write time.
            let outlived = self.classes.iter().any(|c| c.archive || c.age_by == AgeBy::Write);
            let longest =
                rules.iter().map(|r| r.keep_ns).try_fold(0i64, |acc, k| k.map(|k| acc.max(k))).filter(|_| !outlived);
            rules.push(RetentionRule { metric_prefix: reserved.to_string(), keep_ns: longest });
        }
        rules
    }

    /// Checks settings that have no valid default when given badly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting: &str, message: &str| {
            Err(ConfigError::Invalid { setting: setting.into(), message: message.into() })
        };
        if self.dht.k == 0 || self.dht.k > 64 {
            return invalid("dht.k", "must be between 1 and 64");
        }
        if self.dht.alpha == 0 || self.dht.alpha > self.dht.k {
            return invalid("dht.alpha", "must be between 1 and dht.k");
        }
        if self.limits.max_message_bytes < 64 * 1024 {
            return invalid("limits.max_message_bytes", "must be at least 65536");
        }
        if self.limits.max_batch_points == 0 || self.limits.max_page_points == 0 {
            return invalid("limits", "batch and page limits must be positive");
        }
        if self.limits.max_concurrent_requests == 0 || self.limits.read_parallelism == 0 {
            return invalid("limits", "concurrency limits must be positive");
        }
        if self.dht.request_timeout.is_zero() || self.dht.connect_timeout.is_zero() || self.dht.idle_timeout.is_zero() {
            return invalid("dht", "timeouts must be positive");
        }
        if self.classes.iter().any(|c| c.retention.is_some_and(|r| r.is_zero())) {
            return invalid("class.retention", "must be positive; leave it out to keep points forever");
        }
        if self.memory.budget.0 < crate::budget::MIN_BUDGET {
            return invalid("memory.budget", "must be at least 4MiB (256MiB is the default)");
        }
        if self.store.maintenance_interval.is_zero() {
            return invalid("store.maintenance_interval", "must be positive");
        }
        if self.store.max_open_age.is_zero() {
            return invalid("store.max_open_age", "must be positive (60s is the default)");
        }
        if self.store.max_wal_bytes < 1024 * 1024 {
            return invalid("store.max_wal_bytes", "must be at least 1 MiB (64 MiB is the default)");
        }
        let m = &self.membership;
        if m.gossip_interval.is_zero() || m.suspect_after <= m.gossip_interval || m.gone_after <= m.suspect_after {
            return invalid(
                "membership",
                "need 0 < gossip_interval < suspect_after < gone_after (a few gossip rounds before a node is down)",
            );
        }
        if m.max_members < 2 || m.max_members > timeshard_proto::membership::MAX_MEMBERS {
            return invalid("membership.max_members", "must be between 2 and 16384");
        }
        if self.hints.max_age.is_zero() || self.hints.replay_bytes_per_sec == 0 {
            return invalid("hints", "max_age and replay_bytes_per_sec must be positive");
        }
        let r = &self.repair;
        if r.anti_entropy_interval.is_zero() || r.bytes_per_sec == 0 || r.read_repair_queue == 0 {
            return invalid("repair", "anti_entropy_interval, bytes_per_sec and read_repair_queue must be positive");
        }
        self.http.validate()?;
        self.location()?;
        if let Some(w) = &self.testing.wan_emulation
            && !(w.per_hop_ms >= 0.0 && w.per_hop_ms < 10_000.0 && w.route_factor >= 1.0 && w.route_factor < 100.0)
        {
            return invalid("testing.wan_emulation", "need 0 <= per_hop_ms < 10000 and 1 <= route_factor < 100");
        }
        for c in &self.classes {
            if let Some(message) = timeshard_control_api::class::tier_problem(c.hot, c.archive, c.retention) {
                return Err(ConfigError::Invalid { setting: format!("class {:?}", c.name), message });
            }
            if c.archive && self.tier.url.is_empty() {
                return invalid("tier.url", "a class has archive = true: name the archive (a directory or s3://...)");
            }
        }
        self.validate_tier()?;
        let classes = self.class_table()?;
        if classes.max_rf() as usize > self.dht.k {
            return invalid("class", "a replication factor is larger than dht.k");
        }
        Ok(())
    }
}

impl NodeConfig {
    /// This node's location, checked.
    pub fn location(&self) -> Result<Option<timeshard_proto::geo::GeoPoint>, ConfigError> {
        self.location
            .as_deref()
            .map(|l| {
                l.parse().map_err(|e: timeshard_proto::geo::GeoError| ConfigError::Invalid {
                    setting: "location".into(),
                    message: e.to_string(),
                })
            })
            .transpose()
    }

    fn validate_tier(&self) -> Result<(), ConfigError> {
        let t = &self.tier;
        let invalid = |setting: &str, message: String| Err(ConfigError::Invalid { setting: setting.into(), message });
        if !t.url.is_empty()
            && let Err(e) = timeshard_tier::Location::parse(&t.url)
        {
            return invalid("tier.url", e.to_string());
        }
        if t.interval.is_zero() || t.takeover_after.is_zero() || t.max_backoff < t.interval {
            return invalid("tier", "need 0 < interval <= max_backoff and a positive takeover_after".into());
        }
        if t.row_group_rows < 1024 || t.max_blocks_per_round == 0 {
            return invalid("tier", "row_group_rows must be at least 1024 and max_blocks_per_round positive".into());
        }
        if t.cleanup_grace < Duration::from_secs(1) {
            return invalid(
                "tier.cleanup_grace",
                "must be at least a second, and far longer than an export takes".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        let cfg: NodeConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, NodeConfig::default());
        cfg.validate().unwrap();
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let mut cfg = NodeConfig::default();
        cfg.classes.push(ClassConfig { name: "pmu".into(), metric_prefix: "pmu.".into(), ..Default::default() });
        let text = toml::to_string(&cfg).unwrap();
        let back: NodeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn tier_settings_are_checked() {
        let archived = "[[class]]\nname = \"h\"\nmetric_prefix = \"h.\"\narchive = true\n";
        let cfg: NodeConfig = toml::from_str(archived).unwrap();
        assert!(cfg.validate().unwrap_err().to_string().contains("tier.url"), "an archived class needs an archive");
        let mut cfg: NodeConfig = toml::from_str(&format!("{archived}[tier]\nurl = \"archive\"\n")).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.classes[0].hot_window(), Some(Duration::from_secs(30 * 86_400)), "30 days by default");
        cfg.resolve_paths(Path::new("/etc/timeshard"));
        assert_eq!(cfg.tier.url, "/etc/timeshard/archive", "a relative directory is relative to the file");
        // Retention of archived classes applies to the archive too, and must outlast the hot
        // window; the store keeps what the tier ages by write time, and timeshard's own series
        // of archived classes forever.
        cfg.classes[0].retention = Some(Duration::from_secs(86_400));
        assert!(cfg.validate().unwrap_err().to_string().contains("longer than the hot window"));
        cfg.classes[0].retention = Some(Duration::from_secs(365 * 86_400));
        cfg.validate().unwrap();
        cfg.classes[0].retention = None;
        cfg.classes.push(ClassConfig {
            name: "w".into(),
            metric_prefix: "w.".into(),
            retention: Some(Duration::from_secs(60)),
            age_by: AgeBy::Write,
            ..Default::default()
        });
        cfg.validate().unwrap();
        let rules = cfg.retention_rules();
        let keep = |prefix: &str| rules.iter().find(|r| r.metric_prefix == prefix).map(|r| r.keep_ns);
        assert_eq!(keep("w."), Some(None), "write-time retention is the tier's, not the store's");
        assert_eq!(keep(timeshard_proto::key::RESERVED_METRIC_PREFIX), Some(None));
        for bad in ["url = \"gs://x/y\"", "interval = \"0s\"", "row_group_rows = 10", "cleanup_grace = \"0s\""] {
            let cfg: NodeConfig = toml::from_str(&format!("[tier]\n{bad}\n")).unwrap();
            assert!(cfg.validate().unwrap_err().to_string().contains("tier"), "{bad}");
        }
    }

    #[test]
    fn bad_settings_are_explained() {
        let err = toml::from_str::<NodeConfig>("lissen = \"1.2.3.4:5\"").unwrap_err().to_string();
        assert!(err.contains("lissen"), "{err}");
        let cfg: NodeConfig = toml::from_str("[[class]]\nname = \"x\"\nrf = 2\nw = 3\n").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("class \"x\"") && err.contains("w=3"), "{err}");
        let cfg: NodeConfig = toml::from_str("[[class]]\nname = \"q\"\nquantum = \"0s\"\n").unwrap();
        assert!(cfg.validate().unwrap_err().to_string().contains("quantum"));
    }

    #[test]
    fn coi_settings_are_checked() {
        let class = |coi: &str| {
            format!(
                "location = \"33.75,-84.39\"\n[[class]]\nname = \"t\"\nmetric_prefix = \"traffic.\"\ncoi = {{ {coi} }}\n"
            )
        };
        let good = "n_in = 3, n_out = 1, in_coi_dist = \"50km\", out_coi_dist = \"1000km\", coi_size = \"20km\", precision = 5";
        let cfg: NodeConfig = toml::from_str(&class(good)).unwrap();
        cfg.validate().unwrap();
        let table = cfg.class_table().unwrap();
        let t = table.of(&"traffic.speed".parse().unwrap());
        assert_eq!((t.replication.rf, t.replication.w, t.replication.r), (4, 2, 2), "W = n_in/2+1, R + W > n_in");
        assert_eq!(t.coi.as_ref().unwrap().in_coi_m, 50_000);
        assert_eq!(cfg.location().unwrap().unwrap().lat, 33.75);
        for (bad, says) in [
            ("n_in = 0, in_coi_dist = \"5km\", out_coi_dist = \"5km\", coi_size = \"5km\", precision = 5", "n_in"),
            (
                "n_in = 2, in_coi_dist = \"5parsecs\", out_coi_dist = \"5km\", coi_size = \"5km\", precision = 5",
                "5parsecs",
            ),
            (
                "n_in = 2, in_coi_dist = \"50km\", out_coi_dist = \"5km\", coi_size = \"5km\", precision = 5",
                "out_coi_dist",
            ),
            (
                "n_in = 2, in_coi_dist = \"5km\", out_coi_dist = \"5km\", coi_size = \"5km\", precision = 13",
                "precision",
            ),
            (
                "n_in = 2, in_coi_dist = \"5km\", out_coi_dist = \"5km\", coi_size = \"5km\", precision = 5, location = \"dn5a\"",
                "dn5a",
            ),
        ] {
            let cfg: NodeConfig = toml::from_str(&class(bad)).unwrap();
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("class \"t\"") && err.contains(says), "{bad}: {err}");
        }
        let cfg: NodeConfig = toml::from_str("location = \"95,0\"").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("location") && err.contains("latitude"), "{err}");
    }
}

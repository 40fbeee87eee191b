//! The node's TOML configuration. Every setting has a default, so an empty file (or none) is a
//! valid configuration; `timeshard node --print-config` prints them all.
//!
//! A leaf: it imports nothing of the node, so every part of the node may read it. One file per
//! concern: `net` (TLS files, DHT, limits), `store`, `cluster` (membership, hints, repair),
//! `tier`, `class`, `memory` (the one memory budget), `http` and `testing`; this module holds
//! [`NodeConfig`], which gathers them, loading, paths and validation, and [`Live`], the
//! configuration in force while the node runs. The files import one another only for
//! [`ConfigError`] (`error`).

mod class;
mod cluster;
mod error;
mod http;
mod memory;
mod net;
mod store;
mod testing;
mod tier;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use timeshard_proto::class::Classes;
use timeshard_sdk::tls::TlsFiles;

pub use class::{ClassConfig, CoiConfig, OnFull};
pub use cluster::{HintsConfig, MembershipConfig, RepairConfig};
pub use error::ConfigError;
pub use http::{HttpConfig, MIN_TOKEN_CHARS};
pub use memory::{ByteSize, MIN_BUDGET, MemoryConfig};
pub use net::{DhtConfig, LimitsConfig, TlsConfig};
pub use store::{Fsync, StoreConfig, StoreEngine};
pub use testing::{TestingConfig, WanEmulation};
pub use tier::TierConfig;

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
    /// The one memory budget, split over open points, caches, policy pools and queues (by the
    /// node's `budget` module).
    pub memory: MemoryConfig,
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
    /// API and `/metrics` (served by the node's `http` module).
    pub http: HttpConfig,
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
            memory: MemoryConfig::default(),
            store: StoreConfig::default(),
            membership: MembershipConfig::default(),
            hints: HintsConfig::default(),
            repair: RepairConfig::default(),
            tier: TierConfig::default(),
            testing: TestingConfig::default(),
            classes: Vec::new(),
            policy: timeshard_policy::Config::default(),
            http: HttpConfig::default(),
            base_dir: PathBuf::from("."),
        }
    }
}

impl NodeConfig {
    /// Reads `path`, resolving relative paths in it against the file's directory.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        NodeConfig::parse(&text, path)
    }

    /// The configuration in `text`, the contents of the file at `path`: parsed, its relative
    /// paths resolved against the file's directory, and validated.
    pub fn parse(text: &str, path: &Path) -> Result<NodeConfig, ConfigError> {
        let mut cfg: NodeConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
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
        class::table(&self.classes)
    }

    /// Retention rules of the store: one per class, the catch-all class (prefix `""`, added
    /// with no retention when the file has none) and classes that keep forever included, so
    /// the class that owns a series decides (the store takes the longest matching prefix).
    /// Timeshard's own series (`_timeshard.`, e.g. the quantum index of every class) are kept
    /// as long as the longest-lived class, forever if any class keeps forever.
    pub fn retention_rules(&self) -> Vec<timeshard_store::RetentionRule> {
        class::retention_rules(&self.classes)
    }

    /// `[store] max_bytes` in force: the disk engine's limit (the memory engine has its own,
    /// `memory_max_points`).
    pub fn store_max_bytes(&self) -> Option<u64> {
        self.store.max_bytes.filter(|_| self.store.engine == StoreEngine::Disk).map(|b| b.0)
    }

    /// The store's quota rules: one per class (see [`class::quota_rules`]); empty when no class
    /// has a quota.
    pub fn quota_rules(&self) -> Vec<timeshard_store::QuotaRule> {
        class::quota_rules(&self.classes)
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
        if self.limits.max_concurrent_requests == 0
            || self.limits.max_concurrent_peer_requests == 0
            || self.limits.read_parallelism == 0
            || self.limits.max_connections == 0
            || self.limits.max_connections_per_identity == 0
        {
            return invalid("limits", "concurrency limits must be positive");
        }
        if self.limits.handshakes_per_sec_per_address > 0 && self.limits.handshake_burst_per_address == 0 {
            return invalid(
                "limits.handshake_burst_per_address",
                "must be positive while handshakes_per_sec_per_address is (set that to 0 to turn the limit off)",
            );
        }
        if self.dht.request_timeout.is_zero() || self.dht.connect_timeout.is_zero() || self.dht.idle_timeout.is_zero() {
            return invalid("dht", "timeouts must be positive");
        }
        if self.classes.iter().any(|c| c.retention.is_some_and(|r| r.is_zero())) {
            return invalid("class.retention", "must be positive; leave it out to keep points forever");
        }
        if self.memory.budget.0 < MIN_BUDGET {
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
        if self.store.max_bytes.is_some_and(|b| b.0 < 1024 * 1024) {
            return invalid("store.max_bytes", "must be at least 1 MiB, or unset for no limit but the disk's");
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
            if let Some(message) = timeshard_control_api::class::tier_problem(c.hot, c.archive, c.retention)
                .or_else(|| timeshard_control_api::class::priority_problem(c.export_priority, c.archive))
            {
                return Err(ConfigError::Invalid { setting: format!("class {:?}", c.name), message });
            }
            if let Some(message) = timeshard_control_api::class::quota_problem(c.quota, c.on_full) {
                return Err(ConfigError::Invalid { setting: format!("class {:?}", c.name), message });
            }
            if c.quota.is_some() && self.store.engine != StoreEngine::Disk {
                return Err(ConfigError::Invalid {
                    setting: format!("class {:?}", c.name),
                    message: "quota needs [store] engine = \"disk\" (the memory engine has its own memory_max_points)"
                        .into(),
                });
            }
            if c.archive && self.tier.url.is_empty() {
                return invalid("tier.url", "a class has archive = true: name the archive (a directory or s3://...)");
            }
        }
        self.tier.validate()?;
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
}

/// The configuration in force: replaced whole by a reconfiguration, so a reader takes one
/// snapshot ([`Live::get`]) and uses it throughout. Clones share it.
#[derive(Clone, Debug)]
pub struct Live(Arc<RwLock<Arc<NodeConfig>>>);

impl Live {
    pub fn new(config: NodeConfig) -> Live {
        Live(Arc::new(RwLock::new(Arc::new(config))))
    }

    /// The configuration in force now.
    pub fn get(&self) -> Arc<NodeConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `config` in force for every holder.
    pub fn set(&self, config: NodeConfig) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
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
    fn bad_settings_are_explained() {
        let err = toml::from_str::<NodeConfig>("lissen = \"1.2.3.4:5\"").unwrap_err().to_string();
        assert!(err.contains("lissen"), "{err}");
        let cfg: NodeConfig = toml::from_str("[[class]]\nname = \"x\"\nrf = 2\nw = 3\n").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("class \"x\"") && err.contains("w=3"), "{err}");
        let cfg: NodeConfig = toml::from_str("[[class]]\nname = \"q\"\nquantum = \"0s\"\n").unwrap();
        assert!(cfg.validate().unwrap_err().to_string().contains("quantum"));
    }
}

//! `[[class]]`: the series classes as the file writes them, the class table built from them,
//! and the store's retention rules derived from them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::class::{AgeBy, Classes, Replication, SeriesClass};
use timeshard_proto::{KeyFormat, QuantumLen};

use super::error::ConfigError;
pub use timeshard_control_api::class::{ByteSize, OnFull};

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
    /// With `archive = true`: classes with a higher priority are exported first in each round
    /// (0 to 255, default 0), so a small uplink sends the important ones first.
    #[serde(skip_serializing_if = "is_zero")]
    pub export_priority: u8,
    /// What the hot window and retention measure: `event` time (default) or `write` time.
    pub age_by: AgeBy,
    /// Context-of-interest replication (placement by the series' location); `rf`, `w` and `r`
    /// are then derived from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coi: Option<CoiConfig>,
    /// Most bytes the class may hold in this node's store (e.g. `"2GiB"`); unset: no quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<ByteSize>,
    /// At its quota: `refuse` writes (default) or `evict_oldest` (see [`OnFull`]).
    #[serde(skip_serializing_if = "OnFull::is_refuse")]
    pub on_full: OnFull,
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
            export_priority: 0,
            age_by: AgeBy::Event,
            coi: None,
            quota: None,
            on_full: OnFull::Refuse,
        }
    }
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// The class table of `configs` (see `NodeConfig::class_table`).
pub fn table(configs: &[ClassConfig]) -> Result<Classes, ConfigError> {
    let mut classes = Vec::with_capacity(configs.len());
    for c in configs {
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

/// The store's retention rules for `classes` (see `NodeConfig::retention_rules`).
pub fn retention_rules(classes: &[ClassConfig]) -> Vec<timeshard_store::RetentionRule> {
    use timeshard_store::RetentionRule;
    let keep = |c: &ClassConfig| c.retention.map(|r| i64::try_from(r.as_nanos()).unwrap_or(i64::MAX));
    // The store measures event time; write-time retention is the cold tier's.
    let store_keep = |c: &ClassConfig| if c.age_by == AgeBy::Write { None } else { keep(c) };
    let mut rules: Vec<RetentionRule> = classes
        .iter()
        .map(|c| RetentionRule { metric_prefix: c.metric_prefix.clone(), keep_ns: store_keep(c) })
        .collect();
    if !classes.iter().any(|c| c.metric_prefix.is_empty()) {
        rules.push(RetentionRule::forever(""));
    }
    let reserved = timeshard_proto::key::RESERVED_METRIC_PREFIX;
    if !rules.iter().any(|r| r.metric_prefix == reserved) {
        // Any rule that keeps forever (the implicit catch-all too) makes this forever, and
        // so do classes whose data outlives their event-time age: archived ones (the index
        // finds cold quanta too) and those aged by write time.
        let outlived = classes.iter().any(|c| c.archive || c.age_by == AgeBy::Write);
        let longest =
            rules.iter().map(|r| r.keep_ns).try_fold(0i64, |acc, k| k.map(|k| acc.max(k))).filter(|_| !outlived);
        rules.push(RetentionRule { metric_prefix: reserved.to_string(), keep_ns: longest });
    }
    rules
}

/// The store's quota rules for `classes` (see `NodeConfig::quota_rules`): one per class, so
/// each series counts under the class that owns it, and timeshard's own series under none.
/// Archived classes never evict in the store: the tier drops their blocks once archived.
pub fn quota_rules(classes: &[ClassConfig]) -> Vec<timeshard_store::QuotaRule> {
    use timeshard_store::QuotaRule;
    if classes.iter().all(|c| c.quota.is_none()) {
        return Vec::new();
    }
    let mut rules: Vec<QuotaRule> = classes
        .iter()
        .map(|c| QuotaRule {
            metric_prefix: c.metric_prefix.clone(),
            max_bytes: c.quota.map(|q| q.0),
            evict_oldest: c.on_full == OnFull::EvictOldest && !c.archive,
        })
        .collect();
    for unlimited in ["", timeshard_proto::key::RESERVED_METRIC_PREFIX] {
        if !rules.iter().any(|r| r.metric_prefix == unlimited) {
            rules.push(QuotaRule { metric_prefix: unlimited.into(), max_bytes: None, evict_oldest: false });
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::super::NodeConfig;
    use super::OnFull;

    #[test]
    fn quotas_are_checked_and_become_one_store_rule_per_class() {
        let class = |extra: &str| format!("[[class]]\nname = \"t\"\nmetric_prefix = \"t.\"\n{extra}\n");
        let cfg: NodeConfig = toml::from_str(&class("quota = \"2GiB\"\non_full = \"evict_oldest\"")).unwrap();
        cfg.validate().unwrap();
        assert_eq!((cfg.classes[0].quota.unwrap().0, cfg.classes[0].on_full), (2 << 30, OnFull::EvictOldest));
        let rules = cfg.quota_rules();
        let rule = |prefix: &str| rules.iter().find(|r| r.metric_prefix == prefix).cloned();
        assert_eq!(rule("t.").map(|r| (r.max_bytes, r.evict_oldest)), Some((Some(2 << 30), true)));
        assert_eq!(rule("").map(|r| r.max_bytes), Some(None), "the rest counts under no quota");
        let reserved = rule(timeshard_proto::key::RESERVED_METRIC_PREFIX);
        assert_eq!(reserved.map(|r| r.max_bytes), Some(None), "timeshard's own series are never evicted");
        assert!(NodeConfig::default().quota_rules().is_empty(), "no quota, nothing measured");
        for (bad, says) in [
            ("export_priority = 3", "archived classes only"),
            ("on_full = \"evict_oldest\"", "needs a quota"),
            ("quota = \"1KiB\"", "below the smallest"),
            ("quota = \"1 parsec\"", "parsec"),
            ("quota = \"1MiB\"\non_full = \"sometimes\"", "sometimes"),
        ] {
            let err = match toml::from_str::<NodeConfig>(&class(bad)) {
                Ok(cfg) => cfg.validate().unwrap_err().to_string(),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{bad}: {err}");
        }
        let memory = format!("[store]\nengine = \"memory\"\n{}", class("quota = \"1MiB\""));
        let err = toml::from_str::<NodeConfig>(&memory).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("engine = \"disk\""), "{err}");
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

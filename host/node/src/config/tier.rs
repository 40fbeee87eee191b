//! `[tier]`: the archive of the cold tier and how the node exports to it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

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
    /// Read exports of an archive written before node folders (`points/` and `manifests/` at
    /// its top, unsealed) as unverified. Turn off once `timeshard archive status` shows no
    /// legacy exports, so nothing unsealed is ever read.
    pub read_legacy: bool,
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
            read_legacy: true,
        }
    }
}

impl TierConfig {
    /// Checks settings that have no valid default when given badly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = self;
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
    use std::path::Path;

    use timeshard_proto::class::AgeBy;

    use super::super::{ClassConfig, NodeConfig};
    use super::*;

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
}

//! Policy modules and their rollouts as the HTTP API and desired state carry them: what a node
//! is told to run ([`PolicyAssignment`]), what it reports back ([`PolicyRun`], [`PolicyLoadError`]),
//! and the requests and answers of `policy upload|list|show` and `rollout start|status|...`.
//! Which node runs which version when is decided in `rollout`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
pub use timeshard_policy::Kind;

use crate::selector::Selector;

/// Largest module the control plane accepts (and a node fetches).
pub const MAX_MODULE_BYTES: usize = 4 << 20;

/// Longest offline signature an upload may carry, in its hex form (a signature file is about
/// 400 bytes).
pub const MAX_UPLOAD_SIGNATURE: usize = 4096;
/// Most stages of a rollout (canary and waves).
pub const MAX_STAGES: usize = 16;
/// Most settings (`config` values) of one policy.
pub const MAX_SETTINGS: usize = 64;

/// Which series a policy applies to on the nodes that run it: as `select` of a node's
/// `[[policy.bindings]]` (the metric prefix, and tags that must all be present).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesSelector {
    #[serde(default)]
    pub metric_prefix: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

impl SeriesSelector {
    /// Checks lengths (series keys are short).
    pub fn validate(&self) -> Result<(), String> {
        let long = self.metric_prefix.len() > 256 || self.tags.iter().any(|(k, v)| k.len() > 256 || v.len() > 256);
        if long || self.tags.len() > 32 {
            return Err("a series selector has a metric prefix and at most 32 tags of up to 256 bytes".into());
        }
        Ok(())
    }
}

impl fmt::Display for SeriesSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tags: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        match (self.metric_prefix.is_empty(), tags.is_empty()) {
            (true, true) => f.write_str("every series"),
            (false, true) => write!(f, "{}*", self.metric_prefix),
            (true, false) => write!(f, "*{{{}}}", tags.join(",")),
            (false, false) => write!(f, "{}*{{{}}}", self.metric_prefix, tags.join(",")),
        }
    }
}

/// How nodes run a policy: as `[[policy.modules]]` settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// Store a batch unprocessed when the ingest policy fails, instead of refusing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_through: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Values given to the policy with every call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
}

impl PolicySettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.config.len() > MAX_SETTINGS || self.config.iter().any(|(k, v)| k.len() > 256 || v.len() > 1024) {
            return Err(format!("at most {MAX_SETTINGS} config values, names up to 256 bytes, values up to 1024"));
        }
        if self.deadline_ms.is_some_and(|d| d == 0 || d > 60_000) {
            return Err("deadline_ms must be between 1 and 60000".into());
        }
        if self.memory_mib.is_some_and(|m| m == 0 || m > 4096) {
            return Err("memory_mib must be between 1 and 4096".into());
        }
        Ok(())
    }
}

/// One module a node is told to run, with what it needs to fetch and verify it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyAssignment {
    pub name: String,
    pub version: String,
    pub kind: Kind,
    /// SHA-256 of the module (hex): fetched from `GET /v1/node/modules/{sha256}`, cached by it.
    pub sha256: String,
    pub size: u64,
    /// The detached signature (text) by the fleet's policy key, over the hash and identity.
    pub signature: String,
    /// Bound to `series`. An unbound module is only installed: during a rollout a node keeps
    /// the version it ran before, so queries pinned to that version still run here.
    pub bound: bool,
    #[serde(default)]
    pub series: SeriesSelector,
    #[serde(default)]
    pub settings: PolicySettings,
}

impl PolicyAssignment {
    /// `name@version`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// One policy module a node runs, with what its calls cost since it was installed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRun {
    pub name: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    #[serde(default)]
    pub calls: u64,
    /// Time spent in calls, microseconds.
    #[serde(default)]
    pub time_us: u64,
    /// The most linear memory one call used.
    #[serde(default)]
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub traps: u64,
    #[serde(default)]
    pub timeouts: u64,
    /// Calls that failed otherwise (limits, errors the policy returned).
    #[serde(default)]
    pub failures: u64,
    /// Ingest policies: points in the batches they were given, and points they refused.
    #[serde(default)]
    pub points: u64,
    #[serde(default)]
    pub rejected: u64,
}

impl PolicyRun {
    /// Calls that trapped, timed out or failed.
    pub fn failed_calls(&self) -> u64 {
        self.traps + self.timeouts + self.failures
    }
}

/// A module a node was told to run (or configured with) and could not load: it keeps running
/// the version it had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyLoadError {
    pub name: String,
    pub version: String,
    pub error: String,
}

/// `POST /v1/policies?name=N&version=V&kind=K[&min_version=M]` (operator): the body is the
/// module's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    pub name: String,
    pub version: String,
    /// `ingest` or `query`; text so that a wrong one gets a clear answer.
    pub kind: String,
    /// Revoke the versions of this name below this one (a semantic version, at most
    /// `version`): the signature carries it, and nodes that install the module refuse them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<String>,
    /// The module's offline signature (a control plane started with `--policy-public-key`):
    /// the signature file's text in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl UploadQuery {
    /// The offline signature's text, if the upload carries one.
    pub fn signature_text(&self) -> Result<Option<String>, String> {
        let Some(encoded) = &self.signature else { return Ok(None) };
        if encoded.len() > MAX_UPLOAD_SIGNATURE {
            return Err(format!("the signature is {} bytes long, more than {MAX_UPLOAD_SIGNATURE}", encoded.len()));
        }
        let bytes = crate::token::unhex(encoded).ok_or("the signature is not hex")?;
        String::from_utf8(bytes).map(Some).map_err(|_| "the signature is not text".to_string())
    }

    /// `text` as the `signature` parameter carries it.
    pub fn encode_signature(text: &str) -> String {
        crate::token::hex(text.as_bytes())
    }
}

/// One uploaded version (`policy list`, `policy show`, and the answer to an upload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyVersionInfo {
    pub name: String,
    pub version: String,
    pub kind: Kind,
    pub sha256: String,
    pub size: u64,
    pub uploaded_by: String,
    pub uploaded_at_ms: i64,
    /// The signature the control plane made with the fleet's policy key.
    pub signature: String,
    /// Nodes that report running it.
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// Answer to an upload: the version, and whether this call stored it (false: the same bytes
/// were already uploaded under this name and version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uploaded {
    pub policy: PolicyVersionInfo,
    pub created: bool,
}

/// A rollout's plan: which version, to which devices, for which series, in which stages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    pub policy: String,
    pub version: String,
    /// Devices, by labels and/or geohash prefix (empty: every device).
    #[serde(default)]
    pub selector: Selector,
    /// Series on those devices.
    #[serde(default)]
    pub series: SeriesSelector,
    #[serde(default)]
    pub settings: PolicySettings,
    /// Nodes of the first stage (0: no canary).
    #[serde(default)]
    pub canary: u32,
    /// Percentages of the targeted nodes each further stage reaches, rising, the last 100.
    pub waves: Vec<u32>,
    /// Abort (and go back) when the failure ratio passes this, in percent.
    pub abort_above_pct: f64,
}

/// `POST /v1/rollouts` (operator).
pub type StartRollout = RolloutSpec;

/// Where a rollout is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutState {
    /// Its reached stages run the new version; failures are watched.
    Running,
    /// As running, but not promoted until resumed.
    Paused,
    /// Its last stage was reached: the version is the stable one for its devices.
    Completed,
    /// Failures passed the threshold: back to the previous version, automatically.
    Aborted,
    /// Rolled back by an operator.
    RolledBack,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::Completed => "completed",
            RolloutState::Aborted => "aborted",
            RolloutState::RolledBack => "rolled-back",
        }
    }

    /// Whether it still decides what nodes run (running or paused).
    pub fn is_active(self) -> bool {
        matches!(self, RolloutState::Running | RolloutState::Paused)
    }

    pub fn parse(s: &str) -> Option<RolloutState> {
        [Self::Running, Self::Paused, Self::Completed, Self::Aborted, Self::RolledBack]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

impl fmt::Display for RolloutState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stage of a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInfo {
    /// `canary` or `25%`.
    pub label: String,
    /// Targeted nodes it reaches, counting the stages before.
    pub nodes: u32,
}

/// One targeted node of a rollout, with what it reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutNode {
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    /// The first stage that reaches it; `None` for a node that joined the selector after the
    /// rollout started (it runs the stable version until the rollout completes).
    pub stage: Option<u32>,
    /// The version it should run now (`None`: none of this policy).
    pub desired: Option<String>,
    /// The version it reports running.
    pub running: Option<String>,
    /// Its calls and failed calls of the version it runs.
    pub calls: u64,
    pub failed_calls: u64,
    pub load_error: Option<String>,
    pub last_seen_ms: Option<i64>,
}

/// `GET /v1/rollouts/{policy}` (viewer): the policy's latest rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutStatus {
    pub id: String,
    pub spec: RolloutSpec,
    pub kind: Kind,
    pub state: RolloutState,
    /// Index into `stages` of the stage reached.
    pub stage: u32,
    pub stages: Vec<StageInfo>,
    /// Why it ended, or what an operator said.
    pub reason: Option<String>,
    pub created_by: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub nodes: Vec<RolloutNode>,
}

/// `POST /v1/rollouts/{policy}/{promote|pause|resume|rollback}` (operator).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutAction {
    #[serde(default)]
    pub reason: Option<String>,
}

/// Parses `25%,100%` (the CLI's wave syntax; the `%` is optional).
pub fn parse_waves(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| {
            w.trim_end_matches('%').parse::<u32>().map_err(|_| format!("wave {w:?} must be a percentage such as 25%"))
        })
        .collect()
}

/// Parses `5%` or `5` (percent).
pub fn parse_percent(text: &str) -> Result<f64, String> {
    let v: f64 =
        text.trim().trim_end_matches('%').parse().map_err(|_| format!("{text:?} must be a percentage such as 5%"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{text:?} must be between 0% and 100%"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_and_percentages_parse() {
        assert_eq!(parse_waves("25%, 100%").unwrap(), vec![25, 100]);
        assert_eq!(parse_waves("50,100").unwrap(), vec![50, 100]);
        assert!(parse_waves("half").unwrap_err().contains("percentage"));
        assert_eq!(parse_percent("5%").unwrap(), 5.0);
        assert!(parse_percent("120%").is_err());
        assert_eq!(RolloutState::parse("rolled-back"), Some(RolloutState::RolledBack));
    }

    #[test]
    fn selectors_show_what_they_pick() {
        let mut s = SeriesSelector { metric_prefix: "pmu.".into(), ..Default::default() };
        assert_eq!(s.to_string(), "pmu.*");
        s.tags.insert("site".into(), "atl".into());
        assert_eq!(s.to_string(), "pmu.*{site=atl}");
        assert_eq!(SeriesSelector::default().to_string(), "every series");
    }
}

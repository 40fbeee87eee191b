//! The HTTP API's requests and answers (JSON). Paths are in [`paths`]; every error answer is an
//! [`ErrorBody`].
//!
//! Device endpoints authenticate with the node's certificate (mutual TLS), except enrollment,
//! which carries the one-time token. Everything else takes `Authorization: Bearer <API token>`,
//! whose [`Role`] decides what it may do.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::class::ClassSpec;
use crate::geo::Location;
use crate::selector::Selector;
use crate::state::{DesiredState, NodeConfigEntry, NodeSettings};

/// Request paths.
pub mod paths {
    pub const HEALTH: &str = "/healthz";
    pub const FLEET: &str = "/v1/fleet";
    pub const ENROLL: &str = "/v1/enroll";
    pub const RENEW: &str = "/v1/node/renew";
    pub const WATCH: &str = "/v1/node/watch";
    pub const REPORT: &str = "/v1/node/report";
    pub const ENROLLMENT_TOKENS: &str = "/v1/enrollment-tokens";
    pub const API_TOKENS: &str = "/v1/api-tokens";
    pub const HTTP_TOKENS: &str = "/v1/http-tokens";
    pub const CLASSES: &str = "/v1/classes";
    pub const NODE_CONFIGS: &str = "/v1/node-configs";
    pub const DEVICES: &str = "/v1/devices";
    pub const AUDIT: &str = "/v1/audit";
    /// `POST` uploads (`?name=&version=&kind=`, the body is the module); `GET` lists.
    pub const POLICIES: &str = "/v1/policies";
    /// `POST` starts a rollout; `GET /v1/rollouts/{policy}` its latest one's status; `POST
    /// /v1/rollouts/{policy}/{promote|pause|resume|rollback}`.
    pub const ROLLOUTS: &str = "/v1/rollouts";
    /// `GET /v1/node/modules/{sha256}` (node certificate): a module's bytes.
    pub const MODULES: &str = "/v1/node/modules";
}

/// Longest a watch may wait for a change; longer requests are cut to this.
pub const MAX_WATCH_WAIT_MS: u64 = 60_000;

/// What an API token may do. Each role includes the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything: classes, node configurations, devices, audit.
    Viewer,
    /// Also changes desired state, creates enrollment tokens, revokes devices.
    Operator,
    /// Also creates and revokes API tokens.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Operator, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}; roles are admin, operator and viewer")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownRole(s.to_string()))
    }
}

/// Every error answer: a stable machine-readable `code` and a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub error: String,
}

/// `GET /v1/fleet` (any role).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetInfo {
    /// SHA-256 of the fleet CA's public key, as in tokens.
    pub ca_fingerprint: String,
    pub ca_pem: String,
    pub generation: u64,
    pub digest: String,
    /// The fleet's policy public key, which signs every module the control plane hands out
    /// (made at the first upload).
    #[serde(default)]
    pub policy_key: Option<String>,
}

/// `POST /v1/enroll`: a device presents its token and a CSR for the key it made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    pub token: String,
    pub csr_pem: String,
}

/// Answer to enrollment and renewal: the certificate and the fleet CA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Issued {
    /// The node id the certificate binds (SHA-1 of the public key, 40 hex digits).
    pub node_id: String,
    pub certificate_pem: String,
    pub ca_pem: String,
    /// Expiry of the certificate, Unix milliseconds.
    pub not_after_ms: i64,
}

/// `POST /v1/enroll` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnrollResponse {
    pub issued: Issued,
    pub desired: DesiredState,
}

/// `POST /v1/node/renew` (node certificate): a CSR for the same key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    pub csr_pem: String,
}

/// `GET /v1/node/watch?since=G&wait_ms=W` (node certificate): answers the node's desired state
/// as soon as the generation passes `since`, or `304 Not Modified` after `wait_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchQuery {
    pub since: u64,
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// How a node is doing, as it reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    Degraded,
    Failing,
}

/// `POST /v1/node/report` (node certificate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Generation of the desired state the node runs.
    pub generation_applied: u64,
    /// Its digest, as the node computed it.
    pub digest_applied: String,
    pub health: HealthStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A newer generation the node could not apply, and why (it keeps running the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_error: Option<ApplyError>,
    /// Policy modules the node runs, with what their calls cost.
    #[serde(default)]
    pub policies: Vec<PolicyRun>,
    /// Modules it could not load (it runs the versions it had).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_errors: Vec<PolicyLoadError>,
    /// How full the node is and how far behind (disk, quotas, archive export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageStatus>,
}

pub use timeshard_proto::wire::{ClassStorage, StorageStatus};

/// A desired state a node refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyError {
    pub generation: u64,
    pub message: String,
}

pub use crate::policy::{PolicyLoadError, PolicyRun};

/// `POST /v1/enrollment-tokens` (operator).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEnrollmentToken {
    /// Labels the enrolled device gets.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub location: Option<Location>,
    /// Seconds until the token expires.
    pub expires_in_s: u64,
}

/// A token just created; the only time its secret is shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCreated {
    pub token: String,
    pub id: String,
    pub expires_at_ms: Option<i64>,
}

/// `GET /v1/enrollment-tokens` (viewer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnrollmentTokenInfo {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub location: Option<Location>,
    pub created_by: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub used_at_ms: Option<i64>,
    pub used_by: Option<String>,
}

/// `POST /v1/api-tokens` (admin). `role` is text so that an unknown one gets a clear answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateApiToken {
    pub name: String,
    pub role: String,
    #[serde(default)]
    pub expires_in_s: Option<u64>,
}

/// `GET /v1/api-tokens` (admin).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenInfo {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_by: String,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
}

/// `POST /v1/http-tokens` (operator): a token for the HTTP side of the selected nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateHttpToken {
    pub name: String,
    /// Which nodes accept it (empty: every node).
    #[serde(default)]
    pub selector: Selector,
    #[serde(default)]
    pub expires_in_s: Option<u64>,
}

/// `GET /v1/http-tokens` (viewer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpTokenInfo {
    pub id: String,
    pub name: String,
    pub selector: Selector,
    pub created_by: String,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
}

/// `PUT /v1/classes` (operator): adds or changes these classes, all or none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutClasses {
    pub classes: Vec<ClassSpec>,
}

/// `PUT /v1/node-configs/{name}` (operator).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutNodeConfig {
    #[serde(default)]
    pub selector: Selector,
    #[serde(default)]
    pub priority: i32,
    pub settings: NodeSettings,
    /// Accept a selector that matches no enrolled device (for devices that enroll later).
    #[serde(default)]
    pub allow_empty: bool,
}

/// Answer to every change of desired state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    /// The generation the change created.
    pub generation: u64,
    /// For node configurations: how many enrolled devices the selector matches now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<u64>,
}

/// `GET /v1/node-configs` (viewer).
pub type NodeConfigList = Vec<NodeConfigEntry>;

/// `POST /v1/devices/{node_id}/revoke` (operator).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeDevice {
    #[serde(default)]
    pub reason: Option<String>,
}

/// `PUT /v1/devices/{node_id}/location` (operator): where the device is from now on (`None`
/// clears it). The node gossips it and places context-of-interest data by it; it wins over a
/// `location` in the node's own file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetDeviceLocation {
    pub location: Option<Location>,
}

/// `GET /v1/devices` (viewer): one enrolled device and what it last reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    pub location: Option<Location>,
    pub enrolled_at_ms: i64,
    /// Enrollment token it used.
    pub token_id: String,
    pub cert_serial: String,
    pub cert_not_after_ms: i64,
    pub revoked_at_ms: Option<i64>,
    pub last_seen_ms: Option<i64>,
    pub generation_applied: Option<u64>,
    pub digest_applied: Option<String>,
    pub health: Option<HealthStatus>,
    pub message: Option<String>,
    pub apply_error: Option<ApplyError>,
    pub policies: Vec<PolicyRun>,
    #[serde(default)]
    pub policy_errors: Vec<PolicyLoadError>,
    /// As the node last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageStatus>,
}

/// `GET /v1/audit?limit=N&before=ID` (viewer): newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Sortable id: time then a random part.
    pub id: String,
    pub at_ms: i64,
    /// `token:<id> (<name>)` for API tokens, `device:<node id>` for devices, `enrollment:<token id>`.
    pub actor: String,
    pub action: String,
    pub target: String,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// Query of `GET /v1/audit`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub before: Option<String>,
}

//! Desired state: what the control plane wants one node to run, and how it is computed from
//! the fleet's classes and per-selector node configurations. Pure functions, no I/O, so the
//! service and the node compute the same thing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::class::ClassSpec;
use crate::geo::Location;
use crate::policy::PolicyAssignment;
use crate::rollout::PolicyTable;
pub use crate::selector::{Selector, parse_labels, validate_labels};
use crate::token::{hex, sha256};

/// Version of the [`DesiredState`] document. A node that meets a higher one reports that it
/// cannot apply it (and keeps running what it has) instead of half-understanding it.
pub const STATE_FORMAT: u32 = 1;

/// Limits that may differ between nodes and change while a node runs. Wire limits (message
/// and batch sizes) must be the same on every node and are not here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_parallelism: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_quanta_per_page: Option<u32>,
}

/// The names [`LimitSettings::set`] accepts.
pub const LIMIT_NAMES: &[&str] =
    &["max_concurrent_requests", "max_connections", "read_parallelism", "max_quanta_per_page"];

impl LimitSettings {
    /// Sets the limit called `name` (`max_connections=...`, as the CLI writes it).
    pub fn set(&mut self, name: &str, value: u32) -> Result<(), String> {
        if value == 0 || value > 1_000_000 {
            return Err(format!("limit {name}={value}: must be between 1 and 1000000"));
        }
        let slot = match name {
            "max_concurrent_requests" => &mut self.max_concurrent_requests,
            "max_connections" => &mut self.max_connections,
            "read_parallelism" => &mut self.read_parallelism,
            "max_quanta_per_page" => &mut self.max_quanta_per_page,
            _ => {
                return Err(format!(
                    "unknown limit {name:?}; limits that can be set per node: {}",
                    LIMIT_NAMES.join(", ")
                ));
            }
        };
        *slot = Some(value);
        Ok(())
    }

    fn fields(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("max_connections", self.max_connections),
            ("read_parallelism", self.read_parallelism),
            ("max_quanta_per_page", self.max_quanta_per_page),
        ]
    }

    /// Checks every set limit.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in self.fields() {
            if let Some(v) = value {
                LimitSettings::default().set(name, v)?;
            }
        }
        Ok(())
    }

    /// `other`'s set limits override ours.
    fn overlay(&mut self, other: &LimitSettings) {
        let pick = |a: &mut Option<u32>, b: Option<u32>| {
            if b.is_some() {
                *a = b;
            }
        };
        pick(&mut self.max_concurrent_requests, other.max_concurrent_requests);
        pick(&mut self.max_connections, other.max_connections);
        pick(&mut self.read_parallelism, other.read_parallelism);
        pick(&mut self.max_quanta_per_page, other.max_quanta_per_page);
    }
}

/// Settings one node configuration gives to the devices it selects. Unset fields leave what
/// lower-priority configurations (or the node's own file) say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    /// Addresses (`host:port`) of nodes to join through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Vec<String>>,
    #[serde(default)]
    pub limits: LimitSettings,
}

impl NodeSettings {
    /// Checks bootstrap addresses and limits.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(peers) = &self.bootstrap {
            if peers.len() > 64 {
                return Err("at most 64 bootstrap peers".into());
            }
            for p in peers {
                let ok = p.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return Err(format!("bootstrap peer {p:?} must be host:port"));
                }
            }
        }
        self.limits.validate()
    }
}

/// A named node configuration: settings for the devices a selector picks. Where several
/// select a device, they apply in ascending `priority` (then name), later ones overriding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfigEntry {
    pub name: String,
    #[serde(default)]
    pub selector: Selector,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub settings: NodeSettings,
}

/// What the control plane wants one node to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    /// [`STATE_FORMAT`] of the service that wrote it.
    pub format: u32,
    /// Fleet-wide generation: every change to the desired state of any node raises it.
    pub generation: u64,
    /// [`fleet_digest`] of `classes` and `revoked`: what every node must agree on. Nodes
    /// exchange it so that one running an older configuration is visible.
    pub digest: String,
    /// The node this is for (40 hex digits, the node's id).
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    pub location: Option<Location>,
    /// Peers to join through (empty: keep the node's own).
    pub bootstrap: Vec<String>,
    pub limits: LimitSettings,
    pub classes: Vec<ClassSpec>,
    /// Node ids whose certificates are revoked and not yet expired: peers refuse them.
    pub revoked: Vec<String>,
    /// The fleet's policy public key (text): the node trusts modules it signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_key: Option<String>,
    /// Policy modules the node runs (the `rollout` module decides which version when).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyAssignment>,
    /// Tokens the node's HTTP side accepts besides its configured `[http] tokens`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_tokens: Vec<HttpTokenGrant>,
    /// `revoked`, signed with the fleet CA's key: nodes gossip it, so that nodes cut off from
    /// the control plane learn it from any neighbour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocations: Option<SignedRevocationList>,
}

/// What the control plane signs of its revocations ([`SignedRevocationList::body`], JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevocationList {
    /// The fleet generation it was made at: a node takes a list only over an older one.
    pub generation: u64,
    /// When it was signed (milliseconds since the epoch).
    pub issued_at_ms: i64,
    /// How long after `issued_at_ms` nodes count it as current; an older one still applies
    /// and is reported as stale.
    pub max_age_ms: i64,
    /// Node ids (40 hex digits) whose certificates are revoked and not yet expired.
    pub revoked: Vec<String>,
}

/// A [`RevocationList`] signed with the fleet CA's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRevocationList {
    pub generation: u64,
    /// The JSON of the [`RevocationList`], exactly as signed.
    pub body: String,
    /// The TLS `SignatureScheme` code of `signature`.
    pub scheme: u16,
    /// Hex.
    pub signature: String,
}

/// An HTTP token as a node holds it: its id and the SHA-256 of its secret, never the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpTokenGrant {
    /// The token's public id (16 hex digits).
    pub id: String,
    /// The name it was created with (for logs).
    pub name: String,
    /// SHA-256 of the secret, hex ([`crate::Token::secret_hash`]).
    pub secret_hash: String,
    /// When nodes stop accepting it (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// An unrevoked HTTP token with the nodes it is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpTokenEntry {
    pub grant: HttpTokenGrant,
    pub selector: Selector,
}

/// Digest of what every node must agree on: SHA-256 (hex) of the class table sorted by name
/// and the sorted revocation list.
pub fn fleet_digest(classes: &[ClassSpec], revoked: &[String]) -> String {
    let mut classes: Vec<&ClassSpec> = classes.iter().collect();
    classes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut revoked: Vec<&String> = revoked.iter().collect();
    revoked.sort();
    let doc = serde_json::to_vec(&(classes, revoked)).expect("class specs serialize");
    hex(&sha256(&doc))
}

/// The fleet-wide part of desired state at one generation; [`FleetState::for_node`] adds what
/// is particular to one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetState {
    pub generation: u64,
    pub classes: Vec<ClassSpec>,
    pub node_configs: Vec<NodeConfigEntry>,
    pub revoked: Vec<String>,
    pub digest: String,
    /// Policy modules, placements and active rollouts.
    pub policies: PolicyTable,
    /// Unrevoked HTTP tokens.
    pub http_tokens: Vec<HttpTokenEntry>,
    /// `revoked`, signed by the control plane.
    pub revocations: Option<SignedRevocationList>,
}

impl FleetState {
    /// Sorts and digests.
    pub fn new(
        generation: u64,
        mut classes: Vec<ClassSpec>,
        mut node_configs: Vec<NodeConfigEntry>,
        mut revoked: Vec<String>,
    ) -> FleetState {
        classes.sort_by(|a, b| a.name.cmp(&b.name));
        node_configs.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        revoked.sort();
        let digest = fleet_digest(&classes, &revoked);
        FleetState {
            generation,
            classes,
            node_configs,
            revoked,
            digest,
            policies: PolicyTable::default(),
            http_tokens: Vec::new(),
            revocations: None,
        }
    }

    /// This state with its revocation list signed.
    pub fn with_revocations(mut self, signed: SignedRevocationList) -> FleetState {
        self.revocations = Some(signed);
        self
    }

    /// This state with the fleet's policies.
    pub fn with_policies(mut self, policies: PolicyTable) -> FleetState {
        self.policies = policies;
        self
    }

    /// This state with the fleet's unrevoked HTTP tokens.
    pub fn with_http_tokens(mut self, mut tokens: Vec<HttpTokenEntry>) -> FleetState {
        tokens.sort_by(|a, b| a.grant.id.cmp(&b.grant.id));
        self.http_tokens = tokens;
        self
    }

    /// The desired state of the device `node_id` with `labels` at `location`.
    pub fn for_node(
        &self,
        node_id: &str,
        labels: &BTreeMap<String, String>,
        location: Option<&Location>,
    ) -> DesiredState {
        let mut settings = NodeSettings::default();
        for entry in self.node_configs.iter().filter(|e| e.selector.matches(labels, location)) {
            if entry.settings.bootstrap.is_some() {
                settings.bootstrap = entry.settings.bootstrap.clone();
            }
            settings.limits.overlay(&entry.settings.limits);
        }
        DesiredState {
            format: STATE_FORMAT,
            generation: self.generation,
            digest: self.digest.clone(),
            node_id: node_id.to_string(),
            labels: labels.clone(),
            location: location.cloned(),
            bootstrap: settings.bootstrap.unwrap_or_default(),
            limits: settings.limits,
            classes: self.classes.clone(),
            revoked: self.revoked.clone(),
            policy_key: self.policies.key.clone(),
            policies: self.policies.for_node(node_id, labels, location),
            http_tokens: self
                .http_tokens
                .iter()
                .filter(|t| t.selector.matches(labels, location))
                .map(|t| t.grant.clone())
                .collect(),
            revocations: self.revocations.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> BTreeMap<String, String> {
        parse_labels(text).unwrap()
    }

    #[test]
    fn node_configs_apply_in_priority_order() {
        let mut wide = NodeConfigEntry {
            name: "all".into(),
            selector: Selector::default(),
            priority: 0,
            settings: NodeSettings { bootstrap: Some(vec!["a:1".into()]), limits: LimitSettings::default() },
        };
        wide.settings.limits.set("max_connections", 100).unwrap();
        wide.settings.limits.set("read_parallelism", 8).unwrap();
        let mut atl = NodeConfigEntry {
            name: "atl".into(),
            selector: Selector { labels: labels("site=atl"), geohash: None },
            priority: 10,
            settings: NodeSettings::default(),
        };
        atl.settings.limits.set("max_connections", 50).unwrap();
        let fleet = FleetState::new(7, vec![ClassSpec::new("pmu", "pmu.")], vec![atl, wide], vec![]);
        let d = fleet.for_node("n1", &labels("site=atl"), None);
        assert_eq!(d.bootstrap, vec!["a:1".to_string()]);
        assert_eq!((d.limits.max_connections, d.limits.read_parallelism), (Some(50), Some(8)));
        let d = fleet.for_node("n2", &labels("site=sfo"), None);
        assert_eq!(d.limits.max_connections, Some(100));
        assert_eq!(d.generation, 7);
        assert!(LimitSettings::default().set("max_message_bytes", 5).unwrap_err().contains("unknown limit"));
    }

    #[test]
    fn http_tokens_reach_the_selected_nodes_only() {
        let grant = |id: &str| HttpTokenGrant {
            id: id.into(),
            name: format!("t{id}"),
            secret_hash: "00".repeat(32),
            expires_at_ms: None,
        };
        let everyone = HttpTokenEntry { grant: grant("b"), selector: Selector::default() };
        let atl =
            HttpTokenEntry { grant: grant("a"), selector: Selector { labels: labels("site=atl"), geohash: None } };
        let fleet = FleetState::new(3, vec![], vec![], vec![]).with_http_tokens(vec![everyone, atl]);
        let ids = |d: DesiredState| d.http_tokens.into_iter().map(|g| g.id).collect::<Vec<_>>();
        assert_eq!(ids(fleet.for_node("n1", &labels("site=atl"), None)), ["a", "b"]);
        assert_eq!(ids(fleet.for_node("n2", &labels("site=sfo"), None)), ["b"]);
        // A node's state file never carries a secret: only ids and hashes.
        let text = serde_json::to_string(&fleet.for_node("n1", &labels("site=atl"), None)).unwrap();
        assert!(text.contains("secret_hash") && !text.contains("\"secret\""), "{text}");
    }

    #[test]
    fn digest_ignores_order_but_not_content() {
        let a = ClassSpec::new("a", "a.");
        let mut b = ClassSpec::new("b", "b.");
        let d1 = fleet_digest(&[a.clone(), b.clone()], &["x".into(), "y".into()]);
        assert_eq!(d1, fleet_digest(&[b.clone(), a.clone()], &["y".into(), "x".into()]));
        b.rf = 5;
        assert_ne!(d1, fleet_digest(&[a.clone(), b.clone()], &["x".into(), "y".into()]));
        assert_ne!(d1, fleet_digest(&[a, ClassSpec::new("b", "b.")], &["x".into()]));
    }
}

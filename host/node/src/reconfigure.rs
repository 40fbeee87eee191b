//! Changing a running node's configuration without a restart, in two steps so that a change is
//! applied whole or not at all: [`Node::prepare`] checks a new configuration completely and
//! builds everything that could fail; [`Node::reconfigure`] then swaps it in and cannot fail.
//!
//! What may change while the node runs: the series classes (except a class's metric prefix,
//! key format and quantum, which decide where stored blocks live) with their retention, the
//! node's location (gossiped at once: CoI placement follows it), the bootstrap peers, the per-node limits (requests served at once, connections, read
//! parallelism, quanta per page) and the revoked node ids. Everything else (listen address,
//! data directory, TLS files, DHT settings, store, wire limits, policies, membership, hints,
//! repair, fault injection) needs a restart.

use std::collections::HashSet;
use std::sync::Arc;

use timeshard_proto::{Classes, Id};
use tracing::{info, warn};

use crate::config::{ClassConfig, ConfigError, LimitsConfig, NodeConfig, StoreConfig};
use crate::control::apply::config_digest_u64;
use crate::net::BindError;
use crate::node::Node;

/// A configuration this node cannot switch to while it runs.
#[derive(Debug, thiserror::Error)]
pub enum ReconfigureError {
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("{setting} cannot change while the node runs (restart it with the new setting)")]
    Fixed { setting: &'static str },
    #[error("class {class:?}: its {field} cannot change ({from} -> {to}): it decides where stored blocks live")]
    ClassIdentity { class: String, field: &'static str, from: String, to: String },
    #[error("revoked node id {0:?} is not 40 hexadecimal digits")]
    BadRevokedId(String),
    #[error("the new connection limit cannot be set up: {0}")]
    Endpoint(#[from] BindError),
}

/// A checked configuration, ready to swap in.
#[derive(Debug)]
pub struct Prepared {
    config: NodeConfig,
    classes: Classes,
    server: quinn::ServerConfig,
    revoked: HashSet<Id>,
    generation: u64,
    digest: u64,
}

impl Prepared {
    /// The configuration digest (first 64 bits) the node will report once this is in force.
    pub fn digest(&self) -> u64 {
        self.digest
    }
}

/// Parses revoked node ids (hex).
pub fn parse_revoked(ids: &[String]) -> Result<HashSet<Id>, ReconfigureError> {
    ids.iter().map(|s| s.parse::<Id>().map_err(|_| ReconfigureError::BadRevokedId(s.clone()))).collect()
}

/// `current` with the retention, tier (`hot`, `archive`, `age_by`) and quota (`quota`,
/// `on_full`) settings `file` gives each of its classes (by name), and its `[store] max_bytes`:
/// what SIGHUP applies to a node configured by hand. Classes the file adds or drops need a
/// restart.
pub fn with_reloadable_of(current: &NodeConfig, file: &NodeConfig) -> NodeConfig {
    let mut next = current.clone();
    for class in &mut next.classes {
        if let Some(f) = file.classes.iter().find(|f| f.name == class.name) {
            class.retention = f.retention;
            class.hot = f.hot;
            class.archive = f.archive;
            class.age_by = f.age_by;
            class.quota = f.quota;
            class.on_full = f.on_full;
        }
    }
    next.store.max_bytes = file.store.max_bytes;
    next
}

/// Refuses a change of the settings that need a restart.
fn check_fixed(old: &NodeConfig, new: &NodeConfig) -> Result<(), ReconfigureError> {
    let fixed = |setting| Err(ReconfigureError::Fixed { setting });
    if old.listen != new.listen {
        return fixed("listen");
    }
    if old.data_dir != new.data_dir {
        return fixed("data_dir");
    }
    if old.tls != new.tls {
        return fixed("[tls]");
    }
    if old.dht != new.dht {
        return fixed("[dht]");
    }
    // `max_bytes` is a limit the replicas check, not how the store is opened.
    let opened = |store: &StoreConfig| StoreConfig { max_bytes: None, ..store.clone() };
    if opened(&old.store) != opened(&new.store) {
        return fixed("[store]");
    }
    if old.policy != new.policy {
        return fixed("[policy]");
    }
    if old.membership != new.membership {
        return fixed("[membership]");
    }
    if old.hints != new.hints {
        return fixed("[hints]");
    }
    if old.repair != new.repair {
        return fixed("[repair]");
    }
    if old.tier != new.tier {
        return fixed("[tier]");
    }
    if old.testing != new.testing {
        return fixed("[testing]");
    }
    let wire = |l: &LimitsConfig| {
        (l.max_message_bytes, l.max_batch_points, l.max_batch_series, l.max_page_points, l.max_streams_per_connection)
    };
    if wire(&old.limits) != wire(&new.limits) {
        return fixed("the wire limits (message, batch and page sizes, streams per connection)");
    }
    Ok(())
}

/// Refuses a class whose prefix, format or quantum changes under the same name.
fn check_classes(old: &[ClassConfig], new: &[ClassConfig]) -> Result<(), ReconfigureError> {
    for n in new {
        let Some(o) = old.iter().find(|o| o.name == n.name) else { continue };
        let changed = |field, from: String, to: String| {
            Err(ReconfigureError::ClassIdentity { class: n.name.clone(), field, from, to })
        };
        if o.metric_prefix != n.metric_prefix {
            return changed("metric_prefix", o.metric_prefix.clone(), n.metric_prefix.clone());
        }
        if o.format != n.format {
            return changed("format", o.format.to_string(), n.format.to_string());
        }
        if o.quantum != n.quantum {
            return changed("quantum", format!("{:?}", o.quantum), format!("{:?}", n.quantum));
        }
    }
    Ok(())
}

impl Node {
    /// Checks `config` with `revoked` as the configuration of desired-state `generation`, and
    /// builds what it needs. Changes nothing.
    pub fn prepare(
        &self,
        config: NodeConfig,
        revoked: &[String],
        generation: u64,
    ) -> Result<Prepared, ReconfigureError> {
        config.validate()?;
        let current = self.config();
        check_fixed(&current, &config)?;
        check_classes(&current.classes, &config.classes)?;
        let classes = config.class_table()?;
        let server = self.net().server_config_for(&config)?;
        let revoked = parse_revoked(revoked)?;
        let digest = config_digest_u64(&config.classes, &revoked);
        Ok(Prepared { config, classes, server, revoked, generation, digest })
    }

    /// Refuses the nodes of `revoked` from now on (and only those): they own nothing, their
    /// connections close, peers forget them. Returns what changed, if anything.
    pub fn revoke(&self, revoked: HashSet<Id>) -> Option<String> {
        // Revoked nodes own nothing from now on: their blocks move to the next closest nodes.
        self.view().set_excluded(revoked.clone());
        let newly = self.net().set_revoked(revoked);
        if newly.is_empty() {
            return None;
        }
        let forgotten = self.dht().forget(&newly);
        for id in &newly {
            info!(peer = %id, "refusing node {id} from now on: its certificate was revoked");
        }
        Some(format!("{} node(s) revoked ({forgotten} were peers)", newly.len()))
    }

    /// Swaps `prepared` in; returns what changed, for the log.
    pub fn reconfigure(self: &Arc<Self>, prepared: Prepared) -> Vec<String> {
        let Prepared { config, classes, server, revoked, generation, digest } = prepared;
        let old = self.config();
        let mut changed = Vec::new();

        // A newer signed list a peer passed on may revoke more than this generation knew.
        let mut revoked = revoked;
        if self.view().revocations().generation() > generation
            && let Some(newer) = self.view().revocations().ids()
        {
            revoked.extend(newer.iter().copied());
        }
        if let Some(note) = self.revoke(revoked) {
            changed.push(note);
        }
        if old.location != config.location {
            // Checked by `prepare` (config.validate).
            self.view().set_location(config.location().ok().flatten());
            changed.push(format!("location ({})", config.location.as_deref().unwrap_or("none")));
        }
        if old.classes != config.classes {
            self.coordinator().set_classes(classes);
            changed.push(format!("classes ({})", config.classes.len()));
        }
        // Set even when unchanged: it also runs a retention pass at once (what SIGHUP promises).
        let rules = config.retention_rules();
        if rules != old.retention_rules() {
            changed.push("retention".into());
        }
        self.store().set_retention(rules);
        let quotas = config.quota_rules();
        if quotas != old.quota_rules() || old.store.max_bytes != config.store.max_bytes {
            changed.push("quotas".into());
        }
        self.store().set_quotas(quotas);
        self.replica().usage().set_limits(config.store_max_bytes(), &config.classes);
        // Tier hook: class tier settings and write-time retention.
        self.tier().set_config(&config);
        if old.limits != config.limits {
            self.coordinator().set_limits(config.limits.clone());
            let limits = &config.limits;
            self.slots.resize(
                limits.max_concurrent_requests,
                limits.max_concurrent_peer_requests,
                self.shutdown_signal(),
            );
            self.connections.set_limits(limits.connections());
            self.handshakes().set_rate(limits.handshakes());
            changed.push("limits".into());
        }
        self.net().set_limits(&config, server);
        let rejoin = old.bootstrap != config.bootstrap;
        if rejoin {
            changed.push(format!("bootstrap peers ({})", config.bootstrap.join(", ")));
        }
        self.config.set(config);
        self.set_applied(generation, digest);
        if rejoin {
            let node = self.clone();
            self.tasks().spawn(async move {
                let config = node.config();
                tokio::select! {
                    biased;
                    _ = node.shutdown_signal().cancelled() => {}
                    _ = node.dht().join(&config.bootstrap) => {}
                }
            });
        }
        changed
    }
}

/// Applies every newer signed revocation list the view takes (from the control plane or a
/// peer's gossip) until `stop` fires: its nodes are refused from then on, besides those the
/// applied generation revoked.
pub async fn follow_revocations(node: Arc<Node>, stop: tokio_util::sync::CancellationToken) {
    let mut changes = node.view().revocations().subscribe();
    // A list taken before this task started (the one kept in the data directory) applies too.
    changes.mark_changed();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
        let ids = changes.borrow_and_update().clone();
        let mut revoked: HashSet<Id> = (**node.net().revocations().borrow()).clone();
        revoked.extend(ids.iter().copied());
        if let Some(note) = node.revoke(revoked) {
            info!(generation = node.view().revocations().generation(), "{note} by the signed revocation list");
        }
        // Kept for a restart: the list may have come by gossip, which a restarted node that is
        // cut off would not hear again.
        if let Err(e) = node.view().revocations().save(&node.config().data_dir) {
            warn!(error = %e, "cannot keep the revocation list in the data directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_settings_and_class_identity_are_refused() {
        let old = NodeConfig::default();
        let mut new = old.clone();
        new.bootstrap = vec!["10.0.0.1:7400".into()];
        new.limits.read_parallelism = 3;
        check_fixed(&old, &new).unwrap();
        new.dht.k = 5;
        assert!(check_fixed(&old, &new).unwrap_err().to_string().contains("[dht]"));
        let mut new = old.clone();
        new.limits.max_message_bytes *= 2;
        assert!(check_fixed(&old, &new).unwrap_err().to_string().contains("wire limits"));

        let pmu = ClassConfig { name: "pmu".into(), metric_prefix: "pmu.".into(), ..Default::default() };
        let mut kept_longer = pmu.clone();
        kept_longer.retention = Some(std::time::Duration::from_secs(60));
        kept_longer.rf = 5;
        check_classes(std::slice::from_ref(&pmu), &[kept_longer]).unwrap();
        let mut moved = pmu.clone();
        moved.metric_prefix = "pmu2.".into();
        let err = check_classes(std::slice::from_ref(&pmu), &[moved]).unwrap_err().to_string();
        assert!(err.contains("metric_prefix") && err.contains("pmu2."), "{err}");
        let mut requantized = pmu.clone();
        requantized.quantum = std::time::Duration::from_secs(60);
        assert!(check_classes(&[pmu], &[requantized]).unwrap_err().to_string().contains("quantum"));
        assert!(matches!(parse_revoked(&["xyz".into()]), Err(ReconfigureError::BadRevokedId(_))));
    }
}

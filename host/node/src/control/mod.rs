//! The node's side of the control plane (`timeshard-control`).
//!
//! A node enrolled with `timeshard node --enroll URL --token TOKEN --data-dir DIR` keeps its
//! key, certificate, the fleet CA and the last desired state it applied in `DIR/control` (the
//! agent of `timeshard-control-api` writes them). [`start`] runs such a node from those files
//! and its own configuration ([`effective_config`] says which wins where), and spawns the task
//! that follows the control plane (`follow`): new desired states applied without a restart,
//! policy modules fetched, cached and swapped in ([`policies`]), reports, certificate renewal,
//! and revocation.

pub(crate) mod apply;
mod follow;
pub mod policies;
pub mod report;

pub use apply::{class_config, class_spec, config_digest, config_digest_u64, digest_prefix, effective_config};
pub use follow::{RETRY_MAX, WATCH_WAIT};
use timeshard_control_api::Agent;
use tracing::{info, warn};

use crate::config::NodeConfig;
use crate::reconfigure::parse_revoked;
use crate::seams::Seams;
use crate::start::{Applied, RunningNode, StartError};

/// Starts the node enrolled in `agent`'s directory from the desired state it applied last (no
/// network needed), over `base` (the node's file and flags), and follows the control plane
/// from there.
pub async fn start(base: NodeConfig, agent: Agent) -> Result<RunningNode, StartError> {
    start_on(base, agent, Seams::default()).await
}

/// [`start`] on `seams`: a simulator's socket and disk (its control plane is in the agent).
pub async fn start_on(base: NodeConfig, agent: Agent, seams: Seams) -> Result<RunningNode, StartError> {
    if !base.classes.is_empty() {
        warn!(
            "the config file's [[class]] tables are ignored: an enrolled node takes its classes from the control plane"
        );
    }
    let desired = agent.applied();
    if let (Some(file), Some(control)) = (&base.location, &desired.location)
        && file.parse::<timeshard_proto::geo::GeoPoint>().ok().map(|p| (p.lat, p.lon))
            != Some((control.lat, control.lon))
    {
        warn!(
            file = %file,
            control_plane = %control,
            "the config file's location is ignored: the control plane's location for this device wins \
             (change it with `timeshard-control device set-location`)"
        );
    }
    let labels: Vec<String> = desired.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    info!(
        node = agent.node_id(),
        generation = desired.generation,
        labels = %labels.join(","),
        location = %desired.location.as_ref().map(|l| format!("{l} ({})", l.geohash)).unwrap_or_else(|| "-".into()),
        control_plane = %agent.client().credentials().url,
        "starting as an enrolled node"
    );
    let config = effective_config(&base, agent.dir(), desired)?;
    let policies = policies::ControlPolicies { key: desired.policy_key.clone(), assignments: desired.policies.clone() };
    let applied = Applied {
        enrolled: true,
        generation: desired.generation,
        revoked: parse_revoked(&desired.revoked)?,
        policies: Some(policies),
        http_tokens: desired.http_tokens.clone(),
        revocations: desired.revocations.as_ref().and_then(crate::revocations::from_desired),
    };
    let running = RunningNode::start_on(config, applied, seams).await?;
    let node = running.node().clone();
    node.tasks().spawn(follow::follow(node.clone(), agent, base));
    Ok(running)
}

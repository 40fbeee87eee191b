//! The task that follows the control plane while the node runs: long-polls the desired state
//! and applies each new one whole or not at all, reports what the node runs and how it is,
//! renews the certificate before it expires, and stops the node if its certificate is revoked.
//!
//! When the control plane cannot be reached the node keeps running what it applied last (it
//! is on disk, so a restart keeps it too) and retries every few seconds; the first watch that
//! gets through brings it up to date.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use timeshard_control_api::api::{ApplyError, HealthStatus, PolicyRun, Report};
use timeshard_control_api::{Agent, AgentError, DesiredState};
use timeshard_sdk::tls::Identity;
use tracing::{error, info, warn};

use super::apply::{config_digest, effective_config};
use crate::config::NodeConfig;
use crate::node::Node;

/// How long one watch waits for a change before the control plane answers "nothing new".
pub const WATCH_WAIT: Duration = Duration::from_secs(30);
/// The node reports at least this often, so the control plane sees it alive.
const HEARTBEAT: Duration = Duration::from_secs(60);
/// First wait before retrying an unreachable control plane; doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest wait between attempts to reach the control plane. Part of the revocation bound: a
/// node that lost the control plane learns of revocations at most this long after it is back.
pub const RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest health message the control plane accepts.
const MAX_MESSAGE: usize = 1000;
/// While the control plane stays unreachable, the node says so this often (not at every retry).
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why the node could not apply a desired state.
fn refusal(generation: u64, message: String) -> ApplyError {
    ApplyError { generation, message: message.chars().take(4000).collect() }
}

/// Follows the control plane until the node shuts down. `base` is the node's own file and
/// flags, which every desired state is laid over.
pub(crate) async fn follow(node: Arc<Node>, agent: Agent, base: NodeConfig) {
    let shutdown = node.shutdown_signal().clone();
    // Applying a state has no await point, so shutting down never cuts one in half.
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = run(node, agent, base) => {}
    }
}

async fn run(node: Arc<Node>, mut agent: Agent, base: NodeConfig) {
    let mut since = agent.applied().generation;
    let mut refused: Option<ApplyError> = None;
    let mut report_due = true;
    let mut last_report = Instant::now();
    let mut retry = RETRY_MIN;
    let mut renew_after = Instant::now();
    // Since when, and when it was last said, that the control plane cannot be reached.
    let mut unreachable: Option<(Instant, Instant)> = None;
    loop {
        // While the control plane is away only the watch tries it (and says so); renewal and
        // reports wait until it answers.
        let reachable = unreachable.is_none();
        if reachable
            && agent.client().renewal_due(SystemTime::now())
            && Instant::now() >= renew_after
            && let Err(e) = renew(&node, &mut agent).await
        {
            if e.is_revoked() {
                return revoked(&node, &agent);
            }
            warn!(error = %e, "cannot renew the node certificate yet; will retry");
            renew_after = Instant::now() + RETRY_MAX;
        }
        if reachable && (report_due || last_report.elapsed() >= HEARTBEAT) {
            match agent.client().report(&report(&node, &agent, refused.as_ref())).await {
                Ok(()) => {
                    report_due = false;
                    last_report = Instant::now();
                }
                Err(e) if e.is_revoked() => return revoked(&node, &agent),
                Err(e) => warn!(error = %e, "cannot report to the control plane; will retry"),
            }
        }
        let answer = agent.client().watch(since, WATCH_WAIT).await;
        if !matches!(answer, Err(AgentError::Http(_)))
            && let Some((since, _)) = unreachable.take()
        {
            info!(after = ?since.elapsed(), "reached the control plane again");
        }
        match answer {
            Ok(Some(state)) => {
                retry = RETRY_MIN;
                since = state.generation;
                report_due = true;
                let generation = state.generation;
                match apply(&node, &mut agent, &base, state) {
                    Ok(changed) => {
                        refused = None;
                        info!(generation, changed = %changed.join(", "), "applied the control plane's configuration");
                    }
                    Err(message) => {
                        warn!(generation, reason = %message, "cannot apply the control plane's configuration; \
                              keeping generation {}", agent.applied().generation);
                        refused = Some(refusal(generation, message));
                    }
                }
            }
            Ok(None) => retry = RETRY_MIN,
            Err(e) if e.is_revoked() => return revoked(&node, &agent),
            Err(AgentError::Incompatible { generation, reason }) => {
                warn!(generation, %reason, "cannot read the control plane's configuration");
                since = generation;
                report_due = true;
                refused = Some(refusal(generation, reason));
            }
            Err(e) => {
                let now = Instant::now();
                match &mut unreachable {
                    Some((_, said)) if now.duration_since(*said) < UNREACHABLE_LOG_EVERY => {}
                    state => {
                        let since = state.map_or(now, |(since, _)| since);
                        *state = Some((since, now));
                        warn!(
                            error = %e,
                            generation = agent.applied().generation,
                            unreachable_for = ?now.duration_since(since),
                            "cannot reach the control plane; running the last applied configuration, retrying"
                        );
                    }
                }
                // Jitter, so a fleet does not come back all at once.
                let wait = retry.mul_f64(rand::rng().random_range(0.5..1.0));
                retry = (retry * 2).min(RETRY_MAX);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Checks `state` whole against the node, records it on disk, then swaps it in. Returns what
/// changed, or why nothing did.
fn apply(node: &Arc<Node>, agent: &mut Agent, base: &NodeConfig, state: DesiredState) -> Result<Vec<String>, String> {
    if state.revoked.iter().any(|id| id == agent.node_id()) {
        return Err("this node is itself in the revocation list".into());
    }
    let config = effective_config(base, agent.dir(), &state).map_err(|e| e.to_string())?;
    let prepared = node.prepare(config, &state.revoked, state.generation).map_err(|e| e.to_string())?;
    let ours = format!("{:016x}", prepared.digest());
    if !state.digest.starts_with(&ours) {
        return Err(format!(
            "this node computes digest {ours}… for generation {}, the control plane {}; it would run \
             something else than the fleet (upgrade the node)",
            state.generation, state.digest
        ));
    }
    // On disk before it is in force: a crash in between restarts into the new state.
    agent.save_applied(state).map_err(|e| format!("cannot record the new configuration: {e}"))?;
    Ok(node.reconfigure(prepared))
}

/// Renews the certificate (same key) and presents it in every new handshake.
async fn renew(node: &Node, agent: &mut Agent) -> Result<(), AgentError> {
    let issued = agent.renew().await?;
    let config = node.config();
    match Identity::load(&config.tls_files()) {
        Ok(identity) => match node.net().set_identity(&config, &identity) {
            Ok(()) => info!(not_after_ms = issued.not_after_ms, "renewed the node certificate; new handshakes use it"),
            Err(e) => error!(error = %e, "the renewed certificate cannot be used; keeping the old one"),
        },
        Err(e) => error!(error = %e, "cannot read the renewed certificate; keeping the old one"),
    }
    Ok(())
}

/// Stops the node: the control plane revoked its certificate, so its peers refuse it anyway.
fn revoked(node: &Node, agent: &Agent) {
    let reason = format!(
        "the control plane revoked this node's certificate (node {}); it stops serving. Enroll it again \
         with a new token (and a new data directory) if that was a mistake",
        agent.node_id()
    );
    error!("{reason}");
    node.stop(reason);
}

/// What the node tells the control plane.
fn report(node: &Node, agent: &Agent, refused: Option<&ApplyError>) -> Report {
    let config = node.config();
    let revoked = node.net().revocations().borrow().clone();
    let mut problems: Vec<String> = node.disk.as_ref().map(|d| d.health()).unwrap_or_default();
    if node.dht().peer_count() == 0 && !config.bootstrap.is_empty() {
        problems.push(format!("no peers: none of the bootstrap peers ({}) answers", config.bootstrap.join(", ")));
    }
    let (health, message) = if problems.is_empty() {
        (HealthStatus::Ok, None)
    } else {
        (HealthStatus::Degraded, Some(problems.join("; ").chars().take(MAX_MESSAGE).collect()))
    };
    let policies = node.coordinator().policies().map(|r| policy_runs(r)).unwrap_or_default();
    Report {
        generation_applied: agent.applied().generation,
        digest_applied: config_digest(&config.classes, &revoked),
        health,
        message,
        apply_error: refused.cloned(),
        policies,
        policy_errors: Vec::new(),
    }
}

/// What each installed policy is and what its calls cost.
pub(crate) fn policy_runs(registry: &timeshard_policy::Registry) -> Vec<PolicyRun> {
    let stats = registry.call_stats();
    registry
        .running()
        .into_iter()
        .map(|p| {
            let s = stats.iter().find(|s| s.policy == p.policy);
            PolicyRun {
                kind: Some(p.kind),
                hash: Some(p.sha256),
                calls: s.map_or(0, |s| s.calls),
                time_us: s.map_or(0, |s| (s.seconds * 1e6) as u64),
                peak_memory_bytes: s.map_or(0, |s| s.peak_memory_bytes),
                traps: s.map_or(0, |s| s.traps),
                timeouts: s.map_or(0, |s| s.timeouts),
                failures: s.map_or(0, |s| s.failures),
                points: s.map_or(0, |s| s.points),
                rejected: s.map_or(0, |s| s.rejected),
                name: p.policy.name,
                version: p.policy.version,
            }
        })
        .collect()
}

//! The task that follows the control plane while the node runs: long-polls the desired state
//! and applies each new one whole or not at all (its policy modules with [`super::policies`]),
//! reports what the node runs and how it is ([`super::report`]), renews the certificate before
//! it expires, and stops the node if its certificate is revoked.
//!
//! When the control plane cannot be reached the node keeps running what it applied last (it
//! is on disk, so a restart keeps it too) and retries every few seconds; the first watch that
//! gets through brings it up to date.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use timeshard_control_api::api::{ApplyError, PolicyLoadError};
use timeshard_control_api::{Agent, AgentError, DesiredState};
use timeshard_sdk::tls::Identity;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::apply::effective_config;
use super::policies::{self, ControlPolicies};
use super::report::{self, Marks};
use crate::config::NodeConfig;
use crate::node::Node;
use crate::reconfigure::Prepared;

/// How long one watch waits for a change before the control plane answers "nothing new".
pub const WATCH_WAIT: Duration = Duration::from_secs(30);
/// How long a watch waits while the control plane has been unreachable: its first answer says
/// it is back, and renewal and reports, which wait for that, should not wait a whole watch.
const WATCH_WAIT_AFTER_OUTAGE: Duration = Duration::from_secs(1);
/// How often, while waiting for a change, the node looks whether a report is due.
const REPORT_CHECK: Duration = Duration::from_secs(1);
/// First wait before retrying an unreachable control plane; doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest wait between attempts to reach the control plane. Part of the revocation bound: a
/// node that lost the control plane learns of revocations at most this long after it is back.
pub const RETRY_MAX: Duration = Duration::from_secs(5);
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
    // A state's configuration is checked, then its policy modules swapped in (an await), then
    // the configuration recorded and swapped in with no await point: shutting down between
    // the two leaves the recorded state, which the node starts from next time.
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        _ = run(node, agent, base) => {}
    }
}

async fn run(node: Arc<Node>, mut agent: Agent, base: NodeConfig) {
    let mut since = agent.applied().generation;
    let mut refused: Option<ApplyError> = None;
    let mut report_due = true;
    let mut last_report = Instant::now();
    let mut reported = Marks::default();
    let mut retry = RETRY_MIN;
    let mut renew_after = Instant::now();
    // Since when, and when it was last said, that the control plane cannot be reached.
    let mut unreachable: Option<(Instant, Instant)> = None;
    loop {
        // While the control plane is away only the watch tries it (and says so); renewal,
        // reports and fetching modules wait until it answers.
        let reachable = unreachable.is_none();
        if reachable
            && agent.client().renewal_due(wall_clock())
            && Instant::now() >= renew_after
            && let Err(e) = renew(&node, &mut agent).await
        {
            if e.is_revoked() {
                return revoked(&node, &agent);
            }
            warn!(error = %e, "cannot renew the node certificate yet; will retry");
            renew_after = Instant::now() + RETRY_MAX;
        }
        if reachable && node.control_policies().unavailable {
            let state = agent.applied().clone();
            sync_policies(&node, &agent, &state).await;
        }
        if reachable && (report_due || last_report.elapsed() >= report::HEARTBEAT) {
            let marks = Marks::of(&node);
            match agent.client().report(&report::report(&node, &agent, refused.as_ref())).await {
                Ok(()) => {
                    report_due = false;
                    last_report = Instant::now();
                    reported = marks;
                    contact(&node);
                }
                Err(e) if e.is_revoked() => return revoked(&node, &agent),
                Err(e) => warn!(error = %e, "cannot report to the control plane; will retry"),
            }
        }
        // Wait for a change; meanwhile report policy failures (and use) as they happen.
        let answer = {
            let wait = if unreachable.is_some() { WATCH_WAIT_AFTER_OUTAGE } else { WATCH_WAIT };
            let watch = agent.client().watch(since, wait);
            tokio::pin!(watch);
            let mut tick = tokio::time::interval(REPORT_CHECK);
            loop {
                tokio::select! {
                    biased;
                    answer = &mut watch => {
                        if matches!(answer, Ok(_) | Err(AgentError::Incompatible { .. })) {
                            contact(&node);
                        }
                        break answer;
                    }
                    _ = tick.tick() => {}
                }
                // Renewal waits for no answer: a watch may last WATCH_WAIT, a short-lived
                // certificate not that long.
                if unreachable.is_none() && agent.client().renewal_due(wall_clock()) && Instant::now() >= renew_after {
                    break Ok(None);
                }
                let marks = Marks::of(&node);
                if unreachable.is_none() && report::due(marks, reported, last_report) {
                    match agent.client().report(&report::report(&node, &agent, refused.as_ref())).await {
                        Ok(()) => {
                            (last_report, reported) = (Instant::now(), marks);
                            contact(&node);
                        }
                        Err(e) if e.is_revoked() => return revoked(&node, &agent),
                        Err(e) => warn!(error = %e, "cannot report to the control plane; will retry"),
                    }
                }
            }
        };
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
                match prepare(&node, &agent, &base, &state) {
                    Ok(prepared) => {
                        sync_policies(&node, &agent, &state).await;
                        match commit(&node, &mut agent, state, prepared) {
                            Ok(changed) => {
                                refused = None;
                                info!(generation, changed = %changed.join(", "), "applied the control plane's configuration");
                            }
                            Err(message) => refused = Some(refusal(generation, message)),
                        }
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
                let wait = retry.mul_f64(timeshard_clock::rng().random_range(0.5..1.0));
                retry = (retry * 2).min(RETRY_MAX);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The wall clock as certificates' validity is read against: the host's (simulated under
/// simulation, like every clock the node reads).
fn wall_clock() -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(timeshard_clock::now_ns()).unwrap_or(0))
}

/// The control plane answered: `/metrics` shows how long ago ([`crate::metrics::Metrics`]).
fn contact(node: &Node) {
    let now_ms = timeshard_clock::now_ns().div_euclid(1_000_000);
    node.metrics().record_control_plane_contact(u64::try_from(now_ms).unwrap_or(0));
}

/// Checks `state` whole against the node, without changing anything. Returns the prepared
/// configuration, or why the node cannot run it.
fn prepare(node: &Arc<Node>, agent: &Agent, base: &NodeConfig, state: &DesiredState) -> Result<Prepared, String> {
    if state.revoked.iter().any(|id| id == agent.node_id()) {
        return Err("this node is itself in the revocation list".into());
    }
    // The signed list goes to the view first, so that peers learn it and the revoked set
    // applied is never older than one a peer passed on.
    if let Some(list) = state.revocations.as_ref().and_then(crate::revocations::from_desired)
        && let Err(e) = node.view().revocations().offer(list)
    {
        return Err(format!("the control plane's revocation list does not check out: {e}"));
    }
    let config = effective_config(base, agent.dir(), state).map_err(|e| e.to_string())?;
    let prepared = node.prepare(config, &state.revoked, state.generation).map_err(|e| e.to_string())?;
    let ours = format!("{:016x}", prepared.digest());
    if !state.digest.starts_with(&ours) {
        return Err(format!(
            "this node computes digest {ours}… for generation {}, the control plane {}; it would run \
             something else than the fleet (upgrade the node)",
            state.generation, state.digest
        ));
    }
    Ok(prepared)
}

/// Records `state` on disk, then swaps the prepared configuration in. Returns what changed.
fn commit(node: &Arc<Node>, agent: &mut Agent, state: DesiredState, prepared: Prepared) -> Result<Vec<String>, String> {
    // On disk before it is in force: a crash in between restarts into the new state.
    let http_tokens = state.http_tokens.clone();
    agent.save_applied(state).map_err(|e| format!("cannot record the new configuration: {e}"))?;
    node.http_tokens().set_issued(http_tokens);
    Ok(node.reconfigure(prepared))
}

/// Makes the node run `state`'s policy modules: fetches those the cache lacks, then swaps the
/// set in (compiling on a blocking thread). Nothing happens when the node already runs them.
async fn sync_policies(node: &Arc<Node>, agent: &Agent, state: &DesiredState) {
    let Some(registry) = node.coordinator().policies().cloned() else { return };
    let control = ControlPolicies { key: state.policy_key.clone(), assignments: state.policies.clone() };
    let file = {
        let applied = node.control_policies();
        if applied.synced && applied.control == control && !applied.unavailable {
            return;
        }
        applied.file.clone()
    };
    let config = node.config();
    let file_policy = file.clone().unwrap_or_else(|| config.policy.clone());
    let dir = policies::cache_dir(&config.data_dir);
    let unavailable = policies::fetch_missing(agent.client(), &dir, &control.assignments).await;
    let retry = !unavailable.is_empty();
    let next = control.clone();
    let errors = timeshard_clock::spawn_blocking(move || {
        policies::apply(&registry, &file_policy, &config.base_dir, &next, &dir, unavailable)
    })
    .await
    .unwrap_or_else(|e| {
        let error = format!("applying the policy modules failed: {e}");
        vec![PolicyLoadError { name: "(policies)".into(), version: "-".into(), error }]
    });
    let running: Vec<String> = state.policies.iter().map(|a| a.label()).collect();
    info!(assigned = %running.join(", "), not_loaded = errors.len(), "applied the control plane's policy modules");
    *node.control_policies() = policies::Applied { control, file, errors, unavailable: retry, synced: true };
}

/// Renews the certificate (same key) and presents it in every new handshake.
async fn renew(node: &Node, agent: &mut Agent) -> Result<(), AgentError> {
    let issued = agent.renew().await?;
    contact(node);
    let config = node.config();
    match Identity::load(&config.tls_files()) {
        Ok(identity) => match node.net().set_identity(&config, &identity) {
            Ok(()) => {
                node.tier().set_identity(&identity);
                info!(not_after_ms = issued.not_after_ms, "renewed the node certificate; new handshakes use it")
            }
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

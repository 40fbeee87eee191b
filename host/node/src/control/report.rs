//! What the node tells the control plane (generation and digest it runs, health (a disk nearly
//! full and an archive out of reach make it degraded, saying so), refusals, its
//! policy modules with what their calls cost, modules it could not load), and when: at once
//! after a change, soon after a policy fails (so a failing rollout is stopped quickly), now
//! and then while policies are used, and at least every minute.

use std::time::Duration;

use tokio::time::Instant;

use timeshard_control_api::Agent;
use timeshard_control_api::api::{ApplyError, HealthStatus, PolicyRun, Report};

use super::apply::config_digest;
use crate::node::Node;

/// The node reports at least this often, so the control plane sees it alive.
pub const HEARTBEAT: Duration = Duration::from_secs(60);
/// How soon after a policy fails (trap, timeout, load error) the node reports it, at most.
pub const FAILURE_REPORT_GAP: Duration = Duration::from_secs(2);
/// How often figures of policies in use are reported (no failure).
const USAGE_REPORT_GAP: Duration = Duration::from_secs(15);
/// Longest health message the control plane accepts.
const MAX_MESSAGE: usize = 1000;

/// What each installed policy is and what its calls cost.
pub fn policy_runs(registry: &timeshard_policy::Registry) -> Vec<PolicyRun> {
    let hashes: Vec<(String, String, String)> =
        registry.running().into_iter().map(|r| (r.policy.name, r.policy.version, r.sha256)).collect();
    crate::policies::usage(Some(registry))
        .into_iter()
        .map(|u| PolicyRun {
            hash: hashes.iter().find(|(n, v, _)| *n == u.name && *v == u.version).map(|(_, _, h)| h.clone()),
            kind: u.kind.parse().ok(),
            calls: u.calls,
            time_us: u.time_us,
            peak_memory_bytes: u.peak_memory_bytes,
            traps: u.traps,
            timeouts: u.timeouts,
            failures: u.failures,
            points: u.points,
            rejected: u.rejected,
            name: u.name,
            version: u.version,
        })
        .collect()
}

/// What the node tells the control plane.
pub fn report(node: &Node, agent: &Agent, refused: Option<&ApplyError>) -> Report {
    let config = node.config();
    let revoked = node.net().revocations().borrow().clone();
    let mut problems: Vec<String> = node.disk_store().map(|d| d.health()).unwrap_or_default();
    if node.dht().peer_count() == 0 && !config.bootstrap.is_empty() {
        problems.push(format!("no peers: none of the bootstrap peers ({}) answers", config.bootstrap.join(", ")));
    }
    // One statvfs for the problem and the figures.
    let storage = node.storage_status();
    let disk = crate::storage::DiskSpace { size: storage.disk_size_bytes, available: storage.disk_available_bytes };
    problems.extend(disk.problem());
    problems.extend(node.replica().usage().problems());
    if node.tier().archive().is_some() {
        problems.extend(node.tier().progress().outage(timeshard_clock::now_ns()));
    }
    let policy_errors = node.control_policies().errors.clone();
    if !policy_errors.is_empty() {
        problems.push(format!("{} policy module(s) not loaded", policy_errors.len()));
    }
    let (health, message) = if problems.is_empty() {
        (HealthStatus::Ok, None)
    } else {
        (HealthStatus::Degraded, Some(problems.join("; ").chars().take(MAX_MESSAGE).collect()))
    };
    Report {
        generation_applied: agent.applied().generation,
        digest_applied: config_digest(&config.classes, &revoked),
        health,
        message,
        apply_error: refused.cloned(),
        policies: node.coordinator().policies().map(|r| policy_runs(r)).unwrap_or_default(),
        policy_errors,
        storage: Some(storage),
    }
}

/// A summary of the policy figures, to tell when they changed since the last report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Failed calls and modules not loaded.
    failures: u64,
    /// Calls and points.
    usage: u64,
}

impl Marks {
    /// The marks of what the node runs now.
    pub fn of(node: &Node) -> Marks {
        let errors = node.control_policies().errors.len() as u64;
        let stats = node.coordinator().policies().map(|r| r.call_stats()).unwrap_or_default();
        Marks {
            failures: errors + stats.iter().map(|s| s.traps + s.timeouts + s.failures).sum::<u64>(),
            usage: stats.iter().map(|s| s.calls + s.points).sum(),
        }
    }
}

/// When the next report is due, given the marks now, those of the last report, and when it was.
pub fn due(now: Marks, reported: Marks, last: Instant) -> bool {
    let since = last.elapsed();
    since >= HEARTBEAT
        || (now.failures != reported.failures && since >= FAILURE_REPORT_GAP)
        || (now.usage != reported.usage && since >= USAGE_REPORT_GAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_reported_sooner_than_usage() {
        let quiet = Marks { failures: 0, usage: 10 };
        let busy = Marks { failures: 0, usage: 99 };
        let failing = Marks { failures: 1, usage: 11 };
        let just = Instant::now();
        let a_bit_ago = Instant::now() - FAILURE_REPORT_GAP;
        let long_ago = Instant::now() - USAGE_REPORT_GAP;
        assert!(!due(quiet, quiet, long_ago));
        assert!(!due(failing, quiet, just));
        assert!(due(failing, quiet, a_bit_ago));
        assert!(!due(busy, quiet, a_bit_ago));
        assert!(due(busy, quiet, long_ago));
        assert!(due(quiet, quiet, Instant::now() - HEARTBEAT));
    }
}

//! Watches active rollouts and aborts those whose reached nodes report failures above their
//! threshold ([`timeshard_control_api::rollout::evaluate`] decides). It looks after every
//! report that carries policy figures and at least every [`MONITOR_INTERVAL`]; several
//! instances on one PostgreSQL may look at once, and only one abort is recorded.

use std::sync::Arc;
use std::time::Duration;

use timeshard_control_api::rollout::{NodeReport, evaluate};
use tokio::task::JoinHandle;

use super::Fleet;
use super::store;
use crate::error::Result;

/// Longest time between two looks at the active rollouts.
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest time between two looks, however often nodes report.
const MIN_GAP: Duration = Duration::from_millis(250);

/// Starts the monitor; it runs until the process ends.
pub fn spawn(fleet: Arc<Fleet>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = fleet.reported.notified() => {}
                _ = tokio::time::sleep(MONITOR_INTERVAL) => {}
            }
            if let Err(e) = check(&fleet).await {
                tracing::warn!(error = %e, "cannot check the active rollouts; retrying");
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    })
}

/// Looks at every active rollout once; aborts those that must.
pub async fn check(fleet: &Fleet) -> Result<()> {
    let rollouts = store::active_rollouts(fleet.db.pool()).await?;
    if rollouts.is_empty() {
        return Ok(());
    }
    let devices = fleet.device_reports().await?;
    let reports: Vec<NodeReport<'_>> =
        devices.iter().map(|d| NodeReport { node_id: &d.node_id, policies: &d.policies, errors: &d.errors }).collect();
    for row in rollouts {
        if let Some(reason) = evaluate(&row.active(), &reports)
            && fleet.abort_rollout(&row, reason.clone()).await?
        {
            tracing::warn!(rollout = %row.id, policy = %row.spec.policy, version = %row.spec.version, %reason,
                           "rollout aborted: every node goes back to its stable version");
        }
    }
    Ok(())
}

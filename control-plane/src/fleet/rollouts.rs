//! Rollouts: start (targets frozen, stage 0 reached), promote, pause, resume, roll back, and the
//! automatic abort the monitor ([`super::monitor`]) calls. Each is one transaction with its
//! audit record; those that change what nodes run raise the generation. Which node runs which
//! version is decided in `timeshard_control_api::rollout`.

use std::collections::BTreeMap;

use serde_json::json;
use sqlx::Row;
use timeshard_control_api::api::{PolicyLoadError, PolicyRun};
use timeshard_control_api::policy::{RolloutAction, RolloutNode, RolloutSpec, RolloutState, RolloutStatus};
use timeshard_control_api::rollout::{Placement, order_targets, stages, validate_plan};
use timeshard_control_api::token::random_hex;
use timeshard_control_api::{Location, Role};
use timeshard_policy::PolicyRef;

use super::Fleet;
use super::store::{self, RolloutRow};
use super::tokens::Caller;
use crate::db::{Write, from_json, from_json_opt};
use crate::error::{Error, Result};
use crate::time::now_ms;

/// What an operator does to a policy's latest rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Promote,
    Pause,
    Resume,
    Rollback,
}

impl Action {
    pub fn parse(s: &str) -> Result<Action> {
        match s {
            "promote" => Ok(Action::Promote),
            "pause" => Ok(Action::Pause),
            "resume" => Ok(Action::Resume),
            "rollback" => Ok(Action::Rollback),
            other => {
                Err(Error::NotFound { what: format!("rollout action {other:?} (promote, pause, resume, rollback)") })
            }
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Action::Promote => "promote",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Rollback => "rollback",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Promote => "promoted",
            Action::Pause => "paused",
            Action::Resume => "resumed",
            Action::Rollback => "rolled back",
        }
    }
}

/// An enrolled, unrevoked device with what it reports about its policies.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    pub location: Option<Location>,
    pub last_seen_ms: Option<i64>,
    pub policies: Vec<PolicyRun>,
    pub errors: Vec<PolicyLoadError>,
}

/// Audit actor of the automatic abort.
pub const MONITOR_ACTOR: &str = "control-plane (rollout monitor)";

fn bad(reason: String) -> Error {
    Error::BadRequest(reason)
}

/// Completes `row` in `w`: its version becomes the stable one of its selector at `generation`.
async fn complete(w: &mut Write, row: &mut RolloutRow, generation: u64) -> Result<()> {
    let placement = Placement {
        policy: row.spec.policy.clone(),
        version: row.spec.version.clone(),
        selector: row.spec.selector.clone(),
        series: row.spec.series.clone(),
        settings: row.spec.settings.clone(),
        generation,
    };
    row.replaced = store::placement(w, &placement.policy, &store::selector_key(&placement)).await?;
    store::put_placement(w, &placement).await?;
    row.state = RolloutState::Completed;
    Ok(())
}

fn stage_label(row: &RolloutRow) -> String {
    let stages = stages(row.spec.canary, &row.spec.waves, row.targets.len());
    stages.get(row.stage).map_or_else(|| row.stage.to_string(), |s| s.label.clone())
}

impl Fleet {
    /// Every enrolled, unrevoked device with its policy reports.
    pub async fn device_reports(&self) -> Result<Vec<DeviceReport>> {
        let rows = sqlx::query(
            "SELECT node_id, labels_json, location_json, last_seen_ms, policies_json, policy_errors_json \
             FROM devices WHERE revoked_at_ms IS NULL ORDER BY node_id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DeviceReport {
                    node_id: r.try_get("node_id")?,
                    labels: from_json(r, "labels_json")?,
                    location: from_json_opt(r, "location_json")?,
                    last_seen_ms: r.try_get("last_seen_ms")?,
                    policies: from_json_opt(r, "policies_json")?.unwrap_or_default(),
                    errors: from_json_opt(r, "policy_errors_json")?.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// `POST /v1/rollouts` (operator): targets the devices the selector picks now, in the order
    /// the stages reach them, and reaches stage 0 (with one stage, that completes it).
    pub async fn start_rollout(&self, caller: &Caller, spec: RolloutSpec) -> Result<RolloutStatus> {
        caller.require(Role::Operator)?;
        PolicyRef::new(&spec.policy, &spec.version).map_err(|e| bad(e.to_string()))?;
        spec.selector.validate().map_err(bad)?;
        spec.series.validate().map_err(bad)?;
        spec.settings.validate().map_err(bad)?;
        validate_plan(&spec).map_err(bad)?;
        let versions = store::versions(self.db.pool(), Some(&spec.policy)).await?;
        if !versions.iter().any(|v| v.version == spec.version) {
            let known: Vec<&str> = versions.iter().map(|v| v.version.as_str()).collect();
            return Err(Error::UnknownVersion {
                name: spec.policy.clone(),
                version: spec.version.clone(),
                known: if known.is_empty() { "none".into() } else { known.join(", ") },
            });
        }
        let matching: Vec<String> = self
            .device_reports()
            .await?
            .into_iter()
            .filter(|d| spec.selector.matches(&d.labels, d.location.as_ref()))
            .map(|d| d.node_id)
            .collect();
        if matching.is_empty() {
            return Err(Error::RolloutTargetsNothing { selector: spec.selector.to_string() });
        }
        let now = now_ms();
        let id = format!("{:013}-{}", now.max(0), random_hex(4));
        let targets = order_targets(&id, matching);
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        if let Some(active) = store::latest_rollout(&mut *w.tx, &spec.policy).await?
            && active.state.is_active()
        {
            return Err(Error::RolloutInProgress {
                policy: spec.policy.clone(),
                version: active.spec.version.clone(),
                state: active.state.to_string(),
                stage: stage_label(&active),
            });
        }
        let mut row = RolloutRow {
            id,
            spec,
            targets,
            state: RolloutState::Running,
            stage: 0,
            reason: None,
            replaced: None,
            created_by: caller.actor(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        let plan = stages(row.spec.canary, &row.spec.waves, row.targets.len());
        if plan.len() == 1 {
            complete(&mut w, &mut row, generation).await?;
        }
        store::insert_rollout(&mut w, &row).await?;
        let target = format!("{}@{}", row.spec.policy, row.spec.version);
        let after = json!({ "rollout": row.id, "spec": row.spec, "targets": row.targets.len(), "stages": plan,
                            "state": row.state, "generation": generation });
        w.audit(now, &caller.actor(), "rollout.start", &target, None, Some(after)).await?;
        w.commit().await?;
        self.changed();
        self.rollout_status(caller, &row.spec.policy).await
    }

    /// `POST /v1/rollouts/{policy}/{action}` (operator) on the policy's latest rollout.
    pub async fn rollout_action(
        &self,
        caller: &Caller,
        policy: &str,
        action: Action,
        req: RolloutAction,
    ) -> Result<RolloutStatus> {
        caller.require(Role::Operator)?;
        if req.reason.as_ref().is_some_and(|r| r.len() > 1024) {
            return Err(bad("the reason is too long (1024 bytes at most)".into()));
        }
        let now = now_ms();
        let mut w = self.db.write().await?;
        // Only changes of what nodes run need a generation, but taking it first serializes
        // this with every other change on PostgreSQL.
        let generation = w.bump_generation(now).await?;
        let mut row = store::latest_rollout(&mut *w.tx, policy)
            .await?
            .ok_or_else(|| Error::NotFound { what: format!("a rollout of {policy}") })?;
        let before = json!({ "state": row.state, "stage": stage_label(&row) });
        let refuse = |row: &RolloutRow, what: &str| Error::RolloutState {
            policy: policy.to_string(),
            state: row.state.to_string(),
            what: what.to_string(),
        };
        let from = [row.state];
        let mut changes_nodes = true;
        match (action, row.state) {
            (Action::Promote, RolloutState::Running) => {
                row.stage += 1;
                if row.stage + 1 >= stages(row.spec.canary, &row.spec.waves, row.targets.len()).len() {
                    complete(&mut w, &mut row, generation).await?;
                }
            }
            (Action::Promote, RolloutState::Paused) => return Err(refuse(&row, "resume it before promoting it")),
            (Action::Pause, RolloutState::Running) => {
                row.state = RolloutState::Paused;
                changes_nodes = false;
            }
            (Action::Resume, RolloutState::Paused) => {
                row.state = RolloutState::Running;
                changes_nodes = false;
            }
            (Action::Rollback, RolloutState::Running | RolloutState::Paused) => row.state = RolloutState::RolledBack,
            (Action::Rollback, RolloutState::Completed) => {
                // The placement it made goes; the one it replaced, if any, comes back.
                let key = store::selector_key(&Placement {
                    policy: row.spec.policy.clone(),
                    version: row.spec.version.clone(),
                    selector: row.spec.selector.clone(),
                    series: row.spec.series.clone(),
                    settings: row.spec.settings.clone(),
                    generation,
                });
                match row.replaced.clone() {
                    Some(mut previous) => {
                        previous.generation = generation;
                        store::put_placement(&mut w, &previous).await?;
                    }
                    None => store::remove_placement(&mut w, policy, &key).await?,
                }
                row.state = RolloutState::RolledBack;
            }
            (_, _) => {
                return Err(refuse(&row, &format!("it cannot be {} now", action.done())));
            }
        }
        row.reason = req.reason.or(row.reason);
        row.updated_at_ms = now;
        if !changes_nodes {
            // Dropping `w` would roll back everything; commit without the generation instead.
            drop(w);
            w = self.db.write().await?;
        }
        if !store::update_rollout(&mut w, &row, &from).await? {
            return Err(Error::Overloaded("the rollout changed meanwhile; retry"));
        }
        let after = json!({ "state": row.state, "stage": stage_label(&row), "reason": row.reason });
        let target = format!("{}@{}", row.spec.policy, row.spec.version);
        w.audit(now, &caller.actor(), &format!("rollout.{}", action.as_str()), &target, Some(before), Some(after))
            .await?;
        w.commit().await?;
        if changes_nodes {
            self.changed();
        }
        self.rollout_status(caller, policy).await
    }

    /// Aborts active rollout `id` because of `reason` (the monitor's decision): every node goes
    /// back to its stable version. False when it was no longer active.
    pub async fn abort_rollout(&self, row: &RolloutRow, reason: String) -> Result<bool> {
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let mut next = row.clone();
        next.state = RolloutState::Aborted;
        next.reason = Some(reason.clone());
        next.updated_at_ms = now;
        if !store::update_rollout(&mut w, &next, &[RolloutState::Running, RolloutState::Paused]).await? {
            return Ok(false);
        }
        let target = format!("{}@{}", row.spec.policy, row.spec.version);
        let before = json!({ "state": row.state, "stage": stage_label(row) });
        let after = json!({ "state": next.state, "reason": reason, "generation": generation });
        w.audit(now, MONITOR_ACTOR, "rollout.abort", &target, Some(before), Some(after)).await?;
        w.commit().await?;
        self.changed();
        Ok(true)
    }

    /// `GET /v1/rollouts/{policy}` (viewer): the latest rollout, every node it targets (and
    /// every node that joined its selector since), what each should run and what it reports.
    pub async fn rollout_status(&self, caller: &Caller, policy: &str) -> Result<RolloutStatus> {
        caller.require(Role::Viewer)?;
        self.reload().await?;
        let row = store::latest_rollout(self.db.pool(), policy).await?.ok_or_else(|| Error::NotFound {
            what: format!("a rollout of {policy} (start one with `rollout start`)"),
        })?;
        let kind = store::versions(self.db.pool(), Some(policy))
            .await?
            .into_iter()
            .find(|v| v.version == row.spec.version)
            .map(|v| v.kind)
            .ok_or_else(|| Error::Internal(format!("rollout {} names an unknown version", row.id)))?;
        let state = self.current();
        let devices = self.device_reports().await?;
        let active = row.active();
        let mut listed: Vec<&DeviceReport> =
            row.targets.iter().filter_map(|t| devices.iter().find(|d| &d.node_id == t)).collect();
        let late = devices
            .iter()
            .filter(|d| !row.targets.contains(&d.node_id) && row.spec.selector.matches(&d.labels, d.location.as_ref()));
        listed.extend(late);
        let nodes = listed
            .into_iter()
            .map(|d| {
                let desired = state
                    .policies
                    .for_node(&d.node_id, &d.labels, d.location.as_ref())
                    .into_iter()
                    .find(|a| a.name == policy && a.bound)
                    .map(|a| a.version);
                let runs: Vec<&PolicyRun> = d.policies.iter().filter(|r| r.name == policy).collect();
                let run = runs.iter().find(|r| Some(&r.version) == desired.as_ref()).or(runs.last());
                RolloutNode {
                    node_id: d.node_id.clone(),
                    labels: d.labels.clone(),
                    stage: active.stage_of(&d.node_id),
                    desired,
                    running: run.map(|r| r.version.clone()),
                    calls: run.map_or(0, |r| r.calls),
                    failed_calls: run.map_or(0, |r| r.failed_calls()),
                    load_error: d
                        .errors
                        .iter()
                        .find(|e| e.name == policy)
                        .map(|e| format!("{}: {}", e.version, e.error)),
                    last_seen_ms: d.last_seen_ms,
                }
            })
            .collect();
        Ok(RolloutStatus {
            id: row.id.clone(),
            kind,
            state: row.state,
            stage: row.stage as u32,
            stages: stages(row.spec.canary, &row.spec.waves, row.targets.len()),
            reason: row.reason.clone(),
            created_by: row.created_by.clone(),
            created_at_ms: row.created_at_ms,
            updated_at_ms: row.updated_at_ms,
            nodes,
            spec: row.spec,
        })
    }
}

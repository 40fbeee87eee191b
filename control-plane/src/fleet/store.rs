//! Rows of policy modules and rollouts: the fleet's policy key, versions, placements and
//! rollouts, read and written in the callers' transactions, and the [`PolicyTable`] the
//! desired state is computed from.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{Any, AnyPool, Executor, Row};
use timeshard_control_api::policy::{Kind, PolicyVersionInfo, RolloutSpec, RolloutState};
use timeshard_control_api::rollout::{ActiveRollout, ModuleMeta, Placement, PolicyTable};
use timeshard_policy::signing::{self, SecretKey};

use crate::db::{Write, from_json, json};
use crate::error::{Error, Result};
use crate::sealed::{self, Kek};

/// A rollout row.
#[derive(Clone, Debug)]
pub struct RolloutRow {
    pub id: String,
    pub spec: RolloutSpec,
    pub targets: Vec<String>,
    pub state: RolloutState,
    pub stage: usize,
    pub reason: Option<String>,
    /// On completion, the placement it replaced (for a rollback).
    pub replaced: Option<Placement>,
    pub created_by: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl RolloutRow {
    pub fn active(&self) -> ActiveRollout {
        ActiveRollout { id: self.id.clone(), spec: self.spec.clone(), targets: self.targets.clone(), stage: self.stage }
    }
}

const ROLLOUT_COLUMNS: &str =
    "id, spec_json, targets_json, state, stage, reason, replaced_json, created_by, created_at_ms, updated_at_ms";

fn rollout_row(r: &AnyRow) -> Result<RolloutRow> {
    let state: String = r.try_get("state")?;
    let replaced: Option<String> = r.try_get("replaced_json")?;
    Ok(RolloutRow {
        id: r.try_get("id")?,
        spec: from_json(r, "spec_json")?,
        targets: from_json(r, "targets_json")?,
        state: RolloutState::parse(&state)
            .ok_or_else(|| Error::Internal(format!("stored rollout state {state:?} is unknown")))?,
        stage: r.try_get::<i64, _>("stage")? as usize,
        reason: r.try_get("reason")?,
        replaced: replaced
            .filter(|t| t != "null")
            .map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| Error::Internal(format!("stored replaced_json is unreadable: {e}")))?,
        created_by: r.try_get("created_by")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
    })
}

/// The latest rollout of `policy`.
pub async fn latest_rollout<'e, E: Executor<'e, Database = Any>>(db: E, policy: &str) -> Result<Option<RolloutRow>> {
    let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE policy = $1 ORDER BY id DESC LIMIT 1");
    sqlx::query(&sql).bind(policy).fetch_optional(db).await?.as_ref().map(rollout_row).transpose()
}

/// Rollouts that are running or paused.
pub async fn active_rollouts<'e, E: Executor<'e, Database = Any>>(db: E) -> Result<Vec<RolloutRow>> {
    let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE state IN ('running', 'paused') ORDER BY id");
    sqlx::query(&sql).fetch_all(db).await?.iter().map(rollout_row).collect()
}

pub async fn insert_rollout(w: &mut Write, row: &RolloutRow) -> Result<()> {
    sqlx::query(
        "INSERT INTO rollouts (id, policy, version, spec_json, targets_json, state, stage, reason, replaced_json, \
         created_by, created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&row.id)
    .bind(&row.spec.policy)
    .bind(&row.spec.version)
    .bind(json(&row.spec))
    .bind(json(&row.targets))
    .bind(row.state.as_str())
    .bind(row.stage as i64)
    .bind(&row.reason)
    .bind(row.replaced.as_ref().map(json))
    .bind(&row.created_by)
    .bind(row.created_at_ms)
    .bind(row.updated_at_ms)
    .execute(&mut *w.tx)
    .await?;
    Ok(())
}

/// Moves rollout `row.id` from state `from` to `row`'s state, stage, reason and replaced
/// placement. False when it was no longer in `from` (another instance moved it first).
pub async fn update_rollout(w: &mut Write, row: &RolloutRow, from: &[RolloutState]) -> Result<bool> {
    let from: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
    let sql = format!(
        "UPDATE rollouts SET state = $1, stage = $2, reason = $3, replaced_json = $4, updated_at_ms = $5 \
         WHERE id = $6 AND state IN ({})",
        from.join(", ")
    );
    let n = sqlx::query(&sql)
        .bind(row.state.as_str())
        .bind(row.stage as i64)
        .bind(&row.reason)
        .bind(row.replaced.as_ref().map(json))
        .bind(row.updated_at_ms)
        .bind(&row.id)
        .execute(&mut *w.tx)
        .await?
        .rows_affected();
    Ok(n == 1)
}

/// The key under which a placement is stored: one stable version per policy and selector.
pub fn selector_key(p: &Placement) -> String {
    p.selector.to_string()
}

/// The placement of `policy` for exactly `selector_key`, if any.
pub async fn placement(w: &mut Write, policy: &str, selector_key: &str) -> Result<Option<Placement>> {
    sqlx::query("SELECT placement_json FROM policy_placements WHERE policy = $1 AND selector_key = $2")
        .bind(policy)
        .bind(selector_key)
        .fetch_optional(&mut *w.tx)
        .await?
        .map(|r| from_json(&r, "placement_json"))
        .transpose()
}

pub async fn put_placement(w: &mut Write, p: &Placement) -> Result<()> {
    sqlx::query(
        "INSERT INTO policy_placements (policy, selector_key, placement_json, generation) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (policy, selector_key) DO UPDATE SET placement_json = excluded.placement_json, \
         generation = excluded.generation",
    )
    .bind(&p.policy)
    .bind(selector_key(p))
    .bind(json(p))
    .bind(p.generation as i64)
    .execute(&mut *w.tx)
    .await?;
    Ok(())
}

pub async fn remove_placement(w: &mut Write, policy: &str, selector_key: &str) -> Result<()> {
    sqlx::query("DELETE FROM policy_placements WHERE policy = $1 AND selector_key = $2")
        .bind(policy)
        .bind(selector_key)
        .execute(&mut *w.tx)
        .await?;
    Ok(())
}

const VERSION_COLUMNS: &str = "name, version, kind, sha256, size, signature, uploaded_by, uploaded_at_ms";

fn kind_of(text: &str) -> Result<Kind> {
    text.parse().map_err(|e: String| Error::Internal(format!("stored policy kind: {e}")))
}

pub fn version_row(r: &AnyRow) -> Result<PolicyVersionInfo> {
    Ok(PolicyVersionInfo {
        name: r.try_get("name")?,
        version: r.try_get("version")?,
        kind: kind_of(&r.try_get::<String, _>("kind")?)?,
        sha256: r.try_get("sha256")?,
        size: r.try_get::<i64, _>("size")? as u64,
        uploaded_by: r.try_get("uploaded_by")?,
        uploaded_at_ms: r.try_get("uploaded_at_ms")?,
        signature: r.try_get("signature")?,
        nodes: Vec::new(),
    })
}

/// Every uploaded version of `name` (all names when `None`), oldest first.
pub async fn versions<'e, E: Executor<'e, Database = Any>>(
    db: E,
    name: Option<&str>,
) -> Result<Vec<PolicyVersionInfo>> {
    let rows = match name {
        Some(n) => {
            let sql = format!("SELECT {VERSION_COLUMNS} FROM policy_versions WHERE name = $1 ORDER BY uploaded_at_ms");
            sqlx::query(&sql).bind(n).fetch_all(db).await?
        }
        None => {
            let sql = format!("SELECT {VERSION_COLUMNS} FROM policy_versions ORDER BY name, uploaded_at_ms");
            sqlx::query(&sql).fetch_all(db).await?
        }
    };
    rows.iter().map(version_row).collect()
}

/// The fleet's policy signing key, made on first use. Several instances on one PostgreSQL
/// agree on one key: the insert does nothing when the row exists.
pub async fn policy_key(pool: &AnyPool, kek: &Kek, w: &mut Write, now_ms: i64) -> Result<SecretKey> {
    let read = |row: AnyRow| -> Result<(SecretKey, Option<String>)> {
        let stored = row.try_get::<String, _>("secret_text")?;
        let (text, reseal) = if sealed::is_sealed(&stored) {
            (kek.open(&stored, POLICY_KEY)?, None)
        } else {
            // Stored in the clear by an older version: sealed now.
            (stored.clone(), Some(stored))
        };
        let key = SecretKey::from_text(&text)
            .map_err(|e| Error::Internal(format!("the stored policy key is unreadable: {e}")))?;
        Ok((key, reseal))
    };
    let reseal = |key: &SecretKey| kek.seal(&key.to_text(), POLICY_KEY);
    if let Some(row) = sqlx::query("SELECT secret_text FROM policy_key WHERE id = 1").fetch_optional(pool).await? {
        let (key, clear) = read(row)?;
        if let Some(clear) = clear {
            sqlx::query("UPDATE policy_key SET secret_text = $1 WHERE id = 1 AND secret_text = $2")
                .bind(reseal(&key)?)
                .bind(clear)
                .execute(&mut *w.tx)
                .await?;
        }
        return Ok(key);
    }
    let key = signing::generate_keypair().map_err(|e| Error::Internal(format!("cannot make the policy key: {e}")))?;
    sqlx::query(
        "INSERT INTO policy_key (id, secret_text, public_text, created_at_ms) VALUES (1, $1, $2, $3) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(reseal(&key)?)
    .bind(key.public().to_text().trim().to_string())
    .bind(now_ms)
    .execute(&mut *w.tx)
    .await?;
    let row = sqlx::query("SELECT secret_text FROM policy_key WHERE id = 1").fetch_one(&mut *w.tx).await?;
    Ok(read(row)?.0)
}

/// What the policy key is sealed as.
const POLICY_KEY: &str = "policy signing key";

/// The fleet's policy public key (text), if one was made.
pub async fn public_key<'e, E: Executor<'e, Database = Any>>(db: E) -> Result<Option<String>> {
    let row = sqlx::query("SELECT public_text FROM policy_key WHERE id = 1").fetch_optional(db).await?;
    Ok(row.map(|r| r.try_get::<String, _>("public_text")).transpose()?)
}

/// The policy table at `generation` (read by [`super::load_state`] between its
/// two reads of the generation).
pub async fn load_table(pool: &AnyPool) -> Result<PolicyTable> {
    let mut modules = BTreeMap::new();
    for v in versions(pool, None).await? {
        let meta = ModuleMeta { kind: v.kind, sha256: v.sha256, size: v.size, signature: v.signature };
        modules.insert(format!("{}@{}", v.name, v.version), meta);
    }
    let mut placements: Vec<Placement> = Vec::new();
    for row in sqlx::query("SELECT placement_json FROM policy_placements").fetch_all(pool).await? {
        placements.push(from_json(&row, "placement_json")?);
    }
    let rollouts = active_rollouts(pool).await?.iter().map(RolloutRow::active).collect();
    Ok(PolicyTable { key: public_key(pool).await?, modules, placements, rollouts })
}

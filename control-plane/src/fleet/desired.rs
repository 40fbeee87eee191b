//! Changes of desired state: series classes and per-selector node configurations. A change is
//! checked against the whole resulting table inside its transaction and applied whole or not
//! at all; each raises the generation and is audited with its before and after.

use std::collections::BTreeMap;

use serde_json::json;
use sqlx::Row;
use timeshard_control_api::api::{Changed, PutClasses, PutNodeConfig};
use timeshard_control_api::class::validate_table;
use timeshard_control_api::state::NodeConfigEntry;
use timeshard_control_api::{ClassSpec, Location, Role};

use super::Fleet;
use super::tokens::Caller;
use crate::db::{Write, from_json, from_json_opt, json};
use crate::error::{Error, Result};
use crate::time::now_ms;

/// Most classes in a fleet.
pub const MAX_CLASSES: usize = 1024;
/// Most node configurations in a fleet.
pub const MAX_NODE_CONFIGS: usize = 1024;

fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest(format!("{what} name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'")))
    }
}

async fn classes_in(w: &mut Write) -> Result<BTreeMap<String, ClassSpec>> {
    let rows = sqlx::query("SELECT name, spec_json FROM classes").fetch_all(&mut *w.tx).await?;
    rows.iter().map(|r| Ok((r.try_get("name")?, from_json(r, "spec_json")?))).collect()
}

impl Fleet {
    /// `GET /v1/classes` (viewer).
    pub async fn list_classes(&self, caller: &Caller) -> Result<Vec<ClassSpec>> {
        caller.require(Role::Viewer)?;
        let rows = sqlx::query("SELECT spec_json FROM classes ORDER BY name").fetch_all(self.db.pool()).await?;
        rows.iter().map(|r| from_json(r, "spec_json")).collect()
    }

    /// `PUT /v1/classes` (operator): adds or changes classes; all or none.
    pub async fn put_classes(&self, caller: &Caller, req: PutClasses) -> Result<Changed> {
        caller.require(Role::Operator)?;
        if req.classes.is_empty() {
            return Err(Error::BadRequest("no class given".into()));
        }
        validate_table(&req.classes)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let mut table = classes_in(&mut w).await?;
        let mut changes = Vec::new();
        for class in &req.classes {
            let before = table.get(&class.name).cloned();
            if let Some(old) = &before {
                old.check_change(class)?;
            }
            if before.as_ref() != Some(class) {
                changes.push((before, class.clone()));
            }
            table.insert(class.name.clone(), class.clone());
        }
        if table.len() > MAX_CLASSES {
            return Err(Error::BadRequest(format!("a fleet has at most {MAX_CLASSES} classes")));
        }
        // Conflicts with classes this change does not mention (same metric_prefix).
        let all: Vec<ClassSpec> = table.into_values().collect();
        validate_table(&all)?;
        if changes.is_empty() {
            // Nothing changes: no new generation (dropping `w` rolls back the increment).
            return Ok(Changed { generation: generation - 1, matched: None });
        }
        for (before, class) in changes {
            sqlx::query(
                "INSERT INTO classes (name, metric_prefix, spec_json, changed_generation) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name) DO UPDATE SET metric_prefix = excluded.metric_prefix, \
                 spec_json = excluded.spec_json, changed_generation = excluded.changed_generation",
            )
            .bind(&class.name)
            .bind(&class.metric_prefix)
            .bind(json(&class))
            .bind(generation as i64)
            .execute(&mut *w.tx)
            .await?;
            let before = before.map(|b| json!(b));
            w.audit(now, &caller.actor(), "class.set", &class.name, before, Some(json!(class))).await?;
        }
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }

    /// `DELETE /v1/classes/{name}` (operator).
    pub async fn remove_class(&self, caller: &Caller, name: &str) -> Result<Changed> {
        caller.require(Role::Operator)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let before = classes_in(&mut w)
            .await?
            .remove(name)
            .ok_or_else(|| Error::NotFound { what: format!("class {name:?} (see `timeshard-control class list`)") })?;
        sqlx::query("DELETE FROM classes WHERE name = $1").bind(name).execute(&mut *w.tx).await?;
        w.audit(now, &caller.actor(), "class.rm", name, Some(json!(before)), None).await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }

    /// `GET /v1/node-configs` (viewer).
    pub async fn list_node_configs(&self, caller: &Caller) -> Result<Vec<NodeConfigEntry>> {
        caller.require(Role::Viewer)?;
        let rows = sqlx::query("SELECT entry_json FROM node_configs ORDER BY name").fetch_all(self.db.pool()).await?;
        rows.iter().map(|r| from_json(r, "entry_json")).collect()
    }

    /// How many enrolled, unrevoked devices `entry`'s selector picks.
    async fn count_matching(&self, entry: &NodeConfigEntry) -> Result<u64> {
        let rows = sqlx::query("SELECT labels_json, location_json FROM devices WHERE revoked_at_ms IS NULL")
            .fetch_all(self.db.pool())
            .await?;
        let mut n = 0;
        for r in &rows {
            let labels: BTreeMap<String, String> = from_json(r, "labels_json")?;
            let location: Option<Location> = from_json_opt(r, "location_json")?;
            if entry.selector.matches(&labels, location.as_ref()) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// `PUT /v1/node-configs/{name}` (operator).
    pub async fn put_node_config(&self, caller: &Caller, name: &str, req: PutNodeConfig) -> Result<Changed> {
        caller.require(Role::Operator)?;
        check_name("node configuration", name)?;
        let invalid = |reason: String| Error::NodeConfigInvalid { name: name.to_string(), reason };
        req.selector.validate().map_err(invalid)?;
        req.settings.validate().map_err(invalid)?;
        let entry = NodeConfigEntry {
            name: name.to_string(),
            selector: req.selector,
            priority: req.priority,
            settings: req.settings,
        };
        let matched = self.count_matching(&entry).await?;
        if matched == 0 && !req.allow_empty {
            return Err(Error::SelectorMatchesNothing { selector: entry.selector.to_string() });
        }
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let before = sqlx::query("SELECT entry_json FROM node_configs WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *w.tx)
            .await?
            .map(|r| from_json::<NodeConfigEntry>(&r, "entry_json"))
            .transpose()?;
        if before.is_none() {
            let count: i64 =
                sqlx::query("SELECT COUNT(*) FROM node_configs").fetch_one(&mut *w.tx).await?.try_get(0)?;
            if count as usize >= MAX_NODE_CONFIGS {
                return Err(Error::BadRequest(format!("a fleet has at most {MAX_NODE_CONFIGS} node configurations")));
            }
        }
        if before.as_ref() == Some(&entry) {
            return Ok(Changed { generation: generation - 1, matched: Some(matched) });
        }
        sqlx::query(
            "INSERT INTO node_configs (name, entry_json, changed_generation) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET entry_json = excluded.entry_json, changed_generation = excluded.changed_generation",
        )
        .bind(name)
        .bind(json(&entry))
        .bind(generation as i64)
        .execute(&mut *w.tx)
        .await?;
        w.audit(now, &caller.actor(), "node-config.set", name, before.map(|b| json!(b)), Some(json!(entry))).await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: Some(matched) })
    }

    /// `DELETE /v1/node-configs/{name}` (operator).
    pub async fn remove_node_config(&self, caller: &Caller, name: &str) -> Result<Changed> {
        caller.require(Role::Operator)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let before = sqlx::query("SELECT entry_json FROM node_configs WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *w.tx)
            .await?
            .map(|r| from_json::<NodeConfigEntry>(&r, "entry_json"))
            .transpose()?
            .ok_or_else(|| Error::NotFound { what: format!("node configuration {name:?} (see `node-config list`)") })?;
        sqlx::query("DELETE FROM node_configs WHERE name = $1").bind(name).execute(&mut *w.tx).await?;
        w.audit(now, &caller.actor(), "node-config.rm", name, Some(json!(before)), None).await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }
}

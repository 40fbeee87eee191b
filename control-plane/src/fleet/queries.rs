//! Reads for people: the fleet, its devices and what they report, and the audit log.

use sqlx::Row;
use timeshard_control_api::Role;
use timeshard_control_api::api::{AuditEntry, AuditQuery, DeviceInfo, FleetInfo, HealthStatus};

use super::Fleet;
use super::tokens::Caller;
use crate::db::{from_json, from_json_opt};
use crate::error::{Error, Result};

/// Most audit entries in one answer.
pub const MAX_AUDIT_PAGE: u32 = 1000;

impl Fleet {
    /// `GET /v1/fleet` (viewer).
    pub async fn info(&self, caller: &Caller) -> Result<FleetInfo> {
        caller.require(Role::Viewer)?;
        // Read your writes: a change just made through this instance shows at once.
        self.reload().await?;
        let state = self.current();
        Ok(FleetInfo {
            ca_fingerprint: self.ca.fingerprint().to_string(),
            ca_pem: self.ca.cert_pem().to_string(),
            generation: state.generation,
            digest: state.digest.clone(),
            policy_key: self.policy_public_key().await?,
        })
    }

    /// `GET /v1/devices` (viewer).
    pub async fn list_devices(&self, caller: &Caller) -> Result<Vec<DeviceInfo>> {
        caller.require(Role::Viewer)?;
        let rows = sqlx::query(
            "SELECT node_id, token_id, labels_json, location_json, enrolled_at_ms, cert_serial, cert_not_after_ms, \
             revoked_at_ms, last_seen_ms, generation_applied, digest_applied, health, message, apply_error_json, \
             policies_json, policy_errors_json, storage_json FROM devices ORDER BY enrolled_at_ms, node_id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                let health = r
                    .try_get::<Option<String>, _>("health")?
                    .map(|h| serde_json::from_value::<HealthStatus>(serde_json::Value::String(h)))
                    .transpose()
                    .map_err(|e| Error::Internal(format!("stored health is unreadable: {e}")))?;
                Ok(DeviceInfo {
                    node_id: r.try_get("node_id")?,
                    labels: from_json(r, "labels_json")?,
                    location: from_json_opt(r, "location_json")?,
                    enrolled_at_ms: r.try_get("enrolled_at_ms")?,
                    token_id: r.try_get("token_id")?,
                    cert_serial: r.try_get("cert_serial")?,
                    cert_not_after_ms: r.try_get("cert_not_after_ms")?,
                    revoked_at_ms: r.try_get("revoked_at_ms")?,
                    last_seen_ms: r.try_get("last_seen_ms")?,
                    generation_applied: r.try_get::<Option<i64>, _>("generation_applied")?.map(|g| g as u64),
                    digest_applied: r.try_get("digest_applied")?,
                    health,
                    message: r.try_get("message")?,
                    apply_error: from_json_opt(r, "apply_error_json")?,
                    policies: from_json_opt(r, "policies_json")?.unwrap_or_default(),
                    policy_errors: from_json_opt(r, "policy_errors_json")?.unwrap_or_default(),
                    storage: from_json_opt(r, "storage_json")?,
                })
            })
            .collect()
    }

    /// `GET /v1/audit` (viewer): newest first, `limit` entries before the id `before`.
    pub async fn audit_log(&self, caller: &Caller, query: AuditQuery) -> Result<Vec<AuditEntry>> {
        caller.require(Role::Viewer)?;
        let limit = i64::from(query.limit.unwrap_or(100).clamp(1, MAX_AUDIT_PAGE));
        // Ids have one shape (13 digits, '-', 16 hex digits), so text order is time order
        // under any collation.
        let sql = "SELECT id, at_ms, actor, action, target, before_json, after_json FROM audit";
        let rows = match query.before {
            Some(before) => {
                sqlx::query(&format!("{sql} WHERE id < $1 ORDER BY id DESC LIMIT $2"))
                    .bind(before)
                    .bind(limit)
                    .fetch_all(self.db.pool())
                    .await?
            }
            None => {
                sqlx::query(&format!("{sql} ORDER BY id DESC LIMIT $1")).bind(limit).fetch_all(self.db.pool()).await?
            }
        };
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at_ms: r.try_get("at_ms")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    before: from_json_opt(r, "before_json")?,
                    after: from_json_opt(r, "after_json")?,
                })
            })
            .collect()
    }
}

//! Devices: enrollment with a one-time token, certificate renewal, reports, revocation, and
//! the check that a node calling with its certificate is enrolled and not revoked.

use std::collections::BTreeMap;

use serde_json::json;
use sqlx::Row;
use timeshard_control_api::api::{
    Changed, EnrollRequest, EnrollResponse, Issued, RenewRequest, Report, RevokeDevice, SetDeviceLocation,
};
use timeshard_control_api::{Location, Role, Token, TokenKind};

use super::Fleet;
use super::tokens::{Caller, check_fleet};
use crate::ca::{Signed, parse_csr};
use crate::db::{from_json, from_json_opt, json};
use crate::error::{Error, Result};
use crate::time::now_ms;

/// An enrolled, unrevoked device as the desired state needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    pub location: Option<Location>,
}

/// Checks a node id given in a path: 40 hex digits.
pub fn check_node_id(node_id: &str) -> Result<()> {
    if node_id.len() == 40 && node_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Error::BadRequest(format!("{node_id:?} is not a node id (40 hex digits, as `devices` lists them)")))
    }
}

fn is_unique_violation(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(d)) if d.is_unique_violation())
}

impl Fleet {
    /// The device behind a node certificate; refuses unknown and revoked devices.
    pub async fn device(&self, node_id: &str) -> Result<Device> {
        let row = sqlx::query("SELECT labels_json, location_json, revoked_at_ms FROM devices WHERE node_id = $1")
            .bind(node_id)
            .fetch_optional(self.db.pool())
            .await?
            .ok_or_else(|| Error::UnknownDevice { node_id: node_id.to_string() })?;
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("revoked_at_ms")? {
            return Err(Error::Revoked { node_id: node_id.to_string(), at_ms });
        }
        Ok(Device {
            node_id: node_id.to_string(),
            labels: from_json(&row, "labels_json")?,
            location: from_json_opt(&row, "location_json")?,
        })
    }

    /// `POST /v1/enroll`: consumes the token and issues a certificate, in one transaction; a
    /// refused request consumes nothing.
    pub async fn enroll(&self, req: EnrollRequest) -> Result<EnrollResponse> {
        let token = Token::parse(&req.token, TokenKind::Enrollment)?;
        check_fleet(self, &token)?;
        let csr = parse_csr(&req.csr_pem)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let row = sqlx::query(
            "SELECT secret_hash, labels_json, location_json, expires_at_ms, used_at_ms, used_by FROM enrollment_tokens WHERE id = $1",
        )
        .bind(&token.id)
        .fetch_optional(&mut *w.tx)
        .await?;
        let unknown = Error::TokenUnknown { kind: "enrollment token" };
        let Some(row) = row else {
            tracing::warn!(token = %token.id, "enrollment with an unknown token");
            return Err(unknown);
        };
        if row.try_get::<String, _>("secret_hash")? != token.secret_hash() {
            tracing::warn!(token = %token.id, "enrollment with a wrong token secret");
            return Err(unknown);
        }
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("used_at_ms")? {
            return Err(Error::TokenUsed {
                at_ms,
                by: row.try_get::<Option<String>, _>("used_by")?.unwrap_or_default(),
            });
        }
        let expires_at_ms: i64 = row.try_get("expires_at_ms")?;
        if expires_at_ms <= now {
            return Err(Error::TokenExpired { kind: "enrollment token", at_ms: expires_at_ms });
        }
        let enrolled = sqlx::query("SELECT node_id FROM devices WHERE node_id = $1")
            .bind(&csr.node_id)
            .fetch_optional(&mut *w.tx)
            .await?;
        if enrolled.is_some() {
            return Err(Error::KeyEnrolled { node_id: csr.node_id });
        }
        let labels: BTreeMap<String, String> = from_json(&row, "labels_json")?;
        let location: Option<Location> = from_json_opt(&row, "location_json")?;
        let signed = self.ca.sign_node(&csr, now, self.policy.cert_lifetime)?;
        let consumed = sqlx::query(
            "UPDATE enrollment_tokens SET used_at_ms = $1, used_by = $2 WHERE id = $3 AND used_at_ms IS NULL",
        )
        .bind(now)
        .bind(&csr.node_id)
        .bind(&token.id)
        .execute(&mut *w.tx)
        .await?
        .rows_affected();
        if consumed != 1 {
            // Another instance used it between our read and this update.
            return Err(Error::TokenUsed { at_ms: now, by: "another device".into() });
        }
        let inserted = sqlx::query(
            "INSERT INTO devices (node_id, token_id, labels_json, location_json, enrolled_at_ms, cert_serial, cert_not_after_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&csr.node_id)
        .bind(&token.id)
        .bind(json(&labels))
        .bind(location.as_ref().map(json))
        .bind(now)
        .bind(&signed.serial)
        .bind(signed.not_after_ms)
        .execute(&mut *w.tx)
        .await
        .map_err(Error::from);
        match inserted {
            Err(e) if is_unique_violation(&e) => return Err(Error::KeyEnrolled { node_id: csr.node_id }),
            other => other?,
        };
        let after = json!({
            "labels": labels, "location": location, "token": token.id,
            "cert_serial": signed.serial, "cert_not_after_ms": signed.not_after_ms,
        });
        w.audit(now, &format!("enrollment:{}", token.id), "device.enroll", &csr.node_id, None, Some(after)).await?;
        w.commit().await?;
        let desired = self.current().for_node(&csr.node_id, &labels, location.as_ref());
        Ok(EnrollResponse { issued: self.issued(&csr.node_id, signed), desired })
    }

    fn issued(&self, node_id: &str, signed: Signed) -> Issued {
        Issued {
            node_id: node_id.to_string(),
            certificate_pem: signed.pem,
            ca_pem: self.ca.cert_pem().to_string(),
            not_after_ms: signed.not_after_ms,
        }
    }

    /// `POST /v1/node/renew`: a new certificate for the same key.
    pub async fn renew(&self, node_id: &str, req: RenewRequest) -> Result<Issued> {
        self.device(node_id).await?;
        let csr = parse_csr(&req.csr_pem)?;
        if csr.node_id != node_id {
            return Err(Error::CsrKeyMismatch { node_id: node_id.to_string() });
        }
        let now = now_ms();
        let signed = self.ca.sign_node(&csr, now, self.policy.cert_lifetime)?;
        let mut w = self.db.write().await?;
        let before = sqlx::query(
            "SELECT cert_serial, cert_not_after_ms FROM devices WHERE node_id = $1 AND revoked_at_ms IS NULL",
        )
        .bind(node_id)
        .fetch_optional(&mut *w.tx)
        .await?
        .ok_or_else(|| Error::UnknownDevice { node_id: node_id.to_string() })?;
        let before = json!({
            "cert_serial": before.try_get::<String, _>("cert_serial")?,
            "cert_not_after_ms": before.try_get::<i64, _>("cert_not_after_ms")?,
        });
        sqlx::query("UPDATE devices SET cert_serial = $1, cert_not_after_ms = $2 WHERE node_id = $3")
            .bind(&signed.serial)
            .bind(signed.not_after_ms)
            .bind(node_id)
            .execute(&mut *w.tx)
            .await?;
        let after = json!({ "cert_serial": signed.serial, "cert_not_after_ms": signed.not_after_ms });
        w.audit(now, &format!("device:{node_id}"), "device.renew", node_id, Some(before), Some(after)).await?;
        w.commit().await?;
        Ok(self.issued(node_id, signed))
    }

    /// `POST /v1/node/report`: what the node runs and how it is.
    pub async fn report(&self, node_id: &str, report: Report) -> Result<()> {
        let too_long = |what: &str| Err(Error::BadRequest(format!("report: {what} is too long")));
        if report.message.as_ref().is_some_and(|m| m.len() > 1024) {
            return too_long("message");
        }
        if report.apply_error.as_ref().is_some_and(|e| e.message.len() > 4096) {
            return too_long("apply_error.message");
        }
        if report.policies.len() > 256 || report.digest_applied.len() > 128 || report.policy_errors.len() > 256 {
            return too_long("policies, policy_errors or digest");
        }
        if report.policy_errors.iter().any(|e| e.error.len() > 4096) {
            return too_long("a policy error");
        }
        if let Some(s) = &report.storage
            && (s.classes.len() > 256
                || s.classes.iter().any(|c| c.class.len() > 64 || c.on_full.len() > 16)
                || s.export_last_error.as_ref().is_some_and(|e| e.len() > 4096))
        {
            return too_long("storage");
        }
        let mut w = self.db.write().await?;
        let updated = sqlx::query(
            "UPDATE devices SET last_seen_ms = $1, generation_applied = $2, digest_applied = $3, health = $4, \
             message = $5, apply_error_json = $6, policies_json = $7, policy_errors_json = $8, storage_json = $9 \
             WHERE node_id = $10 AND revoked_at_ms IS NULL",
        )
        .bind(now_ms())
        .bind(i64::try_from(report.generation_applied).unwrap_or(i64::MAX))
        .bind(&report.digest_applied)
        .bind(json(&report.health).trim_matches('"').to_string())
        .bind(&report.message)
        .bind(report.apply_error.as_ref().map(json))
        .bind(json(&report.policies))
        .bind(json(&report.policy_errors))
        .bind(report.storage.as_ref().map(json))
        .bind(node_id)
        .execute(&mut *w.tx)
        .await?
        .rows_affected();
        if updated != 1 {
            drop(w);
            self.device(node_id).await?;
            return Err(Error::UnknownDevice { node_id: node_id.to_string() });
        }
        w.commit().await?;
        if !report.policies.is_empty() || !report.policy_errors.is_empty() {
            self.reported.notify_one();
        }
        Ok(())
    }

    /// `POST /v1/devices/{node_id}/revoke` (operator): the device is refused from now on, and
    /// its id goes into every node's revocation list (a new generation).
    pub async fn revoke(&self, caller: &Caller, node_id: &str, req: RevokeDevice) -> Result<Changed> {
        caller.require(Role::Operator)?;
        check_node_id(node_id)?;
        if req.reason.as_ref().is_some_and(|r| r.len() > 1024) {
            return Err(Error::BadRequest("revocation reason is too long (1024 bytes at most)".into()));
        }
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let row = sqlx::query("SELECT revoked_at_ms FROM devices WHERE node_id = $1")
            .bind(node_id)
            .fetch_optional(&mut *w.tx)
            .await?
            .ok_or_else(|| Error::NotFound { what: format!("device {node_id}") })?;
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("revoked_at_ms")? {
            return Err(Error::Revoked { node_id: node_id.to_string(), at_ms });
        }
        sqlx::query("UPDATE devices SET revoked_at_ms = $1, revoked_reason = $2 WHERE node_id = $3")
            .bind(now)
            .bind(&req.reason)
            .bind(node_id)
            .execute(&mut *w.tx)
            .await?;
        let after = json!({ "revoked_at_ms": now, "reason": req.reason, "generation": generation });
        w.audit(now, &caller.actor(), "device.revoke", node_id, Some(json!({ "revoked_at_ms": null })), Some(after))
            .await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }

    /// `PUT /v1/devices/{node_id}/location` (operator): moves (or clears) the device's
    /// location; the device gets it with the next watch answer (a new generation), and node
    /// configurations, HTTP tokens and rollouts that select by geohash see it from then on.
    pub async fn set_location(&self, caller: &Caller, node_id: &str, req: SetDeviceLocation) -> Result<Changed> {
        caller.require(Role::Operator)?;
        check_node_id(node_id)?;
        if let Some(l) = &req.location {
            l.validate().map_err(|e| Error::BadRequest(e.to_string()))?;
        }
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let row = sqlx::query("SELECT location_json, revoked_at_ms FROM devices WHERE node_id = $1")
            .bind(node_id)
            .fetch_optional(&mut *w.tx)
            .await?
            .ok_or_else(|| Error::NotFound { what: format!("device {node_id} (see `timeshard-control devices`)") })?;
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("revoked_at_ms")? {
            return Err(Error::Revoked { node_id: node_id.to_string(), at_ms });
        }
        let before: Option<Location> = from_json_opt(&row, "location_json")?;
        if before == req.location {
            // Nothing changes: no new generation (dropping `w` rolls back the increment).
            return Ok(Changed { generation: generation - 1, matched: None });
        }
        sqlx::query("UPDATE devices SET location_json = $1 WHERE node_id = $2")
            .bind(req.location.as_ref().map(json))
            .bind(node_id)
            .execute(&mut *w.tx)
            .await?;
        let (before, after) =
            (json!({ "location": before }), json!({ "location": req.location, "generation": generation }));
        w.audit(now, &caller.actor(), "device.location", node_id, Some(before), Some(after)).await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }
}

//! API tokens (who may call the API, with which role) and enrollment tokens (which device may
//! enroll, with which labels and location). Only SHA-256 of a secret is stored.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sqlx::Row;
use timeshard_control_api::api::{
    ApiTokenInfo, CreateApiToken, CreateEnrollmentToken, EnrollmentTokenInfo, TokenCreated,
};
use timeshard_control_api::state::validate_labels;
use timeshard_control_api::{Role, Token, TokenKind};

use super::Fleet;
use crate::db::{from_json, from_json_opt, json};
use crate::error::{Error, Result};
use crate::time::{ms, now_ms};

/// Who is calling, from their API token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub token_id: String,
    pub name: String,
    pub role: Role,
}

impl Caller {
    /// How the audit log names the caller.
    pub fn actor(&self) -> String {
        format!("token:{} ({})", self.token_id, self.name)
    }

    /// Refuses unless the caller's role is at least `needed`.
    pub fn require(&self, needed: Role) -> Result<()> {
        if self.role >= needed {
            Ok(())
        } else {
            Err(Error::Forbidden { needed: needed.as_str(), has: self.role.to_string(), token: self.name.clone() })
        }
    }
}

/// Checks that `token` was made for this fleet.
pub fn check_fleet(fleet: &Fleet, token: &Token) -> Result<()> {
    if token.fleet != fleet.ca.fingerprint() {
        return Err(Error::TokenWrongFleet {
            token_fleet: token.fleet.to_string(),
            ours: fleet.ca.fingerprint().to_string(),
        });
    }
    Ok(())
}

pub(super) fn expiry(now: i64, expires_in_s: u64, max: Duration) -> Result<i64> {
    let asked = Duration::from_secs(expires_in_s);
    if asked.is_zero() || asked > max {
        return Err(Error::BadRequest(format!("expiry must be between 1s and {}", humantime::format_duration(max))));
    }
    Ok(now + ms(asked))
}

/// How long an API token lives unless its creator says otherwise.
pub const API_TOKEN_LIFETIME: Duration = Duration::from_secs(90 * 86_400);

impl Fleet {
    /// The caller behind `Authorization: Bearer <text>`.
    pub async fn authenticate(&self, text: &str) -> Result<Caller> {
        let token = Token::parse(text, TokenKind::Api).map_err(|e| Error::Unauthorized(e.to_string()))?;
        check_fleet(self, &token)?;
        let row =
            sqlx::query("SELECT name, role, secret_hash, expires_at_ms, revoked_at_ms FROM api_tokens WHERE id = $1")
                .bind(&token.id)
                .fetch_optional(self.db.pool())
                .await?
                .ok_or(Error::TokenUnknown { kind: "API token" })?;
        if row.try_get::<String, _>("secret_hash")? != token.secret_hash() {
            return Err(Error::TokenUnknown { kind: "API token" });
        }
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("revoked_at_ms")? {
            return Err(Error::TokenRevoked { at_ms });
        }
        if let Some(at_ms) = row.try_get::<Option<i64>, _>("expires_at_ms")?
            && at_ms <= now_ms()
        {
            return Err(Error::TokenExpired { kind: "API token", at_ms });
        }
        let role: String = row.try_get("role")?;
        Ok(Caller { token_id: token.id, name: row.try_get("name")?, role: role.parse()? })
    }

    /// Creates the first admin token (`serve --init`). Refuses when any API token exists.
    pub async fn init_admin(&self) -> Result<Token> {
        let mut w = self.db.write().await?;
        // Lock the fleet row: two instances started with --init at once make one admin token.
        sqlx::query("UPDATE fleet SET id = id WHERE id = 1").execute(&mut *w.tx).await?;
        // A fleet whose admin tokens all expired or were revoked may be initialized again, or
        // nobody could ever manage it: whoever runs `serve` holds its database and key anyway.
        let now = now_ms();
        let count: i64 = sqlx::query(
            "SELECT COUNT(*) FROM api_tokens WHERE role = 'admin' AND revoked_at_ms IS NULL \
             AND (expires_at_ms IS NULL OR expires_at_ms > $1)",
        )
        .bind(now)
        .fetch_one(&mut *w.tx)
        .await?
        .try_get(0)?;
        if count > 0 {
            return Err(Error::BadRequest(
                "this fleet is already initialized (it has an admin API token); start `serve` without --init, \
                 and create more tokens with `timeshard-control api-token create`"
                    .into(),
            ));
        }
        let token = Token::generate(TokenKind::Api, self.ca.fingerprint());
        let expires = now + API_TOKEN_LIFETIME.as_millis() as i64;
        insert_api_token(&mut w, &token, "initial-admin", Role::Admin, "serve --init", now, Some(expires)).await?;
        let after = json!({ "id": token.id, "name": "initial-admin", "role": "admin", "expires_at_ms": expires });
        w.audit(now, "serve --init", "api-token.create", &token.id, None, Some(after)).await?;
        w.commit().await?;
        Ok(token)
    }

    /// `POST /v1/api-tokens` (admin). A token expires after [`API_TOKEN_LIFETIME`] unless asked
    /// otherwise (at most ten years).
    pub async fn create_api_token(&self, caller: &Caller, req: CreateApiToken) -> Result<TokenCreated> {
        caller.require(Role::Admin)?;
        let role: Role = req.role.parse()?;
        if req.name.is_empty() || req.name.len() > 64 || req.name.chars().any(char::is_control) {
            return Err(Error::BadRequest("token name must be 1 to 64 printable characters".into()));
        }
        let now = now_ms();
        let asked = req.expires_in_s.unwrap_or(API_TOKEN_LIFETIME.as_secs());
        let expires = Some(expiry(now, asked, Duration::from_secs(10 * 365 * 86_400))?);
        let token = Token::generate(TokenKind::Api, self.ca.fingerprint());
        let mut w = self.db.write().await?;
        insert_api_token(&mut w, &token, &req.name, role, &caller.actor(), now, expires).await?;
        let after = json!({ "id": token.id, "name": req.name, "role": role, "expires_at_ms": expires });
        w.audit(now, &caller.actor(), "api-token.create", &token.id, None, Some(after)).await?;
        w.commit().await?;
        Ok(TokenCreated { token: token.to_string(), id: token.id, expires_at_ms: expires })
    }

    /// `GET /v1/api-tokens` (admin).
    pub async fn list_api_tokens(&self, caller: &Caller) -> Result<Vec<ApiTokenInfo>> {
        caller.require(Role::Admin)?;
        let rows = sqlx::query(
            "SELECT id, name, role, created_by, created_at_ms, expires_at_ms, revoked_at_ms FROM api_tokens ORDER BY created_at_ms, id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ApiTokenInfo {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    role: r.try_get::<String, _>("role")?.parse()?,
                    created_by: r.try_get("created_by")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                    expires_at_ms: r.try_get("expires_at_ms")?,
                    revoked_at_ms: r.try_get("revoked_at_ms")?,
                })
            })
            .collect()
    }

    /// `DELETE /v1/api-tokens/{id}` (admin).
    pub async fn revoke_api_token(&self, caller: &Caller, id: &str) -> Result<()> {
        caller.require(Role::Admin)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let done = sqlx::query("UPDATE api_tokens SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL")
            .bind(now)
            .bind(id)
            .execute(&mut *w.tx)
            .await?
            .rows_affected();
        if done != 1 {
            return Err(Error::NotFound { what: format!("unrevoked API token {id:?}") });
        }
        w.audit(now, &caller.actor(), "api-token.revoke", id, None, None).await?;
        w.commit().await
    }

    /// `POST /v1/enrollment-tokens` (operator).
    pub async fn create_enrollment_token(&self, caller: &Caller, req: CreateEnrollmentToken) -> Result<TokenCreated> {
        caller.require(Role::Operator)?;
        validate_labels(&req.labels).map_err(Error::BadRequest)?;
        if let Some(l) = &req.location {
            l.validate().map_err(|e| Error::BadRequest(e.to_string()))?;
        }
        let now = now_ms();
        let expires = expiry(now, req.expires_in_s, self.policy.max_token_lifetime)?;
        let token = Token::generate(TokenKind::Enrollment, self.ca.fingerprint());
        let mut w = self.db.write().await?;
        sqlx::query(
            "INSERT INTO enrollment_tokens (id, secret_hash, labels_json, location_json, created_by, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&token.id)
        .bind(token.secret_hash())
        .bind(json(&req.labels))
        .bind(req.location.as_ref().map(json))
        .bind(caller.actor())
        .bind(now)
        .bind(expires)
        .execute(&mut *w.tx)
        .await?;
        let after = json!({ "id": token.id, "labels": req.labels, "location": req.location, "expires_at_ms": expires });
        w.audit(now, &caller.actor(), "enrollment-token.create", &token.id, None, Some(after)).await?;
        w.commit().await?;
        Ok(TokenCreated { token: token.to_string(), id: token.id, expires_at_ms: Some(expires) })
    }

    /// `GET /v1/enrollment-tokens` (viewer).
    pub async fn list_enrollment_tokens(&self, caller: &Caller) -> Result<Vec<EnrollmentTokenInfo>> {
        caller.require(Role::Viewer)?;
        let rows = sqlx::query(
            "SELECT id, labels_json, location_json, created_by, created_at_ms, expires_at_ms, used_at_ms, used_by \
             FROM enrollment_tokens ORDER BY created_at_ms, id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EnrollmentTokenInfo {
                    id: r.try_get("id")?,
                    labels: from_json::<BTreeMap<String, String>>(r, "labels_json")?,
                    location: from_json_opt(r, "location_json")?,
                    created_by: r.try_get("created_by")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                    expires_at_ms: r.try_get("expires_at_ms")?,
                    used_at_ms: r.try_get("used_at_ms")?,
                    used_by: r.try_get("used_by")?,
                })
            })
            .collect()
    }
}

async fn insert_api_token(
    w: &mut crate::db::Write,
    token: &Token,
    name: &str,
    role: Role,
    created_by: &str,
    now: i64,
    expires: Option<i64>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO api_tokens (id, name, role, secret_hash, created_by, created_at_ms, expires_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&token.id)
    .bind(name)
    .bind(role.as_str())
    .bind(token.secret_hash())
    .bind(created_by)
    .bind(now)
    .bind(expires)
    .execute(&mut *w.tx)
    .await?;
    Ok(())
}

//! Tokens for the nodes' HTTP side. The control plane keeps SHA-256 of each secret; every
//! selected node receives the id and hash in its desired state, so creating or revoking one is a
//! new generation and reaches the fleet the way classes do.

use std::time::Duration;

use serde_json::json;
use sqlx::{AnyPool, Row};
use timeshard_control_api::api::{Changed, CreateHttpToken, HttpTokenInfo, TokenCreated};
use timeshard_control_api::{HttpTokenEntry, HttpTokenGrant, Role, Selector, Token, TokenKind};

use super::Fleet;
use super::tokens::{Caller, expiry};
use crate::db::{from_json, json};
use crate::error::{Error, Result};
use crate::time::now_ms;

/// Most unrevoked HTTP tokens in a fleet: each is in the desired state of every node it selects.
pub const MAX_HTTP_TOKENS: i64 = 1024;
/// Longest an HTTP token may live.
const MAX_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);

impl Fleet {
    /// `POST /v1/http-tokens` (operator).
    pub async fn create_http_token(&self, caller: &Caller, req: CreateHttpToken) -> Result<TokenCreated> {
        caller.require(Role::Operator)?;
        if req.name.is_empty() || req.name.len() > 64 || req.name.chars().any(char::is_control) {
            return Err(Error::BadRequest("token name must be 1 to 64 printable characters".into()));
        }
        req.selector.validate().map_err(Error::BadRequest)?;
        let now = now_ms();
        let expires = req.expires_in_s.map(|s| expiry(now, s, MAX_LIFETIME)).transpose()?;
        let token = Token::generate(TokenKind::Http, self.ca.fingerprint());
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let live: i64 = sqlx::query("SELECT COUNT(*) FROM http_tokens WHERE revoked_at_ms IS NULL")
            .fetch_one(&mut *w.tx)
            .await?
            .try_get(0)?;
        if live >= MAX_HTTP_TOKENS {
            return Err(Error::BadRequest(format!(
                "a fleet has at most {MAX_HTTP_TOKENS} unrevoked HTTP tokens; revoke unused ones with \
                 `timeshard-control http-token revoke`"
            )));
        }
        sqlx::query(
            "INSERT INTO http_tokens (id, name, secret_hash, selector_json, created_by, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&token.id)
        .bind(&req.name)
        .bind(token.secret_hash())
        .bind(json(&req.selector))
        .bind(caller.actor())
        .bind(now)
        .bind(expires)
        .execute(&mut *w.tx)
        .await?;
        let after = json!({ "id": token.id, "name": req.name, "selector": req.selector, "expires_at_ms": expires,
                            "generation": generation });
        w.audit(now, &caller.actor(), "http-token.create", &token.id, None, Some(after)).await?;
        w.commit().await?;
        self.changed();
        Ok(TokenCreated { token: token.to_string(), id: token.id, expires_at_ms: expires })
    }

    /// `GET /v1/http-tokens` (viewer).
    pub async fn list_http_tokens(&self, caller: &Caller) -> Result<Vec<HttpTokenInfo>> {
        caller.require(Role::Viewer)?;
        let rows = sqlx::query(
            "SELECT id, name, selector_json, created_by, created_at_ms, expires_at_ms, revoked_at_ms \
             FROM http_tokens ORDER BY created_at_ms, id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(HttpTokenInfo {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    selector: from_json(r, "selector_json")?,
                    created_by: r.try_get("created_by")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                    expires_at_ms: r.try_get("expires_at_ms")?,
                    revoked_at_ms: r.try_get("revoked_at_ms")?,
                })
            })
            .collect()
    }

    /// `DELETE /v1/http-tokens/{id}` (operator): nodes refuse it once they apply the new generation.
    pub async fn revoke_http_token(&self, caller: &Caller, id: &str) -> Result<Changed> {
        caller.require(Role::Operator)?;
        let now = now_ms();
        let mut w = self.db.write().await?;
        let generation = w.bump_generation(now).await?;
        let done = sqlx::query("UPDATE http_tokens SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL")
            .bind(now)
            .bind(id)
            .execute(&mut *w.tx)
            .await?
            .rows_affected();
        if done != 1 {
            return Err(Error::NotFound { what: format!("unrevoked HTTP token {id:?}") });
        }
        let after = json!({ "revoked_at_ms": now, "generation": generation });
        w.audit(now, &caller.actor(), "http-token.revoke", id, None, Some(after)).await?;
        w.commit().await?;
        self.changed();
        Ok(Changed { generation, matched: None })
    }
}

/// The unrevoked HTTP tokens not expired at `at_ms` (read by [`super::load_state`]
/// between its two reads of the generation). Nodes check expiry themselves as well.
pub async fn load_entries(pool: &AnyPool, at_ms: i64) -> Result<Vec<HttpTokenEntry>> {
    let rows = sqlx::query(
        "SELECT id, name, secret_hash, selector_json, expires_at_ms FROM http_tokens \
         WHERE revoked_at_ms IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > $1)",
    )
    .bind(at_ms)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let selector: Selector = from_json(r, "selector_json")?;
            let grant = HttpTokenGrant {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                secret_hash: r.try_get("secret_hash")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
            };
            Ok(HttpTokenEntry { grant, selector })
        })
        .collect()
}

//! Policy modules: uploads (checked as components of their kind, stored by content hash, signed
//! with the fleet's policy key), what `policy list` and `policy show` print, and module bytes
//! for nodes and operators.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use sqlx::Row;
use timeshard_control_api::Role;
use timeshard_control_api::api::PolicyRun;
use timeshard_control_api::policy::{Kind, MAX_MODULE_BYTES, PolicyVersionInfo, UploadQuery, Uploaded};
use timeshard_policy::PolicyRef;
use timeshard_policy::component;
use timeshard_policy::signing::{self, Identity};

use super::Fleet;
use super::store;
use super::tokens::Caller;
use crate::db::from_json_opt;
use crate::error::{Error, Result};
use crate::time::now_ms;

/// Checks a module's name, version and kind as the upload gives them.
pub fn identity(name: &str, version: &str, kind: &str) -> Result<Identity> {
    let invalid = |reason: String| Error::PolicyInvalid { name: name.into(), version: version.into(), reason };
    let policy = PolicyRef::new(name, version).map_err(|e| invalid(e.to_string()))?;
    let kind: Kind = kind.parse().map_err(invalid)?;
    Ok(Identity::new(policy, kind))
}

impl Fleet {
    /// The key nodes trust for policies: the offline key, or the service's own (made by the
    /// first upload, which changes no generation).
    pub async fn policy_public_key(&self) -> Result<Option<String>> {
        match &self.policy.offline_policy_key {
            Some(key) => Ok(Some(key.to_text())),
            None => store::public_key(self.db.pool()).await,
        }
    }

    /// `POST /v1/policies` (operator): checks the module, stores it by hash and signs it. The
    /// same bytes under the same name and version again change nothing.
    ///
    /// With an offline policy key ([`super::Policy::offline_policy_key`]) the upload must carry
    /// its signature, made with that key for this name, version, kind and these bytes; it is
    /// stored as it is. Without one, a signature is refused and the service signs.
    pub async fn upload_policy(&self, caller: &Caller, query: UploadQuery, wasm: &[u8]) -> Result<Uploaded> {
        caller.require(Role::Operator)?;
        let id = identity(&query.name, &query.version, &query.kind)?;
        let (name, version) = (&id.policy.name, &id.policy.version);
        let invalid = |reason: String| Error::PolicyInvalid { name: name.clone(), version: version.clone(), reason };
        let signature = query.signature_text().map_err(&invalid)?;
        let offline = match (&self.policy.offline_policy_key, signature) {
            (Some(key), Some(text)) => {
                if query.min_version.is_some() {
                    return Err(invalid(
                        "policies are signed offline here: the minimum version is part of the signature \
                         (`timeshard-control policy sign --min-version`), not of the upload"
                            .into(),
                    ));
                }
                let parsed = signing::Signature::from_text(&text).map_err(|e| invalid(e.to_string()))?;
                signing::verify(&signing::TrustedKeys::new([*key]), wasm, &id, &parsed, false).map_err(|e| {
                    invalid(format!("its signature is refused: {e}; sign with the fleet's offline key"))
                })?;
                Some(text)
            }
            (Some(_), None) => {
                return Err(invalid(
                    "this control plane signs no policy: sign the module offline with the fleet's key \
                     (`timeshard-control policy sign`) and upload it with --signature"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "this control plane signs policies itself: upload without --signature, or start it with \
                     --policy-public-key to sign offline"
                        .into(),
                ));
            }
            (None, None) => None,
        };
        if wasm.len() > MAX_MODULE_BYTES {
            return Err(Error::ModuleTooLarge { size: wasm.len(), limit: MAX_MODULE_BYTES });
        }
        component::inspect(wasm, id.kind).map_err(|e| Error::PolicyInvalid {
            name: name.clone(),
            version: version.clone(),
            reason: e.to_string(),
        })?;
        let sha256 = signing::hex(&signing::sha256(wasm));
        let now = now_ms();
        let mut w = self.db.write().await?;
        let existing = store::versions(&mut *w.tx, Some(name)).await?;
        if let Some(same) = existing.iter().find(|v| &v.version == version) {
            if same.sha256 != sha256 {
                return Err(Error::VersionConflict {
                    name: name.clone(),
                    version: version.clone(),
                    existing: same.sha256.clone(),
                    uploaded: sha256,
                });
            }
            if same.kind != id.kind {
                return Err(Error::KindConflict {
                    name: name.clone(),
                    existing: same.kind.to_string(),
                    uploaded: id.kind.to_string(),
                });
            }
            return Ok(Uploaded { policy: same.clone(), created: false });
        }
        if let Some(other) = existing.iter().find(|v| v.kind != id.kind) {
            return Err(Error::KindConflict {
                name: name.clone(),
                existing: other.kind.to_string(),
                uploaded: id.kind.to_string(),
            });
        }
        let signature = match offline {
            Some(text) => text,
            None => {
                let key = store::policy_key(self.db.pool(), self.db.kek(), &mut w, now).await?;
                match &query.min_version {
                    Some(min) => {
                        signing::sign_revoking_below(&key, wasm, &id, min).map_err(|e| invalid(e.to_string()))?
                    }
                    None => signing::sign(&key, wasm, &id),
                }
                .to_text()
            }
        };
        sqlx::query(
            "INSERT INTO policy_blobs (sha256, size, wasm_base64) VALUES ($1, $2, $3) ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(&sha256)
        .bind(wasm.len() as i64)
        .bind(STANDARD.encode(wasm))
        .execute(&mut *w.tx)
        .await?;
        let info = PolicyVersionInfo {
            name: name.clone(),
            version: version.clone(),
            kind: id.kind,
            sha256,
            size: wasm.len() as u64,
            uploaded_by: caller.actor(),
            uploaded_at_ms: now,
            signature,
            nodes: Vec::new(),
        };
        sqlx::query(
            "INSERT INTO policy_versions (name, version, kind, sha256, size, signature, uploaded_by, uploaded_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&info.name)
        .bind(&info.version)
        .bind(info.kind.to_string())
        .bind(&info.sha256)
        .bind(info.size as i64)
        .bind(&info.signature)
        .bind(&info.uploaded_by)
        .bind(info.uploaded_at_ms)
        .execute(&mut *w.tx)
        .await?;
        let after = json!({ "kind": info.kind, "sha256": info.sha256, "size": info.size });
        w.audit(now, &caller.actor(), "policy.upload", &format!("{name}@{version}"), None, Some(after)).await?;
        w.commit().await?;
        Ok(Uploaded { policy: info, created: true })
    }

    /// `GET /v1/policies` and `GET /v1/policies/{name}` (viewer): versions, with the nodes
    /// that report running each.
    pub async fn list_policies(&self, caller: &Caller, name: Option<&str>) -> Result<Vec<PolicyVersionInfo>> {
        caller.require(Role::Viewer)?;
        let mut versions = store::versions(self.db.pool(), name).await?;
        if let Some(name) = name
            && versions.is_empty()
        {
            return Err(Error::NotFound { what: format!("policy {name:?} (see `timeshard-control policy list`)") });
        }
        let running = self.running_versions().await?;
        for v in &mut versions {
            v.nodes = running.get(&(v.name.clone(), v.version.clone())).cloned().unwrap_or_default();
        }
        Ok(versions)
    }

    /// Which enrolled nodes report running each `(name, version)`.
    pub async fn running_versions(&self) -> Result<BTreeMap<(String, String), Vec<String>>> {
        let rows =
            sqlx::query("SELECT node_id, policies_json FROM devices WHERE revoked_at_ms IS NULL ORDER BY node_id")
                .fetch_all(self.db.pool())
                .await?;
        let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for r in &rows {
            let node: String = r.try_get("node_id")?;
            let runs: Vec<PolicyRun> = from_json_opt(r, "policies_json")?.unwrap_or_default();
            for run in runs {
                out.entry((run.name, run.version)).or_default().push(node.clone());
            }
        }
        Ok(out)
    }

    /// `GET /v1/policies/{name}/{version}/module` (viewer): the module's bytes.
    pub async fn policy_module(&self, caller: &Caller, name: &str, version: &str) -> Result<Vec<u8>> {
        caller.require(Role::Viewer)?;
        let row = sqlx::query("SELECT sha256 FROM policy_versions WHERE name = $1 AND version = $2")
            .bind(name)
            .bind(version)
            .fetch_optional(self.db.pool())
            .await?
            .ok_or_else(|| Error::NotFound { what: format!("policy {name}@{version}") })?;
        self.module_bytes(&row.try_get::<String, _>("sha256")?).await
    }

    /// `GET /v1/node/modules/{sha256}` (node certificate): a module by hash.
    pub async fn node_module(&self, node_id: &str, sha256: &str) -> Result<Vec<u8>> {
        self.device(node_id).await?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::BadRequest(format!("{sha256:?} is not a SHA-256 (64 hex digits)")));
        }
        self.module_bytes(sha256).await
    }

    async fn module_bytes(&self, sha256: &str) -> Result<Vec<u8>> {
        let row = sqlx::query("SELECT wasm_base64 FROM policy_blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(self.db.pool())
            .await?
            .ok_or_else(|| Error::NotFound { what: format!("module {sha256}") })?;
        STANDARD
            .decode(row.try_get::<String, _>("wasm_base64")?)
            .map_err(|e| Error::Internal(format!("stored module {sha256} is unreadable: {e}")))
    }
}

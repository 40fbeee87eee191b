//! The database: one `sqlx::Any` pool over SQLite or PostgreSQL, the same SQL on both (`$N`
//! parameters, BIGINT and TEXT columns), versioned migrations embedded from `migrations/`, write
//! transactions, and the fleet row (CA and generation). What the tables mean is the `fleet`
//! module's business; nothing here reads them.
//!
//! Changes of desired state go through [`Write::bump_generation`], which raises the fleet's
//! generation inside the transaction. On PostgreSQL that also takes the fleet row's lock, so
//! changes from several `serve` instances are serialized, and `pg_notify` tells the other
//! instances at commit. SQLite has one writer; an in-process lock queues writers instead of
//! letting them fail with `SQLITE_BUSY`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::{Any, AnyPool, Row};
use timeshard_control_api::token::random_hex;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::ca::FleetCa;
use crate::error::{Error, Result};
use crate::sealed::{self, Kek};

/// PostgreSQL channel on which committed generations are announced.
pub const NOTIFY_CHANNEL: &str = "timeshard_fleet";

/// The migrations, in order. Files in `migrations/`; the same SQL runs on both backends.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "fleet", include_str!("../migrations/0001_fleet.sql")),
    (2, "policies", include_str!("../migrations/0002_policies.sql")),
    (3, "http_tokens", include_str!("../migrations/0003_http_tokens.sql")),
    (4, "device_storage", include_str!("../migrations/0004_device_storage.sql")),
];

#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, sqlx::error::BoxDynError>> + Send + 'static>> {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|&(version, name, sql)| {
                    Migration::new(version, name.into(), MigrationType::Simple, sql.into(), false)
                })
                .collect())
        })
    }
}

/// Which database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The pool and how to write to it.
#[derive(Clone, Debug)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
    url: String,
    writer: Arc<Mutex<()>>,
    /// Seals the keys stored in the database.
    kek: Arc<Kek>,
}

/// A write transaction. Dropping it without [`Write::commit`] rolls back.
pub struct Write {
    // Declared first: the transaction ends before the lock is released.
    pub tx: sqlx::Transaction<'static, Any>,
    _writer: Option<OwnedMutexGuard<()>>,
    backend: Backend,
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Write").field("backend", &self.backend).finish()
    }
}

/// JSON for a TEXT column.
pub fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

/// A TEXT column back from JSON; a bad document is an internal error naming the column.
pub fn from_json<T: serde::de::DeserializeOwned>(row: &AnyRow, column: &str) -> Result<T> {
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text).map_err(|e| Error::Internal(format!("stored {column} is unreadable: {e}")))
}

/// A nullable TEXT column back from JSON.
pub fn from_json_opt<T: serde::de::DeserializeOwned>(row: &AnyRow, column: &str) -> Result<Option<T>> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| Error::Internal(format!("stored {column} is unreadable: {e}"))))
        .transpose()
}

/// What the fleet CA's key is sealed as.
const CA_KEY: &str = "fleet CA key";

impl Db {
    /// Connects to `url` (`sqlite://PATH` or `postgres://...`) and applies pending migrations;
    /// keys are stored sealed under `kek`.
    pub async fn connect(url: &str, kek: Kek) -> Result<Db> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(Error::BadRequest(format!(
                "unsupported database {url:?}: use --database postgres://USER@HOST:PORT/DB, or leave it out for SQLite in --data-dir"
            )));
        };
        let max = match backend {
            Backend::Sqlite => 8,
            Backend::Postgres => 16,
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|e| Error::Internal(format!("cannot open the database {}: {e}", redact(url))))?;
        if backend == Backend::Sqlite {
            // Readers do not block the writer; FULL (sqlx's default) syncs every commit.
            sqlx::query("PRAGMA journal_mode = WAL").execute(&pool).await?;
        }
        let migrator = Migrator::new(Embedded).await.map_err(|e| Error::Internal(format!("migrations: {e}")))?;
        migrator.run(&pool).await.map_err(|e| Error::Internal(format!("cannot migrate the database: {e}")))?;
        Ok(Db { pool, backend, url: url.to_string(), writer: Arc::new(Mutex::new(())), kek: Arc::new(kek) })
    }

    /// The key-encryption key the stored keys are sealed under.
    pub fn kek(&self) -> &Kek {
        &self.kek
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Begins a write transaction.
    pub async fn write(&self) -> Result<Write> {
        let guard = match self.backend {
            Backend::Sqlite => Some(self.writer.clone().lock_owned().await),
            Backend::Postgres => None,
        };
        let tx = self.pool.begin().await?;
        Ok(Write { tx, _writer: guard, backend: self.backend })
    }

    /// Loads the fleet CA, creating it on first use. Several instances starting at once on
    /// one PostgreSQL agree on one CA: the insert does nothing when the row exists.
    pub async fn fleet_ca(&self, now_ms: i64) -> Result<FleetCa> {
        if let Some(ca) = self.load_ca().await? {
            return Ok(ca);
        }
        let (cert_pem, key_pem) = FleetCa::generate(now_ms)?;
        let fingerprint = FleetCa::load(&cert_pem, &key_pem)?.fingerprint().to_string();
        let key_pem = self.kek.seal(&key_pem, CA_KEY)?;
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO fleet (id, generation, changed_at_ms, ca_cert_pem, ca_key_pem, ca_fingerprint, created_at_ms) \
             VALUES (1, 1, $1, $2, $3, $4, $1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(now_ms)
        .bind(&cert_pem)
        .bind(&key_pem)
        .bind(&fingerprint)
        .execute(&mut *w.tx)
        .await?;
        w.commit().await?;
        self.load_ca().await?.ok_or_else(|| Error::Internal("the fleet CA vanished after creation".into()))
    }

    /// The stored CA, its key opened with the key-encryption key. A key stored in the clear by
    /// an older version is sealed now.
    async fn load_ca(&self) -> Result<Option<FleetCa>> {
        let row =
            sqlx::query("SELECT ca_cert_pem, ca_key_pem FROM fleet WHERE id = 1").fetch_optional(&self.pool).await?;
        let Some(row) = row else { return Ok(None) };
        let (cert_pem, stored): (String, String) = (row.try_get("ca_cert_pem")?, row.try_get("ca_key_pem")?);
        if sealed::is_sealed(&stored) {
            return FleetCa::load(&cert_pem, &self.kek.open(&stored, CA_KEY)?).map(Some);
        }
        let ca = FleetCa::load(&cert_pem, &stored)?;
        let mut w = self.write().await?;
        sqlx::query("UPDATE fleet SET ca_key_pem = $1 WHERE id = 1 AND ca_key_pem = $2")
            .bind(self.kek.seal(&stored, CA_KEY)?)
            .bind(&stored)
            .execute(&mut *w.tx)
            .await?;
        w.commit().await?;
        tracing::info!(
            "sealed the fleet CA's key, stored in the clear by an older version, under the key-encryption key"
        );
        Ok(Some(ca))
    }

    /// The current generation.
    pub async fn generation(&self) -> Result<u64> {
        let g: i64 =
            sqlx::query("SELECT generation FROM fleet WHERE id = 1").fetch_one(&self.pool).await?.try_get(0)?;
        Ok(g as u64)
    }
}

impl Write {
    /// Raises the fleet generation (and, on PostgreSQL, locks the fleet row until commit and
    /// announces the new generation to other instances at commit).
    pub async fn bump_generation(&mut self, now_ms: i64) -> Result<u64> {
        let g: i64 = sqlx::query(
            "UPDATE fleet SET generation = generation + 1, changed_at_ms = $1 WHERE id = 1 RETURNING generation",
        )
        .bind(now_ms)
        .fetch_one(&mut *self.tx)
        .await?
        .try_get(0)?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(g.to_string())
                .execute(&mut *self.tx)
                .await?;
        }
        Ok(g as u64)
    }

    /// Records a change in the audit log, in this transaction.
    pub async fn audit(
        &mut self,
        at_ms: i64,
        actor: &str,
        action: &str,
        target: &str,
        before: Option<serde_json::Value>,
        after: Option<serde_json::Value>,
    ) -> Result<()> {
        let id = format!("{:013}-{}", at_ms.max(0), random_hex(8));
        sqlx::query(
            "INSERT INTO audit (id, at_ms, actor, action, target, before_json, after_json) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(at_ms)
        .bind(actor)
        .bind(action)
        .bind(target)
        .bind(before.map(|v| v.to_string()))
        .bind(after.map(|v| v.to_string()))
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }
}

/// `url` without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..scheme + 3], user, &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

//! What the service does, apart from HTTP: each operation checks its input, writes in one
//! transaction with its audit record (or refuses and writes nothing), and announces changes of
//! desired state. Split by concern: tokens and callers ([`tokens`]), enrollment and the device
//! endpoints ([`devices`]), desired state ([`desired`]), tokens for the nodes' HTTP side
//! ([`http_tokens`]), policy modules ([`policies`]) and their rollouts ([`rollouts`], watched by
//! [`monitor`]) over their rows ([`store`]), reads ([`queries`]), and following the generation
//! across instances ([`follow`]). This module loads the fleet-wide desired state from those
//! tables; the database layer below (`crate::db`) knows none of them.

pub mod desired;
pub mod devices;
pub mod follow;
pub mod http_tokens;
pub mod monitor;
pub mod policies;
pub mod queries;
pub mod rollouts;
pub mod store;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use timeshard_control_api::FleetState;
use timeshard_control_api::state::NodeConfigEntry;
use tokio::sync::{Notify, watch};

use crate::ca::FleetCa;
use crate::db::{Db, from_json};
use crate::error::Result;
use timeshard_control_api::state::{RevocationList, SignedRevocationList};

/// Settings of the service's behaviour (not of its transport).
#[derive(Clone, Debug)]
pub struct Policy {
    /// Lifetime of node certificates.
    pub cert_lifetime: Duration,
    /// Longest an enrollment token may live.
    pub max_token_lifetime: Duration,
    /// Policies are signed offline with this key, which devices pin when they enroll: the
    /// service signs nothing and accepts only uploads that carry this key's signature. `None`:
    /// the service signs with a key of its own, kept in the database.
    pub offline_policy_key: Option<timeshard_policy::signing::PublicKey>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cert_lifetime: Duration::from_secs(7 * 86_400),
            max_token_lifetime: Duration::from_secs(30 * 86_400),
            offline_policy_key: None,
        }
    }
}

/// The service's state: database, CA, and the current fleet-wide desired state.
#[derive(Debug)]
pub struct Fleet {
    pub db: Db,
    pub ca: FleetCa,
    pub policy: Policy,
    state: watch::Sender<Arc<FleetState>>,
    refresh: Notify,
    /// A node reported policy figures: the rollout monitor looks soon.
    reported: Notify,
}

impl Fleet {
    /// Opens the fleet in `db`, creating its CA on first use.
    pub async fn open(db: Db, policy: Policy) -> Result<Arc<Fleet>> {
        let ca = db.fleet_ca(crate::time::now_ms()).await?;
        let state = load_state(&db, &ca, &policy).await?;
        let (tx, _) = watch::channel(Arc::new(state));
        Ok(Arc::new(Fleet { db, ca, policy, state: tx, refresh: Notify::new(), reported: Notify::new() }))
    }

    /// The fleet-wide desired state as last loaded.
    pub fn current(&self) -> Arc<FleetState> {
        self.state.borrow().clone()
    }

    /// A receiver that wakes when a newer fleet state is loaded.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FleetState>> {
        self.state.subscribe()
    }

    /// Asks the follower to reload (after a local commit, or a notification from another instance).
    pub fn changed(&self) {
        self.refresh.notify_one();
    }

    /// Loads the state if the database is at another generation; publishes it.
    pub async fn reload(&self) -> Result<()> {
        if self.db.generation().await? == self.current().generation {
            return Ok(());
        }
        let state = load_state(&self.db, &self.ca, &self.policy).await?;
        self.state.send_if_modified(|current| {
            if state.generation > current.generation {
                *current = Arc::new(state);
                true
            } else {
                false
            }
        });
        Ok(())
    }
}

/// How long nodes count a revocation list as current after it was signed.
pub const REVOCATIONS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

/// `state`'s revocation list, signed with the fleet CA's key.
fn sign_revocations(ca: &FleetCa, state: &FleetState) -> Result<SignedRevocationList> {
    let list = RevocationList {
        generation: state.generation,
        issued_at_ms: crate::time::now_ms(),
        max_age_ms: REVOCATIONS_MAX_AGE.as_millis() as i64,
        revoked: state.revoked.clone(),
    };
    let body = serde_json::to_string(&list).expect("a revocation list serializes");
    let (scheme, signature) = ca.sign(body.as_bytes())?;
    Ok(SignedRevocationList {
        generation: state.generation,
        body,
        scheme,
        signature: timeshard_control_api::token::hex(&signature),
    })
}

/// The fleet-wide desired state at the current generation. Reads the generation before
/// and after: every change raises it, so equal values mean the reads in between saw one
/// committed state (on either backend, without a snapshot isolation level).
async fn load_state(db: &Db, ca: &FleetCa, policy: &Policy) -> Result<FleetState> {
    loop {
        let row = sqlx::query("SELECT generation, changed_at_ms FROM fleet WHERE id = 1").fetch_one(db.pool()).await?;
        let generation: i64 = row.try_get("generation")?;
        let changed_at: i64 = row.try_get("changed_at_ms")?;
        let mut classes = Vec::new();
        for row in sqlx::query("SELECT spec_json FROM classes").fetch_all(db.pool()).await? {
            classes.push(from_json(&row, "spec_json")?);
        }
        let mut configs: Vec<NodeConfigEntry> = Vec::new();
        for row in sqlx::query("SELECT entry_json FROM node_configs").fetch_all(db.pool()).await? {
            configs.push(from_json(&row, "entry_json")?);
        }
        // Certificates expired when this generation was made need no revocation.
        let revoked =
            sqlx::query("SELECT node_id FROM devices WHERE revoked_at_ms IS NOT NULL AND cert_not_after_ms > $1")
                .bind(changed_at)
                .fetch_all(db.pool())
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>("node_id"))
                .collect::<Result<Vec<_>, _>>()?;
        let mut policies = store::load_table(db.pool()).await?;
        if let Some(key) = &policy.offline_policy_key {
            policies.key = Some(key.to_text());
        }
        let http_tokens = http_tokens::load_entries(db.pool(), changed_at).await?;
        if db.generation().await? == generation as u64 {
            let state = FleetState::new(generation as u64, classes, configs, revoked);
            let signed = sign_revocations(ca, &state)?;
            return Ok(state.with_policies(policies).with_http_tokens(http_tokens).with_revocations(signed));
        }
    }
}

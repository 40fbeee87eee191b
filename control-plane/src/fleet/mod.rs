//! What the service does, apart from HTTP: each operation checks its input, writes in one
//! transaction with its audit record (or refuses and writes nothing), and announces changes of
//! desired state. Split by concern: tokens and callers ([`tokens`]), enrollment and the device
//! endpoints ([`devices`]), desired state ([`desired`]), tokens for the nodes' HTTP side ([`http_tokens`]), reads ([`queries`]), and following the
//! generation across instances ([`follow`]).

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

use timeshard_control_api::FleetState;
use tokio::sync::{Notify, watch};

use crate::ca::FleetCa;
use crate::db::Db;
use crate::error::Result;

/// Settings of the service's behaviour (not of its transport).
#[derive(Clone, Debug)]
pub struct Policy {
    /// Lifetime of node certificates.
    pub cert_lifetime: Duration,
    /// Longest an enrollment token may live.
    pub max_token_lifetime: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { cert_lifetime: Duration::from_secs(30 * 86_400), max_token_lifetime: Duration::from_secs(30 * 86_400) }
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
        let state = db.load_fleet_state().await?;
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
        let state = self.db.load_fleet_state().await?;
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

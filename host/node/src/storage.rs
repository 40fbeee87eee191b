//! The node's local store: opening the engine `[store]` names (the disk engine in
//! `<data_dir>/store`, or memory), and the task that runs the disk engine's maintenance.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_store::backend::Backend;
use timeshard_store::{DiskConfig, DiskStore, FsyncPolicy, MemStore, Store, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::budget::Shares;
use crate::config::{Fsync, NodeConfig, StoreEngine};

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store in {path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
}

/// The store, and the same store when it is the disk engine (for what only it has: health,
/// stats).
pub type Stores = (Arc<dyn Store>, Option<Arc<DiskStore>>);

/// Opens the store `config` names; logs what the disk engine's health check found. With
/// `disk`, the disk engine runs on it instead of `<data_dir>/store` (a simulated disk).
pub fn open(config: &NodeConfig, disk: Option<Arc<dyn Backend>>) -> Result<Stores, OpenError> {
    Ok(match config.store.engine {
        StoreEngine::Memory => (Arc::new(MemStore::new(config.store.memory_max_points)), None),
        StoreEngine::Disk => {
            let dir = config.data_dir.join("store");
            let backend = disk;
            let disk = DiskConfig {
                fsync: match config.store.fsync {
                    Fsync::Durable => FsyncPolicy::Durable,
                    Fsync::OsBuffered => FsyncPolicy::OsBuffered,
                },
                seal_grace_ns: i64::try_from(config.store.seal_grace.as_nanos()).unwrap_or(i64::MAX),
                retention: config.retention_rules(),
                max_open_age_ns: i64::try_from(config.store.max_open_age.as_nanos()).unwrap_or(i64::MAX),
                max_wal_bytes: config.store.max_wal_bytes,
                // Open points past the budget's share are sealed early by the writes themselves.
                max_open_points: DiskConfig::default()
                    .max_open_points
                    .min(Shares::of(config.memory.budget.0).max_open_points()),
                ..DiskConfig::default()
            };
            let opened = match backend {
                Some(backend) => DiskStore::open_with_backend(backend, disk),
                None => {
                    std::fs::create_dir_all(&dir).map_err(|source| OpenError::DataDir { path: dir.clone(), source })?;
                    DiskStore::open(&dir, disk)
                }
            };
            let store = opened.map_err(|source| OpenError::Store { path: dir.clone(), source })?;
            for problem in store.health() {
                warn!(%problem, "store health");
            }
            let store = Arc::new(store);
            (store.clone(), Some(store))
        }
    })
}

/// Runs the store's maintenance (sealing, late data, retention, log checkpoints) every
/// `interval`, in bounded steps on a blocking thread, so ingest never waits for it; until `stop`
/// fires.
pub async fn maintain(store: Arc<dyn Store>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        loop {
            let store = store.clone();
            match timeshard_clock::spawn_blocking(move || store.maintain(now_ns())).await {
                Ok(Ok(report)) if report.more => continue,
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    warn!(error = %e, "store maintenance failed; will retry");
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "store maintenance task failed");
                    break;
                }
            }
        }
    }
}

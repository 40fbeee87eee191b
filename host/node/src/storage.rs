//! The node's local store: opening the engine `[store]` names (the disk engine in
//! `<data_dir>/store`, or memory), the task that runs the disk engine's maintenance, what the
//! store holds against `[store] max_bytes` ([`StoreUse`]), and how full its filesystem is
//! ([`DiskSpace`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
pub async fn maintain(store: Arc<dyn Store>, usage: Arc<StoreUse>, interval: Duration, stop: CancellationToken) {
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
        if usage.limited() {
            let usage = usage.clone();
            let _ = timeshard_clock::spawn_blocking(move || usage.measure()).await;
        }
    }
}

/// `[store] max_bytes`: the bytes the disk store holds, measured after each maintenance pass,
/// and whether replicas must refuse writes because of it.
#[derive(Debug)]
pub struct StoreUse {
    /// The store's directory (`<data_dir>/store`).
    dir: PathBuf,
    max: Option<u64>,
    used: AtomicU64,
}

impl StoreUse {
    /// The store in `dir`, limited to `max` bytes (`None`: no limit, nothing measured).
    pub fn new(dir: PathBuf, max: Option<u64>) -> StoreUse {
        StoreUse { dir, max, used: AtomicU64::new(0) }
    }

    /// Whether a limit applies.
    pub fn limited(&self) -> bool {
        self.max.is_some()
    }

    /// Measures the store's files now.
    pub fn measure(&self) {
        self.used.store(dir_bytes(&self.dir), Ordering::Relaxed);
    }

    /// Why a write must be refused, if it must: the store held its limit at the last measure.
    pub fn refusal(&self) -> Option<String> {
        let max = self.max?;
        let used = self.used.load(Ordering::Relaxed);
        (used >= max).then(|| {
            format!(
                "this node's store holds {used} bytes on disk, at its [store] max_bytes of {max}: writes are refused \
                 until retention frees room or the limit is raised"
            )
        })
    }
}

/// Bytes in the files under `dir` (recursively); 0 if it does not exist.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// How full the filesystem holding the node's data is: what an operator of an SD card watches
/// before writes are refused with ENOSPC (`/metrics`, and the health the control plane sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSpace {
    /// The filesystem's size, in bytes.
    pub size: u64,
    /// Bytes the node may still write (free to unprivileged users).
    pub available: u64,
}

/// Below this share of the filesystem left, the node reports itself degraded.
const LOW_DISK_PERCENT: u64 = 10;

impl DiskSpace {
    /// The filesystem holding `dir`, by statvfs(3); `None` if it cannot be read.
    // The conversions are no-ops on x86_64 and aarch64, not on armv7 (32-bit fields).
    #[allow(clippy::useless_conversion)]
    pub fn of(dir: &Path) -> Option<DiskSpace> {
        let fs = nix::sys::statvfs::statvfs(dir).ok()?;
        let block = u64::from(fs.fragment_size()).max(1);
        Some(DiskSpace {
            size: u64::from(fs.blocks()).saturating_mul(block),
            available: u64::from(fs.blocks_available()).saturating_mul(block),
        })
    }

    /// What to tell the control plane when little is left.
    pub fn problem(&self) -> Option<String> {
        (self.size > 0 && self.available.saturating_mul(100) < self.size.saturating_mul(LOW_DISK_PERCENT)).then(|| {
            let full = 100 - self.available.saturating_mul(100) / self.size;
            format!("disk {full}% full: {} MiB left for the data directory", self.available >> 20)
        })
    }
}

#[cfg(test)]
mod disk_space_tests {
    use super::*;

    #[test]
    fn writes_are_refused_once_the_store_holds_its_max_bytes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wal")).unwrap();
        std::fs::write(dir.path().join("wal").join("0.wal"), vec![0u8; 3000]).unwrap();
        std::fs::write(dir.path().join("index.log"), vec![0u8; 1000]).unwrap();
        let unlimited = StoreUse::new(dir.path().to_path_buf(), None);
        unlimited.measure();
        assert_eq!(unlimited.refusal(), None);
        let limited = StoreUse::new(dir.path().to_path_buf(), Some(4000));
        assert_eq!(limited.refusal(), None, "nothing measured yet");
        limited.measure();
        let why = limited.refusal().expect("4000 bytes held of 4000");
        assert!(why.contains("holds 4000 bytes") && why.contains("max_bytes of 4000"), "{why}");
        std::fs::remove_file(dir.path().join("index.log")).unwrap();
        limited.measure();
        assert_eq!(limited.refusal(), None, "room again");
    }

    #[test]
    fn low_disk_is_a_problem_with_how_full_and_what_is_left() {
        let gib = 1u64 << 30;
        assert_eq!(DiskSpace { size: 10 * gib, available: 2 * gib }.problem(), None);
        assert_eq!(
            DiskSpace { size: 10 * gib, available: gib / 2 }.problem(),
            Some("disk 95% full: 512 MiB left for the data directory".into())
        );
        assert_eq!(DiskSpace { size: 0, available: 0 }.problem(), None, "a filesystem that reports no size");
    }

    #[test]
    fn the_data_directory_filesystem_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let space = DiskSpace::of(dir.path()).expect("statvfs of a temporary directory");
        assert!(space.size > 0 && space.available <= space.size, "{space:?}");
        assert_eq!(DiskSpace::of(&dir.path().join("missing")), None);
    }
}

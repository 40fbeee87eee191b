//! `[store]`: which storage engine holds the node's blocks, and how the disk engine acknowledges,
//! seals and checkpoints.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::memory::ByteSize;

/// Which storage engine holds this node's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `disk`: the durable engine in `<data_dir>/store` (write-ahead log, compressed blocks).
    /// `memory`: everything in RAM, lost on restart (tests, throwaway clusters).
    pub engine: StoreEngine,
    /// When the disk engine acknowledges a write: `durable` (after fsync; survives power loss)
    /// or `os-buffered` (after the OS has it; survives a crash of the node, not of the machine).
    pub fsync: Fsync,
    /// The disk engine seals (compresses) a block once its quantum ended this long ago; later
    /// points still merge in as late data.
    #[serde(with = "humantime_serde")]
    pub seal_grace: Duration,
    /// How often the disk engine's maintenance runs (sealing, retention, log checkpoints).
    #[serde(with = "humantime_serde")]
    pub maintenance_interval: Duration,
    /// Most points the memory engine holds before refusing writes.
    pub memory_max_points: u64,
    /// The disk engine checkpoints a block's open points (writes them as a sealed frame) once
    /// they are this old, so no open block pins the write-ahead log longer than this, even one
    /// whose quantum lasts a year.
    #[serde(with = "humantime_serde")]
    pub max_open_age: Duration,
    /// Once the write-ahead log holds this many bytes, the disk engine checkpoints the open
    /// points of its older half early. Bounds the log on disk and the replay after a crash
    /// (and so the memory a restart needs).
    pub max_wal_bytes: u64,
    /// Most bytes the disk engine may hold (blocks, index and write-ahead log), e.g. "2GiB":
    /// past it the node refuses the writes replicas receive (clients' writes it owns, hints)
    /// until retention frees room or the limit is raised, so the store cannot take the whole
    /// disk. Measured after each maintenance pass, so it may be passed by a pass's writes.
    /// Unset: no limit but the disk's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<ByteSize>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            engine: StoreEngine::Disk,
            fsync: Fsync::Durable,
            seal_grace: Duration::from_secs(30),
            maintenance_interval: Duration::from_secs(1),
            memory_max_points: 200_000_000,
            max_open_age: Duration::from_secs(60),
            max_wal_bytes: 64 * 1024 * 1024,
            max_bytes: None,
        }
    }
}

/// Storage engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    Disk,
    Memory,
}

/// When writes are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fsync {
    Durable,
    OsBuffered,
}

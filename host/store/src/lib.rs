//! Local storage of a timeshard node.
//!
//! A node stores the blocks (series, quantum) it replicates, plus the registrations of the
//! series it holds in the series dictionary. Engines implement [`Store`]; the node holds an
//! `Arc<dyn Store>` and never sees files. [`MemStore`] keeps everything in memory.
//!
//! Stored data is a set of points (see [`timeshard_proto::point`]): writing a point twice stores
//! it once, so replays, retries and repairs are harmless.

use std::fmt;

use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};

mod mem;

pub use mem::MemStore;

/// Failures of a store. Each says what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store has no room left (disk full, or the memory store's cap).
    #[error("store is full: {0}")]
    Full(String),
    /// The store's files may not be read or written.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Stored data failed its checksum or does not decode.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// Any other I/O failure.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The store was closed or has failed earlier and accepts no more writes.
    #[error("store is unavailable: {0}")]
    Unavailable(String),
}

/// One page of a read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadPage {
    /// Points sorted by identity (time, event, value).
    pub points: Vec<Point>,
    /// Whether the range holds more points after the last one returned.
    pub more: bool,
}

/// What a write changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Points that were not stored before.
    pub new_points: u64,
}

/// Local storage engine.
pub trait Store: Send + Sync + fmt::Debug {
    /// Stores the points of `blocks`, returning once they are durable as the engine is
    /// configured. Idempotent. Each block's points lie within its quantum (validated by the
    /// caller).
    fn write(&self, blocks: &[BlockPoints]) -> Result<WriteStats, StoreError>;

    /// Points of `series` within `range`, sorted by identity, strictly after `after`, at most
    /// `limit` of them.
    fn read(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        limit: usize,
    ) -> Result<ReadPage, StoreError>;

    /// Records that `series` exist (idempotent).
    fn register_series(&self, series: &[SeriesKey]) -> Result<(), StoreError>;

    /// Whether `series` was registered here.
    fn has_series(&self, series: &SeriesKey) -> Result<bool, StoreError>;

    /// Registered series whose metric starts with `metric_prefix`, sorted.
    fn list_series(&self, metric_prefix: &str) -> Result<Vec<SeriesKey>, StoreError>;
}

pub use timeshard_proto::point::page_start;

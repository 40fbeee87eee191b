//! Counters of the calls into each installed policy, for the node's `/metrics`, its status and
//! its reports to the control plane: how many, how long they took, the most linear memory one
//! call used, how many trapped, timed out or failed otherwise, and, for ingest policies, the
//! points they were given and refused. Updated without locks on every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::{FailureKind, Kind, PolicyError, PolicyRef};

/// The counters of one installed policy version.
#[derive(Debug, Default)]
pub(crate) struct CallCounters {
    calls: AtomicU64,
    nanos: AtomicU64,
    traps: AtomicU64,
    timeouts: AtomicU64,
    failures: AtomicU64,
    peak_memory: AtomicU64,
    points: AtomicU64,
    rejected: AtomicU64,
}

impl CallCounters {
    /// Runs one call of the policy, counting it and its outcome.
    pub(crate) fn count<T>(&self, call: impl FnOnce() -> Result<T, PolicyError>) -> Result<T, PolicyError> {
        let started = Instant::now();
        let result = call();
        self.peak_memory.fetch_max(crate::engine::take_peak_memory(), Ordering::Relaxed);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        if let Err(e) = &result {
            let counter = match e.kind() {
                FailureKind::Trap => &self.traps,
                FailureKind::Timeout => &self.timeouts,
                _ => &self.failures,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Records an ingest batch of `points` of which the policy refused `rejected`.
    pub(crate) fn batch(&self, points: usize, rejected: usize) {
        self.points.fetch_add(points as u64, Ordering::Relaxed);
        self.rejected.fetch_add(rejected as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, policy: PolicyRef, kind: Kind) -> CallStats {
        CallStats {
            policy,
            kind,
            calls: self.calls.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            traps: self.traps.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            peak_memory_bytes: self.peak_memory.load(Ordering::Relaxed),
            points: self.points.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

/// The calls into one installed policy version since it was installed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallStats {
    pub policy: PolicyRef,
    pub kind: Kind,
    /// Calls made (ingest batches, per-quantum summaries, merges).
    pub calls: u64,
    /// Time spent in them, in seconds.
    pub seconds: f64,
    /// Calls that ended in a trap.
    pub traps: u64,
    /// Calls stopped at their deadline.
    pub timeouts: u64,
    /// Calls that failed otherwise (memory or output limits, errors the policy returned).
    pub failures: u64,
    /// The most linear memory one call used, in bytes.
    pub peak_memory_bytes: u64,
    /// Ingest policies: points in the batches they processed.
    pub points: u64,
    /// Ingest policies: points they refused.
    pub rejected: u64,
}

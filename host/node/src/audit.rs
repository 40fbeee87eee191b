//! Failed authentications, for the operator: every refused credential is counted by where it
//! was presented, and logged with its source address (at most a few lines a second, so that a
//! flood of bad handshakes cannot flood the log; the count keeps every one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

/// Where a credential was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// A QUIC handshake whose certificate the fleet CA did not vouch for (or none).
    Quic,
    /// An HTTP request without a valid token.
    Http,
}

impl Door {
    pub const ALL: [Door; 2] = [Door::Quic, Door::Http];

    pub fn label(self) -> &'static str {
        match self {
            Door::Quic => "quic",
            Door::Http => "http",
        }
    }
}

/// Log lines per second at most; the rest are only counted.
const LINES_PER_SEC: u64 = 5;

/// Counts and logs failed authentications.
#[derive(Debug, Default)]
pub struct Audit {
    failures: [AtomicU64; Door::ALL.len()],
    /// The second of the last log line, and lines logged in it.
    window: AtomicU64,
    lines: AtomicU64,
}

impl Audit {
    /// Records a refused credential from `remote`.
    pub fn failed(&self, door: Door, remote: SocketAddr, reason: &str) {
        self.failures[door as usize].fetch_add(1, Ordering::Relaxed);
        let second = u64::try_from(timeshard_clock::now_ns() / 1_000_000_000).unwrap_or(0);
        if self.window.swap(second, Ordering::Relaxed) != second {
            self.lines.store(0, Ordering::Relaxed);
        }
        if self.lines.fetch_add(1, Ordering::Relaxed) < LINES_PER_SEC {
            warn!(door = door.label(), %remote, reason, "authentication failed");
        }
    }

    /// Failures so far at `door`.
    pub fn failures(&self, door: Door) -> u64 {
        self.failures[door as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_is_counted_by_door() {
        let audit = Audit::default();
        let from: SocketAddr = "192.0.2.7:5000".parse().unwrap();
        for _ in 0..20 {
            audit.failed(Door::Http, from, "no token");
        }
        audit.failed(Door::Quic, from, "unknown CA");
        assert_eq!((audit.failures(Door::Http), audit.failures(Door::Quic)), (20, 1));
    }
}

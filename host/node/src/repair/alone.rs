//! Whether this node has been alone since its data began: started with no bootstrap peers and
//! never saw another member. Such a node received every write it acknowledged, so an
//! anti-entropy round with no one to ask settles it ([`timeshard_proto::repair::Settle::round_complete`]);
//! without this a single-node deployment never settled, and every read of it reconciled raw
//! points instead of using summaries (a day's 1-minute windows: 18 ms became 750 ms).
//!
//! The first time the view holds a neighbour, a marker file in the data directory records it,
//! so a restart of a node that once had peers (and may have missed writes while down) is not
//! taken for a lone one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::warn;

/// The marker's name in the data directory.
const MARKER: &str = "peers_seen";

#[derive(Debug)]
pub struct PeersSeen {
    /// `None`: nowhere to record it (a node that had peers from the start).
    marker: Option<PathBuf>,
    seen: AtomicBool,
}

impl PeersSeen {
    /// A node that counts as having had peers.
    pub fn not_alone() -> PeersSeen {
        PeersSeen { marker: None, seen: AtomicBool::new(true) }
    }

    /// The record of the node whose data lives in `data_dir`, started with bootstrap peers or
    /// not.
    pub fn load(data_dir: &Path, has_bootstrap: bool) -> PeersSeen {
        let marker = data_dir.join(MARKER);
        let seen = has_bootstrap || marker.exists();
        PeersSeen { marker: Some(marker), seen: AtomicBool::new(seen) }
    }

    /// Takes the number of neighbours a round found; the first time there are any, writes the
    /// marker.
    pub fn note_neighbours(&self, neighbours: usize) {
        if neighbours == 0 || self.seen.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(marker) = &self.marker else { return };
        // Should the marker not be written, the node is still not alone in this process; a
        // restart would take it for a lone node only if its peers never come back.
        if let Err(e) = timeshard_control_api::files::write_atomic(marker, b"", false) {
            warn!(error = %e, path = %marker.display(), "cannot record that this node has peers");
        }
    }

    /// Whether the node has been alone since its data began.
    pub fn alone_ever(&self) -> bool {
        !self.seen.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_with_bootstrap_peers_or_a_marker_is_not_alone() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!PeersSeen::load(dir.path(), true).alone_ever());
        assert!(!PeersSeen::not_alone().alone_ever());
        let lone = PeersSeen::load(dir.path(), false);
        assert!(lone.alone_ever());
        lone.note_neighbours(0);
        assert!(lone.alone_ever(), "a round with no neighbours changes nothing");
        lone.note_neighbours(2);
        assert!(!lone.alone_ever());
        assert!(!PeersSeen::load(dir.path(), false).alone_ever(), "the marker outlives a restart");
    }
}

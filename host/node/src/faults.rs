//! Partition fault injection for tests: `[testing] fault_file` names the nodes this node must
//! not talk to. Only the node's own config sets the file, so no peer can switch it on.
//!
//! The file holds one node id (40 hex digits) or `ip:port` address per line (`#` starts a
//! comment). The node re-reads it every [`RELOAD_EVERY`]; a missing file means no fault.
//! Requests to a named node fail as unreachable (the endpoint, `net`, asks [`Faults::blocks`]),
//! and requests from one are dropped unanswered (the request server asks too). A leaf: the
//! endpoint and the server use it, it uses neither.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use timeshard_proto::Id;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// QUIC close code of a connection from a node the fault file names.
pub const CLOSE_CUT_OFF: u32 = 4;
/// How often the fault file is read.
pub const RELOAD_EVERY: Duration = Duration::from_millis(200);
/// Largest fault file read; a longer one is a mistake.
const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Debug, Default, PartialEq, Eq)]
struct Blocked {
    ids: HashSet<Id>,
    addrs: HashSet<SocketAddr>,
}

/// The nodes this node is cut off from.
#[derive(Debug)]
pub struct Faults {
    file: PathBuf,
    blocked: RwLock<Blocked>,
}

fn parse(text: &str) -> Blocked {
    let mut blocked = Blocked::default();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Ok(id) = line.parse::<Id>() {
            blocked.ids.insert(id);
        } else if let Ok(addr) = line.parse::<SocketAddr>() {
            blocked.addrs.insert(addr);
        } else {
            warn!(line, "fault file: not a node id or an address; ignored");
        }
    }
    blocked
}

impl Faults {
    /// Faults read from `file` (none until it exists).
    pub fn new(file: PathBuf) -> Faults {
        let faults = Faults { file, blocked: RwLock::new(Blocked::default()) };
        faults.reload();
        faults
    }

    /// The file watched.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Re-reads the file.
    pub fn reload(&self) {
        let text = match std::fs::metadata(&self.file) {
            Ok(m) if m.len() > MAX_FILE_BYTES => {
                warn!(file = %self.file.display(), "fault file larger than 1 MiB; ignored");
                String::new()
            }
            Ok(_) => std::fs::read_to_string(&self.file).unwrap_or_default(),
            Err(_) => String::new(),
        };
        let blocked = parse(&text);
        let mut current = self.blocked.write().expect("faults lock");
        if *current != blocked {
            info!(ids = blocked.ids.len(), addrs = blocked.addrs.len(), "fault file changed");
            *current = blocked;
        }
    }

    /// Whether this node must not talk to the node `id` (if known) at `addr`.
    pub fn blocks(&self, id: Option<&Id>, addr: SocketAddr) -> bool {
        let b = self.blocked.read().expect("faults lock");
        id.is_some_and(|id| b.ids.contains(id)) || b.addrs.contains(&addr)
    }

    /// Re-reads the file every [`RELOAD_EVERY`] until `stop` fires.
    pub async fn watch(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.reload(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_ids_and_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("faults");
        let faults = Faults::new(file.clone());
        let id = Id::sha1(b"peer");
        let addr: SocketAddr = "127.0.0.1:7401".parse().unwrap();
        assert!(!faults.blocks(Some(&id), addr), "no file, no fault");
        std::fs::write(&file, format!("# partition\n{}\n127.0.0.1:7402\nnonsense\n", id.to_hex())).unwrap();
        faults.reload();
        assert!(faults.blocks(Some(&id), addr));
        assert!(faults.blocks(None, "127.0.0.1:7402".parse().unwrap()));
        assert!(!faults.blocks(Some(&Id::sha1(b"other")), addr));
        std::fs::remove_file(&file).unwrap();
        faults.reload();
        assert!(!faults.blocks(Some(&id), addr), "healed");
    }
}

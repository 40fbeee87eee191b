//! A node as an operating-system process: the ready file it writes once it serves (how the
//! processes of a local cluster report their address), and serving until a stop signal, with
//! SIGHUP reloading the policies.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use timeshard_proto::Id;

use crate::config::NodeConfig;
use crate::node::RunningNode;

/// What `timeshard node --ready-file` writes once the node serves.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    pub id: Id,
    pub addr: SocketAddr,
    pub pid: u32,
    /// Where the HTTP side listens, if it is enabled.
    #[serde(default)]
    pub http_addr: Option<SocketAddr>,
}

/// Writes `node`'s [`Ready`] to `path` as JSON, atomically (a reader never sees half a file).
pub fn write_ready_file(path: &Path, node: &RunningNode) -> std::io::Result<()> {
    let ready = Ready {
        id: node.node().dht().me().id,
        addr: node.addr(),
        pid: std::process::id(),
        http_addr: node.http_addr(),
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&ready)?)?;
    std::fs::rename(&tmp, path)
}

/// Serves until SIGTERM or SIGINT; on SIGHUP, re-reads the config file's `[policy]` section
/// and swaps in new policy versions (a module that fails to load leaves the last good one).
pub async fn serve_until_stopped(node: &RunningNode, config: Option<&Path>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    let stop = wait_for_stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => return r,
            _ = hup.recv() => {
                let (Some(path), Some(registry)) = (config, node.node().coordinator().policies()) else {
                    tracing::warn!("SIGHUP: nothing to reload (no config file, or no [policy] section at start)");
                    continue;
                };
                match NodeConfig::load(path) {
                    Ok(cfg) => crate::policies::reload(registry, &cfg),
                    Err(e) => tracing::warn!(error = %e, "SIGHUP: config not reloaded"),
                }
            }
        }
    }
}

/// Waits for SIGTERM or SIGINT (Ctrl-C).
pub async fn wait_for_stop_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

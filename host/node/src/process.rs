//! A node as an operating-system process: the ready file it writes once it serves (how the
//! processes of a local cluster report their address), and serving until a stop signal, with
//! SIGHUP reloading the policies.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use timeshard_proto::Id;

use crate::config::NodeConfig;
use crate::start::RunningNode;

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

/// Serves until SIGTERM or SIGINT, or until the node stops itself (see
/// [`crate::node::Node::stop_reason`]); on SIGHUP, re-reads the config file and applies what
/// can change without a restart: the classes' retention, tier settings and quotas (unless the
/// node is enrolled: then the control plane decides its classes), `[store] max_bytes`, and the
/// `[policy]` section (new policy versions swap in; a module that fails to load leaves the last
/// good one).
pub async fn serve_until_stopped(node: &RunningNode, config: Option<&Path>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    let stop = wait_for_stop_signal();
    tokio::pin!(stop);
    let stopped_itself = node.node().shutdown_signal().clone();
    loop {
        tokio::select! {
            biased;
            r = &mut stop => return r,
            _ = stopped_itself.cancelled() => return Ok(()),
            _ = hup.recv() => {
                let Some(path) = config else {
                    tracing::warn!("SIGHUP: nothing to reload (the node was started without a config file)");
                    continue;
                };
                match NodeConfig::load(path) {
                    Ok(cfg) => reload(node, &cfg),
                    Err(e) => tracing::warn!(error = %e, "SIGHUP: config not reloaded"),
                }
            }
        }
    }
}

/// Applies the reloadable parts of `cfg` to a running node.
fn reload(node: &RunningNode, cfg: &NodeConfig) {
    let node_ref = node.node();
    // The same path as any change: checked whole, then swapped in with the digest.
    let next = if node_ref.is_enrolled() {
        tracing::info!("SIGHUP: the control plane decides this node's classes; their retention is not reloaded");
        // The store's limit is this device's own.
        let mut next = (*node_ref.config()).clone();
        next.store.max_bytes = cfg.store.max_bytes;
        next
    } else {
        crate::reconfigure::with_reloadable_of(&node_ref.config(), cfg)
    };
    match node_ref.prepare(next, &[], node_ref.config_generation()) {
        Ok(prepared) => {
            node_ref.reconfigure(prepared);
            tracing::info!("SIGHUP: reloaded what can change while the node runs");
        }
        Err(e) => tracing::warn!(error = %e, "SIGHUP: configuration not reloaded"),
    }
    match node.node().coordinator().policies() {
        Some(registry) if node_ref.is_enrolled() => {
            crate::control::policies::reload(&mut node_ref.control_policies(), registry, cfg)
        }
        Some(registry) => crate::policies::reload(registry, cfg),
        None if !cfg.policy.modules.is_empty() => {
            tracing::warn!("SIGHUP: [policy] not applied: the node started without policies; restart it to load them")
        }
        None => {}
    }
}

/// Waits for SIGTERM or SIGINT (Ctrl-C).
pub async fn wait_for_stop_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        biased;
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

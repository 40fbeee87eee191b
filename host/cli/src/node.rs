//! `timeshard node`: runs an edge node until SIGTERM or Ctrl-C, configured by a TOML file and
//! flags, or enrolled with a control plane and following its desired state.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use timeshard_control_api::Agent;
use timeshard_node::config::NodeConfig;
use timeshard_node::process::{serve_until_stopped, write_ready_file};
use timeshard_node::{RunningNode, control};

/// Runs a node until SIGTERM or Ctrl-C.
#[derive(Debug, Args)]
#[command(long_about = "\
Runs an edge node until SIGTERM or Ctrl-C, then stops cleanly: it stops taking requests, lets the
ones in flight finish, and closes its connections.

A node gets its identity and configuration in one of two ways:

  From a control plane (`timeshard-control`): `--enroll` with a one-time token makes the node's
  key, has the control plane sign its certificate (checking first that the server is the fleet's,
  by the CA fingerprint in the token), and stores the certificate, the fleet CA and the node's
  initial configuration (labels, location, bootstrap peers, classes) in DATA_DIR/control. Later
  starts need only --data-dir: a node whose data directory holds an enrollment uses it, runs
  from the configuration it applied last (even while the control plane is away), and applies
  new ones without restarting.

  By hand: a config file (--config) with certificates from the fleet CA. For development,
  `timeshard pki init pki && timeshard pki issue pki --name node --role node`.

The two combine: an enrolled node can take a --config file too. Where the control plane speaks it
wins (TLS identity, classes, bootstrap peers when it names any, the limits it sets); the file and
the flags supply everything else (listen address, DHT, store, wire limits, policies). Every
setting has a default; `--print-config` shows the effective configuration.

Examples:
  # Enroll (once), then run:
  timeshard node --enroll https://cp.example:7443 --token tsc1... --data-dir /var/lib/timeshard \\
      --listen 0.0.0.0:7400
  # Later starts, with or without the control plane reachable:
  timeshard node --data-dir /var/lib/timeshard --listen 0.0.0.0:7400
  # By hand:
  timeshard node --config node.toml
  timeshard node --listen 127.0.0.1:7401 --bootstrap 127.0.0.1:7400 --data-dir data-1")]
pub(crate) struct NodeArgs {
    /// TOML config file; relative paths in it are relative to the file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A node to join through, host:port; repeat for several (overrides `bootstrap`; the
    /// control plane's bootstrap peers override both).
    #[arg(long)]
    bootstrap: Vec<String>,
    /// Data directory (overrides `data_dir`). An enrolled node keeps its enrollment in
    /// DATA_DIR/control.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Enroll with the control plane at this address first (needs --token).
    #[arg(long, value_name = "https://HOST:PORT", requires = "token", conflicts_with = "print_config")]
    enroll: Option<String>,
    /// One-time enrollment token from `timeshard-control token create` (tsc1...).
    #[arg(long, env = "TIMESHARD_ENROLL_TOKEN", hide_env_values = true, requires = "enroll")]
    token: Option<String>,
    /// Once serving, write {"id", "addr", "pid"} as JSON to this file.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

pub(crate) async fn run(args: NodeArgs) -> Result<()> {
    let mut cfg = match &args.config {
        Some(path) => NodeConfig::load(path)?,
        None => {
            let mut c = NodeConfig::default();
            c.resolve_paths(&std::env::current_dir()?);
            c
        }
    };
    if let Some(listen) = args.listen {
        cfg.listen = listen;
    }
    if !args.bootstrap.is_empty() {
        cfg.bootstrap = args.bootstrap.clone();
    }
    if let Some(d) = &args.data_dir {
        cfg.data_dir = std::env::current_dir()?.join(d);
    }
    cfg.validate()?;
    let agent = match (&args.enroll, &args.token) {
        (Some(url), Some(token)) => {
            let agent = timeshard_control_api::enroll(url, token, &cfg.data_dir)
                .await
                .with_context(|| format!("cannot enroll with the control plane at {url}"))?;
            tracing::info!(
                node = agent.node_id(),
                dir = %agent.dir().display(),
                "enrolled; later starts need only --data-dir {}",
                cfg.data_dir.display()
            );
            Some(agent)
        }
        _ if Agent::is_enrolled(&cfg.data_dir) => Some(Agent::open(&cfg.data_dir)?),
        _ => None,
    };
    if args.print_config {
        let effective = match &agent {
            Some(a) => control::effective_config(&cfg, a.dir(), a.applied())?,
            None => cfg,
        };
        print!("{}", toml::to_string(&effective)?);
        return Ok(());
    }
    let node = match agent {
        Some(agent) => control::start(cfg, agent).await?,
        None => RunningNode::start(cfg).await?,
    };
    if let Some(path) = &args.ready_file {
        write_ready_file(path, &node)?;
    }
    serve_until_stopped(&node, args.config.as_deref()).await?;
    let stopped_itself = node.node().stop_reason();
    if stopped_itself.is_none() {
        tracing::info!("stop signal received; shutting down");
    }
    node.shutdown().await;
    match stopped_itself {
        Some(reason) => bail!(reason),
        None => Ok(()),
    }
}

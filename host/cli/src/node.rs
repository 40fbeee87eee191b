//! `timeshard node`: runs an edge node from a TOML config until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use timeshard_node::RunningNode;
use timeshard_node::config::NodeConfig;
use timeshard_node::process::{serve_until_stopped, write_ready_file};

/// Runs a node until SIGTERM or Ctrl-C.
#[derive(Debug, Args)]
#[command(long_about = "\
Runs an edge node until SIGTERM or Ctrl-C, then stops cleanly: it stops taking requests, lets the
ones in flight finish, and closes its connections.

Every setting has a default; a config file only needs what differs. `--print-config` shows all
settings with their defaults. The node needs a certificate from the fleet CA: for development,
`timeshard pki init pki && timeshard pki issue pki --name node --role node`.

Example:
  timeshard node --config node.toml
  timeshard node --listen 127.0.0.1:7401 --bootstrap 127.0.0.1:7400 --data-dir data-1")]
pub(crate) struct NodeArgs {
    /// TOML config file; relative paths in it are relative to the file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A node to join through, host:port; repeat for several (overrides `bootstrap`).
    #[arg(long)]
    bootstrap: Vec<String>,
    /// Data directory (overrides `data_dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
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
    if let Some(d) = args.data_dir {
        cfg.data_dir = std::env::current_dir()?.join(d);
    }
    cfg.validate()?;
    if args.print_config {
        print!("{}", toml::to_string(&cfg)?);
        return Ok(());
    }
    let node = RunningNode::start(cfg).await?;
    if let Some(path) = &args.ready_file {
        write_ready_file(path, &node)?;
    }
    serve_until_stopped(&node, args.config.as_deref()).await?;
    tracing::info!("stop signal received; shutting down");
    node.shutdown().await;
    Ok(())
}

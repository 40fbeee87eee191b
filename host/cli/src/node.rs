//! `timeshard node`: runs an edge node until SIGTERM or Ctrl-C, configured by a TOML file and
//! flags, or enrolled with a control plane and following its desired state.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use timeshard_control_api::{Agent, AgentError};
use timeshard_node::config::NodeConfig;
use timeshard_node::process::{serve_until_stopped, write_ready_file};
use timeshard_node::{RunningNode, control};
use timeshard_sdk::{Client, LeaveProgress};

/// Runs a node until SIGTERM or Ctrl-C.
#[derive(Debug, Args)]
#[command(
    long_about = "\
Runs an edge node until SIGTERM or Ctrl-C, then stops cleanly: it stops taking requests, lets the
ones in flight finish, and closes its connections.

A node gets its identity and configuration in one of two ways:

  From a control plane (`timeshard-control`): `--enroll` with a one-time token makes the node's
  key, has the control plane sign its certificate (checking first that the server is the fleet's,
  by the CA fingerprint in the token), and stores the certificate, the fleet CA and the node's
  initial configuration (labels, location, bootstrap peers, classes) in DATA_DIR/control. While
  the control plane cannot be reached it says so and tries again every 1 to 15 s. Later
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
  timeshard node --listen 127.0.0.1:7401 --bootstrap 127.0.0.1:7400 --data-dir data-1
  # Make a running node leave the cluster for good (it hands its blocks off first):
  timeshard node leave --config node.toml",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct NodeArgs {
    #[command(subcommand)]
    action: Option<NodeAction>,
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
    /// Enroll with the control plane at this address first (needs --token); waits for it while
    /// it cannot be reached.
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

/// What to do with a node other than running it.
#[derive(Debug, Subcommand)]
enum NodeAction {
    #[command(about = "Make a running node leave the cluster: it hands every block off, then exits")]
    Leave(LeaveArgs),
}

/// Makes a running node leave the cluster for good.
#[derive(Debug, Args)]
#[command(long_about = "\
Makes a running node leave the cluster for good. The node announces that it is leaving (from then
on no block is placed on it, while it still serves reads), hands every block it holds to the
nodes that own it now (each owner confirms by digest before the node drops its copy), announces
that it left, and exits. Progress is printed until then; interrupting this command does not stop
the leave.

Only the holder of the node's key can make it leave: this command connects with the certificate
and key of the node's config file.

Examples:
  timeshard node leave --config node.toml
  timeshard node leave --config node.toml --node 127.0.0.1:7401")]
pub(crate) struct LeaveArgs {
    /// The node's TOML config file (its certificate, key and listen address).
    #[arg(long, short)]
    config: PathBuf,
    /// The node's address, when the config's `listen` does not say it (port 0, 0.0.0.0).
    #[arg(long)]
    node: Option<SocketAddr>,
}

async fn leave(args: LeaveArgs) -> Result<()> {
    let cfg = NodeConfig::load(&args.config)?;
    let addr = match args.node {
        Some(a) => a,
        None if cfg.listen.port() == 0 => bail!("the config listens on port 0; pass the node's address with --node"),
        None if cfg.listen.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], cfg.listen.port())),
        None => cfg.listen,
    };
    let client = Client::connect(addr, &cfg.tls_files())
        .await
        .with_context(|| format!("cannot reach the node at {addr} with its own certificate"))?;
    let mut last = None;
    loop {
        let progress = match client.leave().await {
            Ok(p) => p,
            // The node exits once it has left: a closed connection after it said so is success.
            Err(_) if last.is_some_and(|p: LeaveProgress| p.left) => break,
            Err(e) => return Err(e).context("the node did not accept the leave request"),
        };
        if last != Some(progress) {
            println!(
                "handed off {} of {} blocks ({} bytes pushed){}",
                progress.blocks_done,
                progress.blocks_total,
                progress.bytes_pushed,
                if progress.left { "; left the cluster" } else { "" }
            );
        }
        last = Some(progress);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("node at {addr} left the cluster and exited");
    Ok(())
}

pub(crate) async fn run(args: NodeArgs) -> Result<()> {
    if let Some(NodeAction::Leave(a)) = args.action {
        return leave(a).await;
    }
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
            let agent = enroll_waiting(url, token, &cfg.data_dir)
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
    let left = node.node().repair().state().leave_progress().left;
    if stopped_itself.is_none() {
        tracing::info!("stop signal received; shutting down");
    }
    node.shutdown().await;
    match stopped_itself {
        // Leaving is a clean exit.
        Some(_) if left => Ok(()),
        Some(reason) => bail!(reason),
        None => Ok(()),
    }
}

/// First wait before asking an unreachable control plane to enroll again; doubles up to
/// [`ENROLL_RETRY_MAX`].
const ENROLL_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between enrollment attempts: a device installed before its uplink works
/// enrolls within this long of the control plane becoming reachable.
const ENROLL_RETRY_MAX: Duration = Duration::from_secs(15);

/// Enrolls, waiting for a control plane that cannot be reached yet (a device often starts
/// before its uplink, or while the control plane is down): says why and when it tries again,
/// and tries until it gets an answer. A refusal (a used, expired or unknown token) ends it.
async fn enroll_waiting(url: &str, token: &str, data_dir: &std::path::Path) -> Result<Agent, AgentError> {
    let mut wait = ENROLL_RETRY_MIN;
    loop {
        match timeshard_control_api::enroll(url, token, data_dir).await {
            Err(e) if e.is_unreachable() => {
                tracing::warn!(
                    error = %e,
                    retry_in = ?wait,
                    "cannot enroll yet: the control plane does not answer; retrying until it does \
                     (the node starts once enrolled; stop it to give up)"
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(ENROLL_RETRY_MAX);
            }
            other => return other,
        }
    }
}

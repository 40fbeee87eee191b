//! The revocation figure of the fleet benchmark (`revocation_spread_s`): how long a revocation
//! takes to reach every node of a site cut off from the control plane, through gossip alone.
//!
//! Node processes enroll with a real control plane (`timeshard-control serve` on SQLite) and run
//! the default membership settings (gossip every second). All but node 0 and the nodes to be
//! revoked are then cut off: their enrollment record names an address nobody serves, and they
//! restart, so the only way a revocation list reaches them is a peer's gossip (node 0's, or
//! the revoked node's own before it stops). Each round
//! revokes one node with `timeshard-control device revoke`; from the moment that command
//! returns (the revocation is committed), every node's `/metrics` is read until its
//! `timeshard_revocations_generation` is the new list's. A round's spread is the time until the
//! last cut-off node holds it; node 0, which follows the control plane, is timed beside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::percentile_ms;
use crate::cluster::{ClusterOptions, LocalCluster};
use crate::fleet::{Backend, ControlPlane};

/// The gauge a node reports its revocation list's generation in.
const GENERATION: &str = "timeshard_revocations_generation";
/// How often each node's `/metrics` is read while a revocation spreads.
const POLL: Duration = Duration::from_millis(20);
/// A round that has not reached every node by then fails the benchmark.
const LIMIT: Duration = Duration::from_secs(60);

/// What the revocation figure runs.
#[derive(Debug, Clone)]
pub struct RevocationOptions {
    /// The `timeshard-control` program.
    pub control: PathBuf,
    /// The `timeshard` program the nodes run.
    pub node: PathBuf,
    /// Nodes cut off from the control plane.
    pub cut_off: usize,
    /// Revocations timed, each of another node.
    pub rounds: usize,
}

/// Generation of the revocation list node `i` holds (0: none yet).
async fn generation(cluster: &LocalCluster, i: usize) -> Result<u64> {
    Ok(cluster.metric(i, GENERATION).await?.unwrap_or(0.0) as u64)
}

/// Points node `i`'s enrollment record at an address nobody serves, and restarts it: the node
/// keeps its identity and its peers, but never reaches the control plane again.
async fn cut_off(cluster: &mut LocalCluster, i: usize) -> Result<()> {
    cluster.terminate(i).await?;
    let record = cluster.data_dir(i).join("control").join("enrollment.json");
    let text = std::fs::read_to_string(&record).with_context(|| format!("cannot read {}", record.display()))?;
    let mut doc: serde_json::Value = serde_json::from_str(&text)?;
    doc["url"] = "https://127.0.0.1:1".into();
    std::fs::write(&record, serde_json::to_vec(&doc)?)?;
    cluster.restart(i).await
}

/// Runs the rounds in `dir`; returns the figure's JSON.
pub async fn measure(o: &RevocationOptions, dir: &Path) -> Result<serde_json::Value> {
    if o.cut_off == 0 || o.rounds == 0 {
        bail!("the revocation figure needs at least one cut-off node and one round");
    }
    let control = ControlPlane::start(&o.control, Backend::Sqlite, dir).await?;
    let nodes = 1 + o.cut_off + o.rounds;
    let mut options = ClusterOptions::new(nodes, dir.join("nodes"), &o.node);
    options.log = "warn".into();
    eprintln!("bench: revocation: {nodes} nodes enrolling, {} of them to be cut off", o.cut_off);
    let mut cluster = control.enroll_cluster(options).await?;
    cluster.wait_converged(LIMIT).await?;
    let cut: Vec<usize> = (1..=o.cut_off).collect();
    for &i in &cut {
        cut_off(&mut cluster, i).await?;
    }
    cluster.wait_converged(LIMIT).await?;

    let (mut spreads, mut per_node, mut followers) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let victim = 1 + o.cut_off + round;
        let before = generation(&cluster, 0).await?;
        for &i in &cut {
            let g = generation(&cluster, i).await?;
            if g != before {
                bail!("node {i} holds revocation list {g} before round {round}, node 0 holds {before}");
            }
        }
        control.cli(&["device", "revoke", &cluster.id(victim).to_hex(), "--reason", "bench"]).await?;
        let t0 = Instant::now();
        let mut waiting: Vec<usize> = std::iter::once(0).chain(cut.iter().copied()).collect();
        let mut last = 0.0f64;
        while !waiting.is_empty() {
            if t0.elapsed() > LIMIT {
                bail!("round {round}: nodes {waiting:?} did not learn the revocation within {LIMIT:?}");
            }
            let mut still = Vec::new();
            for i in waiting {
                if generation(&cluster, i).await? > before {
                    let took = t0.elapsed().as_secs_f64();
                    if i == 0 {
                        followers.push(took);
                    } else {
                        per_node.push(took);
                        last = last.max(took);
                    }
                } else {
                    still.push(i);
                }
            }
            waiting = still;
            tokio::time::sleep(POLL).await;
        }
        eprintln!("bench: revocation round {round}: every cut-off node had it after {last:.2} s");
        spreads.push(last);
    }
    cluster.shutdown().await?;
    let in_order = spreads.clone();
    let s = |v: &mut Vec<f64>, p: f64| percentile_ms(v, p);
    Ok(json!({
        "nodes": nodes,
        "cut_off": o.cut_off,
        "rounds": o.rounds,
        "gossip_interval_s": timeshard_node::config::MembershipConfig::default().gossip_interval.as_secs_f64(),
        // Medians and largest over rounds of the time until the last cut-off node had it.
        "revocation_spread_s": s(&mut spreads, 50.0),
        "revocation_spread_max_s": s(&mut spreads, 100.0),
        "spread_s": in_order,
        // Each cut-off node, each round.
        "cut_off_node_p50_s": s(&mut per_node, 50.0),
        // Node 0, which follows the control plane.
        "follower_p50_s": s(&mut followers, 50.0),
        "poll_ms": POLL.as_millis() as u64,
    }))
}

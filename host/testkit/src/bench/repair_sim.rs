//! The simulated part of `timeshard bench repair`, over the sans-IO digest trees
//! (`timeshard_proto::repair::tree`), no node processes: idle anti-entropy at block counts the
//! node-process run cannot reach on one machine (up to a million blocks per node).
//!
//! `nodes` nodes at RF 3 hold identical replicas of blocks with random placement ids (the
//! steady state, nothing to repair). Every node runs one session per round with each other
//! node (the cluster stays below [`MAX_NEIGHBOURS`]): it builds the tree of the blocks both
//! own, as the node's inventory does, the peer answers from its own tree, and the exchange
//! follows the session's loop (`host/node/src/repair/session.rs`: root first, descend where
//! hashes differ, then list the differing leaves). The bytes counted are the frames of every
//! message both ways ([`frame_bytes`]), as the nodes count `compare_bytes`.

use std::net::SocketAddr;

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use timeshard_proto::placement::owners;
use timeshard_proto::repair::tree::{self, Descent, Tree, entry_hash, leaf_of};
use timeshard_proto::repair::{MAX_LEAF_ENTRIES, MAX_NEIGHBOURS, RepairScope};
use timeshard_proto::wire::frame_bytes;
use timeshard_proto::wire::{Request, Response};
use timeshard_proto::{Contact, Id};

use crate::stats::round3;

const RF: usize = 3;

/// What one simulated idle round cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IdleRound {
    pub nodes: usize,
    pub blocks_per_node: usize,
    /// Sessions in the round (each node with each other node).
    pub sessions: usize,
    /// Messages and bytes of all sessions, both ways.
    pub messages: u64,
    pub bytes: u64,
    /// Leaves found to differ (0 for identical replicas).
    pub leaves_differing: u64,
}

impl IdleRound {
    /// Bytes per node and second at rounds every `interval_s`, counted as the node-process run
    /// counts them (each session once, at its initiator).
    pub fn bytes_per_s_per_node(&self, interval_s: f64) -> f64 {
        self.bytes as f64 / self.nodes as f64 / interval_s
    }
}

/// One idle round of `nodes` nodes holding about `blocks_per_node` blocks each, identical on
/// every replica.
pub fn idle_round(nodes: usize, blocks_per_node: usize, seed: u64) -> IdleRound {
    assert!((RF..=MAX_NEIGHBOURS).contains(&nodes), "between {RF} and {MAX_NEIGHBOURS} nodes");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let addr: SocketAddr = "127.0.0.1:1".parse().expect("a socket address");
    let members: Vec<Contact> = (0..nodes).map(|_| Contact { id: Id::random(&mut rng), addr }).collect();
    let index = |id: &Id| members.iter().position(|c| c.id == *id).expect("an owner is a member");
    // trees[i * nodes + j]: node i's tree of the blocks both i and j own. Identical replicas
    // give both sides the same blocks with the same digests.
    let mut trees = vec![Tree::new(); nodes * nodes];
    let blocks = blocks_per_node * nodes / RF;
    for _ in 0..blocks {
        let id = Id::random(&mut rng);
        let hash = entry_hash(&id, rng.random(), rng.random(), rng.random_range(1..10_000));
        let leaf = leaf_of(&id);
        let owned: Vec<usize> = owners(&members, &id, RF).iter().map(|c| index(&c.id)).collect();
        for &i in &owned {
            for &j in owned.iter().filter(|&&j| j != i) {
                trees[i * nodes + j].add(leaf, hash);
            }
        }
    }
    let mut round = IdleRound { nodes, blocks_per_node, sessions: 0, messages: 0, bytes: 0, leaves_differing: 0 };
    let scope = RepairScope { view: 1, cutoff: i64::MAX };
    for i in 0..nodes {
        for j in (0..nodes).filter(|&j| j != i) {
            let (local, remote) = (&trees[i * nodes + j], &trees[j * nodes + i]);
            session(local, remote, scope, &mut round);
        }
    }
    round
}

/// One session's comparison, as `session.rs` runs it, counted into `round`.
fn session(local: &Tree, remote: &Tree, scope: RepairScope, round: &mut IdleRound) {
    let mut count = |req: &Request, resp: &Response| {
        round.messages += 2;
        round.bytes += frame_bytes(req) + frame_bytes(resp);
    };
    let descent = Descent::new(local);
    let mut ask = descent.start();
    let mut leaves = Vec::new();
    for _ in 0..=tree::DEPTH {
        if ask.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for chunk in ask.chunks(tree::LEAVES) {
            let nodes = chunk.to_vec();
            let hashes = tree::answer(remote, &nodes, tree::MAX_DESCEND);
            let req = Request::RepairTree { scope, nodes, descend: tree::MAX_DESCEND };
            let step = descent.on_answer(&hashes);
            count(&req, &Response::RepairTree { view_matches: true, hashes });
            leaves.extend(step.leaves);
            next.extend(step.ask);
        }
        ask = next;
    }
    if !leaves.is_empty() {
        // Listing differing leaves is what repair costs, not idle comparison; the simulation
        // only counts its request (replicas here are identical, so it does not happen).
        let req = Request::RepairLeaves { scope, leaves: leaves.clone(), limit: MAX_LEAF_ENTRIES };
        round.messages += 1;
        round.bytes += frame_bytes(&req);
    }
    round.leaves_differing += leaves.len() as u64;
    round.sessions += 1;
}

/// The simulated idle anti-entropy figures of `bench repair`: one round of `nodes` nodes at
/// each block count of `blocks_per_node`, rounds every `interval_s`.
pub fn idle_figures(nodes: usize, blocks_per_node: &[usize], interval_s: f64) -> Value {
    let rounds: Vec<IdleRound> = blocks_per_node.iter().map(|&b| idle_round(nodes, b, b as u64)).collect();
    for r in &rounds {
        println!(
            "idle anti-entropy (simulated, sans-IO trees): {} nodes, {} blocks per node: {} sessions, {} bytes per \
             round = {:.1} bytes/s per node at rounds every {interval_s} s",
            r.nodes,
            r.blocks_per_node,
            r.sessions,
            r.bytes,
            r.bytes_per_s_per_node(interval_s)
        );
    }
    let at_most = rounds.iter().map(|r| r.bytes_per_s_per_node(interval_s)).fold(0.0, f64::max);
    json!({
        "simulated": true,
        "nodes": nodes,
        "rf": RF,
        "interval_s": interval_s,
        "rounds": rounds.iter().map(|r| json!({
            "blocks_per_node": r.blocks_per_node,
            "sessions": r.sessions,
            "messages": r.messages,
            "bytes_per_round": r.bytes,
            "leaves_differing": r.leaves_differing,
            "bytes_per_s_per_node": round3(r.bytes_per_s_per_node(interval_s)),
        })).collect::<Vec<_>>(),
        "bytes_per_s_per_node_at_most": round3(at_most),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_replicas_cost_one_small_exchange_per_session_whatever_the_block_count() {
        let small = idle_round(5, 100, 1);
        let large = idle_round(5, 20_000, 2);
        for r in [small, large] {
            assert_eq!(r.sessions, 20);
            assert_eq!(r.leaves_differing, 0);
            assert_eq!(r.messages, 2 * r.sessions as u64, "root asked, nothing answered: {r:?}");
        }
        // Only the varint length of each root hash tells them apart.
        assert!(small.bytes.abs_diff(large.bytes) <= 4 * small.sessions as u64, "{small:?} {large:?}");
        assert!(large.bytes / large.sessions as u64 <= 64, "{large:?}");
    }

    #[test]
    fn a_differing_block_is_found_by_descending_to_its_leaf() {
        let mut a = Tree::new();
        let mut b = Tree::new();
        let id = Id::sha1(b"block");
        a.add(leaf_of(&id), entry_hash(&id, 1, 2, 3));
        b.add(leaf_of(&id), entry_hash(&id, 1, 2, 4));
        let mut round =
            IdleRound { nodes: 2, blocks_per_node: 1, sessions: 0, messages: 0, bytes: 0, leaves_differing: 0 };
        session(&a, &b, RepairScope { view: 1, cutoff: i64::MAX }, &mut round);
        assert_eq!(round.leaves_differing, 1);
        assert!(round.messages > 2);
    }
}

//! Digest trees: a fixed-shape hash tree over a set of blocks, and the descent that finds the
//! leaves where two trees differ.
//!
//! A tree has [`LEAVES`] leaves under a root with fan-out [`FANOUT`] ([`DEPTH`] levels below
//! the root). A block goes to the leaf given by a hash of its placement id ([`leaf_of`]), so
//! leaves fill uniformly whatever the key format; a leaf's hash is the wrapping sum of its
//! blocks' [`entry_hash`]es, and every inner node's the wrapping sum of its children. Sums do
//! not depend on order, so a tree is built in one pass over the blocks in any order, and two
//! replicas holding the same blocks (same keys, same digests) build equal trees.
//!
//! Comparing trees ([`Descent`]): the initiator sends the hashes of some nodes of its tree; the
//! peer answers, for each node whose hash differs from its own, the hashes of the node's
//! descendants a few levels down ([`answer`]); the initiator keeps the descendants that differ
//! and asks again, until it reaches the leaves. Equal trees cost one small message each way.

use serde::{Deserialize, Serialize};

pub use crate::hash::hash_bytes;
use crate::hash::mix;
use crate::id::Id;

/// Children of every inner node.
pub const FANOUT: usize = 16;
/// Levels below the root.
pub const DEPTH: u8 = 3;
/// Leaves of a tree: `FANOUT ^ DEPTH`.
pub const LEAVES: usize = 4_096;
/// Levels a peer descends below each differing node it is asked about, at most.
pub const MAX_DESCEND: u8 = 2;

/// A 64-bit hash of every byte of an id.
fn id_hash(id: &Id) -> u64 {
    hash_bytes(&id.0)
}

/// The leaf of the block placed at `id`.
pub fn leaf_of(id: &Id) -> u16 {
    (id_hash(id) % LEAVES as u64) as u16
}

/// What one block adds to its leaf: a hash of its placement id, its key (`key_hash`), the
/// digest of its points and their count.
pub fn entry_hash(id: &Id, key_hash: u64, digest: u64, count: u64) -> u64 {
    mix(id_hash(id) ^ mix(key_hash ^ mix(digest ^ mix(count.wrapping_add(0x9E37_79B9_7F4A_7C15)))))
}

/// A node of a tree: its level (0 is the root, [`DEPTH`] the leaves) and its index within the
/// level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TreeNode {
    pub level: u8,
    pub index: u16,
}

impl TreeNode {
    /// The root.
    pub const ROOT: TreeNode = TreeNode { level: 0, index: 0 };

    /// Nodes at `level`.
    fn width(level: u8) -> usize {
        FANOUT.pow(u32::from(level))
    }

    /// Whether the node exists in a tree of this shape.
    pub fn is_valid(&self) -> bool {
        self.level <= DEPTH && usize::from(self.index) < Self::width(self.level)
    }

    /// Whether the node is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.level == DEPTH
    }

    /// Its descendants `levels` levels down (itself for 0), in index order.
    pub fn descendants(&self, levels: u8) -> impl Iterator<Item = TreeNode> {
        let level = (self.level + levels).min(DEPTH);
        let span = Self::width(level - self.level);
        let first = usize::from(self.index) * span;
        (first..first + span).map(move |i| TreeNode { level, index: i as u16 })
    }
}

/// A digest tree.
#[derive(Clone, PartialEq, Eq)]
pub struct Tree {
    /// Level by level, root first; each level's nodes in index order.
    levels: Vec<Vec<u64>>,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tree({:016x})", self.root())
    }
}

impl Default for Tree {
    fn default() -> Self {
        Tree::new()
    }
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Tree {
        Tree { levels: (0..=DEPTH).map(|l| vec![0; TreeNode::width(l)]).collect() }
    }

    /// Adds a block's [`entry_hash`] to leaf `leaf` and every node above it.
    pub fn add(&mut self, leaf: u16, hash: u64) {
        let mut index = usize::from(leaf) % LEAVES;
        for level in (0..=usize::from(DEPTH)).rev() {
            let slot = &mut self.levels[level][index];
            *slot = slot.wrapping_add(hash);
            index /= FANOUT;
        }
    }

    /// The hash of `node` (0 for a node outside the shape).
    pub fn hash(&self, node: TreeNode) -> u64 {
        self.levels.get(usize::from(node.level)).and_then(|l| l.get(usize::from(node.index))).copied().unwrap_or(0)
    }

    /// The root's hash.
    pub fn root(&self) -> u64 {
        self.levels[0][0]
    }
}

/// The peer's side of a comparison: for each asked node whose hash in `tree` differs from the
/// asker's, the hashes of its descendants `descend` levels down (at most [`MAX_DESCEND`], and
/// never below the leaves; a differing leaf is answered with itself).
pub fn answer(tree: &Tree, asked: &[(TreeNode, u64)], descend: u8) -> Vec<(TreeNode, u64)> {
    let descend = descend.clamp(1, MAX_DESCEND);
    let mut out = Vec::new();
    for &(node, theirs) in asked {
        if !node.is_valid() || tree.hash(node) == theirs {
            continue;
        }
        let levels = if node.is_leaf() { 0 } else { descend };
        out.extend(node.descendants(levels).map(|d| (d, tree.hash(d))));
    }
    out
}

/// The initiator's side of a comparison with one peer.
#[derive(Debug)]
pub struct Descent<'a> {
    local: &'a Tree,
}

/// What to do after an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Nodes to ask about next, with this side's hashes.
    pub ask: Vec<(TreeNode, u64)>,
    /// Leaves found to differ.
    pub leaves: Vec<u16>,
}

impl<'a> Descent<'a> {
    /// A comparison of `local` with a peer's tree.
    pub fn new(local: &'a Tree) -> Descent<'a> {
        Descent { local }
    }

    /// The first question: the root.
    pub fn start(&self) -> Vec<(TreeNode, u64)> {
        vec![(TreeNode::ROOT, self.local.root())]
    }

    /// Takes the peer's [`answer`]: differing leaves are done, differing inner nodes are asked
    /// about next. Nodes outside the shape are ignored.
    pub fn on_answer(&self, theirs: &[(TreeNode, u64)]) -> Step {
        let mut step = Step { ask: Vec::new(), leaves: Vec::new() };
        for &(node, hash) in theirs {
            if !node.is_valid() {
                continue;
            }
            let mine = self.local.hash(node);
            if node.is_leaf() {
                if mine != hash {
                    step.leaves.push(node.index);
                }
            } else if mine != hash {
                step.ask.push((node, mine));
            }
        }
        step.leaves.sort_unstable();
        step.leaves.dedup();
        step
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    /// Runs a full comparison of `a` (initiator) with `b`; returns the differing leaves and the
    /// hashes exchanged.
    fn compare(a: &Tree, b: &Tree) -> (BTreeSet<u16>, usize) {
        let descent = Descent::new(a);
        let mut ask = descent.start();
        let mut leaves = BTreeSet::new();
        let mut exchanged = 0;
        for _ in 0..=DEPTH {
            if ask.is_empty() {
                break;
            }
            exchanged += ask.len();
            let theirs = answer(b, &ask, MAX_DESCEND);
            exchanged += theirs.len();
            let step = descent.on_answer(&theirs);
            leaves.extend(step.leaves);
            ask = step.ask;
        }
        assert!(ask.is_empty(), "the descent reaches the leaves within the depth");
        (leaves, exchanged)
    }

    fn tree_of(entries: &[(Id, u64)]) -> Tree {
        let mut t = Tree::new();
        for (id, h) in entries {
            t.add(leaf_of(id), *h);
        }
        t
    }

    #[test]
    fn the_shape_adds_up() {
        assert_eq!(FANOUT.pow(u32::from(DEPTH)), LEAVES);
        let mut t = Tree::new();
        t.add(4095, 7);
        t.add(0, 5);
        assert_eq!(t.root(), 12);
        assert_eq!(t.hash(TreeNode { level: 1, index: 15 }), 7);
        assert_eq!(t.hash(TreeNode { level: 3, index: 0 }), 5);
        assert!(!TreeNode { level: 1, index: 16 }.is_valid());
        assert!(!TreeNode { level: 4, index: 0 }.is_valid());
        let kids: Vec<TreeNode> = TreeNode { level: 1, index: 2 }.descendants(2).collect();
        assert_eq!(kids.len(), 256);
        assert_eq!(kids[0], TreeNode { level: 3, index: 512 });
    }

    #[test]
    fn equal_trees_cost_one_exchange() {
        let entries: Vec<(Id, u64)> = (0..500u32).map(|i| (Id::sha1(&i.to_be_bytes()), u64::from(i) * 77)).collect();
        let (a, b) = (tree_of(&entries), tree_of(&entries.iter().rev().copied().collect::<Vec<_>>()));
        assert_eq!(a, b, "order does not matter");
        let (leaves, exchanged) = compare(&a, &b);
        assert!(leaves.is_empty());
        assert_eq!(exchanged, 1, "only the root was sent");
    }

    proptest! {
        /// The descent finds exactly the leaves whose contents differ.
        #[test]
        fn the_descent_finds_exactly_the_differing_leaves(
            common in proptest::collection::vec(any::<[u8; 20]>(), 0..300),
            only_a in proptest::collection::vec(any::<[u8; 20]>(), 0..20),
            only_b in proptest::collection::vec(any::<[u8; 20]>(), 0..20),
        ) {
            let common: Vec<(Id, u64)> = common.into_iter().map(|b| (Id(b), 1)).collect();
            let mut a = common.clone();
            a.extend(only_a.iter().enumerate().map(|(i, b)| (Id(*b), mix(i as u64 + 1))));
            let mut b = common;
            b.extend(only_b.iter().enumerate().map(|(i, b)| (Id(*b), mix(i as u64 + 1_000))));
            let want: BTreeSet<u16> = only_a.iter().chain(&only_b).map(|b| leaf_of(&Id(*b))).collect();
            let (found, _) = compare(&tree_of(&a), &tree_of(&b));
            prop_assert_eq!(found, want);
        }
    }
}

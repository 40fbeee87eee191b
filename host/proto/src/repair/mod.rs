//! Repair planning: what replicas compare and what they stream to each other, sans I/O.
//!
//! - [`tree`]: digest trees over a set of blocks, and the descent that finds where two differ.
//! - [`ring`]: the k closest members of a view to an id, fast enough to run once per block.
//! - [`settle`]: whether a node holds every block it owns, and the pace of transfers.
//! - [`undelivered`]: blocks a peer listed but did not send, left to other replicas a while.
//! - This module: the wire types of repair ([`BlockRef`], [`RepairEntry`], [`RepairScope`],
//!   ...), which blocks to fetch after a comparison ([`to_fetch`]), whom a node pulls from
//!   ([`neighbours`]), how far a read goes beyond the owners ([`read_candidates`]), and when a
//!   displaced block may be dropped ([`Handoff`]).
//!
//! # Anti-entropy in short
//!
//! A pull session of node I from peer P compares two trees: over the blocks I holds that both
//! own, and over the blocks P holds that I owns (P may hold blocks it no longer owns). Blocks
//! written within `settle_for` are left out on both sides (a cutoff I sends), except while I
//! catches up. Where leaves differ, P lists its entries `(block, digest, count)` and I fetches
//! what it lacks or holds with another digest ([`to_fetch`]); stored data is a set of points,
//! so storing what was fetched is a union. The series dictionary takes part as pseudo-blocks
//! ([`BlockRef::Registration`]).

pub mod ring;
pub mod settle;
pub mod tree;
pub mod undelivered;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::hash::{hash_bytes, mix};
use crate::id::Id;
use crate::point::{Point, PointKey};
use crate::routing::Contact;
use crate::series::SeriesKey;
use crate::time::{Quantum, Timestamp};

pub use ring::Ring;
pub use settle::{Pace, Settle};
pub use tree::{Descent, LEAVES, Tree, TreeNode};
pub use undelivered::Undelivered;

/// Most neighbours a node pulls from: every member when the view holds at most this many,
/// otherwise this many closest to the node.
pub const MAX_NEIGHBOURS: usize = 64;
/// Most entries one leaf listing answer carries.
pub const MAX_LEAF_ENTRIES: u32 = 65_536;
/// Most blocks one bulk read or digest request names.
pub const MAX_REQUEST_BLOCKS: usize = 4_096;

/// A block of points, or the registration of a series in the series dictionary, as repair
/// names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BlockRef {
    Points { series: SeriesKey, quantum: Quantum },
    Registration { series: SeriesKey },
}

impl BlockRef {
    /// The series.
    pub fn series(&self) -> &SeriesKey {
        match self {
            BlockRef::Points { series, .. } | BlockRef::Registration { series } => series,
        }
    }

    /// A stable hash of the key (not of the points): what tells two blocks of one leaf apart.
    pub fn key_hash(&self) -> u64 {
        let series = hash_bytes(self.series().as_str().as_bytes());
        match self {
            BlockRef::Points { quantum, .. } => mix(series ^ mix(quantum.start as u64 ^ mix(quantum.len.ns() as u64))),
            BlockRef::Registration { .. } => mix(series ^ 0x5245_4749_5354_4552),
        }
    }
}

/// The digest a registration reports: it holds no points, so its key stands for it.
pub fn registration_digest(series: &SeriesKey) -> u64 {
    BlockRef::Registration { series: series.clone() }.key_hash()
}

/// One block as a replica holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairEntry {
    pub block: BlockRef,
    /// The block's digest ([`crate::point::set_digest`] of its points; for a registration,
    /// [`registration_digest`]).
    pub digest: u64,
    /// Its points (0 for a registration).
    pub count: u64,
}

/// What a pull session compares: the view both sides place by, and which blocks they leave
/// out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairScope {
    /// Digest of the initiator's view of the members that own blocks; a peer whose view
    /// differs answers with `view_matches: false` (the trees would differ for that alone).
    pub view: u64,
    /// Blocks last written after this (ns since the epoch, the initiator's clock) are left
    /// out; `i64::MAX` leaves nothing out.
    pub cutoff: Timestamp,
}

/// Where a bulk read of several blocks goes on: the index of the block in the request, and
/// the last point sent of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockCursor {
    pub block: u32,
    pub after: Option<PointKey>,
}

/// Where a listing of a node's blocks goes on (the store's cursor, opaque to the asker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCursor {
    pub series: u32,
    pub after: Option<Timestamp>,
}

/// One block a node holds, as a listing of its blocks (`Request::ListBlocks`) reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedBlock {
    pub series: SeriesKey,
    pub quantum: Quantum,
    pub count: u64,
    pub digest: u64,
}

/// Where a graceful leave stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveProgress {
    /// Blocks the node held when it started leaving.
    pub blocks_total: u64,
    /// Blocks handed off (confirmed by every owner) and dropped since.
    pub blocks_done: u64,
    /// Bytes pushed to the new owners.
    pub bytes_pushed: u64,
    /// Whether every block is handed off and the node announced that it left; it exits next.
    pub left: bool,
}

impl RepairEntry {
    /// The entry of a registration.
    pub fn registration(series: SeriesKey) -> RepairEntry {
        let digest = registration_digest(&series);
        RepairEntry { block: BlockRef::Registration { series }, digest, count: 0 }
    }
}

/// What a node reports of its anti-entropy, handoff, read repair and leaving (in its status,
/// `NodeStatus`). Counters run since the node started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairStatus {
    /// Whether the node holds every block it owns: reads count only settled answers towards R.
    pub settled: bool,
    /// Whether the node is leaving (handing its blocks off before it exits).
    pub leaving: bool,
    /// Anti-entropy rounds completed (a pull from every neighbour that was up).
    pub rounds: u64,
    /// Pull sessions completed, and sessions answered for peers.
    pub sessions: u64,
    pub sessions_served: u64,
    /// Bytes of comparisons (tree hashes and leaf listings), both ways, in the sessions this
    /// node ran: what anti-entropy costs when there is nothing to repair.
    pub compare_bytes: u64,
    /// Blocks anti-entropy fetched into this node, and the bytes of the messages that fetched
    /// them (requests and answers, as framed on the wire).
    pub blocks_fetched: u64,
    pub bytes_fetched: u64,
    /// Blocks this node held but no longer owned at its last handoff pass.
    pub handoff_pending: u64,
    /// Blocks pushed to owners that lacked them, and the bytes of the messages (as framed).
    pub handoff_blocks_pushed: u64,
    pub handoff_bytes_pushed: u64,
    /// Copies dropped after every owner confirmed it holds them.
    pub handoff_blocks_dropped: u64,
    /// Read repairs sent to replicas that lacked points, and those dropped because the queue
    /// was full.
    pub read_repairs_sent: u64,
    pub read_repairs_dropped: u64,
    /// Progress of a graceful leave.
    pub leave: LeaveProgress,
}

/// The blocks to fetch after a comparison: those a peer listed (`theirs`) that this node does
/// not hold, or holds with another digest or count (`mine`: this node's entries of the same
/// leaves, by block), leaving out blocks `skip` says this node must not take (it does not own
/// them, or they changed here lately). Registrations this node lacks are in the list too; they
/// need no fetch, only to be recorded.
pub fn to_fetch(
    theirs: Vec<RepairEntry>,
    mine: &HashMap<BlockRef, (u64, u64)>,
    skip: impl Fn(&BlockRef) -> bool,
) -> Vec<RepairEntry> {
    theirs
        .into_iter()
        .filter(|e| mine.get(&e.block) != Some(&(e.digest, e.count)))
        .filter(|e| e.count > 0 || matches!(e.block, BlockRef::Registration { .. }))
        .filter(|e| !skip(&e.block))
        .collect()
}

/// Whom `me` pulls from: every member of `serving` (not gone, this node excluded) when there
/// are at most [`MAX_NEIGHBOURS`], otherwise the [`MAX_NEIGHBOURS`] closest to `me`.
pub fn neighbours(serving: &Ring, me: &Id) -> Vec<Contact> {
    serving.closest(me, MAX_NEIGHBOURS + 1).into_iter().filter(|c| c.id != *me).take(MAX_NEIGHBOURS).collect()
}

/// The nodes a read of a block may ask, closest first: its `rf` owners first, then the next
/// closest members that still serve (leaving ones included), up to `2 * rf + 2` in all. A
/// read counts settled answers towards R and asks further down this list while it has too
/// few; the bound keeps a read that finds most of its owners unsettled (many joins at once)
/// from asking the whole view.
pub fn read_candidates(owners: &[Contact], serving: &Ring, id: &Id, rf: usize) -> Vec<Contact> {
    let bound = 2 * rf + 2;
    let mut out: Vec<Contact> = owners.to_vec();
    for c in serving.closest(id, bound) {
        if out.len() >= bound {
            break;
        }
        if !out.iter().any(|o| o.id == c.id) {
            out.push(c);
        }
    }
    out
}

/// The points of `union` that a replica's answer lacks, given how far its answer reached:
/// `complete` when it returned everything of the range, otherwise up to its last point.
pub fn missing_from(union: &[Point], answer: &[Point], complete: bool) -> Vec<Point> {
    let reach = match (complete, answer.last()) {
        (true, _) => None,
        (false, Some(last)) => Some(last.key()),
        (false, None) => return Vec::new(),
    };
    let have: std::collections::HashSet<PointKey> = answer.iter().map(Point::key).collect();
    union.iter().filter(|p| reach.is_none_or(|r| p.key() <= r)).filter(|p| !have.contains(&p.key())).copied().collect()
}

/// The handoff of one block this node holds but no longer owns: every owner must confirm it
/// holds at least this node's points (an equal digest, or a successful push) before the copy
/// may be dropped, and only if its digest is still the one confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// The digest of this node's copy when the handoff started.
    pub digest: u64,
    pending: Vec<Id>,
    /// Whether the copy had no owner to go to (then it is never dropped).
    orphan: bool,
}

/// What an owner said about its copy of a block being handed off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerCopy {
    /// It holds the same points.
    Same,
    /// It holds other points or none: push ours.
    Differs,
    /// It could not be asked (down, failed): keep our copy for now.
    Unknown,
}

impl Handoff {
    /// A handoff of a copy with `digest` to `owners`. With no owner (a CoI block while no node
    /// has a location, the last node of a cluster leaving) there is no one to hand the copy
    /// to, and it may never be dropped: it may be the last one.
    pub fn new(digest: u64, owners: impl IntoIterator<Item = Id>) -> Handoff {
        let pending: Vec<Id> = owners.into_iter().collect();
        Handoff { digest, orphan: pending.is_empty(), pending }
    }

    /// The owners that have not confirmed yet.
    pub fn pending(&self) -> &[Id] {
        &self.pending
    }

    /// Records that `owner` holds this node's points (equal digest, or a push it stored).
    pub fn confirmed(&mut self, owner: &Id) {
        self.pending.retain(|o| o != owner);
    }

    /// What to do about `owner`'s answer: push when it differs.
    pub fn on_digest(&mut self, owner: &Id, theirs: Option<(u64, u64)>, count: u64) -> OwnerCopy {
        match theirs {
            Some(t) if t == (self.digest, count) => {
                self.confirmed(owner);
                OwnerCopy::Same
            }
            _ => OwnerCopy::Differs,
        }
    }

    /// Whether every owner confirmed, so the copy may be dropped (if it still has
    /// [`Handoff::digest`]); never for a copy that had no owner to go to.
    pub fn may_drop(&self) -> bool {
        !self.orphan && self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::time::QuantumLen;

    fn contact(i: u8) -> Contact {
        Contact { id: Id::sha1(&[i]), addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(i))) }
    }

    fn block(s: &str, q: i64) -> BlockRef {
        BlockRef::Points { series: s.parse().unwrap(), quantum: QuantumLen::DEFAULT.quantum_of(q) }
    }

    #[test]
    fn keys_hash_apart() {
        let a = block("m", 0);
        assert_ne!(a.key_hash(), block("m", 10_000_000_000).key_hash());
        assert_ne!(a.key_hash(), block("n", 0).key_hash());
        assert_ne!(a.key_hash(), BlockRef::Registration { series: "m".parse().unwrap() }.key_hash());
        assert_eq!(a.key_hash(), block("m", 5).key_hash(), "the same quantum");
    }

    #[test]
    fn only_what_differs_is_fetched() {
        let e = |b: BlockRef, d, c| RepairEntry { block: b, digest: d, count: c };
        let mine: HashMap<BlockRef, (u64, u64)> = [(block("a", 0), (1, 1)), (block("b", 0), (2, 2))].into();
        let theirs = vec![
            e(block("a", 0), 1, 1), // same
            e(block("b", 0), 3, 3), // differs
            e(block("c", 0), 4, 4), // lacking
            e(block("d", 0), 5, 5), // not ours to take
            e(block("e", 0), 0, 0), // empty: nothing to fetch
            RepairEntry::registration("r".parse().unwrap()),
        ];
        let skip = |b: &BlockRef| *b == block("d", 0);
        let fetch: Vec<BlockRef> = to_fetch(theirs, &mine, skip).into_iter().map(|e| e.block).collect();
        assert_eq!(fetch, vec![block("b", 0), block("c", 0), BlockRef::Registration { series: "r".parse().unwrap() }]);
    }

    #[test]
    fn reads_go_beyond_the_owners_within_a_bound() {
        let all: Vec<Contact> = (0..20).map(contact).collect();
        let ring = Ring::new(all.clone());
        let id = Id::sha1(b"block");
        let owners = crate::placement::owners(&all, &id, 3);
        let c = read_candidates(&owners, &ring, &id, 3);
        assert_eq!(c.len(), 8);
        assert_eq!(&c[..3], &owners[..]);
        assert_eq!(c, crate::placement::owners(&all, &id, 8), "the next closest, in order");
        // The owners may name nodes that are not in the ring (yet); they stay first.
        let small = Ring::new(all[..2].to_vec());
        let c = read_candidates(&owners, &small, &id, 3);
        assert_eq!(&c[..3], &owners[..]);
        assert!(c.len() <= 5 && c[3..].iter().all(|x| small.contains(&x.id)));
        let me = contact(0);
        let n = neighbours(&ring, &me.id);
        assert_eq!(n.len(), 19);
        assert!(n.iter().all(|c| c.id != me.id));
    }

    #[test]
    fn a_replica_lacks_only_what_its_answer_reached() {
        let p = |t| Point::new(t, 0.0);
        let union = vec![p(1), p(2), p(3), p(4)];
        assert_eq!(missing_from(&union, &[p(1), p(3), p(4)], true), vec![p(2)]);
        // Cut at its page limit after 2: 3 and 4 may be beyond.
        assert_eq!(missing_from(&union, &[p(2)], false), vec![p(1)]);
        assert_eq!(missing_from(&union, &[], true), union);
        assert!(missing_from(&union, &[], false).is_empty());
    }

    #[test]
    fn a_copy_is_dropped_only_after_every_owner_confirmed() {
        let (a, b) = (Id::sha1(b"a"), Id::sha1(b"b"));
        let mut h = Handoff::new(7, [a, b]);
        assert_eq!(h.on_digest(&a, Some((7, 3)), 3), OwnerCopy::Same);
        assert!(!h.may_drop());
        assert_eq!(h.on_digest(&b, Some((8, 3)), 3), OwnerCopy::Differs);
        assert_eq!(h.on_digest(&b, None, 3), OwnerCopy::Differs);
        assert_eq!(h.pending(), &[b]);
        h.confirmed(&b);
        assert!(h.may_drop());
    }

    /// Issue 24, bug 1 (simulation seed 2): with no owner at all (no node located for a CoI
    /// class, the last node leaving) nothing was pending, so the only copy was dropped at once.
    #[test]
    fn a_copy_without_owners_is_never_dropped() {
        let h = Handoff::new(7, []);
        assert!(h.pending().is_empty());
        assert!(!h.may_drop(), "no owner confirmed: this may be the last copy");
        let mut h = Handoff::new(7, [contact(1).id]);
        assert!(!h.may_drop());
        h.confirmed(&contact(1).id);
        assert!(h.may_drop());
    }
}

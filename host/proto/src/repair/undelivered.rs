//! Blocks a peer listed but did not deliver when a pull session fetched them (its copy is
//! damaged, or was dropped meanwhile), so the next rounds take them from another replica.
//!
//! A round's sessions share what they planned to fetch, so a block several peers list is
//! fetched once. A peer that lists a block it cannot send would otherwise win it round after
//! round (sessions run in the same order), and the replicas that hold a good copy would never
//! be asked (issue 24, seed 1042: a damaged block kept a new owner below RF for good).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::id::Id;

use super::BlockRef;

/// How long a peer is passed over for a block it did not deliver.
pub const UNDELIVERED_FOR: Duration = Duration::from_secs(60);
/// Most (peer, block) pairs remembered; past it the oldest are forgotten first.
pub const MAX_UNDELIVERED: usize = 16_384;

/// Which peer failed to deliver which block, and when.
#[derive(Clone, Debug, Default)]
pub struct Undelivered {
    failed: HashMap<(Id, BlockRef), Instant>,
}

impl Undelivered {
    /// Records that `peer` listed `block` but sent none of it at `now`.
    pub fn note(&mut self, peer: Id, block: BlockRef, now: Instant) {
        // Expired pairs answer nothing (`pass_over` checks the age): pruned only when full,
        // not with a pass over the whole record on every block noted.
        if self.failed.len() >= MAX_UNDELIVERED {
            self.failed.retain(|_, at| now.saturating_duration_since(*at) < UNDELIVERED_FOR);
        }
        if self.failed.len() >= MAX_UNDELIVERED {
            let oldest = self.failed.iter().min_by_key(|(_, at)| **at).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.failed.remove(&k);
            }
        }
        self.failed.insert((peer, block), now);
    }

    /// Whether a session with `peer` should leave `block` to other replicas at `now`.
    pub fn pass_over(&self, peer: &Id, block: &BlockRef, now: Instant) -> bool {
        self.failed.get(&(*peer, block.clone())).is_some_and(|at| now.saturating_duration_since(*at) < UNDELIVERED_FOR)
    }

    /// Pairs remembered (expired ones included until the record fills).
    pub fn len(&self) -> usize {
        self.failed.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.failed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{Quantum, QuantumLen};

    fn block(n: i64) -> BlockRef {
        let len = QuantumLen::DEFAULT;
        BlockRef::Points { series: "m".parse().unwrap(), quantum: Quantum::at(n * len.ns(), len).unwrap() }
    }

    #[test]
    fn a_peer_is_passed_over_for_the_block_it_did_not_deliver_only_and_only_for_a_while() {
        let t0 = Instant::now();
        let (bad, good) = (Id([1; 20]), Id([2; 20]));
        let mut u = Undelivered::default();
        u.note(bad, block(0), t0);
        assert!(u.pass_over(&bad, &block(0), t0 + Duration::from_secs(2)));
        assert!(!u.pass_over(&good, &block(0), t0), "another replica is still asked for it");
        assert!(!u.pass_over(&bad, &block(1), t0), "the peer still sends its other blocks");
        assert!(!u.pass_over(&bad, &block(0), t0 + UNDELIVERED_FOR), "and is tried again later");
    }

    #[test]
    fn the_record_is_bounded() {
        let t0 = Instant::now();
        let mut u = Undelivered::default();
        for i in 0..MAX_UNDELIVERED as i64 + 10 {
            u.note(Id([3; 20]), block(i), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(u.len(), MAX_UNDELIVERED);
        assert!(!u.pass_over(&Id([3; 20]), &block(0), t0 + Duration::from_secs(1)), "the oldest went first");
    }
}

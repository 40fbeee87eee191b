//! The members of a view sorted by id, answering "the k closest to an id" in O(k log n).
//!
//! [`crate::placement::owners`] looks at every member, which is fine once per write but not once
//! per block when repair walks a million blocks of a view of thousands. Ids sharing a prefix
//! form a contiguous run of a sorted list, and every id that agrees with the target on the
//! next bit is closer (XOR) than every id that does not, so the k closest are found by
//! splitting runs bit by bit ([`Ring::closest`]); the result is the same as
//! [`crate::placement::owners`] (a property test checks it).

use crate::id::{ID_BITS, Id};
use crate::placement::Members;
use crate::routing::Contact;

/// Members sorted by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    members: Vec<Contact>,
}

fn bit(id: &Id, i: usize) -> bool {
    id.0[i / 8] & (0x80 >> (i % 8)) != 0
}

impl Ring {
    /// A ring of `members` (any order; duplicates of an id are kept once).
    pub fn new(mut members: Vec<Contact>) -> Ring {
        members.sort_by_key(|c| c.id);
        members.dedup_by_key(|c| c.id);
        Ring { members }
    }

    /// The members, sorted by id.
    pub fn members(&self) -> &[Contact] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: &Id) -> bool {
        self.members.binary_search_by_key(id, |c| c.id).is_ok()
    }

    /// The `k` members closest (XOR) to `target`, closest first.
    pub fn closest(&self, target: &Id, k: usize) -> Vec<Contact> {
        let mut out = Vec::with_capacity(k.min(self.members.len()));
        collect(&self.members, target, 0, k, &mut out);
        out
    }
}

/// Appends the `k` closest of `run` (sorted, sharing their first `bit` bits) to `out`, closest
/// first.
fn collect(run: &[Contact], target: &Id, bit_index: usize, k: usize, out: &mut Vec<Contact>) {
    if k == 0 || run.is_empty() {
        return;
    }
    if run.len() <= k || bit_index >= ID_BITS {
        let mut all = run.to_vec();
        all.sort_by_key(|c| c.id.distance(target));
        out.extend(all.into_iter().take(k));
        return;
    }
    let split = run.partition_point(|c| !bit(&c.id, bit_index));
    let (zeros, ones) = run.split_at(split);
    let (near, far) = if bit(target, bit_index) { (ones, zeros) } else { (zeros, ones) };
    if near.len() >= k {
        collect(near, target, bit_index + 1, k, out);
    } else {
        collect(near, target, bit_index + 1, near.len(), out);
        collect(far, target, bit_index + 1, k - near.len(), out);
    }
}

impl Members for Ring {
    fn closest_to(&self, id: &Id, k: usize) -> Vec<Contact> {
        self.closest(id, k)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use proptest::prelude::*;

    use super::*;

    fn contact(b: [u8; 20]) -> Contact {
        Contact { id: Id(b), addr: SocketAddr::from(([127, 0, 0, 1], 7000)) }
    }

    proptest! {
        /// The ring names the same closest members, in the same order, as a full scan.
        #[test]
        fn the_ring_agrees_with_a_full_scan(
            ids in proptest::collection::vec(any::<[u8; 20]>(), 0..80),
            prefix in 0usize..20,
            target in any::<[u8; 20]>(),
            k in 0usize..12,
        ) {
            // Ids sharing long prefixes exercise the deep splits.
            let ids: Vec<[u8; 20]> = ids.into_iter().map(|mut b| { b[..prefix].copy_from_slice(&target[..prefix]); b }).collect();
            let members: Vec<Contact> = ids.iter().map(|b| contact(*b)).collect();
            let ring = Ring::new(members.clone());
            let mut unique = members.clone();
            unique.sort_by_key(|c| c.id);
            unique.dedup_by_key(|c| c.id);
            let want = crate::placement::owners(&unique, &Id(target), k);
            prop_assert_eq!(ring.closest(&Id(target), k), want);
        }
    }
}

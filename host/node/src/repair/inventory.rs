//! One pass over the store: every block and registration this node holds, with where it is
//! placed in the view it was built for, ready to answer what a pull session compares.
//!
//! Building one reads the store's block listing (from memory, in bounded pages) and the
//! registrations, computes each block's placement id once (the series hash is cached per
//! series) and its owners with a [`Ring`] (O(rf log n)), and groups items by leaf. Owner sets
//! are shared between items (a view of n members has few distinct ones). The trees of a
//! session and the entries of a leaf are then filters over the items: no store access, no
//! hashing.
//!
//! Where blocks are placed: a data block at its class's block id with its class's RF; a
//! registration at the series' metadata id with its class's RF; a quantum index block at the
//! metadata id of the series it indexes with **that series'** RF, as the coordinator writes
//! and reads it. The index key carries only the series' hash, so the RF comes from the
//! registration held at the same id; an index block whose registration this node lacks (it
//! arrives by the same repair) is left out until it is there ([`Inventory::unplaced`]).

use std::collections::HashMap;
use std::time::Instant;

use timeshard_proto::key::{self, KeyFormat};
use timeshard_proto::placement::coi::Located;
use timeshard_proto::placement::{self, Target};
use timeshard_proto::repair::tree::{entry_hash, leaf_of};
use timeshard_proto::repair::{BlockRef, RepairEntry, Ring, Tree, registration_digest};
use timeshard_proto::{Classes, Contact, Id, SeriesClass, SeriesKey, Timestamp};
use timeshard_store::{Store, StoreError};

/// Blocks or registrations listed per store call.
const LIST_PAGE: usize = 4_096;

/// One block or registration held here.
#[derive(Clone, Debug)]
pub struct Item {
    pub block: BlockRef,
    pub leaf: u16,
    /// Its [`entry_hash`]: what it adds to its leaf.
    pub hash: u64,
    pub digest: u64,
    pub count: u64,
    /// When it was last written (the store's clock); 0 for registrations.
    pub last_write: Timestamp,
    /// Index of its owners in [`Inventory::owner_sets`].
    pub owners: u32,
}

/// The owners of some blocks, closest first, and whether this node is one of them.
#[derive(Clone, Debug)]
pub struct OwnerSet {
    pub owners: Vec<Contact>,
    pub me: bool,
}

impl OwnerSet {
    pub fn contains(&self, id: &Id) -> bool {
        self.owners.iter().any(|c| c.id == *id)
    }
}

/// A digest of the members that own blocks and of their locations: two nodes with equal
/// digests place every block on the same owners.
pub fn view_digest(eligible: &[Contact], located: &[Located]) -> u64 {
    let mut ids: Vec<&Id> = eligible.iter().map(|c| &c.id).collect();
    ids.sort();
    let mut bytes: Vec<u8> = ids.into_iter().flat_map(|id| id.0).collect();
    let mut places: Vec<(Id, u64, u64)> =
        located.iter().map(|l| (l.contact.id, l.at.lat.to_bits(), l.at.lon.to_bits())).collect();
    places.sort_by_key(|p| p.0);
    for (id, lat, lon) in places {
        bytes.extend(id.0);
        bytes.extend(lat.to_be_bytes());
        bytes.extend(lon.to_be_bytes());
    }
    timeshard_proto::repair::tree::hash_bytes(&bytes)
}

/// What this node held at one moment, placed by one view.
#[derive(Debug)]
pub struct Inventory {
    pub me: Id,
    pub built_at: Instant,
    /// The same moment on the wall clock (ns since the epoch), the clock of comparison cutoffs.
    pub built_at_ns: Timestamp,
    /// The view generation it was placed by, and that view's [`view_digest`].
    pub generation: u64,
    pub view_digest: u64,
    /// Sorted by leaf.
    pub items: Vec<Item>,
    pub owner_sets: Vec<OwnerSet>,
    /// Quantum index blocks left out because this node lacks their series' registration.
    pub unplaced: u64,
    ring: Ring,
    located: Vec<Located>,
    /// Where the registration of each series held is placed, by series hash: where its index
    /// blocks go too.
    index_target: HashMap<[u8; 10], Target>,
}

/// Where one series' blocks go.
struct SeriesPlace {
    series: SeriesKey,
    format: KeyFormat,
    hash: [u8; 10],
    /// For an index series: the series hash of the series it indexes.
    indexes: Option<[u8; 10]>,
    class: SeriesClass,
}

impl Inventory {
    /// Lists what `store` holds and places it among `eligible` (the view of `generation`).
    /// Blocking: run it off the async threads.
    pub fn build(
        store: &dyn Store,
        classes: &Classes,
        eligible: Vec<Contact>,
        located: Vec<Located>,
        me: Id,
        generation: u64,
    ) -> Result<Inventory, StoreError> {
        let view_digest = view_digest(&eligible, &located);
        let mut inv = Inventory {
            me,
            built_at: timeshard_clock::instant(),
            built_at_ns: timeshard_clock::now_ns(),
            generation,
            view_digest,
            items: Vec::new(),
            owner_sets: Vec::new(),
            unplaced: 0,
            ring: Ring::new(eligible),
            located,
            index_target: HashMap::new(),
        };
        let mut sets: HashMap<Vec<Id>, u32> = HashMap::new();

        let mut registrations = Vec::new();
        let mut after = None;
        loop {
            let page = store.list_registered(after, LIST_PAGE)?;
            registrations.extend(page.series);
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        for series in registrations {
            let hash = key::series_hash(&series);
            let id = key::series_meta_id_from_hash(&hash);
            // A series of a CoI class without a usable location was never written.
            let Ok(target) = placement::target(&series, id, classes.of(&series)) else {
                inv.unplaced += 1;
                continue;
            };
            let owners = inv.owner_set(&target, &mut sets);
            inv.index_target.insert(hash, target);
            let block = BlockRef::Registration { series: series.clone() };
            let digest = registration_digest(&series);
            let item_hash = entry_hash(&id, block.key_hash(), digest, 0);
            inv.items.push(Item {
                block,
                leaf: leaf_of(&id),
                hash: item_hash,
                digest,
                count: 0,
                last_write: 0,
                owners,
            });
        }

        let mut place: Option<SeriesPlace> = None;
        let mut after = None;
        loop {
            let page = store.list_blocks(after, LIST_PAGE)?;
            for b in page.blocks {
                if place.as_ref().is_none_or(|p| p.series != b.series) {
                    let class = classes.of(&b.series);
                    place = Some(SeriesPlace {
                        hash: key::series_hash(&b.series),
                        indexes: key::indexed_series_hash(&b.series),
                        format: class.format,
                        class: class.clone(),
                        series: b.series.clone(),
                    });
                }
                let p = place.as_ref().expect("set above");
                let target = match p.indexes {
                    Some(base) => inv.index_target.get(&base).cloned(),
                    None => {
                        let id = key::block_id_from_hashes(p.format, &p.hash, &b.quantum);
                        placement::target(&p.series, id, &p.class).ok()
                    }
                };
                let Some(target) = target else {
                    inv.unplaced += 1;
                    continue;
                };
                let id = target.id;
                let owners = inv.owner_set(&target, &mut sets);
                let block = BlockRef::Points { series: b.series, quantum: b.quantum };
                let hash = entry_hash(&id, block.key_hash(), b.digest, b.count);
                inv.items.push(Item {
                    block,
                    leaf: leaf_of(&id),
                    hash,
                    digest: b.digest,
                    count: b.count,
                    last_write: b.last_write,
                    owners,
                });
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        inv.items.sort_by_key(|i| i.leaf);
        Ok(inv)
    }

    fn owner_set(&mut self, target: &Target, sets: &mut HashMap<Vec<Id>, u32>) -> u32 {
        let owners = placement::owners_of(target, &self.ring, &self.located).owners;
        let ids: Vec<Id> = owners.iter().map(|c| c.id).collect();
        if let Some(&i) = sets.get(&ids) {
            return i;
        }
        let i = self.owner_sets.len() as u32;
        let me = ids.contains(&self.me);
        self.owner_sets.push(OwnerSet { owners, me });
        sets.insert(ids, i);
        i
    }

    /// The members that own blocks in this inventory's view.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The owners of an item.
    pub fn owners_of(&self, item: &Item) -> &OwnerSet {
        &self.owner_sets[item.owners as usize]
    }

    /// The owners of `block` in this inventory's view, if this node can place it (an index
    /// block needs its series' registration here).
    pub fn place(&self, block: &BlockRef, classes: &Classes) -> Option<Vec<Contact>> {
        self.place_target(block, classes).map(|target| placement::owners_of(&target, &self.ring, &self.located).owners)
    }

    /// The members `block` may be asked of in this inventory's view: its owners, then (for a
    /// DHT block) the next closest members up to the read candidates, or (for a CoI block)
    /// the other located members in placement order; views that differ for a while still
    /// agree on these.
    pub fn place_near(&self, block: &BlockRef, classes: &Classes) -> Option<Vec<Contact>> {
        let target = self.place_target(block, classes)?;
        let owners = placement::owners_of(&target, &self.ring, &self.located);
        Some(match target.site {
            Some(_) => owners.owners.into_iter().chain(owners.fallback).collect(),
            None => timeshard_proto::repair::read_candidates(&owners.owners, &self.ring, &target.id, target.rf),
        })
    }

    fn place_target(&self, block: &BlockRef, classes: &Classes) -> Option<Target> {
        let series = block.series();
        let target = match block {
            BlockRef::Registration { .. } => {
                placement::target(series, key::series_meta_id(series), classes.of(series)).ok()?
            }
            BlockRef::Points { quantum, .. } => match key::indexed_series_hash(series) {
                Some(base) => self.index_target.get(&base)?.clone(),
                None => {
                    let class = classes.of(series);
                    placement::target(series, key::block_id(class.format, series, quantum), class).ok()?
                }
            },
        };
        Some(target)
    }

    /// Whether a session with `peer` compares `item`: with this node as the initiator, the
    /// blocks both own; as the responder, the blocks `peer` owns (this node may hold blocks it
    /// no longer owns), registrations only where both own them (a registration is never
    /// dropped, so a displaced one would differ forever). Blocks written after `cutoff` are
    /// left out.
    fn compared(&self, item: &Item, peer: &Id, responder: bool, cutoff: Timestamp) -> bool {
        if item.last_write > cutoff {
            return false;
        }
        let set = self.owners_of(item);
        set.contains(peer)
            && match item.block {
                BlockRef::Registration { .. } => set.me,
                BlockRef::Points { .. } => responder || set.me,
            }
    }

    /// The tree a session with `peer` compares.
    pub fn tree(&self, peer: &Id, responder: bool, cutoff: Timestamp) -> Tree {
        let mut tree = Tree::new();
        for item in self.items.iter().filter(|i| self.compared(i, peer, responder, cutoff)) {
            tree.add(item.leaf, item.hash);
        }
        tree
    }

    fn leaf(&self, leaf: u16) -> &[Item] {
        let start = self.items.partition_point(|i| i.leaf < leaf);
        let end = self.items.partition_point(|i| i.leaf <= leaf);
        &self.items[start..end]
    }

    /// The entries of `leaves` a session with `peer` compares, whole leaves in order, at most
    /// `limit` entries of about `max_bytes` on the wire (but at least the first leaf); returns
    /// them and how many leaves are complete.
    pub fn entries(
        &self,
        peer: &Id,
        responder: bool,
        cutoff: Timestamp,
        leaves: &[u16],
        (limit, max_bytes): (usize, usize),
    ) -> (Vec<RepairEntry>, u32) {
        // An entry is its series key plus a few varints; 48 bytes covers the rest.
        let size = |i: &Item| i.block.series().as_str().len() + 48;
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut done = 0;
        for &leaf in leaves {
            let items: Vec<&Item> =
                self.leaf(leaf).iter().filter(|i| self.compared(i, peer, responder, cutoff)).collect();
            let leaf_bytes: usize = items.iter().map(|i| size(i)).sum();
            if done > 0 && (out.len() + items.len() > limit || bytes + leaf_bytes > max_bytes) {
                break;
            }
            bytes += leaf_bytes;
            out.extend(items.into_iter().map(|i| RepairEntry {
                block: i.block.clone(),
                digest: i.digest,
                count: i.count,
            }));
            done += 1;
        }
        (out, done)
    }

    /// Every item of `leaves`, by block.
    pub fn held(&self, leaves: &[u16]) -> HashMap<BlockRef, &Item> {
        leaves.iter().flat_map(|&l| self.leaf(l)).map(|i| (i.block.clone(), i)).collect()
    }

    /// Items held here that this node does not own.
    pub fn displaced(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|i| !self.owners_of(i).me)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use timeshard_proto::wire::BlockPoints;
    use timeshard_proto::{Point, QuantumLen};
    use timeshard_store::MemStore;

    use super::*;

    fn contact(i: u8) -> Contact {
        Contact { id: Id::sha1(&[i]), addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(i))) }
    }

    fn fill(store: &MemStore, series: &[&str], quanta: i64) {
        let len = QuantumLen::DEFAULT;
        for s in series {
            let key: SeriesKey = s.parse().unwrap();
            store.register_series(std::slice::from_ref(&key)).unwrap();
            let blocks: Vec<BlockPoints> = (0..quanta)
                .map(|q| BlockPoints {
                    series: key.clone(),
                    quantum: len.quantum_of(q * len.ns()),
                    points: vec![Point::new(q * len.ns() + 1, q as f64)],
                })
                .collect();
            store.write(&blocks).unwrap();
            let index = timeshard_proto::quantum_index::blocks(&[(key.clone(), 0)]);
            store.write(&index.into_iter().map(|(_, b)| b).collect::<Vec<_>>()).unwrap();
        }
    }

    #[test]
    fn replicas_with_the_same_blocks_build_the_same_trees() {
        let members: Vec<Contact> = (0..5).map(contact).collect();
        let classes = Classes::default();
        let (a, b) = (MemStore::new(1 << 20), MemStore::new(1 << 20));
        fill(&a, &["m{k=1}", "m{k=2}"], 30);
        fill(&b, &["m{k=2}", "m{k=1}"], 30);
        let (me, peer) = (contact(0).id, contact(1).id);
        let ia = Inventory::build(&a, &classes, members.clone(), Vec::new(), me, 1).unwrap();
        let ib = Inventory::build(&b, &classes, members.clone(), Vec::new(), peer, 1).unwrap();
        assert_eq!(ia.unplaced, 0);
        assert_eq!(ia.items.len(), 2 * 30 + 2 + 2, "blocks, index blocks and registrations");
        // b answers a with every block a owns, those b does not own included.
        let initiator = ia.tree(&peer, false, i64::MAX);
        let responder = ib.tree(&me, true, i64::MAX);
        let both_own = |inv: &Inventory| {
            inv.items.iter().filter(|i| inv.owners_of(i).contains(&me) && inv.owners_of(i).contains(&peer)).count()
        };
        assert!(both_own(&ia) > 0);
        // b holds every block, including those only a (not b) owns: those are in its tree too.
        let only_a_owns = ib.items.iter().filter(|i| ib.owners_of(i).contains(&me) && !ib.owners_of(i).contains(&peer));
        if only_a_owns.clone().any(|i| matches!(i.block, BlockRef::Points { .. })) {
            assert_ne!(initiator, responder);
        }
        // Between two owners of everything (rf 3 of 3 members), trees agree.
        let three: Vec<Contact> = members[..3].to_vec();
        let ia = Inventory::build(&a, &classes, three.clone(), Vec::new(), me, 1).unwrap();
        let ib = Inventory::build(&b, &classes, three, Vec::new(), peer, 1).unwrap();
        assert_eq!(ia.tree(&peer, false, i64::MAX), ib.tree(&me, true, i64::MAX));
        assert_eq!(ia.displaced().count(), 0);
        // A leaf's entries list what it holds.
        let leaf = ia.items[0].leaf;
        let (entries, done) = ib.entries(&me, true, i64::MAX, &[leaf], (10, 1 << 20));
        assert_eq!(done, 1);
        assert_eq!(entries.len(), ia.leaf(leaf).len());
        // A listing of several leaves stops at a leaf boundary within its entry and byte
        // budgets, and always holds the first leaf.
        let mut leaves: Vec<u16> = ia.items.iter().map(|i| i.leaf).collect();
        leaves.dedup();
        let (all, done) = ib.entries(&me, true, i64::MAX, &leaves, (1 << 20, 1 << 20));
        assert_eq!((all.len(), done as usize), (ib.items.len(), leaves.len()));
        for budget in [(1, 1 << 20), (1 << 20, 1)] {
            let (first, done) = ib.entries(&me, true, i64::MAX, &leaves, budget);
            assert_eq!((first.len(), done), (ib.leaf(leaves[0]).len(), 1));
        }
    }

    #[test]
    fn index_blocks_follow_their_series_registration() {
        let classes = Classes::default();
        let store = MemStore::new(1 << 20);
        fill(&store, &["m{k=1}"], 1);
        let index = key::quantum_index_series(&"m{k=1}".parse().unwrap());
        let members: Vec<Contact> = (0..8).map(contact).collect();
        let inv = Inventory::build(&store, &classes, members, Vec::new(), contact(0).id, 1).unwrap();
        let item = inv.items.iter().find(|i| *i.block.series() == index).unwrap();
        let reg = inv.items.iter().find(|i| matches!(i.block, BlockRef::Registration { .. })).unwrap();
        assert_eq!(item.leaf, reg.leaf, "the index lives with the registration");
        assert_eq!(inv.owners_of(item).owners, inv.owners_of(reg).owners);
        // Without the registration, the index block cannot be placed.
        let bare = MemStore::new(1 << 20);
        let block = timeshard_proto::quantum_index::blocks(&[("m{k=1}".parse().unwrap(), 0)]);
        bare.write(&[block[0].1.clone()]).unwrap();
        let inv = Inventory::build(&bare, &classes, vec![contact(0)], Vec::new(), contact(0).id, 1).unwrap();
        assert_eq!((inv.items.len(), inv.unplaced), (0, 1));
    }
}

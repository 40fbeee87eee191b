//! Placement and quorum bookkeeping for the coordinator of a write.
//!
//! Where a block lives: its placement id ([`placement_id`]) and, from the membership view, its
//! owners ([`owners`]: the RF closest members). A client batch is split into blocks, one per
//! (series, quantum) ([`split_batch`]). A [`WritePlan`] tracks acknowledgements until every
//! block has W of them or some block can no longer get them; what one replica gets is packed
//! into requests within the batch and message limits ([`pack`], [`split_block`]).

pub mod coi;

use std::collections::{BTreeMap, HashMap};

use crate::class::{Classes, CoiError, Replication, SeriesClass};
use crate::id::Id;
use crate::key::{self, block_id};
use crate::point::{BlockPoints, Point, SeriesPoints, sort_dedup};
use crate::routing::Contact;
use crate::series::SeriesKey;
use crate::time::Quantum;

/// The id whose owners hold the points of `series` in `quantum`: the block id of its class's
/// key format for data, and the series' metadata id ([`key::series_meta_id`]) for the blocks of
/// a quantum index series, which live with the registration of the series they index. Every
/// node computes it from the key alone.
pub fn placement_id(series: &SeriesKey, quantum: &Quantum, classes: &Classes) -> Id {
    match key::indexed_series_hash(series) {
        Some(base) => key::series_meta_id_from_hash(&base),
        None => block_id(classes.of(series).format, series, quantum),
    }
}

/// Where a block goes: its placement id and how its owners are chosen, by XOR distance to the
/// id (the DHT) or by its series' location (a class with `coi`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub id: Id,
    /// Owners: RF, or n_in + n_out.
    pub rf: usize,
    /// The series' site for a CoI class.
    pub site: Option<coi::Site>,
}

impl Target {
    /// A block placed by the DHT: the `rf` members closest to `id`.
    pub fn dht(id: Id, rf: usize) -> Target {
        Target { id, rf, site: None }
    }

    /// Replicas whose acknowledgements count towards a write's quorum, at the front of the
    /// owners: every owner, or the in-CoI ones.
    pub fn synchronous(&self) -> usize {
        self.site.as_ref().map_or(self.rf, |s| usize::from(s.coi.n_in))
    }
}

/// Where the blocks of `series` placed at `id` go in `class`: for an index block or a
/// registration, `series` is the series it indexes or registers (whose location places it).
/// Fails for a CoI class when the series has no location or a bad one.
pub fn target(series: &SeriesKey, id: Id, class: &SeriesClass) -> Result<Target, CoiError> {
    let rf = usize::from(class.replication.rf);
    match &class.coi {
        None => Ok(Target::dht(id, rf)),
        Some(c) => Ok(Target { id, rf, site: Some(coi::Site::new(c.location_of(series)?, c.clone())) }),
    }
}

/// The owners of a block, and the members to turn to next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owners {
    /// Owners, the synchronous ones (every one, or the in-CoI ones) first.
    pub owners: Vec<Contact>,
    /// How many of `owners` are synchronous (in-CoI for a CoI block).
    pub synchronous: usize,
    /// For a CoI block: the other located members, closest first (further read candidates
    /// from outside the context of interest; repair's peers). Empty for a DHT block (reads go on along the ring).
    pub fallback: Vec<Contact>,
    /// For a CoI block: some out-of-CoI replica is closer than `out_coi_dist`.
    pub out_short: bool,
}

/// The owners of `target`: the one placement function that writes, reads, repair and handoff
/// use. `eligible` are the members placement may choose; `located` those of them with a
/// location (CoI blocks go only to located members).
pub fn owners_of<M: Members + ?Sized>(target: &Target, eligible: &M, located: &[coi::Located]) -> Owners {
    match &target.site {
        None => {
            let owners = eligible.closest_to(&target.id, target.rf);
            Owners { synchronous: owners.len(), owners, fallback: Vec::new(), out_short: false }
        }
        Some(site) => {
            let p = coi::place(&target.id, site, located);
            let mut owners = p.owners();
            fill_from_dht(&mut owners, target, site, eligible);
            Owners { synchronous: p.in_coi.len(), owners, fallback: p.fallback, out_short: p.out_short }
        }
    }
}

/// Tops up the owners of a CoI block with the members closest to it by XOR when fewer located
/// members than n_in + n_out exist (locations cleared, or not yet set, on most of the fleet).
/// The extra owners are asynchronous, like out-of-CoI ones; they keep the block at n_in + n_out
/// copies, where handoff would otherwise move every displaced copy onto the few located members
/// and the departure of one of them lose the block (seed 17181).
fn fill_from_dht<M: Members + ?Sized>(owners: &mut Vec<Contact>, target: &Target, site: &coi::Site, eligible: &M) {
    let want = usize::from(site.coi.n_in) + usize::from(site.coi.n_out);
    if owners.len() >= want {
        return;
    }
    let closest = eligible.closest_to(&target.id, want + owners.len());
    let missing = want - owners.len();
    let extra: Vec<Contact> =
        closest.into_iter().filter(|c| !owners.iter().any(|o| o.id == c.id)).take(missing).collect();
    owners.extend(extra);
}

/// Whom a write of a CoI block waits for: its in-CoI owners, and only they (FogStore: every
/// read and write quorum from inside the context of interest is a majority of the in-CoI
/// replicas; out-of-CoI replicas are written asynchronously and never counted). No other
/// member stands in for an in-CoI owner that is down: an acknowledgement held only by a stand-in
/// would be missed by an in-CoI quorum read once the owner is back (until a hint arrives).
/// Returns the in-CoI owners (those `is_up` rejects included: they fail or get a hint, and
/// count as failures), or [`InCoiShort`] when fewer than `w` of them are up: the write must
/// then be refused, retryably, before anything is sent.
pub fn in_coi_write_quorum(placed: &Owners, w: usize, is_up: impl Fn(&Id) -> bool) -> Result<Vec<Contact>, InCoiShort> {
    let in_coi = &placed.owners[..placed.synchronous.min(placed.owners.len())];
    let (up, down): (Vec<Contact>, Vec<Contact>) = in_coi.iter().partition(|c| is_up(&c.id));
    if up.len() < w {
        return Err(InCoiShort { up: up.len(), n_in: in_coi.len(), w, down });
    }
    Ok(in_coi.to_vec())
}

/// Too few in-CoI owners of a block are up for a write's quorum ([`in_coi_write_quorum`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InCoiShort {
    /// In-CoI owners up.
    pub up: usize,
    /// In-CoI owners.
    pub n_in: usize,
    /// Acknowledgements the write needs.
    pub w: usize,
    /// The in-CoI owners down.
    pub down: Vec<Contact>,
}

/// Members that can name the `k` closest to an id (XOR): a plain list, or a sorted ring
/// (`repair::Ring`) when placing many blocks.
pub trait Members {
    /// The `k` closest to `id`, closest first.
    fn closest_to(&self, id: &Id, k: usize) -> Vec<Contact>;
}

impl Members for [Contact] {
    fn closest_to(&self, id: &Id, k: usize) -> Vec<Contact> {
        owners(self, id, k)
    }
}

/// The owners of `id` among `members`: the `rf` closest by XOR, closest first. Every node that
/// holds the same members names the same owners.
pub fn owners(members: &[Contact], id: &Id, rf: usize) -> Vec<Contact> {
    let mut out: Vec<Contact> = members.to_vec();
    let rf = rf.min(out.len());
    if rf == 0 {
        return Vec::new();
    }
    if rf < out.len() {
        out.select_nth_unstable_by_key(rf - 1, |c| c.id.distance(id));
        out.truncate(rf);
    }
    out.sort_by_key(|c| c.id.distance(id));
    out
}

/// An upper bound of the encoded size of one point (two varints of up to 10 bytes and a f64).
pub const MAX_POINT_BYTES: usize = 28;
/// Room left in every request for its framing and the fields around the blocks.
const REQUEST_OVERHEAD_BYTES: usize = 64;

/// An upper bound of the encoded size of `block` inside a store request.
pub fn block_bytes(block: &BlockPoints) -> usize {
    // Key, its length, quantum (two varints), point count.
    block.series.as_str().len() + 40 + block.points.len() * MAX_POINT_BYTES
}

/// Splits `block` into pieces of the same series and quantum that each fit a store request of
/// at most `max_points` points and `max_bytes` bytes. Stored data is a set, so storing the
/// pieces stores the block.
pub fn split_block(block: BlockPoints, max_points: usize, max_bytes: usize) -> Vec<BlockPoints> {
    let room = max_bytes.saturating_sub(REQUEST_OVERHEAD_BYTES + block.series.as_str().len() + 40);
    let per_piece = max_points.min(room / MAX_POINT_BYTES).max(1);
    if block.points.len() <= per_piece {
        return vec![block];
    }
    let BlockPoints { series, quantum, points } = block;
    points.chunks(per_piece).map(|c| BlockPoints { series: series.clone(), quantum, points: c.to_vec() }).collect()
}

/// Packs items given as (points, bytes), in order, into requests of at most `max_points`
/// points and `max_bytes` bytes each; returns the indices of each request's items. An item
/// over a limit on its own (split it first with [`split_block`]) gets a request to itself.
pub fn pack(items: &[(usize, usize)], max_points: usize, max_bytes: usize) -> Vec<Vec<usize>> {
    let budget = max_bytes.saturating_sub(REQUEST_OVERHEAD_BYTES);
    let mut requests: Vec<Vec<usize>> = Vec::new();
    let (mut points, mut bytes) = (0usize, 0usize);
    for (i, &(p, b)) in items.iter().enumerate() {
        let fits = points + p <= max_points && bytes + b <= budget;
        match requests.last_mut() {
            Some(last) if fits => last.push(i),
            _ => {
                requests.push(vec![i]);
                (points, bytes) = (0, 0);
            }
        }
        points += p;
        bytes += b;
    }
    requests
}

/// One block of a client batch, with where it goes.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedBlock {
    /// The DHT id of the block.
    pub id: Id,
    /// Replication of the block's series class.
    pub replication: Replication,
    /// The points, sorted and deduplicated.
    pub block: BlockPoints,
}

/// Splits a client batch into blocks, one per (series, quantum), with ids from the class table.
/// Points must already be validated.
pub fn split_batch(batch: Vec<SeriesPoints>, classes: &Classes) -> Vec<PlacedBlock> {
    let mut blocks: BTreeMap<(SeriesKey, Quantum), Vec<Point>> = BTreeMap::new();
    let mut meta: HashMap<SeriesKey, (crate::key::KeyFormat, Replication)> = HashMap::new();
    for SeriesPoints { series, points } in batch {
        let class = classes.of(&series);
        meta.entry(series.clone()).or_insert((class.format, class.replication));
        for p in points {
            let q = class.quantum.quantum_of(p.ts);
            match blocks.get_mut(&(series.clone(), q)) {
                Some(v) => v.push(p),
                None => {
                    blocks.insert((series.clone(), q), vec![p]);
                }
            }
        }
    }
    blocks
        .into_iter()
        .map(|((series, quantum), mut points)| {
            sort_dedup(&mut points);
            let (format, replication) = meta[&series];
            PlacedBlock {
                id: block_id(format, &series, &quantum),
                replication,
                block: BlockPoints { series, quantum, points },
            }
        })
        .collect()
}

/// The state of a write after an acknowledgement or a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteProgress {
    /// Still waiting.
    Pending,
    /// Every block has its W acknowledgements.
    Acknowledged,
    /// Some block cannot reach W any more.
    Failed,
}

/// Tracks one write across its replicas. A target `T` is whatever one request goes to (a node,
/// or a node and a kind of request); each item (a block, a series registration) needs W of its
/// targets to acknowledge.
#[derive(Clone, Debug)]
pub struct WritePlan<T> {
    items: Vec<ItemQuorum>,
    /// Per target: the items it replicates.
    per_target: HashMap<T, Vec<usize>>,
    pending: usize,
    failed: bool,
}

#[derive(Clone, Debug)]
struct ItemQuorum {
    need: usize,
    acks: usize,
    /// Failures it can still absorb.
    spare: usize,
}

impl<T: std::hash::Hash + Eq> WritePlan<T> {
    /// A plan for items that each need `need` acknowledgements from their `targets`. An item
    /// with fewer targets than it needs fails at once.
    pub fn new(items: impl IntoIterator<Item = (usize, Vec<T>)>) -> WritePlan<T> {
        let mut per_target: HashMap<T, Vec<usize>> = HashMap::new();
        let mut quorums = Vec::new();
        let mut failed = false;
        for (i, (need, targets)) in items.into_iter().enumerate() {
            failed |= targets.len() < need;
            quorums.push(ItemQuorum { need, acks: 0, spare: targets.len().saturating_sub(need) });
            for t in targets {
                per_target.entry(t).or_default().push(i);
            }
        }
        let pending = quorums.iter().filter(|q| q.need > 0).count();
        WritePlan { pending, items: quorums, per_target, failed }
    }

    /// The targets to send to, each with the indices of its items.
    pub fn requests(&self) -> impl Iterator<Item = (&T, &Vec<usize>)> {
        self.per_target.iter()
    }

    /// Records that `target` stored all its items.
    pub fn on_ack(&mut self, target: &T) -> WriteProgress {
        if let Some(idx) = self.per_target.get(target) {
            for &i in idx {
                let q = &mut self.items[i];
                q.acks += 1;
                if q.acks == q.need {
                    self.pending -= 1;
                }
            }
        }
        self.progress()
    }

    /// Records that `target` failed to store its items.
    pub fn on_failure(&mut self, target: &T) -> WriteProgress {
        if let Some(idx) = self.per_target.get(target) {
            for &i in idx {
                let q = &mut self.items[i];
                if q.acks < q.need {
                    if q.spare == 0 {
                        self.failed = true;
                    } else {
                        q.spare -= 1;
                    }
                }
            }
        }
        self.progress()
    }

    /// The current state.
    pub fn progress(&self) -> WriteProgress {
        if self.failed {
            WriteProgress::Failed
        } else if self.pending == 0 {
            WriteProgress::Acknowledged
        } else {
            WriteProgress::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NANOS_PER_SEC;

    fn batch() -> Vec<SeriesPoints> {
        let s: SeriesKey = "pmu.a".parse().unwrap();
        let t: SeriesKey = "pmu.b".parse().unwrap();
        vec![
            SeriesPoints {
                series: s.clone(),
                points: vec![
                    Point::new(NANOS_PER_SEC, 1.0),
                    Point::new(12 * NANOS_PER_SEC, 2.0),
                    Point::new(NANOS_PER_SEC, 1.0),
                ],
            },
            SeriesPoints { series: t, points: vec![Point::new(3 * NANOS_PER_SEC, 3.0)] },
            SeriesPoints { series: s, points: vec![Point::new(2 * NANOS_PER_SEC, 4.0)] },
        ]
    }

    #[test]
    fn batches_split_by_series_and_quantum() {
        let blocks = split_batch(batch(), &Classes::default());
        assert_eq!(blocks.len(), 3);
        let total: usize = blocks.iter().map(|b| b.block.points.len()).sum();
        assert_eq!(total, 4, "the duplicate point is dropped");
        for b in &blocks {
            assert!(b.block.points.iter().all(|p| b.block.quantum.contains(p.ts)));
            assert!(b.block.points.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn index_blocks_live_with_their_series_registration() {
        let classes = Classes::default();
        let s: SeriesKey = "pmu.a".parse().unwrap();
        let q = crate::time::QuantumLen::DEFAULT.quantum_of(NANOS_PER_SEC);
        assert_eq!(placement_id(&s, &q, &classes), block_id(crate::key::KeyFormat::Qfi, &s, &q));
        let index = key::quantum_index_series(&s);
        let iq = key::index_quantum().quantum_of(0);
        assert_eq!(placement_id(&index, &iq, &classes), key::series_meta_id(&s));
    }

    #[test]
    fn requests_stay_within_both_limits() {
        let s: SeriesKey = "pmu.a".parse().unwrap();
        let q = crate::time::QuantumLen::DEFAULT.quantum_of(0);
        let big =
            BlockPoints { series: s.clone(), quantum: q, points: (0..1000).map(|i| Point::new(i, 0.0)).collect() };
        let pieces = split_block(big.clone(), 300, usize::MAX);
        assert_eq!(pieces.iter().map(|p| p.points.len()).collect::<Vec<_>>(), vec![300, 300, 300, 100]);
        let pieces = split_block(big.clone(), usize::MAX, 64 * 1024);
        assert!(
            pieces.iter().all(|p| crate::wire::encode(
                &crate::wire::Request::Store { blocks: vec![p.clone()] },
                64 * 1024
            )
            .is_ok())
        );
        assert_eq!(pieces.iter().map(|p| p.points.len()).sum::<usize>(), 1000);
        assert_eq!(split_block(big, 1000, usize::MAX).len(), 1);
        // A full client batch plus its index entries: two requests, not one over the limit.
        let requests = pack(&[(99_000, 1_000), (1_000, 1_000), (3, 100)], 100_000, usize::MAX);
        assert_eq!(requests, vec![vec![0, 1], vec![2]]);
        let requests = pack(&[(1, 600), (1, 600), (1, 600)], 100, 1_200);
        assert_eq!(requests, vec![vec![0], vec![1], vec![2]]);
        assert!(pack(&[], 1, 1).is_empty());
    }

    #[test]
    fn quorum_waits_for_w_of_every_block() {
        let blocks = split_batch(batch(), &Classes::default()); // rf 3, w 2
        let a = Id::sha1(b"a");
        let b = Id::sha1(b"b");
        let c = Id::sha1(b"c");
        let d = Id::sha1(b"d");
        let replicas = vec![vec![a, b, c], vec![a, b, d], vec![b, c, d]];
        let mut plan = WritePlan::new(blocks.iter().map(|b| usize::from(b.replication.w)).zip(replicas));
        assert_eq!(plan.requests().count(), 4);
        assert_eq!(plan.on_ack(&a), WriteProgress::Pending);
        assert_eq!(plan.on_ack(&b), WriteProgress::Pending); // block 2 has only b
        assert_eq!(plan.on_failure(&c), WriteProgress::Pending); // block 2 can still use d
        assert_eq!(plan.on_ack(&d), WriteProgress::Acknowledged);
    }

    proptest::proptest! {
        /// Packing keeps every item once, in order, and every request within the limits unless
        /// it holds a single item.
        #[test]
        fn packing_respects_the_limits(
            items in proptest::collection::vec((0usize..500, 0usize..5_000), 0..60),
            max_points in 1usize..2_000,
            max_bytes in 100usize..20_000,
        ) {
            let requests = pack(&items, max_points, max_bytes);
            let flat: Vec<usize> = requests.iter().flatten().copied().collect();
            proptest::prop_assert_eq!(flat, (0..items.len()).collect::<Vec<_>>());
            for r in &requests {
                let points: usize = r.iter().map(|&i| items[i].0).sum();
                let bytes: usize = r.iter().map(|&i| items[i].1).sum();
                proptest::prop_assert!(r.len() == 1 || (points <= max_points && bytes <= max_bytes));
            }
        }
    }

    /// Issue 24 (seed 17181): with one node of eight located, it was the only owner of every
    /// CoI block. A block keeps n_in + n_out owners: the located one first and in-CoI, the
    /// others the closest by XOR, or handoff leaves the located node its only copy.
    #[test]
    fn a_coi_block_with_too_few_located_members_is_topped_up_from_the_dht() {
        let members: Vec<Contact> = (0..8u32)
            .map(|i| Contact { id: Id::sha1(&i.to_be_bytes()), addr: ([127, 0, 0, 1], 7000 + i as u16).into() })
            .collect();
        let at = crate::geo::GeoPoint::new(33.75, -84.39).unwrap();
        let located = vec![coi::Located { contact: members[5], at }];
        let c = crate::class::Coi {
            n_in: 2,
            n_out: 1,
            in_coi_m: 50_000,
            out_coi_m: 1_000_000,
            coi_size_m: 50_000,
            precision: 5,
            location: None,
        };
        let target = Target { id: Id::sha1(b"block"), rf: 3, site: Some(coi::Site::new(at, c)) };
        let placed = owners_of(&target, members.as_slice(), &located);
        assert_eq!(placed.synchronous, 1);
        assert_eq!(placed.owners.len(), 3);
        assert_eq!(placed.owners[0], members[5]);
        let rest: Vec<Contact> = members.iter().filter(|c| c.id != members[5].id).copied().collect();
        assert_eq!(placed.owners[1..], owners(&rest, &target.id, 2)[..]);
        // Nobody located: the DHT's three closest, none of them synchronous.
        let placed = owners_of(&target, members.as_slice(), &[]);
        assert_eq!((placed.synchronous, placed.owners), (0, owners(&members, &target.id, 3)));
        // Enough located members: placement is CoI's alone.
        let located: Vec<coi::Located> = members[..3].iter().map(|&contact| coi::Located { contact, at }).collect();
        let placed = owners_of(&target, members.as_slice(), &located);
        assert!(placed.owners.iter().all(|o| members[..3].contains(o)));
    }

    /// Issue 24 (seed 3): with both in-CoI owners cut off from the coordinator, a write was
    /// acknowledged by two stand-ins and an in-CoI read, which asks the owners, missed it.
    /// Only in-CoI owners count; too few up refuses the write, naming the ones down.
    #[test]
    fn in_coi_writes_count_only_in_coi_owners() {
        let c = |n: &[u8], port: u16| Contact { id: Id::sha1(n), addr: ([127, 0, 0, 1], port).into() };
        let (a, b, out, spare) = (c(b"a", 1), c(b"b", 2), c(b"out", 3), c(b"spare", 4));
        let placed = Owners { owners: vec![a, b, out], synchronous: 2, fallback: vec![spare], out_short: false };
        let all_up = |_: &Id| true;
        assert_eq!(in_coi_write_quorum(&placed, 2, all_up), Ok(vec![a, b]));
        // One in-CoI owner down: the out-of-CoI owner and the spare are up, yet do not count.
        let short = in_coi_write_quorum(&placed, 2, |id| *id != b.id).unwrap_err();
        assert_eq!(short, InCoiShort { up: 1, n_in: 2, w: 2, down: vec![b] });
        // n_in 3, W 2: one owner down still leaves a quorum; the down one is still a target.
        let placed = Owners { owners: vec![a, b, spare, out], synchronous: 3, fallback: vec![], out_short: false };
        assert_eq!(in_coi_write_quorum(&placed, 2, |id| *id != b.id), Ok(vec![a, b, spare]));
        assert_eq!(in_coi_write_quorum(&placed, 2, |id| *id == out.id).unwrap_err().up, 0);
    }

    #[test]
    fn quorum_fails_when_too_many_replicas_fail() {
        let blocks = split_batch(batch(), &Classes::default());
        let [a, b, c] = [Id::sha1(b"a"), Id::sha1(b"b"), Id::sha1(b"c")];
        let need = || blocks.iter().map(|b| usize::from(b.replication.w));
        let mut plan = WritePlan::new(need().zip(vec![vec![a, b, c]; 3]));
        assert_eq!(plan.on_failure(&a), WriteProgress::Pending);
        assert_eq!(plan.on_failure(&b), WriteProgress::Failed);
        // Too few replicas known at all: fails at once.
        let plan = WritePlan::new(need().zip(vec![vec![a]; 3]));
        assert_eq!(plan.progress(), WriteProgress::Failed);
    }
}

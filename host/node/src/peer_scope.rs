//! Least privilege between nodes: a node certificate proves who is asking, not that it may ask
//! for anything. A node stores blocks and registrations only when placement gives them to
//! itself or to the asking node, and serves blocks in bulk (`ReadBlocks`), lists them
//! (`ListBlocks`) or digests them (`BlockDigests`) only for blocks placement gives to the
//! asking node (to itself too, for digests: handoff asks a new owner about its blocks).
//!
//! "Gives" is generous enough for views that differ for a while (a join, a departure): for a
//! DHT block, the read candidates (the owners, then the next closest members that still serve,
//! up to `2 * rf + 2`); for a CoI block, the owners and the other located members in
//! placement order (a location change moves CoI owners anywhere among them). A node always
//! answers itself (its own certificate, as the inspection tools use it).
//!
//! A read that counts this node as an in-CoI owner (`in_coi`) is answered settled only if this
//! node's own view agrees ([`vouches_in_coi`], index blocks included: the read names the
//! series they index): after a location change the asker may know of
//! it before this node does, and this node's settledness then speaks for blocks it does not
//! know it owns (issue 24, simulation seed 10201).
//!
//! Not covered here: index blocks of the quantum index, which are placed by the series they
//! index (the replica cannot place them from the block alone) and pass; client reads
//! (`Fetch` and the like), which any coordinator may send to the owners until clients carry
//! signed capabilities.

use std::sync::atomic::{AtomicU64, Ordering};

use timeshard_proto::placement::{self, Target};
use timeshard_proto::wire::{BlockPoints, ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Classes, Id, Quantum, SeriesKey, key};

use crate::membership::View;

/// The requests this module checks, for counting refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    Store,
    RegisterSeries,
    ReadBlocks,
    ListBlocks,
    BlockDigests,
}

impl Checked {
    pub const ALL: [Checked; 5] =
        [Checked::Store, Checked::RegisterSeries, Checked::ReadBlocks, Checked::ListBlocks, Checked::BlockDigests];

    pub fn label(self) -> &'static str {
        match self {
            Checked::Store => "store",
            Checked::RegisterSeries => "register_series",
            Checked::ReadBlocks => "read_blocks",
            Checked::ListBlocks => "list_blocks",
            Checked::BlockDigests => "block_digests",
        }
    }
}

/// Peer requests refused by placement, by kind.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; Checked::ALL.len()]);

impl Refusals {
    pub fn add(&self, kind: Checked) {
        self.0[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, kind: Checked) -> u64 {
        self.0[kind as usize].load(Ordering::Relaxed)
    }
}

/// Where a block of `series` at `quantum` goes, if it can be placed from the block alone: not
/// an index block, and not a CoI series without a usable location.
pub fn block_target(classes: &Classes, series: &SeriesKey, quantum: &Quantum) -> Option<Target> {
    if key::indexed_series_hash(series).is_some() {
        return None;
    }
    let class = classes.of(series);
    placement::target(series, key::block_id(class.format, series, quantum), class).ok()
}

/// Where the registration of `series` goes.
pub fn registration_target(classes: &Classes, series: &SeriesKey) -> Option<Target> {
    placement::target(series, key::series_meta_id(series), classes.of(series)).ok()
}

/// Whether placement in `view` gives `target` to one of `ids`, allowing for views that differ
/// for a while (see the module doc).
pub fn gives(view: &View, target: &Target, ids: &[Id]) -> bool {
    let owners = view.owners_of(target);
    let near = match target.site {
        Some(_) => owners.owners.iter().chain(&owners.fallback).copied().collect(),
        None => view.read_candidates(&owners.owners, &target.id, target.rf),
    };
    near.iter().any(|c| ids.contains(&c.id))
}

fn forbidden(kind: Checked, peer: &Id, what: String) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Forbidden,
        format!(
            "{} refused: placement gives {what} neither to this node nor to the asking node {}",
            kind.label(),
            peer.short()
        ),
    )
}

/// Checks a `Store` from `peer` to `me`: every block (index blocks aside) goes to one of them.
pub fn check_store(view: &View, classes: &Classes, me: Id, peer: Id, blocks: &[BlockPoints]) -> Result<(), ErrorReply> {
    for b in blocks {
        if let Some(target) = block_target(classes, &b.series, &b.quantum)
            && !gives(view, &target, &[me, peer])
        {
            return Err(forbidden(Checked::Store, &peer, format!("block {} @ {}", b.series, b.quantum.start)));
        }
    }
    Ok(())
}

/// Checks a `RegisterSeries` from `peer` to `me`.
pub fn check_registrations(
    view: &View,
    classes: &Classes,
    me: Id,
    peer: Id,
    series: &[SeriesKey],
) -> Result<(), ErrorReply> {
    for s in series {
        if let Some(target) = registration_target(classes, s)
            && !gives(view, &target, &[me, peer])
        {
            return Err(forbidden(Checked::RegisterSeries, &peer, format!("the registration of {s}")));
        }
    }
    Ok(())
}

/// What a read request from a strict in-CoI read asks about (`in_coi`): the series, the one
/// that places its blocks, and the quanta; `None` for any other request.
pub fn asked_in_coi(req: &Request) -> Option<(&SeriesKey, &SeriesKey, Vec<Quantum>)> {
    match req {
        Request::Fetch { series, quantum, in_coi: Some(base), .. } => Some((series, base, vec![*quantum])),
        Request::FetchWindows { series, parts, in_coi: Some(base), .. }
        | Request::Summarize { series, parts, in_coi: Some(base), .. } => {
            Some((series, base, parts.iter().map(|p| p.quantum).collect()))
        }
        Request::FetchParts { series, parts, in_coi: Some(base), .. } => {
            Some((series, base, parts.iter().map(|p| p.part.quantum).collect()))
        }
        _ => None,
    }
}

/// Whether this node (`me`) may answer settled to a read that counts it as an in-CoI owner of
/// the blocks of `series` at `quanta`, placed by series `base` (`series` itself, or the series
/// an index series indexes): its own view must place it among their in-CoI owners too. A
/// `base` that does not place `series` (not itself, nor the series it indexes), a series this
/// node cannot place, or one it places outside any CoI (the class tables differ for a moment)
/// does not vouch.
pub fn vouches_in_coi(
    view: &View,
    classes: &Classes,
    me: Id,
    series: &SeriesKey,
    base: &SeriesKey,
    quanta: &[Quantum],
) -> bool {
    let places = match key::indexed_series_hash(series) {
        Some(_) => key::quantum_index_series(base) == *series,
        None => base == series,
    };
    if !places {
        return false;
    }
    let class = classes.of(base);
    // The series' site is the same for every quantum: placed once (a geohash decode), then
    // each quantum's block id with it.
    let Some(first) = quanta.first() else { return true };
    let Ok(mut target) = placement::target(base, placement::placement_id(series, first, classes), class) else {
        return false;
    };
    if target.site.is_none() {
        return false;
    }
    quanta.iter().all(|q| {
        target.id = placement::placement_id(series, q, classes);
        let placed = view.owners_of(&target);
        placed.owners.iter().take(placed.synchronous).any(|c| c.id == me)
    })
}

/// Marks a read answer unsettled (see [`vouches_in_coi`]).
pub fn unsettle(resp: &mut Response) {
    match resp {
        Response::Points { settled, .. }
        | Response::BlockWindows { settled, .. }
        | Response::Partials { settled, .. }
        | Response::PartPages { settled, .. } => *settled = false,
        _ => {}
    }
}

/// The refusal of a bulk read or listing of a block placement does not give to `peer`.
pub fn not_the_askers(kind: Checked, peer: &Id, series: &SeriesKey, quantum: Option<&Quantum>) -> ErrorReply {
    let what = match quantum {
        Some(q) => format!("block {series} @ {}", q.start),
        None => format!("the registration of {series}"),
    };
    ErrorReply::new(
        ErrorCode::Forbidden,
        format!("{} refused: placement does not give {what} to the asking node {}", kind.label(), peer.short()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use timeshard_proto::membership::{GossipEntry, Member};
    use timeshard_proto::{Contact, Point, QuantumLen};

    fn contact(i: u16) -> Contact {
        Contact { id: Id::sha1(&i.to_be_bytes()), addr: SocketAddr::from(([127, 0, 0, 1], 7000 + i)) }
    }

    /// Node 0's view of a twelve-node cluster.
    fn view() -> View {
        let members = (1..12).map(|i| {
            let c = contact(i);
            GossipEntry { member: Member::new(c.id, c.addr, 1), age_ms: 0, proof: None, seen_at: None }
        });
        View::for_tests(contact(0), members)
    }

    fn block(i: u32) -> BlockPoints {
        let series: SeriesKey = format!("m{{i={i}}}").parse().unwrap();
        let quantum = QuantumLen::new(10_000_000_000).unwrap().quantum_of(0);
        BlockPoints { series, quantum, points: vec![Point::new(1, 1.0)] }
    }

    #[test]
    fn a_store_is_taken_only_where_placement_gives_the_block_to_this_node_or_the_asker() {
        let view = view();
        let classes = Classes::default();
        let (mut refused, mut taken) = (0, 0);
        for i in 0..50 {
            let b = block(i);
            let target = block_target(&classes, &b.series, &b.quantum).unwrap();
            let owners = view.owners_of(&target).owners;
            let near = view.read_candidates(&owners, &target.id, target.rf);
            assert_eq!(near.len(), 8, "2 rf + 2 candidates of 12 members");
            let outside: Vec<Contact> = (0..12).map(contact).filter(|c| !near.contains(c)).collect();
            let (far, far_too) = (outside[0].id, outside[1].id);
            // Whatever the answering node, an owner asking is taken.
            assert!(check_store(&view, &classes, far, owners[0].id, std::slice::from_ref(&b)).is_ok());
            // An answering owner takes it from anyone.
            assert!(check_store(&view, &classes, owners[1].id, far, std::slice::from_ref(&b)).is_ok());
            // Neither: refused, naming the block.
            let e = check_store(&view, &classes, far, far_too, std::slice::from_ref(&b)).unwrap_err();
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(e.message.contains(b.series.as_str()), "{}", e.message);
            // A registration likewise.
            let reg = registration_target(&classes, &b.series).unwrap();
            let reg_near = view.read_candidates(&view.owners_of(&reg).owners, &reg.id, reg.rf);
            let outside: Vec<Id> = (0..12).map(contact).filter(|c| !reg_near.contains(c)).map(|c| c.id).collect();
            let got = check_registrations(&view, &classes, outside[0], outside[1], std::slice::from_ref(&b.series));
            refused += usize::from(got.is_err());
            taken += usize::from(got.is_ok());
        }
        assert_eq!((refused, taken), (50, 0));
    }

    #[test]
    fn index_blocks_are_not_placed_from_the_block_alone() {
        let series = key::quantum_index_series(&"m".parse().unwrap());
        let q = QuantumLen::new(10_000_000_000).unwrap().quantum_of(0);
        assert!(block_target(&Classes::default(), &series, &q).is_none());
    }

    /// Issue 24, seed 10201: a member answers a read that counts it as an in-CoI owner settled
    /// only if its own view makes it one; an out-of-CoI owner or a member placement does not
    /// name (its view not yet showing a location change) does not vouch.
    #[test]
    fn only_a_member_its_own_view_makes_an_in_coi_owner_vouches_for_an_in_coi_read() {
        use timeshard_proto::class::{Coi, SeriesClass};
        // Twelve members, six near Atlanta and six in Seattle.
        let located = |i: u16| {
            let c = contact(i);
            let mut m = Member::new(c.id, c.addr, 1);
            m.location = Some(if i.is_multiple_of(2) { (33.75, -84.39) } else { (47.6, -122.3) });
            GossipEntry { member: m, age_ms: 0, proof: None, seen_at: None }
        };
        let view = View::for_tests(contact(0), (1..12).map(located));
        view.set_location(Some(timeshard_proto::geo::GeoPoint::new(33.75, -84.39).unwrap()));
        let coi = Coi {
            n_in: 2,
            n_out: 1,
            in_coi_m: 50_000,
            out_coi_m: 1_000_000,
            coi_size_m: 50_000,
            precision: 5,
            location: None,
        };
        let class = SeriesClass {
            name: "traffic".into(),
            metric_prefix: "traffic.".into(),
            coi: Some(coi),
            ..Default::default()
        };
        let classes = Classes::new(vec![class]).unwrap();
        let series: SeriesKey = "traffic.speed{geohash=dn5bpsb}".parse().unwrap();
        let quantum = QuantumLen::new(10_000_000_000).unwrap().quantum_of(0);
        let class = classes.of(&series);
        let target = placement::target(&series, key::block_id(class.format, &series, &quantum), class).unwrap();
        let placed = view.owners_of(&target);
        assert_eq!((placed.synchronous, placed.owners.len()), (2, 3));
        let vouches = |id: Id| vouches_in_coi(&view, &classes, id, &series, &series, &[quantum]);
        for c in &placed.owners[..2] {
            assert!(vouches(c.id), "an in-CoI owner vouches");
        }
        assert!(!vouches(placed.owners[2].id), "an out-of-CoI owner does not");
        let other = (0..12).map(contact).find(|c| !placed.owners.contains(c)).unwrap();
        assert!(!vouches(other.id), "a member placement does not name does not");
        // An index block is placed by the series it indexes, named by the read.
        let index = key::quantum_index_series(&series);
        let at = placement::target(&series, key::series_meta_id(&series), class).unwrap();
        let index_owners = view.owners_of(&at);
        let in_coi = index_owners.owners[0].id;
        assert!(vouches_in_coi(&view, &classes, in_coi, &index, &series, &[quantum]));
        let outside = (0..12).map(contact).find(|c| !index_owners.owners[..2].contains(c)).unwrap();
        assert!(!vouches_in_coi(&view, &classes, outside.id, &index, &series, &[quantum]));
        // A read naming a series that does not place the block does not vouch.
        let other: SeriesKey = "traffic.speed{geohash=dn5bpsc}".parse().unwrap();
        assert!(!vouches_in_coi(&view, &classes, in_coi, &index, &other, &[quantum]));
        assert!(!vouches_in_coi(&view, &classes, placed.owners[0].id, &series, &other, &[quantum]));
        // Only strict in-CoI reads are checked, and a read answer is unsettled by `unsettle`.
        let fetch = |in_coi: Option<SeriesKey>| Request::Fetch {
            series: series.clone(),
            quantum,
            range: quantum.range(),
            after: None,
            limit: 1,
            in_coi,
        };
        assert!(asked_in_coi(&fetch(None)).is_none());
        let strict = fetch(Some(series.clone()));
        assert_eq!(asked_in_coi(&strict), Some((&series, &series, vec![quantum])));
        let mut resp = Response::Points { points: Vec::new(), more: false, settled: true };
        unsettle(&mut resp);
        assert!(matches!(resp, Response::Points { settled: false, .. }));
    }
}

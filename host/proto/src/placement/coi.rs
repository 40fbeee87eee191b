//! Context-of-interest placement (FogStore's Algorithm 2) over a geographic view of the
//! members, beside the XOR placement of the DHT.
//!
//! A block of a CoI class is placed by its series' location ([`Site`]):
//! - **in-CoI**: the `n_in` located members closest to the site, distances taken between cells
//!   of `precision` geohash characters (members in the site's cell are all at distance 0) and
//!   ties broken by rendezvous hashing (the highest `hash(block id, node id)`), which spreads
//!   the series of one cell over its nodes. Members within `in_coi_dist` come first; when too
//!   few are that close the radius doubles, step by step up to the whole earth, so the
//!   placement never fails while enough located members exist.
//! - **out-of-CoI**: `n_out` members at least `out_coi_dist` from the site, not chosen in-CoI,
//!   by rendezvous hash; when none is that far, the farthest remaining ones
//!   ([`CoiPlacement::out_short`] says so).
//!
//! Every node that holds the same members and locations computes the same placement: the
//! order depends only on ids, locations and the block id. Members without a location never
//! hold CoI blocks.

use serde::{Deserialize, Serialize};

use crate::class::Coi;
use crate::geo::{Cell, GeoPoint, MAX_DISTANCE_KM};
use crate::hash::hash_bytes;
use crate::id::Id;
use crate::routing::Contact;

/// A member with its location.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Located {
    pub contact: Contact,
    pub at: GeoPoint,
}

/// Where a CoI block belongs: its series' location and its class's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Site {
    /// The series' location, as a 12-character cell (under a metre).
    pub cell: Cell,
    pub coi: Coi,
}

impl Site {
    /// The site of a series at `at` in a class with `coi`.
    pub fn new(at: GeoPoint, coi: Coi) -> Site {
        Site { cell: at.cell(crate::geo::MAX_PRECISION), coi }
    }

    /// The series' location.
    pub fn point(&self) -> GeoPoint {
        self.cell.center()
    }

    /// Whether a client at `client` is inside the context of interest (within `coi_size`).
    pub fn contains(&self, client: &GeoPoint) -> bool {
        self.point().distance_km(client) * 1_000.0 <= f64::from(self.coi.coi_size_m)
    }
}

/// The placement of one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoiPlacement {
    /// In-CoI replicas, closest first.
    pub in_coi: Vec<Contact>,
    /// Out-of-CoI replicas.
    pub out_coi: Vec<Contact>,
    /// The remaining located members in in-CoI order (closest first): where reads from
    /// outside the context of interest look next. Writes never count them (see
    /// [`super::in_coi_write_quorum`]).
    pub fallback: Vec<Contact>,
    /// The in-CoI radius that held `n_in` members, in metres (more than `in_coi_dist` when it
    /// was widened; `None` when even the whole earth held fewer).
    pub radius_m: Option<u64>,
    /// Whether some out-of-CoI replica is closer than `out_coi_dist` (the fleet has no member
    /// that far that is not in-CoI).
    pub out_short: bool,
}

impl CoiPlacement {
    /// Every owner: in-CoI then out-of-CoI, distinct.
    pub fn owners(&self) -> Vec<Contact> {
        self.in_coi.iter().chain(&self.out_coi).copied().collect()
    }
}

/// The rendezvous weight of `node` for the block at `block`: higher wins.
pub fn rendezvous(block: &Id, node: &Id) -> u64 {
    let mut bytes = [0u8; 40];
    bytes[..20].copy_from_slice(&block.0);
    bytes[20..].copy_from_slice(&node.0);
    hash_bytes(&bytes)
}

/// Places the block at `block` of a series at `site` among `located` (the eligible members
/// that have a location; order does not matter).
pub fn place(block: &Id, site: &Site, located: &[Located]) -> CoiPlacement {
    let coi = &site.coi;
    let here = site.point();
    let centre = here.cell(coi.precision).center();
    let n_in = usize::from(coi.n_in);
    let n_out = usize::from(coi.n_out);
    // (cell distance in metres, rendezvous weight, exact distance in km, contact)
    let mut ranked: Vec<(u64, u64, f64, Contact)> = located
        .iter()
        .map(|m| {
            let cell = m.at.cell(coi.precision);
            let d = if cell.center() == centre { 0.0 } else { centre.distance_km(&cell.center()) };
            ((d * 1_000.0).round() as u64, rendezvous(block, &m.contact.id), here.distance_km(&m.at), m.contact)
        })
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.3.id.cmp(&b.3.id)));
    ranked.dedup_by_key(|r| r.3.id);

    // Algorithm 2: widen the in-CoI radius until it holds n_in members.
    let max_m = (MAX_DISTANCE_KM * 1_000.0) as u64 + 1;
    let mut radius = u64::from(coi.in_coi_m).max(1);
    let radius_m = loop {
        let within = ranked.iter().take_while(|r| r.0 <= radius).count();
        if within >= n_in {
            break Some(radius);
        }
        if radius >= max_m {
            break None;
        }
        radius = radius.saturating_mul(2).min(max_m);
    };
    let in_coi: Vec<Contact> = ranked.iter().take(n_in).map(|r| r.3).collect();
    let rest = &ranked[in_coi.len()..];

    let far_km = f64::from(coi.out_coi_m) / 1_000.0;
    let mut far: Vec<&(u64, u64, f64, Contact)> = rest.iter().filter(|r| r.2 >= far_km).collect();
    far.sort_by(|a, b| b.1.cmp(&a.1).then(a.3.id.cmp(&b.3.id)));
    let mut out_coi: Vec<Contact> = far.iter().take(n_out).map(|r| r.3).collect();
    let mut out_short = false;
    if out_coi.len() < n_out {
        let mut near: Vec<&(u64, u64, f64, Contact)> = rest.iter().filter(|r| r.2 < far_km).collect();
        near.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.3.id.cmp(&b.3.id)));
        let extra: Vec<Contact> = near.iter().take(n_out - out_coi.len()).map(|r| r.3).collect();
        out_short = !extra.is_empty();
        out_coi.extend(extra);
    }
    let fallback = rest.iter().map(|r| r.3).filter(|c| !out_coi.iter().any(|o| o.id == c.id)).collect();
    CoiPlacement { in_coi, out_coi, fallback, radius_m, out_short }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn node(i: u32, lat: f64, lon: f64) -> Located {
        let addr = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
        Located { contact: Contact { id: Id::sha1(&i.to_be_bytes()), addr }, at: GeoPoint::new(lat, lon).unwrap() }
    }

    fn coi(n_in: u8, n_out: u8, in_km: u32, out_km: u32, precision: u8) -> Coi {
        Coi {
            n_in,
            n_out,
            in_coi_m: in_km * 1_000,
            out_coi_m: out_km * 1_000,
            coi_size_m: 50_000,
            precision,
            location: None,
        }
    }

    const ATL: (f64, f64) = (33.749, -84.388);

    /// Four nodes around Atlanta, and Houston, San Francisco, Chicago, Seattle.
    fn fleet() -> Vec<Located> {
        vec![
            node(0, 33.75, -84.39),
            node(1, 33.78, -84.40),
            node(2, 33.70, -84.35),
            node(3, 33.85, -84.30),
            node(4, 29.76, -95.37),
            node(5, 37.77, -122.42),
            node(6, 41.88, -87.63),
            node(7, 47.61, -122.33),
        ]
    }

    #[test]
    fn in_coi_nearby_out_coi_far() {
        let site = Site::new(GeoPoint::new(ATL.0, ATL.1).unwrap(), coi(2, 1, 50, 1_000, 5));
        let p = place(&Id::sha1(b"block"), &site, &fleet());
        let atl: HashSet<Id> = fleet()[..4].iter().map(|m| m.contact.id).collect();
        assert_eq!(p.in_coi.len(), 2);
        assert!(p.in_coi.iter().all(|c| atl.contains(&c.id)));
        assert_eq!(p.out_coi.len(), 1);
        assert!(!atl.contains(&p.out_coi[0].id) && !p.out_short);
        assert_eq!(p.radius_m, Some(50_000));
        assert_eq!(p.fallback.len(), 5);
        // The far nodes come after the Atlanta ones in the fallback order.
        assert!(p.fallback[..2].iter().all(|c| atl.contains(&c.id)));
    }

    #[test]
    fn sparse_regions_widen_the_radius() {
        // One node in Atlanta: the second in-CoI replica is the next closest (Chicago or
        // Houston), found by widening 10 km step by step.
        let mut f = fleet();
        f.drain(1..4);
        let site = Site::new(GeoPoint::new(ATL.0, ATL.1).unwrap(), coi(2, 1, 10, 2_000, 6));
        let p = place(&Id::sha1(b"block"), &site, &f);
        assert_eq!(p.in_coi.len(), 2);
        assert_eq!(p.in_coi[0].id, f[0].contact.id);
        assert_eq!(p.in_coi[1].id, f[3].contact.id, "Chicago is the closest after Atlanta");
        assert!(p.radius_m.unwrap() > 10_000);
        assert!(
            p.out_coi.iter().all(|o| [f[2].contact.id, f[4].contact.id].contains(&o.id)),
            "out-of-CoI: San Francisco or Seattle"
        );
        // Fewer members than replicas: every one placed, the radius covers the earth.
        let p = place(&Id::sha1(b"block"), &site, &f[..1]);
        assert_eq!((p.in_coi.len(), p.out_coi.len(), p.radius_m), (1, 0, None));
    }

    #[test]
    fn no_node_far_enough_is_reported() {
        let f: Vec<Located> = fleet()[..4].to_vec();
        let site = Site::new(GeoPoint::new(ATL.0, ATL.1).unwrap(), coi(2, 1, 50, 1_000, 5));
        let p = place(&Id::sha1(b"b"), &site, &f);
        assert_eq!(p.out_coi.len(), 1);
        assert!(p.out_short);
    }

    #[test]
    fn the_series_of_one_cell_spread_over_its_nodes() {
        // Four nodes in one cell: with n_in 1 every node gets some of 400 blocks.
        let f: Vec<Located> = (0..4).map(|i| node(i, 33.75, -84.39)).collect();
        let site = Site::new(GeoPoint::new(ATL.0, ATL.1).unwrap(), coi(1, 0, 50, 1_000, 4));
        let mut load = std::collections::HashMap::new();
        for b in 0..400u32 {
            let p = place(&Id::sha1(&b.to_be_bytes()), &site, &f);
            *load.entry(p.in_coi[0].id).or_insert(0) += 1;
        }
        assert_eq!(load.len(), 4);
        assert!(load.values().all(|&n| n > 50), "{load:?}");
    }

    fn arb_fleet() -> impl Strategy<Value = Vec<Located>> {
        proptest::collection::vec((25.0f64..49.0, -124.0f64..-67.0), 1..40)
            .prop_map(|v| v.into_iter().enumerate().map(|(i, (lat, lon))| node(i as u32, lat, lon)).collect())
    }

    proptest! {
        /// Deterministic whatever the order of the members; n_in + n_out distinct owners when
        /// the fleet has that many; out-of-CoI replicas at least out_coi_dist away whenever
        /// enough such members exist; in-CoI replicas are the closest (by cell).
        #[test]
        fn placement_properties(
            fleet in arb_fleet(),
            block in any::<[u8; 20]>(),
            n_in in 1u8..4,
            n_out in 0u8..3,
            in_km in 1u32..500,
            extra_km in 0u32..2_000,
            precision in 2u8..8,
            site in (25.0f64..49.0, -124.0f64..-67.0),
            seed in any::<u64>(),
        ) {
            let c = coi(n_in, n_out, in_km, in_km + extra_km, precision);
            let site = Site::new(GeoPoint::new(site.0, site.1).unwrap(), c.clone());
            let id = Id(block);
            let p = place(&id, &site, &fleet);
            let mut shuffled = fleet.clone();
            let k = (seed as usize) % shuffled.len();
            shuffled.rotate_left(k);
            shuffled.reverse();
            prop_assert_eq!(&place(&id, &site, &shuffled), &p);

            let owners = p.owners();
            let distinct: HashSet<Id> = owners.iter().map(|o| o.id).collect();
            prop_assert_eq!(distinct.len(), owners.len());
            let want = usize::from(n_in + n_out).min(fleet.len());
            prop_assert_eq!(owners.len(), want);
            prop_assert_eq!(owners.len() + p.fallback.len(), fleet.len());

            let here = site.point();
            let far_km = f64::from(c.out_coi_m) / 1_000.0;
            let loc = |id: &Id| fleet.iter().find(|m| m.contact.id == *id).unwrap().at;
            let far_available = fleet
                .iter()
                .filter(|m| !p.in_coi.iter().any(|i| i.id == m.contact.id))
                .filter(|m| here.distance_km(&m.at) >= far_km)
                .count();
            if far_available >= p.out_coi.len() {
                for o in &p.out_coi {
                    prop_assert!(here.distance_km(&loc(&o.id)) >= far_km);
                }
                prop_assert!(!p.out_short);
            }
            // No member outside in-CoI is in a strictly closer cell than an in-CoI replica.
            let centre = here.cell(precision).center();
            let cell_km = |id: &Id| {
                let c = loc(id).cell(precision).center();
                if c == centre { 0.0 } else { centre.distance_km(&c) }
            };
            let worst = p.in_coi.iter().map(|c| cell_km(&c.id)).fold(0.0, f64::max);
            for m in fleet.iter().filter(|m| !p.in_coi.iter().any(|i| i.id == m.contact.id)) {
                prop_assert!(cell_km(&m.contact.id) + 1e-3 >= worst);
            }
        }
    }
}

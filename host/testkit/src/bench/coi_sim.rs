//! The simulated parts of `timeshard bench coi`, over the sans-IO placement
//! (`timeshard_proto::placement`), no node processes:
//!
//! - `load_balance` (FogStore Fig 11): 64 nodes spread over the Atlanta region, 80 % of the
//!   series from 1/16 of its area; the standard deviation of in-CoI series per node against
//!   geohash precision 2-8 and 1, 2 or 4 nodes per site, for both designs: the geographic view
//!   beside the routing table (what timeshard runs: cell distance, then rendezvous hashing)
//!   and geo-prefixed node ids (FogStore: ids `geohash(5p bits) ++ hash`, owners the XOR
//!   closest to the series' `geohash ++ hash`).
//! - `out_coi_km_p50` (FogStore Fig 13): one node per US state capital, series at random
//!   points of the contiguous US; the median distance from a series to its out-of-CoI replica,
//!   at the benchmark class's out_coi_dist (1,000 km) and swept over 500-2,000 km.

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use timeshard_proto::class::Coi;
use timeshard_proto::geo::GeoPoint;
use timeshard_proto::placement::coi::{Located, Site, place};
use timeshard_proto::placement::owners;
use timeshard_proto::{Contact, Id};

use crate::stats::{median, round3};

/// The Atlanta region: (min lat, min lon, max lat, max lon).
const ATLANTA: (f64, f64, f64, f64) = (33.50, -84.70, 34.10, -84.10);
const NODES: usize = 64;
const SERIES: usize = 20_000;

/// State capitals of the contiguous US (lat, lon).
const CAPITALS: [(f64, f64); 48] = [
    (32.377, -86.300),
    (33.448, -112.074),
    (34.746, -92.289),
    (38.576, -121.494),
    (39.739, -104.985),
    (41.764, -72.682),
    (39.157, -75.520),
    (30.438, -84.281),
    (33.749, -84.388),
    (43.618, -116.215),
    (39.798, -89.654),
    (39.768, -86.163),
    (41.591, -93.604),
    (39.048, -95.678),
    (38.187, -84.875),
    (30.457, -91.187),
    (44.307, -69.782),
    (38.979, -76.491),
    (42.358, -71.064),
    (42.733, -84.555),
    (44.955, -93.102),
    (32.303, -90.182),
    (38.579, -92.173),
    (46.586, -112.018),
    (40.808, -96.700),
    (39.164, -119.766),
    (43.207, -71.538),
    (40.221, -74.756),
    (35.682, -105.940),
    (42.653, -73.757),
    (35.780, -78.639),
    (46.820, -100.783),
    (39.961, -82.999),
    (35.492, -97.503),
    (44.938, -123.030),
    (40.264, -76.884),
    (41.831, -71.415),
    (34.000, -81.033),
    (44.367, -100.346),
    (36.165, -86.784),
    (30.275, -97.740),
    (40.777, -111.888),
    (44.262, -72.580),
    (37.539, -77.434),
    (47.036, -122.905),
    (38.336, -81.612),
    (43.075, -89.384),
    (41.140, -104.820),
];

fn contact(i: usize) -> Contact {
    Contact { id: Id::sha1(&(i as u64).to_be_bytes()), addr: "127.0.0.1:1".parse().expect("literal") }
}

fn point_in(rng: &mut impl Rng, (a, b, c, d): (f64, f64, f64, f64)) -> GeoPoint {
    GeoPoint::new(rng.random_range(a..c), rng.random_range(b..d)).expect("in range")
}

fn std_dev(load: &[usize]) -> f64 {
    let n = load.len().max(1) as f64;
    let mean = load.iter().sum::<usize>() as f64 / n;
    (load.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

/// A geo-prefixed id: the first `bits` bits are the location's geohash, the rest `hash`.
fn prefixed(at: &GeoPoint, bits: u32, hash: &Id) -> Id {
    let cell = at.cell(((bits / 5) as u8).max(1));
    let mut out = hash.0;
    for i in 0..bits as usize {
        let bit = (cell.bits >> (bits as usize - 1 - i)) & 1;
        let (byte, mask) = (i / 8, 0x80u8 >> (i % 8));
        if bit == 1 {
            out[byte] |= mask;
        } else {
            out[byte] &= !mask;
        }
    }
    Id(out)
}

/// The load-balance simulation: per precision and nodes per site, the standard deviation of
/// in-CoI replicas (n_in 2) per node for both designs.
pub fn load_balance(seed: u64, series: usize) -> Value {
    let mut rows = Vec::new();
    for per_site in [1usize, 2, 4] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let sites: Vec<GeoPoint> = (0..NODES / per_site).map(|_| point_in(&mut rng, ATLANTA)).collect();
        let nodes: Vec<Located> =
            (0..NODES).map(|i| Located { contact: contact(i), at: sites[i / per_site] }).collect();
        // 80 % of the series from one sixteenth of the area (a quarter of each side).
        let (a, b, c, d) = ATLANTA;
        let hot = (a, b, a + (c - a) / 4.0, b + (d - b) / 4.0);
        let locations: Vec<GeoPoint> = (0..series)
            .map(|_| if rng.random_bool(0.8) { point_in(&mut rng, hot) } else { point_in(&mut rng, ATLANTA) })
            .collect();
        for precision in 2u8..=8 {
            let coi = Coi {
                n_in: 2,
                n_out: 0,
                in_coi_m: 5_000,
                out_coi_m: 5_000,
                coi_size_m: 5_000,
                precision,
                location: None,
            };
            let bits = u32::from(precision) * 5;
            let prefixed_nodes: Vec<Contact> =
                nodes.iter().map(|n| Contact { id: prefixed(&n.at, bits, &n.contact.id), ..n.contact }).collect();
            let (mut view, mut tokens) = (vec![0usize; NODES], vec![0usize; NODES]);
            for (s, at) in locations.iter().enumerate() {
                let block = Id::sha1(&(s as u64).to_be_bytes());
                for o in place(&block, &Site::new(*at, coi.clone()), &nodes).in_coi {
                    view[nodes.iter().position(|n| n.contact.id == o.id).expect("a node")] += 1;
                }
                for o in owners(&prefixed_nodes, &prefixed(at, bits, &block), 2) {
                    tokens[prefixed_nodes.iter().position(|n| n.id == o.id).expect("a node")] += 1;
                }
            }
            rows.push(json!({
                "precision": precision,
                "nodes_per_site": per_site,
                "geo_view_std_dev": round3(std_dev(&view)),
                "geo_prefixed_ids_std_dev": round3(std_dev(&tokens)),
                "geo_view_max": view.iter().max(),
                "geo_prefixed_ids_max": tokens.iter().max(),
            }));
        }
    }
    json!({ "nodes": NODES, "series": series, "n_in": 2, "rows": rows })
}

/// The out-of-CoI distance of the benchmark's class, and the others the sweep reports.
pub const OUT_COI_KM: u32 = 1_000;
const OUT_COI_SWEEP_KM: [u32; 4] = [500, 1_000, 1_500, 2_000];

/// The median distance in km from a series to its out-of-CoI replica (n_in 2, n_out 1,
/// out_coi_dist `out_coi_km`), one node per state capital, series at random points of the
/// contiguous US.
pub fn out_coi_km_p50(seed: u64, series: usize, out_coi_km: u32) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let nodes: Vec<Located> = CAPITALS
        .iter()
        .enumerate()
        .map(|(i, &(lat, lon))| Located { contact: contact(i), at: GeoPoint::new(lat, lon).expect("in range") })
        .collect();
    let coi = Coi {
        n_in: 2,
        n_out: 1,
        in_coi_m: 100_000,
        out_coi_m: out_coi_km * 1_000,
        coi_size_m: 50_000,
        precision: 5,
        location: None,
    };
    let distances: Vec<f64> = (0..series)
        .map(|s| {
            let at = point_in(&mut rng, (30.0, -122.0, 47.0, -72.0));
            let p = place(&Id::sha1(&(s as u64).to_be_bytes()), &Site::new(at, coi.clone()), &nodes);
            let out = p.out_coi.first().expect("48 nodes hold an out-of-CoI replica");
            let node = nodes.iter().find(|n| n.contact.id == out.id).expect("a node");
            at.distance_km(&node.at)
        })
        .collect();
    round3(median(&distances))
}

/// Both simulations, as the benchmark's JSON keys.
pub fn simulate(seed: u64, quick: bool) -> Value {
    let series = if quick { 2_000 } else { SERIES };
    json!({
        "load_balance": load_balance(seed, series),
        "out_coi_km_p50": out_coi_km_p50(seed, series, OUT_COI_KM),
        // FogStore's Fig 13 is a function of its distance threshold too ("a maximum encoding
        // distance threshold of 34 can allow a median separation of at least 2500 km").
        "out_coi_km_p50_by_out_coi_dist": OUT_COI_SWEEP_KM
            .iter()
            .map(|&km| json!({"out_coi_dist_km": km, "p50_km": out_coi_km_p50(seed, series, km)}))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulations_give_their_figures() {
        let doc = simulate(7, true);
        let rows = doc["load_balance"]["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 7 * 3);
        assert!(rows.iter().all(|r| r["geo_view_std_dev"].as_f64().unwrap() >= 0.0));
        let km = doc["out_coi_km_p50"].as_f64().unwrap();
        assert!(km >= 1_000.0, "out-of-CoI replicas are at least out_coi_dist away: {km}");
        let sweep = doc["out_coi_km_p50_by_out_coi_dist"].as_array().unwrap();
        assert_eq!(sweep.len(), OUT_COI_SWEEP_KM.len());
        for row in sweep {
            let (dist, p50) = (row["out_coi_dist_km"].as_f64().unwrap(), row["p50_km"].as_f64().unwrap());
            assert!(p50 >= dist, "a median of {p50} km at out_coi_dist {dist} km");
        }
        let p50s: Vec<f64> = sweep.iter().map(|r| r["p50_km"].as_f64().unwrap()).collect();
        assert!(p50s.windows(2).all(|w| w[0] <= w[1]), "farther thresholds, farther replicas: {p50s:?}");
    }

    #[test]
    fn prefixed_ids_carry_the_geohash() {
        let at = GeoPoint::new(33.749, -84.388).unwrap();
        let id = prefixed(&at, 25, &Id::sha1(b"x"));
        let other = prefixed(&at, 25, &Id::sha1(b"y"));
        assert_eq!(id.0[..3], other.0[..3], "the first 24 bits are the same cell");
    }
}

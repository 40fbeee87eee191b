//! Geography for context-of-interest placement: points on the earth, geohashes (encode, decode,
//! cell bounds), great-circle distances, and distances as operators write them ("50km").
//!
//! A geohash interleaves longitude and latitude bits (longitude first) and spells them in
//! base 32, five bits per character; a prefix of a geohash is the cell that contains it. Two
//! locations quantized to the same number of characters are in the same cell or not: that is
//! what makes placement at a given precision treat nearby nodes alike.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The geohash alphabet.
const BASE32: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";
/// Longest geohash accepted (60 bits: well under a metre).
pub const MAX_PRECISION: u8 = 12;
/// Mean earth radius in kilometres.
pub const EARTH_RADIUS_KM: f64 = 6_371.0;
/// Half the earth's circumference: no two points are farther apart.
pub const MAX_DISTANCE_KM: f64 = std::f64::consts::PI * EARTH_RADIUS_KM;

/// Bad geographic input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeoError {
    #[error("latitude {0} is out of range: it must be between -90 and 90")]
    Latitude(String),
    #[error("longitude {0} is out of range: it must be between -180 and 180")]
    Longitude(String),
    #[error("location {0:?} is not LAT,LON (e.g. 33.75,-84.39)")]
    Coordinates(String),
    #[error("geohash {0:?} is malformed: use 1 to 12 characters of 0-9 and b-z without a, i, l, o (e.g. dn5bpsb)")]
    Geohash(String),
    #[error("distance {0:?} is not a positive distance like 50km, 500m or 2.5km")]
    Distance(String),
    #[error("geohash precision {0} is out of range: use 1 to 12 characters")]
    Precision(u8),
}

/// A point on the earth, in degrees.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GeoPoint {
    pub lat: f64,
    pub lon: f64,
}

impl GeoPoint {
    /// A point, checking both coordinates are in range.
    pub fn new(lat: f64, lon: f64) -> Result<GeoPoint, GeoError> {
        if !(-90.0..=90.0).contains(&lat) {
            return Err(GeoError::Latitude(lat.to_string()));
        }
        if !(-180.0..=180.0).contains(&lon) {
            return Err(GeoError::Longitude(lon.to_string()));
        }
        Ok(GeoPoint { lat, lon })
    }

    /// Great-circle distance to `other` in kilometres (haversine).
    pub fn distance_km(&self, other: &GeoPoint) -> f64 {
        let (p1, p2) = (self.lat.to_radians(), other.lat.to_radians());
        let dp = p2 - p1;
        let dl = (other.lon - self.lon).to_radians();
        let a = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
        2.0 * EARTH_RADIUS_KM * a.sqrt().min(1.0).asin()
    }

    /// The geohash cell of `precision` characters holding this point.
    pub fn cell(&self, precision: u8) -> Cell {
        let bits = u32::from(precision.clamp(1, MAX_PRECISION)) * 5;
        let (mut lat, mut lon) = ((-90.0f64, 90.0f64), (-180.0f64, 180.0f64));
        let mut code = 0u64;
        for i in 0..bits {
            let range = if i % 2 == 0 { &mut lon } else { &mut lat };
            let v = if i % 2 == 0 { self.lon } else { self.lat };
            let mid = (range.0 + range.1) / 2.0;
            code <<= 1;
            if v >= mid {
                code |= 1;
                range.0 = mid;
            } else {
                range.1 = mid;
            }
        }
        Cell { bits: code, precision: precision.clamp(1, MAX_PRECISION) }
    }

    /// The geohash of `precision` characters holding this point.
    pub fn geohash(&self, precision: u8) -> String {
        self.cell(precision).to_string()
    }
}

impl FromStr for GeoPoint {
    type Err = GeoError;
    /// `LAT,LON` in degrees.
    fn from_str(s: &str) -> Result<GeoPoint, GeoError> {
        let bad = || GeoError::Coordinates(s.to_string());
        let (lat, lon) = s.split_once(',').ok_or_else(bad)?;
        let lat: f64 = lat.trim().parse().map_err(|_| bad())?;
        let lon: f64 = lon.trim().parse().map_err(|_| bad())?;
        if !lat.is_finite() || !lon.is_finite() {
            return Err(bad());
        }
        GeoPoint::new(lat, lon)
    }
}

impl fmt::Display for GeoPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.lat, self.lon)
    }
}

/// A geohash cell: `precision` characters, `5 * precision` bits (the first in the high bits
/// of the low `5 * precision` bits of `bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cell {
    pub bits: u64,
    pub precision: u8,
}

impl Cell {
    /// Number of bits.
    pub fn len(&self) -> u32 {
        u32::from(self.precision) * 5
    }

    /// Whether the cell has no bits (never: precision is at least 1).
    pub fn is_empty(&self) -> bool {
        self.precision == 0
    }

    /// The cell's bounds: (min lat, min lon, max lat, max lon).
    pub fn bounds(&self) -> (f64, f64, f64, f64) {
        let (mut lat, mut lon) = ((-90.0f64, 90.0f64), (-180.0f64, 180.0f64));
        let n = self.len();
        for i in 0..n {
            let bit = self.bits >> (n - 1 - i) & 1 == 1;
            let range = if i % 2 == 0 { &mut lon } else { &mut lat };
            let mid = (range.0 + range.1) / 2.0;
            if bit {
                range.0 = mid;
            } else {
                range.1 = mid;
            }
        }
        (lat.0, lon.0, lat.1, lon.1)
    }

    /// The centre of the cell.
    pub fn center(&self) -> GeoPoint {
        let (a, b, c, d) = self.bounds();
        GeoPoint { lat: (a + c) / 2.0, lon: (b + d) / 2.0 }
    }

    /// FogStore's geohash distance: bits after the longest common prefix of the two cells (at
    /// the smaller precision). 0 for the same cell; it grows with the size of the smallest
    /// cell holding both.
    pub fn bit_distance(&self, other: &Cell) -> u32 {
        let n = self.len().min(other.len());
        let a = self.bits >> (self.len() - n);
        let b = other.bits >> (other.len() - n);
        let x = a ^ b;
        if x == 0 { 0 } else { 64 - x.leading_zeros() }
    }
}

impl FromStr for Cell {
    type Err = GeoError;
    fn from_str(s: &str) -> Result<Cell, GeoError> {
        let bad = || GeoError::Geohash(s.to_string());
        if s.is_empty() || s.len() > usize::from(MAX_PRECISION) {
            return Err(bad());
        }
        let mut bits = 0u64;
        for c in s.bytes() {
            let v = BASE32.iter().position(|&b| b == c.to_ascii_lowercase()).ok_or_else(bad)?;
            bits = bits << 5 | v as u64;
        }
        Ok(Cell { bits, precision: s.len() as u8 })
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in (0..self.precision).rev() {
            let v = (self.bits >> (u32::from(i) * 5)) & 31;
            write!(f, "{}", BASE32[v as usize] as char)?;
        }
        Ok(())
    }
}

/// The centre of the cell `geohash` names.
pub fn decode(geohash: &str) -> Result<GeoPoint, GeoError> {
    Ok(geohash.parse::<Cell>()?.center())
}

/// The location a series' tags give: `geohash=`, or `lat=` and `lon=`; `None` without them.
pub fn tagged_location(series: &crate::series::SeriesKey) -> Result<Option<GeoPoint>, GeoError> {
    if let Some(g) = series.tag("geohash") {
        return decode(g).map(Some);
    }
    match (series.tag("lat"), series.tag("lon")) {
        (Some(lat), Some(lon)) => format!("{lat},{lon}").parse().map(Some),
        (None, None) => Ok(None),
        (lat, lon) => Err(GeoError::Coordinates(format!("lat={} lon={}", lat.unwrap_or("?"), lon.unwrap_or("?")))),
    }
}

/// Parses a distance (`50km`, `500m`, `2.5 km`; a bare number is kilometres) into metres.
/// It must be positive and at most half the earth's circumference.
pub fn parse_distance_m(s: &str) -> Result<u32, GeoError> {
    let bad = || GeoError::Distance(s.to_string());
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("km") {
        (n, 1_000.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1.0)
    } else {
        (t, 1_000.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let m = v * scale;
    if !m.is_finite() || !(1.0..=MAX_DISTANCE_KM * 1_000.0).contains(&m) {
        return Err(bad());
    }
    Ok(m.round() as u32)
}

/// Speed of light in fibre, km per millisecond.
pub const FIBER_KM_PER_MS: f64 = 200.0;

/// The one-way latency the WAN emulation adds between nodes at `a` and `b`, in milliseconds:
/// `haversine_km(a, b) * route_factor / 200 + per_hop_ms` (fibre carries light at about
/// 200 km/ms; routes are longer than great circles by `route_factor`; every hop costs a fixed
/// `per_hop_ms`).
pub fn wan_one_way_ms(a: &GeoPoint, b: &GeoPoint, per_hop_ms: f64, route_factor: f64) -> f64 {
    a.distance_km(b) * route_factor / FIBER_KM_PER_MS + per_hop_ms
}

/// Checks a geohash precision (1 to 12 characters).
pub fn check_precision(precision: u8) -> Result<u8, GeoError> {
    if (1..=MAX_PRECISION).contains(&precision) { Ok(precision) } else { Err(GeoError::Precision(precision)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_geohashes() {
        // Atlanta, and a classic reference point.
        let atl = GeoPoint::new(33.75, -84.39).unwrap();
        assert_eq!(atl.geohash(5), "dn5bp");
        let p = GeoPoint::new(57.64911, 10.40744).unwrap();
        assert_eq!(p.geohash(11), "u4pruydqqvj");
        let c = decode("u4pruydqqvj").unwrap();
        assert!((c.lat - 57.64911).abs() < 1e-5 && (c.lon - 10.40744).abs() < 1e-5);
    }

    #[test]
    fn distances() {
        let atl = GeoPoint::new(33.749, -84.388).unwrap();
        let sfo = GeoPoint::new(37.7749, -122.4194).unwrap();
        let d = atl.distance_km(&sfo);
        assert!((3_400.0..3_450.0).contains(&d), "{d}");
        assert_eq!(atl.distance_km(&atl), 0.0);
        assert_eq!(parse_distance_m("50km").unwrap(), 50_000);
        assert_eq!(parse_distance_m("500m").unwrap(), 500);
        assert_eq!(parse_distance_m("2.5").unwrap(), 2_500);
        // Atlanta to San Francisco: about 3,420 km * 1.5 / 200 + 0.2 = 25.9 ms one way.
        let ms = wan_one_way_ms(&atl, &sfo, 0.2, 1.5);
        assert!((25.5..26.2).contains(&ms), "{ms}");
        assert_eq!(wan_one_way_ms(&atl, &atl, 0.2, 1.5), 0.2);
    }

    #[test]
    fn bad_input_is_explained() {
        assert!(matches!("dn5a".parse::<Cell>(), Err(GeoError::Geohash(_))), "a is not base32");
        assert!("".parse::<Cell>().is_err());
        assert!("0123456789bcd".parse::<Cell>().is_err(), "13 characters");
        assert!(matches!("91,0".parse::<GeoPoint>(), Err(GeoError::Latitude(_))));
        assert!(matches!("0,181".parse::<GeoPoint>(), Err(GeoError::Longitude(_))));
        assert!(matches!("33.7".parse::<GeoPoint>(), Err(GeoError::Coordinates(_))));
        assert!(matches!("nan,1".parse::<GeoPoint>(), Err(GeoError::Coordinates(_))));
        for d in ["0km", "-5km", "abc", "30000km", ""] {
            assert!(parse_distance_m(d).is_err(), "{d}");
        }
        assert!(check_precision(0).is_err() && check_precision(13).is_err() && check_precision(6).is_ok());
        let msg = "dn5a".parse::<Cell>().unwrap_err().to_string();
        assert!(msg.contains("dn5a") && msg.contains("0-9"), "{msg}");
    }

    proptest::proptest! {
        /// Encoding and decoding: the point lies in its cell, the geohash round-trips, and a
        /// shorter geohash is a prefix of a longer one.
        #[test]
        fn geohash_round_trips(lat in -90.0f64..90.0, lon in -180.0f64..180.0, p in 1u8..=12) {
            let pt = GeoPoint::new(lat, lon).unwrap();
            let cell = pt.cell(p);
            let (a, b, c, d) = cell.bounds();
            proptest::prop_assert!(a <= lat && lat <= c && b <= lon && lon <= d);
            let text = cell.to_string();
            proptest::prop_assert_eq!(text.len(), usize::from(p));
            proptest::prop_assert_eq!(text.parse::<Cell>().unwrap(), cell);
            proptest::prop_assert!(pt.geohash(12).starts_with(&text));
            proptest::prop_assert_eq!(cell.center().cell(p), cell);
        }

        /// Distances are symmetric, non-negative, bounded, and obey the triangle inequality;
        /// the bit distance is 0 exactly for the same cell.
        #[test]
        fn distances_are_a_metric(
            a in (-90.0f64..90.0, -180.0f64..180.0),
            b in (-90.0f64..90.0, -180.0f64..180.0),
            c in (-90.0f64..90.0, -180.0f64..180.0),
            p in 1u8..=12,
        ) {
            let [a, b, c] = [a, b, c].map(|(lat, lon)| GeoPoint::new(lat, lon).unwrap());
            let ab = a.distance_km(&b);
            proptest::prop_assert!((ab - b.distance_km(&a)).abs() < 1e-6);
            proptest::prop_assert!((0.0..=MAX_DISTANCE_KM + 1e-6).contains(&ab));
            proptest::prop_assert!(ab <= a.distance_km(&c) + c.distance_km(&b) + 1e-6);
            let (ca, cb) = (a.cell(p), b.cell(p));
            proptest::prop_assert_eq!(ca.bit_distance(&cb) == 0, ca == cb);
            proptest::prop_assert!(ca.bit_distance(&cb) <= ca.len());
        }
    }
}

//! Where a device is: latitude and longitude, and the geohash that selectors match by prefix.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Characters of a geohash stored for a device: 9 is about 5 m by 5 m.
pub const GEOHASH_LEN: usize = 9;

const BASE32: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

/// A device's position.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    /// Degrees north, -90 to 90.
    pub lat: f64,
    /// Degrees east, -180 to 180.
    pub lon: f64,
    /// Geohash of the position ([`GEOHASH_LEN`] characters).
    pub geohash: String,
}

/// A position that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid location {input:?}: {reason}; write it as LAT,LON in degrees, e.g. 33.75,-84.39")]
pub struct LocationError {
    pub input: String,
    pub reason: &'static str,
}

impl Location {
    /// The location at `lat`, `lon` (degrees).
    pub fn new(lat: f64, lon: f64) -> Result<Location, LocationError> {
        let err = |reason| LocationError { input: format!("{lat},{lon}"), reason };
        if !(-90.0..=90.0).contains(&lat) {
            return Err(err("latitude must be between -90 and 90"));
        }
        if !(-180.0..=180.0).contains(&lon) {
            return Err(err("longitude must be between -180 and 180"));
        }
        Ok(Location { lat, lon, geohash: geohash(lat, lon, GEOHASH_LEN) })
    }

    /// Checks a location that arrived from outside (its geohash must match its position).
    pub fn validate(&self) -> Result<(), LocationError> {
        let fresh = Location::new(self.lat, self.lon)?;
        if fresh.geohash != self.geohash {
            return Err(LocationError { input: self.to_string(), reason: "its geohash does not match its position" });
        }
        Ok(())
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.lat, self.lon)
    }
}

impl FromStr for Location {
    type Err = LocationError;
    fn from_str(s: &str) -> Result<Location, LocationError> {
        let err = |reason| LocationError { input: s.to_string(), reason };
        let (lat, lon) = s.split_once(',').ok_or_else(|| err("expected two numbers separated by a comma"))?;
        let lat: f64 = lat.trim().parse().map_err(|_| err("the latitude is not a number"))?;
        let lon: f64 = lon.trim().parse().map_err(|_| err("the longitude is not a number"))?;
        if !lat.is_finite() || !lon.is_finite() {
            return Err(err("coordinates must be finite"));
        }
        Location::new(lat, lon).map_err(|e| LocationError { input: s.to_string(), reason: e.reason })
    }
}

/// The geohash of `lat`, `lon` with `len` characters.
pub fn geohash(lat: f64, lon: f64, len: usize) -> String {
    let (mut lat_lo, mut lat_hi, mut lon_lo, mut lon_hi) = (-90.0f64, 90.0f64, -180.0f64, 180.0f64);
    let mut out = String::with_capacity(len);
    let (mut bits, mut value, mut even) = (0, 0usize, true);
    while out.len() < len {
        // Bits alternate longitude, latitude, starting with longitude.
        let (lo, hi, x) = if even { (&mut lon_lo, &mut lon_hi, lon) } else { (&mut lat_lo, &mut lat_hi, lat) };
        let mid = (*lo + *hi) / 2.0;
        value <<= 1;
        if x >= mid {
            value |= 1;
            *lo = mid;
        } else {
            *hi = mid;
        }
        even = !even;
        bits += 1;
        if bits == 5 {
            out.push(BASE32[value] as char);
            (bits, value) = (0, 0);
        }
    }
    out
}

/// Whether `s` consists of geohash characters only (a valid prefix for a selector).
pub fn is_geohash_prefix(s: &str) -> bool {
    !s.is_empty() && s.len() <= GEOHASH_LEN && s.bytes().all(|b| BASE32.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_geohashes() {
        // Reference values from the geohash algorithm's description.
        assert_eq!(geohash(57.64911, 10.40744, 11), "u4pruydqqvj");
        assert_eq!(geohash(33.75, -84.39, 5), "dn5bp"); // Atlanta
        assert!(is_geohash_prefix("dn5"));
        assert!(!is_geohash_prefix("dna")); // 'a' is not in the alphabet
    }

    #[test]
    fn locations_parse_and_validate() {
        let l: Location = "33.75,-84.39".parse().unwrap();
        assert_eq!(l.geohash.len(), GEOHASH_LEN);
        l.validate().unwrap();
        assert!("91,0".parse::<Location>().unwrap_err().to_string().contains("latitude"));
        assert!("atl".parse::<Location>().unwrap_err().to_string().contains("LAT,LON"));
        let forged = Location { geohash: "u4pruydqq".into(), ..l };
        assert!(forged.validate().is_err());
    }
}

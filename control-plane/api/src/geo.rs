//! Where a device is: latitude and longitude, and the geohash that selectors match by prefix.
//! Geohashes are `timeshard_proto::geo`'s (the one encoder the nodes place data by too).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use timeshard_proto::geo::{Cell, GeoPoint};

/// Characters of a geohash stored for a device: 9 is about 5 m by 5 m.
pub const GEOHASH_LEN: usize = 9;

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
        Ok(Location { lat, lon, geohash: GeoPoint { lat, lon }.geohash(GEOHASH_LEN as u8) })
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

/// Whether `s` is a prefix of a device's geohash (a valid prefix for a selector): 1 to
/// [`GEOHASH_LEN`] lowercase geohash characters.
pub fn is_geohash_prefix(s: &str) -> bool {
    s.len() <= GEOHASH_LEN && !s.bytes().any(|b| b.is_ascii_uppercase()) && s.parse::<Cell>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_geohashes() {
        // Reference values from the geohash algorithm's description.
        assert_eq!(GeoPoint { lat: 57.64911, lon: 10.40744 }.geohash(11), "u4pruydqqvj");
        assert_eq!(Location::new(33.75, -84.39).unwrap().geohash, "dn5bp8j04"); // Atlanta
        assert_eq!(Location::new(-90.0, -180.0).unwrap().geohash, "000000000");
        assert_eq!(Location::new(90.0, 180.0).unwrap().geohash, "zzzzzzzzz");
        assert!(is_geohash_prefix("dn5"));
        assert!(is_geohash_prefix("dn5bp8j04"));
        assert!(!is_geohash_prefix("dn5bp8j04b")); // longer than a device's geohash
        assert!(!is_geohash_prefix("dna")); // 'a' is not in the alphabet
        assert!(!is_geohash_prefix("DN5")); // stored geohashes are lowercase
        assert!(!is_geohash_prefix(""));
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

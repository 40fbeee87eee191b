//! Points and their identity.
//!
//! A point is `(ts, value, event)`. Its identity is all three: two points at one timestamp with
//! distinct event ids or distinct values are both kept, and writing the same point again changes
//! nothing. Stored data is therefore a set of points, so replicas merge by union and every write
//! is idempotent.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::time::{TimeRange, Timestamp};

/// One measurement.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Point {
    /// Nanoseconds since the Unix epoch.
    pub ts: Timestamp,
    /// The measured value.
    pub value: f64,
    /// Distinguishes several events at one timestamp; 0 when there is only one.
    pub event: u64,
}

impl Point {
    /// A point without an event id.
    pub fn new(ts: Timestamp, value: f64) -> Point {
        Point { ts, value, event: 0 }
    }

    /// The identity and sort key of the point.
    pub fn key(&self) -> PointKey {
        PointKey { ts: self.ts, event: self.event, value_bits: self.value.to_bits() }
    }
}

/// Identity of a point, ordered by time, then event id, then value bits. Also the cursor of a
/// paged read: a page continues strictly after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PointKey {
    pub ts: Timestamp,
    pub event: u64,
    pub value_bits: u64,
}

// Equality and order follow the identity, so NaN values compare like any other bit pattern.
impl PartialEq for Point {
    fn eq(&self, other: &Point) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Point {}
impl PartialOrd for Point {
    fn partial_cmp(&self, other: &Point) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Point {
    fn cmp(&self, other: &Point) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// SplitMix64's finalizer: a cheap, well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Point {
    /// A 64-bit hash of the point's identity.
    pub fn identity_hash(&self) -> u64 {
        mix((self.ts as u64) ^ mix(self.event ^ mix(self.value.to_bits() ^ 0x9E37_79B9_7F4A_7C15)))
    }
}

/// A digest of a set of points: the wrapping sum of their identity hashes. It does not depend
/// on order and adds up across disjoint sets, so block summaries can carry it and replicas can
/// compare what they hold without shipping the points.
pub fn set_digest<'a>(points: impl IntoIterator<Item = &'a Point>) -> u64 {
    points.into_iter().fold(0u64, |d, p| d.wrapping_add(p.identity_hash()))
}

/// Sorts points by identity and removes duplicates.
pub fn sort_dedup(points: &mut Vec<Point>) {
    points.sort_unstable();
    points.dedup();
}

/// The lower bound of a page: the first identity after `after`, or the range start.
pub fn page_start(range: &TimeRange, after: Option<PointKey>) -> PointKey {
    let range_start = PointKey { ts: range.start(), event: 0, value_bits: 0 };
    match after {
        Some(a) if a >= range_start => match a.value_bits.checked_add(1) {
            Some(v) => PointKey { value_bits: v, ..a },
            None => match a.event.checked_add(1) {
                Some(e) => PointKey { ts: a.ts, event: e, value_bits: 0 },
                None => PointKey { ts: a.ts.saturating_add(1), event: 0, value_bits: 0 },
            },
        },
        _ => range_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_keeps_distinct_events_and_values() {
        let mut pts = vec![
            Point { ts: 5, value: 1.0, event: 0 },
            Point { ts: 5, value: 1.0, event: 0 },
            Point { ts: 5, value: 2.0, event: 0 },
            Point { ts: 5, value: 1.0, event: 9 },
            Point { ts: 4, value: f64::NAN, event: 0 },
            Point { ts: 4, value: f64::NAN, event: 0 },
        ];
        sort_dedup(&mut pts);
        assert_eq!(pts.len(), 4);
        assert_eq!(pts[0].ts, 4);
        assert!(pts.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn page_start_is_strictly_after_the_cursor() {
        let r = TimeRange::new(10, 100).unwrap();
        assert_eq!(page_start(&r, None), PointKey { ts: 10, event: 0, value_bits: 0 });
        let a = PointKey { ts: 20, event: 3, value_bits: 7 };
        assert!(page_start(&r, Some(a)) > a);
        let edge = PointKey { ts: 20, event: u64::MAX, value_bits: u64::MAX };
        assert_eq!(page_start(&r, Some(edge)), PointKey { ts: 21, event: 0, value_bits: 0 });
        // A cursor before the range starts at the range.
        assert_eq!(page_start(&r, Some(PointKey { ts: 1, event: 0, value_bits: 0 })).ts, 10);
    }
}

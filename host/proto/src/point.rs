//! Points, their identity, and the shapes they travel in.
//!
//! A point is `(ts, value, event)`. Its identity is all three: two points at one timestamp with
//! distinct event ids or distinct values are both kept, and writing the same point again changes
//! nothing. Stored data is therefore a set of points, so replicas merge by union and every write
//! is idempotent.
//!
//! Points travel grouped by series ([`SeriesPoints`], and [`WriteSeries`] as a client sends
//! them), by block ([`BlockPoints`], what a replica stores) or as columns ([`ColumnBatch`], what
//! a client reads); a part's count and digest ([`PartEnd`]) stand for its points where replicas
//! compare them. The `batch` module splits batches into requests within limits.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::hash::mix;
use crate::series::SeriesKey;
use crate::time::{Quantum, TimeRange, Timestamp};

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

/// Points of one series, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoints {
    pub series: SeriesKey,
    pub points: Vec<Point>,
}

/// Points of one series as a client sends them. The series key travels as plain text and is
/// checked by the receiver, so a bad key gets an error that says what is wrong with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriteSeries {
    pub series: String,
    pub points: Vec<Point>,
}

impl From<SeriesPoints> for WriteSeries {
    fn from(s: SeriesPoints) -> WriteSeries {
        WriteSeries { series: s.series.into(), points: s.points }
    }
}

/// Points of one block (series, quantum), as a coordinator sends them to a replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockPoints {
    pub series: SeriesKey,
    pub quantum: Quantum,
    pub points: Vec<Point>,
}

/// The count and digest ([`set_digest`]) of the points a replica holds in a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEnd {
    pub count: u64,
    pub digest: u64,
}

impl PartEnd {
    /// The count and digest of `points`.
    pub fn of(points: &[Point]) -> PartEnd {
        PartEnd { count: points.len() as u64, digest: set_digest(points) }
    }

    /// Adds `points` (disjoint from those already counted).
    pub fn add(&mut self, points: &[Point]) {
        self.count += points.len() as u64;
        self.digest = self.digest.wrapping_add(set_digest(points));
    }
}

/// Points as columns, the way a client consumes a streamed read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnBatch {
    /// Nanoseconds since the Unix epoch, ascending.
    pub timestamps: Vec<i64>,
    pub values: Vec<f64>,
    pub events: Vec<u64>,
}

impl ColumnBatch {
    /// The columns of `points`.
    pub fn from_points(points: &[Point]) -> ColumnBatch {
        ColumnBatch {
            timestamps: points.iter().map(|p| p.ts).collect(),
            values: points.iter().map(|p| p.value).collect(),
            events: points.iter().map(|p| p.event).collect(),
        }
    }

    /// Points in the batch.
    pub fn len(&self) -> usize {
        self.timestamps.len()
    }

    /// Whether the batch holds no point.
    pub fn is_empty(&self) -> bool {
        self.timestamps.is_empty()
    }

    /// Whether the three columns have one length (a peer could send them otherwise).
    pub fn is_consistent(&self) -> bool {
        self.values.len() == self.timestamps.len() && self.events.len() == self.timestamps.len()
    }

    /// The batch's points, in order.
    pub fn points(&self) -> impl Iterator<Item = Point> + '_ {
        self.timestamps.iter().zip(&self.values).zip(&self.events).map(|((&ts, &value), &event)| Point {
            ts,
            value,
            event,
        })
    }

    /// The key of the last point, where a read resumed after this batch continues.
    pub fn last_key(&self) -> Option<PointKey> {
        self.points().last().map(|p| p.key())
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

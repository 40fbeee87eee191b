//! Nanosecond timestamps, half-open time ranges, and time quanta.
//!
//! A quantum is `[start, start + len)` with `start` a multiple of `len` (counted from the Unix
//! epoch); its identifier is `start`. [`quanta`] enumerates the quanta a range touches, and
//! [`Quantum::clip`] trims a range exactly to one quantum, so every point of a range falls in
//! exactly one enumerated quantum.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Nanoseconds since the Unix epoch (UTC).
pub type Timestamp = i64;

/// Nanoseconds in a second.
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// The earliest accepted timestamp: the Unix epoch.
pub const MIN_TIMESTAMP: Timestamp = 0;
/// One past the latest accepted timestamp: 2200-01-01T00:00:00Z. Keeps quantum arithmetic far
/// from overflow and catches timestamps in the wrong unit (microseconds read as nanoseconds).
pub const MAX_TIMESTAMP: Timestamp = 7_258_118_400 * NANOS_PER_SEC;

/// Shortest allowed quantum: 1 ms.
pub const MIN_QUANTUM_NS: i64 = 1_000_000;
/// Longest allowed quantum: 366 days.
pub const MAX_QUANTUM_NS: i64 = 366 * 86_400 * NANOS_PER_SEC;

/// Invalid times, ranges and quantum lengths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// A timestamp outside `[MIN_TIMESTAMP, MAX_TIMESTAMP)`.
    #[error(
        "timestamp {0} ns is out of range: timestamps are nanoseconds since the Unix epoch, from 0 up to \
         {MAX_TIMESTAMP} (2200-01-01); check the unit"
    )]
    OutOfRange(Timestamp),
    /// A range whose end is before its start.
    #[error("time range is inverted: start {start} is after end {end}")]
    Inverted { start: Timestamp, end: Timestamp },
    /// A range whose start equals its end.
    #[error("time range is empty: start and end are both {0}; the end is exclusive")]
    Empty(Timestamp),
    /// A quantum start that is not a multiple of its length.
    #[error("quantum start {start} is not a multiple of the quantum length {len} ns")]
    Unaligned { start: Timestamp, len: i64 },
    /// A quantum length outside the allowed bounds.
    #[error("quantum length {0} ns is out of bounds: use 1 ms ({MIN_QUANTUM_NS} ns) to 366 days ({MAX_QUANTUM_NS} ns)")]
    BadQuantum(i64),
}

/// Checks that `ts` is an accepted timestamp.
pub fn check_timestamp(ts: Timestamp) -> Result<Timestamp, TimeError> {
    if (MIN_TIMESTAMP..MAX_TIMESTAMP).contains(&ts) { Ok(ts) } else { Err(TimeError::OutOfRange(ts)) }
}

/// A half-open range of time `[start, end)`, non-empty, within the accepted timestamps.
/// Deserializing validates, so a range off the wire is as sound as one built with
/// [`TimeRange::new`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawRange")]
pub struct TimeRange {
    start: Timestamp,
    end: Timestamp,
}

impl TimeRange {
    /// A validated range. `end` may equal [`MAX_TIMESTAMP`] (it is exclusive).
    pub fn new(start: Timestamp, end: Timestamp) -> Result<TimeRange, TimeError> {
        check_timestamp(start)?;
        if end != MAX_TIMESTAMP {
            check_timestamp(end)?;
        }
        if end < start {
            return Err(TimeError::Inverted { start, end });
        }
        if end == start {
            return Err(TimeError::Empty(start));
        }
        Ok(TimeRange { start, end })
    }

    /// First nanosecond in the range.
    pub fn start(&self) -> Timestamp {
        self.start
    }

    /// First nanosecond after the range.
    pub fn end(&self) -> Timestamp {
        self.end
    }

    /// Whether `ts` lies in the range.
    pub fn contains(&self, ts: Timestamp) -> bool {
        self.start <= ts && ts < self.end
    }

    /// Length in nanoseconds.
    pub fn len_ns(&self) -> i64 {
        self.end - self.start
    }

    /// The overlap of two ranges, if any.
    pub fn intersect(&self, other: &TimeRange) -> Option<TimeRange> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start < end).then_some(TimeRange { start, end })
    }
}

#[derive(Deserialize)]
struct RawRange {
    start: Timestamp,
    end: Timestamp,
}

impl TryFrom<RawRange> for TimeRange {
    type Error = TimeError;
    fn try_from(r: RawRange) -> Result<Self, Self::Error> {
        TimeRange::new(r.start, r.end)
    }
}

impl fmt::Debug for TimeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start, self.end)
    }
}

/// A validated quantum length in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct QuantumLen(i64);

impl QuantumLen {
    /// The default quantum: 10 seconds, as in the seed paper.
    pub const DEFAULT: QuantumLen = QuantumLen(10 * NANOS_PER_SEC);

    /// A validated length.
    pub fn new(ns: i64) -> Result<QuantumLen, TimeError> {
        if (MIN_QUANTUM_NS..=MAX_QUANTUM_NS).contains(&ns) {
            Ok(QuantumLen(ns))
        } else {
            Err(TimeError::BadQuantum(ns))
        }
    }

    /// Nanoseconds.
    pub fn ns(self) -> i64 {
        self.0
    }

    /// The quantum containing `ts`.
    pub fn quantum_of(self, ts: Timestamp) -> Quantum {
        Quantum { start: ts.div_euclid(self.0) * self.0, len: self }
    }
}

impl Default for QuantumLen {
    fn default() -> Self {
        QuantumLen::DEFAULT
    }
}

impl TryFrom<i64> for QuantumLen {
    type Error = TimeError;
    fn try_from(ns: i64) -> Result<Self, Self::Error> {
        QuantumLen::new(ns)
    }
}

impl From<QuantumLen> for i64 {
    fn from(q: QuantumLen) -> i64 {
        q.0
    }
}

/// One time quantum: `[start, start + len)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(try_from = "RawQuantum")]
pub struct Quantum {
    /// The quantum's identifier: its first nanosecond, a multiple of `len`.
    pub start: Timestamp,
    /// Its length.
    pub len: QuantumLen,
}

impl Quantum {
    /// The quantum starting at `start`, which must be a multiple of `len`.
    pub fn at(start: Timestamp, len: QuantumLen) -> Option<Quantum> {
        (start.rem_euclid(len.ns()) == 0).then_some(Quantum { start, len })
    }

    /// First nanosecond after the quantum.
    pub fn end(&self) -> Timestamp {
        self.start.saturating_add(self.len.ns())
    }

    /// Whether `ts` falls in this quantum.
    pub fn contains(&self, ts: Timestamp) -> bool {
        self.start <= ts && ts < self.end()
    }

    /// The part of `range` inside this quantum, trimmed exactly.
    pub fn clip(&self, range: &TimeRange) -> Option<TimeRange> {
        let start = range.start.max(self.start);
        let end = range.end.min(self.end());
        (start < end).then_some(TimeRange { start, end })
    }

    /// The whole quantum as a range.
    pub fn range(&self) -> TimeRange {
        TimeRange { start: self.start, end: self.end() }
    }
}

#[derive(Deserialize)]
struct RawQuantum {
    start: Timestamp,
    len: QuantumLen,
}

impl TryFrom<RawQuantum> for Quantum {
    type Error = TimeError;
    fn try_from(q: RawQuantum) -> Result<Self, Self::Error> {
        check_timestamp(q.start)?;
        Quantum::at(q.start, q.len).ok_or(TimeError::Unaligned { start: q.start, len: q.len.ns() })
    }
}

/// The quanta that `range` touches, in time order, each with the exact part of the range in it.
pub fn quanta(range: TimeRange, len: QuantumLen) -> impl Iterator<Item = (Quantum, TimeRange)> {
    let first = len.quantum_of(range.start).start;
    let step = len.ns();
    (0..).map(move |i: i64| first + i * step).take_while(move |&start| start < range.end).map(move |start| {
        let q = Quantum { start, len };
        let part = q.clip(&range).expect("an enumerated quantum overlaps the range");
        (q, part)
    })
}

/// Number of quanta `range` touches.
pub fn quanta_count(range: TimeRange, len: QuantumLen) -> u64 {
    let first = len.quantum_of(range.start).start;
    let last = len.quantum_of(range.end - 1).start;
    ((last - first) / len.ns() + 1) as u64
}

/// Part of one block: a quantum and the part of a queried range inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockPart {
    pub quantum: Quantum,
    pub range: TimeRange,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_are_validated() {
        assert_eq!(TimeRange::new(5, 3), Err(TimeError::Inverted { start: 5, end: 3 }));
        assert_eq!(TimeRange::new(5, 5), Err(TimeError::Empty(5)));
        assert_eq!(TimeRange::new(-1, 5), Err(TimeError::OutOfRange(-1)));
        assert!(TimeRange::new(0, MAX_TIMESTAMP).is_ok());
        assert!(TimeRange::new(0, MAX_TIMESTAMP + 1).is_err());
    }

    #[test]
    fn quantum_lengths_are_bounded() {
        assert!(QuantumLen::new(0).is_err());
        assert!(QuantumLen::new(-10).is_err());
        assert!(QuantumLen::new(MAX_QUANTUM_NS + 1).is_err());
        assert_eq!(QuantumLen::new(NANOS_PER_SEC).unwrap().ns(), NANOS_PER_SEC);
    }

    #[test]
    fn seed_paper_quanta() {
        // 150 s starting mid-quantum touches 16 quanta of 10 s, trimmed at both ends.
        let r = TimeRange::new(1_700_000_005 * NANOS_PER_SEC, 1_700_000_155 * NANOS_PER_SEC).unwrap();
        let qs: Vec<_> = quanta(r, QuantumLen::DEFAULT).collect();
        assert_eq!(qs.len(), 16);
        assert_eq!(quanta_count(r, QuantumLen::DEFAULT), 16);
        assert_eq!(qs[0].0.start, 1_700_000_000 * NANOS_PER_SEC);
        assert_eq!(qs[0].1.start(), r.start());
        assert_eq!(qs[15].1.end(), r.end());
        assert_eq!(qs.iter().map(|(_, p)| p.len_ns()).sum::<i64>(), r.len_ns());
    }

    fn arb_range() -> impl Strategy<Value = TimeRange> {
        (MIN_TIMESTAMP..MAX_TIMESTAMP - 1, 1i64..1_000_000_000_000)
            .prop_map(|(s, l)| TimeRange::new(s, (s + l).min(MAX_TIMESTAMP)).unwrap())
    }

    proptest! {
        /// Every instant of a range falls in exactly one enumerated quantum part, and no
        /// instant outside the range falls in any.
        #[test]
        fn every_point_in_exactly_one_quantum(
            range in arb_range(),
            len in prop_oneof![Just(NANOS_PER_SEC * 10), MIN_QUANTUM_NS..100_000_000_000i64],
            probes in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            let len = QuantumLen::new(len).unwrap();
            let parts: Vec<_> = quanta(range, len).collect();
            prop_assert_eq!(parts.len() as u64, quanta_count(range, len));
            // Parts tile the range: contiguous, ordered, each inside its quantum.
            prop_assert_eq!(parts.first().unwrap().1.start(), range.start());
            prop_assert_eq!(parts.last().unwrap().1.end(), range.end());
            for w in parts.windows(2) {
                prop_assert_eq!(w[0].1.end(), w[1].1.start());
            }
            for (q, p) in &parts {
                prop_assert!(q.start % len.ns() == 0);
                prop_assert!(q.contains(p.start()) && q.contains(p.end() - 1));
            }
            // Probe instants in and around the range.
            for probe in probes {
                let span = (range.len_ns() as u64).saturating_mul(3).max(1);
                let ts = range.start().saturating_sub(range.len_ns()).saturating_add((probe % span) as i64);
                let hits = parts.iter().filter(|(_, p)| p.contains(ts)).count();
                prop_assert_eq!(hits, usize::from(range.contains(ts)));
                if range.contains(ts) {
                    let (q, _) = parts.iter().find(|(_, p)| p.contains(ts)).unwrap();
                    prop_assert_eq!(*q, len.quantum_of(ts));
                }
            }
        }
    }
}

//! The quantum index of a series: which spans of its quanta hold data.
//!
//! Every series keeps, beside its registration, an internal series
//! ([`key::quantum_index_series`]) holding one point per span of [`SPAN_QUANTA`] quanta that
//! holds data, at the span's start. A write adds the entries of the spans it fills first
//! ([`blocks`]); a read of a long range reads the index first and then touches only the quanta
//! of the spans listed ([`Scan`]).
//!
//! Implementation notes: an entry stands for every quantum of its span, so a scan returns a
//! superset of the quanta holding data, never fewer. Entries that do not start a quantum of the
//! series' current quantum length come from an older length, whose blocks cannot be read under
//! the current one anyway, and are skipped.

use std::collections::BTreeMap;

use crate::key;
use crate::point::BlockPoints;
use crate::point::Point;
use crate::series::SeriesKey;
use crate::time::{self, Quantum, QuantumLen, TimeRange, Timestamp};

/// Quanta one index entry stands for. One entry per quantum cost a write to the index
/// replicas every few batches of live data (a third of all batches with 4 in flight, whose
/// coordinator had not yet seen the entry acknowledged); a span of 64 makes that rare, and a
/// sparse read touches at most 64 quanta per entry.
pub const SPAN_QUANTA: i64 = 64;

/// Length of the index span of a class's quanta.
pub fn span_ns(quantum: QuantumLen) -> i64 {
    quantum.ns().saturating_mul(SPAN_QUANTA)
}

/// Start of the index span holding quantum `q`: the timestamp of its index entry.
pub fn span_of(q: &Quantum) -> Timestamp {
    let span = span_ns(q.len);
    q.start.div_euclid(span) * span
}

/// The index blocks that record `spans`, each given as (series, span start): per series one
/// block per index quantum, holding one entry per span in the order given, in (series,
/// quantum) order. Each block comes with the series it indexes, whose class and metadata id
/// say where it is stored.
pub fn blocks(spans: &[(SeriesKey, Timestamp)]) -> Vec<(SeriesKey, BlockPoints)> {
    let mut index: BTreeMap<(SeriesKey, Quantum), Vec<Point>> = BTreeMap::new();
    for (series, start) in spans {
        let q = key::index_quantum().quantum_of(*start);
        index.entry((series.clone(), q)).or_default().push(Point::new(*start, 0.0));
    }
    index
        .into_iter()
        .map(|((series, quantum), points)| {
            let block = BlockPoints { series: key::quantum_index_series(&series), quantum, points };
            (series, block)
        })
        .collect()
}

/// Finds, from a series' quantum index, the quanta of a range that may hold data: at most a
/// limit of them, in time order, and whether more follow. The caller reads the index blocks
/// [`Scan::index_parts`] names, in order, and [`Scan::push`]es each one's entries.
#[derive(Clone, Debug)]
pub struct Scan {
    scan: TimeRange,
    len: QuantumLen,
    limit: usize,
    quanta: Vec<Quantum>,
    more: bool,
}

impl Scan {
    /// A scan of `scan` over a series of quantum length `len`, finding at most `limit` quanta.
    pub fn new(scan: TimeRange, len: QuantumLen, limit: usize) -> Scan {
        Scan { scan, len, limit, quanta: Vec::new(), more: false }
    }

    /// The index blocks to read, in time order, each with the part of it to read. The index
    /// holds span starts, and the span holding the scan's start starts before it.
    pub fn index_parts(&self) -> Vec<(Quantum, TimeRange)> {
        let span = span_ns(self.len);
        let first = self.scan.start().div_euclid(span) * span;
        match TimeRange::new(first, self.scan.end()) {
            Ok(indexed) => time::quanta(indexed, key::index_quantum()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Takes the entries of the next index part, in time order. Returns true once more than
    /// the limit of quanta were found: the scan is complete and later parts need not be read.
    pub fn push(&mut self, entries: &[Point]) -> bool {
        let span_ns = span_ns(self.len);
        for entry in entries {
            if self.more {
                break;
            }
            let Ok(span) = TimeRange::new(entry.ts, entry.ts.saturating_add(span_ns)) else { continue };
            let Some(span) = span.intersect(&self.scan) else { continue };
            if Quantum::at(entry.ts, self.len).is_none() {
                continue;
            }
            self.quanta.extend(time::quanta(span, self.len).map(|(q, _)| q));
            if self.quanta.len() > self.limit {
                self.quanta.truncate(self.limit);
                self.more = true;
            }
        }
        self.more
    }

    /// The quanta found, in time order, and whether more follow beyond the limit.
    pub fn finish(self) -> (Vec<Quantum>, bool) {
        (self.quanta, self.more)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::time::NANOS_PER_SEC;

    fn len() -> QuantumLen {
        QuantumLen::DEFAULT
    }

    /// The entries of the index of a series holding `points`, as a write would add them.
    fn entries_of(points: &[Timestamp]) -> Vec<Point> {
        let spans: BTreeSet<Timestamp> = points.iter().map(|&ts| span_of(&len().quantum_of(ts))).collect();
        spans.into_iter().map(|s| Point::new(s, 0.0)).collect()
    }

    /// Runs a scan the way the coordinator does, over index `entries`.
    fn run(scan: TimeRange, limit: usize, entries: &[Point]) -> (Vec<Quantum>, bool) {
        let mut s = Scan::new(scan, len(), limit);
        for (_, part) in s.index_parts() {
            let in_part: Vec<Point> = entries.iter().filter(|e| part.contains(e.ts)).copied().collect();
            if s.push(&in_part) {
                break;
            }
        }
        s.finish()
    }

    #[test]
    fn spans_are_aligned_groups_of_quanta() {
        let span = span_ns(len());
        assert_eq!(span, 64 * 10 * NANOS_PER_SEC);
        let q = len().quantum_of(3 * span + 5 * NANOS_PER_SEC);
        assert_eq!(span_of(&q), 3 * span);
        assert_eq!(span_of(&len().quantum_of(3 * span - 1)), 2 * span);
    }

    #[test]
    fn blocks_group_entries_by_series_and_index_quantum() {
        let a: SeriesKey = "a".parse().unwrap();
        let b: SeriesKey = "b".parse().unwrap();
        let far = key::index_quantum().ns() + span_ns(len());
        let spans = vec![(b.clone(), 0), (a.clone(), far), (a.clone(), 0), (a.clone(), span_ns(len()))];
        let blocks = blocks(&spans);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0].0, a);
        assert_eq!(blocks[0].1.series, key::quantum_index_series(&a));
        assert_eq!(blocks[0].1.points, vec![Point::new(0, 0.0), Point::new(span_ns(len()), 0.0)]);
        assert_eq!(blocks[1].1.points, vec![Point::new(far, 0.0)]);
        assert_eq!(blocks[2].0, b);
        assert!(blocks.iter().all(|(_, blk)| blk.points.iter().all(|p| blk.quantum.contains(p.ts))));
    }

    #[test]
    fn a_scan_finds_the_spans_holding_data_and_stops_at_its_limit() {
        let span = span_ns(len());
        let data = [5 * span + NANOS_PER_SEC, 9 * span];
        let entries = entries_of(&data);
        let scan = TimeRange::new(5 * span + 20 * NANOS_PER_SEC, 10 * span).unwrap();
        let (quanta, more) = run(scan, usize::MAX, &entries);
        assert!(!more);
        // The first span is cut at the scan's start: its first two quanta are before it.
        assert_eq!(quanta.len(), 62 + 64);
        assert_eq!(quanta[0].start, 5 * span + 20 * NANOS_PER_SEC);
        assert_eq!(quanta[62].start, 9 * span);
        let (quanta, more) = run(scan, 70, &entries);
        assert!(more);
        assert_eq!(quanta.len(), 70);
        // Nothing indexed, nothing found.
        assert_eq!(run(scan, 10, &[]), (Vec::new(), false));
        // An entry of an older quantum length (not a quantum start) is skipped.
        assert_eq!(run(scan, 10, &[Point::new(9 * span + 1, 0.0)]), (Vec::new(), false));
    }

    proptest! {
        /// A scan returns every quantum of the range that holds data, in time order, once.
        #[test]
        fn scans_cover_every_quantum_holding_data(
            data in proptest::collection::vec(0i64..2_000_000 * NANOS_PER_SEC, 0..40),
            start in 0i64..2_000_000 * NANOS_PER_SEC,
            len_ns in 1i64..1_000_000 * NANOS_PER_SEC,
        ) {
            let scan = TimeRange::new(start, start + len_ns).unwrap();
            let (quanta, more) = run(scan, usize::MAX, &entries_of(&data));
            prop_assert!(!more);
            prop_assert!(quanta.windows(2).all(|w| w[0].start < w[1].start));
            prop_assert!(quanta.iter().all(|q| q.clip(&scan).is_some()));
            for ts in data.iter().filter(|&&ts| scan.contains(ts)) {
                prop_assert!(quanta.contains(&len().quantum_of(*ts)), "quantum of {} missing", ts);
            }
        }
    }
}

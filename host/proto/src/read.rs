//! How a coordinator pages through a range read, and which block parts a read or query covers.
//!
//! A read page starts strictly after the client's cursor ([`scan_range`]) and scans the block
//! parts of at most a limit of quanta: every quantum of a short range ([`first_parts`]), and
//! only those the quantum index lists for a long one ([`uses_index`],
//! [`crate::quantum_index::Scan`]). A [`Page`] then fetches those parts a window at a time, in
//! time order, and ends either full (continue after its last point) or at its last quantum
//! (continue after that quantum, [`cursor_after`]) or at the end of the range.
//!
//! Implementation notes: the window of parallel fetches shrinks as the points still needed
//! grow, so the points in flight stay within [`POINT_BUDGET`]; every fetch of a window may
//! return as many points as the page still needs. Points come out in identity order because
//! parts are taken in time order and each part's points are sorted.

use crate::point::{Point, PointKey, page_start};
use crate::time::{self, BlockPart, Quantum, QuantumLen, TimeRange};

/// Reads, aggregates and queries spanning more quanta than this ask the quantum index first
/// and then touch only the spans that hold data; shorter ones go straight to the blocks.
pub const INDEX_SCAN_THRESHOLD: u64 = 64;
/// Points a read may hold in flight across the quanta it fetches in parallel.
pub const POINT_BUDGET: usize = 2_000_000;
/// Most quanta one policy query or aggregate may span.
pub const MAX_QUERY_QUANTA: u64 = 1_000_000;

/// Whether a read of `range` asks the quantum index first (it spans many quanta).
pub fn uses_index(range: TimeRange, len: QuantumLen) -> bool {
    time::quanta_count(range, len) > INDEX_SCAN_THRESHOLD
}

/// What is left of `range` to scan after cursor `after`; `None` when nothing is.
pub fn scan_range(range: &TimeRange, after: Option<PointKey>) -> Option<TimeRange> {
    TimeRange::new(page_start(range, after).ts, range.end()).ok()
}

/// The parts of `range` inside each of `quanta`, skipping quanta outside it.
pub fn block_parts(quanta: impl IntoIterator<Item = Quantum>, range: &TimeRange) -> Vec<BlockPart> {
    quanta.into_iter().filter_map(|quantum| quantum.clip(range).map(|range| BlockPart { quantum, range })).collect()
}

/// The parts of `range` in its first `max` quanta, and whether more quanta follow.
pub fn first_parts(range: TimeRange, len: QuantumLen, max: usize) -> (Vec<BlockPart>, bool) {
    let all: Vec<BlockPart> = time::quanta(range, len).map(|(quantum, range)| BlockPart { quantum, range }).collect();
    let more = all.len() > max;
    (all.into_iter().take(max).collect(), more)
}

/// The cursor that continues a read at the first nanosecond after quantum `q`: greater than
/// the key of every point in `q`.
pub fn cursor_after(q: &Quantum) -> PointKey {
    PointKey { ts: q.end() - 1, event: u64::MAX, value_bits: u64::MAX }
}

/// One page of a range read, sans I/O: the caller asks for [`Page::next_fetches`], fetches
/// those block parts (each trimmed to the page's cursor and sorted), [`Page::push`]es the
/// answers in the order given, and repeats until there is nothing more to fetch; then
/// [`Page::finish`] says what the page holds and where the next one continues.
#[derive(Clone, Debug)]
pub struct Page {
    parts: Vec<BlockPart>,
    /// Quanta after the last part may hold points the page did not scan.
    more_parts: bool,
    limit: usize,
    parallelism: usize,
    /// Parts handed out by `next_fetches`.
    handed_out: usize,
    points: Vec<Point>,
    full: bool,
}

/// How a page ended.
#[derive(Clone, Debug, PartialEq)]
pub struct PageEnd {
    /// The page's points, in identity order.
    pub points: Vec<Point>,
    /// Where the next page continues, if one is needed.
    pub next: Option<PointKey>,
    /// The page scanned to the end of the range (so no point was found, if `points` is empty).
    pub reached_end: bool,
}

impl Page {
    /// A page over `parts` (in time order) returning at most `limit` points, fetching at most
    /// `parallelism` parts at once (at least 1); `more_parts` when quanta after them may hold
    /// points too.
    pub fn new(parts: Vec<BlockPart>, more_parts: bool, limit: usize, parallelism: usize) -> Page {
        Page { parts, more_parts, limit, parallelism, handed_out: 0, points: Vec::new(), full: false }
    }

    /// The parts the page scans.
    pub fn parts(&self) -> &[BlockPart] {
        &self.parts
    }

    /// The next parts to fetch at once, and the most points each fetch needs to return; `None`
    /// once the page is full or every part was handed out.
    ///
    /// # Panics
    ///
    /// If the page was made with a parallelism of 0.
    pub fn next_fetches(&mut self) -> Option<(Vec<BlockPart>, usize)> {
        let rest = &self.parts[self.handed_out..];
        if self.full || rest.is_empty() {
            return None;
        }
        let remaining = self.limit - self.points.len();
        let window = (POINT_BUDGET / remaining.max(1)).clamp(1, self.parallelism).min(rest.len());
        let fetches = rest[..window].to_vec();
        self.handed_out += window;
        Some((fetches, remaining))
    }

    /// Adds the points of the next fetched part. Returns true once the page is full: the
    /// answers of later parts are not needed.
    pub fn push(&mut self, points: Vec<Point>) -> bool {
        if !self.full {
            self.points.extend(points);
            if self.points.len() >= self.limit {
                self.points.truncate(self.limit);
                self.full = true;
            }
        }
        self.full
    }

    /// What the page holds and where the next one continues: after its last point if it is
    /// full, after its last quantum if later quanta were left for the next page.
    pub fn finish(self) -> PageEnd {
        let next = if self.full {
            self.points.last().map(Point::key)
        } else if self.more_parts
            && let Some(last) = self.parts.last()
        {
            Some(cursor_after(&last.quantum))
        } else {
            return PageEnd { points: self.points, next: None, reached_end: true };
        };
        PageEnd { points: self.points, next, reached_end: false }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::point::Point;
    use crate::quantum_index::{self, Scan};
    use crate::time::NANOS_PER_SEC;

    const LEN: QuantumLen = QuantumLen::DEFAULT;

    /// What a replica fetch of `part` answers after the page's cursor: sorted, at most `limit`.
    fn fetch(data: &BTreeSet<Point>, part: &BlockPart, after: Option<PointKey>, limit: usize) -> Vec<Point> {
        data.iter()
            .filter(|p| part.range.contains(p.ts) && after.is_none_or(|a| p.key() > a))
            .take(limit)
            .copied()
            .collect()
    }

    struct Limits {
        points: usize,
        quanta: usize,
        parallelism: usize,
    }

    /// One page the way the coordinator reads it; also the parts it scanned.
    fn read_page(
        data: &BTreeSet<Point>,
        range: &TimeRange,
        after: Option<PointKey>,
        limits: &Limits,
    ) -> (PageEnd, Vec<BlockPart>) {
        let Some(scan) = scan_range(range, after) else {
            return (PageEnd { points: Vec::new(), next: None, reached_end: true }, Vec::new());
        };
        let (parts, more) = if uses_index(scan, LEN) {
            let spans: BTreeSet<i64> = data.iter().map(|p| quantum_index::span_of(&LEN.quantum_of(p.ts))).collect();
            let entries: Vec<Point> = spans.into_iter().map(|s| Point::new(s, 0.0)).collect();
            let mut index = Scan::new(scan, LEN, limits.quanta);
            for (_, part) in index.index_parts() {
                let in_part: Vec<Point> = entries.iter().filter(|e| part.contains(e.ts)).copied().collect();
                if index.push(&in_part) {
                    break;
                }
            }
            let (quanta, more) = index.finish();
            (block_parts(quanta, &scan), more)
        } else {
            first_parts(scan, LEN, limits.quanta)
        };
        let mut page = Page::new(parts, more, limits.points, limits.parallelism);
        let scanned = page.parts().to_vec();
        while let Some((fetches, remaining)) = page.next_fetches() {
            assert!(fetches.len() <= limits.parallelism);
            for part in &fetches {
                if page.push(fetch(data, part, after, remaining)) {
                    break;
                }
            }
        }
        (page.finish(), scanned)
    }

    #[test]
    fn a_page_continues_after_its_last_point_or_its_last_quantum() {
        let data: BTreeSet<Point> = (0..30).map(|i| Point::new(i * NANOS_PER_SEC, i as f64)).collect();
        let range = TimeRange::new(0, 30 * NANOS_PER_SEC).unwrap();
        // Full at 4 points.
        let limits = Limits { points: 4, quanta: 10, parallelism: 2 };
        let (end, _) = read_page(&data, &range, None, &limits);
        assert_eq!(end.points.len(), 4);
        assert_eq!(end.next, Some(Point::new(3 * NANOS_PER_SEC, 3.0).key()));
        assert!(!end.reached_end);
        // Two quanta per page: the next page starts at the third quantum.
        let limits = Limits { points: 100, quanta: 2, parallelism: 2 };
        let (end, scanned) = read_page(&data, &range, None, &limits);
        assert_eq!(end.points.len(), 20);
        assert_eq!(scanned.len(), 2);
        let next = end.next.unwrap();
        assert_eq!(page_start(&range, Some(next)).ts, 20 * NANOS_PER_SEC);
        // The last page reaches the end.
        let (end, _) = read_page(&data, &range, Some(next), &limits);
        assert_eq!(end.points.len(), 10);
        assert_eq!(end, PageEnd { points: end.points.clone(), next: None, reached_end: true });
    }

    #[test]
    fn fetch_windows_keep_points_in_flight_within_the_budget() {
        let parts = first_parts(TimeRange::new(0, 100 * NANOS_PER_SEC).unwrap(), LEN, 100).0;
        let mut page = Page::new(parts.clone(), false, 1_000_000, 64);
        assert_eq!(page.next_fetches().map(|(f, n)| (f.len(), n)), Some((2, 1_000_000)));
        let mut page = Page::new(parts.clone(), false, 100, 4);
        assert_eq!(page.next_fetches().map(|(f, n)| (f.len(), n)), Some((4, 100)));
        assert_eq!(page.next_fetches().map(|(f, n)| (f.len(), n)), Some((4, 100)));
        assert_eq!(page.next_fetches().map(|(f, n)| (f.len(), n)), Some((2, 100)));
        assert_eq!(page.next_fetches(), None);
        // Even a page needing more points than the budget fetches one part at a time.
        let mut page = Page::new(parts, false, POINT_BUDGET * 2, 4);
        assert_eq!(page.next_fetches().map(|(f, _)| f.len()), Some(1));
    }

    #[test]
    fn a_full_page_takes_no_more_points() {
        let parts = first_parts(TimeRange::new(0, 20 * NANOS_PER_SEC).unwrap(), LEN, 10).0;
        let mut page = Page::new(parts, false, 2, 4);
        let (fetches, remaining) = page.next_fetches().unwrap();
        assert_eq!((fetches.len(), remaining), (2, 2));
        assert!(page.push(vec![Point::new(1, 1.0), Point::new(2, 2.0), Point::new(3, 3.0)]));
        assert!(page.push(vec![Point::new(10 * NANOS_PER_SEC, 4.0)]));
        assert_eq!(page.next_fetches(), None);
        let end = page.finish();
        assert_eq!(end.points, vec![Point::new(1, 1.0), Point::new(2, 2.0)]);
        assert_eq!(end.next, Some(Point::new(2, 2.0).key()));
    }

    #[test]
    fn query_parts_are_trimmed_to_the_range() {
        let range = TimeRange::new(5 * NANOS_PER_SEC, 25 * NANOS_PER_SEC).unwrap();
        let quanta = [LEN.quantum_of(0), LEN.quantum_of(20 * NANOS_PER_SEC), LEN.quantum_of(40 * NANOS_PER_SEC)];
        let parts = block_parts(quanta, &range);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].range, TimeRange::new(5 * NANOS_PER_SEC, 10 * NANOS_PER_SEC).unwrap());
        assert_eq!(parts[1].range, TimeRange::new(20 * NANOS_PER_SEC, 25 * NANOS_PER_SEC).unwrap());
        assert!(uses_index(TimeRange::new(0, 641 * NANOS_PER_SEC).unwrap(), LEN));
        assert!(!uses_index(TimeRange::new(0, 640 * NANOS_PER_SEC).unwrap(), LEN));
    }

    #[test]
    fn the_quantum_cursor_starts_the_next_quantum() {
        let q = LEN.quantum_of(40 * NANOS_PER_SEC);
        let range = TimeRange::new(0, 100 * NANOS_PER_SEC).unwrap();
        assert_eq!(page_start(&range, Some(cursor_after(&q))), PointKey { ts: q.end(), event: 0, value_bits: 0 });
        assert!(Point { ts: q.end() - 1, value: f64::NAN, event: u64::MAX }.key() <= cursor_after(&q));
        assert_eq!(scan_range(&TimeRange::new(0, q.end()).unwrap(), Some(cursor_after(&q))), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        /// Paging through a range, sparse (through the quantum index) or dense, returns every
        /// point of the range exactly once and in order, and a page that ends at its last
        /// quantum is followed by one that starts after it: no quantum is skipped or scanned
        /// twice across pages.
        #[test]
        fn pages_never_skip_or_repeat(
            times in proptest::collection::vec(
                // Points at and next to quantum boundaries as well as anywhere.
                (0i64..2_000, prop_oneof![Just(0), Just(1), Just(LEN.ns() - 1), 0..LEN.ns()])
                    .prop_map(|(q, offset)| q * LEN.ns() + offset),
                0..60,
            ),
            events in proptest::collection::vec(0u64..3, 60),
            start in prop_oneof![0i64..10_000 * NANOS_PER_SEC, (0i64..1_000).prop_map(|q| q * LEN.ns())],
            len_ns in prop_oneof![1i64..10_000 * NANOS_PER_SEC, (1i64..1_000).prop_map(|q| q * LEN.ns())],
            points in 1usize..40,
            quanta in 1usize..80,
            parallelism in 1usize..8,
        ) {
            let data: BTreeSet<Point> = times
                .iter()
                .zip(&events)
                .map(|(&ts, &event)| Point { ts, value: (ts % 7) as f64, event })
                .collect();
            let range = TimeRange::new(start, start + len_ns).unwrap();
            let limits = Limits { points, quanta, parallelism };
            let mut got = Vec::new();
            let mut after = None;
            let mut last_scanned: Option<(Quantum, bool)> = None;
            for _ in 0..=(data.len() + time::quanta_count(range, LEN) as usize) {
                let (end, scanned) = read_page(&data, &range, after, &limits);
                if let (Some((last, true)), Some(first)) = (last_scanned, scanned.first()) {
                    // The previous page stopped at its last quantum: this one starts after it,
                    // at the very next quantum when it scans every quantum.
                    prop_assert!(first.quantum.start >= last.end());
                    if !uses_index(scan_range(&range, after).unwrap(), LEN) {
                        prop_assert_eq!(first.quantum.start, last.end());
                    }
                }
                prop_assert!(end.points.len() <= points);
                got.extend(end.points.iter().copied());
                let Some(next) = end.next else { break };
                prop_assert!(after.is_none_or(|a| next > a), "the cursor moves forward");
                let ended_at_quantum = end.points.len() < points;
                last_scanned = scanned.last().map(|p| (p.quantum, ended_at_quantum));
                after = Some(next);
            }
            let want: Vec<Point> = data.iter().filter(|p| range.contains(p.ts)).copied().collect();
            prop_assert_eq!(got, want);
        }
    }
}

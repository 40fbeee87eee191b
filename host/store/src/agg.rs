//! Block summaries and window aggregates, as pure functions over sorted points.
//!
//! A [`Summary`] is what a sealed block carries (count, min, max, sum, first, last). It is always
//! computed by [`Summary::of`] over the block's points in identity order, so a summary rebuilt
//! from the raw points is bit-for-bit the stored one. [`Aggregator`] turns points, or whole
//! summaries when a block lies inside one window, into [`WindowAggregate`]s.
//!
//! NaN values: min and max ignore them (unless every value is NaN), sum and mean become NaN.

use timeshard_proto::window::Grid;
use timeshard_proto::{Point, TimeRange, Timestamp};

/// Summary of a set of points.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub count: u64,
    pub min: f64,
    pub max: f64,
    /// Sum of the values, added in identity order.
    pub sum: f64,
    /// The point with the smallest identity.
    pub first: Point,
    /// The point with the largest identity.
    pub last: Point,
    /// [`timeshard_proto::point::set_digest`] of the points: replicas compare it to tell
    /// whether they hold the same points.
    pub digest: u64,
}

// Bitwise, so summaries holding NaN still compare equal to their recomputation.
impl PartialEq for Summary {
    fn eq(&self, o: &Summary) -> bool {
        self.count == o.count
            && self.min.to_bits() == o.min.to_bits()
            && self.max.to_bits() == o.max.to_bits()
            && self.sum.to_bits() == o.sum.to_bits()
            && self.first == o.first
            && self.last == o.last
            && self.digest == o.digest
    }
}

impl Summary {
    /// The summary of `points`, which must be sorted by identity; `None` when empty.
    pub fn of(points: &[Point]) -> Option<Summary> {
        let (first, last) = (*points.first()?, *points.last()?);
        let mut min = f64::NAN;
        let mut max = f64::NAN;
        let mut sum = 0.0;
        let mut digest = 0u64;
        for p in points {
            min = min.min(p.value);
            max = max.max(p.value);
            sum += p.value;
            digest = digest.wrapping_add(p.identity_hash());
        }
        Some(Summary { count: points.len() as u64, min, max, sum, first, last, digest })
    }

    /// The summary of the union of two disjoint point sets.
    pub fn merge(&self, o: &Summary) -> Summary {
        Summary {
            count: self.count + o.count,
            min: self.min.min(o.min),
            max: self.max.max(o.max),
            sum: self.sum + o.sum,
            first: self.first.min(o.first),
            last: self.last.max(o.last),
            digest: self.digest.wrapping_add(o.digest),
        }
    }
}

/// Aggregates of one window (`start..end` trimmed to the queried range): the type that also
/// crosses the network, so a node hands the store's answer on unchanged.
pub use timeshard_proto::window::WindowStats as WindowAggregate;

/// Builds window aggregates from points and summaries fed in time order.
#[derive(Debug)]
pub struct Aggregator {
    range: TimeRange,
    grid: Grid,
    current: Option<(i64, Summary)>,
    out: Vec<WindowAggregate>,
}

impl Aggregator {
    /// Windows on `grid` (checked: see [`timeshard_proto::window::check_windows`]) trimmed
    /// to `range`.
    pub fn new(range: TimeRange, grid: Grid) -> Aggregator {
        Aggregator { range, grid, current: None, out: Vec::new() }
    }

    /// The window index of `ts`.
    pub fn window_of(&self, ts: Timestamp) -> i64 {
        self.grid.index(ts)
    }

    /// Whether every instant of `[start, end)` lies in the range and in one window, so a
    /// summary of it can be used whole.
    pub fn fits_one_window(&self, start: Timestamp, end: Timestamp) -> bool {
        start >= self.range.start() && end <= self.range.end() && self.window_of(start) == self.window_of(end - 1)
    }

    /// Adds points sorted by identity, later than everything fed before. Points outside the
    /// range are ignored.
    pub fn push_points(&mut self, points: &[Point]) {
        let mut i = 0;
        while i < points.len() {
            let p = points[i];
            if !self.range.contains(p.ts) {
                i += 1;
                continue;
            }
            let w = self.window_of(p.ts);
            let w_end = self.grid.start(w.saturating_add(1));
            let mut j = i + 1;
            while j < points.len() && points[j].ts < w_end && self.range.contains(points[j].ts) {
                j += 1;
            }
            if let Some(s) = Summary::of(&points[i..j]) {
                self.push_summary(w, &s);
            }
            i = j;
        }
    }

    /// Adds a summary of points that all lie in window `window` and in the range, later than
    /// everything fed before.
    pub fn push_summary(&mut self, window: i64, s: &Summary) {
        match &mut self.current {
            Some((w, acc)) if *w == window => *acc = acc.merge(s),
            _ => {
                self.flush();
                self.current = Some((window, *s));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((w, s)) = self.current.take() {
            let start = self.grid.start(w).max(self.range.start());
            let end = self.grid.start(w.saturating_add(1)).min(self.range.end());
            self.out.push(WindowAggregate {
                start,
                end,
                count: s.count,
                min: s.min,
                max: s.max,
                sum: s.sum,
                first: s.first.value,
                first_ts: s.first.ts,
                last: s.last.value,
                last_ts: s.last.ts,
                digest: s.digest,
            });
        }
    }

    /// The aggregates of the windows that held points, in time order.
    pub fn finish(mut self) -> Vec<WindowAggregate> {
        self.flush();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_sorted_points() {
        let pts = [Point::new(1, 3.0), Point::new(2, -1.0), Point::new(5, 4.0)];
        let s = Summary::of(&pts).unwrap();
        assert_eq!(s.count, 3);
        assert_eq!((s.min, s.max, s.sum), (-1.0, 4.0, 6.0));
        assert_eq!((s.first.ts, s.last.ts), (1, 5));
        assert!(Summary::of(&[]).is_none());
        let nan = Summary::of(&[Point::new(1, f64::NAN), Point::new(2, 1.0)]).unwrap();
        assert_eq!((nan.min, nan.max), (1.0, 1.0));
        assert!(nan.sum.is_nan());
        assert_eq!(nan, nan, "summaries compare bitwise, NaN included");
    }

    #[test]
    fn windows_are_aligned_and_trimmed() {
        let range = TimeRange::new(5, 35).unwrap();
        let mut a = Aggregator::new(range, Grid::epoch(10));
        let pts: Vec<Point> = (0..40).map(|t| Point::new(t, t as f64)).collect();
        a.push_points(&pts);
        let w = a.finish();
        assert_eq!(w.len(), 4);
        assert_eq!((w[0].start, w[0].end, w[0].count), (5, 10, 5));
        assert_eq!((w[3].start, w[3].end, w[3].count), (30, 35, 5));
        assert_eq!((w[1].min, w[1].max, w[1].sum, w[1].mean()), (10.0, 19.0, 145.0, 14.5));
        assert_eq!((w[1].first, w[1].last), (10.0, 19.0));
        assert!(a_fits());
        fn a_fits() -> bool {
            let a = Aggregator::new(TimeRange::new(0, 100).unwrap(), Grid::epoch(10));
            a.fits_one_window(10, 20) && !a.fits_one_window(10, 21)
        }
    }
}

//! Window aggregates as they cross the network, and how the coordinator merges the windows of
//! several quanta.
//!
//! Windows lie on a [`Grid`]: `[origin + w * width, origin + (w + 1) * width)`, aligned to the
//! Unix epoch unless asked otherwise (PromQL's steps end where the query says), and trimmed
//! to the queried range. A window wider than a quantum is reported by the owner of each
//! quantum for its part; [`merge_windows`] adds those parts up.

use serde::{Deserialize, Serialize};

use crate::time::{TimeRange, Timestamp};

/// Most windows one aggregate query may return.
pub const MAX_WINDOWS: u64 = 100_000;

/// Where windows lie: `[origin_ns + w * width_ns, origin_ns + (w + 1) * width_ns)` for every
/// integer `w`, with `0 <= origin_ns < width_ns` (see [`Grid::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grid {
    pub width_ns: i64,
    pub origin_ns: i64,
}

impl Grid {
    /// Windows of `width_ns` aligned to the epoch.
    pub fn epoch(width_ns: i64) -> Grid {
        Grid { width_ns, origin_ns: 0 }
    }

    /// Windows of `width_ns` with a boundary at `boundary_ns`; the origin is reduced into
    /// `[0, width_ns)`. A width below 1 is kept as given, for [`check_windows`] to refuse.
    pub fn new(width_ns: i64, boundary_ns: i64) -> Grid {
        Grid { width_ns, origin_ns: if width_ns > 0 { boundary_ns.rem_euclid(width_ns) } else { 0 } }
    }

    /// The index of the window holding `ts`.
    pub fn index(&self, ts: Timestamp) -> i64 {
        let width = self.width_ns.max(1);
        // An origin outside [0, width) (from a peer) is reduced first, so this never overflows.
        ts.div_euclid(width) + (ts.rem_euclid(width) - self.origin_ns.rem_euclid(width)).div_euclid(width)
    }

    /// Where window `index` starts (saturating).
    pub fn start(&self, index: i64) -> Timestamp {
        index.saturating_mul(self.width_ns.max(1)).saturating_add(self.origin_ns.rem_euclid(self.width_ns.max(1)))
    }
}

/// Aggregates of one window.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct WindowStats {
    /// The window, trimmed to the queried range.
    pub start: Timestamp,
    pub end: Timestamp,
    pub count: u64,
    pub min: f64,
    pub max: f64,
    pub sum: f64,
    /// Value and time of the first point of the window (identity order).
    pub first: f64,
    pub first_ts: Timestamp,
    /// Value and time of the last point of the window.
    pub last: f64,
    pub last_ts: Timestamp,
    /// Digest of the window's points (see [`crate::point::set_digest`]).
    pub digest: u64,
}

// Bitwise, so replicas that hold the same points compare equal even with NaN values.
impl PartialEq for WindowStats {
    fn eq(&self, o: &WindowStats) -> bool {
        (self.start, self.end, self.count, self.first_ts, self.last_ts, self.digest)
            == (o.start, o.end, o.count, o.first_ts, o.last_ts, o.digest)
            && [self.min, self.max, self.sum, self.first, self.last].map(f64::to_bits)
                == [o.min, o.max, o.sum, o.first, o.last].map(f64::to_bits)
    }
}

impl WindowStats {
    /// The mean value.
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// Adds the statistics of a later, disjoint part of the same window.
    fn absorb(&mut self, later: &WindowStats) {
        self.count += later.count;
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.sum += later.sum;
        if later.first_ts < self.first_ts {
            (self.first, self.first_ts) = (later.first, later.first_ts);
        }
        if later.last_ts >= self.last_ts {
            (self.last, self.last_ts) = (later.last, later.last_ts);
        }
        self.digest = self.digest.wrapping_add(later.digest);
    }
}

/// Checks a grid against a range: a positive width, an origin within it, and at most
/// [`MAX_WINDOWS`] windows.
pub fn check_windows(range: &TimeRange, grid: Grid) -> Result<u64, String> {
    let Grid { width_ns, origin_ns } = grid;
    if width_ns <= 0 {
        return Err(format!("window width {width_ns} ns must be positive"));
    }
    if !(0..width_ns).contains(&origin_ns) {
        return Err(format!("window origin {origin_ns} ns must lie in [0, {width_ns})"));
    }
    let first = grid.index(range.start());
    let last = grid.index(range.end() - 1);
    let windows = (last - first + 1) as u64;
    if windows > MAX_WINDOWS {
        return Err(format!(
            "{windows} windows of {width_ns} ns fit the range; at most {MAX_WINDOWS} may be asked at once: use wider \
             windows or a shorter range"
        ));
    }
    Ok(windows)
}

/// Merges per-quantum window lists, given in time order, into one list for `range`.
pub fn merge_windows(
    range: &TimeRange,
    grid: Grid,
    parts: impl IntoIterator<Item = Vec<WindowStats>>,
) -> Vec<WindowStats> {
    let mut out: Vec<WindowStats> = Vec::new();
    for w in parts.into_iter().flatten() {
        let index = grid.index(w.start);
        match out.last_mut() {
            Some(last) if grid.index(last.start) == index => last.absorb(&w),
            _ => {
                let mut w = w;
                w.start = grid.start(index).max(range.start());
                w.end = grid.start(index.saturating_add(1)).min(range.end());
                out.push(w);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::point::{Point, set_digest};
    use proptest::prelude::*;

    /// Window stats computed directly from points, the reference.
    fn direct(points: &[Point], range: &TimeRange, grid: Grid) -> Vec<WindowStats> {
        let mut out: Vec<WindowStats> = Vec::new();
        for p in points.iter().filter(|p| range.contains(p.ts)) {
            let one = WindowStats {
                start: p.ts,
                end: p.ts + 1,
                count: 1,
                min: p.value,
                max: p.value,
                sum: p.value,
                first: p.value,
                first_ts: p.ts,
                last: p.value,
                last_ts: p.ts,
                digest: set_digest([p]),
            };
            out = merge_windows(range, grid, [out, vec![one]]);
        }
        out
    }

    proptest! {
        /// Splitting points into quanta and merging their windows gives the windows of all points.
        #[test]
        fn merged_quanta_equal_the_whole(
            ts in proptest::collection::btree_set(0i64..10_000, 1..200),
            width in 1i64..3_000,
            boundary in -5_000i64..5_000,
            quantum in 1i64..2_000,
            (start, len) in (0i64..5_000, 1i64..10_000),
        ) {
            let points: Vec<Point> = ts.iter().map(|&t| Point::new(t, (t % 97) as f64)).collect();
            let range = TimeRange::new(start, start + len).unwrap();
            let grid = Grid::new(width, boundary);
            let whole = direct(&points, &range, grid);
            let mut parts = Vec::new();
            let mut i = 0;
            while i < points.len() {
                let q = points[i].ts.div_euclid(quantum);
                let j = points[i..].iter().position(|p| p.ts.div_euclid(quantum) != q).map_or(points.len(), |k| i + k);
                parts.push(direct(&points[i..j], &range, grid));
                i = j;
            }
            let merged = merge_windows(&range, grid, parts);
            prop_assert_eq!(merged.len(), whole.len());
            for (m, w) in merged.iter().zip(&whole) {
                prop_assert_eq!((m.start, m.end, m.count, m.first_ts, m.last_ts, m.digest), (w.start, w.end, w.count, w.first_ts, w.last_ts, w.digest));
                prop_assert_eq!((m.min, m.max), (w.min, w.max));
                prop_assert!((m.sum - w.sum).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn window_counts_are_bounded() {
        let day = TimeRange::new(0, 86_400_000_000_000).unwrap();
        assert_eq!(check_windows(&day, Grid::epoch(60_000_000_000)), Ok(1440));
        // Shifted by half a window: one more, cut at each end.
        assert_eq!(check_windows(&day, Grid::new(60_000_000_000, 30_000_000_000)), Ok(1441));
        assert!(check_windows(&day, Grid::epoch(1_000)).is_err());
        assert!(check_windows(&day, Grid::epoch(0)).is_err());
        assert!(check_windows(&day, Grid { width_ns: 10, origin_ns: 10 }).is_err(), "an origin past the width");
    }

    proptest! {
        /// Every timestamp lies in the window its index names, whatever the origin.
        #[test]
        fn a_grid_puts_each_instant_in_its_window(
            ts in crate::time::MIN_TIMESTAMP..crate::time::MAX_TIMESTAMP,
            width in 1i64..crate::time::MAX_TIMESTAMP,
            boundary in any::<i64>(),
        ) {
            let grid = Grid::new(width, boundary);
            prop_assert!((0..width).contains(&grid.origin_ns));
            prop_assert_eq!((i128::from(boundary) - i128::from(grid.origin_ns)).rem_euclid(i128::from(width)), 0);
            let w = grid.index(ts);
            let (start, end) = (grid.start(w), grid.start(w + 1));
            prop_assert!(start <= ts && ts < end, "{} in [{}, {})", ts, start, end);
        }
    }
}

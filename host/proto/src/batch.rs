//! Splitting a batch of points into write requests a node accepts.
//!
//! A node refuses a write that holds more points or more series than its [`Limits`]
//! (`max_batch_points`, `max_batch_series`: see [`Request::validate`]). Whoever sends writes
//! splits them first with [`split`]: the SDK for a client's batch, the node's HTTP side for what
//! line protocol and remote write decode. Both bounds count, so a batch of many series with one
//! point each is split as surely as one long series.
//!
//! [`Limits`]: crate::wire::Limits
//! [`Request::validate`]: crate::wire::Request::validate

use crate::point::{Point, SeriesPoints};

/// Splits `batch` into batches of at most `max_points` points and at most `max_series` series
/// entries each (a bound of 0 counts as 1). Every point is kept, in order; a series larger than
/// the room left is continued in the next batch; series without points are left out. A batch is
/// closed only when it is full by one of the bounds, so all but the last are full.
pub fn split(batch: Vec<SeriesPoints>, max_points: usize, max_series: usize) -> Vec<Vec<SeriesPoints>> {
    let (max_points, max_series) = (max_points.max(1), max_series.max(1));
    let mut out = Vec::new();
    let mut current: Vec<SeriesPoints> = Vec::new();
    let mut points = 0;
    for SeriesPoints { series, points: all } in batch {
        let mut rest = all.into_iter();
        while rest.len() > 0 {
            if points == max_points || current.len() == max_series {
                out.push(std::mem::take(&mut current));
                points = 0;
            }
            let room = max_points - points;
            if rest.len() <= room {
                // The common case: the series fits whole and keeps its allocation.
                points += rest.len();
                current.push(SeriesPoints { series, points: rest.collect() });
                break;
            }
            let part: Vec<Point> = rest.by_ref().take(room).collect();
            points += part.len();
            current.push(SeriesPoints { series: series.clone(), points: part });
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::SeriesKey;
    use crate::wire::{Limits, Request, WriteSeries};

    fn series(name: &str, n: usize) -> SeriesPoints {
        SeriesPoints {
            series: name.parse().unwrap(),
            points: (0..n).map(|i| Point::new(1_700_000_000_000_000_000 + i as i64, i as f64)).collect(),
        }
    }

    fn shape(out: &[Vec<SeriesPoints>]) -> Vec<Vec<usize>> {
        out.iter().map(|c| c.iter().map(|s| s.points.len()).collect()).collect()
    }

    /// Whether a node with `limits` accepts each batch as one write.
    fn accepted(out: &[Vec<SeriesPoints>], limits: &Limits) -> bool {
        out.iter().all(|c| {
            let batch = c.iter().cloned().map(WriteSeries::from).collect();
            Request::Write { batch }.validate(limits).is_ok()
        })
    }

    #[test]
    fn splits_by_points_and_by_series() {
        let out = split(vec![series("a", 7), series("b", 2), series("c", 1)], 4, 2);
        assert_eq!(shape(&out), vec![vec![4], vec![3, 1], vec![1, 1]]);
        let a: Vec<Point> =
            out.iter().flatten().filter(|s| s.series.as_str() == "a").flat_map(|s| s.points.clone()).collect();
        assert_eq!(a, series("a", 7).points);
        assert!(split(Vec::new(), 4, 2).is_empty());
        assert!(split(vec![series("empty", 0)], 4, 2).is_empty());
        // A bound of 0 would never make progress: it counts as 1.
        assert_eq!(shape(&split(vec![series("a", 2)], 0, 0)), vec![vec![1], vec![1]]);
    }

    /// 10,001 series of one point each: within the point limit, over the series limit. The
    /// SDK used to send them as one write, which the node refused (`BatchTooLarge`).
    #[test]
    fn more_series_than_the_limit_split_even_when_the_points_fit() {
        let limits = Limits::default();
        let batch: Vec<SeriesPoints> = (0..10_001).map(|i| series(&format!("m{{id={i}}}"), 1)).collect();
        let one = Request::Write { batch: batch.iter().cloned().map(WriteSeries::from).collect() };
        assert_eq!(one.validate(&limits).unwrap_err().code(), crate::wire::ErrorCode::BatchTooLarge);
        let out = split(batch, limits.max_batch_points as usize, limits.max_batch_series as usize);
        assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), vec![10_000, 1]);
        assert!(accepted(&out, &limits));
    }

    proptest! {
        /// Whatever the batch and the bounds: every batch within both bounds, all but the last
        /// full by one of them, and every series' points kept in order.
        #[test]
        fn batches_stay_within_both_bounds_and_keep_every_point(
            sizes in proptest::collection::vec(0usize..40, 0..30),
            max_points in 1usize..50,
            max_series in 1usize..8,
        ) {
            let batch: Vec<SeriesPoints> =
                sizes.iter().enumerate().map(|(i, &n)| series(&format!("m{{id={i}}}"), n)).collect();
            let out = split(batch.clone(), max_points, max_series);
            let limits = Limits {
                max_batch_points: max_points as u32,
                max_batch_series: max_series as u32,
                ..Limits::default()
            };
            prop_assert!(accepted(&out, &limits));
            for (i, c) in out.iter().enumerate() {
                let points: usize = c.iter().map(|s| s.points.len()).sum();
                prop_assert!(c.iter().all(|s| !s.points.is_empty()));
                prop_assert!(i + 1 == out.len() || points == max_points || c.len() == max_series);
            }
            for s in &batch {
                let got: Vec<Point> = out
                    .iter()
                    .flatten()
                    .filter(|p| p.series == s.series)
                    .flat_map(|p| p.points.iter().copied())
                    .collect();
                prop_assert_eq!(&got, &s.points);
            }
            let at = |k: &SeriesKey| batch.iter().position(|s| &s.series == k).unwrap();
            let order: Vec<usize> = out.iter().flatten().map(|s| at(&s.series)).collect();
            prop_assert!(order.windows(2).all(|w| w[0] <= w[1]), "series keep their order");
        }
    }
}

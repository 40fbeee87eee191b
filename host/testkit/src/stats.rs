//! Order statistics for the demo and the benchmarks: the one definition of a percentile
//! (nearest rank) and of a median that every figure uses, and latency samples summarized with
//! them.

use std::cmp::Ordering;
use std::time::Duration;

/// A value that order statistics can rank: floats in their total order, integers as usual.
pub trait Ranked: Copy + Default {
    /// The order values are ranked in.
    fn rank_cmp(&self, other: &Self) -> Ordering;
}

impl Ranked for f64 {
    fn rank_cmp(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

impl Ranked for u64 {
    fn rank_cmp(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// The `p`-th percentile (0..=100) of `values` by nearest rank: the smallest value with at
/// least `p`% of the values at or below it. Zero when there are no values.
pub fn percentile<T: Ranked>(values: &[T], p: f64) -> T {
    if values.is_empty() {
        return T::default();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(T::rank_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The median: the 50th [`percentile`] (of an even number of values, the lower middle one).
pub fn median<T: Ranked>(values: &[T]) -> T {
    percentile(values, 50.0)
}

/// A set of measured latencies.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    ms: Vec<f64>,
}

impl Latencies {
    /// Records one latency.
    pub fn push(&mut self, d: Duration) {
        self.ms.push(d.as_secs_f64() * 1e3);
    }

    /// Adds every latency of `other`.
    pub fn extend(&mut self, other: &Latencies) {
        self.ms.extend_from_slice(&other.ms);
    }

    /// Number recorded.
    pub fn len(&self) -> usize {
        self.ms.len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.ms.is_empty()
    }

    /// The `p`-th [`percentile`] (0..=100) in milliseconds.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        percentile(&self.ms, p)
    }

    /// Mean in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        if self.ms.is_empty() { 0.0 } else { self.ms.iter().sum::<f64>() / self.ms.len() as f64 }
    }
}

/// Rounds for JSON output (microsecond resolution is plenty for milliseconds).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut l = Latencies::default();
        for ms in 1..=100 {
            l.push(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile_ms(50.0), 50.0);
        assert_eq!(l.percentile_ms(99.0), 99.0);
        assert_eq!(l.percentile_ms(100.0), 100.0);
        assert!((l.mean_ms() - 50.5).abs() < 1e-9);
        assert_eq!(Latencies::default().percentile_ms(50.0), 0.0);
    }

    #[test]
    fn medians_of_floats_and_integers() {
        assert_eq!(median(&[3.0, f64::NAN, 1.0, 2.0, 5.0]), 3.0);
        assert_eq!(median(&[4u64, 1, 3, 2]), 2);
        assert_eq!(median(&[7u64]), 7);
        assert_eq!(median::<u64>(&[]), 0);
        assert_eq!(percentile(&[1u64, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99.0), 10);
    }
}

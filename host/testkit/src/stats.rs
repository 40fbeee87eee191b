//! Latency summaries for the demo and the benchmarks.

use std::time::Duration;

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

    /// Number recorded.
    pub fn len(&self) -> usize {
        self.ms.len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.ms.is_empty()
    }

    /// The `p`-th percentile (0..=100) in milliseconds, nearest-rank.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.ms.is_empty() {
            return 0.0;
        }
        let mut sorted = self.ms.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
        sorted[rank.min(sorted.len()) - 1]
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
}

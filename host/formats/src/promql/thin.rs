//! Reading one sample per step for instant vector selectors.
//!
//! The evaluator asks each series of an instant vector selector only for its latest sample at
//! or before each step (less the selector's offset), within the lookback. So when every
//! selector of a query is an instant vector selector with the same offset, a node may read,
//! instead of every sample, the last sample of each window `(at - offset - step, at - offset]`.
//! Those windows tile the time line and end at the steps, so the latest sample at or before a
//! step is the last one of the latest window that holds any: the answer is the same, from one
//! sample per step and series. The owners compute such windows next to the data
//! (`timeshard_proto::window::Grid`), and only those samples travel.

use super::ast::Expr;
use super::eval::Range;
use super::source::Sample;

/// Windows of `width_ms` with a boundary at `boundary_ms`: each holds the samples with
/// `boundary_ms + k * width_ms <= t < boundary_ms + (k + 1) * width_ms`, and its last sample is
/// all a query needs of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastSamples {
    pub width_ms: i64,
    pub boundary_ms: i64,
}

/// The windows whose last samples answer `expr` over `range` exactly as every sample would,
/// or `None` when the query needs more (a range vector, or selectors with different offsets).
pub fn last_samples(expr: &Expr, range: Range, lookback_ms: i64) -> Option<LastSamples> {
    let selectors = expr.selectors();
    let offset = selectors.first()?.0.offset_ms;
    if selectors.iter().any(|(s, window)| window.is_some() || s.offset_ms != offset) {
        return None;
    }
    // An instant query has one step: one window as long as the lookback ends at it.
    let width_ms = if range.is_instant() { lookback_ms } else { range.step_ms };
    (width_ms > 0).then_some(LastSamples { width_ms, boundary_ms: range.start_ms - offset + 1 })
}

impl LastSamples {
    /// The window holding `t`.
    pub fn window_of(&self, t: i64) -> i64 {
        (t - self.boundary_ms).div_euclid(self.width_ms)
    }

    /// Of `samples`, sorted by time, the last of each window: what the owners' windows give.
    pub fn thin(&self, samples: &[Sample]) -> Vec<Sample> {
        let mut out: Vec<Sample> = Vec::new();
        for s in samples {
            match out.last_mut() {
                Some(last) if self.window_of(last.t) == self.window_of(s.t) => *last = *s,
                _ => out.push(*s),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::promql::eval::{DEFAULT_LOOKBACK_MS, Options, evaluate};
    use crate::promql::labels::Labels;
    use crate::promql::source::{MemorySource, STALE_NAN_BITS};
    use crate::promql::{Limits, QueryValue, parse};

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::from_pairs(pairs.iter().copied())
    }

    /// Irregular samples: a counter every 7 s with a gap and a staleness marker, a gauge with
    /// several samples per millisecond-apart burst, and a series that stops early.
    fn full() -> MemorySource {
        let mut m = MemorySource::new();
        let stale = f64::from_bits(STALE_NAN_BITS);
        m.insert(
            labels(&[("__name__", "x"), ("job", "a")]),
            (0..200)
                .filter(|i| !(60..110).contains(i))
                .map(|i| Sample { t: i * 7_000, v: if i == 130 { stale } else { i as f64 } }),
        );
        m.insert(
            labels(&[("__name__", "x"), ("job", "b")]),
            (0..900).map(|i| Sample { t: i * 1_501 + (i % 3), v: (i * 37 % 101) as f64 }),
        );
        m.insert(labels(&[("__name__", "x"), ("job", "c")]), (0..20).map(|i| Sample { t: i * 60_000, v: -(i as f64) }));
        m
    }

    fn thinned(full: &MemorySource, windows: LastSamples) -> MemorySource {
        let mut m = MemorySource::new();
        for (labels, samples) in full.iter() {
            m.insert(labels.clone(), windows.thin(samples));
        }
        m
    }

    fn answer(q: &str, range: Range, source: &MemorySource) -> QueryValue {
        let e = parse(q, &Limits::default()).unwrap();
        evaluate(&e, range, source, &Limits::default(), Options::default()).unwrap_or_else(|e| panic!("{q}: {e}"))
    }

    #[test]
    fn the_last_sample_of_each_window_answers_as_every_sample() {
        let full = full();
        let queries = [
            "x",
            "sum by (job) (x)",
            "x offset 90s",
            "max(x offset 1m) - min(x offset 1m)",
            "x > 50",
            "2 * x + on(job) x",
            "topk(1, x)",
            "count(x)",
            "abs(x - scalar(sum(x)))",
        ];
        let ranges = [
            Range { start_ms: 0, end_ms: 1_400_000, step_ms: 60_000 },
            Range { start_ms: 12_345, end_ms: 1_300_000, step_ms: 17_001 },
            // Steps closer than the samples: most windows are empty.
            Range { start_ms: 400_000, end_ms: 460_000, step_ms: 500 },
            Range { start_ms: -300_000, end_ms: 2_000_000, step_ms: 300_000 },
            Range::instant(700_000),
            Range::instant(910_000),
            Range::instant(1_000),
        ];
        for q in queries {
            let expr = parse(q, &Limits::default()).unwrap();
            for range in ranges {
                let windows = last_samples(&expr, range, DEFAULT_LOOKBACK_MS).expect("instant selectors");
                let thin = thinned(&full, windows);
                if windows.width_ms >= 60_000 {
                    let read: usize = thin.iter().map(|(_, s)| s.len()).sum();
                    assert!(read * 4 < full.iter().map(|(_, s)| s.len()).sum(), "{q} over {range:?} reads less");
                }
                assert_eq!(answer(q, range, &thin), answer(q, range, &full), "{q} over {range:?}");
            }
        }
    }

    #[test]
    fn range_vectors_and_mixed_offsets_read_every_sample() {
        let range = Range { start_ms: 0, end_ms: 600_000, step_ms: 60_000 };
        for q in ["rate(x[5m])", "x - x offset 1m", "x + sum_over_time(x[1m])", "vector(1)"] {
            let expr = parse(q, &Limits::default()).unwrap();
            assert_eq!(last_samples(&expr, range, DEFAULT_LOOKBACK_MS), None, "{q}");
        }
    }

    #[test]
    fn windows_end_at_each_step_less_the_offset() {
        let expr = parse("x offset 30s", &Limits::default()).unwrap();
        let w = last_samples(&expr, Range { start_ms: 100_000, end_ms: 400_000, step_ms: 60_000 }, 300_000).unwrap();
        // Step 0 at 100 s reads (10 s, 70 s]: 70 s ends one window, 70.001 s starts the next.
        assert_eq!(w.window_of(70_000), w.window_of(10_001));
        assert_ne!(w.window_of(70_000), w.window_of(70_001));
        assert_ne!(w.window_of(10_000), w.window_of(10_001));
        let instant = last_samples(&expr, Range::instant(100_000), 300_000).unwrap();
        assert_eq!(instant.width_ms, 300_000, "one window as long as the lookback");
    }
}

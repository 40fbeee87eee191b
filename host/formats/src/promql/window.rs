//! The range functions (`rate`, `*_over_time`, ...) over the windows of one series: the step a
//! [`Source`](super::Source) may take over, answering from summaries or partial results,
//! and the reference computation from raw samples that the evaluator falls back on.
//!
//! Windows are closed, `[end - range, end]`, as in Prometheus 2.x; staleness markers are not
//! samples. The arithmetic follows Prometheus': `rate` extrapolates towards the window's edges
//! (by at most half a sample interval, and never below a counter's zero), sums use Kahan's
//! compensation, variance Welford's.

use super::source::{Sample, is_stale};

/// A function of a range vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeFunction {
    Rate,
    Irate,
    Increase,
    Delta,
    Deriv,
    AvgOverTime,
    MinOverTime,
    MaxOverTime,
    SumOverTime,
    CountOverTime,
    LastOverTime,
    StddevOverTime,
    StdvarOverTime,
    PresentOverTime,
    /// Takes the quantile as a parameter per step.
    QuantileOverTime,
}

impl RangeFunction {
    /// Whether a source can answer it from per-window count, sum, min, max and last alone.
    pub fn from_summaries(self) -> bool {
        matches!(
            self,
            RangeFunction::AvgOverTime
                | RangeFunction::MinOverTime
                | RangeFunction::MaxOverTime
                | RangeFunction::SumOverTime
                | RangeFunction::CountOverTime
                | RangeFunction::LastOverTime
                | RangeFunction::PresentOverTime
        )
    }
}

/// The evaluation steps a range function is computed at: step `i` is evaluated at
/// `first_ms + i * step_ms` over the window `[at - offset - range, at - offset]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub first_ms: i64,
    pub step_ms: i64,
    pub steps: usize,
    pub range_ms: i64,
    pub offset_ms: i64,
}

impl Windows {
    /// Evaluation time of step `i`.
    pub fn at(&self, i: usize) -> i64 {
        self.first_ms + i as i64 * self.step_ms
    }

    /// The window of step `i`, both ends included.
    pub fn window(&self, i: usize) -> (i64, i64) {
        let end = self.at(i) - self.offset_ms;
        (end - self.range_ms, end)
    }

    /// The time span all windows cover, both ends included.
    pub fn span(&self) -> (i64, i64) {
        (self.window(0).0, self.window(self.steps.saturating_sub(1)).1)
    }
}

/// Evaluates `f` over every window of `w` from one series' samples (sorted by time, staleness
/// markers allowed). `params[i]` is step `i`'s parameter (the quantile of
/// `quantile_over_time`). Appends `(evaluation time, value)` for the steps with a value.
pub fn evaluate(f: RangeFunction, samples: &[Sample], w: &Windows, params: &[f64], out: &mut Vec<Sample>) {
    let live: Vec<Sample>;
    let samples = if samples.iter().any(|s| is_stale(s.v)) {
        live = samples.iter().copied().filter(|s| !is_stale(s.v)).collect();
        &live[..]
    } else {
        samples
    };
    let (mut lo, mut hi) = (0, 0);
    let mut scratch = Vec::new();
    for i in 0..w.steps {
        let (start, end) = w.window(i);
        while hi < samples.len() && samples[hi].t <= end {
            hi += 1;
        }
        while lo < hi && samples[lo].t < start {
            lo += 1;
        }
        if lo >= hi {
            continue;
        }
        let param = params.get(i).copied().unwrap_or(f64::NAN);
        if let Some(v) = apply(f, &samples[lo..hi], start, end, param, &mut scratch) {
            out.push(Sample { t: w.at(i), v });
        }
    }
}

/// `f` over one window's samples (sorted, no staleness markers, at least one).
pub fn apply(f: RangeFunction, s: &[Sample], start: i64, end: i64, param: f64, scratch: &mut Vec<f64>) -> Option<f64> {
    let first = s.first()?;
    let last = s[s.len() - 1];
    Some(match f {
        RangeFunction::Rate => extrapolated_rate(s, start, end, true, true)?,
        RangeFunction::Increase => extrapolated_rate(s, start, end, true, false)?,
        RangeFunction::Delta => extrapolated_rate(s, start, end, false, false)?,
        RangeFunction::Irate => {
            if s.len() < 2 {
                return None;
            }
            let prev = s[s.len() - 2];
            let dt = last.t - prev.t;
            if dt == 0 {
                return None;
            }
            let dv = if last.v < prev.v { last.v } else { last.v - prev.v };
            dv / (dt as f64 / 1000.0)
        }
        RangeFunction::Deriv => {
            if s.len() < 2 {
                return None;
            }
            regression_slope(s, first.t)
        }
        RangeFunction::AvgOverTime => avg(s),
        RangeFunction::MinOverTime => s.iter().fold(first.v, |m, x| if x.v < m || m.is_nan() { x.v } else { m }),
        RangeFunction::MaxOverTime => s.iter().fold(first.v, |m, x| if x.v > m || m.is_nan() { x.v } else { m }),
        RangeFunction::SumOverTime => {
            let (sum, c) = s.iter().fold((0.0, 0.0), |(sum, c), x| kahan_add(x.v, sum, c));
            if sum.is_infinite() { sum } else { sum + c }
        }
        RangeFunction::CountOverTime => s.len() as f64,
        RangeFunction::LastOverTime => last.v,
        RangeFunction::StddevOverTime => variance(s).sqrt(),
        RangeFunction::StdvarOverTime => variance(s),
        RangeFunction::PresentOverTime => 1.0,
        RangeFunction::QuantileOverTime => {
            scratch.clear();
            scratch.extend(s.iter().map(|x| x.v));
            quantile(param, scratch)
        }
    })
}

/// Kahan-Neumaier summation step: `(sum, compensation)` after adding `inc`.
pub fn kahan_add(inc: f64, sum: f64, c: f64) -> (f64, f64) {
    let t = sum + inc;
    let c = if sum.abs() >= inc.abs() { c + ((sum - t) + inc) } else { c + ((inc - t) + sum) };
    (t, c)
}

fn avg(s: &[Sample]) -> f64 {
    let (mut mean, mut c, mut count) = (0.0f64, 0.0f64, 0.0f64);
    for x in s {
        count += 1.0;
        if mean.is_infinite() {
            if x.v.is_infinite() && (mean > 0.0) == (x.v > 0.0) {
                continue;
            }
            if !x.v.is_infinite() && !x.v.is_nan() {
                continue;
            }
        }
        (mean, c) = kahan_add(x.v / count - mean / count, mean, c);
    }
    if mean.is_infinite() { mean } else { mean + c }
}

fn variance(s: &[Sample]) -> f64 {
    let (mut count, mut mean, mut c_mean, mut aux, mut c_aux) = (0.0f64, 0.0, 0.0, 0.0, 0.0);
    for x in s {
        count += 1.0;
        let delta = x.v - (mean + c_mean);
        (mean, c_mean) = kahan_add(delta / count, mean, c_mean);
        (aux, c_aux) = kahan_add(delta * (x.v - (mean + c_mean)), aux, c_aux);
    }
    (aux + c_aux) / count
}

/// The least-squares slope per second, times taken relative to `intercept_t`.
fn regression_slope(s: &[Sample], intercept_t: i64) -> f64 {
    let (mut n, mut sx, mut cx, mut sy, mut cy, mut sxy, mut cxy, mut sx2, mut cx2) =
        (0.0f64, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let init = s[0].v;
    let mut const_y = true;
    for (i, p) in s.iter().enumerate() {
        if const_y && i > 0 && p.v != init {
            const_y = false;
        }
        n += 1.0;
        let x = (p.t - intercept_t) as f64 / 1e3;
        (sx, cx) = kahan_add(x, sx, cx);
        (sy, cy) = kahan_add(p.v, sy, cy);
        (sxy, cxy) = kahan_add(x * p.v, sxy, cxy);
        (sx2, cx2) = kahan_add(x * x, sx2, cx2);
    }
    if const_y {
        return if init.is_infinite() { f64::NAN } else { 0.0 };
    }
    let (sx, sy, sxy, sx2) = (sx + cx, sy + cy, sxy + cxy, sx2 + cx2);
    let cov = sxy - sx * sy / n;
    let var = sx2 - sx * sx / n;
    cov / var
}

/// `rate`, `increase` and `delta`: the change over the window, corrected for counter resets,
/// extrapolated to the window's edges as Prometheus does.
fn extrapolated_rate(s: &[Sample], range_start: i64, range_end: i64, counter: bool, per_second: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (first, last) = (s[0], s[s.len() - 1]);
    let mut result = last.v - first.v;
    if counter {
        let mut prev = first.v;
        for p in &s[1..] {
            if p.v < prev {
                result += prev;
            }
            prev = p.v;
        }
    }
    let mut to_start = (first.t - range_start) as f64 / 1000.0;
    let to_end = (range_end - last.t) as f64 / 1000.0;
    let sampled = (last.t - first.t) as f64 / 1000.0;
    let avg_interval = sampled / (s.len() - 1) as f64;
    if counter && result > 0.0 && first.v >= 0.0 {
        let to_zero = sampled * (first.v / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = avg_interval * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold { to_start } else { avg_interval / 2.0 };
    interval += if to_end < threshold { to_end } else { avg_interval / 2.0 };
    let mut factor = interval / sampled;
    if per_second {
        factor /= (range_end - range_start) as f64 / 1000.0;
    }
    Some(result * factor)
}

/// The `q` quantile of `values` (sorted in place), interpolating between neighbours:
/// NaN for no values or a NaN `q`, -Inf below 0, +Inf above 1.
pub fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    // NaN sorts first, as in Prometheus.
    values.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    });
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    values[lower as usize] * (1.0 - weight) + values[upper as usize] * weight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(pts: &[(i64, f64)]) -> Vec<Sample> {
        pts.iter().map(|&(t, v)| Sample { t, v }).collect()
    }

    fn one(f: RangeFunction, pts: &[(i64, f64)], start: i64, end: i64) -> Option<f64> {
        apply(f, &samples(pts), start, end, 0.5, &mut Vec::new())
    }

    #[test]
    fn rate_extrapolates_like_prometheus() {
        // A counter scraped every 15 s over a 60 s window, the first sample 5 s in: the window
        // edges are within 1.1 intervals, so the change extrapolates to the full 60 s.
        let pts = [(5_000, 10.0), (20_000, 25.0), (35_000, 40.0), (50_000, 55.0)];
        assert_eq!(one(RangeFunction::Increase, &pts, 0, 60_000), Some(45.0 * 60.0 / 45.0));
        let rate = one(RangeFunction::Rate, &pts, 0, 60_000).unwrap();
        assert!((rate - 1.0).abs() < 1e-12, "{rate}");
        // Extrapolation towards the start stops at the counter's zero.
        let pts = [(30_000, 1.0), (45_000, 16.0), (60_000, 31.0)];
        let inc = one(RangeFunction::Increase, &pts, 0, 60_000).unwrap();
        assert!((inc - 30.0 * 31.0 / 30.0).abs() < 1e-9, "{inc}");
        // A reset adds the value before it.
        let pts = [(0, 10.0), (15_000, 20.0), (30_000, 5.0), (45_000, 15.0), (60_000, 25.0)];
        assert_eq!(one(RangeFunction::Increase, &pts, 0, 60_000), Some(35.0));
        // Delta is not a counter: no reset handling, no zero clamp.
        assert_eq!(one(RangeFunction::Delta, &pts, 0, 60_000), Some(15.0));
        assert_eq!(one(RangeFunction::Rate, &pts[..1], 0, 60_000), None, "one sample has no rate");
    }

    #[test]
    fn irate_deriv_and_over_time() {
        let pts = [(0, 1.0), (10_000, 3.0), (20_000, 2.0)];
        assert_eq!(one(RangeFunction::Irate, &pts, 0, 20_000), Some(0.2), "a reset: the last value over 10 s");
        assert_eq!(one(RangeFunction::Deriv, &pts[..2], 0, 20_000), Some(0.2));
        assert_eq!(one(RangeFunction::Deriv, &[(0, 4.0), (5_000, 4.0)], 0, 5_000), Some(0.0));
        assert_eq!(one(RangeFunction::AvgOverTime, &pts, 0, 20_000), Some(2.0));
        assert_eq!(one(RangeFunction::MinOverTime, &pts, 0, 20_000), Some(1.0));
        assert_eq!(one(RangeFunction::MaxOverTime, &pts, 0, 20_000), Some(3.0));
        assert_eq!(one(RangeFunction::SumOverTime, &pts, 0, 20_000), Some(6.0));
        assert_eq!(one(RangeFunction::CountOverTime, &pts, 0, 20_000), Some(3.0));
        assert_eq!(one(RangeFunction::LastOverTime, &pts, 0, 20_000), Some(2.0));
        assert_eq!(one(RangeFunction::StdvarOverTime, &pts, 0, 20_000), Some(2.0 / 3.0));
        assert_eq!(one(RangeFunction::QuantileOverTime, &pts, 0, 20_000), Some(2.0));
        assert_eq!(one(RangeFunction::MaxOverTime, &[(0, f64::NAN), (1, 1.0)], 0, 1), Some(1.0));
    }

    #[test]
    fn quantiles_interpolate_and_saturate() {
        assert_eq!(quantile(0.5, &mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(quantile(0.0, &mut [4.0, 1.0]), 1.0);
        assert_eq!(quantile(1.0, &mut [4.0, 1.0]), 4.0);
        assert_eq!(quantile(-1.0, &mut [1.0]), f64::NEG_INFINITY);
        assert_eq!(quantile(2.0, &mut [1.0]), f64::INFINITY);
        assert!(quantile(0.5, &mut []).is_nan());
    }

    proptest::proptest! {
        /// The sliding evaluation equals computing each window from scratch.
        #[test]
        fn sliding_windows_equal_fresh_ones(
            gaps in proptest::collection::vec((1i64..40_000, -50i32..50, proptest::bool::weighted(0.05)), 0..120),
            first in 0i64..100_000, step in 1i64..90_000, steps in 1usize..40, range in 1i64..300_000, offset in -60_000i64..60_000,
            f in 0usize..15,
        ) {
            let stale = f64::from_bits(super::super::source::STALE_NAN_BITS);
            let mut t = 0;
            let s: Vec<Sample> = gaps.iter().map(|&(dt, v, st)| { t += dt; Sample { t, v: if st { stale } else { f64::from(v) } } }).collect();
            let fs = [RangeFunction::Rate, RangeFunction::Irate, RangeFunction::Increase, RangeFunction::Delta, RangeFunction::Deriv,
                RangeFunction::AvgOverTime, RangeFunction::MinOverTime, RangeFunction::MaxOverTime, RangeFunction::SumOverTime,
                RangeFunction::CountOverTime, RangeFunction::LastOverTime, RangeFunction::StddevOverTime, RangeFunction::StdvarOverTime,
                RangeFunction::PresentOverTime, RangeFunction::QuantileOverTime];
            let w = Windows { first_ms: first, step_ms: step, steps, range_ms: range, offset_ms: offset };
            let params: Vec<f64> = (0..steps).map(|i| i as f64 / steps as f64).collect();
            let mut got = Vec::new();
            evaluate(fs[f], &s, &w, &params, &mut got);
            let mut want = Vec::new();
            for (i, &param) in params.iter().enumerate() {
                let (a, b) = w.window(i);
                let win: Vec<Sample> = s.iter().copied().filter(|x| x.t >= a && x.t <= b && !is_stale(x.v)).collect();
                if !win.is_empty()
                    && let Some(v) = apply(fs[f], &win, a, b, param, &mut Vec::new())
                {
                    want.push(Sample { t: w.at(i), v });
                }
            }
            proptest::prop_assert_eq!(got.len(), want.len());
            for (g, x) in got.iter().zip(&want) {
                proptest::prop_assert!(g.t == x.t && (g.v == x.v || (g.v.is_nan() && x.v.is_nan())), "{:?} vs {:?}", g, x);
            }
        }
    }

    #[test]
    fn windows_slide_over_closed_intervals_and_skip_staleness() {
        let stale = f64::from_bits(super::super::source::STALE_NAN_BITS);
        let s = samples(&[(0, 1.0), (60_000, 2.0), (90_000, stale), (120_000, 3.0)]);
        let w = Windows { first_ms: 60_000, step_ms: 60_000, steps: 3, range_ms: 60_000, offset_ms: 0 };
        let mut out = Vec::new();
        evaluate(RangeFunction::CountOverTime, &s, &w, &[], &mut out);
        // [0, 60 s] holds 2 samples (both ends), [60 s, 120 s] 2 (the marker is not one), [120 s, 180 s] 1.
        assert_eq!(out, samples(&[(60_000, 2.0), (120_000, 2.0), (180_000, 1.0)]));
        let w = Windows { offset_ms: 60_000, ..w };
        out.clear();
        evaluate(RangeFunction::LastOverTime, &s, &w, &[], &mut out);
        assert_eq!(out, samples(&[(60_000, 1.0), (120_000, 2.0), (180_000, 3.0)]));
    }
}

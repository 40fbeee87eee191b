//! Function calls: the range functions (through the source), `histogram_quantile`, the
//! per-sample math (`abs`, `ceil`, `floor`, `round`, `clamp*`), `time`, `vector`, `scalar`
//! and `label_replace`.

use super::{EvalError, Evaluator, Sample, Series, Val, by_step, merge_series};
use crate::promql::ast::{Call, Expr, Func};
use crate::promql::labels::Labels;
use crate::promql::matcher::anchored_regex;

impl Evaluator<'_> {
    pub(super) fn call(&mut self, c: &Call) -> Result<Val, EvalError> {
        match c.func {
            Func::Rate
            | Func::Irate
            | Func::Increase
            | Func::Delta
            | Func::Deriv
            | Func::AvgOverTime
            | Func::MinOverTime
            | Func::MaxOverTime
            | Func::SumOverTime
            | Func::CountOverTime
            | Func::LastOverTime
            | Func::StddevOverTime
            | Func::StdvarOverTime
            | Func::PresentOverTime => Ok(Val::Vector(self.range_function(c.func, &c.args[0], &[])?)),
            Func::QuantileOverTime => {
                let q = self.scalar_arg(&c.args[0])?;
                Ok(Val::Vector(self.range_function(c.func, &c.args[1], &q)?))
            }
            Func::Time => Ok(Val::Scalar((0..self.steps).map(|i| self.range.at(i) as f64 / 1000.0).collect())),
            Func::Vector => {
                let v = self.scalar_arg(&c.args[0])?;
                let samples = v.iter().enumerate().map(|(i, &v)| Sample { t: self.range.at(i), v }).collect();
                Ok(Val::Vector(vec![Series { labels: Labels::new(), samples }]))
            }
            Func::Scalar => {
                let series = self.vector_arg(&c.args[0])?;
                let steps = by_step(self, &series);
                Ok(Val::Scalar(steps.iter().map(|s| if s.len() == 1 { s[0].1 } else { f64::NAN }).collect()))
            }
            Func::Abs => self.map_values(&c.args[0], f64::abs),
            Func::Ceil => self.map_values(&c.args[0], f64::ceil),
            Func::Floor => self.map_values(&c.args[0], f64::floor),
            Func::Round => {
                let to = match c.args.get(1) {
                    Some(a) => self.scalar_arg(a)?,
                    None => vec![1.0; self.steps],
                };
                // Prometheus rounds with the inverse, ties upwards.
                self.map_with_steps(&c.args[0], |v, i| {
                    let inv = 1.0 / to[i];
                    Some((v * inv + 0.5).floor() / inv)
                })
            }
            Func::Clamp => {
                let (lo, hi) = (self.scalar_arg(&c.args[1])?, self.scalar_arg(&c.args[2])?);
                self.map_with_steps(&c.args[0], |v, i| (hi[i] >= lo[i]).then(|| go_max(lo[i], go_min(hi[i], v))))
            }
            Func::ClampMin => {
                let lo = self.scalar_arg(&c.args[1])?;
                self.map_with_steps(&c.args[0], |v, i| Some(go_max(lo[i], v)))
            }
            Func::ClampMax => {
                let hi = self.scalar_arg(&c.args[1])?;
                self.map_with_steps(&c.args[0], |v, i| Some(go_min(hi[i], v)))
            }
            Func::HistogramQuantile => self.histogram_quantile(c),
            Func::LabelReplace => self.label_replace(c),
        }
    }

    pub(super) fn scalar_arg(&mut self, e: &Expr) -> Result<Vec<f64>, EvalError> {
        match self.eval(e)? {
            Val::Scalar(v) => Ok(v),
            _ => Err(EvalError::BadData("expected a scalar argument".into())),
        }
    }

    pub(super) fn vector_arg(&mut self, e: &Expr) -> Result<Vec<Series>, EvalError> {
        match self.eval(e)? {
            Val::Vector(v) => Ok(v),
            _ => Err(EvalError::BadData("expected an instant vector argument".into())),
        }
    }

    fn map_values(&mut self, arg: &Expr, f: fn(f64) -> f64) -> Result<Val, EvalError> {
        self.map_with_steps(arg, |v, _| Some(f(v)))
    }

    /// Applies `f(value, step)` to every sample, dropping the metric name; `None` drops the
    /// sample.
    fn map_with_steps(&mut self, arg: &Expr, f: impl Fn(f64, usize) -> Option<f64>) -> Result<Val, EvalError> {
        let series = self.vector_arg(arg)?;
        let mapped = series
            .into_iter()
            .map(|s| Series {
                labels: s.labels.without_name(),
                samples: s
                    .samples
                    .iter()
                    .filter_map(|p| f(p.v, self.step_of(p.t)).map(|v| Sample { t: p.t, v }))
                    .collect(),
            })
            .collect();
        Ok(Val::Vector(merge_series(mapped)?))
    }

    fn histogram_quantile(&mut self, c: &Call) -> Result<Val, EvalError> {
        let q = self.scalar_arg(&c.args[0])?;
        let series = self.vector_arg(&c.args[1])?;
        // Buckets group by every label but `le` (the metric name included); the answer drops
        // both. Series without a parseable `le` are skipped.
        let mut groups: Vec<(Labels, Labels)> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let mut member: Vec<Option<(usize, f64)>> = Vec::with_capacity(series.len());
        for s in &series {
            let Some(bound) = s.labels.get("le").and_then(parse_go_float) else {
                member.push(None);
                continue;
            };
            let mut key = s.labels.clone();
            key.remove("le");
            let g = *index.entry(key.clone()).or_insert_with(|| {
                groups.push((key.clone(), key.without_name()));
                groups.len() - 1
            });
            member.push(Some((g, bound)));
        }
        let mut out = super::Collector::default();
        let mut buckets: Vec<Vec<(f64, f64)>> = vec![Vec::new(); groups.len()];
        let mut touched: Vec<usize> = Vec::new();
        for (step, samples) in by_step(self, &series).into_iter().enumerate() {
            let t = self.range.at(step);
            for (i, v) in samples {
                if let Some((g, bound)) = member[i] {
                    if buckets[g].is_empty() {
                        touched.push(g);
                    }
                    buckets[g].push((bound, v));
                }
            }
            for &g in &touched {
                let v = bucket_quantile(q[step], &mut buckets[g]);
                out.push(&groups[g].1, t, v)?;
                buckets[g].clear();
            }
            touched.clear();
        }
        Ok(Val::Vector(out.finish()))
    }

    fn label_replace(&mut self, c: &Call) -> Result<Val, EvalError> {
        let text = |i: usize| match &c.args[i] {
            Expr::String(s) => s.as_str(),
            _ => "",
        };
        let (dst, replacement, src, pattern) = (text(1), text(2), text(3), text(4));
        let re = anchored_regex(pattern, self.limits.max_regex_bytes)
            .map_err(|e| EvalError::BadData(format!("invalid regular expression in label_replace(): {e}")))?;
        let series = self.vector_arg(&c.args[0])?;
        let mapped = series
            .into_iter()
            .map(|mut s| {
                let value = s.labels.value(src).to_string();
                if let Some(caps) = re.captures(&value) {
                    let mut expanded = String::new();
                    caps.expand(replacement, &mut expanded);
                    s.labels.set(dst, &expanded);
                }
                s
            })
            .collect();
        Ok(Val::Vector(merge_series(mapped)?))
    }
}

/// Go's `math.Max`: NaN wins, then +Inf.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

/// Go's `math.Min`: NaN wins, then -Inf.
fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
}

/// A float as Go's `strconv.ParseFloat` reads a bucket bound (`+Inf`, `0.5`, `1e3`).
fn parse_go_float(s: &str) -> Option<f64> {
    let t = s.strip_prefix('+').unwrap_or(s);
    if t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity") {
        return Some(if s.starts_with('-') { f64::NEG_INFINITY } else { f64::INFINITY });
    }
    s.parse().ok()
}

/// Prometheus' quantile of classic histogram buckets `(upper bound, cumulative count)`:
/// sorted, equal bounds merged, made monotonic, then interpolated linearly within the bucket.
fn bucket_quantile(q: f64, buckets: &mut Vec<(f64, f64)>) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    if buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
        return f64::NAN;
    }
    buckets.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
    let mut max = buckets[0].1;
    for b in buckets.iter_mut().skip(1) {
        if b.1 > max {
            max = b.1;
        } else if b.1 < max {
            b.1 = max;
        }
    }
    if buckets.len() < 2 {
        return f64::NAN;
    }
    let n = buckets.len();
    let observations = buckets[n - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let b = buckets[..n - 1].partition_point(|x| x.1 < rank);
    if b == n - 1 {
        return buckets[n - 2].0;
    }
    if b == 0 && buckets[0].0 <= 0.0 {
        return buckets[0].0;
    }
    let (mut start, end, mut count) = (0.0, buckets[b].0, buckets[b].1);
    if b > 0 {
        start = buckets[b - 1].0;
        count -= buckets[b - 1].1;
        rank -= buckets[b - 1].1;
    }
    start + (end - start) * (rank / count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_quantiles_follow_prometheus() {
        let mut b = vec![(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (f64::INFINITY, 40.0)];
        // rank 20 lies in (0.1, 0.5]: 0.1 + 0.4 * (10 / 20).
        assert!((bucket_quantile(0.5, &mut b.clone()) - 0.3).abs() < 1e-12);
        // rank 40 falls in the +Inf bucket's predecessor: its upper bound.
        assert_eq!(bucket_quantile(1.0, &mut b.clone()), 1.0);
        assert!((bucket_quantile(0.05, &mut b) - 0.02).abs() < 1e-12, "rank 2 of 10 in (0, 0.1]");
        assert!(bucket_quantile(0.5, &mut vec![(1.0, 3.0)]).is_nan(), "no +Inf bucket");
        assert!(bucket_quantile(0.5, &mut vec![(1.0, 0.0), (f64::INFINITY, 0.0)]).is_nan());
        assert_eq!(bucket_quantile(2.0, &mut vec![(f64::INFINITY, 1.0)]), f64::INFINITY);
        // Non-monotonic counts are flattened; equal bounds summed.
        let mut b = vec![(1.0, 10.0), (2.0, 5.0), (f64::INFINITY, 10.0), (1.0, 0.0)];
        assert_eq!(bucket_quantile(0.5, &mut b), 0.5);
        assert_eq!(parse_go_float("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_go_float("1e3"), Some(1000.0));
        assert_eq!(parse_go_float("x"), None);
    }

    #[test]
    fn clamps_follow_go_math() {
        assert!(go_max(1.0, f64::NAN).is_nan());
        assert!(go_min(f64::NAN, 1.0).is_nan());
        assert_eq!(go_max(1.0, 2.0), 2.0);
        assert_eq!(go_min(1.0, 2.0), 1.0);
    }
}

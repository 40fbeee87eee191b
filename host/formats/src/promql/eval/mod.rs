//! The evaluator: an expression, a time range and a [`Source`] in, Prometheus' answer out.
//!
//! As in Prometheus, every expression is evaluated over the whole grid of steps at once (an
//! instant query is a grid of one step): selectors read each series once, and operators work
//! step by step on the values present at each step. Instant vector selectors take the latest
//! sample within the 5-minute lookback unless it is a staleness marker; range functions go
//! through [`Source::windows`], so a source can answer them from its own summaries.
//!
//! Split by concern: selectors and range functions here, [`functions`], [`aggregate`] and
//! [`binary`] beside.

mod aggregate;
mod binary;
mod functions;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Limits;
use super::ast::{Expr, Func, Selector, ValueType};
use super::labels::Labels;
pub use super::source::Sample;
use super::source::{SelectedSeries, Source, SourceError, WindowRequest, is_stale};
use super::window::{RangeFunction, Windows};

/// Prometheus' default lookback for instant vector selectors.
pub const DEFAULT_LOOKBACK_MS: i64 = 5 * 60 * 1000;

/// The evaluation times: `start_ms`, `start_ms + step_ms`, ... up to `end_ms`. An instant
/// query has `start_ms == end_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start_ms: i64,
    pub end_ms: i64,
    pub step_ms: i64,
}

impl Range {
    pub fn instant(t_ms: i64) -> Range {
        Range { start_ms: t_ms, end_ms: t_ms, step_ms: 1 }
    }

    pub fn is_instant(&self) -> bool {
        self.start_ms == self.end_ms
    }

    /// Number of evaluation steps.
    pub fn steps(&self) -> usize {
        ((self.end_ms - self.start_ms) / self.step_ms.max(1)) as usize + 1
    }

    fn at(&self, i: usize) -> i64 {
        self.start_ms + i as i64 * self.step_ms
    }
}

/// A labelled series of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub samples: Vec<Sample>,
}

/// The answer to a query, in Prometheus' result types.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryValue {
    Scalar(Sample),
    String {
        t: i64,
        value: String,
    },
    /// One sample per series, at the evaluation time.
    Vector(Vec<Series>),
    Matrix(Vec<Series>),
}

impl QueryValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            QueryValue::Scalar(_) => ValueType::Scalar,
            QueryValue::String { .. } => ValueType::String,
            QueryValue::Vector(_) => ValueType::Vector,
            QueryValue::Matrix(_) => ValueType::Matrix,
        }
    }
}

/// A query that failed while evaluating.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// Prometheus' `execution` errors: the data make the expression undefined.
    #[error("{0}")]
    Execution(String),
    /// The query asks for something malformed (`bad_data`).
    #[error("{0}")]
    BadData(String),
    #[error(
        "query processing would load too many samples into memory in query execution (more than the limit of {limit})"
    )]
    TooManySamples { limit: usize },
    #[error("the answer would hold more than the limit of {limit} points; narrow the selectors or raise the step")]
    TooManyPoints { limit: usize },
    #[error("query timed out in expression evaluation")]
    Timeout,
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// What evaluation needs beyond the expression.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub lookback_ms: i64,
    /// Set by the caller to stop an evaluation (a timeout): checked between series and steps.
    pub stop: Option<&'a AtomicBool>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options { lookback_ms: DEFAULT_LOOKBACK_MS, stop: None }
    }
}

/// Evaluates `expr` over `range` against `source`. A range query's expression must be a
/// scalar or an instant vector, and its answer is a matrix sorted by labels.
pub fn evaluate(
    expr: &Expr,
    range: Range,
    source: &dyn Source,
    limits: &Limits,
    options: Options<'_>,
) -> Result<QueryValue, EvalError> {
    let ty = expr.value_type();
    if range.end_ms < range.start_ms || range.step_ms <= 0 {
        return Err(EvalError::BadData("the range must have start <= end and a positive step".into()));
    }
    if !range.is_instant() && !matches!(ty, ValueType::Scalar | ValueType::Vector) {
        return Err(EvalError::BadData(format!(
            "invalid expression type {:?} for range query, must be Scalar or instant Vector",
            ty.documented()
        )));
    }
    let mut ev = Evaluator { source, limits, range, steps: range.steps(), options, samples: 0 };
    let t0 = range.start_ms;
    let out = match ev.eval(expr)? {
        Val::Str(s) => QueryValue::String { t: t0, value: s },
        Val::Scalar(v) if range.is_instant() => QueryValue::Scalar(Sample { t: t0, v: v[0] }),
        Val::Scalar(v) => {
            let samples = v.iter().enumerate().map(|(i, &v)| Sample { t: range.at(i), v }).collect();
            QueryValue::Matrix(vec![Series { labels: Labels::new(), samples }])
        }
        Val::Vector(series) if range.is_instant() => QueryValue::Vector(series),
        Val::Vector(mut series) => {
            series.sort_by(|a, b| a.labels.cmp(&b.labels));
            QueryValue::Matrix(series)
        }
        Val::Matrix(series) => QueryValue::Matrix(series),
    };
    let points = match &out {
        QueryValue::Vector(s) | QueryValue::Matrix(s) => s.iter().map(|s| s.samples.len()).sum(),
        _ => 1,
    };
    if points > limits.max_output_points {
        return Err(EvalError::TooManyPoints { limit: limits.max_output_points });
    }
    Ok(out)
}

/// What evaluating `expr` over `range` will read: each selector's matchers and the time span
/// of samples it needs, both ends included. A node that fetches asynchronously can read these
/// into a [`MemorySource`](super::MemorySource) first and evaluate against it.
pub fn data_needed(expr: &Expr, range: Range, lookback_ms: i64) -> Vec<(&Selector, i64, i64)> {
    expr.selectors()
        .into_iter()
        .map(|(s, window)| {
            let end = range.end_ms - s.offset_ms;
            let start = match window {
                Some(w) => range.start_ms - s.offset_ms - w,
                None => range.start_ms - s.offset_ms - lookback_ms,
            };
            (s, start, end)
        })
        .collect()
}

/// A value over the grid of steps.
#[derive(Debug, Clone)]
enum Val {
    /// One value per step.
    Scalar(Vec<f64>),
    /// Series with samples at step times only, each step at most once.
    Vector(Vec<Series>),
    /// Raw samples (instant queries only).
    Matrix(Vec<Series>),
    Str(String),
}

struct Evaluator<'a> {
    source: &'a dyn Source,
    limits: &'a Limits,
    range: Range,
    steps: usize,
    options: Options<'a>,
    /// Samples read so far.
    samples: usize,
}

impl Evaluator<'_> {
    fn check_stop(&self) -> Result<(), EvalError> {
        match self.options.stop {
            Some(s) if s.load(Ordering::Relaxed) => Err(EvalError::Timeout),
            _ => Ok(()),
        }
    }

    fn count_samples(&mut self, n: usize) -> Result<(), EvalError> {
        self.samples += n;
        if self.samples > self.limits.max_samples {
            return Err(EvalError::TooManySamples { limit: self.limits.max_samples });
        }
        Ok(())
    }

    fn step_of(&self, t: i64) -> usize {
        ((t - self.range.start_ms) / self.range.step_ms) as usize
    }

    fn eval(&mut self, e: &Expr) -> Result<Val, EvalError> {
        self.check_stop()?;
        Ok(match e {
            Expr::Number(n) => Val::Scalar(vec![*n; self.steps]),
            Expr::String(s) => Val::Str(s.clone()),
            Expr::Selector(s) => Val::Vector(self.vector_selector(s)?),
            Expr::Matrix { selector, range_ms } => Val::Matrix(self.matrix_selector(selector, *range_ms)?),
            Expr::Neg(inner) => match self.eval(inner)? {
                Val::Scalar(v) => Val::Scalar(v.into_iter().map(|x| -x).collect()),
                Val::Vector(series) => {
                    let mapped = series
                        .into_iter()
                        .map(|s| Series {
                            labels: s.labels.without_name(),
                            samples: s.samples.into_iter().map(|p| Sample { t: p.t, v: -p.v }).collect(),
                        })
                        .collect();
                    Val::Vector(unique_labels(mapped)?)
                }
                other => other,
            },
            Expr::Binary(b) => self.binary(b)?,
            Expr::Aggregate(a) => self.aggregate(a)?,
            Expr::Call(c) => self.call(c)?,
        })
    }

    fn select(&mut self, s: &Selector, start: i64, end: i64) -> Result<Vec<SelectedSeries>, EvalError> {
        Ok(self.source.select(&s.matchers, start, end, self.limits.max_series)?)
    }

    /// The latest sample at or before each step (minus the offset), within the lookback.
    fn vector_selector(&mut self, s: &Selector) -> Result<Vec<Series>, EvalError> {
        let lookback = self.options.lookback_ms;
        let start = self.range.start_ms - s.offset_ms - lookback;
        let end = self.range.end_ms - s.offset_ms;
        let selected = self.select(s, start, end)?;
        let mut out = Vec::with_capacity(selected.len());
        let mut buf = Vec::new();
        for series in selected {
            self.check_stop()?;
            buf.clear();
            self.source.samples(&series, start, end, &mut buf)?;
            self.count_samples(buf.len())?;
            let mut points = Vec::new();
            let mut next = 0;
            for i in 0..self.steps {
                let at = self.range.at(i);
                let reference = at - s.offset_ms;
                while next < buf.len() && buf[next].t <= reference {
                    next += 1;
                }
                if next == 0 {
                    continue;
                }
                let latest = buf[next - 1];
                if latest.t >= reference - lookback && !is_stale(latest.v) {
                    points.push(Sample { t: at, v: latest.v });
                }
            }
            if !points.is_empty() {
                out.push(Series { labels: series.labels, samples: points });
            }
        }
        Ok(out)
    }

    /// The raw samples of `selector[range]` at the (single) evaluation time.
    fn matrix_selector(&mut self, s: &Selector, range_ms: i64) -> Result<Vec<Series>, EvalError> {
        let end = self.range.start_ms - s.offset_ms;
        let start = end - range_ms;
        let selected = self.select(s, start, end)?;
        let mut out = Vec::new();
        for series in selected {
            self.check_stop()?;
            let mut buf = Vec::new();
            self.source.samples(&series, start, end, &mut buf)?;
            self.count_samples(buf.len())?;
            buf.retain(|p| !is_stale(p.v) && p.t >= start && p.t <= end);
            if !buf.is_empty() {
                out.push(Series { labels: series.labels, samples: buf });
            }
        }
        Ok(out)
    }

    /// A range function over `selector[range]` at every step, through the source.
    fn range_function(&mut self, f: Func, arg: &Expr, params: &[f64]) -> Result<Vec<Series>, EvalError> {
        let Expr::Matrix { selector, range_ms } = arg else {
            return Err(EvalError::BadData(format!("{} needs a range vector selector", f.name())));
        };
        let function = range_function_of(f);
        let windows = Windows {
            first_ms: self.range.start_ms,
            step_ms: self.range.step_ms,
            steps: self.steps,
            range_ms: *range_ms,
            offset_ms: selector.offset_ms,
        };
        let (start, end) = windows.span();
        let selected = self.select(selector, start, end)?;
        let request = WindowRequest { function, windows, params };
        let mut out = Vec::with_capacity(selected.len());
        for series in selected {
            self.check_stop()?;
            let mut points = Vec::new();
            let read = self.source.windows(&series, &request, &mut points)?;
            self.count_samples(read + points.len())?;
            if points.is_empty() {
                continue;
            }
            // last_over_time acts like an offset and keeps the metric name.
            let labels = if f == Func::LastOverTime { series.labels } else { series.labels.without_name() };
            out.push(Series { labels, samples: points });
        }
        unique_labels(out)
    }
}

fn range_function_of(f: Func) -> RangeFunction {
    match f {
        Func::Rate => RangeFunction::Rate,
        Func::Irate => RangeFunction::Irate,
        Func::Increase => RangeFunction::Increase,
        Func::Delta => RangeFunction::Delta,
        Func::Deriv => RangeFunction::Deriv,
        Func::AvgOverTime => RangeFunction::AvgOverTime,
        Func::MinOverTime => RangeFunction::MinOverTime,
        Func::MaxOverTime => RangeFunction::MaxOverTime,
        Func::SumOverTime => RangeFunction::SumOverTime,
        Func::CountOverTime => RangeFunction::CountOverTime,
        Func::LastOverTime => RangeFunction::LastOverTime,
        Func::StddevOverTime => RangeFunction::StddevOverTime,
        Func::StdvarOverTime => RangeFunction::StdvarOverTime,
        Func::PresentOverTime => RangeFunction::PresentOverTime,
        _ => RangeFunction::QuantileOverTime,
    }
}

const SAME_LABELSET: &str = "vector cannot contain metrics with the same labelset";

/// Refuses two series with the same labels (Prometheus' check on whole matrices).
fn unique_labels(series: Vec<Series>) -> Result<Vec<Series>, EvalError> {
    let mut seen = std::collections::HashSet::with_capacity(series.len());
    for s in &series {
        if !seen.insert(&s.labels) {
            return Err(EvalError::Execution(SAME_LABELSET.into()));
        }
    }
    Ok(series)
}

/// Joins series that came out with the same labels, as Prometheus' step-wise evaluation does;
/// two values at one step are an error. Keeps the order of first appearance.
fn merge_series(series: Vec<Series>) -> Result<Vec<Series>, EvalError> {
    let mut index: HashMap<Labels, usize> = HashMap::with_capacity(series.len());
    let mut out: Vec<Series> = Vec::with_capacity(series.len());
    for s in series {
        if s.samples.is_empty() {
            continue;
        }
        match index.get(&s.labels) {
            None => {
                index.insert(s.labels.clone(), out.len());
                out.push(s);
            }
            Some(&i) => {
                let target = &mut out[i].samples;
                target.extend(s.samples);
                target.sort_by_key(|p| p.t);
                if target.windows(2).any(|w| w[0].t == w[1].t) {
                    return Err(EvalError::Execution(SAME_LABELSET.into()));
                }
            }
        }
    }
    Ok(out)
}

/// Output series built step by step (steps in increasing order).
#[derive(Default)]
struct Collector {
    index: HashMap<Labels, usize>,
    out: Vec<Series>,
}

impl Collector {
    fn push(&mut self, labels: &Labels, t: i64, v: f64) -> Result<(), EvalError> {
        let i = match self.index.get(labels) {
            Some(&i) => i,
            None => {
                self.index.insert(labels.clone(), self.out.len());
                self.out.push(Series { labels: labels.clone(), samples: Vec::new() });
                self.out.len() - 1
            }
        };
        let samples = &mut self.out[i].samples;
        if samples.last().is_some_and(|p| p.t == t) {
            return Err(EvalError::Execution(SAME_LABELSET.into()));
        }
        samples.push(Sample { t, v });
        Ok(())
    }

    fn finish(self) -> Vec<Series> {
        self.out
    }
}

/// For each step, the `(series index, value)` pairs present, from series on the step grid.
fn by_step(ev: &Evaluator<'_>, series: &[Series]) -> Vec<Vec<(usize, f64)>> {
    let mut steps = vec![Vec::new(); ev.steps];
    for (i, s) in series.iter().enumerate() {
        for p in &s.samples {
            steps[ev.step_of(p.t)].push((i, p.v));
        }
    }
    steps
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

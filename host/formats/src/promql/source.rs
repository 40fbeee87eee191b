//! Where the evaluator reads data: the [`Source`] trait a node implements over its series
//! dictionary and stores, and [`MemorySource`], the in-memory one tests use.
//!
//! A source answers three questions: which series match these label matchers (`select`),
//! what are a series' samples in a time range (`samples`), and, optionally, what is a range
//! function over a series' windows (`windows`). The last has a default that reads the samples
//! and computes ([`window::evaluate`]); a node overrides it to answer `*_over_time` from
//! per-quantum summaries or `rate` from owner-side partials, and falls back on the default.

use std::collections::{BTreeMap, BTreeSet};

use super::labels::Labels;
use super::matcher::{Matcher, matches_all};
use super::window::{self, RangeFunction, Windows};

/// The bit pattern of Prometheus' staleness marker (a NaN).
pub const STALE_NAN_BITS: u64 = crate::remote_write::STALE_NAN_BITS;

/// Whether a value is Prometheus' staleness marker.
pub fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN_BITS
}

/// One sample: milliseconds since the Unix epoch, and the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t: i64,
    pub v: f64,
}

/// A series handle, meaningful to the source that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesId(pub u64);

/// A series a selection found: the source's handle and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedSeries {
    pub id: SeriesId,
    pub labels: Labels,
}

/// A source that cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error(
        "the selector {selector} matches more than the limit of {limit} series; narrow it with more label matchers"
    )]
    TooManySeries { selector: String, limit: usize },
    #[error("the query was canceled")]
    Canceled,
    #[error("the query timed out")]
    Timeout,
    /// Anything else that failed reading the data (a store error, a peer that did not answer).
    #[error("reading the data failed: {0}")]
    Failed(String),
}

/// A range function to compute over every window of one series.
#[derive(Debug, Clone, Copy)]
pub struct WindowRequest<'a> {
    pub function: RangeFunction,
    pub windows: Windows,
    /// The function's parameter per step (the quantile of `quantile_over_time`).
    pub params: &'a [f64],
}

/// The data a query reads. Timestamps are milliseconds since the Unix epoch.
pub trait Source {
    /// The series whose labels satisfy every matcher (an empty list matches every series) and
    /// that may hold samples in `[start_ms, end_ms]`. More than `limit` series is
    /// [`SourceError::TooManySeries`].
    fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
        limit: usize,
    ) -> Result<Vec<SelectedSeries>, SourceError>;

    /// Appends the series' samples with `start_ms <= t <= end_ms` to `out`, sorted by time.
    /// Staleness markers ([`STALE_NAN_BITS`]) are samples here; the evaluator interprets them.
    fn samples(
        &self,
        series: &SelectedSeries,
        start_ms: i64,
        end_ms: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), SourceError>;

    /// Appends `(evaluation time, value)` of `request.function` for each window of the
    /// series that has a value, and returns how many raw samples it read (the evaluator
    /// counts them against its sample limit; a source answering from summaries reads none).
    /// The default reads the samples and computes with [`window::evaluate`].
    fn windows(
        &self,
        series: &SelectedSeries,
        request: &WindowRequest<'_>,
        out: &mut Vec<Sample>,
    ) -> Result<usize, SourceError> {
        let (start, end) = request.windows.span();
        let mut buf = Vec::new();
        self.samples(series, start, end, &mut buf)?;
        window::evaluate(request.function, &buf, &request.windows, request.params, out);
        Ok(buf.len())
    }
}

/// Series and samples held in memory: the reference source of the tests, and what a node may
/// fill when it fetches a query's data ahead of evaluating it.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    series: BTreeMap<Labels, Vec<Sample>>,
}

impl MemorySource {
    pub fn new() -> MemorySource {
        MemorySource::default()
    }

    /// Adds samples to a series (created if new); keeps them sorted by time, the last of
    /// equal timestamps winning.
    pub fn insert(&mut self, labels: Labels, samples: impl IntoIterator<Item = Sample>) {
        let s = self.series.entry(labels).or_default();
        s.extend(samples);
        s.sort_by_key(|x| x.t);
        s.reverse();
        s.dedup_by_key(|x| x.t);
        s.reverse();
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Every series and its samples, sorted by labels.
    pub fn iter(&self) -> impl Iterator<Item = (&Labels, &[Sample])> {
        self.series.iter().map(|(l, s)| (l, s.as_slice()))
    }

    /// Label names of all series, sorted.
    pub fn label_names(&self) -> BTreeSet<String> {
        self.series.keys().flat_map(|l| l.iter().map(|(n, _)| n.to_string())).collect()
    }
}

impl Source for MemorySource {
    fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
        limit: usize,
    ) -> Result<Vec<SelectedSeries>, SourceError> {
        let mut out = Vec::new();
        for (i, (labels, samples)) in self.series.iter().enumerate() {
            let in_range = samples.iter().any(|s| s.t >= start_ms && s.t <= end_ms);
            if in_range && matches_all(matchers, labels) {
                if out.len() == limit {
                    let selector: Vec<String> = matchers.iter().map(|m| m.to_string()).collect();
                    return Err(SourceError::TooManySeries { selector: format!("{{{}}}", selector.join(", ")), limit });
                }
                out.push(SelectedSeries { id: SeriesId(i as u64), labels: labels.clone() });
            }
        }
        Ok(out)
    }

    fn samples(
        &self,
        series: &SelectedSeries,
        start_ms: i64,
        end_ms: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), SourceError> {
        if let Some(s) = self.series.get(&series.labels) {
            let from = s.partition_point(|x| x.t < start_ms);
            let to = s.partition_point(|x| x.t <= end_ms);
            out.extend_from_slice(&s[from..to]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::promql::matcher::MatchOp;

    #[test]
    fn memory_source_selects_and_reads_ranges() {
        let mut m = MemorySource::new();
        let up = |job: &str| Labels::from_pairs([("__name__", "up"), ("job", job)]);
        m.insert(up("a"), [Sample { t: 10, v: 1.0 }, Sample { t: 0, v: 0.0 }, Sample { t: 10, v: 2.0 }]);
        m.insert(up("b"), [Sample { t: 100, v: 1.0 }]);
        let sel = m.select(&[Matcher::metric("up")], 0, 50, 10).unwrap();
        assert_eq!(sel.len(), 1, "b has no sample in [0, 50]");
        let mut out = Vec::new();
        m.samples(&sel[0], 5, 10, &mut out).unwrap();
        assert_eq!(out, vec![Sample { t: 10, v: 2.0 }], "the later write of t=10 wins");
        let all = [Matcher::new("job", MatchOp::Regex, ".+", 1 << 20).unwrap()];
        let e = m.select(&all, 0, 1000, 1).unwrap_err();
        assert!(e.to_string().contains("more than the limit of 1 series"), "{e}");
    }
}

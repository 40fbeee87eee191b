//! PromQL, sans I/O: the parser ([`parse`]), the evaluator of the subset dashboards send
//! ([`eval`]), the data it reads through a [`Source`] (for instant vector selectors, one sample
//! per step: [`thin`]), the answers of Prometheus' HTTP API ([`api`]), and the label sets that
//! stand for series keys ([`labels`]).
//!
//! What the subset holds: instant and range vector selectors with `offset`; `rate`, `irate`,
//! `increase`, `delta`, `deriv`; `avg|min|max|sum|count|last|stddev|stdvar|present_over_time`
//! and `quantile_over_time`; `sum|avg|min|max|count|topk|bottomk|quantile` with `by` or
//! `without`; arithmetic, comparison (`bool`) and set operators with `on`/`ignoring` and
//! `group_left`/`group_right`; `histogram_quantile`, `abs`, `ceil`, `floor`, `round`, `clamp`,
//! `clamp_min`, `clamp_max`, `time`, `vector`, `scalar` and `label_replace`. Everything else in
//! Prometheus' language (subqueries, `@`, the other functions and aggregators) is refused with
//! an error naming it. The semantics are Prometheus 2.x's: 5-minute lookback, staleness
//! markers, the extrapolation of `rate`, closed range windows, `__name__` dropped by functions
//! and arithmetic.
//!
//! Every bound is in [`Limits`]: query length, nesting depth, regex size, matchers, series,
//! samples loaded, points per series and points answered.

pub mod api;
pub mod ast;
pub mod eval;
pub mod labels;
mod lexer;
pub mod matcher;
mod parser;
pub mod source;
pub mod thin;
pub mod window;

use std::fmt;

pub use ast::{Expr, ValueType};
pub use eval::{EvalError, QueryValue, Range, Sample, Series, data_needed, evaluate};
pub use labels::{Labels, METRIC_NAME};
pub use matcher::{MatchOp, Matcher};
pub use parser::parse;
pub use source::{MemorySource, SelectedSeries, SeriesId, Source, SourceError};
pub use thin::{LastSamples, last_samples};

/// The bounds on a query, from its text to its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of query text.
    pub max_query_bytes: usize,
    /// Nesting depth of the expression (parentheses, operators, calls).
    pub max_depth: usize,
    /// Compiled size of one regular expression (matchers, `label_replace`).
    pub max_regex_bytes: usize,
    /// Label matchers in one selector.
    pub max_matchers: usize,
    /// Series one selector may select.
    pub max_series: usize,
    /// Samples held in memory at once (Prometheus' `--query.max-samples`).
    pub max_samples: usize,
    /// Points per series of a range query (Prometheus refuses more than 11,000).
    pub max_points_per_series: usize,
    /// Points (samples) in one answer, over all its series.
    pub max_output_points: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_query_bytes: 64 * 1024,
            max_depth: 128,
            max_regex_bytes: 1 << 20,
            max_matchers: 64,
            max_series: 100_000,
            max_samples: 10_000_000,
            max_points_per_series: 11_000,
            max_output_points: 2_000_000,
        }
    }
}

/// A query that is not valid PromQL, or not in the subset: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line and column (in characters) of the offending token.
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl ParseError {
    pub(crate) fn at(input: &str, pos: usize, message: impl Into<String>) -> ParseError {
        let pos = input.floor_char_boundary(pos.min(input.len()));
        let before = &input[..pos];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        ParseError { line, column, message: message.into() }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: parse error: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for ParseError {}

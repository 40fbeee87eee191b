//! The InfluxQL subset that dashboards and the `influx` tools send, sans I/O: query text in,
//! statements out ([`parse`]); the series each statement needs and how to answer it in
//! InfluxDB's JSON shape ([`answer`]).
//!
//! Supported:
//! - `SELECT <field> [, ...]` or `SELECT mean|min|max|sum|count|first|last(<field>) [AS name]
//!   [, ...] FROM <measurement> [WHERE <tag> = '...' | <tag> != '...' | time <op> <time>
//!   [AND ...]] [GROUP BY time(<w>)[, <tag> ... | *]] [fill(null|none|previous|<number>)]
//!   [ORDER BY time [ASC|DESC]] [LIMIT n] [OFFSET n] [SLIMIT n] [SOFFSET n]`, where a time is
//!   an RFC 3339 string, an integer (nanoseconds), a duration literal (`1700000000000ms`), or
//!   `now()`, each `± <duration>`;
//! - `SHOW MEASUREMENTS`, `SHOW TAG KEYS [FROM m]`, `SHOW TAG VALUES [FROM m] WITH KEY = k |
//!   IN (k, ...) [WHERE ...]`, `SHOW FIELD KEYS [FROM m]`, `SHOW DATABASES`, `SHOW RETENTION
//!   POLICIES`.
//!
//! Anything else is refused with [`QueryError::Unsupported`], naming what is not supported; a
//! `GROUP BY time()` of more than [`timeshard_proto::window::MAX_WINDOWS`] windows with
//! [`QueryError::TooLarge`].
//! Measurements and fields map to series as [`crate::names`] says; quote names that hold a `.`
//! (`FROM "pmu.phase"`), since InfluxQL reads `a.b` as retention policy `a`, measurement `b`.

pub mod answer;
mod lexer;
mod parser;
pub mod time;

use timeshard_proto::SeriesKey;
use timeshard_proto::wire::SeriesFilter;

use crate::names;

pub use parser::parse;

/// What is wrong with a query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("error parsing query: {0}")]
    Syntax(String),
    #[error(
        "unsupported InfluxQL: {0}. timeshard answers SELECT <field> or mean|min|max|sum|count|first|last(<field>) \
         FROM <measurement> WHERE <tag> = '...' AND time >= ... AND time < ... GROUP BY time(<w>), and SHOW \
         MEASUREMENTS, SHOW TAG KEYS, SHOW TAG VALUES, SHOW FIELD KEYS, SHOW DATABASES"
    )]
    Unsupported(String),
    /// A statement that asks for more than one answer may hold (InfluxDB's max-select-buckets).
    #[error("the query is too large: {0}")]
    TooLarge(String),
}

/// One statement of a query.
#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    Select(Select),
    ShowMeasurements {
        limit: Option<usize>,
        offset: usize,
    },
    ShowTagKeys {
        measurement: Option<String>,
    },
    ShowTagValues {
        measurement: Option<String>,
        keys: Vec<String>,
        tags: Vec<TagCond>,
    },
    ShowFieldKeys {
        measurement: Option<String>,
    },
    ShowDatabases,
    ShowRetentionPolicies,
    /// `CREATE DATABASE` or `CREATE RETENTION POLICY`: accepted, nothing to do.
    Create,
}

/// The aggregate functions of the subset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    Mean,
    Min,
    Max,
    Sum,
    Count,
    First,
    Last,
}

impl Agg {
    fn from_name(name: &str) -> Option<Agg> {
        Some(match name.to_ascii_lowercase().as_str() {
            "mean" => Agg::Mean,
            "min" => Agg::Min,
            "max" => Agg::Max,
            "sum" => Agg::Sum,
            "count" => Agg::Count,
            "first" => Agg::First,
            "last" => Agg::Last,
            _ => return None,
        })
    }

    /// The function's name, also its default column name.
    pub fn name(self) -> &'static str {
        match self {
            Agg::Mean => "mean",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Sum => "sum",
            Agg::Count => "count",
            Agg::First => "first",
            Agg::Last => "last",
        }
    }
}

/// One column of a SELECT: a raw field or an aggregate of one.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub agg: Option<Agg>,
    pub field: String,
    /// The column's name in the answer.
    pub name: String,
}

/// A condition on a tag: `key = 'value'` (or `!=`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagCond {
    pub key: String,
    pub value: String,
    pub equal: bool,
}

/// How a SELECT groups its series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupTags {
    /// One group: every matching series together, as InfluxDB does without `GROUP BY <tag>`.
    None,
    Keys(Vec<String>),
    /// `GROUP BY *`: one group per tag set.
    All,
}

/// What a window without data shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    Null,
    None,
    Previous,
    Value(f64),
}

/// A SELECT statement, its times resolved against the query's `now`.
#[derive(Clone, Debug, PartialEq)]
pub struct Select {
    pub columns: Vec<Column>,
    pub measurement: String,
    pub tags: Vec<TagCond>,
    /// First nanosecond of the range (0 when the query sets no lower bound).
    pub start: i64,
    /// First nanosecond after the range.
    pub end: i64,
    /// Whether the query set a lower time bound.
    pub bounded_start: bool,
    /// `GROUP BY time(<w>)`, in nanoseconds.
    pub interval: Option<i64>,
    pub group_tags: GroupTags,
    pub fill: Fill,
    pub descending: bool,
    pub limit: Option<usize>,
    pub offset: usize,
    pub slimit: Option<usize>,
    pub soffset: usize,
}

impl Select {
    /// Whether the columns are aggregates (else raw fields).
    pub fn aggregates(&self) -> bool {
        self.columns.iter().any(|c| c.agg.is_some())
    }

    /// The distinct fields the columns read, each with the metric that holds it.
    pub fn fields(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for c in &self.columns {
            if !out.iter().any(|(f, _)| *f == c.field) {
                out.push((c.field.clone(), names::metric_of(&self.measurement, &c.field)));
            }
        }
        out
    }

    /// The filter that lists the series of `metric` the WHERE clause may select (exact tags are
    /// pushed down; [`Select::matches`] checks the rest).
    pub fn filter(&self, metric: &str) -> SeriesFilter {
        tag_filter(metric, &self.tags)
    }

    /// Whether a listed series is one of the statement's.
    pub fn matches(&self, key: &SeriesKey, metric: &str) -> bool {
        key.metric() == metric && tags_match(key, &self.tags)
    }
}

fn tag_filter(metric_prefix: &str, tags: &[TagCond]) -> SeriesFilter {
    SeriesFilter {
        metric_prefix: metric_prefix.to_string(),
        tags: tags
            .iter()
            .filter(|t| t.equal)
            .map(|t| (names::encode_name(&t.key).into_owned(), names::encode_name(&t.value).into_owned()))
            .collect(),
    }
}

/// Whether `key` passes every tag condition.
pub fn tags_match(key: &SeriesKey, tags: &[TagCond]) -> bool {
    tags.iter().all(|t| {
        let value = key.tag(&names::encode_name(&t.key)).map(names::decode);
        (value.as_deref() == Some(t.value.as_str())) == t.equal
    })
}

impl Statement {
    /// The series listing the statement needs: a filter, and which listed series belong to it.
    pub fn listing(&self) -> Option<SeriesFilter> {
        match self {
            Statement::Select(_) | Statement::ShowDatabases | Statement::ShowRetentionPolicies | Statement::Create => {
                None
            }
            Statement::ShowMeasurements { .. } => Some(SeriesFilter::default()),
            Statement::ShowTagKeys { measurement } | Statement::ShowFieldKeys { measurement } => {
                Some(tag_filter(&measurement.as_deref().map(names::encode_name).unwrap_or_default(), &[]))
            }
            Statement::ShowTagValues { measurement, tags, .. } => {
                Some(tag_filter(&measurement.as_deref().map(names::encode_name).unwrap_or_default(), tags))
            }
        }
    }
}

//! The values a node exchanges with the policy host: policy names, batch outcomes, query
//! partials and results. All serde-friendly; [`Partial`] crosses the network between the owner
//! nodes and the coordinator.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use timeshard_proto::{Point, TimeRange};

use crate::PolicyError;
use crate::error::FailureKind;

/// Longest policy name or version, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Query parameters (`threshold=10`) or an ingest policy's configuration values, passed to the
/// guest as strings.
pub type Params = BTreeMap<String, String>;

/// Which world a policy implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `ingest-policy`: runs on the receiving node over each batch, before replication.
    Ingest,
    /// `query-policy`: `summarize` on the owners of each quantum, `merge` on the coordinator.
    Query,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Ingest => "ingest",
            Kind::Query => "query",
        })
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        match s {
            "ingest" => Ok(Kind::Ingest),
            "query" => Ok(Kind::Query),
            other => Err(format!("{other:?} is not a policy kind: write ingest or query")),
        }
    }
}

fn check_name(what: &str, s: &str) -> Result<(), PolicyError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'));
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Config(format!(
            "policy {what} {s:?} is invalid: use 1 to {MAX_NAME_BYTES} letters, digits and . _ - + \
             (e.g. pmu-validate@1.2.0)"
        )))
    }
}

/// One installed policy: its name and exact version, written `name@version`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
}

impl PolicyRef {
    /// A validated reference.
    pub fn new(name: &str, version: &str) -> Result<PolicyRef, PolicyError> {
        check_name("name", name)?;
        check_name("version", version)?;
        Ok(PolicyRef { name: name.to_string(), version: version.to_string() })
    }
}

impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

impl FromStr for PolicyRef {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, version) = s
            .split_once('@')
            .ok_or_else(|| PolicyError::Config(format!("{s:?} names no version: write name@version")))?;
        PolicyRef::new(name, version)
    }
}

impl TryFrom<String> for PolicyRef {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<PolicyRef> for String {
    fn from(r: PolicyRef) -> String {
        r.to_string()
    }
}

/// A policy named in a binding: `name` (whatever version was installed last) or
/// `name@version` (pinned).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PolicySpec {
    pub name: String,
    pub version: Option<String>,
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{}@{v}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl FromStr for PolicySpec {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('@') {
            Some(_) => {
                let r: PolicyRef = s.parse()?;
                Ok(PolicySpec { name: r.name, version: Some(r.version) })
            }
            None => {
                check_name("name", s)?;
                Ok(PolicySpec { name: s.to_string(), version: None })
            }
        }
    }
}

impl TryFrom<String> for PolicySpec {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<PolicySpec> for String {
    fn from(r: PolicySpec) -> String {
        r.to_string()
    }
}

/// A point an ingest policy refused, and why (at most [`crate::Limits::max_string_bytes`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub point: Point,
    pub reason: String,
}

/// Why a batch was passed through unprocessed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// What to do with a batch of one series after its ingest policy ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IngestOutcome {
    /// The points to store and replicate.
    pub keep: Vec<Point>,
    /// The points refused, to report to the writer.
    pub rejected: Vec<Rejection>,
    /// The policy that ran, if any was bound to the series.
    pub policy: Option<PolicyRef>,
    /// Set when the policy failed and its `on_failure = "pass-through"` let the batch through
    /// unprocessed (`keep` is then the input).
    pub passed_through: Option<Failure>,
}

/// A query policy's partial result over one piece of one quantum, computed on the node that
/// owns the quantum and sent to the coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// The exact policy version that computed it; the merge runs the same version.
    pub policy: PolicyRef,
    /// The time it covers.
    pub range: TimeRange,
    /// Policy-defined numbers (at most [`MAX_PARTIAL_NUMBERS`]).
    pub numbers: Vec<f64>,
    /// Policy-defined points.
    pub points: Vec<Point>,
}

/// Most numbers in a partial or values in a result.
pub const MAX_PARTIAL_NUMBERS: usize = 64;

/// A named number in a query result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedValue {
    pub name: String,
    pub value: f64,
}

/// The merged result of a query policy over a range.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryResult {
    pub policy: PolicyRef,
    pub values: Vec<NamedValue>,
    pub points: Vec<Point>,
}

impl QueryResult {
    /// The value named `name`, if present.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|v| v.name == name).map(|v| v.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        let r: PolicyRef = "pmu-validate@1.2.0".parse().unwrap();
        assert_eq!(r.name, "pmu-validate");
        assert_eq!(r.to_string(), "pmu-validate@1.2.0");
        assert!("pmu-validate".parse::<PolicyRef>().is_err());
        assert!("a b@1".parse::<PolicyRef>().is_err());
        assert!("x@".parse::<PolicyRef>().is_err());
        let s: PolicySpec = "rms".parse().unwrap();
        assert_eq!(s.version, None);
        let s: PolicySpec = "rms@0.1.0".parse().unwrap();
        assert_eq!(s.version.as_deref(), Some("0.1.0"));
        assert_eq!(serde_json::to_string(&r).unwrap(), "\"pmu-validate@1.2.0\"");
    }
}

//! Series classes as the control plane distributes them: the fields of a node's `[[class]]`
//! table, with the checks that keep a fleet's class table consistent.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::KeyFormat;
use timeshard_proto::class::{AgeBy, Replication, ReplicationError};
use timeshard_proto::time::{QuantumLen, TimeError};

/// One series class. The same fields as a node's `[[class]]`; fields the context-of-interest
/// work adds will be optional, so older documents stay valid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// Letters, digits, `-`, `_` and `.`; 1 to 64 characters.
    pub name: String,
    /// Series whose metric starts with this belong to the class (longest prefix wins; empty
    /// catches everything else).
    #[serde(default)]
    pub metric_prefix: String,
    /// `qfi` or `kfi`.
    #[serde(default)]
    pub format: KeyFormat,
    /// Quantum length, e.g. `10s`.
    #[serde(with = "humantime_serde", default = "default_quantum")]
    pub quantum: Duration,
    #[serde(default = "default_rf")]
    pub rf: u8,
    #[serde(default = "default_quorum")]
    pub w: u8,
    #[serde(default = "default_quorum")]
    pub r: u8,
    /// How long points are kept, by event time; `None` keeps them forever.
    #[serde(with = "humantime_serde", default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
    /// With `archive`: sealed blocks older than this (by `age_by`) move to the node's archive
    /// (default 30 days). The tier fields are left out of documents when unset, so fleets that
    /// do not use them keep their digests.
    #[serde(with = "humantime_serde", default, skip_serializing_if = "Option::is_none")]
    pub hot: Option<Duration>,
    /// Export the class's history to the archive each node configures (`[tier] url`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub archive: bool,
    /// What the hot window and retention measure: event time (default) or write time.
    #[serde(default, skip_serializing_if = "AgeBy::is_event")]
    pub age_by: AgeBy,
}

fn default_quantum() -> Duration {
    Duration::from_secs(10)
}
fn default_rf() -> u8 {
    3
}
fn default_quorum() -> u8 {
    2
}

impl ClassSpec {
    /// A class with the node's defaults (QFI, 10 s quanta, RF 3, W 2, R 2, kept forever).
    pub fn new(name: &str, metric_prefix: &str) -> ClassSpec {
        ClassSpec {
            name: name.into(),
            metric_prefix: metric_prefix.into(),
            format: KeyFormat::Qfi,
            quantum: default_quantum(),
            rf: default_rf(),
            w: default_quorum(),
            r: default_quorum(),
            retention: None,
            hot: None,
            archive: false,
            age_by: AgeBy::Event,
        }
    }

    /// Checks the class on its own.
    pub fn validate(&self) -> Result<(), ClassError> {
        let name = &self.name;
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ClassError::BadName { name: name.clone() });
        }
        if self.metric_prefix.len() > 256 || self.metric_prefix.chars().any(char::is_control) {
            return Err(ClassError::BadPrefix { class: name.clone() });
        }
        let ns = i64::try_from(self.quantum.as_nanos()).unwrap_or(i64::MAX);
        QuantumLen::new(ns).map_err(|source| ClassError::Quantum { class: name.clone(), source })?;
        Replication { rf: self.rf, w: self.w, r: self.r }
            .validate()
            .map_err(|source| ClassError::Replication { class: name.clone(), source })?;
        if self.retention.is_some_and(|r| r.is_zero()) {
            return Err(ClassError::ZeroRetention { class: name.clone() });
        }
        if let Some(message) = tier_problem(self.hot, self.archive, self.retention) {
            return Err(ClassError::Tier { class: name.clone(), message });
        }
        Ok(())
    }

    /// Checks a change from `self` (the class as it is) to `new`: what decides where a series'
    /// blocks live and under which ids cannot change under stored data.
    pub fn check_change(&self, new: &ClassSpec) -> Result<(), ClassError> {
        let immutable = |field: &'static str, from: String, to: String| {
            Err(ClassError::Immutable { class: self.name.clone(), field, from, to })
        };
        if self.metric_prefix != new.metric_prefix {
            return immutable("metric_prefix", self.metric_prefix.clone(), new.metric_prefix.clone());
        }
        if self.format != new.format {
            return immutable("format", self.format.to_string(), new.format.to_string());
        }
        if self.quantum != new.quantum {
            let show = |d: Duration| humantime::format_duration(d).to_string();
            return immutable("quantum", show(self.quantum), show(new.quantum));
        }
        Ok(())
    }
}

/// A class or a class table that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    #[error("class name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'")]
    BadName { name: String },
    #[error("class {class:?}: metric_prefix must be at most 256 characters, without control characters")]
    BadPrefix { class: String },
    #[error("class {class:?}: {source}")]
    Quantum { class: String, source: TimeError },
    #[error("class {class:?}: {source}")]
    Replication { class: String, source: ReplicationError },
    #[error("class {class:?}: retention must be positive; leave it out to keep points forever")]
    ZeroRetention { class: String },
    #[error("class {class:?}: {message}")]
    Tier { class: String, message: String },
    #[error("class {name:?} is given twice in one change; give each class once")]
    DuplicateName { name: String },
    #[error(
        "class {class:?} conflicts with class {other:?}: both have metric_prefix {prefix:?}; \
         a series must belong to one class, so give one of them another prefix"
    )]
    DuplicatePrefix { class: String, other: String, prefix: String },
    #[error(
        "class {class:?}: {field} cannot change ({from} -> {to}): it decides where stored blocks \
         live; add a new class with another metric_prefix instead, or `class rm` this one first"
    )]
    Immutable { class: String, field: &'static str, from: String, to: String },
}

/// Default hot window of a class with `archive = true` and no `hot`.
pub const DEFAULT_HOT: Duration = Duration::from_secs(30 * 86_400);

/// What is wrong with a class's tier settings (`hot`, `archive`, and `retention`, which an
/// archived class applies to its archive too), if anything: the node's `[[class]]` checks the
/// same.
pub fn tier_problem(hot: Option<Duration>, archive: bool, retention: Option<Duration>) -> Option<String> {
    if hot.is_some_and(|h| h.is_zero()) {
        return Some("hot must be positive (e.g. 30d)".into());
    }
    if hot.is_some() && !archive {
        return Some("hot applies to archived classes only: set archive = true, or leave hot out".into());
    }
    if archive
        && let Some(keep) = retention
        && keep <= hot.unwrap_or(DEFAULT_HOT)
    {
        return Some(format!(
            "retention ({}) must be longer than the hot window ({}): points would expire before they \
             are archived; lengthen retention, shorten hot, or set archive = false",
            humantime::format_duration(keep),
            humantime::format_duration(hot.unwrap_or(DEFAULT_HOT))
        ));
    }
    None
}

/// Checks a whole class table: every class valid, no name or metric prefix twice.
pub fn validate_table(classes: &[ClassSpec]) -> Result<(), ClassError> {
    let mut prefixes: HashMap<&str, &str> = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for c in classes {
        c.validate()?;
        if !names.insert(c.name.as_str()) {
            return Err(ClassError::DuplicateName { name: c.name.clone() });
        }
        if let Some(other) = prefixes.insert(&c.metric_prefix, &c.name) {
            return Err(ClassError::DuplicatePrefix {
                class: c.name.clone(),
                other: other.to_string(),
                prefix: c.metric_prefix.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_human_durations_and_defaults() {
        let c: ClassSpec =
            serde_json::from_str(r#"{"name":"pmu","metric_prefix":"pmu.","retention":"30days"}"#).unwrap();
        assert_eq!((c.rf, c.w, c.r, c.quantum), (3, 2, 2, Duration::from_secs(10)));
        assert_eq!(c.retention, Some(Duration::from_secs(30 * 86_400)));
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ClassSpec>(&text).unwrap(), c);
        assert!(serde_json::from_str::<ClassSpec>(r#"{"name":"x","retension":"1d"}"#).is_err());
    }

    #[test]
    fn bad_classes_are_explained() {
        let mut c = ClassSpec::new("pmu", "pmu.");
        c.w = 4;
        assert!(c.validate().unwrap_err().to_string().contains("w=4"));
        let mut c = ClassSpec::new("pmu", "pmu.");
        c.quantum = Duration::ZERO;
        assert!(c.validate().unwrap_err().to_string().contains("quantum"));
        assert!(ClassSpec::new("a b", "").validate().is_err());
        let table = [ClassSpec::new("a", "x."), ClassSpec::new("b", "x.")];
        let err = validate_table(&table).unwrap_err();
        assert!(matches!(err, ClassError::DuplicatePrefix { .. }), "{err}");
        let table = [ClassSpec::new("a", "x."), ClassSpec::new("a", "y.")];
        assert!(matches!(validate_table(&table).unwrap_err(), ClassError::DuplicateName { .. }));
        let old = ClassSpec::new("a", "x.");
        let mut new = old.clone();
        new.retention = Some(Duration::from_secs(60));
        old.check_change(&new).unwrap();
        new.quantum = Duration::from_secs(60);
        assert!(old.check_change(&new).unwrap_err().to_string().contains("quantum cannot change (10s -> 1m)"));
    }

    #[test]
    fn tier_fields_are_optional_and_checked() {
        // Left out when unset: a class without them serializes (and digests) as before.
        let plain = ClassSpec::new("pmu", "pmu.");
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("hot") && !text.contains("archive") && !text.contains("age_by"), "{text}");
        let c: ClassSpec =
            serde_json::from_str(r#"{"name":"pmu","hot":"7d","archive":true,"age_by":"write"}"#).unwrap();
        assert_eq!((c.hot, c.archive, c.age_by), (Some(Duration::from_secs(7 * 86_400)), true, AgeBy::Write));
        c.validate().unwrap();
        assert_eq!(serde_json::from_str::<ClassSpec>(&serde_json::to_string(&c).unwrap()).unwrap(), c);
        let mut no_archive = c.clone();
        no_archive.archive = false;
        assert!(no_archive.validate().unwrap_err().to_string().contains("archive = true"));
        let mut kept = c.clone();
        kept.retention = Some(Duration::from_secs(365 * 86_400));
        kept.validate().unwrap();
        kept.retention = Some(Duration::from_secs(7 * 86_400));
        assert!(kept.validate().unwrap_err().to_string().contains("longer than the hot window"));
        let mut zero = c;
        zero.hot = Some(Duration::ZERO);
        assert!(zero.validate().unwrap_err().to_string().contains("positive"));
        assert!(serde_json::from_str::<ClassSpec>(r#"{"name":"x","age_by":"arrival"}"#).is_err());
    }
}

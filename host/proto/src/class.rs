//! Series classes: how a family of series is keyed, quantized and replicated.
//!
//! Every node of a cluster must hold the same class table, because the node that coordinates a
//! write and the one that coordinates a read compute the same keys from it.

use serde::{Deserialize, Serialize};

use crate::key::KeyFormat;
use crate::series::SeriesKey;
use crate::time::QuantumLen;

/// How the series of one class are stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesClass {
    /// A name for logs and errors.
    pub name: String,
    /// Series whose metric starts with this prefix belong to the class; the longest matching
    /// prefix wins. The empty prefix matches every series.
    pub metric_prefix: String,
    /// Quanta-first or key-first ids.
    pub format: KeyFormat,
    /// Length of a time quantum.
    pub quantum: QuantumLen,
    /// Replication factor: how many nodes store each block.
    pub replication: Replication,
}

/// Which age of a block decides when it leaves the hot tier (a class's hot window) and when
/// retention expires it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgeBy {
    /// The time of its points (the end of its quantum): the default.
    #[default]
    Event,
    /// When it was last written: a device that uploads weeks-old data after coming back gets
    /// the full hot window and retention from the day the data arrived.
    Write,
}

impl AgeBy {
    /// Whether this is the default, event time.
    pub fn is_event(&self) -> bool {
        *self == AgeBy::Event
    }
}

impl std::fmt::Display for AgeBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AgeBy::Event => "event",
            AgeBy::Write => "write",
        })
    }
}

impl std::str::FromStr for AgeBy {
    type Err = String;
    fn from_str(s: &str) -> Result<AgeBy, String> {
        match s {
            "event" => Ok(AgeBy::Event),
            "write" => Ok(AgeBy::Write),
            other => {
                Err(format!("age_by {other:?}: use \"event\" (the points' time) or \"write\" (when they arrived)"))
            }
        }
    }
}

/// Replication factor and quorum sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replication {
    /// Replicas per block.
    pub rf: u8,
    /// Acknowledgements a write waits for.
    pub w: u8,
    /// Replicas a read asks.
    pub r: u8,
}

impl Default for Replication {
    fn default() -> Self {
        Replication { rf: 3, w: 2, r: 2 }
    }
}

/// A replication setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid replication rf={rf} w={w} r={r}: need 1 <= w <= rf, 1 <= r <= rf and rf <= {MAX_RF}")]
pub struct ReplicationError {
    rf: u8,
    w: u8,
    r: u8,
}

/// Largest replication factor a class may ask for.
pub const MAX_RF: u8 = 20;

impl Replication {
    /// Checks the quorum sizes.
    pub fn validate(self) -> Result<Replication, ReplicationError> {
        let Replication { rf, w, r } = self;
        if rf == 0 || rf > MAX_RF || w == 0 || w > rf || r == 0 || r > rf {
            return Err(ReplicationError { rf, w, r });
        }
        Ok(self)
    }

    /// Whether reads are guaranteed to see acknowledged writes (R + W > RF).
    pub fn read_your_writes(self) -> bool {
        u16::from(self.r) + u16::from(self.w) > u16::from(self.rf)
    }
}

impl Default for SeriesClass {
    fn default() -> Self {
        SeriesClass {
            name: "default".into(),
            metric_prefix: String::new(),
            format: KeyFormat::Qfi,
            quantum: QuantumLen::DEFAULT,
            replication: Replication::default(),
        }
    }
}

/// The class table of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classes {
    /// Sorted by prefix length, longest first, so the first match is the best.
    classes: Vec<SeriesClass>,
}

impl Classes {
    /// A table from `classes`; a catch-all default class is added if none has the empty prefix.
    pub fn new(mut classes: Vec<SeriesClass>) -> Result<Classes, ReplicationError> {
        for c in &classes {
            c.replication.validate()?;
        }
        if !classes.iter().any(|c| c.metric_prefix.is_empty()) {
            classes.push(SeriesClass::default());
        }
        classes.sort_by_key(|c| std::cmp::Reverse(c.metric_prefix.len()));
        Ok(Classes { classes })
    }

    /// The class of `series`.
    pub fn of(&self, series: &SeriesKey) -> &SeriesClass {
        let metric = series.metric();
        self.classes
            .iter()
            .find(|c| metric.starts_with(&c.metric_prefix))
            .expect("the table always has a catch-all class")
    }

    /// All classes, longest prefix first.
    pub fn iter(&self) -> impl Iterator<Item = &SeriesClass> {
        self.classes.iter()
    }

    /// The largest replication factor of any class.
    pub fn max_rf(&self) -> u8 {
        self.classes.iter().map(|c| c.replication.rf).max().unwrap_or(1)
    }
}

impl Default for Classes {
    fn default() -> Self {
        Classes::new(Vec::new()).expect("the default class is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins() {
        let classes = Classes::new(vec![
            SeriesClass { name: "pmu".into(), metric_prefix: "pmu.".into(), ..Default::default() },
            SeriesClass {
                name: "pmu-kfi".into(),
                metric_prefix: "pmu.kfi".into(),
                format: KeyFormat::Kfi,
                ..Default::default()
            },
        ])
        .unwrap();
        assert_eq!(classes.of(&"pmu.kfi.x".parse().unwrap()).name, "pmu-kfi");
        assert_eq!(classes.of(&"pmu.phase".parse().unwrap()).name, "pmu");
        assert_eq!(classes.of(&"cpu".parse().unwrap()).name, "default");
    }

    #[test]
    fn impossible_quorums_are_refused() {
        assert!(Replication { rf: 3, w: 4, r: 1 }.validate().is_err());
        assert!(Replication { rf: 0, w: 0, r: 0 }.validate().is_err());
        assert!(Replication { rf: 3, w: 2, r: 0 }.validate().is_err());
        assert!(Replication { rf: 3, w: 2, r: 2 }.validate().unwrap().read_your_writes());
        assert!(!Replication { rf: 3, w: 1, r: 1 }.read_your_writes());
    }
}

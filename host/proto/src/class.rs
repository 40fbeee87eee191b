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
    /// Replication factor: how many nodes store each block. For a class with `coi`, derived
    /// from it ([`Coi::replication`]).
    pub replication: Replication,
    /// Context-of-interest replication: blocks placed by the series' location.
    #[serde(default)]
    pub coi: Option<Coi>,
}

/// Context-of-interest replication of a class (FogStore): `n_in` replicas near the series'
/// location, kept by quorum, and `n_out` far away, kept asynchronously, for surviving the loss
/// of a region. Distances are in metres (operators write `50km`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coi {
    /// In-CoI replicas: the nodes closest to the series' location.
    pub n_in: u8,
    /// Out-of-CoI replicas: nodes at least `out_coi_m` away.
    pub n_out: u8,
    /// How far from the series' location in-CoI replicas are first looked for (widened, x2 a
    /// step, when too few nodes are that close).
    pub in_coi_m: u32,
    /// How far out-of-CoI replicas must at least be.
    pub out_coi_m: u32,
    /// A client within this distance of the series' location is inside its context of
    /// interest: it gets quorum reads over the in-CoI replicas.
    pub coi_size_m: u32,
    /// Geohash characters locations are quantized to: nodes in the series' cell are equally
    /// close, and rendezvous hashing spreads series over them.
    pub precision: u8,
    /// Location of the class's series that carry none in their tags.
    pub location: Option<crate::geo::Cell>,
}

/// CoI parameters that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoiError {
    #[error("coi: n_in must be at least 1 and n_in + n_out at most {MAX_RF} (n_in={0}, n_out={1})")]
    Replicas(u8, u8),
    #[error("coi: out_coi_dist ({out} m) must be at least in_coi_dist ({inside} m)")]
    Distances { inside: u32, out: u32 },
    #[error("coi: {0}")]
    Geo(#[from] crate::geo::GeoError),
    #[error(
        "series {0} has no location: its class places data by location; add a tag geohash=<geohash> or tags \
         lat=<degrees> and lon=<degrees>, or give the class a default coi.location"
    )]
    NoLocation(String),
    #[error("series {series}: {source}")]
    BadTag { series: String, source: crate::geo::GeoError },
}

impl Coi {
    /// Acknowledgements of in-CoI replicas a write waits for: a majority.
    pub fn w_in(&self) -> u8 {
        self.n_in / 2 + 1
    }

    /// In-CoI replicas a read inside the CoI asks: enough to overlap every write quorum.
    pub fn r_in(&self) -> u8 {
        self.n_in - self.w_in() + 1
    }

    /// The class's replication: every replica, the in-CoI write and read quorums.
    pub fn replication(&self) -> Replication {
        Replication { rf: self.n_in + self.n_out, w: self.w_in(), r: self.r_in() }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CoiError> {
        if self.n_in == 0 || u16::from(self.n_in) + u16::from(self.n_out) > u16::from(MAX_RF) {
            return Err(CoiError::Replicas(self.n_in, self.n_out));
        }
        crate::geo::check_precision(self.precision)?;
        for m in [self.in_coi_m, self.out_coi_m, self.coi_size_m] {
            if m == 0 {
                return Err(crate::geo::GeoError::Distance("0".into()).into());
            }
        }
        if self.out_coi_m < self.in_coi_m {
            return Err(CoiError::Distances { inside: self.in_coi_m, out: self.out_coi_m });
        }
        Ok(())
    }

    /// The location of `series`: its `geohash` tag, or its `lat` and `lon` tags, or the class
    /// default.
    pub fn location_of(&self, series: &SeriesKey) -> Result<crate::geo::GeoPoint, CoiError> {
        match crate::geo::tagged_location(series) {
            Ok(Some(at)) => Ok(at),
            Ok(None) => self.location.map(|c| c.center()).ok_or_else(|| CoiError::NoLocation(series.to_string())),
            Err(source) => Err(CoiError::BadTag { series: series.to_string(), source }),
        }
    }
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
            coi: None,
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
        for c in &mut classes {
            if let Some(coi) = &c.coi {
                c.replication = coi.replication();
            }
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

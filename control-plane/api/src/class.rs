//! Series classes as the control plane distributes them: the fields of a node's `[[class]]`
//! table, with the checks that keep a fleet's class table consistent.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::KeyFormat;
use timeshard_proto::class::{AgeBy, Coi, Replication, ReplicationError};
use timeshard_proto::geo::{GeoPoint, MAX_PRECISION, parse_distance_m};
pub use timeshard_proto::size::ByteSize;
use timeshard_proto::time::{QuantumLen, TimeError};

/// One series class. The same fields as a node's `[[class]]`; fields added later (tier,
/// context of interest) are optional and left out when unset, so older documents stay valid
/// and keep their digests.
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
    /// With `archive`: higher priorities are exported first in each round (0 to 255).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub export_priority: u8,
    /// What the hot window and retention measure: event time (default) or write time.
    #[serde(default, skip_serializing_if = "AgeBy::is_event")]
    pub age_by: AgeBy,
    /// Context-of-interest replication (placement by the series' location); `rf`, `w` and `r`
    /// are then derived from it (n_in + n_out, and the in-CoI quorums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coi: Option<CoiSpec>,
    /// Most bytes the class may hold in a node's store (e.g. `"2GiB"`); unset: no quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<ByteSize>,
    /// What a node does when the class holds its quota (see [`OnFull`]).
    #[serde(default, skip_serializing_if = "OnFull::is_refuse")]
    pub on_full: OnFull,
}

/// What a node does when a class holds its quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFull {
    /// Refuse writes of the class until retention (or the archive, for an archived class) frees
    /// room: nothing stored is lost.
    #[default]
    Refuse,
    /// Drop the class's oldest ended blocks, counted: for a class that may lose its oldest
    /// data. An archived class drops only blocks the archive holds (its hot window shrinks),
    /// and refuses writes when the archive cannot take them.
    EvictOldest,
}

impl OnFull {
    pub fn is_refuse(&self) -> bool {
        *self == OnFull::Refuse
    }
}

impl std::str::FromStr for OnFull {
    type Err = String;

    fn from_str(s: &str) -> Result<OnFull, String> {
        match s {
            "refuse" => Ok(OnFull::Refuse),
            "evict_oldest" => Ok(OnFull::EvictOldest),
            other => Err(format!("on_full {other:?}: use refuse or evict_oldest")),
        }
    }
}

impl std::fmt::Display for OnFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnFull::Refuse => "refuse",
            OnFull::EvictOldest => "evict_oldest",
        })
    }
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// What is wrong with a class's `export_priority`, if anything: it orders exports, so it needs
/// `archive`. The node's `[[class]]` checks the same.
pub fn priority_problem(export_priority: u8, archive: bool) -> Option<String> {
    (export_priority > 0 && !archive)
        .then(|| "export_priority applies to archived classes only: set archive = true, or leave it out".into())
}

/// Smallest class quota: less would fill with one block.
pub const MIN_QUOTA: u64 = 64 << 10;

/// What is wrong with a class's quota settings, if anything: the node's `[[class]]` checks the
/// same.
pub fn quota_problem(quota: Option<ByteSize>, on_full: OnFull) -> Option<String> {
    match quota {
        None if on_full != OnFull::Refuse => {
            Some(format!("on_full = \"{on_full}\" needs a quota (e.g. quota = \"2GiB\")"))
        }
        Some(q) if q.0 < MIN_QUOTA => Some(format!("quota {q} is below the smallest, {}", ByteSize(MIN_QUOTA))),
        _ => None,
    }
}

/// A class's context-of-interest parameters, as a node's `[[class]]` writes them:
/// `coi = { n_in = 2, n_out = 1, in_coi_dist = "50km", out_coi_dist = "1000km", coi_size = "50km",
/// precision = 5 }`. The node's file and the control plane share this type, so both check
/// the same rules with the same messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoiSpec {
    /// In-CoI replicas (written and read by quorum: W = n_in/2 + 1, R = n_in - W + 1).
    pub n_in: u8,
    /// Out-of-CoI replicas (written asynchronously).
    #[serde(default)]
    pub n_out: u8,
    /// Radius in-CoI replicas are first looked for in (`50km`, `500m`; a bare number is km).
    pub in_coi_dist: String,
    /// Least distance of out-of-CoI replicas from the series.
    pub out_coi_dist: String,
    /// Clients within this distance of a series get quorum reads over its in-CoI replicas.
    pub coi_size: String,
    /// Geohash characters (1-12) locations are quantized to before they are compared.
    pub precision: u8,
    /// Location of the class's series that carry no `geohash` or `lat`/`lon` tags: a geohash
    /// or `LAT,LON`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

impl CoiSpec {
    /// The parameters, checked; the error names the parameter (`coi.in_coi_dist: ...`).
    pub fn coi(&self) -> Result<Coi, String> {
        let dist = |name: &str, v: &str| parse_distance_m(v).map_err(|e| format!("coi.{name}: {e}"));
        let location = match &self.location {
            None => None,
            Some(l) if l.contains(',') => {
                Some(l.parse::<GeoPoint>().map_err(|e| format!("coi.location: {e}"))?.cell(MAX_PRECISION))
            }
            Some(l) => Some(l.parse().map_err(|e| format!("coi.location: {e}"))?),
        };
        let coi = Coi {
            n_in: self.n_in,
            n_out: self.n_out,
            in_coi_m: dist("in_coi_dist", &self.in_coi_dist)?,
            out_coi_m: dist("out_coi_dist", &self.out_coi_dist)?,
            coi_size_m: dist("coi_size", &self.coi_size)?,
            precision: self.precision,
            location,
        };
        coi.validate().map_err(|e| e.to_string())?;
        Ok(coi)
    }

    /// Sets the parameter `name` from text, as the CLI's `--coi name=value,...` gives it.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let count = |v: &str| v.trim().parse::<u8>().map_err(|_| format!("coi.{name}: {v:?} is not a number (0-255)"));
        match name {
            "n_in" => self.n_in = count(value)?,
            "n_out" => self.n_out = count(value)?,
            "in_coi_dist" => self.in_coi_dist = value.trim().into(),
            "out_coi_dist" => self.out_coi_dist = value.trim().into(),
            "coi_size" => self.coi_size = value.trim().into(),
            "precision" => self.precision = count(value)?,
            "location" => self.location = Some(value.trim().into()).filter(|l: &String| !l.is_empty()),
            _ => return Err(format!("unknown coi parameter {name:?}; the parameters: {}", COI_PARAMS.join(", "))),
        }
        Ok(())
    }
}

/// The parameters of [`CoiSpec`], in the order the README explains them.
pub const COI_PARAMS: &[&str] = &["n_in", "n_out", "in_coi_dist", "out_coi_dist", "coi_size", "precision", "location"];

/// The parameters `name=value,name=value` (a `location` may be `LAT,LON`: a part without `=`
/// continues the value before it) laid over `base`, or over nothing for a new CoI, in which
/// case `n_in`, the three distances and `precision` must be given.
pub fn parse_coi(text: &str, base: Option<&CoiSpec>) -> Result<CoiSpec, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for part in text.split(',') {
        match part.split_once('=') {
            Some((k, v)) => pairs.push((k.trim().to_string(), v.to_string())),
            None => match pairs.last_mut() {
                Some((_, v)) => {
                    v.push(',');
                    v.push_str(part);
                }
                None => return Err(format!("coi {text:?}: write name=value,name=value (e.g. n_in=2,n_out=1,...)")),
            },
        }
    }
    let given = |name: &str| pairs.iter().any(|(k, _)| k == name);
    let mut spec = match base {
        Some(b) => b.clone(),
        None => {
            let required = ["n_in", "in_coi_dist", "out_coi_dist", "coi_size", "precision"];
            let missing: Vec<&str> = required.into_iter().filter(|r| !given(r)).collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the class has no coi yet: give {} too (e.g. n_in=2,n_out=1,in_coi_dist=50km,\
                     out_coi_dist=1000km,coi_size=50km,precision=5)",
                    missing.join(", ")
                ));
            }
            CoiSpec {
                n_in: 0,
                n_out: 0,
                in_coi_dist: String::new(),
                out_coi_dist: String::new(),
                coi_size: String::new(),
                precision: 0,
                location: None,
            }
        }
    };
    for (k, v) in &pairs {
        spec.set(k, v)?;
    }
    Ok(spec)
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
            export_priority: 0,
            age_by: AgeBy::Event,
            coi: None,
            quota: None,
            on_full: OnFull::Refuse,
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
        if let Some(message) = tier_problem(self.hot, self.archive, self.retention)
            .or_else(|| priority_problem(self.export_priority, self.archive))
        {
            return Err(ClassError::Tier { class: name.clone(), message });
        }
        if let Some(message) = quota_problem(self.quota, self.on_full) {
            return Err(ClassError::Quota { class: name.clone(), message });
        }
        self.coi().map_err(|message| ClassError::Coi { class: name.clone(), message })?;
        Ok(())
    }

    /// The CoI parameters, checked (`None` for a class without).
    pub fn coi(&self) -> Result<Option<Coi>, String> {
        self.coi.as_ref().map(CoiSpec::coi).transpose()
    }

    /// The replication in force: the class's `rf`, `w`, `r`, or those its CoI derives.
    pub fn replication(&self) -> Replication {
        match self.coi() {
            Ok(Some(coi)) => coi.replication(),
            _ => Replication { rf: self.rf, w: self.w, r: self.r },
        }
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
    #[error("class {class:?}: {message}")]
    Coi { class: String, message: String },
    #[error("class {class:?}: {message}")]
    Quota { class: String, message: String },
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

    #[test]
    fn coi_is_optional_checked_and_derives_replication() {
        let plain = serde_json::to_string(&ClassSpec::new("t", "traffic.")).unwrap();
        assert!(!plain.contains("coi"), "{plain}");
        let text = r#"{"name":"t","metric_prefix":"traffic.","coi":{"n_in":3,"n_out":1,"in_coi_dist":"50km",
            "out_coi_dist":"1000km","coi_size":"20km","precision":5,"location":"33.75,-84.39"}}"#;
        let c: ClassSpec = serde_json::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.replication(), Replication { rf: 4, w: 2, r: 2 });
        assert_eq!(serde_json::from_str::<ClassSpec>(&serde_json::to_string(&c).unwrap()).unwrap(), c);
        // The node file's messages: the parameter at fault, and what is wrong with it.
        for (change, expect) in [
            ("n_in=0", "n_in must be at least 1"),
            ("in_coi_dist=5parsecs", "coi.in_coi_dist"),
            ("out_coi_dist=10km", "out_coi_dist"),
            ("precision=13", "precision"),
            ("location=dn5a", "coi.location"),
            ("location=95,0", "coi.location"),
            ("n_in=20", "n_in + n_out at most"),
        ] {
            let mut bad = c.clone();
            bad.coi = Some(parse_coi(change, c.coi.as_ref()).unwrap());
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.starts_with("class \"t\"") && err.contains(expect), "{change}: {err}");
        }
        assert!(serde_json::from_str::<ClassSpec>(&text.replace("n_out", "n_outside")).is_err());
    }

    #[test]
    fn coi_text_is_parsed_over_the_existing_parameters() {
        let full =
            "n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5,location=33.75,-84.39";
        let spec = parse_coi(full, None).unwrap();
        assert_eq!((spec.n_in, spec.n_out, spec.precision), (2, 1, 5));
        assert_eq!(spec.location.as_deref(), Some("33.75,-84.39"));
        spec.coi().unwrap();
        let wider = parse_coi("n_in=3, in_coi_dist=80km", Some(&spec)).unwrap();
        assert_eq!((wider.n_in, wider.in_coi_dist.as_str(), wider.coi_size.as_str()), (3, "80km", "50km"));
        let err = parse_coi("n_in=2,n_out=1", None).unwrap_err();
        assert!(err.contains("in_coi_dist") && err.contains("precision"), "{err}");
        assert!(parse_coi("radius=5km", Some(&spec)).unwrap_err().contains("unknown coi parameter"));
        assert!(parse_coi("2", Some(&spec)).unwrap_err().contains("name=value"));
        assert!(parse_coi("n_in=two", Some(&spec)).unwrap_err().contains("not a number"));
    }
}

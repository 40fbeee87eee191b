//! Object names of the archive (FORMAT.md, "Layout"): each node writes under its own prefix
//! `node=<node>/` (so object-store credentials can be scoped to it), and below it Hive-style
//! partitions by class and UTC day, one points file and one manifest per export, named by the
//! exporting node and its export sequence in that partition.
//!
//! ```text
//! node=<node>/points/class=<class>/day=<YYYY-MM-DD>/<node>-<seq:010>.parquet      the points
//! node=<node>/manifests/class=<class>/day=<YYYY-MM-DD>/<node>-<seq:010>.parquet   its manifest, written last
//! ```
//!
//! Archives written before the prefix (`points/...` and `manifests/...` at the top, "legacy")
//! are still named by [`FileId`] with `legacy` set, read but never written.
//!
//! Names are pure functions of (class, day, node, seq, legacy), and [`FileId::parse`] inverts
//! them, so a listing is all the catalog needs to know which exports exist.

use std::fmt;

use object_store::path::Path;
use timeshard_proto::Timestamp;

/// Nanoseconds in a UTC day.
pub const DAY_NS: i64 = 86_400 * 1_000_000_000;

/// Top folder of the points files (what foreign engines read).
pub const POINTS_DIR: &str = "points";
/// Top folder of the manifests (commit markers with the block summaries).
pub const MANIFESTS_DIR: &str = "manifests";
/// What a node's own top folder starts with: `node=<node>`.
pub const NODE_PREFIX: &str = "node=";
/// Longest class or node name accepted in an object name.
pub const MAX_NAME_LEN: usize = 64;

/// A name that cannot be part of an object name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} name {name:?} cannot name archive objects: use 1 to {MAX_NAME_LEN} letters, digits, '_' or '-'{extra}")]
pub struct NameError {
    what: &'static str,
    name: String,
    extra: &'static str,
}

fn check_name(what: &'static str, name: &str, extra: &'static str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok { Ok(()) } else { Err(NameError { what, name: name.to_string(), extra }) }
}

/// Checks a class name for use in `class=<name>`.
pub fn check_class(name: &str) -> Result<(), NameError> {
    check_name("class", name, "")
}

/// Checks a node name for use in `<node>-<seq>`.
pub fn check_node(name: &str) -> Result<(), NameError> {
    check_name("node", name, " (e.g. the node id in hex)")
}

/// A UTC day, counted from the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(pub i64);

impl Day {
    /// The day holding `ts`.
    pub fn of(ts: Timestamp) -> Day {
        Day(ts.div_euclid(DAY_NS))
    }

    /// Its first nanosecond.
    pub fn start(self) -> Timestamp {
        self.0 * DAY_NS
    }

    /// Parses `YYYY-MM-DD`.
    pub fn parse(s: &str) -> Option<Day> {
        let b = s.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
        let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let day = days_from_civil(y, m, d)?;
        (Day(day).to_string() == s).then_some(Day(day))
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = civil_from_days(self.0);
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

// Howard Hinnant's algorithms for the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> Option<i64> {
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// Which kind of object a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Points,
    Manifest,
}

impl Kind {
    fn dir(self) -> &'static str {
        match self {
            Kind::Points => POINTS_DIR,
            Kind::Manifest => MANIFESTS_DIR,
        }
    }
}

/// Whose folder: a node's own (`node=<node>/`), or the top of an archive written before
/// prefixes (legacy, read only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner<'a> {
    Node(&'a str),
    Legacy,
}

impl Owner<'_> {
    /// `node=<node>/` or nothing.
    fn root(self) -> String {
        match self {
            Owner::Node(n) => format!("{NODE_PREFIX}{n}/"),
            Owner::Legacy => String::new(),
        }
    }
}

/// The top folder of node `node`: everything it writes is below it.
pub fn node_prefix(node: &str) -> Path {
    Path::from(format!("{NODE_PREFIX}{node}"))
}

/// The node whose top folder `prefix` is (a common prefix of a listing of the archive's top);
/// `None` for any other name.
pub fn parse_node_prefix(prefix: &Path) -> Option<String> {
    let node = prefix.as_ref().strip_prefix(NODE_PREFIX)?;
    check_node(node).ok()?;
    Some(node.to_string())
}

/// One export: the points file and the manifest of node `node`'s export number `seq` in the
/// partition (`class`, `day`), under the node's prefix (or at the top, `legacy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub class: String,
    pub day: Day,
    pub node: String,
    pub seq: u64,
    /// Written before node prefixes: at the archive's top, unsigned (read only).
    pub legacy: bool,
}

impl FileId {
    /// The partition folder `class=<class>/day=<day>` under `kind`'s folder of `owner`.
    pub fn partition(owner: Owner<'_>, kind: Kind, class: &str, day: Day) -> Path {
        Path::from(format!("{}{}/class={class}/day={day}", owner.root(), kind.dir()))
    }

    /// The folder of `kind` for `class` of `owner`.
    pub fn class_prefix(owner: Owner<'_>, kind: Kind, class: &str) -> Path {
        Path::from(format!("{}{}/class={class}", owner.root(), kind.dir()))
    }

    /// Whose folder the export is in.
    pub fn owner(&self) -> Owner<'_> {
        if self.legacy { Owner::Legacy } else { Owner::Node(&self.node) }
    }

    /// The object name of this export's points file or manifest.
    pub fn path(&self, kind: Kind) -> Path {
        Path::from(format!(
            "{}{}/class={}/day={}/{}-{:010}.parquet",
            self.owner().root(),
            kind.dir(),
            self.class,
            self.day,
            self.node,
            self.seq
        ))
    }

    /// The export an object name belongs to, and which of its objects it is; `None` for any
    /// other name (which the archive ignores), among them a file in node `a`'s folder named
    /// as node `b`'s.
    pub fn parse(path: &Path) -> Option<(FileId, Kind)> {
        let parts: Vec<&str> = path.as_ref().split('/').collect();
        let (owner, dir, class, day, file) = match parts.as_slice() {
            [dir, class, day, file] => (None, dir, class, day, file),
            [owner, dir, class, day, file] => (Some(owner.strip_prefix(NODE_PREFIX)?), dir, class, day, file),
            _ => return None,
        };
        let kind = match *dir {
            POINTS_DIR => Kind::Points,
            MANIFESTS_DIR => Kind::Manifest,
            _ => return None,
        };
        let class = class.strip_prefix("class=")?;
        check_class(class).ok()?;
        let day = Day::parse(day.strip_prefix("day=")?)?;
        let stem = file.strip_suffix(".parquet")?;
        let (node, seq) = stem.rsplit_once('-')?;
        check_node(node).ok()?;
        if seq.len() != 10 || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if owner.is_some_and(|o| o != node) {
            return None;
        }
        let id = FileId {
            class: class.to_string(),
            day,
            node: node.to_string(),
            seq: seq.parse().ok()?,
            legacy: owner.is_none(),
        };
        Some((id, kind))
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}class={}/day={}/{}-{:010}", self.owner().root(), self.class, self.day, self.node, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn days_print_as_utc_dates() {
        assert_eq!(Day(0).to_string(), "1970-01-01");
        assert_eq!(Day::of(1_700_000_000 * 1_000_000_000).to_string(), "2023-11-14");
        assert_eq!(Day::of(DAY_NS - 1), Day(0));
        assert_eq!(Day::parse("2024-02-29").unwrap().to_string(), "2024-02-29");
        assert!(Day::parse("2023-02-29").is_none(), "no such date");
        assert!(Day::parse("2023-2-01").is_none());
        assert!(Day::parse("2199-12-31").is_some());
    }

    #[test]
    fn names_follow_the_layout() {
        let id = FileId {
            class: "pmu".into(),
            day: Day::parse("2023-11-14").unwrap(),
            node: "a1b2".into(),
            seq: 7,
            legacy: false,
        };
        assert_eq!(id.path(Kind::Points).as_ref(), "node=a1b2/points/class=pmu/day=2023-11-14/a1b2-0000000007.parquet");
        assert_eq!(
            id.path(Kind::Manifest).as_ref(),
            "node=a1b2/manifests/class=pmu/day=2023-11-14/a1b2-0000000007.parquet"
        );
        assert_eq!(FileId::parse(&id.path(Kind::Manifest)), Some((id.clone(), Kind::Manifest)));
        assert!(id.path(Kind::Points).as_ref().starts_with(node_prefix("a1b2").as_ref()));
        assert_eq!(parse_node_prefix(&node_prefix("a1b2")).as_deref(), Some("a1b2"));
        assert_eq!(parse_node_prefix(&Path::from("points")), None);
        // Archives from before prefixes still name exports.
        let legacy = FileId { legacy: true, ..id.clone() };
        assert_eq!(legacy.path(Kind::Points).as_ref(), "points/class=pmu/day=2023-11-14/a1b2-0000000007.parquet");
        assert_eq!(FileId::parse(&legacy.path(Kind::Points)), Some((legacy, Kind::Points)));
        for other in [
            // A file in one node's folder named as another's.
            "node=ffff/manifests/class=pmu/day=2023-11-14/a1b2-0000000007.parquet",
            "node=/manifests/class=pmu/day=2023-11-14/a1b2-0000000007.parquet",
            "n=a1b2/manifests/class=pmu/day=2023-11-14/a1b2-0000000007.parquet",
            "points/class=pmu/day=2023-11-14/a1b2-0000000007.parquet#1",
            "points/class=pmu/day=2023-11-14/a1b2-7.parquet",
            "points/class=pmu/day=2023-11-14/extra/a1b2-0000000007.parquet",
            "other/class=pmu/day=2023-11-14/a1b2-0000000007.parquet",
            "points/class=p u/day=2023-11-14/a1b2-0000000007.parquet",
        ] {
            assert_eq!(FileId::parse(&Path::from(other)), None, "{other}");
        }
        assert!(check_class("pmu.x").is_err() && check_node("").is_err() && check_node(&"a".repeat(65)).is_err());
    }

    proptest! {
        #[test]
        fn names_round_trip(
            class in "[A-Za-z0-9_-]{1,20}",
            node in "[A-Za-z0-9_-]{1,40}",
            day in 0i64..84_000,
            seq in 0u64..10_000_000_000,
            kind in prop_oneof![Just(Kind::Points), Just(Kind::Manifest)],
            legacy in any::<bool>(),
        ) {
            let id = FileId { class, day: Day(day), node, seq, legacy };
            prop_assert_eq!(FileId::parse(&id.path(kind)), Some((id.clone(), kind)));
            prop_assert_eq!(Day::parse(&Day(day).to_string()), Some(Day(day)));
            prop_assert_eq!(Day::of(Day(day).start()), Day(day));
        }
    }
}

//! The checker: properties over a recorded history, apart from the workload that made it. Each
//! failure names its property (the keys of `scripts/simulate --json`'s `failures`) and what
//! broke it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Event, History, Pt};

/// A property a run broke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub property: &'static str,
    pub detail: String,
}

/// The properties, by name.
pub mod property {
    /// Every acknowledged point is returned by a read after the faults (Jepsen's set-full).
    pub const ACKED_READABLE: &str = "acked_readable";
    /// A read returns each point once, however often its write was replayed.
    pub const NO_DUPLICATES: &str = "no_duplicates";
    /// Nothing is read that no client wrote.
    pub const NO_INVENTED: &str = "no_invented";
    /// An in-CoI `latest` never returns a point older than the newest acknowledged before it began.
    pub const STALE_IN_COI: &str = "stale_in_coi";
    /// An acknowledged point is held by some node or the archive at the end: its last copy was
    /// never dropped.
    pub const LAST_COPY: &str = "last_copy";
    /// A block's replicas are back to RF within the bound after a departure (checked at the
    /// end; a block the archive holds needs no hot copy).
    pub const RF_RESTORED: &str = "rf_restored";
    /// After the faults, every copy of a block agrees (the hot copies of a block the archive
    /// holds leave on their own schedule and are not compared).
    pub const CONVERGED: &str = "converged";
    /// Aggregates equal a recompute from the points read.
    pub const AGGREGATES: &str = "aggregates";
    /// A node's memory stays within its budget.
    pub const MEMORY: &str = "memory";
    /// A node failed to start, or the final reads could not run.
    pub const LIVENESS: &str = "liveness";
    /// After the faults, every running node runs (and has reported) the control plane's last
    /// generation of desired state.
    pub const CONFIG_APPLIED: &str = "config_applied";
}

/// Copies a block must have at the end: its replication factor (both classes use 3).
pub const RF: usize = 3;

/// Every property over `history`.
pub fn check(history: &History) -> Vec<Failure> {
    let mut out = Vec::new();
    let mut fail = |property: &'static str, detail: String| out.push(Failure { property, detail });

    // What was written: acked points per series, every attempted point, ack times.
    let mut acked: BTreeMap<&str, BTreeSet<Pt>> = BTreeMap::new();
    let mut attempted: HashMap<&str, BTreeSet<Pt>> = HashMap::new();
    // Per series: (ack time, newest ts of the write).
    let mut acks: HashMap<&str, Vec<(u64, i64)>> = HashMap::new();
    for e in &history.events {
        if let Event::Write { done, series, points, acked: ok, .. } = e {
            attempted.entry(series).or_default().extend(points.iter().copied());
            if *ok {
                acked.entry(series).or_default().extend(points.iter().copied());
                let newest = points.iter().map(|p| p.0).max().unwrap_or(i64::MIN);
                acks.entry(series).or_default().push((*done, newest));
            }
        }
    }

    for e in &history.events {
        match e {
            Event::Latest { invoked, series, point, error: None, via, .. } => {
                let required = acks
                    .get(series.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|(done, _)| done < invoked)
                    .map(|(_, ts)| *ts)
                    .max();
                if let Some(req) = required
                    && point.is_none_or(|p| p.0 < req)
                {
                    fail(
                        property::STALE_IN_COI,
                        format!(
                            "latest of {series} through node {via} at t={invoked} returned {point:?}; a write acknowledged before held ts {req}"
                        ),
                    );
                }
            }
            Event::FinalRead { series, via, points, error, t } => {
                if let Some(e) = error {
                    fail(property::LIVENESS, format!("final read of {series} through node {via} at t={t} failed: {e}"));
                    continue;
                }
                let mut seen = BTreeSet::new();
                let mut dups = 0;
                for p in points {
                    if !seen.insert(*p) {
                        dups += 1;
                    }
                }
                if dups > 0 {
                    fail(
                        property::NO_DUPLICATES,
                        format!("final read of {series} through node {via}: {dups} points twice"),
                    );
                }
                let missing: Vec<&Pt> =
                    acked.get(series.as_str()).into_iter().flatten().filter(|p| !seen.contains(p)).collect();
                if !missing.is_empty() {
                    fail(
                        property::ACKED_READABLE,
                        format!(
                            "final read of {series} through node {via}: {} acknowledged points missing, first {:?}",
                            missing.len(),
                            missing[0]
                        ),
                    );
                }
                let empty = BTreeSet::new();
                let tried = attempted.get(series.as_str()).unwrap_or(&empty);
                let invented = seen.iter().filter(|p| !tried.contains(p)).count();
                if invented > 0 {
                    fail(property::NO_INVENTED, format!("final read of {series}: {invented} points no client wrote"));
                }
            }
            Event::Aggregate { series, via, width_ns, windows, error: None, .. } => {
                let Some(points) = history.events.iter().find_map(|e| match e {
                    Event::FinalRead { series: s, points, error: None, .. } if s == series => Some(points),
                    _ => None,
                }) else {
                    continue;
                };
                let mut want: BTreeMap<i64, (u64, f64)> = BTreeMap::new();
                for (ts, event) in points {
                    let w = want.entry(ts.div_euclid(*width_ns) * width_ns).or_default();
                    w.0 += 1;
                    w.1 += crate::workload::value_of(*event);
                }
                let got: BTreeMap<i64, (u64, f64)> = windows.iter().map(|w| (w.start, (w.count, w.sum))).collect();
                if got != want {
                    let diff =
                        want.iter().find(|(k, v)| got.get(k) != Some(v)).map(|(k, v)| (*k, *v, got.get(k).copied()));
                    fail(
                        property::AGGREGATES,
                        format!(
                            "aggregates of {series} through node {via} differ from a recompute: first (window, want, got) {diff:?}"
                        ),
                    );
                }
            }
            Event::Aggregate { series, error: Some(e), .. } => {
                fail(property::LIVENESS, format!("final aggregate of {series} failed: {e}"));
            }
            Event::Memory { node, what, used, limit, t } if used > limit => {
                fail(property::MEMORY, format!("node {node} at t={t}: {what} {used} over {limit}"));
            }
            Event::NodeError { node, error, t } => {
                fail(property::LIVENESS, format!("node {node} at t={t}: {error}"));
            }
            Event::Config { node, running, reported, latest, t } if running != latest || reported != latest => {
                fail(
                    property::CONFIG_APPLIED,
                    format!(
                        "node {node} at t={t} runs generation {running} and reported {reported}; the control plane is at {latest}"
                    ),
                );
            }
            Event::Copies { series, quantum, copies, why, archived, .. } if why == "end" => {
                // Past its hot window an archived block is the tier's: repair leaves its hot
                // copies alone, and each replica exports what the archive lacks of its copy and
                // drops it, on its own schedule. What must hold of it is that no acknowledged
                // point is lost (the archive counts as a copy), not that the leftovers agree.
                let digests: BTreeSet<(u64, u64)> = copies.iter().map(|c| (c.count, c.digest)).collect();
                if digests.len() > 1 && *archived == 0 {
                    fail(
                        property::CONVERGED,
                        format!("block {quantum} of {series}: copies disagree at the end: {copies:?}"),
                    );
                }
                if copies.len() < RF && *archived == 0 {
                    fail(
                        property::RF_RESTORED,
                        format!("block {quantum} of {series}: {} copies at the end, RF {RF}", copies.len()),
                    );
                }
            }
            _ => {}
        }
    }

    // Held: what the nodes' stores hold at the end, against what was acknowledged.
    let mut held: HashMap<&str, BTreeSet<Pt>> = HashMap::new();
    let mut audited = false;
    for e in &history.events {
        if let Event::Held { series, points, .. } = e {
            audited = true;
            held.entry(series).or_default().extend(points.iter().copied());
        }
    }
    if audited {
        for (series, points) in &acked {
            let lost: Vec<&Pt> = points.iter().filter(|p| !held.get(series).is_some_and(|h| h.contains(p))).collect();
            if !lost.is_empty() {
                fail(
                    property::LAST_COPY,
                    format!(
                        "{series}: {} acknowledged points on no node's disk nor in the archive, first {:?}",
                        lost.len(),
                        lost[0]
                    ),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_behind_the_control_plane_at_the_end_fails_config_applied() {
        let config = |running, reported| Event::Config { t: 9, node: 4, running, reported, latest: 3 };
        let caught_up = History { events: vec![config(3, 3)] };
        assert!(check(&caught_up).is_empty());
        for (running, reported) in [(2, 3), (3, 2)] {
            let behind = History { events: vec![config(running, reported)] };
            let failures = check(&behind);
            assert_eq!(failures.len(), 1, "{failures:?}");
            assert_eq!(failures[0].property, property::CONFIG_APPLIED);
        }
    }
}

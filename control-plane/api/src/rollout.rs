//! Which version of each policy a node runs, and when a rollout aborts: pure functions over
//! the fleet's policy table, so the control plane decides without I/O and tests need no
//! sockets.
//!
//! # Stable versions and rollouts
//!
//! A completed rollout leaves a *placement*: version V of policy P on the devices its selector
//! picks, for the series its series selector picks. A device's stable version of P is that of
//! the latest placement of P whose selector picks it (none: it runs no P).
//!
//! A rollout freezes its *targets* when it starts: the devices its selector picks then, in a
//! deterministic shuffled order ([`order_targets`]). Its stages reach growing prefixes of that
//! order ([`stages`]): the canary (`--canary N` nodes), then each wave (`--waves 25%,100%`: a
//! share of the targets). Stage 0 is reached at start; `promote` reaches the next one, and
//! reaching the last completes the rollout (its version becomes the stable one of its
//! selector). A target reached by the rollout's stage runs the new version; every other
//! device runs its stable version. Aborting or rolling back ends the rollout: every device
//! runs its stable version again, which the rollout never changed.
//!
//! # Late joiners
//!
//! A device that comes to match the selector after the rollout started (enrolled, or moved,
//! later) is not a target: it belongs to no stage before the last. It runs the stable version
//! until the rollout completes, and the new version from then on; it is never a canary and
//! never part of a wave that has not been promoted to everybody.
//!
//! # Failures
//!
//! [`evaluate`] looks at what the reached targets report for the new version: a node that
//! could not load it, calls that trapped, timed out or failed, or a rejection rate far above
//! the stable version's on the targets not reached yet. Above the threshold the rollout aborts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::geo::Location;
use crate::policy::{
    Kind, MAX_STAGES, PolicyAssignment, PolicyLoadError, PolicyRun, PolicySettings, RolloutSpec, SeriesSelector,
    StageInfo,
};
use crate::selector::Selector;
use crate::token::{hex, sha256};

/// Calls of the new version, over its reached nodes, before a failure ratio counts: one slow
/// call on a busy device must not abort a fleet's rollout.
pub const MIN_CALLS: u64 = 10;
/// Points given to the new version before its rejection rate counts.
pub const MIN_POINTS: u64 = 100;

/// A version as nodes need it to fetch and verify it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleMeta {
    pub kind: Kind,
    pub sha256: String,
    pub size: u64,
    pub signature: String,
}

/// A version made stable on the devices `selector` picks by a completed rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub policy: String,
    pub version: String,
    pub selector: Selector,
    pub series: SeriesSelector,
    #[serde(default)]
    pub settings: PolicySettings,
    /// Generation at which it was made: a later placement wins where selectors overlap.
    pub generation: u64,
}

/// A rollout that still decides what its targets run (running or paused).
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveRollout {
    pub id: String,
    pub spec: RolloutSpec,
    /// Node ids, canary first ([`order_targets`]).
    pub targets: Vec<String>,
    /// Index into [`stages`] of the stage reached.
    pub stage: usize,
}

impl ActiveRollout {
    /// Targets the reached stage covers.
    pub fn reached_count(&self) -> usize {
        let stages = stages(self.spec.canary, &self.spec.waves, self.targets.len());
        stages.get(self.stage).map_or(0, |s| s.nodes as usize)
    }

    /// Whether `node_id` runs the new version now.
    pub fn reaches(&self, node_id: &str) -> bool {
        let reached = self.reached_count();
        self.targets.iter().take(reached).any(|t| t == node_id)
    }

    /// The first stage that reaches target `node_id`; `None` when it is not a target.
    pub fn stage_of(&self, node_id: &str) -> Option<u32> {
        let position = self.targets.iter().position(|t| t == node_id)?;
        let stages = stages(self.spec.canary, &self.spec.waves, self.targets.len());
        stages.iter().position(|s| position < s.nodes as usize).map(|s| s as u32)
    }
}

/// The fleet's policies at one generation: the fleet's policy key, the versions placements and
/// rollouts use, the placements, and the active rollouts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyTable {
    /// The fleet's policy public key (text), which nodes trust.
    pub key: Option<String>,
    /// By `name@version`.
    pub modules: BTreeMap<String, ModuleMeta>,
    pub placements: Vec<Placement>,
    pub rollouts: Vec<ActiveRollout>,
}

impl PolicyTable {
    /// The stable placement of `policy` on a device (the latest whose selector picks it).
    pub fn stable_for(
        &self,
        policy: &str,
        labels: &BTreeMap<String, String>,
        location: Option<&Location>,
    ) -> Option<&Placement> {
        self.placements
            .iter()
            .filter(|p| p.policy == policy && p.selector.matches(labels, location))
            .max_by_key(|p| p.generation)
    }

    /// What the device `node_id` with `labels` at `location` runs, sorted by name (a version
    /// whose module is unknown is left out: it cannot be fetched).
    pub fn for_node(
        &self,
        node_id: &str,
        labels: &BTreeMap<String, String>,
        location: Option<&Location>,
    ) -> Vec<PolicyAssignment> {
        let mut names: Vec<&str> = self.placements.iter().map(|p| p.policy.as_str()).collect();
        names.extend(self.rollouts.iter().map(|r| r.spec.policy.as_str()));
        names.sort_unstable();
        names.dedup();
        let mut out = Vec::new();
        for name in names {
            let stable = self.stable_for(name, labels, location);
            let rollout = self.rollouts.iter().find(|r| r.spec.policy == name && r.reaches(node_id));
            let assign = |version: &str, series: &SeriesSelector, settings: &PolicySettings, bound: bool| {
                self.modules.get(&format!("{name}@{version}")).map(|m| PolicyAssignment {
                    name: name.to_string(),
                    version: version.to_string(),
                    kind: m.kind,
                    sha256: m.sha256.clone(),
                    size: m.size,
                    signature: m.signature.clone(),
                    bound,
                    series: series.clone(),
                    settings: settings.clone(),
                })
            };
            match (rollout, stable) {
                (Some(r), stable) => {
                    let new = assign(&r.spec.version, &r.spec.series, &r.spec.settings, true);
                    // A query policy keeps its stable version installed beside the new one,
                    // so a query pinned to the stable version runs here too.
                    if let (Some(s), Some(n)) = (stable, &new)
                        && n.kind == Kind::Query
                        && s.version != n.version
                    {
                        out.extend(assign(&s.version, &s.series, &s.settings, false));
                    }
                    out.extend(new);
                }
                (None, Some(s)) => out.extend(assign(&s.version, &s.series, &s.settings, true)),
                (None, None) => {}
            }
        }
        out
    }
}

/// Checks a rollout's stages and threshold.
pub fn validate_plan(spec: &RolloutSpec) -> Result<(), String> {
    let waves = &spec.waves;
    if waves.is_empty() || waves.len() + 1 > MAX_STAGES {
        return Err(format!("give 1 to {} waves, e.g. --waves 25%,100%", MAX_STAGES - 1));
    }
    if waves.iter().any(|&w| w == 0 || w > 100) || waves.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("waves {waves:?} must rise, each between 1% and 100%"));
    }
    if waves.last() != Some(&100) {
        return Err("the last wave must be 100%: a rollout completes when it reaches every targeted node".into());
    }
    if !(0.0..=100.0).contains(&spec.abort_above_pct) || spec.abort_above_pct.is_nan() {
        return Err("--abort-above must be between 0% and 100%".into());
    }
    Ok(())
}

/// The stages of a rollout over `targets` nodes: how many (a prefix of the targets) each
/// reaches. The canary (when there is one) is `canary` nodes; each wave reaches its share of
/// the targets, rounded up, and at least as many as the stage before.
pub fn stages(canary: u32, waves: &[u32], targets: usize) -> Vec<StageInfo> {
    let mut out = Vec::new();
    let mut reached = 0u32;
    if canary > 0 {
        reached = canary.min(targets as u32);
        out.push(StageInfo { label: "canary".into(), nodes: reached });
    }
    for &w in waves {
        let share = (targets as u64 * u64::from(w)).div_ceil(100) as u32;
        reached = reached.max(share);
        out.push(StageInfo { label: format!("{w}%"), nodes: reached });
    }
    out
}

/// The order in which a rollout reaches `nodes`: by SHA-256 of the rollout id and the node id,
/// so it is the same wherever it is computed, and each rollout picks other canaries.
pub fn order_targets(rollout_id: &str, nodes: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut keyed: Vec<(String, String)> =
        nodes.into_iter().map(|n| (hex(&sha256(format!("{rollout_id}/{n}").as_bytes())), n)).collect();
    keyed.sort();
    keyed.into_iter().map(|(_, n)| n).collect()
}

/// What one node reports, as [`evaluate`] reads it.
#[derive(Clone, Copy, Debug)]
pub struct NodeReport<'a> {
    pub node_id: &'a str,
    pub policies: &'a [PolicyRun],
    pub errors: &'a [PolicyLoadError],
}

/// Why a rollout must abort, if it must: failures of the new version on the nodes it reached.
pub fn evaluate(rollout: &ActiveRollout, reports: &[NodeReport<'_>]) -> Option<String> {
    let (name, version) = (&rollout.spec.policy, &rollout.spec.version);
    let threshold = rollout.spec.abort_above_pct / 100.0;
    let reached: Vec<&String> = rollout.targets.iter().take(rollout.reached_count()).collect();
    let (mut calls, mut failed, mut points, mut rejected) = (0u64, 0u64, 0u64, 0u64);
    let (mut base_points, mut base_rejected) = (0u64, 0u64);
    for report in reports {
        if !rollout.targets.iter().any(|t| t == report.node_id) {
            continue;
        }
        let is_reached = reached.iter().any(|r| *r == report.node_id);
        if is_reached && let Some(e) = report.errors.iter().find(|e| &e.name == name && &e.version == version) {
            return Some(format!("node {} could not load {name}@{version}: {}", report.node_id, e.error));
        }
        for run in report.policies.iter().filter(|r| &r.name == name) {
            if is_reached && &run.version == version {
                calls += run.calls;
                failed += run.failed_calls();
                points += run.points;
                rejected += run.rejected;
            } else if !is_reached && &run.version != version {
                base_points += run.points;
                base_rejected += run.rejected;
            }
        }
    }
    if calls >= MIN_CALLS && failed as f64 / calls as f64 > threshold {
        return Some(format!(
            "{failed} of {calls} calls of {name}@{version} on the {} nodes it reached trapped, timed out or failed \
             ({:.1}%, above the {:.1}% threshold)",
            reached.len(),
            100.0 * failed as f64 / calls as f64,
            rollout.spec.abort_above_pct
        ));
    }
    if points >= MIN_POINTS && base_points >= MIN_POINTS {
        let (new_rate, base_rate) = (rejected as f64 / points as f64, base_rejected as f64 / base_points as f64);
        // Far above: by more than the threshold, and at least twice the stable version's rate.
        if new_rate - base_rate > threshold && new_rate > 2.0 * base_rate {
            return Some(format!(
                "{name}@{version} rejected {:.1}% of {points} points where the version it replaces rejects {:.1}% \
                 (more than the {:.1}% threshold above it)",
                100.0 * new_rate,
                100.0 * base_rate,
                rollout.spec.abort_above_pct
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::parse_labels;

    fn spec(version: &str, selector: &str, canary: u32, waves: &[u32]) -> RolloutSpec {
        RolloutSpec {
            policy: "pmu-validate".into(),
            version: version.into(),
            selector: Selector { labels: parse_labels(selector).unwrap(), geohash: None },
            series: SeriesSelector { metric_prefix: "pmu.".into(), ..Default::default() },
            settings: PolicySettings::default(),
            canary,
            waves: waves.to_vec(),
            abort_above_pct: 5.0,
        }
    }

    fn meta(kind: Kind) -> ModuleMeta {
        ModuleMeta { kind, sha256: "ab".into(), size: 1, signature: "sig".into() }
    }

    fn table() -> PolicyTable {
        let mut t = PolicyTable::default();
        for v in ["1.0.0", "2.0.0"] {
            t.modules.insert(format!("pmu-validate@{v}"), meta(Kind::Ingest));
        }
        let s = spec("1.0.0", "", 0, &[100]);
        t.placements.push(Placement {
            policy: s.policy,
            version: s.version,
            selector: s.selector,
            series: s.series,
            settings: s.settings,
            generation: 3,
        });
        t
    }

    fn run(version: &str, calls: u64, failed: u64) -> PolicyRun {
        PolicyRun { name: "pmu-validate".into(), version: version.into(), calls, traps: failed, ..Default::default() }
    }

    #[test]
    fn stages_grow_and_end_with_every_target() {
        let s = stages(1, &[25, 100], 4);
        assert_eq!(
            s.iter().map(|s| (s.label.as_str(), s.nodes)).collect::<Vec<_>>(),
            [("canary", 1), ("25%", 1), ("100%", 4)]
        );
        assert_eq!(stages(0, &[10, 100], 1000).iter().map(|s| s.nodes).collect::<Vec<_>>(), [100, 1000]);
        assert_eq!(stages(5, &[100], 2)[0].nodes, 2, "a canary larger than the fleet is the fleet");
        let mut bad = spec("2.0.0", "", 1, &[50, 25]);
        assert!(validate_plan(&bad).is_err());
        bad.waves = vec![50];
        assert!(validate_plan(&bad).unwrap_err().contains("100%"));
        bad.waves = vec![50, 100];
        validate_plan(&bad).unwrap();
    }

    #[test]
    fn targets_are_ordered_the_same_everywhere_and_differently_per_rollout() {
        let nodes: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
        let a = order_targets("r1", nodes.clone());
        assert_eq!(a, order_targets("r1", nodes.iter().rev().cloned()));
        assert_ne!(a, order_targets("r2", nodes.clone()));
        assert_eq!(a.len(), 20);
    }

    #[test]
    fn reached_targets_run_the_new_version_and_late_joiners_the_stable_one() {
        let mut t = table();
        let atl = parse_labels("site=atl").unwrap();
        let sfo = parse_labels("site=sfo").unwrap();
        let targets = order_targets("r", ["a", "b", "c", "d"].map(String::from));
        let canary = targets[0].clone();
        t.rollouts.push(ActiveRollout {
            id: "r".into(),
            spec: spec("2.0.0", "site=atl", 1, &[100]),
            targets,
            stage: 0,
        });
        let version = |t: &PolicyTable, node: &str, labels| {
            let a = t.for_node(node, labels, None);
            assert_eq!(a.len(), 1, "{a:?}");
            a[0].version.clone()
        };
        assert_eq!(version(&t, &canary, &atl), "2.0.0");
        let others: Vec<String> = t.rollouts[0].targets[1..].to_vec();
        for n in &others {
            assert_eq!(version(&t, n, &atl), "1.0.0");
        }
        // A node that joined site=atl after the start is no target: stable until completion.
        assert_eq!(version(&t, "late", &atl), "1.0.0");
        assert_eq!(t.rollouts[0].stage_of("late"), None);
        assert_eq!(t.rollouts[0].stage_of(&canary), Some(0));
        assert_eq!(version(&t, "x", &sfo), "1.0.0");
        // Promoted to its last stage, every target runs it.
        t.rollouts[0].stage = 1;
        assert!(others.iter().all(|n| version(&t, n, &atl) == "2.0.0"));
    }

    #[test]
    fn a_query_policy_keeps_its_stable_version_installed() {
        let mut t = table();
        for m in t.modules.values_mut() {
            m.kind = Kind::Query;
        }
        t.rollouts.push(ActiveRollout {
            id: "r".into(),
            spec: spec("2.0.0", "", 0, &[100]),
            targets: vec!["a".into()],
            stage: 0,
        });
        let a = t.for_node("a", &BTreeMap::new(), None);
        let got: Vec<(&str, bool)> = a.iter().map(|a| (a.version.as_str(), a.bound)).collect();
        assert_eq!(got, [("1.0.0", false), ("2.0.0", true)]);
    }

    #[test]
    fn failures_above_the_threshold_abort() {
        let targets: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let rollout = ActiveRollout { id: "r".into(), spec: spec("2.0.0", "", 1, &[100]), targets, stage: 0 };
        let reached = &rollout.targets[0];
        let other = &rollout.targets[1];
        let ok = [run("2.0.0", 100, 3)];
        let r =
            |node: &str, p: &[PolicyRun]| evaluate(&rollout, &[NodeReport { node_id: node, policies: p, errors: &[] }]);
        assert_eq!(r(reached, &ok), None, "3% is under 5%");
        assert!(r(reached, &[run("2.0.0", 100, 6)]).unwrap().contains("6 of 100 calls"));
        assert_eq!(r(reached, &[run("2.0.0", 5, 5)]), None, "too few calls to judge");
        // Failures of a node the rollout has not reached are not the new version's.
        assert_eq!(r(other, &[run("1.0.0", 100, 100)]), None);
        let errors = [PolicyLoadError { name: "pmu-validate".into(), version: "2.0.0".into(), error: "trap".into() }];
        let why = evaluate(&rollout, &[NodeReport { node_id: reached, policies: &[], errors: &errors }]).unwrap();
        assert!(why.contains("could not load pmu-validate@2.0.0"), "{why}");
    }

    #[test]
    fn a_rejection_rate_far_above_the_stable_versions_aborts() {
        let targets: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let rollout = ActiveRollout { id: "r".into(), spec: spec("2.0.0", "", 1, &[100]), targets, stage: 0 };
        let (reached, other) = (rollout.targets[0].clone(), rollout.targets[1].clone());
        let with = |version: &str, points, rejected| PolicyRun {
            name: "pmu-validate".into(),
            version: version.into(),
            calls: 10,
            points,
            rejected,
            ..Default::default()
        };
        let eval = |new: PolicyRun, old: PolicyRun| {
            let (a, b) = ([new], [old]);
            evaluate(
                &rollout,
                &[
                    NodeReport { node_id: &reached, policies: &a, errors: &[] },
                    NodeReport { node_id: &other, policies: &b, errors: &[] },
                ],
            )
        };
        assert!(eval(with("2.0.0", 1000, 500), with("1.0.0", 1000, 10)).unwrap().contains("rejected 50.0%"));
        assert_eq!(eval(with("2.0.0", 1000, 32), with("1.0.0", 1000, 30)), None, "about the same rate");
    }
}

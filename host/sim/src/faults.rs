//! The faults a seed applies, and when: a plan drawn up front from the seed (so the plan of a
//! failing seed can be printed and read), over the fault period of a run. After it, everything
//! heals: links, partitions, disks and clocks, and every crashed node restarts.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use timeshard_store::faulty_disk::SplitMix64;

use crate::archive::ArchiveFault;
use crate::net::LinkFaults;

/// A family of faults; `--faults` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Loss, duplication and reordering of datagrams.
    Network,
    /// Partitions, one-way ones included.
    Partition,
    /// Crashes and restarts.
    Crash,
    /// Torn and misdirected writes, fsync failures, a full disk, flipped bits.
    Disk,
    /// Skewed and jumping clocks.
    Clock,
    /// Joins, graceful leaves, departures (a node gone for good) and location changes.
    Membership,
    /// The control plane out of reach of every device for a while.
    Control,
    /// A node's requests to the object store fail: 5xx errors, an outage that cuts uploads
    /// short, a request whose answer is lost.
    Archive,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Network,
        Kind::Partition,
        Kind::Crash,
        Kind::Disk,
        Kind::Clock,
        Kind::Membership,
        Kind::Control,
        Kind::Archive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Network => "network",
            Kind::Partition => "partition",
            Kind::Crash => "crash",
            Kind::Disk => "disk",
            Kind::Clock => "clock",
            Kind::Membership => "membership",
            Kind::Control => "control",
            Kind::Archive => "archive",
        }
    }
}

/// The fault families a run enables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Faults(pub Vec<Kind>);

impl Faults {
    pub fn all() -> Faults {
        Faults(Kind::ALL.to_vec())
    }
    pub fn none() -> Faults {
        Faults(Vec::new())
    }
    pub fn has(&self, k: Kind) -> bool {
        self.0.contains(&k)
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        if Kind::ALL.iter().all(|k| self.has(*k)) {
            return f.write_str("all");
        }
        let names: Vec<&str> = self.0.iter().map(|k| k.name()).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for Faults {
    type Err = String;
    fn from_str(s: &str) -> Result<Faults, String> {
        match s {
            "all" => return Ok(Faults::all()),
            "none" | "" => return Ok(Faults::none()),
            _ => {}
        }
        let mut out = Vec::new();
        for name in s.split(',') {
            let k = Kind::ALL.into_iter().find(|k| k.name() == name.trim()).ok_or_else(|| {
                format!("unknown fault family {name:?}: use all, none, or a list of network, partition, crash, disk, clock, membership, control, archive")
            })?;
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out.sort();
        Ok(Faults(out))
    }
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Links(LinkFaults),
    /// Cuts `a` from `b`: both ways, or only from `a` to `b`.
    Partition {
        a: Vec<usize>,
        b: Vec<usize>,
        one_way: bool,
    },
    HealPartitions,
    Crash(usize),
    Restart(usize),
    /// A crash the node never comes back from.
    Depart(usize),
    Join(usize),
    Leave(usize),
    /// A node's location changes (or is cleared: `None`).
    Relocate(usize, Option<(f64, f64)>),
    /// Every node loses its location (a rollout that cleared them).
    ClearLocations,
    /// The control plane becomes unreachable from every device.
    ControlDown,
    /// It is back.
    ControlUp,
    /// Node `.0`'s requests to the object store start failing.
    ArchiveFails(usize, ArchiveFault),
    /// They succeed again.
    ArchiveHeals(usize),
    Skew(usize, i64),
    DiskFull(usize),
    DiskHeal(usize),
    FsyncFails(usize),
    Misdirect(usize),
    BitFlip(usize),
    /// The end of the fault period: everything heals.
    HealAll,
}

/// A plan: actions and when (simulation ns), in time order.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub steps: Vec<(u64, Action)>,
}

/// What a plan is drawn for.
#[derive(Clone, Debug)]
pub struct PlanSpec {
    pub faults: Faults,
    /// Nodes that start with the fleet.
    pub nodes: usize,
    /// Nodes that may join later (indices `nodes..nodes + joiners`).
    pub joiners: usize,
    pub start: Duration,
    pub length: Duration,
}

const SEC: u64 = 1_000_000_000;
/// Nodes whose copies of the same blocks one run may lose (departed, or misdirected writes):
/// RF 3 less one.
const MAX_LOST_COPIES: usize = 2;

impl Plan {
    /// The plan of `seed`.
    pub fn draw(seed: u64, spec: &PlanSpec) -> Plan {
        let mut rng = SplitMix64(seed ^ 0xFA17_5EED);
        let mut steps = Vec::new();
        let start = spec.start.as_nanos() as u64;
        let end = start + spec.length.as_nanos() as u64;
        // Control-plane and object-store faults come from streams of their own, so that
        // enabling them leaves every other fault of a seed's plan where it was.
        let kinds: Vec<Kind> =
            spec.faults.0.iter().copied().filter(|k| !matches!(k, Kind::Control | Kind::Archive)).collect();
        if spec.faults.has(Kind::Control) {
            let mut outages = SplitMix64(seed ^ 0x00C0_4701);
            for _ in 0..outages.below(3) {
                let at = start + outages.below(end - start);
                steps.push((at, Action::ControlDown));
                steps.push(((at + 2 * SEC + outages.below(18 * SEC)).min(end), Action::ControlUp));
            }
        }
        if spec.faults.has(Kind::Archive) {
            let mut faults = SplitMix64(seed ^ 0x00A7_C41E);
            for _ in 0..faults.below(5) {
                let at = start + faults.below(end - start);
                let n = faults.below(spec.nodes as u64) as usize;
                let fault = match faults.below(3) {
                    0 => ArchiveFault::Errors { every: 1 + faults.below(3), count: 1 + faults.below(12) },
                    1 => ArchiveFault::CutAfter(faults.below(4)),
                    _ => ArchiveFault::LostAnswer(faults.below(4)),
                };
                steps.push((at, Action::ArchiveFails(n, fault)));
                steps.push(((at + SEC + faults.below(15 * SEC)).min(end), Action::ArchiveHeals(n)));
            }
        }
        let mut t = start;
        // Nodes down (crashed, departed or left) at once are at most two, so a quorum remains.
        let mut down_until: Vec<u64> = vec![0; spec.nodes + spec.joiners];
        let mut gone = vec![false; spec.nodes + spec.joiners];
        let mut joined = 0;
        let mut departed = false;
        let mut left = false;
        // Nodes given a misdirected write. The disk model misdirects an append onto the start
        // of the store's first segment, where the same oldest blocks sit on every replica: a
        // node gone for good and two misdirected ones can hold all three copies of a block
        // (seed 16762: a departure, then both other replicas of the first quantum damaged).
        // RF 3 survives two lost copies, not three, so a misdirect or a departure that would
        // make three is drawn as before and left out: the rest of the plan stays where it was.
        // Flipped bits land anywhere, so they are not counted.
        let mut misdirected: BTreeSet<usize> = BTreeSet::new();
        while !kinds.is_empty() {
            t += SEC / 2 + rng.below(4 * SEC);
            if t >= end {
                break;
            }
            let members = spec.nodes + joined;
            let down_now = (0..members).filter(|&i| gone[i] || down_until[i] > t).count();
            let pick_up = |rng: &mut SplitMix64| -> Option<usize> {
                let up: Vec<usize> = (0..members).filter(|&i| !gone[i] && down_until[i] <= t).collect();
                (!up.is_empty()).then(|| up[rng.below(up.len() as u64) as usize])
            };
            match kinds[rng.below(kinds.len() as u64) as usize] {
                Kind::Network => {
                    let faults = LinkFaults {
                        drop: [0.0, 0.01, 0.05, 0.2][rng.below(4) as usize],
                        duplicate: [0.0, 0.01, 0.05][rng.below(3) as usize],
                        jitter: Duration::from_millis([0, 5, 30, 150][rng.below(4) as usize]),
                    };
                    steps.push((t, Action::Links(faults)));
                    steps.push((t + SEC + rng.below(8 * SEC), Action::Links(LinkFaults::default())));
                }
                Kind::Partition => {
                    let mut a = Vec::new();
                    let mut b = Vec::new();
                    for i in 0..members {
                        if rng.below(3) == 0 { a.push(i) } else { b.push(i) }
                    }
                    if a.is_empty() || b.is_empty() {
                        continue;
                    }
                    let one_way = rng.below(3) == 0;
                    steps.push((t, Action::Partition { a, b, one_way }));
                    steps.push((t + SEC + rng.below(10 * SEC), Action::HealPartitions));
                }
                Kind::Crash => {
                    if down_now >= 2 {
                        continue;
                    }
                    let Some(n) = pick_up(&mut rng) else { continue };
                    let back = t + SEC / 2 + rng.below(8 * SEC);
                    down_until[n] = back;
                    steps.push((t, Action::Crash(n)));
                    steps.push((back, Action::Restart(n)));
                }
                Kind::Disk => {
                    let Some(n) = pick_up(&mut rng) else { continue };
                    match rng.below(4) {
                        0 => {
                            steps.push((t, Action::DiskFull(n)));
                            steps.push((t + SEC + rng.below(5 * SEC), Action::DiskHeal(n)));
                        }
                        1 => steps.push((t, Action::FsyncFails(n))),
                        2 => {
                            let mut lost = misdirected.clone();
                            lost.insert(n);
                            if lost.len() + usize::from(departed) <= MAX_LOST_COPIES {
                                misdirected.insert(n);
                                steps.push((t, Action::Misdirect(n)));
                            }
                        }
                        _ => steps.push((t, Action::BitFlip(n))),
                    }
                }
                Kind::Clock => {
                    let Some(n) = pick_up(&mut rng) else { continue };
                    // Skews up to ±5 s; now and then a jump of a minute either way.
                    let skew = if rng.below(5) == 0 {
                        if rng.below(2) == 0 { 60 * SEC as i64 } else { -60 * SEC as i64 }
                    } else {
                        rng.below(10 * SEC) as i64 - 5 * SEC as i64
                    };
                    steps.push((t, Action::Skew(n, skew)));
                }
                // Drawn apart, above.
                Kind::Control | Kind::Archive => continue,
                Kind::Membership => match rng.below(6) {
                    0 if joined < spec.joiners => {
                        steps.push((t, Action::Join(spec.nodes + joined)));
                        joined += 1;
                    }
                    1 if !departed && down_now < 2 => {
                        let Some(n) = pick_up(&mut rng) else { continue };
                        if misdirected.iter().filter(|&&d| d != n).count() + 1 > MAX_LOST_COPIES {
                            continue;
                        }
                        departed = true;
                        gone[n] = true;
                        steps.push((t, Action::Depart(n)));
                    }
                    2 if !left && down_now < 2 => {
                        let Some(n) = pick_up(&mut rng) else { continue };
                        left = true;
                        gone[n] = true;
                        steps.push((t, Action::Leave(n)));
                    }
                    3 if rng.below(4) == 0 => steps.push((t, Action::ClearLocations)),
                    _ => {
                        let Some(n) = pick_up(&mut rng) else { continue };
                        let to = match rng.below(3) {
                            0 => None,
                            1 => Some((33.70 + rng.unit() * 0.2, -84.45 + rng.unit() * 0.2)),
                            _ => Some((30.0 + rng.unit() * 15.0, -120.0 + rng.unit() * 40.0)),
                        };
                        steps.push((t, Action::Relocate(n, to)));
                    }
                },
            }
        }
        steps.push((end, Action::HealAll));
        steps.sort_by_key(|(t, _)| *t);
        Plan { steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No plan loses more copies of the oldest blocks than RF 3 survives: misdirected nodes
    /// and the departed one are at most two (seed 16762 had three and lost the first quantum).
    #[test]
    fn no_plan_damages_or_removes_three_replicas_of_the_same_blocks() {
        let spec = PlanSpec {
            faults: Faults::all(),
            nodes: 8,
            joiners: 2,
            start: Duration::from_secs(10),
            length: Duration::from_secs(40),
        };
        let mut misdirects_and_departures = 0;
        for seed in 0..3000 {
            let plan = Plan::draw(seed, &spec);
            let mut lost = BTreeSet::new();
            for (_, a) in &plan.steps {
                if let Action::Misdirect(n) | Action::Depart(n) = a {
                    lost.insert(*n);
                }
            }
            assert!(lost.len() <= MAX_LOST_COPIES, "seed {seed}: {:?}", plan.steps);
            misdirects_and_departures += usize::from(lost.len() == MAX_LOST_COPIES);
        }
        assert!(misdirects_and_departures > 100, "plans still reach two: {misdirects_and_departures}");
    }
}

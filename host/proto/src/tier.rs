//! Decisions of the cold tier, without I/O: when a block is due to leave the hot tier, which
//! owner exports it, which due blocks one bounded round takes, when write-time retention
//! expires a block, and what a node reports for `timeshard archive status`.
//!
//! # Who exports
//!
//! Exactly one owner of a block exports it: the first of its owners (closest to the block's
//! placement id) that is in the membership view, as every owner computes from the same view
//! ([`export_rank`]); the others only wait for the archive to hold their copy. Ownership
//! changes as nodes join and leave, the first owner may be down, or lack the block (it joined
//! after the block was written) or some of its points; so an owner of rank `k` also exports a
//! block still not archived `k * takeover` after it became due ([`exports_now`]). A down owner
//! keeps its rank until the view counts it gone: being down is a guess (a node busy exporting
//! can miss heartbeats), and two owners exporting the same block at once would write its rows
//! twice. A takeover itself never duplicates rows: an export of a block the archive already
//! holds writes only the points it lacks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::class::AgeBy;
use crate::id::Id;
use crate::routing::Contact;
use crate::time::{Quantum, Timestamp};

/// When a block may leave the hot tier: its age by `age_by` reaches `hot_ns`, and it is
/// sealed (its quantum ended `seal_grace_ns` ago), whichever is later. `last_write` is when a
/// write last added points to it.
pub fn due_at(age_by: AgeBy, quantum: Quantum, last_write: Timestamp, hot_ns: i64, seal_grace_ns: i64) -> Timestamp {
    let sealed = quantum.end().saturating_add(seal_grace_ns);
    let aged = match age_by {
        AgeBy::Event => quantum.end(),
        AgeBy::Write => last_write,
    }
    .saturating_add(hot_ns);
    sealed.max(aged)
}

/// Whether retention of `keep_ns` by `age_by` has expired a block at `now`.
pub fn expired(age_by: AgeBy, quantum: Quantum, last_write: Timestamp, keep_ns: i64, now: Timestamp) -> bool {
    let age_from = match age_by {
        AgeBy::Event => quantum.end(),
        AgeBy::Write => last_write,
    };
    age_from.saturating_add(keep_ns) <= now
}

/// The place of `me` in the line of exporters of a block whose owners are `owners` (closest
/// first, gone members left out: the view's owners): its index among them. A node that no
/// longer owns the block comes after every owner.
pub fn export_rank(owners: &[Contact], me: Id) -> usize {
    owners.iter().position(|o| o.id == me).unwrap_or(owners.len())
}

/// Whether the exporter of rank `rank` exports a block due at `due` and last written at
/// `last_write` at `now`: the first at once, each later one `takeover_ns` after the one before
/// it, counted from when the block was due and its points were there (old data written today
/// is due at once, yet the first owner has had no time to export it).
pub fn exports_now(rank: usize, due: Timestamp, last_write: Timestamp, now: Timestamp, takeover_ns: i64) -> bool {
    let wait = takeover_ns.saturating_mul(i64::try_from(rank).unwrap_or(i64::MAX));
    now >= due.max(last_write).saturating_add(wait)
}

/// The due blocks one round takes: at most `budget`, from the earliest days (UTC) on, so each
/// export covers whole days where it can (the archive writes one file per class and day an
/// export touches). Memory stays within the budget however many blocks are due.
#[derive(Clone, Debug)]
pub struct RoundPicker<T> {
    budget: usize,
    total: usize,
    days: BTreeMap<i64, Vec<T>>,
    /// Due blocks offered, taken or not.
    offered: u64,
}

/// Nanoseconds in a day.
const DAY_NS: i64 = 86_400 * 1_000_000_000;

impl<T> RoundPicker<T> {
    /// A picker taking at most `budget` blocks (at least one).
    pub fn new(budget: usize) -> RoundPicker<T> {
        RoundPicker { budget: budget.max(1), total: 0, days: BTreeMap::new(), offered: 0 }
    }

    /// Offers a due block of `quantum`; it is kept while it is among the `budget` earliest by day.
    pub fn offer(&mut self, quantum: Quantum, block: T) {
        self.offered += 1;
        let day = quantum.start.div_euclid(DAY_NS);
        if self.total == self.budget {
            match self.days.last_key_value() {
                Some((&last, _)) if last > day => {}
                // Not earlier than what is kept: it waits for a later round.
                _ => return,
            }
            let mut last = self.days.last_entry().expect("the picker is full");
            last.get_mut().pop();
            if last.get().is_empty() {
                last.remove();
            }
            self.total -= 1;
        }
        self.days.entry(day).or_default().push(block);
        self.total += 1;
    }

    /// Due blocks offered so far, taken or not.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// The blocks taken, earliest day first.
    pub fn finish(self) -> Vec<T> {
        self.days.into_values().flatten().collect()
    }
}

/// What a node reports about the cold tier: the archive as a listing shows it, and this
/// node's exports since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveReport {
    /// The archive's URL (no credentials: those come from the environment); empty when the
    /// node has none.
    pub url: String,
    pub classes: Vec<ArchiveClassReport>,
    /// Points files no manifest commits (exports in progress or interrupted; removed after
    /// the cleanup grace): the first [`MAX_LISTED_FILES`], and how many there are.
    pub uncommitted: Vec<String>,
    pub uncommitted_total: u64,
    /// Manifests whose points file is missing (damage), likewise.
    pub dangling: Vec<String>,
    pub dangling_total: u64,
    /// Why the archive could not be listed for this report, if it could not.
    pub listing_error: Option<String>,
    /// This node's export rounds: when the last one ended (ns since the epoch, 0: none yet),
    /// the last error and when it happened, and the failed rounds in a row since the last
    /// success (rounds back off while it is positive).
    pub last_round_ns: i64,
    pub last_error: Option<String>,
    pub last_error_ns: i64,
    pub failed_rounds: u32,
    /// Manifests this node refused because their seal did not check (not sealed by the node
    /// whose folder they are in, or not by the fleet), and the last few as `path: reason`.
    pub refused_manifests: u64,
    pub refused: Vec<String>,
    /// Exports in the layout from before node folders (read unverified while `read_legacy`).
    pub legacy_exports: u64,
}

/// One class in an [`ArchiveReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveClassReport {
    pub class: String,
    /// Whether the class is archived, its hot window (ns; 0 when not archived) and what its
    /// age is measured by (`event` or `write`).
    pub archive: bool,
    pub hot_ns: i64,
    pub age_by: String,
    /// In the archive (every node's exports): days with exports, the first and last of them
    /// (`YYYY-MM-DD`), exports committed, and the bytes of their points files and manifests.
    pub days: u64,
    pub first_day: String,
    pub last_day: String,
    pub exports: u64,
    pub points_bytes: u64,
    pub manifest_bytes: u64,
    /// This node since it started: exports committed, blocks they archived, and their rows
    /// and bytes.
    pub exported_files: u64,
    pub exported_blocks: u64,
    pub exported_rows: u64,
    pub exported_bytes: u64,
    /// Hot copies this node dropped once the archive held them.
    pub dropped_blocks: u64,
    /// Blocks past their hot window still hot on this node at its last round, and of them
    /// those another owner is to export first.
    pub pending_blocks: u64,
    pub waiting_for_owner: u64,
    /// Blocks this node expired by write-time retention.
    pub expired_blocks: u64,
    /// Archive files this node removed because retention expired every point in them.
    #[serde(default)]
    pub expired_files: u64,
}

/// Files an [`ArchiveReport`] lists by name at most (per list).
pub const MAX_LISTED_FILES: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::QuantumLen;
    use proptest::prelude::*;

    const S: i64 = 1_000_000_000;

    fn contact(b: u8) -> Contact {
        Contact { id: Id([b; 20]), addr: "127.0.0.1:1".parse().unwrap() }
    }

    #[test]
    fn blocks_are_due_after_the_hot_window_once_sealed() {
        let q = QuantumLen::DEFAULT.quantum_of(100 * S);
        // By event time: from the quantum's end.
        assert_eq!(due_at(AgeBy::Event, q, 0, 50 * S, 30 * S), q.end() + 50 * S);
        // By write time: from the last write, however old the points ...
        assert_eq!(due_at(AgeBy::Write, q, 10_000 * S, 50 * S, 30 * S), 10_050 * S);
        // ... but never before the block is sealed.
        assert_eq!(due_at(AgeBy::Write, q, q.start, S, 30 * S), q.end() + 30 * S);
        assert!(expired(AgeBy::Event, q, 0, 10 * S, q.end() + 10 * S));
        assert!(!expired(AgeBy::Write, q, 500 * S, 10 * S, q.end() + 10 * S));
        assert!(expired(AgeBy::Write, q, 500 * S, 10 * S, 510 * S));
    }

    #[test]
    fn the_first_owner_exports_and_later_ones_take_over_in_turn() {
        let owners = [contact(1), contact(2), contact(3)];
        assert_eq!(export_rank(&owners, contact(1).id), 0);
        assert_eq!(export_rank(&owners, contact(3).id), 2);
        // A former owner comes after the owners.
        assert_eq!(export_rank(&owners, contact(9).id), 3);
        assert!(exports_now(0, 100, 0, 100, 50));
        assert!(!exports_now(2, 100, 0, 199, 50));
        assert!(exports_now(2, 100, 0, 200, 50));
        assert!(exports_now(usize::MAX, 0, 0, i64::MAX, 1));
        assert!(!exports_now(usize::MAX, 0, 0, i64::MAX - 1, 1));
        // Old data written lately: the takeover waits from the write, not from the due time.
        assert!(exports_now(0, 100, 1_000, 1_000, 50));
        assert!(!exports_now(1, 100, 1_000, 1_049, 50));
        assert!(exports_now(1, 100, 1_000, 1_050, 50));
    }

    proptest! {
        /// Whatever the order blocks are offered in, the picker keeps `budget` of them, and no
        /// block left out is of an earlier day than one kept.
        #[test]
        fn the_picker_keeps_the_earliest_days(
            days in proptest::collection::vec(0i64..20, 0..300),
            budget in 1usize..50,
        ) {
            let mut picker = RoundPicker::new(budget);
            for (i, d) in days.iter().enumerate() {
                let q = QuantumLen::DEFAULT.quantum_of(d * DAY_NS + i as i64 * S);
                picker.offer(q, (*d, i));
            }
            prop_assert_eq!(picker.offered(), days.len() as u64);
            let kept = picker.finish();
            prop_assert_eq!(kept.len(), days.len().min(budget));
            prop_assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0), "earliest day first");
            let latest_kept = kept.iter().map(|k| k.0).max().unwrap_or(-1);
            let kept_idx: std::collections::BTreeSet<usize> = kept.iter().map(|k| k.1).collect();
            for (i, d) in days.iter().enumerate() {
                if !kept_idx.contains(&i) {
                    prop_assert!(*d >= latest_kept, "day {d} left out while day {latest_kept} was kept");
                }
            }
        }
    }
}

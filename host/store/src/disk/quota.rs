//! Quotas of a [`DiskStore`]: the bytes each class of series holds, measured by maintenance,
//! and the eviction of the oldest ended blocks of classes that allow it.
//!
//! A class's bytes are its sealed frames' bytes plus an estimate for its open points. Eviction
//! counts open points at what the class's sealed points take each, and works like retention
//! with a moving cutoff: it finds the earliest quantum end below which dropping every block
//! brings the class to [`EVICT_TO_PERCENT`] of its quota, and records it as each series'
//! expiry watermark, so the drop survives a restart and late points below it
//! are not stored again. Blocks whose quantum has not ended are never evicted.

use std::sync::atomic::Ordering;

use timeshard_proto::{QuantumLen, Timestamp};

use super::{DiskStore, Maint};
use crate::index::Edit;
use crate::{MaintenanceReport, StoreError};

/// Bytes an open (not yet sealed) point is counted as: about what the log holds of it.
pub const OPEN_POINT_BYTES: u64 = 24;

/// Eviction frees room down to this share of the quota, so that it does not run at every write.
pub const EVICT_TO_PERCENT: u64 = 90;

/// How often (by the maintenance clock) the classes' bytes are measured: each measure walks
/// every block.
const MEASURE_EVERY_NS: i64 = 1_000_000_000;

/// The quota of the series whose metric starts with `metric_prefix` (the longest matching
/// prefix among all rules decides which rule a series counts under: give one rule per class).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRule {
    pub metric_prefix: String,
    /// Most bytes the class may hold; `None` measures without a limit.
    pub max_bytes: Option<u64>,
    /// Past `max_bytes`, drop the oldest ended blocks (the class allows losing them); otherwise
    /// the store only measures, and the caller refuses writes.
    pub evict_oldest: bool,
}

/// What one rule's series hold, as the last measure found, and what eviction removed since open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaUse {
    pub metric_prefix: String,
    pub max_bytes: Option<u64>,
    /// Sealed bytes plus [`OPEN_POINT_BYTES`] per open point.
    pub bytes: u64,
    /// Blocks evicted to keep the quota, since open.
    pub evicted_blocks: u64,
    /// Points those blocks held.
    pub evicted_points: u64,
    /// Bytes they were counted as.
    pub evicted_bytes: u64,
    /// The maintenance clock at the measure (0 before the first).
    pub measured_at: Timestamp,
}

impl QuotaUse {
    /// Whether the class holds at least its quota.
    pub fn full(&self) -> bool {
        self.max_bytes.is_some_and(|max| self.bytes >= max)
    }
}

/// The quota state a store keeps: its rules, the last measure, and when to measure again.
#[derive(Debug, Default)]
pub(super) struct Quotas {
    uses: Vec<QuotaUse>,
    next_measure: i64,
}

impl Quotas {
    pub(super) fn new(rules: &[QuotaRule]) -> Quotas {
        Quotas { uses: uses_of(rules, &[]), next_measure: i64::MIN }
    }
}

/// Fresh uses for `rules`, keeping the eviction counters of `old` rules of the same prefix.
fn uses_of(rules: &[QuotaRule], old: &[QuotaUse]) -> Vec<QuotaUse> {
    rules
        .iter()
        .map(|r| {
            let kept = old.iter().find(|u| u.metric_prefix == r.metric_prefix).cloned().unwrap_or_default();
            QuotaUse { metric_prefix: r.metric_prefix.clone(), max_bytes: r.max_bytes, ..kept }
        })
        .collect()
}

/// The rule `metric` counts under: the longest matching prefix.
fn rule_of(uses: &[QuotaUse], metric: &str) -> Option<usize> {
    uses.iter()
        .enumerate()
        .filter(|(_, u)| metric.starts_with(&u.metric_prefix))
        .max_by_key(|(_, u)| u.metric_prefix.len())
        .map(|(i, _)| i)
}

/// One ended block a class could evict: (quantum end, estimated bytes, points).
type Candidate = (i64, u64, u64);

/// What blocks hold, sealed and open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    sealed_bytes: u64,
    sealed_points: u64,
    open_points: u64,
}

impl Held {
    fn add(&mut self, other: &Held) {
        self.sealed_bytes += other.sealed_bytes;
        self.sealed_points += other.sealed_points;
        self.open_points += other.open_points;
    }

    fn points(&self) -> u64 {
        self.sealed_points + self.open_points
    }

    /// Bytes an open point of this class will take once sealed: what its sealed points take
    /// each, at most [`OPEN_POINT_BYTES`] (which it is while nothing is sealed yet).
    fn open_point_estimate(&self) -> u64 {
        match self.sealed_points {
            0 => OPEN_POINT_BYTES,
            n => self.sealed_bytes.div_ceil(n).clamp(1, OPEN_POINT_BYTES),
        }
    }

    /// Bytes once sealed, with `per_open` bytes for each open point.
    fn estimate(&self, per_open: u64) -> u64 {
        self.sealed_bytes + self.open_points * per_open
    }
}

/// The quantum end at or below which every candidate must go for `total` bytes to come down
/// to `target`; `None` if nothing need go or nothing can.
fn eviction_cutoff(mut candidates: Vec<Candidate>, total: u64, target: u64) -> Option<i64> {
    if total <= target || candidates.is_empty() {
        return None;
    }
    candidates.sort_unstable_by_key(|c| c.0);
    let mut left = total;
    let mut cutoff = None;
    let mut i = 0;
    while i < candidates.len() && left > target {
        // Blocks ending together go together: the cutoff is a time, not a block.
        let end = candidates[i].0;
        while i < candidates.len() && candidates[i].0 == end {
            left = left.saturating_sub(candidates[i].1);
            i += 1;
        }
        cutoff = Some(end);
    }
    cutoff
}

impl DiskStore {
    /// Replaces the quota rules (measured, and enforced, from the next maintenance step).
    pub fn set_quotas(&self, rules: Vec<QuotaRule>) {
        let mut q = self.quotas.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::take(&mut q.uses);
        q.uses = uses_of(&rules, &old);
        q.next_measure = i64::MIN;
        *self.quota_rules.write().unwrap_or_else(|e| e.into_inner()) = rules;
    }

    /// What each quota rule's series held at the last measure, in the rules' order.
    pub fn quota_use(&self) -> Vec<QuotaUse> {
        self.quotas.lock().unwrap_or_else(|e| e.into_inner()).uses.clone()
    }

    /// Measures the bytes each rule's series hold and evicts from the classes over their quota
    /// that allow it (bounded: at most one cutoff per rule per step).
    pub(super) fn quota_step(
        &self,
        m: &mut Maint,
        now: Timestamp,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        let rules = self.quota_rules.read().unwrap_or_else(|e| e.into_inner()).clone();
        if rules.is_empty() {
            return Ok(());
        }
        {
            let mut q = self.quotas.lock().unwrap_or_else(|e| e.into_inner());
            if now < q.next_measure {
                return Ok(());
            }
            q.next_measure = now.saturating_add(MEASURE_EVERY_NS);
        }
        let uses = uses_of(&rules, &[]);
        let mut held = vec![Held::default(); rules.len()];
        let mut candidates: Vec<Vec<(i64, Held)>> = vec![Vec::new(); rules.len()];
        {
            let st = self.read_state();
            self.series_walked.fetch_add(st.series.len() as u64, Ordering::Relaxed);
            for s in st.series.values() {
                let Some(i) = rule_of(&uses, s.key.metric()) else { continue };
                let evicts = rules[i].evict_oldest && rules[i].max_bytes.is_some();
                let len = s.quantum.map_or(0, QuantumLen::ns);
                for (&start, b) in &s.blocks {
                    let h = Held {
                        sealed_bytes: b.sealed_bytes(),
                        sealed_points: b.frames.count(),
                        open_points: b.open.len() as u64,
                    };
                    held[i].add(&h);
                    let end = start.saturating_add(len);
                    if evicts && len > 0 && end <= now {
                        candidates[i].push((end, h));
                    }
                }
            }
        }
        // The gauge counts open points at the log's share.
        let mut bytes: Vec<u64> = held.iter().map(|h| h.estimate(OPEN_POINT_BYTES)).collect();
        let mut evicted = vec![(0u64, 0u64, 0u64); rules.len()];
        for (i, rule) in rules.iter().enumerate() {
            let (Some(max), true) = (rule.max_bytes, rule.evict_oldest) else { continue };
            let target = max / 100 * EVICT_TO_PERCENT;
            // What the class will hold once sealed decides, not the log's larger share of its
            // open points: counted at 24 bytes, points written between a seal and this measure
            // could make eviction take the whole history of every series.
            let per_open = held[i].open_point_estimate();
            let total = held[i].estimate(per_open);
            if total < max {
                continue;
            }
            let class: Vec<Candidate> =
                candidates[i].iter().map(|(end, h)| (*end, h.estimate(per_open), h.points())).collect();
            let Some(cutoff) = eviction_cutoff(class, total, target) else {
                continue;
            };
            evicted[i] = self.evict_before(m, &uses, i, cutoff, report)?;
            bytes[i] = bytes[i].saturating_sub(evicted[i].2);
        }
        let mut q = self.quotas.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::take(&mut q.uses);
        q.uses = uses_of(&rules, &old);
        for (i, u) in q.uses.iter_mut().enumerate() {
            u.bytes = bytes[i];
            u.measured_at = now;
            u.evicted_blocks += evicted[i].0;
            u.evicted_points += evicted[i].1;
            u.evicted_bytes += evicted[i].2;
        }
        Ok(())
    }

    /// Drops every block of rule `rule`'s series that ends at or before `cutoff`, durably (as
    /// expiry watermarks); returns the blocks, points and counted bytes dropped.
    fn evict_before(
        &self,
        m: &mut Maint,
        uses: &[QuotaUse],
        rule: usize,
        cutoff: i64,
        report: &mut MaintenanceReport,
    ) -> Result<(u64, u64, u64), StoreError> {
        let ids: Vec<u32> = {
            let st = self.read_state();
            st.series
                .iter()
                .filter(|(_, s)| rule_of(uses, s.key.metric()) == Some(rule))
                .filter(|(_, s)| {
                    let len = s.quantum.map_or(0, QuantumLen::ns);
                    s.blocks.first_key_value().is_some_and(|(&start, _)| len > 0 && start.saturating_add(len) <= cutoff)
                })
                .map(|(&id, _)| id)
                .collect()
        };
        if ids.is_empty() {
            return Ok((0, 0, 0));
        }
        let edits: Vec<Edit> = ids.iter().map(|&id| Edit::Expire { id, before: cutoff }).collect();
        self.index_append(m, &edits)?;
        let mut dropped = (0u64, 0u64, 0u64);
        let mut st = self.write_state();
        for id in ids {
            st.expire_series(id, cutoff, |b| {
                dropped.0 += 1;
                dropped.1 += b.frames.count() + b.open.len() as u64;
                dropped.2 += b.bytes();
                report.evicted_blocks += 1;
            });
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoff_frees_the_oldest_blocks_down_to_the_target() {
        let blocks = vec![(30, 10, 1), (10, 10, 1), (20, 10, 1), (20, 5, 1), (40, 10, 1)];
        // 45 bytes; down to 30 takes the blocks ending at 10 and 20 (25 bytes): both at 20 go.
        assert_eq!(eviction_cutoff(blocks.clone(), 45, 30), Some(20));
        assert_eq!(eviction_cutoff(blocks.clone(), 45, 35), Some(10));
        assert_eq!(eviction_cutoff(blocks.clone(), 45, 45), None, "nothing over the target");
        assert_eq!(eviction_cutoff(blocks, 45, 0), Some(40), "everything ended may go, nothing more");
        assert_eq!(eviction_cutoff(Vec::new(), 45, 0), None);
    }

    #[test]
    fn a_series_counts_under_its_longest_prefix() {
        let uses = uses_of(
            &[
                QuotaRule { metric_prefix: "".into(), max_bytes: None, evict_oldest: false },
                QuotaRule { metric_prefix: "pmu.".into(), max_bytes: Some(1), evict_oldest: true },
            ],
            &[],
        );
        assert_eq!(rule_of(&uses, "pmu.freq"), Some(1));
        assert_eq!(rule_of(&uses, "env.temp"), Some(0));
    }
}

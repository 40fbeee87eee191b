//! Retention of a [`DiskStore`]: rules by metric prefix, and the maintenance step that drops
//! the blocks they expire (recorded in the index as a per-series watermark).

use std::sync::atomic::Ordering;

use timeshard_proto::Timestamp;

use super::{DiskStore, Maint};
use crate::index::Edit;
use crate::{MaintenanceReport, StoreError};

/// How long the series whose metric starts with `metric_prefix` are kept, by event time.
///
/// The rule with the longest matching prefix decides, among all rules, those that keep forever
/// included: a rule `pmu.phase` that keeps forever protects `pmu.phase.a` from a 90-day rule
/// `pmu.`. A series no rule matches is kept forever. (Give one rule per class, the catch-all
/// class `""` included, so the class that owns a series decides and nothing else.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionRule {
    /// The metric prefix the rule applies to (`""` matches every series).
    pub metric_prefix: String,
    /// Nanoseconds of event time to keep; `None` keeps forever.
    pub keep_ns: Option<i64>,
}

impl RetentionRule {
    /// Keep the matching series for `keep_ns` of event time.
    pub fn new(metric_prefix: impl Into<String>, keep_ns: i64) -> RetentionRule {
        RetentionRule { metric_prefix: metric_prefix.into(), keep_ns: Some(keep_ns) }
    }

    /// Keep the matching series forever (overrides shorter-prefix rules that expire them).
    pub fn forever(metric_prefix: impl Into<String>) -> RetentionRule {
        RetentionRule { metric_prefix: metric_prefix.into(), keep_ns: None }
    }
}

/// How long `metric` is kept under `rules`: the longest matching prefix decides; `None` (keep
/// forever) when that rule says so or no rule matches.
pub(super) fn retention_of(rules: &[RetentionRule], metric: &str) -> Option<i64> {
    rules
        .iter()
        .filter(|r| metric.starts_with(&r.metric_prefix))
        .max_by_key(|r| r.metric_prefix.len())
        .and_then(|r| r.keep_ns)
}

impl DiskStore {
    /// Replaces the retention rules (applied by the next maintenance steps).
    pub fn set_retention(&self, rules: Vec<RetentionRule>) {
        *self.retention.write().unwrap_or_else(|e| e.into_inner()) = rules;
        self.next_expire.store(i64::MIN, Ordering::Relaxed);
    }

    pub(super) fn expire_step(
        &self,
        m: &mut Maint,
        now: Timestamp,
        report: &mut MaintenanceReport,
    ) -> Result<(), StoreError> {
        const MAX_BLOCKS: usize = 10_000;
        let rules = self.retention.read().unwrap_or_else(|e| e.into_inner()).clone();
        // Rules that keep forever expire nothing by themselves.
        let Some(shortest) = rules.iter().filter_map(|r| r.keep_ns).map(|k| k.max(0)).min() else {
            return Ok(());
        };
        if now < self.next_expire.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Retention walks every series: run it about every hundredth of the shortest keep
        // (at most once a minute), not at every step.
        let next = now.saturating_add((shortest / 100).min(60_000_000_000));
        self.next_expire.store(next, Ordering::Relaxed);
        // (series id, new watermark): blocks that end at or before it expire.
        let todo: Vec<(u32, i64)> = {
            let st = self.read_state();
            let mut todo = Vec::new();
            let mut blocks = 0;
            self.series_walked.fetch_add(st.series.len() as u64, Ordering::Relaxed);
            for (&id, s) in &st.series {
                let Some(keep_ns) = retention_of(&rules, s.key.metric()) else {
                    continue;
                };
                let (Some(len), Some((&first, _))) = (s.quantum, s.blocks.first_key_value()) else {
                    continue;
                };
                let cutoff = now.saturating_sub(keep_ns.max(0));
                if first.saturating_add(len.ns()) > cutoff {
                    continue;
                }
                // Bound the work: stop at the end of the MAX_BLOCKS-th expired block.
                let expired: Vec<i64> = s
                    .blocks
                    .range(..=cutoff.saturating_sub(len.ns()))
                    .map(|(&k, _)| k)
                    .take(MAX_BLOCKS - blocks)
                    .collect();
                let before = match expired.last() {
                    Some(&last) if expired.len() == MAX_BLOCKS - blocks => {
                        report.more = true;
                        last + len.ns()
                    }
                    _ => cutoff,
                };
                blocks += expired.len();
                todo.push((id, before));
                if blocks >= MAX_BLOCKS {
                    report.more = true;
                    break;
                }
            }
            if report.more {
                // Bounded: continue at the next step.
                self.next_expire.store(i64::MIN, Ordering::Relaxed);
            }
            todo
        };
        if todo.is_empty() {
            return Ok(());
        }
        let edits: Vec<Edit> = todo.iter().map(|&(id, before)| Edit::Expire { id, before }).collect();
        self.index_append(m, &edits)?;
        let mut st = self.write_state();
        for (id, before) in todo {
            st.expire_series(id, before, |_| report.expired_blocks += 1);
        }
        Ok(())
    }
}

//! Damaged copies fetched again. A block that a read found damaged here (a failed checksum, a
//! frame past its segment's end) is left out of what this node serves, but its digest in
//! memory still matches the replicas', so anti-entropy alone would never fetch it again
//! (issue 24). Before each round the driver drops such a copy (its damaged frames; the points
//! it holds in memory stay) when another owner holds the block, and unsettles this node until
//! a catch-up round has pulled it: the round that follows fetches the replicas' copy. A block
//! no other member owns is kept: its intact frames still read.
//!
//! Reads come across damage only in blocks someone reads. After each round the driver scrubs
//! a step of the store ([`timeshard_store::Store::scrub`], [`SCRUB_FRAMES_PER_ROUND`] sealed frames read and
//! checked, then the next step from where it stopped), so damage in a block nobody queries is
//! found within a pass too (issue 24: seeds 10037 and six others ended with a block at two good
//! copies of three after a misdirected write).

use std::collections::HashSet;

use timeshard_proto::SeriesKey;
use timeshard_proto::repair::BlockRef;
use tracing::{debug, warn};

use super::Repair;

/// Sealed frames a scrub step reads after each round: at the default round of 60 s, a store
/// of a million blocks is checked about every two days, and a step costs a few MiB of reads and
/// their checksums (no point is decoded).
pub(super) const SCRUB_FRAMES_PER_ROUND: usize = 1024;

/// Damaged blocks kept because no other member owns them that were already reported: the scrub
/// and reads find such a block again every round, and one warning says what the next ones
/// would. Bounded: past [`KeptDamaged::MOST`] blocks it forgets them all and reports afresh.
#[derive(Debug, Default)]
pub(super) struct KeptDamaged(HashSet<(SeriesKey, i64)>);

impl KeptDamaged {
    const MOST: usize = 4096;

    /// Notes the block; whether it is new (to report).
    pub(super) fn first_time(&mut self, series: &SeriesKey, quantum_start: i64) -> bool {
        if self.0.len() >= Self::MOST {
            self.0.clear();
        }
        self.0.insert((series.clone(), quantum_start))
    }
}

impl Repair {
    /// Reads and checks the next step of the store; damage found is dropped and fetched again
    /// before the next round ([`Repair::drop_damaged`]). Returns whether it found damage.
    pub(super) async fn scrub_step(&self) -> bool {
        let after = *self.scrub_cursor.lock().expect("scrub cursor lock");
        let store = self.store.clone();
        match timeshard_clock::spawn_blocking(move || store.scrub(after, SCRUB_FRAMES_PER_ROUND)).await {
            Ok(Ok(page)) => {
                // Each damaged block is reported where it is dealt with ([`Repair::drop_damaged`]:
                // every drop, and a kept block once), not here, where a kept one would be
                // reported again every pass.
                if page.damaged > 0 {
                    debug!(damaged = page.damaged, checked = page.checked, "the scrub found damaged blocks");
                }
                *self.scrub_cursor.lock().expect("scrub cursor lock") = page.next;
                page.damaged > 0
            }
            Ok(Err(e)) => {
                warn!(error = %e, "the scrub could not read the store; it tries again next round");
                false
            }
            Err(e) => {
                warn!(error = %e, "the scrub failed");
                false
            }
        }
    }

    /// Drops the damaged copies reads found since the last call that another owner holds;
    /// returns how many.
    pub(super) async fn drop_damaged(&self) -> usize {
        let store = self.store.clone();
        let damaged = match timeshard_clock::spawn_blocking(move || store.take_damaged()).await {
            Ok(d) if !d.is_empty() => d,
            _ => return 0,
        };
        let inv = match self.inventory().await {
            Ok(inv) => inv,
            Err(e) => {
                warn!(blocks = damaged.len(), error = %e, "cannot place damaged blocks; kept as they are");
                return 0;
            }
        };
        let classes = self.coordinator.classes();
        let mut dropped = 0;
        for d in damaged {
            let block = BlockRef::Points { series: d.series.clone(), quantum: d.quantum };
            let owners = inv.place(&block, &classes).unwrap_or_default();
            if !owners.iter().any(|c| c.id != self.me.id) {
                let first = self.kept_damaged.lock().expect("kept damaged lock").first_time(&d.series, d.quantum.start);
                if first {
                    warn!(
                        series = %d.series,
                        quantum = d.quantum.start,
                        "a damaged block no other member owns is kept (its intact frames still read); \
                         reported once, until another owner appears"
                    );
                } else {
                    debug!(series = %d.series, quantum = d.quantum.start, "a damaged block no other member owns is kept");
                }
                continue;
            }
            let store = self.store.clone();
            let (series, start) = (d.series.clone(), d.quantum.start);
            match timeshard_clock::spawn_blocking(move || store.drop_damaged(&series, start)).await {
                Ok(Ok(true)) => {
                    dropped += 1;
                    warn!(
                        series = %d.series,
                        quantum = d.quantum.start,
                        "dropped a damaged copy of a block; anti-entropy fetches it from a replica"
                    );
                }
                // Gone since.
                Ok(Ok(false)) => {}
                Ok(Err(e)) => warn!(series = %d.series, error = %e, "cannot drop a damaged block"),
                Err(e) => warn!(error = %e, "dropping a damaged block failed"),
            }
        }
        if dropped > 0 {
            self.settle().on_copy_lost(timeshard_clock::instant());
            self.state.set_settled(false);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A damaged block no other member owns was reported at warn level every round, as the
    /// scrub and reads found it again: once now, again only after it was forgotten.
    #[test]
    fn a_kept_damaged_block_is_reported_once() {
        let mut kept = KeptDamaged::default();
        let series: SeriesKey = "pmu.pole1".parse().unwrap();
        assert!(kept.first_time(&series, 0));
        for _ in 0..10 {
            assert!(!kept.first_time(&series, 0), "the same block again");
        }
        assert!(kept.first_time(&series, 10), "another quantum is another block");
        for q in 0..KeptDamaged::MOST as i64 {
            kept.first_time(&series, 100 + q);
        }
        assert!(kept.0.len() <= KeptDamaged::MOST, "bounded: {}", kept.0.len());
    }
}

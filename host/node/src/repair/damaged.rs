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

use timeshard_proto::repair::BlockRef;
use tracing::warn;

use super::Repair;

/// Sealed frames a scrub step reads after each round: at the default round of 60 s, a store
/// of a million blocks is checked about every two days, and a step costs a few MiB of reads and
/// their checksums (no point is decoded).
pub(super) const SCRUB_FRAMES_PER_ROUND: usize = 1024;

impl Repair {
    /// Reads and checks the next step of the store; damage found is dropped and fetched again
    /// before the next round ([`Repair::drop_damaged`]). Returns whether it found damage.
    pub(super) async fn scrub_step(&self) -> bool {
        let after = *self.scrub_cursor.lock().expect("scrub cursor lock");
        let store = self.store.clone();
        match timeshard_clock::spawn_blocking(move || store.scrub(after, SCRUB_FRAMES_PER_ROUND)).await {
            Ok(Ok(page)) => {
                if page.damaged > 0 {
                    warn!(damaged = page.damaged, checked = page.checked, "the scrub found damaged blocks");
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
                warn!(series = %d.series, quantum = d.quantum.start, "a damaged block no other member owns is kept");
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

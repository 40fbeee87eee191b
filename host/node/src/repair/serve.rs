//! The responder's side of repair: a peer's pull session (trees and leaf listings over the
//! blocks this node holds that the peer owns), bulk reads of whole blocks, digests of blocks a
//! peer hands off, and listings of this node's blocks. Store work runs off the async threads;
//! every answer is bounded by the request's limits (checked by `Request::validate`).

use std::sync::Arc;

use timeshard_proto::repair::{self, BlockCursor, BlockRef, ListCursor, ListedBlock, tree};
use timeshard_proto::wire::{BlockPoints, ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Id, Point};
use timeshard_store::{ListCursor as StoreCursor, Store, StoreError};

use tracing::warn;

use super::Repair;
use super::state::Counters;
use crate::peer_scope::{self, Checked};

fn store_error(e: StoreError) -> Response {
    Response::Error(ErrorReply::new(ErrorCode::Storage, format!("this node's store failed: {e}")))
}

fn internal(e: impl std::fmt::Display) -> Response {
    Response::Error(ErrorReply::new(ErrorCode::Internal, format!("repair task failed: {e}")))
}

impl Repair {
    /// The cutoff a comparison this node answers uses: the asker's, or this node's own
    /// (`settle_for` before its clock) when that is later. An asker whose clock lags leaves
    /// out on its side only what it wrote within `settle_for` (its own clock dates its own
    /// writes), but with its cutoff this node would leave out everything it wrote within the lag
    /// too, and the asker would not fetch it until its clock caught up (issue 24, seed 10743:
    /// an owner a minute behind kept 25 of 31 points to the end).
    fn served_cutoff(&self, asked: i64) -> i64 {
        asked.max(timeshard_clock::now_ns().saturating_sub(self.cfg.settle_for.as_nanos() as i64))
    }

    /// Answers a repair request from node `peer`.
    pub async fn serve(self: &Arc<Self>, peer: Id, req: Request) -> Response {
        match req {
            Request::RepairTree { scope, nodes, descend } => {
                let cutoff = self.served_cutoff(scope.cutoff);
                let inv = match self.inventory_for(cutoff).await {
                    Ok(inv) => inv,
                    Err(e) => return store_error(e),
                };
                if inv.view_digest != scope.view {
                    return Response::RepairTree { view_matches: false, hashes: Vec::new() };
                }
                if nodes.iter().any(|(n, _)| *n == tree::TreeNode::ROOT) {
                    Counters::add(&self.state.counters.sessions_served, 1);
                }
                let inv2 = inv.clone();
                let hashes = timeshard_clock::spawn_blocking(move || {
                    let tree = inv2.tree(&peer, true, cutoff);
                    tree::answer(&tree, &nodes, descend)
                })
                .await;
                match hashes {
                    Ok(hashes) => Response::RepairTree { view_matches: true, hashes },
                    Err(e) => internal(e),
                }
            }
            Request::RepairLeaves { scope, leaves, limit } => {
                let cutoff = self.served_cutoff(scope.cutoff);
                let inv = match self.inventory_for(cutoff).await {
                    Ok(inv) => inv,
                    Err(e) => return store_error(e),
                };
                if inv.view_digest != scope.view {
                    return Response::RepairLeaves { view_matches: false, entries: Vec::new(), done: 0 };
                }
                let budget = (limit as usize, self.limits.max_message_bytes as usize / 2);
                let (entries, done) = inv.entries(&peer, true, cutoff, &leaves, budget);
                Response::RepairLeaves { view_matches: true, entries, done }
            }
            Request::ReadBlocks { blocks, after, limit } => {
                let refs = blocks
                    .iter()
                    .map(|(series, quantum)| BlockRef::Points { series: series.clone(), quantum: *quantum });
                if let Err(e) = self.askers_only(Checked::ReadBlocks, peer, refs, false).await {
                    return e;
                }
                let store = self.store.clone();
                let work =
                    timeshard_clock::spawn_blocking(move || read_blocks(&*store, &blocks, after, limit as usize));
                match work.await {
                    Ok(Ok((blocks, next))) => Response::Blocks { blocks, next },
                    Ok(Err(e)) => store_error(e),
                    Err(e) => internal(e),
                }
            }
            Request::BlockDigests { blocks } => {
                if let Err(e) = self.askers_only(Checked::BlockDigests, peer, blocks.iter().cloned(), true).await {
                    return e;
                }
                let store = self.store.clone();
                let work = timeshard_clock::spawn_blocking(move || block_digests(&*store, &blocks));
                match work.await {
                    Ok(Ok(digests)) => Response::BlockDigests { digests },
                    Ok(Err(e)) => store_error(e),
                    Err(e) => internal(e),
                }
            }
            Request::ListBlocks { after, limit } => {
                // Another node sees only the blocks placement gives it.
                let placed = match peer == self.me.id {
                    true => None,
                    false => match self.inventory_for(i64::MIN).await {
                        Ok(inv) => Some((inv, self.classes())),
                        Err(e) => return store_error(e),
                    },
                };
                let store = self.store.clone();
                let work = timeshard_clock::spawn_blocking(move || {
                    store.list_blocks(after.map(|c| StoreCursor::from_parts(c.series, c.after)), limit as usize)
                });
                let given = |b: &timeshard_store::BlockInfo| {
                    placed.as_ref().is_none_or(|(inv, classes)| {
                        let block = BlockRef::Points { series: b.series.clone(), quantum: b.quantum };
                        inv.place_near(&block, classes).is_some_and(|near| near.iter().any(|c| c.id == peer))
                    })
                };
                match work.await {
                    Ok(Ok(page)) => Response::BlockList {
                        blocks: page
                            .blocks
                            .into_iter()
                            .filter(given)
                            .map(|b| ListedBlock {
                                series: b.series,
                                quantum: b.quantum,
                                count: b.count,
                                digest: b.digest,
                            })
                            .collect(),
                        next: page.next.map(|c| {
                            let (series, after) = c.to_parts();
                            ListCursor { series, after }
                        }),
                    },
                    Ok(Err(e)) => store_error(e),
                    Err(e) => internal(e),
                }
            }
            other => Response::Error(ErrorReply::new(
                ErrorCode::Internal,
                format!("{} is not a repair request", other.kind()),
            )),
        }
    }
}

impl Repair {
    /// Refuses, and counts, a request for any of `blocks` that placement does not give to
    /// `peer` (or, with `or_me`, to this node either). A node always answers itself.
    async fn askers_only(
        &self,
        kind: Checked,
        peer: Id,
        blocks: impl IntoIterator<Item = BlockRef>,
        or_me: bool,
    ) -> Result<(), Response> {
        if peer == self.me.id {
            return Ok(());
        }
        let inv = self.inventory_for(i64::MIN).await.map_err(store_error)?;
        let classes = self.classes();
        for block in blocks {
            let near = inv.place_near(&block, &classes).unwrap_or_default();
            if !near.iter().any(|c| c.id == peer || (or_me && c.id == self.me.id)) {
                self.refusals().add(kind);
                let quantum = match &block {
                    BlockRef::Points { quantum, .. } => Some(quantum),
                    BlockRef::Registration { .. } => None,
                };
                warn!(peer = %peer.short(), kind = kind.label(), series = %block.series(), "refused a peer request for a block placement does not give it");
                return Err(Response::Error(peer_scope::not_the_askers(kind, &peer, block.series(), quantum)));
            }
        }
        Ok(())
    }
}

/// The points of `blocks` from `after` on, at most `limit` in all (at least the rest of one
/// block page), and where to go on. A block the store finds damaged is left out.
fn read_blocks(
    store: &dyn Store,
    blocks: &[(timeshard_proto::SeriesKey, timeshard_proto::Quantum)],
    after: Option<BlockCursor>,
    limit: usize,
) -> Result<(Vec<BlockPoints>, Option<BlockCursor>), StoreError> {
    let mut out = Vec::new();
    let mut room = limit.max(1);
    let (first, mut cursor) = match after {
        Some(c) => (c.block as usize, c.after),
        None => (0, None),
    };
    for (i, (series, quantum)) in blocks.iter().enumerate().skip(first) {
        let page = match store.read_block(series, quantum.start, cursor.take(), room) {
            Ok(page) => page,
            // A damaged block is no copy to send, and must not stop the others: the asker
            // counts what arrived and takes this block from another replica (issue 24,
            // seed 1042: one damaged block kept a new owner from every block of its peer).
            Err(StoreError::Corrupt(why)) => {
                warn!(series = %series, quantum = quantum.start, error = %why, "left a damaged block out of a bulk read");
                continue;
            }
            Err(e) => return Err(e),
        };
        room -= page.points.len().min(room);
        let last = page.points.last().map(Point::key);
        if !page.points.is_empty() {
            out.push(BlockPoints { series: series.clone(), quantum: *quantum, points: page.points });
        }
        if page.more {
            return Ok((out, Some(BlockCursor { block: i as u32, after: last })));
        }
        if room == 0 {
            let next = (i + 1 < blocks.len()).then_some(BlockCursor { block: i as u32 + 1, after: None });
            return Ok((out, next));
        }
    }
    Ok((out, None))
}

/// (digest, count) of each block held here, `None` where it is not; a registration reports
/// [`repair::registration_digest`] and no points.
fn block_digests(store: &dyn Store, blocks: &[BlockRef]) -> Result<Vec<Option<(u64, u64)>>, StoreError> {
    blocks
        .iter()
        .map(|b| match b {
            BlockRef::Points { series, quantum } => {
                Ok(store.block_info(series, quantum.start)?.map(|i| (i.digest, i.count)))
            }
            BlockRef::Registration { series } => {
                Ok(store.has_series(series)?.then(|| (repair::registration_digest(series), 0)))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use timeshard_proto::QuantumLen;
    use timeshard_store::MemStore;

    use super::*;

    #[test]
    fn bulk_reads_page_across_blocks_without_gaps() {
        let store = MemStore::new(1 << 20);
        let len = QuantumLen::DEFAULT;
        let series: timeshard_proto::SeriesKey = "m".parse().unwrap();
        let blocks: Vec<_> = (0..3).map(|q| (series.clone(), len.quantum_of(q * len.ns()))).collect();
        let written: Vec<BlockPoints> = blocks
            .iter()
            .map(|(s, q)| BlockPoints {
                series: s.clone(),
                quantum: *q,
                points: (0..5).map(|k| Point::new(q.start + k, k as f64)).collect(),
            })
            .collect();
        store.write(&written).unwrap();
        let mut got: Vec<Point> = Vec::new();
        let mut after = None;
        let mut pages = 0;
        loop {
            let (page, next) = read_blocks(&store, &blocks, after, 4).unwrap();
            assert!(page.iter().map(|b| b.points.len()).sum::<usize>() <= 4);
            got.extend(page.into_iter().flat_map(|b| b.points));
            pages += 1;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let want: Vec<Point> = written.into_iter().flat_map(|b| b.points).collect();
        assert_eq!(got, want);
        assert_eq!(pages, 4);
        let digests = block_digests(
            &store,
            &[
                BlockRef::Points { series: series.clone(), quantum: blocks[0].1 },
                BlockRef::Points { series: series.clone(), quantum: len.quantum_of(100 * len.ns()) },
                BlockRef::Registration { series: series.clone() },
            ],
        )
        .unwrap();
        assert_eq!(digests[0].map(|d| d.1), Some(5));
        assert_eq!(digests[1..], [None, None]);
    }

    /// Issue 24, seed 1042: a block the store finds damaged failed the whole bulk read, so a
    /// new owner pulling from that peer got none of its blocks, round after round. It is left
    /// out now, and the others are served (the asker takes it from another replica).
    #[test]
    fn a_damaged_block_is_left_out_of_a_bulk_read_and_the_others_are_served() {
        use std::sync::Arc;
        use timeshard_store::faulty_disk::FaultyDisk;
        use timeshard_store::{DiskConfig, DiskStore};

        let disk = FaultyDisk::new();
        let config = DiskConfig { seal_grace_ns: 1_000_000, block_segment_bytes: 1 << 20, ..DiskConfig::default() };
        let store = DiskStore::open_with_backend(Arc::new(disk.clone()), config).unwrap();
        let len = QuantumLen::new(1_000_000).unwrap();
        let series: timeshard_proto::SeriesKey = "m".parse().unwrap();
        let blocks: Vec<_> = (0..3).map(|q| (series.clone(), len.quantum_of(q * len.ns()))).collect();
        let points = |q: &timeshard_proto::Quantum| (0..5).map(|k| Point::new(q.start + k, k as f64)).collect();
        let written: Vec<BlockPoints> =
            blocks.iter().map(|(s, q)| BlockPoints { series: s.clone(), quantum: *q, points: points(q) }).collect();
        store.write(&written).unwrap();
        while store.maintain(i64::MAX / 2).unwrap().more {}
        // Damage the first sealed frame: the first block.
        let (seg, _) = disk.files().into_iter().find(|(n, _)| n.starts_with("blocks/")).unwrap();
        disk.corrupt(&seg, 40, 0x5a);
        assert!(store.read_block(&series, blocks[0].1.start, None, 100).is_err(), "the first block is damaged");

        let (page, next) = read_blocks(&store, &blocks, None, 100).unwrap();
        assert_eq!(next, None);
        let served: Vec<_> = page.iter().map(|b| (b.quantum, b.points.len())).collect();
        assert_eq!(served, [(blocks[1].1, 5), (blocks[2].1, 5)]);
    }
}

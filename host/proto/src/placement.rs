//! Placement and quorum bookkeeping for the coordinator of a write.
//!
//! A client batch is split into blocks, one per (series, quantum), each with its time-factored
//! id ([`split_batch`]). Once the caller has found the replicas of every block, a [`WritePlan`]
//! groups the blocks by replica node, so one request per node carries all of that node's
//! blocks, and tracks acknowledgements until every block has W of them or some block can no
//! longer get them.

use std::collections::{BTreeMap, HashMap};

use crate::class::{Classes, Replication};
use crate::id::Id;
use crate::key::block_id;
use crate::point::{Point, sort_dedup};
use crate::series::SeriesKey;
use crate::time::Quantum;
use crate::wire::{BlockPoints, SeriesPoints};

/// One block of a client batch, with where it goes.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedBlock {
    /// The DHT id of the block.
    pub id: Id,
    /// Replication of the block's series class.
    pub replication: Replication,
    /// The points, sorted and deduplicated.
    pub block: BlockPoints,
}

/// Splits a client batch into blocks, one per (series, quantum), with ids from the class table.
/// Points must already be validated.
pub fn split_batch(batch: Vec<SeriesPoints>, classes: &Classes) -> Vec<PlacedBlock> {
    let mut blocks: BTreeMap<(SeriesKey, Quantum), Vec<Point>> = BTreeMap::new();
    let mut meta: HashMap<SeriesKey, (crate::key::KeyFormat, Replication)> = HashMap::new();
    for SeriesPoints { series, points } in batch {
        let class = classes.of(&series);
        meta.entry(series.clone()).or_insert((class.format, class.replication));
        for p in points {
            let q = class.quantum.quantum_of(p.ts);
            match blocks.get_mut(&(series.clone(), q)) {
                Some(v) => v.push(p),
                None => {
                    blocks.insert((series.clone(), q), vec![p]);
                }
            }
        }
    }
    blocks
        .into_iter()
        .map(|((series, quantum), mut points)| {
            sort_dedup(&mut points);
            let (format, replication) = meta[&series];
            PlacedBlock {
                id: block_id(format, &series, &quantum),
                replication,
                block: BlockPoints { series, quantum, points },
            }
        })
        .collect()
}

/// The state of a write after an acknowledgement or a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteProgress {
    /// Still waiting.
    Pending,
    /// Every block has its W acknowledgements.
    Acknowledged,
    /// Some block cannot reach W any more.
    Failed,
}

/// Tracks one write across its replicas. A target `T` is whatever one request goes to (a node,
/// or a node and a kind of request); each item (a block, a series registration) needs W of its
/// targets to acknowledge.
#[derive(Clone, Debug)]
pub struct WritePlan<T> {
    items: Vec<ItemQuorum>,
    /// Per target: the items it replicates.
    per_target: HashMap<T, Vec<usize>>,
    pending: usize,
    failed: bool,
}

#[derive(Clone, Debug)]
struct ItemQuorum {
    need: usize,
    acks: usize,
    /// Failures it can still absorb.
    spare: usize,
}

impl<T: std::hash::Hash + Eq> WritePlan<T> {
    /// A plan for items that each need `need` acknowledgements from their `targets`. An item
    /// with fewer targets than it needs fails at once.
    pub fn new(items: impl IntoIterator<Item = (usize, Vec<T>)>) -> WritePlan<T> {
        let mut per_target: HashMap<T, Vec<usize>> = HashMap::new();
        let mut quorums = Vec::new();
        let mut failed = false;
        for (i, (need, targets)) in items.into_iter().enumerate() {
            failed |= targets.len() < need;
            quorums.push(ItemQuorum { need, acks: 0, spare: targets.len().saturating_sub(need) });
            for t in targets {
                per_target.entry(t).or_default().push(i);
            }
        }
        let pending = quorums.iter().filter(|q| q.need > 0).count();
        WritePlan { pending, items: quorums, per_target, failed }
    }

    /// The targets to send to, each with the indices of its items.
    pub fn requests(&self) -> impl Iterator<Item = (&T, &Vec<usize>)> {
        self.per_target.iter()
    }

    /// Records that `target` stored all its items.
    pub fn on_ack(&mut self, target: &T) -> WriteProgress {
        if let Some(idx) = self.per_target.get(target) {
            for &i in idx {
                let q = &mut self.items[i];
                q.acks += 1;
                if q.acks == q.need {
                    self.pending -= 1;
                }
            }
        }
        self.progress()
    }

    /// Records that `target` failed to store its items.
    pub fn on_failure(&mut self, target: &T) -> WriteProgress {
        if let Some(idx) = self.per_target.get(target) {
            for &i in idx {
                let q = &mut self.items[i];
                if q.acks < q.need {
                    if q.spare == 0 {
                        self.failed = true;
                    } else {
                        q.spare -= 1;
                    }
                }
            }
        }
        self.progress()
    }

    /// The current state.
    pub fn progress(&self) -> WriteProgress {
        if self.failed {
            WriteProgress::Failed
        } else if self.pending == 0 {
            WriteProgress::Acknowledged
        } else {
            WriteProgress::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NANOS_PER_SEC;

    fn batch() -> Vec<SeriesPoints> {
        let s: SeriesKey = "pmu.a".parse().unwrap();
        let t: SeriesKey = "pmu.b".parse().unwrap();
        vec![
            SeriesPoints {
                series: s.clone(),
                points: vec![
                    Point::new(NANOS_PER_SEC, 1.0),
                    Point::new(12 * NANOS_PER_SEC, 2.0),
                    Point::new(NANOS_PER_SEC, 1.0),
                ],
            },
            SeriesPoints { series: t, points: vec![Point::new(3 * NANOS_PER_SEC, 3.0)] },
            SeriesPoints { series: s, points: vec![Point::new(2 * NANOS_PER_SEC, 4.0)] },
        ]
    }

    #[test]
    fn batches_split_by_series_and_quantum() {
        let blocks = split_batch(batch(), &Classes::default());
        assert_eq!(blocks.len(), 3);
        let total: usize = blocks.iter().map(|b| b.block.points.len()).sum();
        assert_eq!(total, 4, "the duplicate point is dropped");
        for b in &blocks {
            assert!(b.block.points.iter().all(|p| b.block.quantum.contains(p.ts)));
            assert!(b.block.points.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn quorum_waits_for_w_of_every_block() {
        let blocks = split_batch(batch(), &Classes::default()); // rf 3, w 2
        let a = Id::sha1(b"a");
        let b = Id::sha1(b"b");
        let c = Id::sha1(b"c");
        let d = Id::sha1(b"d");
        let replicas = vec![vec![a, b, c], vec![a, b, d], vec![b, c, d]];
        let mut plan = WritePlan::new(blocks.iter().map(|b| usize::from(b.replication.w)).zip(replicas));
        assert_eq!(plan.requests().count(), 4);
        assert_eq!(plan.on_ack(&a), WriteProgress::Pending);
        assert_eq!(plan.on_ack(&b), WriteProgress::Pending); // block 2 has only b
        assert_eq!(plan.on_failure(&c), WriteProgress::Pending); // block 2 can still use d
        assert_eq!(plan.on_ack(&d), WriteProgress::Acknowledged);
    }

    #[test]
    fn quorum_fails_when_too_many_replicas_fail() {
        let blocks = split_batch(batch(), &Classes::default());
        let [a, b, c] = [Id::sha1(b"a"), Id::sha1(b"b"), Id::sha1(b"c")];
        let need = || blocks.iter().map(|b| usize::from(b.replication.w));
        let mut plan = WritePlan::new(need().zip(vec![vec![a, b, c]; 3]));
        assert_eq!(plan.on_failure(&a), WriteProgress::Pending);
        assert_eq!(plan.on_failure(&b), WriteProgress::Failed);
        // Too few replicas known at all: fails at once.
        let plan = WritePlan::new(need().zip(vec![vec![a]; 3]));
        assert_eq!(plan.progress(), WriteProgress::Failed);
    }
}

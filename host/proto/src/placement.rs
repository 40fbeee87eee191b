//! Placement and quorum bookkeeping for the coordinator of a write or a read.
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
use crate::time::{Quantum, TimeRange};
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
        meta.entry(series.clone())
            .or_insert((class.format, class.replication));
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
                block: BlockPoints {
                    series,
                    quantum,
                    points,
                },
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

/// Tracks one write across its replica nodes.
#[derive(Clone, Debug)]
pub struct WritePlan {
    /// Per block: acknowledgements needed, received, and failures it can still absorb.
    blocks: Vec<BlockQuorum>,
    /// Per node: the blocks it replicates.
    per_node: HashMap<Id, Vec<usize>>,
    pending: usize,
    failed: bool,
}

#[derive(Clone, Debug)]
struct BlockQuorum {
    need: usize,
    acks: usize,
    spare: usize,
}

impl WritePlan {
    /// A plan for blocks whose replica sets are `replicas[i]` (closest first, up to RF nodes).
    /// A block with fewer replicas than W fails at once.
    pub fn new(blocks: &[PlacedBlock], replicas: &[Vec<Id>]) -> WritePlan {
        assert_eq!(blocks.len(), replicas.len());
        let mut per_node: HashMap<Id, Vec<usize>> = HashMap::new();
        let mut quorums = Vec::with_capacity(blocks.len());
        let mut failed = false;
        for (i, (b, nodes)) in blocks.iter().zip(replicas).enumerate() {
            let need = usize::from(b.replication.w);
            failed |= nodes.len() < need;
            quorums.push(BlockQuorum {
                need,
                acks: 0,
                spare: nodes.len().saturating_sub(need),
            });
            for n in nodes {
                per_node.entry(*n).or_default().push(i);
            }
        }
        WritePlan {
            pending: quorums.len(),
            blocks: quorums,
            per_node,
            failed,
        }
    }

    /// The nodes to send to, each with the indices of its blocks.
    pub fn requests(&self) -> impl Iterator<Item = (&Id, &Vec<usize>)> {
        self.per_node.iter()
    }

    /// Records that `node` stored all its blocks.
    pub fn on_ack(&mut self, node: &Id) -> WriteProgress {
        if let Some(idx) = self.per_node.get(node) {
            for &i in idx {
                let b = &mut self.blocks[i];
                b.acks += 1;
                if b.acks == b.need {
                    self.pending -= 1;
                }
            }
        }
        self.progress()
    }

    /// Records that `node` failed to store its blocks.
    pub fn on_failure(&mut self, node: &Id) -> WriteProgress {
        if let Some(idx) = self.per_node.get(node) {
            for &i in idx {
                let b = &mut self.blocks[i];
                if b.acks < b.need {
                    if b.spare == 0 {
                        self.failed = true;
                    } else {
                        b.spare -= 1;
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

/// Merges the answers of several replicas for one range: union, sorted, deduplicated, and
/// trimmed exactly to `range`.
pub fn merge_replica_answers(
    answers: impl IntoIterator<Item = Vec<Point>>,
    range: &TimeRange,
) -> Vec<Point> {
    let mut all: Vec<Point> = answers
        .into_iter()
        .flatten()
        .filter(|p| range.contains(p.ts))
        .collect();
    sort_dedup(&mut all);
    all
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
            SeriesPoints {
                series: t,
                points: vec![Point::new(3 * NANOS_PER_SEC, 3.0)],
            },
            SeriesPoints {
                series: s,
                points: vec![Point::new(2 * NANOS_PER_SEC, 4.0)],
            },
        ]
    }

    #[test]
    fn batches_split_by_series_and_quantum() {
        let blocks = split_batch(batch(), &Classes::default());
        assert_eq!(blocks.len(), 3);
        let total: usize = blocks.iter().map(|b| b.block.points.len()).sum();
        assert_eq!(total, 4, "the duplicate point is dropped");
        for b in &blocks {
            assert!(
                b.block
                    .points
                    .iter()
                    .all(|p| b.block.quantum.contains(p.ts))
            );
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
        let mut plan = WritePlan::new(&blocks, &replicas);
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
        let replicas = vec![vec![a, b, c]; 3];
        let mut plan = WritePlan::new(&blocks, &replicas);
        assert_eq!(plan.on_failure(&a), WriteProgress::Pending);
        assert_eq!(plan.on_failure(&b), WriteProgress::Failed);
        // Too few replicas known at all: fails at once.
        let plan = WritePlan::new(&blocks, &vec![vec![a]; 3]);
        assert_eq!(plan.progress(), WriteProgress::Failed);
    }

    #[test]
    fn replica_answers_merge_exactly() {
        let range = TimeRange::new(10, 20).unwrap();
        let merged = merge_replica_answers(
            [
                vec![Point::new(9, 0.0), Point::new(10, 1.0), Point::new(15, 2.0)],
                vec![Point::new(15, 2.0), Point::new(20, 3.0)],
            ],
            &range,
        );
        assert_eq!(merged, vec![Point::new(10, 1.0), Point::new(15, 2.0)]);
    }
}

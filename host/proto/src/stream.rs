//! Streamed range reads, sans I/O: what a coordinator asks each owner node, what the owners
//! stream back, when one replica's points stand for the part, and the column batches a client
//! receives.
//!
//! A streamed read asks each owner node once for all the block parts it holds in a window of
//! the range ([`owner_fetches`]). For every part, the first candidate (the local node when it
//! is an owner) streams the points; the next R-1 stream only the part's count and digest
//! ([`PartEnd`]). The part's points stand when R settled answers agree ([`accepts`]); otherwise
//! the coordinator reads the part again the careful way (R settled replicas, further
//! candidates, exact merge, read repair).
//!
//! Answers come back as [`PartChunk`]s in ascending part order, a part's points possibly split
//! over several chunks, its [`PartEnd`] on its last chunk.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::Id;
use crate::packed::{MAX_PACKED_POINTS, PackedColumns, PackedError, PackedPart};
use crate::point::Point;
pub use crate::point::{ColumnBatch, PartEnd};
use crate::routing::Contact;
use crate::time::BlockPart;

/// One part of a request for block parts (`Request::FetchParts`): the block part, and whether the
/// receiver sends its points (or only its count and digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchPart {
    pub part: BlockPart,
    pub points: bool,
}

/// Points of the part at index `part` of a request (in the order asked); `end` is set on the
/// part's last chunk. A part covering a sealed block whole may come as that block's columns
/// instead (`packed`, in one chunk with its `end` and no `points`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartChunk {
    pub part: u32,
    pub points: Vec<Point>,
    pub packed: Option<PackedColumns>,
    pub end: Option<PartEnd>,
}

/// A run of a streamed read's answer to a client, in order: points, or a part's packed
/// columns (which the client decodes and checks, [`PackedPart::decode_into`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadRun {
    Points(Vec<Point>),
    Packed(PackedPart),
}

impl ReadRun {
    /// Points the run holds (or claims, packed).
    pub fn count(&self) -> u64 {
        match self {
            ReadRun::Points(p) => p.len() as u64,
            ReadRun::Packed(p) => p.count(),
        }
    }
}

impl ColumnBatch {
    /// The points of `runs`, in order, packed parts decoded and checked
    /// ([`PackedPart::decode_into`]).
    pub fn from_runs(runs: &[ReadRun]) -> Result<ColumnBatch, PackedError> {
        // Claimed counts come from a peer: reserve no more than a few blocks' worth up front.
        let claimed: u64 = runs.iter().map(ReadRun::count).sum();
        let n = claimed.min(MAX_PACKED_POINTS) as usize;
        let mut out = ColumnBatch {
            timestamps: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            events: Vec::with_capacity(n),
        };
        for run in runs {
            match run {
                ReadRun::Points(points) => {
                    out.timestamps.extend(points.iter().map(|p| p.ts));
                    out.values.extend(points.iter().map(|p| p.value));
                    out.events.extend(points.iter().map(|p| p.event));
                }
                ReadRun::Packed(part) => part.decode_into(&mut out)?,
            }
        }
        Ok(out)
    }
}

/// The requests of one window of a streamed read: one per owner node asked about any part, as
/// (node, the parts asked of it in ascending order with whether it sends points). Parts are
/// indices into `candidates` (each part's read candidates, in the order to ask them); each is
/// asked of its first `r`. Ordered local node (`me`) first, then by node id.
pub fn owner_fetches(candidates: &[Vec<Contact>], r: usize, me: Id) -> Vec<(Contact, Vec<(usize, bool)>)> {
    let mut by_node: BTreeMap<Id, (Contact, Vec<(usize, bool)>)> = BTreeMap::new();
    for (i, part) in candidates.iter().enumerate() {
        for (k, c) in part.iter().take(r.max(1)).enumerate() {
            by_node.entry(c.id).or_insert_with(|| (*c, Vec::new())).1.push((i, k == 0));
        }
    }
    let mut requests: Vec<_> = by_node.into_values().collect();
    requests.sort_by_key(|(c, _)| (c.id != me, c.id));
    requests
}

/// One replica's answer to a part: its count and digest, and whether it said it is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartAnswer {
    pub end: PartEnd,
    pub settled: bool,
}

/// Whether the point sender's answer stands for the part: `r` answers (the sender's first),
/// all settled, all with one count and digest. Otherwise the part must be read again and the
/// answers merged.
pub fn accepts(answers: &[Option<PartAnswer>], r: usize) -> bool {
    answers.len() >= r.max(1)
        && answers.iter().all(|a| a.is_some_and(|a| a.settled))
        && answers.windows(2).all(|w| w[0].map(|a| a.end) == w[1].map(|a| a.end))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn node(n: u8) -> Contact {
        Contact { id: Id::sha1(&[n]), addr: SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(n))) }
    }

    #[test]
    fn each_node_is_asked_once_with_every_part_it_answers() {
        let (a, b, c) = (node(1), node(2), node(3));
        let candidates = vec![vec![a, b, c], vec![b, c, a], vec![c, a, b]];
        let requests = owner_fetches(&candidates, 2, c.id);
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0], (c, vec![(1, false), (2, true)]));
        let of = |n: Contact| requests.iter().find(|(c, _)| c.id == n.id).unwrap().1.clone();
        assert_eq!(of(a), vec![(0, true), (2, false)]);
        assert_eq!(of(b), vec![(0, false), (1, true)]);
        // Every part has exactly one point sender and r - 1 digest senders.
        for i in 0..3 {
            let roles: Vec<bool> =
                requests.iter().flat_map(|(_, p)| p.iter().filter(|(j, _)| *j == i).map(|(_, pts)| *pts)).collect();
            assert_eq!(roles.iter().filter(|p| **p).count(), 1);
            assert_eq!(roles.len(), 2);
        }
    }

    #[test]
    fn only_r_settled_agreeing_answers_stand() {
        let pts = [Point::new(1, 1.0), Point::new(2, 2.0)];
        let end = PartEnd::of(&pts);
        let ok = Some(PartAnswer { end, settled: true });
        assert!(accepts(&[ok, ok], 2));
        assert!(!accepts(&[ok], 2), "a replica missing");
        assert!(!accepts(&[ok, None], 2), "a replica failed");
        assert!(!accepts(&[ok, Some(PartAnswer { end, settled: false })], 2), "a replica catching up");
        let other = PartEnd::of(&pts[..1]);
        assert!(!accepts(&[ok, Some(PartAnswer { end: other, settled: true })], 2), "disagreeing digests");
        let mut summed = PartEnd::of(&pts[..1]);
        summed.add(&pts[1..]);
        assert_eq!(summed, end, "digests add up across chunks");
    }

    #[test]
    fn runs_of_points_and_packed_parts_make_one_batch_in_order() {
        let pts: Vec<Point> = (0..300).map(|i| Point::new(i * 10, i as f64)).collect();
        let packed = |p: &[Point]| {
            ReadRun::Packed(PackedPart {
                range: crate::time::TimeRange::new(0, 10_000).unwrap(),
                end: PartEnd::of(p),
                columns: PackedColumns::of(p),
            })
        };
        let runs =
            vec![ReadRun::Points(pts[..50].to_vec()), packed(&pts[50..200]), ReadRun::Points(pts[200..].to_vec())];
        assert_eq!(runs.iter().map(ReadRun::count).sum::<u64>(), 300);
        assert_eq!(ColumnBatch::from_runs(&runs).unwrap().points().collect::<Vec<_>>(), pts);
        // One bad packed part fails the batch.
        let mut bad = packed(&pts[50..200]);
        if let ReadRun::Packed(p) = &mut bad {
            p.end.digest ^= 1;
        }
        assert!(ColumnBatch::from_runs(&[ReadRun::Points(pts[..50].to_vec()), bad]).is_err());
    }

    #[test]
    fn columns_round_trip_points() {
        let pts = vec![Point { ts: 5, value: 1.5, event: 2 }, Point::new(7, -0.0)];
        let batch = ColumnBatch::from_points(&pts);
        assert!(batch.is_consistent());
        assert_eq!(batch.points().collect::<Vec<_>>(), pts);
        assert_eq!(batch.last_key(), Some(pts[1].key()));
    }
}

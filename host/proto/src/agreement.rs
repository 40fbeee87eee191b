//! Replica agreement on the read side: which owner node a coordinator asks about which block
//! parts, when the answers of R owners may stand for a part, and how raw points of several
//! replicas merge.
//!
//! A computation pushed down to the owners of block parts (window aggregates, a query policy)
//! sends one request per owner node, carrying every part that node is asked about
//! ([`owner_requests`]). The R answers for a part stand for it when they all agree ([`agreed`];
//! for policy partials, [`same_points`] compares the count and digest of the points they were
//! computed from). A part whose owners did not all answer, or disagree, is reconciled
//! ([`OwnerAnswers::settle`]): the coordinator asks further replicas and, if they still
//! disagree, merges their raw points ([`merge_replica_answers`]) and computes the part itself.
//!
//! A read of one block asks its candidates in order ([`ReadQuorum`]): the owners, then the next
//! closest members ([`crate::repair::read_candidates`]). Only answers of settled replicas (that
//! hold every block they own, [`crate::repair::settle`]) count towards R; an unsettled answer
//! (a node that just joined, or took over from a departed one, and is still pulling) is kept
//! for the merge but makes the read ask one candidate more. So after a join the read falls
//! back to the previous owners until the new ones have caught up. When every candidate was
//! asked and fewer than R settled answers came, the merge stands, except for a strict read
//! ([`ReadQuorum::strict`], inside a context of interest), which fails instead.
//!
//! Implementation notes: stored data is a set of points, so the union of replicas' points is
//! what a quorum acknowledged, and merging never loses an acknowledged point. The first of
//! agreeing answers is used, and requests are ordered local node first, then by node id, so the
//! same query picks the same replicas.

use std::collections::BTreeMap;

use crate::id::Id;
use crate::point::{Point, PointKey, sort_dedup};
use crate::routing::Contact;
use crate::time::TimeRange;
use crate::wire::Summarized;

/// Whether two owners' policy partials were computed from the same points.
pub fn same_points(a: &Summarized, b: &Summarized) -> bool {
    (a.points, a.digest) == (b.points, b.digest)
}

/// The answer that stands for all of `answers` if there are `r` of them and they all `agree`
/// (the first of them); `None` when the part must be reconciled.
pub fn agreed<T>(answers: Vec<T>, r: usize, agree: impl Fn(&T, &T) -> bool) -> Option<T> {
    if answers.len() == r && answers.windows(2).all(|w| agree(&w[0], &w[1])) {
        answers.into_iter().next()
    } else {
        None
    }
}

/// The requests that ask the first `r` of each part's `owners` (listed per part, in the order
/// to ask them) about it: one per owner node and at most `max_parts` parts each, as (node,
/// indices of its parts in ascending order). Ordered local node (`me`) first, then by node id
/// and first part.
pub fn owner_requests(owners: &[Vec<Contact>], r: usize, me: Id, max_parts: usize) -> Vec<(Contact, Vec<usize>)> {
    let mut by_node: BTreeMap<Id, (Contact, Vec<usize>)> = BTreeMap::new();
    for (i, part_owners) in owners.iter().enumerate() {
        for c in part_owners.iter().take(r) {
            by_node.entry(c.id).or_insert_with(|| (*c, Vec::new())).1.push(i);
        }
    }
    let mut requests: Vec<(Contact, Vec<usize>)> = by_node
        .into_values()
        .flat_map(|(c, idx)| idx.chunks(max_parts.max(1)).map(|chunk| (c, chunk.to_vec())).collect::<Vec<_>>())
        .collect();
    requests.sort_by_key(|(c, idx)| (c.id != me, c.id, idx.first().copied()));
    requests
}

/// The answers owners gave for each of a query's block parts.
#[derive(Clone, Debug)]
pub struct OwnerAnswers<T> {
    r: usize,
    per_part: Vec<Vec<T>>,
}

impl<T> OwnerAnswers<T> {
    /// Room for the answers of `r` owners to each of `parts` parts.
    pub fn new(parts: usize, r: usize) -> OwnerAnswers<T> {
        OwnerAnswers { r, per_part: (0..parts).map(|_| Vec::with_capacity(r)).collect() }
    }

    /// Records one owner's answers to the parts it was asked about, in the order asked.
    pub fn record(&mut self, parts: Vec<usize>, answers: Vec<T>) {
        for (i, a) in parts.into_iter().zip(answers) {
            self.per_part[i].push(a);
        }
    }

    /// Accepts the parts whose `r` owners all answered and `agree`; the rest are left to
    /// reconcile.
    pub fn settle(self, agree: impl Fn(&T, &T) -> bool) -> Settled<T> {
        let mut answers = Vec::with_capacity(self.per_part.len());
        let mut redo = Vec::new();
        for (i, a) in self.per_part.into_iter().enumerate() {
            let accepted = agreed(a, self.r, &agree);
            if accepted.is_none() {
                redo.push(i);
            }
            answers.push(accepted);
        }
        Settled { answers, redo }
    }
}

/// The answers of a query's parts once agreeing owners were accepted.
#[derive(Clone, Debug)]
pub struct Settled<T> {
    answers: Vec<Option<T>>,
    redo: Vec<usize>,
}

impl<T> Settled<T> {
    /// The parts left to reconcile, in ascending order.
    pub fn redo(&self) -> &[usize] {
        &self.redo
    }

    /// Every part's answer, given the reconciled answers of the parts in [`Settled::redo`], in
    /// that order.
    ///
    /// # Panics
    ///
    /// If `reconciled` holds fewer answers than there are parts to redo.
    pub fn complete(self, reconciled: Vec<T>) -> Vec<T> {
        let mut answers = self.answers;
        assert!(reconciled.len() >= self.redo.len(), "every part left to redo needs a reconciled answer");
        for (i, a) in self.redo.into_iter().zip(reconciled) {
            answers[i] = Some(a);
        }
        answers.into_iter().map(|a| a.expect("every part answered or reconciled")).collect()
    }
}

/// Which candidates a read of one block asks, and when it has enough: R settled answers, or
/// every candidate asked. Candidates are indices into the caller's ordered list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadQuorum {
    r: usize,
    candidates: usize,
    next: usize,
    in_flight: usize,
    settled: usize,
    answered: usize,
    /// Only settled answers may stand ([`ReadQuorum::strict`]).
    strict: bool,
}

/// How a read of one block ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// R settled replicas answered.
    Settled,
    /// Every candidate was asked; at least R answered but fewer than R of them were settled
    /// (many nodes catching up at once): the merge of every answer stands.
    Merged,
    /// Fewer than R answered at all.
    Short,
    /// A strict read ([`ReadQuorum::strict`]): R or more answered, but fewer than R of them
    /// were settled. The merge may miss an acknowledged write; the read fails, retryably.
    Unsettled,
}

impl ReadQuorum {
    /// A read needing `r` settled answers from `candidates` candidates.
    pub fn new(candidates: usize, r: usize) -> ReadQuorum {
        ReadQuorum { r: r.max(1), candidates, next: 0, in_flight: 0, settled: 0, answered: 0, strict: false }
    }

    /// A read whose answer must come from `r` settled replicas, never from the merge of
    /// unsettled ones: an in-CoI quorum read, promised to return every write acknowledged
    /// before it began. Its candidates are the in-CoI owners; one that catches up (it may own
    /// blocks it does not hold yet, after a location or membership change) cannot stand in
    /// for a settled one, so the read ends [`ReadOutcome::Unsettled`] instead of `Merged`.
    pub fn strict(candidates: usize, r: usize) -> ReadQuorum {
        ReadQuorum { strict: true, ..ReadQuorum::new(candidates, r) }
    }

    /// The candidates to ask next: as many as it takes to reach R settled answers if all of
    /// those in flight and these were settled, as far as candidates last.
    pub fn to_ask(&mut self) -> std::ops::Range<usize> {
        let want = self.r.saturating_sub(self.settled + self.in_flight);
        let start = self.next;
        self.next = (self.next + want).min(self.candidates);
        self.in_flight += self.next - start;
        start..self.next
    }

    /// Records an answer (`settled`: whether the replica said it is).
    pub fn on_answer(&mut self, settled: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.answered += 1;
        self.settled += usize::from(settled);
    }

    /// Records a candidate that failed to answer.
    pub fn on_failure(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Whether nothing more will be asked: R settled answers, or no candidate left and none in
    /// flight.
    pub fn is_done(&self) -> bool {
        self.settled >= self.r || (self.in_flight == 0 && self.next >= self.candidates)
    }

    /// How the read ended (meaningful once [`ReadQuorum::is_done`]).
    pub fn outcome(&self) -> ReadOutcome {
        if self.settled >= self.r {
            ReadOutcome::Settled
        } else if self.answered >= self.r && self.strict {
            ReadOutcome::Unsettled
        } else if self.answered >= self.r {
            ReadOutcome::Merged
        } else {
            ReadOutcome::Short
        }
    }
}

/// Merges the answers of several replicas for one range: union, sorted, deduplicated, and
/// trimmed exactly to `range`.
pub fn merge_replica_answers(answers: impl IntoIterator<Item = Vec<Point>>, range: &TimeRange) -> Vec<Point> {
    let mut all: Vec<Point> = answers.into_iter().flatten().filter(|p| range.contains(p.ts)).collect();
    sort_dedup(&mut all);
    all
}

/// [`merge_replica_answers`] for one page of a block: only points strictly after `after`, and
/// at most `limit` of them.
pub fn merge_page(
    answers: impl IntoIterator<Item = Vec<Point>>,
    range: &TimeRange,
    after: Option<PointKey>,
    limit: usize,
) -> Vec<Point> {
    let mut merged = merge_replica_answers(answers, range);
    if let Some(a) = after {
        merged.retain(|p| p.key() > a);
    }
    merged.truncate(limit);
    merged
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;

    use proptest::prelude::*;

    use super::*;

    fn node(n: u8) -> Contact {
        Contact { id: Id::sha1(&[n]), addr: SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(n))) }
    }

    fn summarized(points: u64, digest: u64) -> Summarized {
        Summarized { partials: Vec::new(), points, digest }
    }

    #[test]
    fn partials_agree_when_computed_from_the_same_points() {
        assert!(same_points(&summarized(3, 7), &summarized(3, 7)));
        assert!(!same_points(&summarized(3, 7), &summarized(3, 8)));
        assert!(!same_points(&summarized(2, 7), &summarized(3, 7)));
    }

    #[test]
    fn r_agreeing_answers_stand_for_the_part() {
        assert_eq!(agreed(vec![1, 1], 2, |a, b| a == b), Some(1));
        assert_eq!(agreed(vec![1, 2], 2, |a, b| a == b), None, "disagreeing owners");
        assert_eq!(agreed(vec![1], 2, |a, b| a == b), None, "an owner did not answer");
        // The first answer is used when agreement is looser than equality.
        assert_eq!(agreed(vec![(1, 'a'), (1, 'b')], 2, |a, b| a.0 == b.0), Some((1, 'a')));
    }

    #[test]
    fn requests_go_local_first_and_carry_every_part_of_a_node() {
        let (a, b, c) = (node(1), node(2), node(3));
        let owners = vec![vec![b, a, c], vec![a, c, b], vec![c, b, a]];
        let requests = owner_requests(&owners, 2, c.id, 4096);
        assert_eq!(requests[0], (c, vec![1, 2]));
        let mut rest = requests[1..].to_vec();
        rest.sort_by_key(|(c, _)| c.id);
        let mut want = vec![(a, vec![0, 1]), (b, vec![0, 2])];
        want.sort_by_key(|(c, _)| c.id);
        assert_eq!(rest, want);
        assert!(requests[1].0.id < requests[2].0.id);
        // Chunks of at most max_parts parts.
        let many = vec![vec![a]; 5];
        let requests = owner_requests(&many, 1, b.id, 2);
        assert_eq!(requests, vec![(a, vec![0, 1]), (a, vec![2, 3]), (a, vec![4])]);
    }

    #[test]
    fn settling_redoes_parts_short_of_r_or_in_disagreement() {
        let mut answers = OwnerAnswers::new(3, 2);
        answers.record(vec![0, 1, 2], vec![10, 11, 12]);
        answers.record(vec![0, 1], vec![10, 99]);
        let settled = answers.settle(|a, b| a == b);
        assert_eq!(settled.redo(), &[1, 2]);
        assert_eq!(settled.complete(vec![21, 22]), vec![10, 21, 22]);
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
        let page = merge_page(
            [vec![Point::new(12, 1.0), Point::new(15, 2.0)], vec![Point::new(16, 2.0), Point::new(17, 3.0)]],
            &range,
            Some(Point::new(12, 1.0).key()),
            2,
        );
        assert_eq!(page, vec![Point::new(15, 2.0), Point::new(16, 2.0)]);
    }

    /// Drives a quorum over candidates that answer settled (`Some(true)`), unsettled
    /// (`Some(false)`) or fail (`None`); returns the candidates asked, in order.
    fn drive(answers: &[Option<bool>], r: usize) -> (Vec<usize>, ReadOutcome) {
        drive_quorum(ReadQuorum::new(answers.len(), r), answers)
    }

    fn drive_quorum(mut q: ReadQuorum, answers: &[Option<bool>]) -> (Vec<usize>, ReadOutcome) {
        let mut asked = Vec::new();
        let mut pending: std::collections::VecDeque<usize> = q.to_ask().collect();
        asked.extend(pending.iter().copied());
        while let Some(i) = pending.pop_front() {
            match answers[i] {
                Some(settled) => q.on_answer(settled),
                None => q.on_failure(),
            }
            if q.is_done() {
                break;
            }
            let more: Vec<usize> = q.to_ask().collect();
            asked.extend(&more);
            pending.extend(more);
        }
        assert!(q.is_done() || pending.is_empty());
        (asked, q.outcome())
    }

    #[test]
    fn settled_owners_suffice() {
        let (asked, outcome) = drive(&[Some(true), Some(true), Some(true), Some(true)], 2);
        assert_eq!((asked, outcome), (vec![0, 1], ReadOutcome::Settled));
    }

    #[test]
    fn unsettled_answers_make_the_read_ask_further_candidates() {
        // Two new owners still catching up, then the previous owners.
        let (asked, outcome) = drive(&[Some(false), Some(false), Some(true), Some(true), Some(true)], 2);
        assert_eq!((asked, outcome), (vec![0, 1, 2, 3], ReadOutcome::Settled));
        // A failure is replaced like an unsettled answer, but does not count.
        let (asked, outcome) = drive(&[None, Some(true), Some(false), Some(true)], 2);
        assert_eq!((asked, outcome), (vec![0, 1, 2, 3], ReadOutcome::Settled));
    }

    #[test]
    fn without_r_settled_answers_the_merge_of_all_stands_or_the_read_fails() {
        let (asked, outcome) = drive(&[Some(false), Some(true), Some(false)], 2);
        assert_eq!((asked, outcome), (vec![0, 1, 2], ReadOutcome::Merged));
        let (_, outcome) = drive(&[None, Some(true), None], 2);
        assert_eq!(outcome, ReadOutcome::Short);
        let (_, outcome) = drive(&[], 2);
        assert_eq!(outcome, ReadOutcome::Short);
    }

    /// Issue 24 (seed 2): every location cleared at once, the in-CoI owners a coordinator
    /// still placed by both answered unsettled, and the merge of their answers (older points)
    /// stood as an in-CoI quorum read. A strict read fails instead.
    #[test]
    fn a_strict_read_never_stands_on_unsettled_answers() {
        let strict = |answers: &[Option<bool>], r| drive_quorum(ReadQuorum::strict(answers.len(), r), answers);
        assert_eq!(strict(&[Some(false), Some(false)], 2), (vec![0, 1], ReadOutcome::Unsettled));
        assert_eq!(strict(&[Some(true), Some(false)], 2).1, ReadOutcome::Unsettled);
        assert_eq!(strict(&[Some(true), Some(true)], 2).1, ReadOutcome::Settled);
        assert_eq!(strict(&[Some(false), None], 2).1, ReadOutcome::Short);
        // R of 1 over three owners: an unsettled first answer makes it ask on.
        assert_eq!(strict(&[Some(false), Some(true), Some(true)], 1), (vec![0, 1], ReadOutcome::Settled));
    }

    proptest! {
        /// A read never asks a candidate twice, asks in order, stops as soon as R settled
        /// answers are in, and ends Settled exactly when R settled candidates were asked.
        #[test]
        fn a_read_quorum_asks_in_order_and_stops_at_r_settled(
            answers in proptest::collection::vec(proptest::option::of(any::<bool>()), 0..10),
            r in 1usize..4,
        ) {
            let (asked, outcome) = drive(&answers, r);
            prop_assert!(asked.iter().enumerate().all(|(i, &c)| i == c), "in order, once each");
            let settled = asked.iter().filter(|&&c| answers[c] == Some(true)).count();
            prop_assert_eq!(outcome == ReadOutcome::Settled, settled >= r);
            if settled < r {
                prop_assert_eq!(asked.len(), answers.len(), "every candidate asked before giving up");
            }
        }

        /// Every part is asked of its first r owners (or all, if fewer), once each, and no
        /// request exceeds the part limit.
        #[test]
        fn every_part_goes_to_its_first_r_owners_once(
            owners in proptest::collection::vec(proptest::collection::btree_set(0u8..8, 0..5), 0..40),
            r in 1usize..4,
            me in 0u8..8,
            max_parts in 1usize..6,
        ) {
            let owners: Vec<Vec<Contact>> = owners.iter().map(|s| s.iter().map(|&n| node(n)).collect()).collect();
            let requests = owner_requests(&owners, r, node(me).id, max_parts);
            let mut asked: Vec<BTreeSet<Id>> = vec![BTreeSet::new(); owners.len()];
            for (c, idx) in &requests {
                prop_assert!(!idx.is_empty() && idx.len() <= max_parts);
                prop_assert!(idx.windows(2).all(|w| w[0] < w[1]));
                for &i in idx {
                    prop_assert!(asked[i].insert(c.id), "part {} asked twice of one node", i);
                }
            }
            for (i, part_owners) in owners.iter().enumerate() {
                let want: BTreeSet<Id> = part_owners.iter().take(r).map(|c| c.id).collect();
                prop_assert_eq!(&asked[i], &want);
            }
            let local = requests.iter().take_while(|(c, _)| c.id == node(me).id).count();
            prop_assert!(requests[local..].iter().all(|(c, _)| c.id != node(me).id), "local requests come first");
        }
    }
}

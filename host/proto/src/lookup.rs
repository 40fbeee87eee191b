//! Iterative parallel node lookup (Kademlia's FIND_NODE), as a state machine.
//!
//! The caller seeds it with the closest contacts it knows, then loops: send a FIND_NODE to each
//! contact [`Lookup::next_query`] yields (at most `alpha` in flight), and feed the answers back
//! with [`Lookup::on_response`] or [`Lookup::on_failure`]. The lookup is finished when the `k`
//! closest contacts that have not failed have all answered; [`Lookup::result`] returns them.
//! No sockets, no clock: timeouts are the caller's, reported as failures.

use std::collections::BTreeMap;

use crate::id::{Distance, Id};
use crate::routing::Contact;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    NotQueried,
    InFlight,
    Answered,
    Failed,
}

#[derive(Clone, Debug)]
struct Candidate {
    contact: Contact,
    state: State,
}

/// One lookup for the `k` nodes closest to a target.
#[derive(Clone, Debug)]
pub struct Lookup {
    target: Id,
    k: usize,
    alpha: usize,
    candidates: BTreeMap<Distance, Candidate>,
    in_flight: usize,
    /// Guards against unbounded growth from hostile or confused responders.
    max_candidates: usize,
}

impl Lookup {
    /// Starts a lookup for `target`. `local`, if given, is counted as a node that already
    /// answered (a node is a candidate for its own lookups). `seeds` are the closest contacts
    /// the caller knows.
    pub fn new(
        target: Id,
        local: Option<Contact>,
        seeds: impl IntoIterator<Item = Contact>,
        k: usize,
        alpha: usize,
    ) -> Lookup {
        assert!(k > 0 && alpha > 0, "k and alpha must be positive");
        let mut l = Lookup { target, k, alpha, candidates: BTreeMap::new(), in_flight: 0, max_candidates: k * 16 };
        if let Some(me) = local {
            l.candidates.insert(me.id.distance(&target), Candidate { contact: me, state: State::Answered });
        }
        for c in seeds {
            l.add(c);
        }
        l
    }

    /// The target id.
    pub fn target(&self) -> Id {
        self.target
    }

    fn add(&mut self, c: Contact) {
        let d = c.id.distance(&self.target);
        if self.candidates.contains_key(&d) {
            return;
        }
        if self.candidates.len() >= self.max_candidates {
            // Drop the furthest not-yet-queried candidate, or this one if it is further.
            let furthest = self.candidates.iter().rev().find(|(_, c)| c.state == State::NotQueried).map(|(d, _)| *d);
            match furthest {
                Some(f) if f > d => {
                    self.candidates.remove(&f);
                }
                _ => return,
            }
        }
        self.candidates.insert(d, Candidate { contact: c, state: State::NotQueried });
    }

    /// The next contact to query, if the lookup may send another request now.
    pub fn next_query(&mut self) -> Option<Contact> {
        if self.in_flight >= self.alpha || self.is_finished() {
            return None;
        }
        // Only the k closest live candidates are worth asking.
        let candidate = self
            .candidates
            .values_mut()
            .filter(|c| c.state != State::Failed)
            .take(self.k)
            .find(|c| c.state == State::NotQueried)?;
        candidate.state = State::InFlight;
        self.in_flight += 1;
        Some(candidate.contact)
    }

    fn settle(&mut self, from: &Id, state: State) -> bool {
        let d = from.distance(&self.target);
        match self.candidates.get_mut(&d) {
            Some(c) if c.state == State::InFlight => {
                c.state = state;
                self.in_flight -= 1;
                true
            }
            _ => false,
        }
    }

    /// `from` answered with the contacts it knows closest to the target.
    pub fn on_response(&mut self, from: &Id, closer: impl IntoIterator<Item = Contact>) {
        if self.settle(from, State::Answered) {
            for c in closer {
                self.add(c);
            }
        }
    }

    /// The request to `from` failed or timed out.
    pub fn on_failure(&mut self, from: &Id) {
        self.settle(from, State::Failed);
    }

    /// Whether the lookup is done: the k closest non-failed candidates all answered (or there
    /// are no candidates left to ask) and nothing is in flight among them.
    pub fn is_finished(&self) -> bool {
        self.candidates.values().filter(|c| c.state != State::Failed).take(self.k).all(|c| c.state == State::Answered)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The closest contacts that answered, closest first, at most `k`.
    pub fn result(&self) -> Vec<Contact> {
        self.candidates.values().filter(|c| c.state == State::Answered).take(self.k).map(|c| c.contact).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::RoutingTable;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use std::collections::{HashMap, HashSet};
    use std::net::SocketAddr;
    use std::time::Instant;

    /// A simulated network: every node's routing table filled the way Kademlia fills it (each
    /// node hears of every other node; full buckets keep their first k).
    struct Network {
        tables: HashMap<Id, RoutingTable>,
        contacts: Vec<Contact>,
    }

    fn network(n: usize, k: usize, seed: u64) -> Network {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let contacts: Vec<Contact> = (0..n)
            .map(|i| Contact { id: Id::random(&mut rng), addr: SocketAddr::from(([10, 0, 0, 1], i as u16)) })
            .collect();
        let now = Instant::now();
        let mut tables = HashMap::new();
        for me in &contacts {
            let mut t = RoutingTable::new(me.id, k, 2);
            // Hear of the others in a random order, as a real network would.
            let mut order: Vec<&Contact> = contacts.iter().collect();
            rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
            for c in order {
                t.observe(*c, now);
            }
            tables.insert(me.id, t);
        }
        Network { tables, contacts }
    }

    /// Drives a lookup to completion, answering from the simulated tables; `dead` nodes fail.
    fn run(
        net: &Network,
        from: Contact,
        target: Id,
        k: usize,
        alpha: usize,
        dead: &HashSet<Id>,
    ) -> (Vec<Contact>, usize) {
        let seeds = net.tables[&from.id].closest(&target, k);
        let mut l = Lookup::new(target, Some(from), seeds, k, alpha);
        let mut queries = 0;
        loop {
            let batch: Vec<Contact> = std::iter::from_fn(|| l.next_query()).collect();
            assert!(batch.len() <= alpha, "more than alpha requests in flight");
            if batch.is_empty() {
                assert_eq!(l.in_flight(), 0);
                break;
            }
            for c in batch {
                queries += 1;
                if dead.contains(&c.id) {
                    l.on_failure(&c.id);
                } else {
                    l.on_response(&c.id, net.tables[&c.id].closest(&target, k));
                }
            }
        }
        assert!(l.is_finished());
        (l.result(), queries)
    }

    fn true_closest(net: &Network, target: &Id, k: usize, dead: &HashSet<Id>) -> Vec<Id> {
        let mut ids: Vec<Id> = net.contacts.iter().map(|c| c.id).filter(|id| !dead.contains(id)).collect();
        ids.sort_by_key(|id| id.distance(target));
        ids.truncate(k);
        ids
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Lookups converge to the true k closest on random networks of 1 to 256 nodes.
        #[test]
        fn lookup_finds_the_true_k_closest(n in 1usize..=256, seed in any::<u64>(), from in any::<prop::sample::Index>(), target_seed in any::<u64>()) {
            let k = 20;
            let net = network(n, k, seed);
            let origin = net.contacts[from.index(n)];
            let target = Id::random(&mut rand::rngs::StdRng::seed_from_u64(target_seed));
            let (found, _) = run(&net, origin, target, k, 3, &HashSet::new());
            let found: Vec<Id> = found.iter().map(|c| c.id).collect();
            prop_assert_eq!(found, true_closest(&net, &target, k, &HashSet::new()));
        }

        /// With one node in eight dead but still in everyone's tables, the lookup routes around
        /// them: it returns only live nodes, closest first, and the closest half of its answer
        /// is exactly the true closest live nodes. (The far half may miss a live node whose
        /// bucket slots elsewhere are held by dead ones until the tables evict them.)
        #[test]
        fn lookup_routes_around_dead_nodes(n in 2usize..=128, seed in any::<u64>()) {
            let k = 20;
            let net = network(n, k, seed);
            let origin = net.contacts[0];
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xdead);
            let dead: HashSet<Id> = net.contacts.iter().skip(1)
                .filter(|_| rand::Rng::random_ratio(&mut rng, 1, 8))
                .map(|c| c.id).collect();
            let target = Id::random(&mut rng);
            let (found, _) = run(&net, origin, target, k, 3, &dead);
            let found: Vec<Id> = found.iter().map(|c| c.id).collect();
            prop_assert!(found.iter().all(|id| !dead.contains(id)));
            prop_assert!(found.windows(2).all(|w| w[0].distance(&target) < w[1].distance(&target)));
            let truth = true_closest(&net, &target, k, &dead);
            let half = truth.len().div_ceil(2);
            prop_assert_eq!(&found[..half.min(found.len())], &truth[..half]);
        }
    }

    #[test]
    fn single_node_lookup_is_immediately_done() {
        let me = Contact { id: Id::sha1(b"me"), addr: SocketAddr::from(([127, 0, 0, 1], 1)) };
        let mut l = Lookup::new(Id::sha1(b"t"), Some(me), [], 20, 3);
        assert!(l.next_query().is_none());
        assert!(l.is_finished());
        assert_eq!(l.result(), vec![me]);
    }

    #[test]
    fn responses_from_unknown_or_settled_nodes_are_ignored() {
        let me = Contact { id: Id::sha1(b"me"), addr: SocketAddr::from(([127, 0, 0, 1], 1)) };
        let other = Contact { id: Id::sha1(b"o"), addr: SocketAddr::from(([127, 0, 0, 1], 2)) };
        let stranger = Contact { id: Id::sha1(b"s"), addr: SocketAddr::from(([127, 0, 0, 1], 3)) };
        let mut l = Lookup::new(Id::sha1(b"t"), Some(me), [other], 20, 3);
        // An unsolicited answer adds nothing.
        l.on_response(&stranger.id, [stranger]);
        assert_eq!(l.next_query(), Some(other));
        l.on_response(&other.id, []);
        l.on_response(&other.id, [stranger]);
        assert!(l.is_finished());
        assert_eq!(l.result().len(), 2);
    }
}

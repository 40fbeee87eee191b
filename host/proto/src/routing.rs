//! The Kademlia routing table: 160 k-buckets with liveness-based replacement.
//!
//! # Implementation notes
//!
//! - Bucket `i` holds contacts whose XOR distance to the local id has its highest set bit at
//!   position `i`, so bucket 159 covers half the id space and bucket 0 a single id.
//! - A bucket holds at most `k` entries, least recently seen first. Hearing from a known contact
//!   moves it to the back.
//! - A full bucket never drops a live contact for a new one (long-lived nodes are the most likely
//!   to stay up). The newcomer waits in the bucket's replacement cache (at most `k`, newest kept)
//!   and the table asks the caller to ping the least recently seen entry. If that entry fails
//!   `max_failures` times in a row it is evicted and the newest replacement takes its place.
//! - The table never contains the local id.
//! - Nothing here does I/O or reads a clock: `now` is an argument.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::id::{ID_BITS, Id};

/// A node as others see it: its id and the address it listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Contact {
    pub id: Id,
    pub addr: SocketAddr,
}

#[derive(Clone, Debug)]
struct Entry {
    contact: Contact,
    last_seen: Instant,
    failures: u32,
}

#[derive(Clone, Debug, Default)]
struct Bucket {
    /// Least recently seen first.
    entries: Vec<Entry>,
    /// Candidates waiting for a slot, newest last.
    replacements: Vec<Contact>,
    /// The entry currently being checked because the bucket was full.
    probing: Option<Id>,
    /// When a lookup last touched this bucket's range.
    last_refresh: Option<Instant>,
}

/// What [`RoutingTable::observe`] did with a contact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// It was new and had room.
    Inserted,
    /// It was known; it is now the most recently seen of its bucket.
    Refreshed,
    /// Its bucket is full; it waits in the replacement cache. If `ping` is set, the caller
    /// should ping that contact and report the outcome with [`RoutingTable::observe`] or
    /// [`RoutingTable::failed`].
    Pending { ping: Option<Contact> },
    /// The local id: never stored.
    IsLocal,
}

/// The routing table of one node.
#[derive(Clone, Debug)]
pub struct RoutingTable {
    local: Id,
    k: usize,
    max_failures: u32,
    buckets: Vec<Bucket>,
    /// Bumped whenever the set of contacts changes, so callers can cache placement decisions.
    generation: u64,
}

impl RoutingTable {
    /// An empty table for `local`, `k` entries per bucket; an entry is evicted after
    /// `max_failures` consecutive failures while a replacement is waiting, or `2 * max_failures`
    /// in any case.
    pub fn new(local: Id, k: usize, max_failures: u32) -> RoutingTable {
        assert!(k > 0, "k must be positive");
        RoutingTable {
            local,
            k,
            max_failures: max_failures.max(1),
            buckets: vec![Bucket::default(); ID_BITS],
            generation: 0,
        }
    }

    /// The local id.
    pub fn local_id(&self) -> Id {
        self.local
    }

    /// Changes whenever a contact is added, removed or changes address.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn bucket_of(&self, id: &Id) -> Option<usize> {
        self.local.distance(id).bucket_index()
    }

    /// Records that `contact` answered or sent us a request.
    pub fn observe(&mut self, contact: Contact, now: Instant) -> Observed {
        let Some(b) = self.bucket_of(&contact.id) else {
            return Observed::IsLocal;
        };
        let k = self.k;
        let bucket = &mut self.buckets[b];
        if let Some(pos) = bucket.entries.iter().position(|e| e.contact.id == contact.id) {
            let mut e = bucket.entries.remove(pos);
            if e.contact.addr != contact.addr {
                self.generation += 1;
            }
            e.contact = contact;
            e.last_seen = now;
            e.failures = 0;
            bucket.entries.push(e);
            if bucket.probing == Some(contact.id) {
                bucket.probing = None;
            }
            return Observed::Refreshed;
        }
        if bucket.entries.len() < k {
            bucket.entries.push(Entry { contact, last_seen: now, failures: 0 });
            bucket.replacements.retain(|c| c.id != contact.id);
            self.generation += 1;
            return Observed::Inserted;
        }
        bucket.replacements.retain(|c| c.id != contact.id);
        bucket.replacements.push(contact);
        if bucket.replacements.len() > k {
            bucket.replacements.remove(0);
        }
        let ping = if bucket.probing.is_none() {
            let oldest = bucket.entries[0].contact;
            bucket.probing = Some(oldest.id);
            Some(oldest)
        } else {
            None
        };
        Observed::Pending { ping }
    }

    /// Records that a request to `id` failed at `now`. Returns the contact if it was evicted.
    pub fn failed(&mut self, id: &Id, now: Instant) -> Option<Contact> {
        let b = self.bucket_of(id)?;
        let max = self.max_failures;
        let bucket = &mut self.buckets[b];
        if bucket.probing == Some(*id) {
            bucket.probing = None;
        }
        bucket.replacements.retain(|c| c.id != *id);
        let pos = bucket.entries.iter().position(|e| e.contact.id == *id)?;
        bucket.entries[pos].failures += 1;
        let failures = bucket.entries[pos].failures;
        let evict = failures >= 2 * max || (failures >= max && !bucket.replacements.is_empty());
        if !evict {
            return None;
        }
        let gone = bucket.entries.remove(pos).contact;
        if let Some(next) = bucket.replacements.pop() {
            // The replacement has not been heard from since it was cached: it goes first, as
            // the least recently seen, so it is the next to be checked.
            bucket.entries.insert(0, Entry { contact: next, last_seen: now, failures: 0 });
        }
        self.generation += 1;
        Some(gone)
    }

    /// Removes `id` outright (e.g. it presented a different key).
    pub fn remove(&mut self, id: &Id) -> Option<Contact> {
        let b = self.bucket_of(id)?;
        let bucket = &mut self.buckets[b];
        bucket.replacements.retain(|c| c.id != *id);
        let pos = bucket.entries.iter().position(|e| e.contact.id == *id)?;
        self.generation += 1;
        Some(bucket.entries.remove(pos).contact)
    }

    /// Whether `id` is in the table.
    pub fn contains(&self, id: &Id) -> bool {
        self.get(id).is_some()
    }

    /// The contact for `id`, if known.
    pub fn get(&self, id: &Id) -> Option<Contact> {
        let b = self.bucket_of(id)?;
        self.buckets[b].entries.iter().find(|e| e.contact.id == *id).map(|e| e.contact)
    }

    /// Number of contacts.
    pub fn len(&self) -> usize {
        self.buckets.iter().map(|b| b.entries.len()).sum()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All contacts.
    pub fn contacts(&self) -> impl Iterator<Item = Contact> + '_ {
        self.buckets.iter().flat_map(|b| b.entries.iter().map(|e| e.contact))
    }

    /// The `n` known contacts closest to `target`, closest first.
    pub fn closest(&self, target: &Id, n: usize) -> Vec<Contact> {
        let mut all: Vec<Contact> = self.contacts().collect();
        all.sort_by_key(|c| c.id.distance(target));
        all.truncate(n);
        all
    }

    /// Notes that a lookup for `target` ran, which refreshes the bucket covering it.
    pub fn touch(&mut self, target: &Id, now: Instant) {
        if let Some(b) = self.bucket_of(target) {
            self.buckets[b].last_refresh = Some(now);
        }
    }

    /// Buckets that hold contacts or lie below the furthest non-empty bucket and that no lookup
    /// touched for `interval`: a lookup for a random id in each keeps the table fresh.
    pub fn buckets_to_refresh(&self, now: Instant, interval: Duration) -> Vec<usize> {
        let Some(top) = self.buckets.iter().rposition(|b| !b.entries.is_empty()) else {
            return Vec::new();
        };
        // Below the closest non-empty bucket there is nothing to find but our immediate
        // neighbours, which the self-lookup already covers.
        let bottom = self.buckets.iter().position(|b| !b.entries.is_empty()).unwrap_or(0);
        (bottom..=top)
            .filter(|&i| self.buckets[i].last_refresh.is_none_or(|t| now.saturating_duration_since(t) >= interval))
            .collect()
    }

    /// When `id` was last heard from.
    pub fn last_seen(&self, id: &Id) -> Option<Instant> {
        let b = self.bucket_of(id)?;
        self.buckets[b].entries.iter().find(|e| e.contact.id == *id).map(|e| e.last_seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn contact(id: Id, port: u16) -> Contact {
        Contact { id, addr: SocketAddr::from(([127, 0, 0, 1], port)) }
    }

    #[test]
    fn full_bucket_keeps_old_contacts_until_they_fail() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let local = Id::random(&mut rng);
        let now = Instant::now();
        let mut t = RoutingTable::new(local, 2, 1);
        let ids: Vec<Id> = (0..4).map(|_| local.random_in_bucket(159, &mut rng)).collect();
        assert_eq!(t.observe(contact(ids[0], 1), now), Observed::Inserted);
        assert_eq!(t.observe(contact(ids[1], 2), now), Observed::Inserted);
        // Third contact: bucket full, the oldest must be pinged.
        assert_eq!(t.observe(contact(ids[2], 3), now), Observed::Pending { ping: Some(contact(ids[0], 1)) });
        // A fourth while the probe is running: no second ping.
        assert_eq!(t.observe(contact(ids[3], 4), now), Observed::Pending { ping: None });
        // The oldest answers: it stays, moved to the back.
        assert_eq!(t.observe(contact(ids[0], 1), now), Observed::Refreshed);
        assert!(t.contains(&ids[0]) && !t.contains(&ids[2]));
        // ids[1] is now least recent; it fails once: evicted, newest replacement (ids[3]) in.
        let generation = t.generation();
        assert_eq!(t.failed(&ids[1], now), Some(contact(ids[1], 2)));
        assert!(t.contains(&ids[3]) && !t.contains(&ids[1]));
        assert!(t.generation() > generation);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn failures_without_replacement_evict_later() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let local = Id::random(&mut rng);
        let mut t = RoutingTable::new(local, 20, 2);
        let id = Id::random(&mut rng);
        let now = Instant::now();
        t.observe(contact(id, 1), now);
        assert_eq!(t.failed(&id, now), None);
        assert_eq!(t.failed(&id, now), None);
        assert_eq!(t.failed(&id, now), None);
        assert!(t.failed(&id, now).is_some());
        assert!(t.is_empty());
    }

    #[test]
    fn local_id_is_never_stored_and_closest_sorts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let local = Id::random(&mut rng);
        let mut t = RoutingTable::new(local, 20, 2);
        assert_eq!(t.observe(contact(local, 1), Instant::now()), Observed::IsLocal);
        for i in 0..50 {
            t.observe(contact(Id::random(&mut rng), i), Instant::now());
        }
        let target = Id::random(&mut rng);
        let c = t.closest(&target, 10);
        assert_eq!(c.len(), 10);
        assert!(c.windows(2).all(|w| w[0].id.distance(&target) <= w[1].id.distance(&target)));
    }

    #[test]
    fn refresh_lists_untouched_buckets() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let local = Id::random(&mut rng);
        let mut t = RoutingTable::new(local, 20, 2);
        let now = Instant::now();
        t.observe(contact(local.random_in_bucket(159, &mut rng), 1), now);
        t.observe(contact(local.random_in_bucket(150, &mut rng), 2), now);
        assert_eq!(t.buckets_to_refresh(now, Duration::from_secs(60)).len(), 10);
        t.touch(&local.random_in_bucket(155, &mut rng), now);
        let due = t.buckets_to_refresh(now, Duration::from_secs(60));
        assert!(!due.contains(&155) && due.len() == 9);
        assert_eq!(t.buckets_to_refresh(now + Duration::from_secs(61), Duration::from_secs(60)).len(), 10);
    }
}

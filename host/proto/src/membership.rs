//! The membership view: one entry per node this node has heard of, spread by gossip
//! (Scuttlebutt-lite), and the liveness every node derives from it locally.
//!
//! Placement is computed from this view ([`Membership::owners`]), not by network lookups, so
//! every node that holds the same view names the same owners for a block: repair needs that.
//! The view is meant for fleets of up to a few thousand nodes (every node holds every entry,
//! and a gossip digest carries one item per entry).
//!
//! # Implementation notes
//!
//! - An entry's version is `(incarnation, heartbeat)`: the incarnation is the node's start time
//!   in nanoseconds, the heartbeat a counter the node bumps every gossip round. An entry is only
//!   ever replaced by one with a higher version, so gossip in any order converges.
//! - Liveness is local: a node is up while its version advanced within `suspect_after`, down
//!   after that, gone after `gone_after`; a `Left` node is gone at once. This node is always up.
//! - Entries travel with their age (how long ago the sender saw them advance), so a node that
//!   learns of a long-silent member sees it as down or gone at once instead of up for a while,
//!   and nodes agree on who is gone (and so on the owners) without waiting out `gone_after`.
//! - Entries silent for twice `gone_after` are forgotten, and not learned again from peers
//!   that still hold them; a full view makes room by forgetting the longest-silent gone entry.
//! - Every entry is signed by the node it describes ([`Proof`]); the node checks each entry it
//!   would take ([`Membership::merge_checked`]) so only a node itself can change its entry:
//!   mark itself `Left`, move, or raise its version. This module carries the proofs and leaves
//!   the cryptography to its caller.
//! - A peer holding this node's entry at a higher version (a previous run with a clock ahead)
//!   is asked for it; once that entry passes the check, this node refutes it by raising its
//!   incarnation above it. A bare digest claim never moves the incarnation.
//! - Nothing here does I/O or reads a clock: `now` is an argument (the model is quinn-proto).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::IndexedRandom;
use serde::{Deserialize, Serialize};

use crate::beat_chain::{BeatProof, Token};
use crate::geo::GeoPoint;
use crate::placement::coi::Located;

use crate::id::Id;
use crate::routing::Contact;

/// Most entries a view may be configured to hold, and most items a digest may carry on the
/// wire.
pub const MAX_MEMBERS: usize = 16_384;
/// Most entries (or wanted ids) one gossip message may carry on the wire.
pub const MAX_GOSSIP_ENTRIES: usize = 1_024;
/// Most certificates a [`Proof`] may carry.
pub const MAX_PROOF_CERTS: usize = 3;
/// Most bytes of one certificate, or of a signature, in a [`Proof`].
pub const MAX_PROOF_ITEM_BYTES: usize = 8 * 1024;

/// Whether a node takes part in placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberStatus {
    /// Owns blocks.
    Normal,
    /// Handing its blocks off before it leaves: no longer an owner, still serving.
    Leaving,
    /// Gone for good.
    Left,
}

/// What the view records of one node; the node itself writes it, others copy it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub id: Id,
    pub addr: SocketAddr,
    /// The node's start time in nanoseconds since the Unix epoch: a restarted node comes back
    /// with a higher one.
    pub incarnation: u64,
    /// Bumped by the node every gossip round, and whenever it changes its entry.
    pub heartbeat: u64,
    pub status: MemberStatus,
    /// Digest of the configuration the node runs (set by the control plane; 0 when none).
    pub config_digest: u64,
    /// The node's location (latitude, longitude) when known.
    pub location: Option<(f64, f64)>,
}

impl Member {
    /// A fresh entry for a node starting now.
    pub fn new(id: Id, addr: SocketAddr, incarnation: u64) -> Member {
        Member { id, addr, incarnation, heartbeat: 0, status: MemberStatus::Normal, config_digest: 0, location: None }
    }

    /// The version that orders copies of this entry.
    pub fn version(&self) -> (u64, u64) {
        (self.incarnation, self.heartbeat)
    }

    /// Its id and address.
    pub fn contact(&self) -> Contact {
        Contact { id: self.id, addr: self.addr }
    }
}

/// One item of a gossip digest: which version of an entry the sender holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestItem {
    pub id: Id,
    pub incarnation: u64,
    pub heartbeat: u64,
}

impl DigestItem {
    fn version(&self) -> (u64, u64) {
        (self.incarnation, self.heartbeat)
    }
}

/// Most bytes of a signed revocation list on the wire (about 20,000 revoked ids).
pub const MAX_REVOCATIONS_BYTES: usize = 1 << 20;

/// The fleet's revocation list as the control plane signed it with the fleet CA's key; nodes
/// pass it on by gossip, so a site cut off from the control plane still learns it. What the
/// body says (its JSON) is the node's business; `generation` orders lists without reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedRevocations {
    /// The fleet generation the list was made at (also inside `body`, which is what counts).
    pub generation: u64,
    pub body: Vec<u8>,
    /// The TLS `SignatureScheme` code of the signature.
    pub scheme: u16,
    pub signature: Vec<u8>,
}

impl SignedRevocations {
    /// Whether its sizes are within [`MAX_REVOCATIONS_BYTES`] and [`MAX_PROOF_ITEM_BYTES`].
    pub fn is_bounded(&self) -> bool {
        self.body.len() <= MAX_REVOCATIONS_BYTES && self.signature.len() <= MAX_PROOF_ITEM_BYTES
    }
}

/// What a gossip message says of revocations: the generation of the list the sender holds (0:
/// none), and the list itself when the other side is known to hold an older one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationNews {
    pub held: u64,
    pub list: Option<SignedRevocations>,
}

/// A node's proof of its own entry: the certificate chain that binds its id (the id is the
/// hash of the certificate's public key), the signature with that key of
/// [`Member::signed_bytes`] (the entry and the anchor of a beat chain), and the token that
/// proves the entry's heartbeat on that chain ([`crate::beat_chain`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// DER certificates, the node's own first.
    pub chain: Vec<Vec<u8>>,
    /// The TLS `SignatureScheme` code of the signature.
    pub scheme: u16,
    pub signature: Vec<u8>,
    pub beats: BeatProof,
}

impl Proof {
    /// Whether its sizes are within [`MAX_PROOF_CERTS`] and [`MAX_PROOF_ITEM_BYTES`].
    pub fn is_bounded(&self) -> bool {
        !self.chain.is_empty()
            && self.chain.len() <= MAX_PROOF_CERTS
            && self.chain.iter().all(|c| c.len() <= MAX_PROOF_ITEM_BYTES)
            && self.signature.len() <= MAX_PROOF_ITEM_BYTES
    }
}

impl Member {
    /// What a node signs for its entry: a domain tag, the entry's postcard encoding with the
    /// heartbeat its beat chain starts at (`chain_first`), then the chain's anchor. Later
    /// heartbeats are proven by the chain, not signed.
    pub fn signed_bytes(&self, chain_first: u64, anchor: &Token) -> Vec<u8> {
        let body = Member { heartbeat: chain_first, ..self.clone() };
        let mut out = b"timeshard member entry v2\0".to_vec();
        out.extend(postcard::to_allocvec(&body).expect("a member always encodes"));
        out.extend_from_slice(anchor);
        out
    }
}

/// An entry as gossip carries it: with how long ago the sender saw it advance, and its
/// node's signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GossipEntry {
    pub member: Member,
    pub age_ms: u32,
    /// `None` only for entries a view hands out of its own node, which its caller signs.
    pub proof: Option<Proof>,
    /// Where the receiver saw the node, for an entry whose signed address is unspecified (the
    /// node listens on 0.0.0.0): set by the receiver, never sent.
    #[serde(skip)]
    pub seen_at: Option<SocketAddr>,
}

/// What this node concludes about another from the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Liveness {
    /// Its heartbeat advanced within `suspect_after`.
    Up,
    /// Silent for longer than that: still an owner (writes to it become hints).
    Down,
    /// Silent for longer than `gone_after`, or `Left`: no longer an owner.
    Gone,
}

/// Settings of a view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub suspect_after: Duration,
    pub gone_after: Duration,
    /// Most entries held (this node included).
    pub max_members: usize,
    /// Most entries one gossip message carries.
    pub max_entries: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            suspect_after: Duration::from_secs(5),
            gone_after: Duration::from_secs(600),
            max_members: 4_096,
            max_entries: 256,
        }
    }
}

/// How many members are up, down and gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub up: u32,
    pub down: u32,
    pub gone: u32,
}

/// What a merge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Entries added or replaced by newer versions.
    pub updated: usize,
    /// New entries refused because the view is full.
    pub refused: usize,
    /// Entries the check refused (see [`Membership::merge_checked`]).
    pub rejected: usize,
}

impl Entry {
    /// The node's id and the address to reach it at.
    fn contact(&self) -> Contact {
        let addr = match self.seen_at {
            Some(seen) if self.member.addr.ip().is_unspecified() => seen,
            _ => self.member.addr,
        };
        Contact { id: self.member.id, addr }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    member: Member,
    /// The signature it came with (`None` for this node's own entry).
    proof: Option<Proof>,
    /// Where the node was seen, used when its signed address is unspecified.
    seen_at: Option<SocketAddr>,
    /// When this node last saw the entry's version grow (or, for entries learned by gossip,
    /// when the sender had).
    last_advanced: Instant,
}

/// One node's membership view.
#[derive(Clone, Debug)]
pub struct Membership {
    me: Id,
    cfg: Config,
    /// Every entry, this node's own included.
    entries: HashMap<Id, Entry>,
    /// Members placement may choose (Normal and not gone), sorted by id.
    eligible: Vec<Contact>,
    /// Members that still serve reads (Normal or Leaving, not gone), sorted by id.
    serving: Vec<Contact>,
    /// The eligible members that have a valid location, sorted by id: where CoI blocks go.
    located: Vec<Located>,
    /// Ids placement must not choose whatever their entries say (revoked certificates).
    excluded: HashSet<Id>,
    /// Bumped whenever `eligible` or `serving` changes, so callers can cache owner sets.
    generation: u64,
    /// The first `now` this view saw; the earliest instant it records.
    started: Instant,
}

impl Membership {
    /// A view holding only `me`, as of `now`.
    pub fn new(me: Member, cfg: Config, now: Instant) -> Membership {
        let id = me.id;
        let mut entries = HashMap::new();
        entries.insert(id, Entry { member: me, proof: None, seen_at: None, last_advanced: now });
        let mut view = Membership {
            me: id,
            cfg,
            entries,
            eligible: Vec::new(),
            serving: Vec::new(),
            located: Vec::new(),
            excluded: HashSet::new(),
            generation: 0,
            started: now,
        };
        view.refresh(now);
        view
    }

    /// This node's own entry.
    pub fn me(&self) -> &Member {
        &self.entries[&self.me].member
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Bumped whenever the set of members placement may choose or reads may ask (or one of
    /// their addresses) changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of entries, this node included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false: the view holds this node from the start.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `id`, if known.
    pub fn get(&self, id: &Id) -> Option<&Member> {
        self.entries.get(id).map(|e| &e.member)
    }

    /// How to reach `id`: its signed address, or where it was seen if that is unspecified.
    pub fn contact(&self, id: &Id) -> Option<Contact> {
        self.entries.get(id).map(Entry::contact)
    }

    fn own(&mut self) -> &mut Entry {
        self.entries.get_mut(&self.me).expect("the view always holds this node")
    }

    /// One gossip round's heartbeat: bumps this node's version and re-derives liveness.
    pub fn beat(&mut self, now: Instant) {
        let own = self.own();
        own.member.heartbeat += 1;
        own.last_advanced = now;
        self.refresh(now);
    }

    /// Changes this node's status (leaving, left); peers learn it with the next gossip.
    pub fn set_status(&mut self, status: MemberStatus, now: Instant) {
        self.own().member.status = status;
        self.beat(now);
    }

    /// Records the digest of the configuration this node runs, if it changed.
    pub fn set_config_digest(&mut self, digest: u64, now: Instant) {
        if self.me().config_digest != digest {
            self.own().member.config_digest = digest;
            self.beat(now);
        }
    }

    /// Records this node's location, if it changed.
    pub fn set_location(&mut self, location: Option<(f64, f64)>, now: Instant) {
        if self.me().location != location {
            self.own().member.location = location;
            self.beat(now);
        }
    }

    /// What this node concludes about `id`, if it is in the view.
    pub fn liveness(&self, id: &Id, now: Instant) -> Option<Liveness> {
        self.entries.get(id).map(|e| self.liveness_of(e, now))
    }

    fn liveness_of(&self, e: &Entry, now: Instant) -> Liveness {
        if e.member.id == self.me {
            return Liveness::Up;
        }
        if e.member.status == MemberStatus::Left {
            return Liveness::Gone;
        }
        let silent = now.saturating_duration_since(e.last_advanced);
        if silent >= self.cfg.gone_after {
            Liveness::Gone
        } else if silent >= self.cfg.suspect_after {
            Liveness::Down
        } else {
            Liveness::Up
        }
    }

    /// Every entry with its liveness.
    pub fn members(&self, now: Instant) -> impl Iterator<Item = (&Member, Liveness)> + '_ {
        self.entries.values().map(move |e| (&e.member, self.liveness_of(e, now)))
    }

    /// How many members are up, down and gone (this node counts as up).
    pub fn counts(&self, now: Instant) -> Counts {
        let mut c = Counts::default();
        for (_, l) in self.members(now) {
            match l {
                Liveness::Up => c.up += 1,
                Liveness::Down => c.down += 1,
                Liveness::Gone => c.gone += 1,
            }
        }
        c
    }

    /// The members placement may choose (status Normal, not gone), sorted by id.
    pub fn eligible(&self) -> &[Contact] {
        &self.eligible
    }

    /// The members that still serve reads (status Normal or Leaving, not gone, not excluded),
    /// sorted by id: the candidates a read may ask beyond the owners.
    pub fn serving(&self) -> &[Contact] {
        &self.serving
    }

    /// Keeps `ids` out of placement and reads whatever their entries say (revoked
    /// certificates), as of `now`.
    pub fn set_excluded(&mut self, ids: HashSet<Id>, now: Instant) {
        self.excluded = ids;
        self.refresh(now);
    }

    /// The eligible members that have a valid location, sorted by id.
    pub fn located(&self) -> &[Located] {
        &self.located
    }

    /// The `rf` owners of `id`: the closest eligible members, closest first.
    pub fn owners(&self, id: &Id, rf: usize) -> Vec<Contact> {
        crate::placement::owners(&self.eligible, id, rf)
    }

    /// Re-derives liveness as of `now`: forgets long-silent entries and recomputes the members
    /// placement may choose. Returns whether that set changed.
    pub fn refresh(&mut self, now: Instant) -> bool {
        let forget_after = self.cfg.gone_after.saturating_mul(2);
        let me = self.me;
        self.entries.retain(|id, e| *id == me || now.saturating_duration_since(e.last_advanced) < forget_after);
        let mut serving: Vec<&Entry> = self
            .entries
            .values()
            .filter(|e| e.member.status != MemberStatus::Left && self.liveness_of(e, now) != Liveness::Gone)
            .filter(|e| !self.excluded.contains(&e.member.id))
            .collect();
        serving.sort_by_key(|e| e.member.id);
        let eligible: Vec<Contact> =
            serving.iter().filter(|e| e.member.status == MemberStatus::Normal).map(|e| e.contact()).collect();
        let located: Vec<Located> = serving
            .iter()
            .filter(|e| e.member.status == MemberStatus::Normal)
            .filter_map(|e| {
                let (lat, lon) = e.member.location?;
                Some(Located { contact: e.contact(), at: GeoPoint::new(lat, lon).ok()? })
            })
            .collect();
        let serving: Vec<Contact> = serving.iter().map(|e| e.contact()).collect();
        let changed = eligible != self.eligible || located != self.located;
        if changed || serving != self.serving {
            self.eligible = eligible;
            self.serving = serving;
            self.located = located;
            self.generation += 1;
        }
        changed
    }

    /// The digest of every entry, for a gossip message.
    pub fn digest(&self) -> Vec<DigestItem> {
        self.entries
            .values()
            .map(|e| DigestItem { id: e.member.id, incarnation: e.member.incarnation, heartbeat: e.member.heartbeat })
            .collect()
    }

    fn gossip_entry(&self, e: &Entry, now: Instant) -> GossipEntry {
        let age = now.saturating_duration_since(e.last_advanced).as_millis();
        GossipEntry {
            member: e.member.clone(),
            age_ms: u32::try_from(age).unwrap_or(u32::MAX),
            proof: e.proof.clone(),
            seen_at: None,
        }
    }

    /// Answers a peer's digest: the entries it lacks or holds older (at most `max_entries`,
    /// freshest first), and the ids of its digest this view lacks or holds older (at most
    /// `max_entries`), which the peer should push. A higher version of this node's own entry
    /// is asked for too: only the signed entry, once checked, may be refuted.
    pub fn answer(&self, digest: &[DigestItem], now: Instant) -> (Vec<GossipEntry>, Vec<Id>) {
        let theirs: HashMap<Id, (u64, u64)> = digest.iter().map(|d| (d.id, d.version())).collect();
        let mut newer: Vec<&Entry> = self
            .entries
            .values()
            .filter(|e| theirs.get(&e.member.id).is_none_or(|&v| v < e.member.version()))
            .collect();
        newer.sort_by_key(|e| (std::cmp::Reverse(e.last_advanced), e.member.id));
        let entries = newer.into_iter().take(self.cfg.max_entries).map(|e| self.gossip_entry(e, now)).collect();
        let mut wanted = HashSet::new();
        let want = digest
            .iter()
            .filter(|d| self.entries.get(&d.id).is_none_or(|e| e.member.version() < d.version()))
            .filter(|d| wanted.insert(d.id))
            .map(|d| d.id)
            .take(self.cfg.max_entries)
            .collect();
        (entries, want)
    }

    /// The entries of `ids` this view holds (at most `max_entries`), for a push.
    pub fn entries_for(&self, ids: &[Id], now: Instant) -> Vec<GossipEntry> {
        ids.iter()
            .filter_map(|id| self.entries.get(id))
            .take(self.cfg.max_entries)
            .map(|e| self.gossip_entry(e, now))
            .collect()
    }

    /// Raises this node's incarnation above one a peer claims for it.
    fn refute(&mut self, claimed_incarnation: u64, now: Instant) {
        let own = self.own();
        own.member.incarnation = own.member.incarnation.max(claimed_incarnation.saturating_add(1));
        own.member.heartbeat = 0;
        own.last_advanced = now;
    }

    /// Takes entries from a peer, each only if its version is higher than the one held,
    /// without checking their proofs: for tests and tools that hold no keys.
    pub fn merge(&mut self, entries: impl IntoIterator<Item = GossipEntry>, now: Instant) -> Merged {
        self.merge_checked(entries, now, |_| true)
    }

    /// Takes entries from a peer: each replaces the one held only if its version is higher and
    /// `check` accepts it (the node verifies its proof there). `check` runs only for entries
    /// the view would take, so entries already known cost nothing.
    pub fn merge_checked(
        &mut self,
        entries: impl IntoIterator<Item = GossipEntry>,
        now: Instant,
        mut check: impl FnMut(&GossipEntry) -> bool,
    ) -> Merged {
        let mut merged = Merged::default();
        let forget_after = self.cfg.gone_after.saturating_mul(2);
        for entry in entries {
            let member = &entry.member;
            if member.id == self.me {
                if member.version() > self.me().version() {
                    if check(&entry) {
                        self.refute(member.incarnation, now);
                    } else {
                        merged.rejected += 1;
                    }
                }
                continue;
            }
            let age = Duration::from_millis(u64::from(entry.age_ms));
            let advanced = now.checked_sub(age).unwrap_or(self.started).min(now);
            let held = self.entries.get(&member.id).map(|e| e.member.version());
            if held.is_some_and(|v| v >= member.version()) || (held.is_none() && age >= forget_after) {
                continue;
            }
            if !check(&entry) {
                merged.rejected += 1;
                continue;
            }
            let GossipEntry { member, proof, seen_at, .. } = entry;
            match self.entries.get_mut(&member.id) {
                Some(e) => {
                    e.last_advanced = e.last_advanced.max(advanced);
                    e.member = member;
                    e.proof = proof;
                    e.seen_at = seen_at.or(e.seen_at);
                    merged.updated += 1;
                }
                None => {
                    if self.entries.len() >= self.cfg.max_members && !self.evict_one(now) {
                        merged.refused += 1;
                        continue;
                    }
                    self.entries.insert(member.id, Entry { member, proof, seen_at, last_advanced: advanced });
                    merged.updated += 1;
                }
            }
        }
        self.refresh(now);
        merged
    }

    /// Forgets the longest-silent gone entry to make room; false if none is gone.
    fn evict_one(&mut self, now: Instant) -> bool {
        let victim = self
            .entries
            .values()
            .filter(|e| self.liveness_of(e, now) == Liveness::Gone)
            .min_by_key(|e| (e.last_advanced, e.member.id))
            .map(|e| e.member.id);
        victim.is_some_and(|id| self.entries.remove(&id).is_some())
    }

    /// Whom to gossip with this round: `fanout` random up peers; with a probability of
    /// down / (up + down) also one down peer, so a healed partition or a recovered node is
    /// noticed; rarely (one round in ten) one gone peer that has not left, so even a long
    /// partition heals.
    pub fn gossip_targets<R: Rng + ?Sized>(&self, fanout: usize, now: Instant, rng: &mut R) -> Vec<Contact> {
        let (mut up, mut down, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for e in self.entries.values().filter(|e| e.member.id != self.me) {
            match self.liveness_of(e, now) {
                Liveness::Up => up.push(e.contact()),
                Liveness::Down => down.push(e.contact()),
                Liveness::Gone if e.member.status != MemberStatus::Left => gone.push(e.contact()),
                Liveness::Gone => {}
            }
        }
        // A fixed order first, so the choice depends on the rng alone.
        for list in [&mut up, &mut down, &mut gone] {
            list.sort_by_key(|c| c.id);
        }
        let mut targets: Vec<Contact> = up.choose_multiple(rng, fanout).copied().collect();
        if !down.is_empty() && rng.random_range(0..up.len() + down.len()) < down.len() {
            targets.extend(down.choose(rng));
        }
        if !gone.is_empty() && rng.random_range(0..10) == 0 {
            targets.extend(gone.choose(rng));
        }
        targets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    /// A virtual clock's origin with room to go back (ages are subtracted from `now`).
    fn origin() -> Instant {
        Instant::now() + Duration::from_secs(86_400)
    }

    fn member(i: u8) -> Member {
        Member::new(Id::sha1(&[i]), SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(i))), 1_000)
    }

    fn cfg() -> Config {
        Config { suspect_after: Duration::from_secs(5), gone_after: Duration::from_secs(60), ..Config::default() }
    }

    /// One full gossip exchange from `a` to `b` at `now`, as the node driver runs it.
    fn exchange(a: &mut Membership, b: &mut Membership, now: Instant) {
        let (entries, want) = b.answer(&a.digest(), now);
        a.merge(entries, now);
        let push = a.entries_for(&want, now);
        b.merge(push, now);
    }

    #[test]
    fn gossip_spreads_every_entry() {
        let t0 = origin();
        let mut views: Vec<Membership> = (0..6).map(|i| Membership::new(member(i), cfg(), t0)).collect();
        // A chain: 0-1, 1-2, ...: a few rounds reach everyone.
        for round in 0..6 {
            let now = t0 + Duration::from_millis(100 * round);
            for i in 0..5 {
                let (left, right) = views.split_at_mut(i + 1);
                exchange(&mut left[i], &mut right[0], now);
            }
        }
        for v in &views {
            assert_eq!(v.len(), 6);
            assert_eq!(v.eligible().len(), 6);
            assert_eq!(v.counts(t0 + Duration::from_secs(1)), Counts { up: 6, down: 0, gone: 0 });
        }
        let target = Id::sha1(b"block");
        let owners = views[0].owners(&target, 3);
        assert!(views.iter().all(|v| v.owners(&target, 3) == owners));
    }

    #[test]
    fn silence_makes_a_member_down_then_gone() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut b = Membership::new(member(1), cfg(), t0);
        exchange(&mut a, &mut b, t0);
        let bid = b.me().id;
        assert_eq!(a.liveness(&bid, t0 + Duration::from_secs(4)), Some(Liveness::Up));
        assert_eq!(a.liveness(&bid, t0 + Duration::from_secs(5)), Some(Liveness::Down));
        let generation = a.generation();
        // Down members stay owners.
        assert!(!a.refresh(t0 + Duration::from_secs(30)));
        assert_eq!(a.eligible().len(), 2);
        // Gone ones do not.
        assert!(a.refresh(t0 + Duration::from_secs(60)));
        assert_eq!(a.liveness(&bid, t0 + Duration::from_secs(60)), Some(Liveness::Gone));
        assert_eq!(a.eligible().len(), 1);
        assert!(a.generation() > generation);
        // This node itself is always up.
        assert_eq!(a.liveness(&a.me().id, t0 + Duration::from_secs(3_600)), Some(Liveness::Up));
        // Twice gone_after: forgotten.
        a.refresh(t0 + Duration::from_secs(120));
        assert_eq!(a.liveness(&bid, t0 + Duration::from_secs(120)), None);
    }

    #[test]
    fn heartbeats_keep_a_member_up() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut b = Membership::new(member(1), cfg(), t0);
        for s in 0..20 {
            let now = t0 + Duration::from_secs(s);
            b.beat(now);
            exchange(&mut a, &mut b, now);
            assert_eq!(a.liveness(&b.me().id, now + Duration::from_secs(4)), Some(Liveness::Up));
        }
    }

    #[test]
    fn a_restarted_node_replaces_its_old_entry() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut b = Membership::new(member(1), cfg(), t0);
        exchange(&mut a, &mut b, t0);
        for _ in 0..50 {
            b.beat(t0);
        }
        exchange(&mut a, &mut b, t0);
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(a.liveness(&b.me().id, t1), Some(Liveness::Down));
        // Back with a later start time, a new port and a heartbeat from zero.
        let mut again = member(1);
        again.incarnation = 2_000;
        again.addr.set_port(9_999);
        let mut b2 = Membership::new(again, cfg(), t1);
        let generation = a.generation();
        exchange(&mut b2, &mut a, t1);
        assert_eq!(a.get(&b2.me().id).unwrap().addr.port(), 9_999);
        assert_eq!(a.liveness(&b2.me().id, t1), Some(Liveness::Up));
        assert!(a.generation() > generation, "a new address changes the owners' contacts");
        // The stale entry never comes back from a peer that still holds it.
        let stale = GossipEntry { member: b.me().clone(), age_ms: 0, proof: None, seen_at: None };
        a.merge([stale], t1);
        assert_eq!(a.get(&b2.me().id).unwrap().incarnation, 2_000);
    }

    #[test]
    fn long_silent_entries_arrive_down_or_gone() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut c = Membership::new(member(2), cfg(), t0);
        a.merge([GossipEntry { member: member(1), age_ms: 0, proof: None, seen_at: None }], t0);
        // Much later, c learns of member 1 through a: silent for 45 s, so down, not up.
        let t1 = t0 + Duration::from_secs(45);
        exchange(&mut c, &mut a, t1);
        assert_eq!(c.liveness(&member(1).id, t1), Some(Liveness::Down));
        let t2 = t0 + Duration::from_secs(61);
        assert_eq!(c.liveness(&member(1).id, t2), a.liveness(&member(1).id, t2));
        assert_eq!(c.liveness(&member(1).id, t2), Some(Liveness::Gone));
        // Entries past twice gone_after are not learned at all.
        let mut d = Membership::new(member(3), cfg(), t0);
        d.merge([GossipEntry { member: member(4), age_ms: 120_000, proof: None, seen_at: None }], t0);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn leaving_and_left_members_own_nothing() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut b = Membership::new(member(1), cfg(), t0);
        exchange(&mut a, &mut b, t0);
        assert_eq!(a.eligible().len(), 2);
        b.set_status(MemberStatus::Leaving, t0);
        exchange(&mut a, &mut b, t0);
        assert_eq!(a.eligible().len(), 1);
        assert_eq!(a.serving().len(), 2, "a leaving node still serves reads");
        assert_eq!(a.liveness(&b.me().id, t0), Some(Liveness::Up), "a leaving node still serves");
        b.set_status(MemberStatus::Left, t0);
        exchange(&mut a, &mut b, t0);
        assert_eq!(a.liveness(&b.me().id, t0), Some(Liveness::Gone));
        assert_eq!(a.serving().len(), 1);
    }

    #[test]
    fn excluded_members_own_nothing_at_once() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut b = Membership::new(member(1), cfg(), t0);
        exchange(&mut a, &mut b, t0);
        let generation = a.generation();
        a.set_excluded([member(1).id].into(), t0);
        assert_eq!((a.eligible().len(), a.serving().len()), (1, 1));
        assert!(a.generation() > generation);
        a.set_excluded(HashSet::new(), t0);
        assert_eq!(a.eligible().len(), 2);
    }

    #[test]
    fn a_checked_claim_to_this_node_is_refuted_and_a_bare_one_is_asked_for() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        let mut impostor = member(0);
        impostor.incarnation = 5_000;
        let claim = GossipEntry { member: impostor, age_ms: 0, proof: None, seen_at: None };
        // An entry the check refuses never moves the incarnation.
        let merged = a.merge_checked([claim.clone()], t0, |_| false);
        assert_eq!((merged.rejected, a.me().incarnation), (1, 1_000));
        a.merge([claim], t0);
        assert!(a.me().incarnation > 5_000);
        // A digest claims a higher version: the answer asks for the entry instead of refuting.
        let digest = [DigestItem { id: member(0).id, incarnation: u64::MAX, heartbeat: u64::MAX }];
        let incarnation = a.me().incarnation;
        let (_, want) = a.answer(&digest, t0);
        assert_eq!(want, vec![member(0).id]);
        assert_eq!(a.me().incarnation, incarnation, "a bare digest claim moves nothing");
    }

    #[test]
    fn refused_entries_change_nothing_and_known_ones_are_not_checked_again() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        a.merge([GossipEntry { member: member(1), age_ms: 0, proof: None, seen_at: None }], t0);
        // A forged Left entry for member 1, and a fake member.
        let mut left = member(1);
        left.heartbeat = 10;
        left.status = MemberStatus::Left;
        let forged = [left, member(2)].map(|m| GossipEntry { member: m, age_ms: 0, proof: None, seen_at: None });
        let generation = a.generation();
        let merged = a.merge_checked(forged, t0, |_| false);
        assert_eq!((merged.updated, merged.rejected), (0, 2));
        assert_eq!((a.eligible().len(), a.generation()), (2, generation));
        // The version already held is not checked again.
        let mut checked = 0;
        a.merge_checked([GossipEntry { member: member(1), age_ms: 0, proof: None, seen_at: None }], t0, |_| {
            checked += 1;
            true
        });
        assert_eq!(checked, 0);
    }

    #[test]
    fn the_view_and_messages_are_bounded() {
        let t0 = origin();
        let small = Config { max_members: 4, max_entries: 2, ..cfg() };
        let mut a = Membership::new(member(0), small, t0);
        let entries = (1..10).map(|i| GossipEntry { member: member(i), age_ms: 0, proof: None, seen_at: None });
        let merged = a.merge(entries, t0);
        assert_eq!((a.len(), merged.updated, merged.refused), (4, 3, 6));
        // A gone entry makes room for a new one.
        let later = t0 + Duration::from_secs(61);
        a.merge([GossipEntry { member: member(20), age_ms: 0, proof: None, seen_at: None }], later);
        assert_eq!(a.len(), 4);
        assert!(a.get(&member(20).id).is_some(), "it took the place of a gone one");
        let b = Membership::new(member(30), small, t0);
        let (entries, want) = a.answer(&b.digest(), later);
        assert!(entries.len() <= 2 && want.len() <= 2);
    }

    #[test]
    fn gossip_targets_prefer_up_peers_and_sometimes_try_down_ones() {
        let t0 = origin();
        let mut a = Membership::new(member(0), cfg(), t0);
        a.merge((1..6).map(|i| GossipEntry { member: member(i), age_ms: 0, proof: None, seen_at: None }), t0);
        a.merge([GossipEntry { member: member(9), age_ms: 10_000, proof: None, seen_at: None }], t0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut down_tried = 0;
        for _ in 0..200 {
            let targets = a.gossip_targets(2, t0, &mut rng);
            assert!(targets.iter().all(|c| c.id != a.me().id));
            down_tried += targets.iter().filter(|c| c.id == member(9).id).count();
            assert!(targets.len() >= 2);
        }
        assert!(down_tried > 0 && down_tried < 100, "down peer tried {down_tried} times in 200 rounds");
    }

    proptest! {
        /// Nodes that learn the same entries, in any order and through any partner, name the
        /// same owners for every id.
        #[test]
        fn every_node_computes_the_same_owners_from_the_same_view(
            n in 2usize..24,
            order_seed in any::<u64>(),
            targets in proptest::collection::vec(any::<[u8; 20]>(), 1..20),
            rf in 1usize..6,
        ) {
            let t0 = origin();
            let members: Vec<Member> = (0..n as u8).map(member).collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(order_seed);
            let mut views: Vec<Membership> = members.iter().map(|m| Membership::new(m.clone(), cfg(), t0)).collect();
            // Random exchanges until every view holds every entry.
            let mut rounds = 0;
            while views.iter().any(|v| v.len() < n) {
                let (i, j) = (rand::Rng::random_range(&mut rng, 0..n), rand::Rng::random_range(&mut rng, 0..n));
                if i != j {
                    let (a, b) = if i < j {
                        let (l, r) = views.split_at_mut(j);
                        (&mut l[i], &mut r[0])
                    } else {
                        let (l, r) = views.split_at_mut(i);
                        (&mut r[0], &mut l[j])
                    };
                    exchange(a, b, t0);
                }
                rounds += 1;
                prop_assert!(rounds < 10_000);
            }
            for t in targets {
                let id = Id(t);
                let owners = views[0].owners(&id, rf);
                prop_assert_eq!(owners.len(), rf.min(n));
                for v in &views {
                    prop_assert_eq!(&v.owners(&id, rf), &owners);
                }
                // The owners are the closest members by XOR, closest first.
                let mut by_distance: Vec<Contact> = members.iter().map(Member::contact).collect();
                by_distance.sort_by_key(|c| c.id.distance(&id));
                prop_assert_eq!(&owners[..], &by_distance[..rf.min(n)]);
            }
        }
    }
}

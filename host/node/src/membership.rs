//! The membership view as the node runs it: the sans-IO [`Membership`] of `timeshard_proto`
//! under a lock, driven by the wall clock and by gossip over the network, and the owners of a
//! block computed from it (cached per view generation).
//!
//! Every `gossip_interval` the node bumps its heartbeat and sends its digest to a few peers
//! ([`View::gossip_round`]): random up members, sometimes a down one (so a recovered node or a
//! healed partition is noticed) and a contact of the routing table the view does not hold yet
//! (discovery still runs on Kademlia; placement no longer does). The answer carries the
//! entries this node lacks, and the ids it should push, which a second message carries.
//! Messages and the view are bounded (`max_members`, [`membership::MAX_GOSSIP_ENTRIES`]).
//!
//! Every entry is signed by its own node and checked before the view takes it
//! ([`crate::attest`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::seq::IndexedRandom;
use timeshard_proto::geo::GeoPoint;
use timeshard_proto::membership::{
    self, Counts, DigestItem, GossipEntry, Liveness, Member, MemberStatus, Membership, RevocationNews,
    SignedRevocations,
};
use timeshard_proto::placement::coi::Located;
use timeshard_proto::placement::{self, Owners, Target};
use timeshard_proto::repair::Ring;
use timeshard_proto::wire::{ErrorCode, ErrorReply, Request, Response};
use timeshard_proto::{Contact, Id};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::attest::Attest;
use crate::config::MembershipConfig;
use crate::dht::Dht;
use crate::revocations::Revocations;

/// Random up peers gossiped with each round.
const FANOUT: usize = 2;
/// Owner sets cached before the cache is cleared.
const OWNER_CACHE_MAX: usize = 200_000;
/// Gossip rounds a starting node runs with its first peers before it serves as a coordinator.
const JOIN_ROUNDS: usize = 5;

#[derive(Debug, Default)]
struct OwnerCache {
    generation: u64,
    owners: HashMap<Target, Owners>,
    /// The members that serve reads, for [`View::read_candidates`].
    serving: Option<Arc<Ring>>,
}

/// What runs, under the view's lock, whenever the owner-relevant part of the view changed
/// ([`View::on_change`]).
pub struct ChangeHook(Box<dyn Fn(&Membership) + Send + Sync>);

impl std::fmt::Debug for ChangeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChangeHook")
    }
}

/// This node's membership view.
#[derive(Debug)]
pub struct View {
    me: Contact,
    state: Mutex<Membership>,
    cfg: MembershipConfig,
    owners: Mutex<OwnerCache>,
    config_digest: Arc<AtomicU64>,
    generation: watch::Sender<u64>,
    attest: Arc<Attest>,
    revocations: Arc<Revocations>,
    on_change: std::sync::OnceLock<ChangeHook>,
}

/// Nanoseconds since the Unix epoch: a node's incarnation.
fn wall_ns() -> u64 {
    u64::try_from(timeshard_clock::now_ns()).unwrap_or(0)
}

impl View {
    /// A view holding only this node, `me`, starting now (its incarnation). `config_digest` is
    /// gossiped as this node's configuration digest whenever it changes; `attest` signs this
    /// node's entry and checks everyone else's.
    pub fn new(me: Contact, cfg: &MembershipConfig, config_digest: Arc<AtomicU64>, attest: Arc<Attest>) -> View {
        let mut member = Member::new(me.id, me.addr, wall_ns());
        member.config_digest = config_digest.load(Ordering::Relaxed);
        let state = Membership::new(member, cfg.view(), timeshard_clock::instant());
        let (generation, _) = watch::channel(state.generation());
        View {
            me,
            state: Mutex::new(state),
            cfg: cfg.clone(),
            owners: Mutex::new(OwnerCache::default()),
            config_digest,
            generation,
            revocations: Arc::new(Revocations::new(attest.clone())),
            attest,
            on_change: std::sync::OnceLock::new(),
        }
    }

    /// A view of `me` holding `members` as given (unsigned), with a throwaway signing key:
    /// for unit tests of what is computed from a view.
    #[cfg(test)]
    pub(crate) fn for_tests(me: Contact, members: impl IntoIterator<Item = GossipEntry>) -> View {
        let dir = crate::attest::tests::fleet(1);
        let identity = crate::attest::tests::identity(dir.path(), "node-0");
        let attest = Arc::new(Attest::new(&identity, std::time::Duration::from_secs(60)).expect("a dev identity"));
        let view = View::new(me, &MembershipConfig::default(), Arc::new(AtomicU64::new(0)), attest);
        view.with(|s| s.merge(members, timeshard_clock::instant()));
        view
    }

    /// What signs this node's entry and checks the others (its refusal counts, and renewal).
    pub fn attest(&self) -> &Arc<Attest> {
        &self.attest
    }

    /// Takes `entries` that `from` sent: only those whose proof checks out. Refusals are
    /// counted ([`Attest::refused`]) and logged once per message, naming the sender.
    fn merge(&self, s: &mut Membership, from: Contact, entries: Vec<GossipEntry>, now: std::time::Instant) {
        let wall = wall_ns();
        let mut first = None;
        let merged = s.merge_checked(entries, now, |e| match self.attest.check(e, wall) {
            Ok(()) => true,
            Err(reason) => {
                first.get_or_insert((e.member.id, reason));
                false
            }
        });
        if let Some((node, reason)) = first {
            warn!(
                from = %from.id.short(),
                addr = %from.addr,
                refused = merged.rejected,
                first_node = %node.short(),
                first_reason = reason.label(),
                "refused membership entries that their nodes did not sign"
            );
        }
        if merged.refused > 0 {
            debug!(refused = merged.refused, "membership view full");
        }
    }

    /// Signs this node's own entry among `entries` (the view hands it out unsigned).
    fn signed(&self, mut entries: Vec<GossipEntry>) -> Vec<GossipEntry> {
        for e in entries.iter_mut().filter(|e| e.member.id == self.me.id) {
            e.proof = self.attest.sign(&e.member);
        }
        entries
    }

    /// Runs `hook` with the new view whenever its generation changes (the owners may have
    /// changed), before anyone can read that view: repair marks this node unsettled there, so
    /// no read counts this node's answers for blocks the new view gives it and it lacks. The
    /// hook runs under the view's lock and must not call back into the view. Set once; a
    /// second hook is refused (returns false).
    pub fn on_change(&self, hook: impl Fn(&Membership) + Send + Sync + 'static) -> bool {
        self.on_change.set(ChangeHook(Box::new(hook))).is_ok()
    }

    /// This node.
    pub fn me(&self) -> Contact {
        self.me
    }

    /// The digest of the configuration this node runs, gossiped with its entry; whoever applies
    /// a new configuration stores its digest here.
    pub fn config_digest(&self) -> &Arc<AtomicU64> {
        &self.config_digest
    }

    fn with<T>(&self, f: impl FnOnce(&mut Membership) -> T) -> T {
        let mut state = self.state.lock().expect("membership lock");
        let before = state.generation();
        let out = f(&mut state);
        let after = state.generation();
        // Under the lock: nothing reads the new view (placement included) before the hook ran.
        if after != before
            && let Some(hook) = self.on_change.get()
        {
            (hook.0)(&state);
        }
        drop(state);
        if after != before {
            self.generation.send_replace(after);
        }
        out
    }

    /// The `rf` owners of `id`, closest first: the closest members that are not gone and not
    /// leaving. Cached until the view's generation changes.
    pub fn owners(&self, id: Id, rf: usize) -> Vec<Contact> {
        self.owners_of(&Target::dht(id, rf)).owners
    }

    /// The owners of `target` ([`placement::owners_of`]: by XOR distance, or by location for
    /// a CoI class), with the members to turn to next. Cached until the view's generation
    /// changes. Writes, reads, repair and handoff all place blocks through this.
    pub fn owners_of(&self, target: &Target) -> Owners {
        let (generation, owners) = {
            let state = self.state.lock().expect("membership lock");
            let generation = state.generation();
            let cache = self.owners.lock().expect("owner cache lock");
            if cache.generation == generation
                && let Some(o) = cache.owners.get(target)
            {
                return o.clone();
            }
            (generation, placement::owners_of(target, state.eligible(), state.located()))
        };
        let mut cache = self.owners.lock().expect("owner cache lock");
        if cache.generation != generation || cache.owners.len() >= OWNER_CACHE_MAX {
            cache.owners.clear();
            cache.serving = None;
            cache.generation = generation;
        }
        cache.owners.insert(target.clone(), owners.clone());
        owners
    }

    /// This node's location, gossiped with its entry.
    pub fn set_location(&self, location: Option<GeoPoint>) {
        self.with(|s| s.set_location(location.map(|p| (p.lat, p.lon)), timeshard_clock::instant()));
    }

    /// The location of member `id`, if it has one.
    pub fn location_of(&self, id: &Id) -> Option<GeoPoint> {
        let state = self.state.lock().expect("membership lock");
        state.get(id)?.location.and_then(|(lat, lon)| GeoPoint::new(lat, lon).ok())
    }

    /// This node's location.
    pub fn location(&self) -> Option<GeoPoint> {
        let state = self.state.lock().expect("membership lock");
        state.me().location.and_then(|(lat, lon)| GeoPoint::new(lat, lon).ok())
    }

    /// The members that still serve reads (not gone, leaving ones included), as a ring for
    /// finding the closest; cached until the view's generation changes.
    pub fn serving(&self) -> Arc<Ring> {
        let state = self.state.lock().expect("membership lock");
        let generation = state.generation();
        let mut cache = self.owners.lock().expect("owner cache lock");
        if cache.generation != generation {
            cache.owners.clear();
            cache.serving = None;
            cache.generation = generation;
        }
        cache.serving.get_or_insert_with(|| Arc::new(Ring::new(state.serving().to_vec()))).clone()
    }

    /// The nodes a read of block `id` may ask, in order: `owners` (as the caller ordered them),
    /// then the next closest members that still serve, up to `2 * rf + 2` in all (see
    /// [`timeshard_proto::repair::read_candidates`]).
    pub fn read_candidates(&self, owners: &[Contact], id: &Id, rf: usize) -> Vec<Contact> {
        timeshard_proto::repair::read_candidates(owners, &self.serving(), id, rf)
    }

    /// Keeps `ids` (revoked certificates) out of placement and reads, whatever their entries
    /// say.
    pub fn set_excluded(&self, ids: std::collections::HashSet<Id>) {
        self.with(|s| s.set_excluded(ids, timeshard_clock::instant()));
    }

    /// What the view says of `id` now (`None`: not in the view).
    pub fn liveness(&self, id: &Id) -> Option<Liveness> {
        self.state.lock().expect("membership lock").liveness(id, timeshard_clock::instant())
    }

    /// Whether `id` is up (this node always is).
    pub fn is_up(&self, id: &Id) -> bool {
        self.liveness(id) == Some(Liveness::Up)
    }

    /// Members up, down and gone.
    pub fn counts(&self) -> Counts {
        self.state.lock().expect("membership lock").counts(timeshard_clock::instant())
    }

    /// The generation of the owner-relevant part of the view.
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Fires with the new generation whenever the owners may have changed (a member came,
    /// became gone, left or moved).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Every member with its liveness.
    pub fn members(&self) -> Vec<(Member, Liveness)> {
        let state = self.state.lock().expect("membership lock");
        state.members(timeshard_clock::instant()).map(|(m, l)| (m.clone(), l)).collect()
    }

    /// The contact of member `id`, if the view holds it.
    pub fn contact(&self, id: &Id) -> Option<Contact> {
        self.state.lock().expect("membership lock").contact(id)
    }

    /// The view's generation and the members placement may choose then (all, and those with
    /// a location), read together.
    pub fn placement(&self) -> (u64, Vec<Contact>, Vec<Located>) {
        let state = self.state.lock().expect("membership lock");
        (state.generation(), state.eligible().to_vec(), state.located().to_vec())
    }

    /// The members placement may choose, sorted by id.
    pub fn eligible(&self) -> Vec<Contact> {
        self.state.lock().expect("membership lock").eligible().to_vec()
    }

    /// Sets this node's status (leaving, left); peers learn it with the next gossip.
    pub fn set_status(&self, status: MemberStatus) {
        self.with(|s| s.set_status(status, timeshard_clock::instant()));
    }

    /// Answers a peer's [`Request::Gossip`]: merges what it pushes, then, if it sent a digest,
    /// returns what it lacks and what this node wants. `from` is the peer and the address it
    /// spoke from, used for entries that name no reachable address.
    pub fn on_gossip(
        &self,
        from: Contact,
        digest: Vec<DigestItem>,
        mut entries: Vec<GossipEntry>,
        revocations: RevocationNews,
        known_addr: impl Fn(&Id) -> Option<SocketAddr>,
    ) -> Response {
        if digest.len() > self.cfg.max_members.max(1) * 2 {
            return Response::Error(ErrorReply::new(
                ErrorCode::BatchTooLarge,
                format!("gossip digest of {} items exceeds this node's view size", digest.len()),
            ));
        }
        for e in &mut entries {
            fix_addr(e, from, &known_addr);
        }
        let (entries, want) = self.with(|s| {
            let now = timeshard_clock::instant();
            self.merge(s, from, entries, now);
            if digest.is_empty() {
                // A push: nothing asked.
                return (Vec::new(), Vec::new());
            }
            s.answer(&digest, now)
        });
        self.take_revocations(from, revocations.list);
        let revocations = self.revocations.news_for(Some(revocations.held));
        Response::Gossip { entries: self.signed(entries), want, revocations }
    }

    /// Takes a revocation list a peer passed on, if the fleet CA signed it and it is newer.
    fn take_revocations(&self, from: Contact, list: Option<SignedRevocations>) {
        let Some(list) = list else { return };
        let generation = list.generation;
        match self.revocations.offer(list) {
            Ok(true) => info!(from = %from.id.short(), generation, "learned a newer revocation list from a peer"),
            Ok(false) => {}
            Err(e) => warn!(from = %from.id.short(), addr = %from.addr, error = %e, "refused a revocation list"),
        }
    }

    /// The fleet's revocation list as this node holds it.
    pub fn revocations(&self) -> &Arc<Revocations> {
        &self.revocations
    }

    /// Bumps this node's heartbeat (taking up a changed configuration digest) and re-derives
    /// liveness.
    pub fn beat(&self) {
        let digest = self.config_digest.load(Ordering::Relaxed);
        self.with(|s| {
            let now = timeshard_clock::instant();
            s.set_config_digest(digest, now);
            s.beat(now);
        });
    }

    /// One exchange with `peer`: digest out, missing entries in, wanted entries pushed.
    async fn exchange(&self, dht: &Arc<Dht>, peer: Contact) -> Result<(), String> {
        let digest = self.state.lock().expect("membership lock").digest();
        let news = self.revocations.news_for(None);
        let resp = dht
            .call(&peer, &Request::Gossip { digest, entries: Vec::new(), revocations: news })
            .await
            .map_err(|e| e.to_string())?;
        let Response::Gossip { mut entries, mut want, revocations } = resp else {
            return Err(format!("unexpected answer to gossip: {resp:?}"));
        };
        entries.truncate(membership::MAX_GOSSIP_ENTRIES);
        want.truncate(membership::MAX_GOSSIP_ENTRIES);
        let known = |id: &Id| dht.closest_known(id, 1).into_iter().find(|c| c.id == *id).map(|c| c.addr);
        for e in &mut entries {
            fix_addr(e, peer, &known);
        }
        let push = self.signed(self.with(|s| {
            let now = timeshard_clock::instant();
            self.merge(s, peer, entries, now);
            s.entries_for(&want, now)
        }));
        self.take_revocations(peer, revocations.list);
        // The peer's list is older: it gets ours with the push.
        let news = self.revocations.news_for(Some(revocations.held));
        if !push.is_empty() || news.list.is_some() {
            let push = Request::Gossip { digest: Vec::new(), entries: push, revocations: news };
            dht.call(&peer, &push).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Whom to gossip with now: random up members, sometimes a down or gone one, and a contact
    /// of the routing table the view does not hold.
    fn targets(&self, dht: &Dht) -> Vec<Contact> {
        let mut rng = timeshard_clock::rng();
        let (mut targets, unknown) = {
            let state = self.state.lock().expect("membership lock");
            let targets = state.gossip_targets(FANOUT, timeshard_clock::instant(), &mut rng);
            let unknown: Vec<Contact> = dht.all_known().into_iter().filter(|c| state.get(&c.id).is_none()).collect();
            (targets, unknown)
        };
        targets.extend(unknown.choose(&mut rng));
        targets
    }

    /// One gossip round: a heartbeat, then exchanges with this round's targets.
    pub async fn gossip_round(&self, dht: &Arc<Dht>) {
        self.beat();
        let targets = self.targets(dht);
        let exchanges = targets.iter().map(|&peer| async move {
            if let Err(e) = self.exchange(dht, peer).await {
                debug!(peer = %peer.id.short(), error = %e, "gossip failed");
            }
        });
        futures::future::join_all(exchanges).await;
    }

    /// Learns the view from the peers the routing table knows (after bootstrap), a few rounds,
    /// so a starting node places data like everyone else before it coordinates.
    pub async fn join(&self, dht: &Arc<Dht>) {
        let mut last = 0;
        for _ in 0..JOIN_ROUNDS {
            let peers: Vec<Contact> = {
                let mut rng = timeshard_clock::rng();
                dht.all_known().choose_multiple(&mut rng, 3).copied().collect()
            };
            if peers.is_empty() {
                return;
            }
            self.beat();
            futures::future::join_all(peers.iter().map(|&p| self.exchange(dht, p))).await;
            let len = self.state.lock().expect("membership lock").len();
            if len == last {
                break;
            }
            last = len;
        }
        info!(members = last, "learned the membership view");
    }

    /// Gossips every `gossip_interval` until `stop` fires.
    pub async fn run(self: Arc<Self>, dht: Arc<Dht>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.gossip_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // A round that outlives the interval must not stop the next heartbeat for long.
            let round = self.gossip_round(&dht);
            if tokio::time::timeout(self.cfg.suspect_after / 2, round).await.is_err() {
                debug!("gossip round took longer than half of suspect_after");
            }
        }
    }
}

/// A member that advertises an unspecified address (it listens on 0.0.0.0) is reached where
/// it was seen: the address it spoke from, or the one the routing table knows. The signed
/// entry itself is left as it is, so it still verifies when passed on.
fn fix_addr(entry: &mut GossipEntry, from: Contact, known: &impl Fn(&Id) -> Option<SocketAddr>) {
    if !entry.member.addr.ip().is_unspecified() {
        return;
    }
    entry.seen_at = if entry.member.id == from.id { Some(from.addr) } else { known(&entry.member.id) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::tests::{fleet, identity};

    fn view(dir: &std::path::Path, i: u8, digest: u64) -> View {
        let who = identity(dir, &format!("node-{i}"));
        let me = Contact { id: who.id().unwrap(), addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(i))) };
        let attest = Arc::new(Attest::new(&who, std::time::Duration::from_secs(60)).unwrap());
        View::new(me, &MembershipConfig::default(), Arc::new(AtomicU64::new(digest)), attest)
    }

    /// One exchange from `b` to `a`, as the gossip driver runs it (without the network).
    fn exchange(a: &View, b: &View) {
        let digest = b.state.lock().unwrap().digest();
        let news = RevocationNews::default();
        let Response::Gossip { entries, want, .. } = a.on_gossip(b.me(), digest, Vec::new(), news, |_| None) else {
            panic!("not a gossip answer")
        };
        b.with(|s| b.merge(s, a.me(), entries, timeshard_clock::instant()));
        let push = b.signed(b.state.lock().unwrap().entries_for(&want, timeshard_clock::instant()));
        a.on_gossip(b.me(), Vec::new(), push, RevocationNews::default(), |_| None);
    }

    #[test]
    fn owners_are_cached_per_generation_and_follow_the_view() {
        let dir = fleet(2);
        let a = view(dir.path(), 0, 0);
        let b = view(dir.path(), 1, 7);
        let target = Id::sha1(b"block");
        assert_eq!(a.owners(target, 3), vec![a.me()]);
        let changes = a.subscribe();
        exchange(&a, &b);
        assert!(changes.has_changed().unwrap(), "a learned a new owner");
        assert_eq!(a.owners(target, 3).len(), 2);
        assert_eq!(a.owners(target, 3), b.owners(target, 3));
        assert_eq!(a.counts(), Counts { up: 2, down: 0, gone: 0 });
        let bm = a.members().into_iter().find(|(m, _)| m.id == b.me().id).unwrap().0;
        assert_eq!(bm.config_digest, 7, "the configuration digest travels with the entry");
    }

    /// Issue 24: repair noticed a location change only when its task next looked at the view
    /// (after a round in progress), so reads placed by the new view counted this node's
    /// answers as settled for series it had just taken over. The hook sees every change that
    /// moves owners with the new view, before the change is published to subscribers.
    #[test]
    fn the_change_hook_sees_each_new_view_before_it_is_published() {
        let dir = fleet(2);
        let (a, b) = (view(dir.path(), 0, 0), view(dir.path(), 1, 0));
        let changes = a.subscribe();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (log, probe) = (seen.clone(), changes.clone());
        assert!(a.on_change(move |m| {
            let published = *probe.borrow();
            log.lock().unwrap().push((m.eligible().len(), m.located().len(), published == m.generation()));
        }));
        assert!(!a.on_change(|_| {}), "one hook per view");
        exchange(&a, &b);
        b.set_location(Some(GeoPoint::new(33.75, -84.39).unwrap()));
        exchange(&a, &b);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.first(), Some(&(2, 0, false)), "a new member, before subscribers hear of it");
        assert_eq!(seen.last(), Some(&(2, 1, false)), "b's new location, before subscribers hear of it");
        assert!(changes.has_changed().unwrap());
    }

    /// A rogue member (a valid node certificate of its own) forges entries about others: it
    /// marks one `Left`, moves it, claims a version out of reach, and invents a member. Each
    /// is refused and counted, and placement does not move.
    #[test]
    fn forged_entries_about_other_nodes_are_refused_and_placement_stays() {
        let dir = fleet(3);
        let (a, b, rogue) = (view(dir.path(), 0, 0), view(dir.path(), 1, 0), view(dir.path(), 2, 0));
        exchange(&a, &b);
        exchange(&a, &rogue);
        let before = a.eligible();
        assert_eq!(before.len(), 3);
        let genuine = a.state.lock().unwrap().get(&b.me().id).cloned().unwrap();
        let rogue_proof = rogue.attest.sign(&rogue.state.lock().unwrap().me().clone());
        let mut forged = Vec::new();
        let mut left = genuine.clone();
        left.status = MemberStatus::Left;
        left.heartbeat += 1;
        forged.push(left.clone());
        let mut moved = genuine.clone();
        moved.location = Some((48.8, 2.3));
        moved.heartbeat += 2;
        forged.push(moved);
        let mut saturated = genuine.clone();
        saturated.incarnation = u64::MAX;
        saturated.heartbeat = u64::MAX;
        forged.push(saturated);
        let fake = Member::new(Id::sha1(b"fake"), "127.0.0.1:9".parse().unwrap(), 1);
        forged.push(fake);
        let entries: Vec<GossipEntry> = forged
            .into_iter()
            // Signed by the rogue's own key, or carrying b's genuine proof of another version.
            .flat_map(|m| {
                [
                    GossipEntry { member: m.clone(), age_ms: 0, proof: rogue_proof.clone(), seen_at: None },
                    GossipEntry { member: m, age_ms: 0, proof: b.attest.sign(&genuine), seen_at: None },
                ]
            })
            .collect();
        let n = entries.len() as u64;
        a.on_gossip(rogue.me(), Vec::new(), entries, RevocationNews::default(), |_| None);
        assert_eq!(a.eligible(), before, "placement did not move");
        assert_eq!(a.state.lock().unwrap().get(&b.me().id), Some(&genuine));
        let refused: u64 = a.attest().refused().iter().map(|(_, n)| n).sum();
        assert_eq!(refused, n, "every forged entry is refused and counted");
        // b itself may leave: its own signed entry is taken.
        b.set_status(MemberStatus::Left);
        exchange(&a, &b);
        assert_eq!(a.liveness(&b.me().id), Some(Liveness::Gone));
    }

    #[test]
    fn unspecified_addresses_are_replaced_by_where_the_node_was_seen() {
        let id = |i: u8| Id::sha1(&[i]);
        let from = Contact { id: id(1), addr: SocketAddr::from(([127, 0, 0, 1], 7001)) };
        let entry = |m| GossipEntry { member: m, age_ms: 0, proof: None, seen_at: None };
        let mut m = entry(Member::new(from.id, "0.0.0.0:7001".parse().unwrap(), 1));
        fix_addr(&mut m, from, &|_| None);
        assert_eq!(m.seen_at, Some(from.addr));
        let there = SocketAddr::from(([127, 0, 0, 1], 7002));
        let mut other = entry(Member::new(id(2), "0.0.0.0:7002".parse().unwrap(), 1));
        fix_addr(&mut other, from, &|_| Some(there));
        assert_eq!(other.seen_at, Some(there));
        // The view reaches it there, and passes the entry on as signed.
        let mut view = Membership::new(
            Member::new(id(0), from.addr, 1),
            MembershipConfig::default().view(),
            timeshard_clock::instant(),
        );
        view.merge([other], timeshard_clock::instant());
        assert_eq!(view.contact(&id(2)).map(|c| c.addr), Some(there));
        assert!(view.get(&id(2)).unwrap().addr.ip().is_unspecified());
    }
}

//! The DHT as the node runs it: drives the sans-IO routing table and lookups from
//! `timeshard_proto` with real requests. It serves discovery (joining through the bootstrap
//! peers, rejoining, bucket refresh: [`Dht::join`], [`Dht::maintain`]) and calls to peers;
//! where blocks live comes from the membership view (its owners), not from lookups.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timeshard_clock::instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use timeshard_proto::routing::Observed;
use timeshard_proto::wire::{Request, Response};
use timeshard_proto::{Contact, Id, Lookup, RoutingTable};
use timeshard_sdk::tls::PeerIdentity;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{DhtConfig, Live};
use crate::net::{Net, NetError};

/// How long a peer that failed a request is tried after its healthy siblings.
const SUSPECT_FOR: Duration = Duration::from_secs(30);
/// How often the node checks whether buckets need refreshing or it must rejoin.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(10);

/// The node's view of the DHT.
#[derive(Debug)]
pub struct Dht {
    me: Contact,
    table: Mutex<RoutingTable>,
    net: Arc<Net>,
    cfg: DhtConfig,
    suspects: Mutex<HashMap<Id, Instant>>,
    /// WAN emulation (tests only): the one-way delay to a peer.
    wan: std::sync::OnceLock<WanDelay>,
}

/// The one-way delay the WAN emulation adds to a message to a peer, if it has one.
pub struct WanDelay(pub Box<PeerDelay>);

/// The delay to one peer, `None` when it has no location.
pub type PeerDelay = dyn Fn(&Id) -> Option<Duration> + Send + Sync;

impl std::fmt::Debug for WanDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WanDelay")
    }
}

impl Dht {
    /// A DHT for the local node `me`, talking through `net`.
    pub fn new(me: Contact, net: Arc<Net>, cfg: DhtConfig) -> Dht {
        Dht {
            table: Mutex::new(RoutingTable::new(me.id, cfg.k, cfg.max_failures)),
            me,
            net,
            cfg,
            suspects: Mutex::new(HashMap::new()),
            wan: std::sync::OnceLock::new(),
        }
    }

    /// Turns the WAN emulation on (once; only the node's own config does this): every request
    /// to a peer, and its answer, waits `delay(peer)`.
    pub fn set_wan_emulation(&self, delay: WanDelay) {
        let _ = self.wan.set(delay);
    }

    /// This node.
    pub fn me(&self) -> Contact {
        self.me
    }

    /// The network layer.
    pub fn net(&self) -> &Arc<Net> {
        &self.net
    }

    /// Number of known peers.
    pub fn peer_count(&self) -> usize {
        self.table.lock().expect("table lock").len()
    }

    /// The `n` known contacts closest to `target` (not including this node).
    pub fn closest_known(&self, target: &Id, n: usize) -> Vec<Contact> {
        self.table.lock().expect("table lock").closest(target, n)
    }

    /// Every known peer.
    pub fn all_known(&self) -> Vec<Contact> {
        self.table.lock().expect("table lock").contacts().collect()
    }

    /// Records that `contact` is alive; pings the oldest entry of a full bucket if asked to.
    pub fn observe(self: &Arc<Self>, contact: Contact) {
        let outcome = self.table.lock().expect("table lock").observe(contact, instant());
        self.suspects.lock().expect("suspects lock").remove(&contact.id);
        if let Observed::Pending { ping: Some(oldest) } = outcome {
            let dht = self.clone();
            tokio::spawn(async move {
                // The outcome is recorded by `call` itself.
                let _ = dht.call(&oldest, &Request::Ping).await;
            });
        }
    }

    /// Records a request from a peer holding a node certificate.
    pub fn observe_incoming(self: &Arc<Self>, peer: PeerIdentity, addr: SocketAddr) {
        if peer.is_node {
            self.observe(Contact { id: peer.id, addr });
        }
    }

    /// Drops `ids` from the routing table (revoked peers); returns how many it held.
    pub fn forget(&self, ids: &[Id]) -> usize {
        let mut table = self.table.lock().expect("table lock");
        ids.iter().filter(|id| table.remove(id).is_some()).count()
    }

    fn failed(&self, id: &Id) {
        self.suspects.lock().expect("suspects lock").insert(*id, instant());
        if let Some(gone) = self.table.lock().expect("table lock").failed(id, instant()) {
            info!(peer = %gone.id.short(), addr = %gone.addr, "evicted unresponsive peer");
        }
    }

    /// Whether `id` failed a request recently.
    pub fn is_suspect(&self, id: &Id) -> bool {
        self.suspects
            .lock()
            .expect("suspects lock")
            .get(id)
            .is_some_and(|t| instant().saturating_duration_since(*t) < SUSPECT_FOR)
    }

    /// Sends `req` to `contact`, keeping the routing table up to date with the outcome.
    pub async fn call(self: &Arc<Self>, contact: &Contact, req: &Request) -> Result<Response, NetError> {
        let delay = self.wan.get().and_then(|d| (d.0)(&contact.id));
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let result = self.net.call(contact.addr, Some(contact.id), req).await;
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        match result {
            Ok((resp, _)) => {
                self.observe(*contact);
                Ok(resp)
            }
            Err(e) => {
                match &e {
                    NetError::IdMismatch { .. } | NetError::NotANode { .. } | NetError::Revoked { .. } => {
                        self.table.lock().expect("table lock").remove(&contact.id);
                    }
                    // The peer is alive and said no; that is not a liveness failure.
                    NetError::Call { source: timeshard_sdk::transport::CallError::Remote(_), .. } => {
                        self.observe(*contact);
                    }
                    _ => self.failed(&contact.id),
                }
                debug!(peer = %contact.id.short(), kind = req.kind(), error = %e, "peer request failed");
                Err(e)
            }
        }
    }

    /// Iterative parallel lookup for the `want` nodes closest to `target`, this node included.
    pub async fn lookup(self: &Arc<Self>, target: Id, want: usize) -> Vec<Contact> {
        let seeds = {
            let mut table = self.table.lock().expect("table lock");
            table.touch(&target, instant());
            table.closest(&target, self.cfg.k)
        };
        let mut lookup = Lookup::new(target, Some(self.me), seeds, want.max(1), self.cfg.alpha);
        let req = Request::FindNode { target };
        let req = &req;
        let mut in_flight = FuturesUnordered::new();
        loop {
            while let Some(c) = lookup.next_query() {
                in_flight.push(async move { (c, self.call(&c, req).await) });
            }
            match in_flight.next().await {
                None => break,
                Some((c, Ok(Response::Nodes { closest }))) => {
                    lookup.on_response(&c.id, closest.into_iter().take(self.cfg.k));
                }
                Some((c, _)) => lookup.on_failure(&c.id),
            }
        }
        lookup.result()
    }

    /// Joins the network through `seeds`: learns their ids, then looks itself up so that the
    /// nodes closest to it learn of it, then refreshes every bucket. Returns the peers known.
    pub async fn bootstrap(self: &Arc<Self>, seeds: &[SocketAddr]) -> usize {
        for &addr in seeds {
            match self.net.call(addr, None, &Request::Ping).await {
                Ok((_, peer)) if peer.id != self.me.id => self.observe(Contact { id: peer.id, addr }),
                Ok(_) => {}
                Err(e) => warn!(%addr, error = %e, "bootstrap peer did not answer"),
            }
        }
        if self.peer_count() == 0 {
            return 0;
        }
        self.lookup(self.me.id, self.cfg.k).await;
        self.refresh(usize::MAX).await;
        self.peer_count()
    }

    /// Looks up a random id in each bucket no lookup touched for the refresh interval (at most
    /// `max` of them).
    pub async fn refresh(self: &Arc<Self>, max: usize) {
        let due = {
            let table = self.table.lock().expect("table lock");
            table.buckets_to_refresh(instant(), self.cfg.refresh_interval)
        };
        let targets: Vec<Id> = {
            let mut rng = timeshard_clock::rng();
            due.into_iter().rev().take(max).map(|b| self.me.id.random_in_bucket(b, &mut rng)).collect()
        };
        futures::stream::iter(targets)
            .for_each_concurrent(self.cfg.alpha, |t| async move {
                self.lookup(t, self.cfg.k).await;
            })
            .await;
    }

    /// Joins the network through the `bootstrap` peers (`host:port`, resolved now); returns
    /// the peers known.
    pub async fn join(self: &Arc<Self>, bootstrap: &[String]) -> usize {
        let seeds = resolve(bootstrap).await;
        if seeds.is_empty() {
            return self.peer_count();
        }
        let peers = self.bootstrap(&seeds).await;
        if peers > 0 {
            info!(peers, "joined the network");
        }
        peers
    }

    /// Until `stop` fires: rejoins through the bootstrap peers in force (`config`: they may
    /// change while the node runs) when the node lost every peer, and refreshes stale buckets.
    pub async fn maintain(self: Arc<Self>, config: Live, stop: CancellationToken) {
        let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.peer_count() == 0 {
                self.join(&config.get().bootstrap).await;
            } else {
                self.refresh(8).await;
            }
        }
    }
}

async fn resolve(seeds: &[String]) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for s in seeds {
        match tokio::net::lookup_host(s.as_str()).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => warn!(seed = %s, error = %e, "cannot resolve bootstrap address"),
        }
    }
    out
}

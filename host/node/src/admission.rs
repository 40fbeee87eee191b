//! Admission per caller on the QUIC side: established connections per identity (certificate)
//! and in total ([`Connections`]), and request slots apart for peers and for clients
//! ([`RequestSlots`]), so that however many clients connect and however much they ask, gossip,
//! repair and replication from the other nodes still get connections and slots.
//!
//! No I/O here: the server asks when a handshake has shown who connected, or when a stream
//! opens, and holds what it is given ([`ConnectionSlot`], a semaphore permit) for as long as the
//! connection or request lasts. Limits change with `[limits]` while the node runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use timeshard_proto::Id;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// QUIC application close code for a connection refused because its identity, or the node,
/// holds as many connections as it may.
pub const CLOSE_TOO_MANY: u32 = 5;

/// How many established connections the node accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// In all (`[limits] max_connections`).
    pub total: usize,
    /// From one certificate (`[limits] max_connections_per_identity`).
    pub per_identity: usize,
}

/// Why a connection was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionRefused {
    #[error(
        "too many connections from one certificate: it holds {held}, the limit is {limit} \
         ([limits] max_connections_per_identity); reuse one connection"
    )]
    PerIdentity { held: usize, limit: usize },
    #[error("the node holds {held} connections, its limit ([limits] max_connections); retry later")]
    Total { held: usize, limit: usize },
}

/// The connections established with the node, by the identity that opened them.
#[derive(Debug)]
pub struct Connections {
    state: Mutex<ConnectionState>,
}

#[derive(Debug)]
struct ConnectionState {
    limits: ConnectionLimits,
    total: usize,
    by_identity: HashMap<Id, usize>,
}

/// One admitted connection; given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    connections: Arc<Connections>,
    identity: Id,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut state = self.connections.lock();
        state.total = state.total.saturating_sub(1);
        if let Some(held) = state.by_identity.get_mut(&self.identity) {
            *held -= 1;
            if *held == 0 {
                state.by_identity.remove(&self.identity);
            }
        }
    }
}

impl Connections {
    pub fn new(limits: ConnectionLimits) -> Arc<Connections> {
        Arc::new(Connections { state: Mutex::new(ConnectionState { limits, total: 0, by_identity: HashMap::new() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one more connection from `identity`, or says which limit it would break.
    pub fn admit(self: &Arc<Self>, identity: Id) -> Result<ConnectionSlot, ConnectionRefused> {
        let mut state = self.lock();
        let limits = state.limits;
        let held = state.by_identity.get(&identity).copied().unwrap_or(0);
        if held >= limits.per_identity {
            return Err(ConnectionRefused::PerIdentity { held, limit: limits.per_identity });
        }
        if state.total >= limits.total {
            return Err(ConnectionRefused::Total { held: state.total, limit: limits.total });
        }
        state.total += 1;
        *state.by_identity.entry(identity).or_default() += 1;
        Ok(ConnectionSlot { connections: self.clone(), identity })
    }

    /// Applies new limits to connections admitted from now on (those open stay).
    pub fn set_limits(&self, limits: ConnectionLimits) {
        self.lock().limits = limits;
    }

    /// Connections admitted and open: in all, and from `identity`.
    pub fn held(&self, identity: &Id) -> (usize, usize) {
        let state = self.lock();
        (state.total, state.by_identity.get(identity).copied().unwrap_or(0))
    }
}

/// Who a request comes from, which decides the slots it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A node of the fleet (a node certificate): gossip, lookups, replication, repair, and the
    /// reads and writes coordinators send to the owners.
    Peer,
    /// Anyone else: clients and devices.
    Client,
}

impl Caller {
    pub fn of(is_node: bool) -> Caller {
        if is_node { Caller::Peer } else { Caller::Client }
    }
}

/// Requests served at once, apart for peers and clients.
#[derive(Debug)]
pub struct RequestSlots {
    clients: Arc<Semaphore>,
    peers: Arc<Semaphore>,
    /// Permits each semaphore is meant to hold (it lags while a shrink waits for requests):
    /// (clients, peers).
    capacity: Mutex<(usize, usize)>,
}

impl RequestSlots {
    pub fn new(clients: usize, peers: usize) -> RequestSlots {
        RequestSlots {
            clients: Arc::new(Semaphore::new(clients)),
            peers: Arc::new(Semaphore::new(peers)),
            capacity: Mutex::new((clients, peers)),
        }
    }

    /// A slot for a request from `caller`, held until the request is answered; `None` when
    /// every slot of its kind is taken (the other kind's free slots are not lent).
    pub fn try_admit(&self, caller: Caller) -> Option<OwnedSemaphorePermit> {
        self.of(caller).clone().try_acquire_owned().ok()
    }

    /// The slots of `caller`'s kind.
    pub fn of(&self, caller: Caller) -> &Arc<Semaphore> {
        match caller {
            Caller::Peer => &self.peers,
            Caller::Client => &self.clients,
        }
    }

    /// Makes the slots `clients` and `peers`: adds permits, or takes them out as requests in
    /// flight give theirs back (a task that ends with `shutdown`).
    pub fn resize(&self, clients: usize, peers: usize, shutdown: &tokio_util::sync::CancellationToken) {
        let mut capacity = self.capacity.lock().unwrap_or_else(|e| e.into_inner());
        resize(&self.clients, capacity.0, clients, shutdown);
        resize(&self.peers, capacity.1, peers, shutdown);
        *capacity = (clients, peers);
    }
}

fn resize(slots: &Arc<Semaphore>, had: usize, want: usize, shutdown: &tokio_util::sync::CancellationToken) {
    if want > had {
        slots.add_permits(want - had);
    } else if want < had {
        let owed = (had - want) - slots.forget_permits(had - want);
        if owed > 0 {
            // Requests in flight hold the rest; take them out as they come back.
            let slots = slots.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => {}
                    permits = slots.acquire_many_owned(owed as u32) => {
                        if let Ok(p) = permits {
                            p.forget();
                        }
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Id {
        Id::of_public_key(&[n])
    }

    #[test]
    fn connections_are_limited_per_identity_and_in_all() {
        let conns = Connections::new(ConnectionLimits { total: 5, per_identity: 2 });
        let a1 = conns.admit(id(1)).unwrap();
        let _a2 = conns.admit(id(1)).unwrap();
        let err = conns.admit(id(1)).unwrap_err();
        assert_eq!(err, ConnectionRefused::PerIdentity { held: 2, limit: 2 });
        assert!(err.to_string().contains("max_connections_per_identity"), "{err}");
        // Another identity is not held back by the first one's.
        let _b = (conns.admit(id(2)).unwrap(), conns.admit(id(2)).unwrap());
        let _c = conns.admit(id(3)).unwrap();
        assert_eq!(conns.admit(id(4)).unwrap_err(), ConnectionRefused::Total { held: 5, limit: 5 });
        assert_eq!(conns.held(&id(1)), (5, 2));
        // A closed connection gives its place back, to its identity and to the total.
        drop(a1);
        assert_eq!(conns.held(&id(1)), (4, 1));
        let _a3 = conns.admit(id(1)).unwrap();
        // Lower limits hold back new connections only.
        conns.set_limits(ConnectionLimits { total: 5, per_identity: 1 });
        assert_eq!(conns.held(&id(2)), (5, 2));
        drop(_b);
        assert!(matches!(conns.admit(id(1)), Err(ConnectionRefused::PerIdentity { held: 2, limit: 1 })));
        let _d = conns.admit(id(4)).unwrap();
        assert!(conns.admit(id(4)).is_err());
    }

    #[test]
    fn identities_that_left_are_forgotten() {
        let conns = Connections::new(ConnectionLimits { total: 10_000, per_identity: 1 });
        for n in 0..=255 {
            drop(conns.admit(id(n)).unwrap());
        }
        assert!(conns.lock().by_identity.is_empty());
        assert_eq!(conns.held(&id(0)), (0, 0));
    }

    #[test]
    fn clients_cannot_take_the_slots_of_peers() {
        let slots = RequestSlots::new(3, 2);
        let clients: Vec<_> = (0..3).map(|_| slots.try_admit(Caller::Client).unwrap()).collect();
        assert!(slots.try_admit(Caller::Client).is_none(), "clients are at their limit");
        // Peers still get theirs, and only theirs.
        let peers: Vec<_> = (0..2).map(|_| slots.try_admit(Caller::Peer).unwrap()).collect();
        assert!(slots.try_admit(Caller::Peer).is_none());
        drop(peers);
        assert!(slots.try_admit(Caller::Client).is_none(), "free peer slots are not lent to clients");
        drop(clients);
        assert!(slots.try_admit(Caller::Client).is_some());
        assert_eq!(Caller::of(true), Caller::Peer);
        assert_eq!(Caller::of(false), Caller::Client);
    }

    #[tokio::test]
    async fn slots_resize_while_requests_hold_them() {
        let slots = RequestSlots::new(2, 2);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let held = slots.try_admit(Caller::Client).unwrap();
        slots.resize(0, 4, &shutdown);
        assert_eq!(slots.of(Caller::Peer).available_permits(), 4);
        // Client slots go: the one still free at once, the held one when it returns.
        assert_eq!(slots.of(Caller::Client).available_permits(), 0);
        drop(held);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(slots.of(Caller::Client).available_permits(), 0, "the returned slot was taken out");
        slots.resize(3, 4, &shutdown);
        assert_eq!(slots.of(Caller::Client).available_permits(), 3);
        shutdown.cancel();
    }
}

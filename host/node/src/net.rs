//! The node's QUIC endpoint: one UDP socket that serves peers and clients and dials peers.
//!
//! Mutual TLS on every connection: the node presents its certificate and requires one from the
//! fleet CA of whoever connects. Connections to peers are pooled by address and reused (one
//! connection per peer, one stream per request); a connection a peer opened to us is reused for
//! our requests to it too.
//!
//! The TLS identity can be replaced while the node runs (a renewed certificate): new
//! handshakes use it, established connections keep theirs. The endpoint also holds the set of
//! revoked node ids: a connection with a revoked peer is refused once its handshake shows who
//! it is, in both directions, and connections already open are closed when the set changes.
//!
//! What a connection may make the node buffer comes from the memory budget
//! ([`crate::budget::Shares::receive_windows`]): every connection starts with a small receive
//! window, and those admitted or dialed share a larger pool of window bytes per role.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use quinn::{Connection, Endpoint, TransportConfig, VarInt};
use timeshard_proto::Id;
use timeshard_proto::wire::{ALPN, Request, Response};
use timeshard_sdk::tls::{self, Identity, NODE_NAME, PeerIdentity};
use timeshard_sdk::transport::{self, CallError, Traffic};
use tokio::time::Instant;

use crate::attest::Attest;
use crate::budget::{ReceiveWindows, Shares, WindowSplit};
use crate::config::NodeConfig;

/// Failures talking to a peer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("{addr} presented the key of node {got}, not of {expected}; dropping it")]
    IdMismatch { addr: SocketAddr, expected: Id, got: Id },
    #[error("{addr} does not hold a node certificate")]
    NotANode { addr: SocketAddr },
    #[error("{addr} is node {id}, whose certificate the control plane revoked; refusing it")]
    Revoked { addr: SocketAddr, id: Id },
    #[error("request to {addr} failed: {source}")]
    Call {
        addr: SocketAddr,
        #[source]
        source: CallError,
    },
}

/// The receive windows `cfg`'s memory budget allows its connections: those it accepts and
/// those it dials, up to `[limits] max_connections` each.
pub fn receive_windows(cfg: &NodeConfig) -> ReceiveWindows {
    Shares::of(cfg.memory.budget.0).receive_windows(2 * cfg.limits.max_connections, cfg.limits.max_message_bytes)
}

/// Builds the QUIC transport settings shared by both directions.
fn transport_config(cfg: &NodeConfig) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(cfg.limits.max_streams_per_connection));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.max_idle_timeout(Some(cfg.dht.idle_timeout.try_into().expect("idle timeout fits a QUIC varint")));
    t.keep_alive_interval(Some(cfg.dht.idle_timeout / 3));
    // What a peer may make this node buffer comes from the memory budget: a small window for
    // every connection, a share of a larger pool for those admitted or dialed ([`WindowGrants`]).
    let windows = receive_windows(cfg);
    t.receive_window(VarInt::from_u64(windows.initial).expect("bounded window"));
    t.stream_receive_window(VarInt::from_u64(windows.stream).expect("bounded window"));
    // What this node sends: an answer is encoded whole before it is written, so the window
    // only decides whether its bytes wait in quinn's buffer or in the frame; room for a few
    // maximum-size messages in flight.
    t.send_window(u64::from(cfg.limits.max_message_bytes).saturating_mul(4).min(u64::from(u32::MAX)));
    Arc::new(t)
}

/// The larger receive windows, shared out of pools the memory budget bounds
/// ([`Shares::receive_windows`]), apart for peers and for clients so that clients holding
/// most of theirs cannot slow replication and repair. Every connection of a role the node
/// admitted or dialed gets an equal share of its pool (at most the largest window), so a node
/// with many peers gives each a smaller window instead of leaving the last ones at the first.
#[derive(Debug)]
struct WindowGrants {
    windows: ReceiveWindows,
    peers: Mutex<Holders>,
    clients: Mutex<Holders>,
}

/// The connections of one role that share its pool, by quinn's stable id.
#[derive(Debug, Default)]
struct Holders {
    connections: HashMap<usize, Connection>,
    split: WindowSplit,
}

impl Holders {
    fn window_of(&self, windows: &ReceiveWindows) -> VarInt {
        VarInt::from_u64(windows.shared(self.split.step())).expect("bounded window")
    }

    /// Resizes every holder's window when the split changed (quinn takes a smaller window
    /// back as the sender's data is read).
    fn resize(&mut self, windows: &ReceiveWindows) -> bool {
        if self.split.resize(self.connections.len()).is_none() {
            return false;
        }
        let window = self.window_of(windows);
        for c in self.connections.values() {
            c.set_receive_window(window);
        }
        true
    }
}

impl WindowGrants {
    fn new(windows: ReceiveWindows) -> WindowGrants {
        WindowGrants { windows, peers: Mutex::default(), clients: Mutex::default() }
    }

    /// The connections of one role (`peer`: those with a node's certificate).
    fn holders(&self, peer: bool) -> std::sync::MutexGuard<'_, Holders> {
        let role = if peer { &self.peers } else { &self.clients };
        role.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `conn` its share of its role's pool (resizing the others' when the split
    /// changes); the share goes back to the others when the connection closes.
    fn grant(self: &Arc<Self>, conn: &Connection, peer: bool) {
        let id = conn.stable_id();
        {
            let mut holders = self.holders(peer);
            if holders.connections.insert(id, conn.clone()).is_some() {
                return;
            }
            if !holders.resize(&self.windows) {
                conn.set_receive_window(holders.window_of(&self.windows));
            }
        }
        let (grants, conn) = (Arc::clone(self), conn.clone());
        tokio::spawn(async move {
            conn.closed().await;
            let mut holders = grants.holders(peer);
            holders.connections.remove(&id);
            holders.resize(&grants.windows);
        });
    }
}

/// The endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("invalid TLS setup (check the CA, certificate and key files): {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}; is another process using the port?")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl From<tls::TlsError> for BindError {
    fn from(e: tls::TlsError) -> BindError {
        BindError::Tls(e.to_string())
    }
}

/// The server configuration: our certificate, and clients must hold one from the CA.
pub fn server_config(cfg: &NodeConfig, identity: &Identity) -> Result<quinn::ServerConfig, BindError> {
    let tls_err = |e: &dyn std::fmt::Display| BindError::Tls(e.to_string());
    let provider = tls::provider();
    let verifier = tls::client_verifier(identity, provider.clone())?;
    let mut crypto = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| tls_err(&e))?;
    crypto.alpn_protocols = vec![ALPN.to_vec()];
    // No 0-RTT: a replayed early write must not be possible.
    crypto.max_early_data_size = 0;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(crypto).map_err(|e| tls_err(&e))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
    server.transport_config(transport_config(cfg));
    server.max_incoming(cfg.limits.max_connections);
    Ok(server)
}

/// The client configuration: our certificate, and servers must hold one from the CA.
fn client_config(cfg: &NodeConfig, identity: &Identity) -> Result<quinn::ClientConfig, BindError> {
    let mut client = tls::client_config(identity)?;
    client.transport_config(transport_config(cfg));
    Ok(client)
}

/// The pooled connection to one address, or why the last dial failed (and when).
#[derive(Debug, Default)]
struct SlotState {
    conn: Option<Connection>,
    failed: Option<(Instant, String)>,
}

impl SlotState {
    fn live(&self) -> Option<&Connection> {
        self.conn.as_ref().filter(|c| c.close_reason().is_none())
    }
}

type Slot = Arc<tokio::sync::Mutex<SlotState>>;

/// Called with every connection this node dials, so the server answers requests the peer sends
/// back over it (a connection serves both directions).
pub type DialedHandler = Box<dyn Fn(Connection) + Send + Sync>;

/// QUIC application close code for a connection refused because the peer is revoked.
pub const CLOSE_REVOKED: u32 = 3;

/// The node ids whose certificates are revoked.
pub type Revoked = Arc<HashSet<Id>>;

/// The endpoint and the pool of peer connections.
#[derive(Debug)]
pub struct Net {
    endpoint: Endpoint,
    /// What new handshakes present and trust; replaced on renewal.
    identity: RwLock<Identity>,
    /// Signs this node's membership entry with the same key, and checks its peers'.
    attest: Arc<Attest>,
    client_config: RwLock<quinn::ClientConfig>,
    pool: Mutex<HashMap<SocketAddr, Slot>>,
    max_message_bytes: u32,
    request_timeout: Duration,
    connect_timeout: Duration,
    max_pool: AtomicUsize,
    /// Larger receive windows for connections admitted or dialed.
    grants: RwLock<Arc<WindowGrants>>,
    on_dialed: std::sync::OnceLock<DialedHook>,
    traffic: Arc<Traffic>,
    revoked: tokio::sync::watch::Sender<Revoked>,
    /// Nodes a test cut this node off from (`[testing] fault_file`).
    faults: std::sync::OnceLock<Arc<crate::faults::Faults>>,
}

struct DialedHook(DialedHandler);

impl std::fmt::Debug for DialedHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DialedHook")
    }
}

impl Net {
    /// Binds the endpoint on `cfg.listen`.
    pub fn bind(cfg: &NodeConfig, identity: &Identity) -> Result<Net, BindError> {
        let server = server_config(cfg, identity)?;
        let endpoint =
            Endpoint::server(server, cfg.listen).map_err(|source| BindError::Listen { addr: cfg.listen, source })?;
        Net::on_endpoint(cfg, identity, endpoint)
    }

    /// The node's network on an endpoint made elsewhere (on a simulated socket: see
    /// [`crate::seams`]), which serves with [`server_config`].
    pub fn on_endpoint(cfg: &NodeConfig, identity: &Identity, endpoint: Endpoint) -> Result<Net, BindError> {
        let attest = Attest::new(identity, cfg.membership.max_clock_skew).map_err(|e| BindError::Tls(e.to_string()))?;
        Ok(Net {
            endpoint,
            identity: RwLock::new(identity.clone()),
            attest: Arc::new(attest),
            client_config: RwLock::new(client_config(cfg, identity)?),
            pool: Mutex::new(HashMap::new()),
            max_message_bytes: cfg.limits.max_message_bytes,
            request_timeout: cfg.dht.request_timeout,
            connect_timeout: cfg.dht.connect_timeout,
            max_pool: AtomicUsize::new(cfg.limits.max_connections),
            grants: RwLock::new(Arc::new(WindowGrants::new(receive_windows(cfg)))),
            on_dialed: std::sync::OnceLock::new(),
            traffic: Arc::default(),
            revoked: tokio::sync::watch::Sender::new(Arc::default()),
            faults: std::sync::OnceLock::new(),
        })
    }

    /// Presents `identity` (a renewed certificate) in every handshake from now on, as server
    /// and as client; connections already open keep the one they were made with. Nothing
    /// changes when the identity is unusable.
    pub fn set_identity(&self, cfg: &NodeConfig, identity: &Identity) -> Result<(), BindError> {
        let server = server_config(cfg, identity)?;
        let client = client_config(cfg, identity)?;
        self.attest.set_identity(identity).map_err(|e| BindError::Tls(e.to_string()))?;
        self.endpoint.set_server_config(Some(server));
        *self.client_config.write().unwrap_or_else(|e| e.into_inner()) = client;
        *self.identity.write().unwrap_or_else(|e| e.into_inner()) = identity.clone();
        Ok(())
    }

    /// What signs this node's membership entry and checks its peers' (with this identity).
    pub fn attest(&self) -> Arc<Attest> {
        self.attest.clone()
    }

    /// The server configuration `cfg`'s limits give with the current identity (to check it
    /// before [`Net::set_limits`]).
    pub fn server_config_for(&self, cfg: &NodeConfig) -> Result<quinn::ServerConfig, BindError> {
        server_config(cfg, &self.identity.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies the connection limit of `cfg` to new connections, with `server` from
    /// [`Net::server_config_for`].
    pub fn set_limits(&self, cfg: &NodeConfig, server: quinn::ServerConfig) {
        self.endpoint.set_server_config(Some(server));
        self.max_pool.store(cfg.limits.max_connections, Ordering::Relaxed);
        let windows = receive_windows(cfg);
        let mut grants = self.grants.write().unwrap_or_else(|e| e.into_inner());
        // New pools only when the windows change: connections holding grants of the old ones
        // keep them until they close (the bound is over by those meanwhile).
        if grants.windows != windows {
            *grants = Arc::new(WindowGrants::new(windows));
        }
    }

    /// Gives `conn` its share of its role's window pool (`peer`: a node's certificate): call
    /// once a connection is admitted or dialed.
    pub fn grant_window(&self, conn: &Connection, peer: bool) {
        let grants = self.grants.read().unwrap_or_else(|e| e.into_inner()).clone();
        grants.grant(conn, peer);
    }

    /// Whether node `id`'s certificate is revoked.
    pub fn is_revoked(&self, id: &Id) -> bool {
        self.revoked.borrow().contains(id)
    }

    /// Follows the revocation set: a receiver sees each change.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<Revoked> {
        self.revoked.subscribe()
    }

    /// Replaces the revocation set, closes pooled connections to peers now in it (the
    /// server closes the connections it serves), and returns the ids newly revoked.
    pub fn set_revoked(&self, ids: HashSet<Id>) -> Vec<Id> {
        let newly: Vec<Id> = {
            let old = self.revoked.borrow();
            ids.iter().filter(|id| !old.contains(id)).copied().collect()
        };
        self.revoked.send_if_modified(|set| {
            if **set == ids {
                return false;
            }
            *set = Arc::new(ids);
            true
        });
        let slots: Vec<Slot> = self.pool.lock().expect("pool lock").values().cloned().collect();
        for slot in slots {
            let Ok(guard) = slot.try_lock() else { continue };
            if let Some(conn) = guard.live()
                && PeerIdentity::of_connection(conn).is_some_and(|p| self.is_revoked(&p.id))
            {
                conn.close(VarInt::from_u32(CLOSE_REVOKED), b"certificate revoked");
            }
        }
        newly
    }

    /// Sets what happens to connections this node dials (once; later calls are ignored).
    pub fn on_dialed(&self, handler: DialedHandler) {
        let _ = self.on_dialed.set(DialedHook(handler));
    }

    /// Cuts this node off from the nodes `faults` names (once; later calls are ignored).
    pub fn set_faults(&self, faults: Arc<crate::faults::Faults>) {
        let _ = self.faults.set(faults);
    }

    /// Whether a test cut this node off from the node `id` at `addr`.
    pub fn is_cut_off(&self, id: Option<&Id>, addr: SocketAddr) -> bool {
        self.faults.get().is_some_and(|f| f.blocks(id, addr))
    }

    /// The endpoint (for accepting).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    fn slot(&self, addr: SocketAddr) -> Slot {
        let mut pool = self.pool.lock().expect("pool lock");
        if pool.len() >= self.max_pool.load(Ordering::Relaxed) && !pool.contains_key(&addr) {
            // Forget slots whose connection is gone (or never came), which bounds the map.
            pool.retain(|_, s| s.try_lock().map(|s| s.live().is_some()).unwrap_or(true));
        }
        pool.entry(addr).or_default().clone()
    }

    /// A live connection to `addr`, reusing the pooled one. Callers that queued behind a dial
    /// that failed get that failure at once for a while, instead of each waiting out its own
    /// handshake timeout against a dead peer.
    pub async fn connection(&self, addr: SocketAddr) -> Result<Connection, NetError> {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if let Some(c) = guard.live() {
            return Ok(c.clone());
        }
        let connect_err = |reason: String| NetError::Connect { addr, reason };
        if let Some((at, reason)) = &guard.failed
            && at.elapsed() < self.connect_timeout
        {
            return Err(connect_err(format!("{reason} (recently)")));
        }
        let client = self.client_config.read().unwrap_or_else(|e| e.into_inner()).clone();
        let dialed = match self.endpoint.connect_with(client, addr, NODE_NAME) {
            Ok(connecting) => match tokio::time::timeout(self.connect_timeout, connecting).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no handshake within {:?}", self.connect_timeout)),
            },
            Err(e) => Err(e.to_string()),
        };
        let conn = match dialed {
            Ok(conn) => conn,
            Err(reason) => {
                guard.failed = Some((Instant::now(), reason.clone()));
                return Err(connect_err(reason));
            }
        };
        if let Some(peer) = PeerIdentity::of_connection(&conn)
            && self.is_revoked(&peer.id)
        {
            conn.close(VarInt::from_u32(CLOSE_REVOKED), b"certificate revoked");
            return Err(NetError::Revoked { addr, id: peer.id });
        }
        self.grant_window(&conn, PeerIdentity::of_connection(&conn).is_some_and(|p| p.is_node));
        *guard = SlotState { conn: Some(conn.clone()), failed: None };
        if let Some(DialedHook(handler)) = self.on_dialed.get() {
            handler(conn.clone());
        }
        Ok(conn)
    }

    /// Pools a connection a peer node opened to us, unless a live one exists already.
    /// The newest connection wins: if the peer restarted, the pooled one is stale (it only
    /// times out later), and if both sides dialed at once, either works.
    pub fn adopt(&self, conn: &Connection) {
        if PeerIdentity::of_connection(conn).is_some_and(|p| self.is_revoked(&p.id)) {
            return;
        }
        let slot = self.slot(conn.remote_address());
        if let Ok(mut guard) = slot.try_lock() {
            *guard = SlotState { conn: Some(conn.clone()), failed: None };
        }
    }

    /// Sends `req` to the node at `addr`. If `expected` is given, the peer's certificate must
    /// carry that id. Returns the answer and who answered. If the pooled connection turns out
    /// to be dead (the peer restarted), the request is sent once more on a new connection;
    /// every request is idempotent, so that is safe.
    pub async fn call(
        &self,
        addr: SocketAddr,
        expected: Option<Id>,
        req: &Request,
    ) -> Result<(Response, PeerIdentity), NetError> {
        if self.is_cut_off(expected.as_ref(), addr) {
            return Err(NetError::Connect { addr, reason: "unreachable: cut off by the fault file".into() });
        }
        match self.call_once(addr, expected, req).await {
            Err(NetError::Call { source: CallError::Connection(_), .. }) => self.call_once(addr, expected, req).await,
            other => other,
        }
    }

    /// A live connection to the node at `addr`, checked: a node, not revoked, not cut off,
    /// and `expected` if given.
    async fn checked_connection(
        &self,
        addr: SocketAddr,
        expected: Option<Id>,
    ) -> Result<(Connection, PeerIdentity), NetError> {
        let conn = self.connection(addr).await?;
        let peer = PeerIdentity::of_connection(&conn).ok_or(NetError::NotANode { addr })?;
        if self.is_revoked(&peer.id) {
            conn.close(VarInt::from_u32(CLOSE_REVOKED), b"certificate revoked");
            return Err(NetError::Revoked { addr, id: peer.id });
        }
        if !peer.is_node {
            return Err(NetError::NotANode { addr });
        }
        if self.is_cut_off(Some(&peer.id), addr) {
            return Err(NetError::Connect { addr, reason: "unreachable: cut off by the fault file".into() });
        }
        if let Some(expected) = expected
            && expected != peer.id
        {
            return Err(NetError::IdMismatch { addr, expected, got: peer.id });
        }
        Ok((conn, peer))
    }

    async fn call_once(
        &self,
        addr: SocketAddr,
        expected: Option<Id>,
        req: &Request,
    ) -> Result<(Response, PeerIdentity), NetError> {
        let (conn, peer) = self.checked_connection(addr, expected).await?;
        let resp =
            transport::call_counted(&conn, req, self.max_message_bytes, self.request_timeout, Some(&self.traffic))
                .await
                .map_err(|source| NetError::Call { addr, source })?;
        Ok((resp, peer))
    }

    /// Sends `req` to the node at `addr` (which must be `expected`) and returns its streamed
    /// answer, each frame awaited at most the request timeout.
    pub async fn open_stream(
        &self,
        addr: SocketAddr,
        expected: Id,
        req: &Request,
    ) -> Result<transport::FrameStream, NetError> {
        if self.is_cut_off(Some(&expected), addr) {
            return Err(NetError::Connect { addr, reason: "unreachable: cut off by the fault file".into() });
        }
        let (conn, _) = self.checked_connection(addr, Some(expected)).await?;
        let traffic = Some(self.traffic.clone());
        transport::open_stream(&conn, req, self.max_message_bytes, self.request_timeout, traffic)
            .await
            .map_err(|source| NetError::Call { addr, source })
    }

    /// Application bytes this node sent and received, as a server and as a client of its peers.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.endpoint.close(VarInt::from_u32(0), b"node shutting down");
    }

    /// Waits until every connection is closed.
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await;
    }
}

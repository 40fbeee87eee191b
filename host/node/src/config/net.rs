//! How the node talks: its certificate files, the DHT's parameters and timeouts, and the hard
//! limits on what peers and clients may send and on concurrent work.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::wire::Limits;

/// Certificate files; relative paths are relative to the config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The fleet CA certificate: peers and clients must present certificates it signed.
    pub ca: PathBuf,
    /// This node's certificate (must name `node.timeshard`).
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig { ca: "pki/ca.pem".into(), cert: "pki/node.pem".into(), key: "pki/node.key".into() }
    }
}

/// The DHT: Kademlia parameters and timeouts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DhtConfig {
    /// Contacts per k-bucket and per lookup answer.
    pub k: usize,
    /// Requests a lookup keeps in flight.
    pub alpha: usize,
    /// Consecutive failed requests after which a peer is evicted (doubled if no replacement waits).
    pub max_failures: u32,
    /// How often a bucket no lookup touched is refreshed.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// How long a request to a peer may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a QUIC handshake with a peer may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// A connection with no traffic for this long is closed (keep-alives are sent at a third of it).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for DhtConfig {
    fn default() -> Self {
        DhtConfig {
            k: timeshard_proto::K,
            alpha: timeshard_proto::ALPHA,
            max_failures: 2,
            refresh_interval: Duration::from_secs(600),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(6),
        }
    }
}

/// Hard limits on what peers and clients may send, and on concurrent work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest message accepted, in bytes.
    pub max_message_bytes: u32,
    /// Most points in one write.
    pub max_batch_points: u32,
    /// Most series in one write.
    pub max_batch_series: u32,
    /// Most points in one page of a read.
    pub max_page_points: u32,
    /// Requests from clients served at once; beyond it they are refused as overloaded.
    pub max_concurrent_requests: usize,
    /// Requests from other nodes (gossip, lookups, replication, repair) served at once, apart
    /// from the clients' so that clients cannot starve them; beyond it refused as overloaded.
    pub max_concurrent_peer_requests: usize,
    /// Streams (requests) one connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Connections others opened to this node (and handshakes waiting) at once, in all; also
    /// bounds the pool of connections it dials.
    pub max_connections: usize,
    /// Connections established at once from one certificate (a client, a device or a node);
    /// beyond it a new one is closed with a reason that says so.
    pub max_connections_per_identity: usize,
    /// New QUIC handshakes one source address (IPv6: one /64) may start per second, after its
    /// burst; beyond it they are refused before any crypto. 0 turns the limit off.
    pub handshakes_per_sec_per_address: u32,
    /// New QUIC handshakes one source address may start at once.
    pub handshake_burst_per_address: u32,
    /// Quanta a read fetches in parallel.
    pub read_parallelism: usize,
    /// Quanta one page of a read scans at most; a longer range continues on the next page.
    pub max_quanta_per_page: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = Limits::default();
        LimitsConfig {
            max_message_bytes: l.max_message_bytes,
            max_batch_points: l.max_batch_points,
            max_batch_series: l.max_batch_series,
            max_page_points: l.max_page_points,
            max_concurrent_requests: 1024,
            max_concurrent_peer_requests: 1024,
            max_streams_per_connection: 256,
            max_connections: 4096,
            max_connections_per_identity: 64,
            // A peer holds one long-lived connection and redials only after a failure; a client
            // or device opens one when it starts. 100 a second after a burst of 400 is more than
            // a local cluster (every node and client on 127.0.0.1) or a site of devices behind
            // one NAT address opens at start-up, and holds what one address can make the node
            // spend on handshakes (about 0.5 ms of CPU each) to about 5 % of a core.
            handshakes_per_sec_per_address: 100,
            handshake_burst_per_address: 400,
            read_parallelism: 64,
            max_quanta_per_page: 4096,
        }
    }
}

impl LimitsConfig {
    /// The limits on established connections.
    pub fn connections(&self) -> crate::admission::ConnectionLimits {
        crate::admission::ConnectionLimits {
            total: self.max_connections,
            per_identity: self.max_connections_per_identity,
        }
    }

    /// The limit on new handshakes per source address.
    pub fn handshakes(&self) -> crate::handshakes::HandshakeRate {
        crate::handshakes::HandshakeRate {
            per_sec: self.handshakes_per_sec_per_address,
            burst: self.handshake_burst_per_address,
        }
    }

    /// The wire limits.
    pub fn wire(&self) -> Limits {
        Limits {
            max_message_bytes: self.max_message_bytes,
            max_batch_points: self.max_batch_points,
            max_batch_series: self.max_batch_series,
            max_page_points: self.max_page_points,
            max_contacts: Limits::default().max_contacts,
        }
    }
}

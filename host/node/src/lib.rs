//! The timeshard edge node as a library: the daemon that wires the sans-IO core
//! (`timeshard-proto`), the store (`timeshard-store`), the policy host (`timeshard-policy`) and
//! QUIC (quinn + rustls) together. The `timeshard` command line is `timeshard-cli`; local
//! clusters, the demo and the benchmarks are `timeshard-testkit`.
//!
//! Module map, grouped from the leaves up (no module imports one that imports it back):
//! - Leaves: [`config`] (TOML settings, the configuration in force; imports nothing of the
//!   node), [`metrics`] (what the node counts; [`audit`]: failed authentications), [`budget`] (the one memory budget),
//!   [`faults`] (partition fault injection for tests), [`pki`] (development CA), [`attest`]
//!   (signing this node's membership entry and checking its peers'),
//!   [`repair::state`] (what the read path shares with repair: settled, counters, the read
//!   repair queue).
//! - The network: [`net`] (endpoint and peer connections), [`dht`] (routing table and lookups
//!   over the network: discovery, joining), [`membership`] (the gossiped membership view and
//!   the owners of blocks computed from it; [`revocations`]: the signed revocation list it
//!   passes on).
//! - Data on this node: [`storage`] (opening the store, its maintenance, its size limit and
//!   disk space), [`hints`] (hinted handoff: writes replicas missed, kept on disk and
//!   replayed), [`policies`] (ingest and query policies on the node), [`replica`] (the local
//!   replica's side of every request a coordinator sends to a replica), [`tier`] (the cold
//!   tier: export to the archive, and reads that span both tiers).
//! - Across replicas: [`coordinator`] (client writes, reads, aggregates, policy queries and
//!   series listings, one submodule per path; it serves this node's share through
//!   [`replica`]), [`repair`] (anti-entropy, handoff of blocks this node no longer owns, read
//!   repair, leaving).
//! - The node: [`node`] (the [`Node`] handle the front doors share, and its status),
//!   [`seams`] (the socket and disk a simulator replaces),
//!   [`reconfigure`] (what may change while the node runs, applied whole or not at all),
//!   [`start`] (wiring a node phase by phase, the tasks it runs with the narrow handles each
//!   uses, shutdown).
//! - Front doors: [`server`] (accepting and answering QUIC requests; [`handshakes`]: new
//!   handshakes per source address, asked before any crypto; [`peer_scope`]: what
//!   another node may store, read in bulk and list here, by placement), [`streams`] (requests
//!   answered with a stream of frames), [`http`] (InfluxDB and Prometheus endpoints, the JSON
//!   API and `/metrics`), [`control`] (enrolled nodes: following the control plane's desired
//!   state, renewal, revocation), [`process`] (ready file and stop signals of a node process).

pub mod admission;
pub mod attest;
pub mod audit;
pub mod budget;
pub mod config;
pub mod control;
pub mod coordinator;
pub mod dht;
pub mod faults;
pub mod handshakes;
pub mod hints;
pub mod http;
pub mod membership;
pub mod metrics;
pub mod net;
pub mod node;
pub mod peer_scope;
pub mod pki;
pub mod policies;
pub mod priority;
pub mod process;
pub mod reconfigure;
pub mod repair;
pub mod replica;
pub mod revocations;
pub mod seams;
pub mod server;
pub mod start;
pub mod storage;
pub mod streams;
pub mod tier;

pub use config::NodeConfig;
pub use node::Node;
pub use start::{RunningNode, StartError};

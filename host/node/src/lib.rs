//! The timeshard edge node as a library: the daemon that wires the sans-IO core
//! (`timeshard-proto`), the store (`timeshard-store`), the policy host (`timeshard-policy`) and
//! QUIC (quinn + rustls) together. The `timeshard` command line is `timeshard-cli`; local
//! clusters, the demo and the benchmarks are `timeshard-testkit`.
//!
//! Module map: [`config`] (TOML settings), [`pki`] (development CA), [`net`] (endpoint and peer
//! connections), [`dht`] (routing table and lookups over the network: discovery),
//! [`membership`] (the gossiped membership view and the owners of blocks computed from it),
//! [`coordinator`] (client writes, reads, aggregates, policy queries and series listings across
//! replicas, one submodule per path), [`hints`] (hinted handoff: writes replicas missed, kept on
//! disk and replayed), [`repair`] (anti-entropy, handoff of blocks
//! this node no longer owns, read repair, leaving), [`server`] (accepting and answering requests), [`streams`] (requests answered with a stream of frames), [`node`] (start and
//! shutdown), [`reconfigure`] (what may change while the node runs, applied whole or not at
//! all), [`control`] (enrolled nodes: following the control plane's desired state, renewal,
//! revocation), [`policies`] (ingest and query policies on the node), [`process`] (ready file
//! and stop signals of a node process), [`faults`] (partition fault injection for tests), [`http`]
//! (InfluxDB and Prometheus endpoints, the JSON API and `/metrics`), [`metrics`] (what the node
//! counts), [`tier`] (the cold tier: export to the archive, and reads that span both tiers).

pub mod budget;
pub mod config;
pub mod control;
pub mod coordinator;
pub mod dht;
pub mod faults;
pub mod hints;
pub mod http;
pub mod membership;
pub mod metrics;
pub mod net;
pub mod node;
pub mod pki;
pub mod policies;
pub mod process;
pub mod reconfigure;
pub mod repair;
pub mod replica;
pub mod server;
pub mod start;
pub mod storage;
pub mod streams;
pub mod tier;

pub use config::NodeConfig;
pub use node::Node;
pub use start::{RunningNode, StartError};

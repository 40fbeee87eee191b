//! The timeshard edge node: the daemon that wires the sans-IO core (`timeshard-proto`), the
//! store (`timeshard-store`) and QUIC (quinn + rustls) together, and the `timeshard` command
//! line around it (node, demo, put, get, status, pki, bench).
//!
//! Module map: [`config`] (TOML settings), [`pki`] (development CA), [`net`] (endpoint and peer
//! connections), [`dht`] (routing table and lookups over the network), [`coordinator`] (client
//! writes, reads, aggregates, policy queries and series listings across replicas, one submodule
//! per path), [`server`] (accepting and answering requests), [`node`]
//! (start and shutdown), [`cluster`] (local multi-process clusters), [`demo`], [`bench`], [`cli`].

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod coordinator;
pub mod demo;
pub mod dht;
pub mod net;
pub mod node;
pub mod pki;
pub mod policies;
pub mod server;
pub mod stats;

pub use config::NodeConfig;
pub use node::{Node, RunningNode, StartError};

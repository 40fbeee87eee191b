//! The timeshard edge node: the daemon that wires the sans-IO core (`timeshard-proto`), the
//! store (`timeshard-store`) and QUIC (quinn + rustls) together, and the `timeshard` command
//! line around it (node, demo, put, get, status, pki, bench).
//!
//! Module map: [`config`] (TOML settings), [`pki`] (development CA), [`net`] (endpoint and peer
//! connections), [`dht`] (routing table and lookups over the network), [`coordinator`] (client
//! writes and reads across replicas), [`server`] (accepting and answering requests), [`node`]
//! (start and shutdown), [`cluster`] (local multi-process clusters), [`demo`], [`bench`], [`cli`].

pub mod config;
pub mod coordinator;
pub mod dht;
pub mod net;
pub mod node;
pub mod pki;
pub mod policies;
pub mod process;
pub mod server;

pub use config::NodeConfig;
pub use node::{Node, RunningNode, StartError};

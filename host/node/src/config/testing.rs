//! `[testing]`: fault injection and WAN emulation for tests and benchmarks on one machine.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Fault injection for tests. Only the node's own config file sets it; no peer can.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TestingConfig {
    /// A file naming nodes (ids in hex, or `ip:port` addresses), one per line, that this node
    /// must not talk to: requests to them fail as unreachable, and requests from them are
    /// dropped. Re-read every 200 ms; absent or empty means no fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_file: Option<PathBuf>,
    /// WAN emulation for tests and benchmarks on one machine: requests to a peer with a
    /// location (and their answers) are each delayed by
    /// `haversine_km * route_factor / 200 + per_hop_ms`. Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wan_emulation: Option<WanEmulation>,
}

/// The WAN emulation's parameters (`[testing] wan_emulation = { per_hop_ms = 0.2,
/// route_factor = 1.5 }`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanEmulation {
    /// Fixed cost of every message, in milliseconds.
    pub per_hop_ms: f64,
    /// How much longer routes are than great circles.
    pub route_factor: f64,
}

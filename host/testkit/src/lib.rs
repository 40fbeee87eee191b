//! What timeshard's tests, demo and benchmarks share; no part of a node.
//!
//! Owns local clusters of separate node processes on loopback ([`cluster`]), the deterministic
//! datasets of BENCHMARKS.md ([`datasets`]), latency statistics ([`stats`]), an HTTP client for
//! the nodes' HTTP side ([`http`]), the demo behind
//! `timeshard demo` ([`demo`]) and the benchmarks behind `timeshard bench` ([`mod@bench`]). The
//! command line (`timeshard-cli`) parses their options; everything else is here.

pub mod bench;
pub mod cluster;
pub mod datasets;
pub mod demo;
pub mod http;
pub mod stats;

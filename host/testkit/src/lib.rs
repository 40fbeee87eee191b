//! What timeshard's tests, demo and benchmarks share; no part of a node.
//!
//! Owns local clusters of separate node processes on loopback ([`cluster`]) with partition fault
//! injection, a peer's look at each replica of a block ([`inspect`]), what a test writer had
//! acknowledged and where blocks live against their owners ([`ledger`]), a control plane of
//! `timeshard-control` processes for them to enroll with ([`fleet`], [`control`]), signed
//! policy modules and the `[policy]` section that loads them ([`policies`]), the deterministic
//! datasets of BENCHMARKS.md ([`datasets`]), latency statistics ([`stats`]), a process's memory
//! and CPU time from `/proc` ([`procfs`]), an HTTP client for the nodes' HTTP side
//! ([`http_client`]), hand-made QUIC traffic for hostile tests ([`raw_quic`]), the demo behind
//! `timeshard demo` ([`demo`]) and the benchmarks behind `timeshard bench` ([`mod@bench`]). The
//! command line (`timeshard-cli`) parses their options; everything else is here.

pub mod bench;
pub mod cluster;
pub mod control;
pub mod datasets;
pub mod demo;
pub mod fleet;
pub mod http_client;
pub mod inspect;
pub mod ledger;
pub mod moto;
pub mod policies;
pub mod ports;
pub mod procfs;
pub mod raw_quic;
pub mod stats;

//! What timeshard's tests, demo and benchmarks share; no part of a node.
//!
//! Owns the deterministic benchmark datasets of BENCHMARKS.md ([`datasets`]) and the benchmarks
//! themselves ([`bench`]).

pub mod bench;
pub mod datasets;

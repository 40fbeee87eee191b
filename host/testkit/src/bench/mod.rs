//! The benchmarks of BENCHMARKS.md. Each `run` returns its JSON document, with the [`floor`]
//! measured in the same run, and prints a short human summary; they measure and never pass or
//! fail.

pub mod coi;
pub mod coi_sim;
pub mod floor;
pub mod footprint;
pub mod http;
pub mod paper;
pub mod policy;
pub mod policy_host;
pub mod repair;
pub mod repair_sim;
pub mod store;
pub mod tier;

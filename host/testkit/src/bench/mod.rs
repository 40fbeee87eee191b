//! The benchmarks of BENCHMARKS.md. Each `run` returns its JSON document and prints a short
//! human summary; they measure and never pass or fail.

pub mod paper;
pub mod policy;
pub mod policy_host;
pub mod store;

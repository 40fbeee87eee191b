//! The benchmarks of BENCHMARKS.md. They measure; they never pass or fail.

pub mod policy_host;
pub mod store;

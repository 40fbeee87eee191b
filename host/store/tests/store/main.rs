//! The storage engine's integration tests, one binary: crash injection below the store, a
//! model of its contents, failing disks, live timestamps, maintenance, the repair API,
//! retention, packed reads, and a child process killed with SIGKILL mid-ingest.

mod common;
mod concurrency;
mod crash;
mod failures;
mod live;
mod maintenance;
mod model;
mod packed;
mod quota;
mod repair_api;
mod retention;
mod sigkill;

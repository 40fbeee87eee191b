//! The end-to-end tests, one binary with one module per scenario: clusters of node processes on
//! loopback, control planes of `timeshard-control serve` processes on SQLite and PostgreSQL,
//! and the outside programs the interfaces are checked against (moto's S3 server, DuckDB, the
//! Python InfluxDB clients, Prometheus). Everything that needs a process cluster or an outside
//! server lives here, so `scripts/test --fast` leaves out just this binary.
//!
//! One binary links the node, the control plane and wasmtime once instead of once per
//! scenario. Run one scenario with `cargo test -p timeshard-tests --test e2e join::`.

/// The `timeshard` command line built in this package (`src/bin`), which node processes run.
pub const NODE: &str = env!("CARGO_BIN_EXE_timeshard-e2e");
/// The `timeshard-control` command line built in this package, for control plane processes.
pub const CONTROL: &str = env!("CARGO_BIN_EXE_timeshard-control-e2e");

/// The guest workspace, whose components `guest/build.sh` builds.
pub fn guest_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest")
}

mod archive_duckdb;
mod archive_s3;
mod bad_input;
mod batch_split;
mod bench;
mod cli;
mod coi;
mod coi_fleet;
mod coi_stale;
mod control_plane;
mod damage;
mod departure;
mod disk_full;
mod durability;
mod failover;
mod fleet;
mod full_batches;
mod hinted_handoff;
mod hostile_archive;
mod hostile_disk;
mod hostile_http;
mod hostile_modules;
mod hostile_quic;
mod http;
mod http_clients;
mod http_policies;
mod http_tokens;
mod import_export;
mod join;
mod leave;
mod memory_budget;
mod packed_read;
mod partition;
mod policies;
mod promql_oracle;
mod queries;
mod quotas;
mod read_repair;
mod renewal;
mod retention;
mod rogue_device;
mod rollout;
mod stream_read;
mod tier;
mod tier_failures;

// Support shared by several scenarios.
/// The tier crate's own test support (hot stores of generated data, the archive's answers
/// compared with the hot store's), shared with its tests rather than copied.
#[path = "../../../host/tier/tests/tier/support.rs"]
mod archive_support;
mod tier_support;

//! The sandboxed WebAssembly policy host of a timeshard node.
//!
//! Owns the wasmtime engine and its limits ([`engine`]), the generated bindings of the WIT
//! package in `wit/` (`bindings`), the one host capability granted to guests (`host_log`),
//! the bounded guest calls (`call`), signatures ([`signing`]), the installed policies and
//! their bindings to series ([`registry`]). The policy benchmark is in `timeshard-testkit`.
//!
//! # Policies
//!
//! - An **ingest policy** (WIT world `ingest-policy`) runs on the node that receives a write,
//!   before replication, over a batch of points of one series; it returns the points to store
//!   and the rejections with reasons.
//! - A **query policy** (world `query-policy`) runs `summarize` on the owner node of each
//!   quantum over its raw points, giving a small [`Partial`]; the coordinator `merge`s the
//!   partials of the whole range into a [`QueryResult`].
//!
//! A module runs only if it is a component signed (ed25519, over its hash, name, version and
//! kind, detached `.sig` file: see [`signing`]) by a key the node trusts, and imports nothing but
//! `timeshard:policy/host` (logging). Each call gets a fresh pooled instance, a deadline
//! (default 10 ms) and a memory cap (default 64 MiB); a trap, timeout or exceeded limit is a
//! typed [`PolicyError`], and the node keeps serving.
//!
//! # How a node uses it
//!
//! At start-up and on every configuration change, build or update the [`Registry`] from the
//! `[policy]` section of the node configuration ([`Config`], TOML example there):
//!
//! ```no_run
//! # use std::path::Path;
//! # use timeshard_policy::{Config, Registry, Params};
//! # use timeshard_proto::{Point, SeriesKey, TimeRange};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let toml_section: Config = Config::default();
//! # let config_dir = Path::new(".");
//! let (registry, report) = Registry::from_config(&toml_section, config_dir)?;
//! for (policy, error) in &report.failed {
//!     eprintln!("policy {policy} not loaded: {error}"); // the last good version keeps running
//! }
//! // On a configuration change (hot reload), apply the new section to the same registry:
//! let report = registry.apply(&toml_section, config_dir);
//!
//! // Ingest, on the receiving node, before replication, on a blocking thread:
//! let series: SeriesKey = "pmu.phase{bus=7,site=atl}".parse()?;
//! let batch = vec![Point::new(1_700_000_000_000_000_000, 49.9)];
//! match registry.ingest(&series, batch) {
//!     Ok(outcome) => { /* store and replicate outcome.keep; report outcome.rejected */ }
//!     Err(e) => { /* refuse the batch with e.to_string(); count e.kind() */ }
//! }
//!
//! // Query push-down: on each owner node, for each quantum of the range...
//! let params = Params::from([("threshold".to_string(), "10".to_string())]);
//! let part = TimeRange::new(1_700_000_000_000_000_000, 1_700_000_010_000_000_000)?;
//! let raw: Vec<Point> = vec![]; // the quantum's points in `part`, from the store
//! let partials = registry.query_map("rms", &series, part, &raw, &params)?;
//! // ...send `partials` (serde) to the coordinator, which merges all of them:
//! let result = registry.query_merge("rms", partials, &params)?;
//! println!("rms = {:?}", result.value("rms"));
//! # Ok(()) }
//! ```
//!
//! To install or roll out a module without a configuration file, call
//! [`Registry::install`] with a [`Module`] (the new version becomes current for unpinned
//! bindings at once) and [`Registry::bind`] to change the bindings; both swap atomically and
//! leave everything as it was on error. [`Registry::running`] lists what runs, for reporting.
//!
//! The CLI's `timeshard policy keygen` and `timeshard policy sign` are
//! [`signing::generate_keypair`] + [`signing::SecretKey::write`] and [`signing::sign_file`].
//!
//! # Without the engine
//!
//! With default features off (no `runtime`), the crate is the part a control plane needs and
//! nothing that runs WebAssembly: names and kinds, [`signing`], and [`component::inspect`],
//! which checks that bytes are a policy component of a kind without compiling them.

#[cfg(feature = "runtime")]
mod bindings;
#[cfg(feature = "runtime")]
mod call;
#[cfg(feature = "cli")]
pub mod commands;
pub mod component;
#[cfg(feature = "runtime")]
pub mod engine;
mod error;
pub mod floors;
#[cfg(feature = "runtime")]
mod host_log;
#[cfg(feature = "runtime")]
pub mod pool;
#[cfg(feature = "runtime")]
pub mod registry;
pub mod signing;
#[cfg(feature = "runtime")]
mod stats;
mod types;

#[cfg(feature = "runtime")]
pub use engine::Limits;
pub use error::{FailureKind, PolicyError};
#[cfg(feature = "runtime")]
pub use pool::Backend;
#[cfg(feature = "runtime")]
pub use registry::{
    ApplyReport, Binding, Bindings, Config, Module, ModuleConfig, OnFailure, Registry, Running, Selector, Settings,
};
#[cfg(feature = "runtime")]
pub use stats::CallStats;
pub use types::{
    Failure, IngestOutcome, Kind, MAX_NAME_BYTES, MAX_PARTIAL_NUMBERS, NamedValue, Params, Partial, PolicyRef,
    PolicySpec, QueryResult, Rejection,
};

/// The guest component `name` (a crate of the `guest/` workspace, e.g. `pmu-validate`) as
/// built by `guest/build.sh`, under `guest_dir`.
pub fn guest_artifact(guest_dir: &std::path::Path, name: &str) -> Result<std::path::PathBuf, PolicyError> {
    let path = guest_dir.join("target/wasm32-wasip2/release").join(format!("{}.wasm", name.replace('-', "_")));
    if path.is_file() {
        Ok(path)
    } else {
        Err(PolicyError::Io {
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("guest component {name} is not built; run {}/build.sh first", guest_dir.display()),
            ),
            path,
        })
    }
}

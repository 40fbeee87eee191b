//! The cold tier of timeshard: sealed blocks exported to Parquet files on object storage, and
//! read back as one store with the hot tier.
//!
//! # What it owns
//!
//! - The archive's layout and formats (FORMAT.md): a folder per node (`node=<id>/`, the only
//!   place it writes and deletes), Hive-style partitions by class and UTC day below it, one
//!   points file per export of a node and class-day (few, large files: rows sorted by series
//!   and time, row-group statistics and a page index), and a manifest per points file, written
//!   last, that commits it and lists every block part with its summary ([`layout`],
//!   [`schema`], [`manifest`]).
//! - Seals ([`seal`]): each manifest is signed by the node that wrote it with its TLS key, and
//!   checked on read against the fleet CA and the folder it sits in; a manifest that fails is
//!   refused (counted, its blocks not read), the rest of the archive stays readable. Archives
//!   from before folders and seals are read as legacy, unverified (`Config::read_legacy`).
//! - Export ([`Archive::export`]): exactly-once and resumable. Object names are deterministic
//!   (class, day, node, and the node's next export number in that partition as the archive
//!   lists it), so a re-run after a crash at any point rewrites the same objects; blocks whose
//!   hot digest the archive already covers are skipped; late data is exported as a diff against
//!   what is archived. Failed object-store work is retried with backoff; uploads are streamed a
//!   row group at a time and rate-limited.
//! - Queries over the archive ([`Archive::read`], [`Archive::aggregate`]), pruned by the
//!   manifests' block summaries, row-group statistics and page indexes, and the confirmation the
//!   hot tier waits for before dropping a block ([`Archive::confirmed`]).
//! - Upkeep: [`Archive::status`] and [`Archive::cleanup`] (uncommitted files after a grace age).
//! - Retention ([`Archive::set_retention`], [`Archive::expire`]): points past a class's
//!   retention are hidden from queries, and this node's files wholly past it removed, manifest
//!   first. Nobody removes another node's files: those of a node that is gone stay readable
//!   (hidden once past retention) until an operator removes its folder.
//!
//! # What it does not own
//!
//! The hot store (`timeshard-store`): the crate reads blocks through [`timeshard_store::Store`]
//! and never deletes or changes hot data; it only reports what the archive holds. Which node
//! exports which block (exactly one owner of a block), when blocks are due (the class's hot
//! window), dropping hot copies on every replica after [`Archive::confirmed`], and merging
//! answers of both tiers belong to the node.
//!
//! # How a node uses it
//!
//! ```no_run
//! # async fn f(hot: std::sync::Arc<dyn timeshard_store::Store>, class: timeshard_proto::SeriesClass,
//! #     due: Vec<(timeshard_proto::SeriesKey, timeshard_proto::Quantum)>) -> Result<(), timeshard_tier::Error> {
//! use timeshard_tier::{Archive, Config};
//! let archive = Archive::open("/var/lib/timeshard/archive", Config::for_node("a1b2c3"))?;
//! // The owner exports whole days of blocks past the hot window, one class at a time ...
//! let report = archive.export(hot.clone(), &class, due).await?;
//! // ... and every replica drops a block once the archive covers its digest, after the
//! // listing TTL (so every node's catalog sees the export first).
//! for c in &report.confirmed {
//!     hot.drop_block(&c.series, c.quantum.start, c.digest)?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout of the crate
//!
//! [`location`] (URLs to object stores), [`layout`] (object names), [`schema`] and [`write`]
//! (Parquet writers), [`read`] (Parquet readers over object storage), [`manifest`],
//! [`seal`] (signing and checking manifests),
//! [`catalog`] (committed blocks, cached), `export` (the exporter), `query` (reads and
//! aggregates), `upkeep` (status and cleanup), `retention` (hiding and removing expired
//! data), [`retry`] (backoff and rate limit), and
//! [`faulty`] (an object store that fails on demand, for tests here and in the node).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::ObjectStore;

mod cache;
pub mod catalog;
mod error;
mod export;
pub mod faulty;
pub mod layout;
pub mod location;
pub mod manifest;
mod page_header;
mod query;
pub mod read;
mod retention;
pub mod retry;
pub mod schema;
pub mod seal;
mod upkeep;
pub mod write;

/// The object-store crate the archive is built on, for callers that wrap or list its store.
pub use object_store;

pub use catalog::{ArchivedBlock, CacheConfig, Part};
pub use error::Error;
pub use export::{Confirmed, ExportConfig, ExportReport};
pub use layout::{Day, FileId};
pub use location::Location;
pub use query::Horizon;
pub use retention::{ExpireReport, Retention};
pub use retry::RetryPolicy;
pub use upkeep::{ArchiveStatus, ClassStatus, CleanupReport, LastExport};

/// Settings of an archive handle.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's name in the objects it exports (letters, digits, `_`, `-`; e.g. its id in
    /// hex). Two nodes must never share one.
    pub node: String,
    pub export: ExportConfig,
    pub cache: CacheConfig,
    /// Retries of object-store work (each upload, listing, read and commit).
    pub retry: RetryPolicy,
    /// This node's keys: it seals its manifests with them and checks every other node's
    /// against the fleet CA. `None` (tests, benchmarks) writes unsealed manifests and checks
    /// none; a node always has keys, and then `node` must be their node id in hex.
    pub keys: Option<Arc<seal::Keys>>,
    /// Read exports of an archive written before node folders (at its top, unsealed), as
    /// unverified. Turn off once none are left, so nothing unsealed is ever read.
    pub read_legacy: bool,
}

impl Config {
    /// Defaults for node `node`.
    pub fn for_node(node: &str) -> Config {
        Config {
            node: node.to_string(),
            export: ExportConfig::default(),
            cache: CacheConfig::default(),
            retry: RetryPolicy::default(),
            keys: None,
            read_legacy: true,
        }
    }
}

/// A handle on one archive. Cheap to clone; all methods take `&self`.
#[derive(Clone, Debug)]
pub struct Archive {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn ObjectStore>,
    /// The directory of a local archive (for cleaning up interrupted local uploads).
    local_root: Option<PathBuf>,
    config: Config,
    catalog: catalog::Catalog,
    rate: retry::RateLimit,
    /// One export at a time per handle: export numbers are taken from the archive's listing.
    export_lock: tokio::sync::Mutex<()>,
    last_export: Mutex<Option<LastExport>>,
    /// Retention per class name (see [`Archive::set_retention`]).
    retention: Mutex<std::collections::HashMap<String, Retention>>,
    /// Write times of exports, as their manifests say (for expiry by write time).
    written: Mutex<std::collections::HashMap<FileId, i64>>,
}

impl Archive {
    /// Opens the archive at `url` (see [`Location`]).
    pub fn open(url: &str, config: Config) -> Result<Archive, Error> {
        Archive::open_with_options(url, &[], config)
    }

    /// Opens the archive at `url` with settings of its remote store over the environment's
    /// (see [`Location::open`]).
    pub fn open_with_options(url: &str, options: &[(String, String)], config: Config) -> Result<Archive, Error> {
        let location = Location::parse(url)?;
        let store = location.open(options, Duration::from_secs(30))?;
        let local_root = match location {
            Location::Local(dir) => Some(dir),
            _ => None,
        };
        Archive::build(store, local_root, config)
    }

    /// An archive on `store` (tests wrap stores, e.g. in [`faulty::FaultyStore`]).
    pub fn with_store(store: Arc<dyn ObjectStore>, config: Config) -> Result<Archive, Error> {
        Archive::build(store, None, config)
    }

    fn build(store: Arc<dyn ObjectStore>, local_root: Option<PathBuf>, config: Config) -> Result<Archive, Error> {
        layout::check_node(&config.node)?;
        if let Some(keys) = &config.keys
            && keys.node() != config.node
        {
            return Err(Error::InvalidInput(format!(
                "the archive node name {} is not the node id {} of the keys that seal its manifests",
                config.node,
                keys.node()
            )));
        }
        let catalog = catalog::Catalog::new(Arc::clone(&store), &config);
        let rate = retry::RateLimit::new(config.export.rate_limit_bytes_per_s);
        let inner = Inner {
            store,
            local_root,
            config,
            catalog,
            rate,
            export_lock: tokio::sync::Mutex::new(()),
            last_export: Mutex::new(None),
            retention: Mutex::new(std::collections::HashMap::new()),
            written: Mutex::new(std::collections::HashMap::new()),
        };
        Ok(Archive { inner: Arc::new(inner) })
    }

    /// The object store under the archive.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// The settings it was opened with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Forgets cached listings, so the next query sees exports of other nodes at once.
    pub fn refresh(&self) {
        self.inner.catalog.refresh();
    }

    /// Manifests refused so far (each counted once per process), and the last few with the
    /// reason (see [`Error::Refused`]).
    pub fn refused(&self) -> (u64, Vec<(String, String)>) {
        self.inner.catalog.refused()
    }
}

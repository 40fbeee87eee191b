//! The cold tier on a node: classes with `archive = true` move sealed blocks past their hot
//! window to the archive (`[tier] url`, the `timeshard-tier` crate), and every read, window
//! aggregate and policy query spans both tiers.
//!
//! - [`store::TieredStore`] is the store the node serves replica requests from: the hot store,
//!   with reads and aggregates of archived classes merged with what the archive holds. Each
//!   replica answers for hot and cold alike, so the coordinator's paths (quorums, agreement,
//!   reconciliation) work unchanged, and a replica that dropped its hot copy answers exactly
//!   like one that still holds it.
//! - `mover` is the export loop: every `[tier] interval` it finds the blocks past their hot
//!   window; their first owner exports them (later owners take over after `takeover_after`
//!   each, should it be down or lack them: `timeshard_proto::tier`), and every replica drops its hot copy once the archive holds it,
//!   checked by its own digest (`Store::drop_block` refuses a copy that changed meanwhile). It
//!   also applies write-time retention (`age_by = "write"`), which the store does not measure,
//!   and retention to the archive (each node removes its own expired files, and only those).
//!   The archive seals this node's manifests with its TLS key and checks every other node's
//!   against the fleet CA ([`Tier::set_identity`] follows certificate renewal).
//! - [`writes`] keeps the write times of classes aged by write time durably (the store's are
//!   lost at a restart); [`store::TieredStore`] records them before each write.
//! - `report` answers `timeshard archive status`.
//!
//! The coordinator never sees the archive; the hooks are the store the node serves from (set up
//! as the node starts), the export task it spawns, the class settings a reconfiguration passes
//! on ([`Tier::set_config`]), and the status request (`timeshard archive status`).

mod mover;
mod report;
pub mod store;
pub mod writes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::class::AgeBy;
use timeshard_proto::{Classes, SeriesClass, SeriesKey, Timestamp};
use timeshard_sdk::tls::Identity;
use timeshard_store::{BlockInfo, Store, StoreError};
use timeshard_tier::seal::Keys;
use timeshard_tier::{Archive, CacheConfig, Config, ExportConfig, Retention};
use tracing::warn;

use crate::config::{ConfigError, NodeConfig, TierConfig};

pub use mover::run as run_mover;

/// The tier settings of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassTier {
    pub archive: bool,
    /// The hot window (ns); 0 when the class is not archived.
    pub hot_ns: i64,
    pub age_by: AgeBy,
    /// Retention (ns, by `age_by`). The tier applies it to the archive, and to hot blocks by
    /// write time (the store applies event-time retention to hot blocks).
    pub retention_ns: Option<i64>,
    /// Higher goes first in an export round.
    pub export_priority: u8,
}

impl ClassTier {
    /// Retention the tier applies to hot blocks itself: by write time only.
    pub fn write_retention_ns(&self) -> Option<i64> {
        self.retention_ns.filter(|_| self.age_by == AgeBy::Write)
    }

    /// How far ahead a write time is recorded ([`writes`]): a hundredth of the shortest window
    /// the class ages by write time (1 ms to 1 h).
    pub fn write_granule_ns(&self) -> i64 {
        let hot = (self.archive && self.hot_ns > 0).then_some(self.hot_ns);
        let shortest = hot.into_iter().chain(self.retention_ns).min().unwrap_or(0);
        (shortest / 100).clamp(1_000_000, 3_600_000_000_000)
    }

    /// The archive's retention of the class, if it has one.
    pub fn archive_retention(&self) -> Option<Retention> {
        self.retention_ns.map(|keep_ns| Retention { keep_ns, age_by: self.age_by })
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The classes and their tier settings, swapped whole on reconfiguration.
#[derive(Debug)]
pub struct Policy {
    pub classes: Classes,
    by_name: HashMap<String, ClassTier>,
}

impl Policy {
    fn of(config: &NodeConfig) -> Result<Policy, ConfigError> {
        let by_name = config
            .classes
            .iter()
            .map(|c| {
                let tier = ClassTier {
                    archive: c.archive,
                    hot_ns: c.hot_window().map_or(0, nanos),
                    age_by: c.age_by,
                    retention_ns: c.retention.map(nanos),
                    export_priority: c.export_priority,
                };
                (c.name.clone(), tier)
            })
            .collect();
        Ok(Policy { classes: config.class_table()?, by_name })
    }

    /// Gives the archive the classes' retention (and takes it from classes `old` had that
    /// are gone).
    fn apply_retention(&self, archive: &Archive, old: Option<&Policy>) {
        for name in old.iter().flat_map(|o| o.by_name.keys()) {
            archive.set_retention(name, None);
        }
        for (name, t) in &self.by_name {
            archive.set_retention(name, t.archive_retention());
        }
    }

    /// The tier settings of `class` (a class the file does not name, the implicit catch-all,
    /// is not archived).
    pub fn tier(&self, class: &SeriesClass) -> ClassTier {
        self.by_name.get(&class.name).copied().unwrap_or(ClassTier {
            archive: false,
            hot_ns: 0,
            age_by: AgeBy::Event,
            retention_ns: None,
            export_priority: 0,
        })
    }

    /// The class of `series` if it is archived (timeshard's own series never are).
    pub fn archived_class(&self, series: &SeriesKey) -> Option<(&SeriesClass, ClassTier)> {
        if series.metric().starts_with(timeshard_proto::key::RESERVED_METRIC_PREFIX) {
            return None;
        }
        let class = self.classes.of(series);
        let tier = self.tier(class);
        tier.archive.then_some((class, tier))
    }

    /// The class of `series` when the archive may hold points of it: any class but
    /// timeshard's own series, archived now or not (a class switched to `archive = false` keeps
    /// its history readable).
    pub fn class_in_archive(&self, series: &SeriesKey) -> Option<&SeriesClass> {
        if series.metric().starts_with(timeshard_proto::key::RESERVED_METRIC_PREFIX) {
            return None;
        }
        Some(self.classes.of(series))
    }

    /// Whether the node has tier work at all (`archive`: one is configured): an archived
    /// class, write-time retention, or retention over an archive.
    pub fn has_work(&self, archive: bool) -> bool {
        self.by_name
            .values()
            .any(|t| t.archive || t.write_retention_ns().is_some() || (archive && t.retention_ns.is_some()))
    }
}

/// What the export loop has done, for `timeshard archive status`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClassCounters {
    /// Damaged hot blocks the last export left out (kept hot; the store's health names them).
    pub unreadable_blocks: u64,
    pub exported_files: u64,
    pub exported_blocks: u64,
    pub exported_rows: u64,
    pub exported_bytes: u64,
    pub dropped_blocks: u64,
    pub pending_blocks: u64,
    /// Points in the blocks due for export at the last walk, the bytes they take in the hot
    /// store, and when the oldest of them
    /// became due (0: none): how far behind the archive is.
    pub pending_points: u64,
    pub pending_bytes: u64,
    pub oldest_due_ns: i64,
    pub waiting_for_owner: u64,
    pub expired_blocks: u64,
    pub expired_files: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub classes: HashMap<String, ClassCounters>,
    pub last_round_ns: i64,
    /// When a round last ended without error (0: not since the node started).
    pub last_success_ns: i64,
    pub last_error: Option<String>,
    pub last_error_ns: i64,
    pub failed_rounds: u32,
}

/// Export rounds failed in a row after which the node reports itself degraded: one failure is
/// a blip the backoff absorbs, this many an outage the operator should see.
const OUTAGE_ROUNDS: u32 = 3;

impl Progress {
    /// What to tell the control plane while export rounds keep failing: since when (the last
    /// success, or "since start"), how many blocks wait, and the last error.
    pub(crate) fn outage(&self, now_ns: i64) -> Option<String> {
        if self.failed_rounds < OUTAGE_ROUNDS {
            return None;
        }
        let pending: u64 = self.classes.values().map(|c| c.pending_blocks).sum();
        let since = match self.last_success_ns {
            0 => "no export has succeeded since the node started".to_string(),
            ns => format!("the last export succeeded {} s ago", (now_ns - ns).max(0) / 1_000_000_000),
        };
        let error = self.last_error.as_deref().unwrap_or("no error kept");
        Some(format!(
            "archive unreachable: {} export rounds failed in a row, {since}, {pending} blocks wait (kept hot): {error}",
            self.failed_rounds
        ))
    }
}

/// The cold tier of a node.
#[derive(Debug)]
pub struct Tier {
    archive: Option<Archive>,
    url: String,
    hot: Arc<dyn Store>,
    config: TierConfig,
    seal_grace_ns: i64,
    policy: RwLock<Arc<Policy>>,
    progress: Mutex<Progress>,
    /// A background relisting of the archive is under way (see [`store::TieredStore`]).
    relisting: AtomicBool,
    /// When listing each class last failed: reads do not wait for another attempt within the
    /// listing TTL.
    list_failures: Mutex<HashMap<String, (tokio::time::Instant, String)>>,
    /// Per class, the end of the newest quantum this node dropped a hot copy of (see
    /// [`Tier::drop_horizon`]), kept in `drops_file`.
    drops: Mutex<HashMap<String, Timestamp>>,
    drops_file: PathBuf,
    /// Durable write times of blocks of classes aged by write time.
    writes: writes::WriteTimes,
    runtime: tokio::runtime::Handle,
}

/// The tier cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("cannot open the archive {url}: {source}")]
    Archive {
        url: String,
        #[source]
        source: Box<timeshard_tier::Error>,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot keep the tier's state in {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a node keeps its drop horizons (in `<data_dir>/tier`).
const DROPS_FILE: &str = "drops.json";

impl Tier {
    /// The tier of the node whose certificate is `identity` (its id in hex names its archive
    /// folder and exports; its key seals its manifests) over its hot store. Every node has
    /// one, idle unless an archive is configured or a class ages by write time (a
    /// reconfiguration may make it so). Must be called within the node's runtime.
    /// `seam` is the object store to use instead of the one `[tier] url` names (a simulator's).
    pub fn open(
        config: &NodeConfig,
        identity: &Identity,
        hot: Arc<dyn Store>,
        seam: Option<Arc<dyn timeshard_tier::object_store::ObjectStore>>,
    ) -> Result<Arc<Tier>, TierError> {
        let policy = Policy::of(config)?;
        let t = &config.tier;
        let dir = config.data_dir.join("tier");
        std::fs::create_dir_all(&dir).map_err(|source| TierError::State { path: dir.clone(), source })?;
        let drops_file = dir.join(DROPS_FILE);
        let drops = match std::fs::read(&drops_file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| TierError::State {
                path: drops_file.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(source) => return Err(TierError::State { path: drops_file, source }),
        };
        let writes_file = dir.join(writes::FILE);
        let writes =
            writes::WriteTimes::open(&writes_file).map_err(|source| TierError::State { path: writes_file, source })?;
        let archive = if t.url.is_empty() {
            None
        } else {
            let keys = Keys::of(identity).map_err(|e| TierError::Archive {
                url: t.url.clone(),
                source: Box::new(timeshard_tier::Error::InvalidInput(e.to_string())),
            })?;
            let archive_config = Config {
                node: keys.node(),
                keys: Some(Arc::new(keys)),
                read_legacy: t.read_legacy,
                export: ExportConfig {
                    row_group_rows: t.row_group_rows,
                    rate_limit_bytes_per_s: (t.rate_limit_bytes_per_sec > 0).then_some(t.rate_limit_bytes_per_sec),
                    ..ExportConfig::default()
                },
                cache: CacheConfig { listing_ttl: t.listing_ttl, ..CacheConfig::default() },
                retry: timeshard_tier::RetryPolicy::default(),
            };
            let options: Vec<(String, String)> = t.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let archive = match seam {
                Some(store) => Archive::with_store(store, archive_config),
                None => Archive::open_with_options(&t.url, &options, archive_config),
            }
            .map_err(|e| TierError::Archive { url: t.url.clone(), source: Box::new(e) })?;
            Some(archive)
        };
        if let Some(archive) = &archive {
            policy.apply_retention(archive, None);
        }
        Ok(Arc::new(Tier {
            archive,
            url: t.url.clone(),
            hot,
            config: t.clone(),
            seal_grace_ns: nanos(config.store.seal_grace),
            policy: RwLock::new(Arc::new(policy)),
            progress: Mutex::new(Progress::default()),
            relisting: AtomicBool::new(false),
            list_failures: Mutex::new(HashMap::new()),
            drops: Mutex::new(drops),
            drops_file,
            writes,
            runtime: tokio::runtime::Handle::current(),
        }))
    }

    /// Seals this node's manifests with a renewed certificate from now on.
    pub fn set_identity(&self, identity: &Identity) {
        if let Some(keys) = self.archive.as_ref().and_then(|a| a.config().keys.as_ref())
            && let Err(e) = keys.set_identity(identity)
        {
            warn!(error = %e, "the renewed certificate cannot seal archive manifests; keeping the old one");
        }
    }

    /// The archive, if one is configured.
    pub fn archive(&self) -> Option<&Archive> {
        self.archive.as_ref()
    }

    /// The hot store.
    pub fn hot(&self) -> &Arc<dyn Store> {
        &self.hot
    }

    /// The classes and tier settings in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies the classes of a new configuration (checked already, by the node's
    /// reconfiguration).
    pub fn set_config(&self, config: &NodeConfig) {
        match Policy::of(config) {
            Ok(p) => {
                let mut policy = self.policy.write().unwrap_or_else(|e| e.into_inner());
                if let Some(archive) = &self.archive {
                    p.apply_retention(archive, Some(&policy));
                }
                *policy = Arc::new(p);
            }
            Err(e) => warn!(error = %e, "tier settings not applied"),
        }
    }

    /// Records durably when `blocks` of classes aged by write time are written (before they
    /// reach the hot store: see [`writes`]).
    pub fn note_writes(&self, blocks: &[timeshard_proto::wire::BlockPoints]) -> Result<(), StoreError> {
        let policy = self.policy();
        let aged: Vec<(&SeriesKey, Timestamp, i64)> = blocks
            .iter()
            .filter_map(|b| {
                let class = policy.class_in_archive(&b.series)?;
                let t = policy.tier(class);
                (t.age_by == AgeBy::Write).then(|| (&b.series, b.quantum.start, t.write_granule_ns()))
            })
            .collect();
        if aged.is_empty() {
            return Ok(());
        }
        self.writes
            .note(&aged, now_ns())
            .map_err(|source| StoreError::Io { context: "recording write times of the tier".into(), source })
    }

    /// `b` with its durable write time when its class ages by write time and one is recorded
    /// (the store's own is lost at a restart).
    pub fn with_write_time(&self, policy: &Policy, mut b: BlockInfo) -> BlockInfo {
        let Some(class) = policy.class_in_archive(&b.series) else { return b };
        if policy.tier(class).age_by == AgeBy::Write
            && let Some(t) = self.writes.get(&b.series, b.quantum.start)
        {
            b.last_write = t;
        }
        b
    }

    pub(crate) fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether block `b` is past the hot window of its archived class at `now` (the tier
    /// moves it; repair leaves it alone).
    pub fn leaving(&self, policy: &Policy, b: &timeshard_store::BlockInfo, now: Timestamp) -> bool {
        if self.archive.is_none() {
            return false;
        }
        policy.archived_class(&b.series).is_some_and(|(_, t)| {
            timeshard_proto::tier::due_at(t.age_by, b.quantum, b.last_write, t.hot_ns, self.seal_grace_ns) <= now
        })
    }

    /// The end of the newest quantum of `class` this node ever dropped a hot copy of
    /// ([`Timestamp::MIN`]: none): from there on its hot store holds everything it was given.
    pub fn drop_horizon(&self, class: &str) -> Timestamp {
        self.drops.lock().unwrap_or_else(|e| e.into_inner()).get(class).copied().unwrap_or(Timestamp::MIN)
    }

    /// Moves the drop horizon of `class` to `end` (if later) and makes it durable: called
    /// before hot copies up to `end` are dropped.
    pub(crate) fn note_drops(&self, class: &str, end: Timestamp) -> std::io::Result<()> {
        let mut drops = self.drops.lock().unwrap_or_else(|e| e.into_inner());
        if drops.get(class).is_some_and(|&d| d >= end) {
            return Ok(());
        }
        let mut next = drops.clone();
        next.insert(class.to_string(), end);
        let tmp = self.drops_file.with_extension("tmp");
        let bytes = serde_json::to_vec(&next).map_err(std::io::Error::other)?;
        {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.drops_file)?;
        if let Some(dir) = self.drops_file.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        *drops = next;
        Ok(())
    }

    /// Lists the archive's exports of `class` now, unless that failed within the listing TTL
    /// (then the earlier failure is the answer); remembers a failure. The error says why.
    pub(crate) async fn relist(&self, class: &SeriesClass) -> Result<(), String> {
        let Some(archive) = &self.archive else { return Ok(()) };
        let recent = |(at, _): &&(tokio::time::Instant, String)| at.elapsed() < self.config.listing_ttl;
        if let Some((_, e)) =
            self.list_failures.lock().unwrap_or_else(|e| e.into_inner()).get(&class.name).filter(recent)
        {
            return Err(e.clone());
        }
        let result = archive.relist(class).await.map_err(|e| e.to_string());
        let mut failures = self.list_failures.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Ok(()) => failures.remove(&class.name),
            Err(e) => failures.insert(class.name.clone(), (tokio::time::Instant::now(), e.clone())),
        };
        result
    }

    /// Lists the archive's exports of `class` in the background, unless a listing is under way.
    pub(crate) fn relist_soon(self: &Arc<Self>, class: &SeriesClass) {
        if self.archive.is_none() || self.relisting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (tier, class) = (self.clone(), class.clone());
        self.runtime.spawn(async move {
            if let Err(e) = tier.relist(&class).await {
                warn!(class = %class.name, error = %e, "listing the archive failed; queries use the previous listing");
            }
            tier.relisting.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_reported_after_a_few_failed_rounds_with_its_backlog_and_error() {
        let mut p = Progress::default();
        p.classes.entry("pmu".into()).or_default().pending_blocks = 40;
        p.classes.entry("traffic".into()).or_default().pending_blocks = 2;
        p.failed_rounds = OUTAGE_ROUNDS - 1;
        p.last_error = Some("object store: connection refused".into());
        assert_eq!(p.outage(0), None, "a blip is not an outage");
        p.failed_rounds = OUTAGE_ROUNDS;
        assert_eq!(
            p.outage(0).as_deref(),
            Some(
                "archive unreachable: 3 export rounds failed in a row, no export has succeeded since the node \
                 started, 42 blocks wait (kept hot): object store: connection refused"
            )
        );
        p.last_success_ns = 1_000_000_000;
        assert!(p.outage(91_000_000_000).unwrap().contains("the last export succeeded 90 s ago"));
    }
}

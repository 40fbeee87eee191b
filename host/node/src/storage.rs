//! The node's local store: opening the engine `[store]` names (the disk engine in
//! `<data_dir>/store`, or memory), the task that runs the disk engine's maintenance, what the
//! store holds against `[store] max_bytes` ([`StoreUse`]), and how full its filesystem is
//! ([`DiskSpace`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::point::BlockPoints;
use timeshard_proto::wire::ClassStorage;
use timeshard_store::backend::Backend;
use timeshard_store::{DiskConfig, DiskStore, FsyncPolicy, MemStore, QuotaUse, Store, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::budget::Shares;
use crate::config::{ClassConfig, Fsync, NodeConfig, OnFull, StoreEngine};

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store in {path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
}

/// The store, and the same store when it is the disk engine (for what only it has: health,
/// stats).
pub type Stores = (Arc<dyn Store>, Option<Arc<DiskStore>>);

/// Opens the store `config` names; logs what the disk engine's health check found. With
/// `disk`, the disk engine runs on it instead of `<data_dir>/store` (a simulated disk).
pub fn open(config: &NodeConfig, disk: Option<Arc<dyn Backend>>) -> Result<Stores, OpenError> {
    Ok(match config.store.engine {
        StoreEngine::Memory => (Arc::new(MemStore::new(config.store.memory_max_points)), None),
        StoreEngine::Disk => {
            let dir = config.data_dir.join("store");
            let backend = disk;
            let disk = DiskConfig {
                fsync: match config.store.fsync {
                    Fsync::Durable => FsyncPolicy::Durable,
                    Fsync::OsBuffered => FsyncPolicy::OsBuffered,
                },
                seal_grace_ns: i64::try_from(config.store.seal_grace.as_nanos()).unwrap_or(i64::MAX),
                retention: config.retention_rules(),
                quotas: config.quota_rules(),
                max_open_age_ns: i64::try_from(config.store.max_open_age.as_nanos()).unwrap_or(i64::MAX),
                max_wal_bytes: config.store.max_wal_bytes,
                // Open points past the budget's share are sealed early by the writes themselves.
                max_open_points: DiskConfig::default()
                    .max_open_points
                    .min(Shares::of(config.memory.budget.0).max_open_points()),
                ..DiskConfig::default()
            };
            let opened = match backend {
                Some(backend) => DiskStore::open_with_backend(backend, disk),
                None => {
                    std::fs::create_dir_all(&dir).map_err(|source| OpenError::DataDir { path: dir.clone(), source })?;
                    DiskStore::open(&dir, disk)
                }
            };
            let store = opened.map_err(|source| OpenError::Store { path: dir.clone(), source })?;
            for problem in store.health() {
                warn!(%problem, "store health");
            }
            let store = Arc::new(store);
            (store.clone(), Some(store))
        }
    })
}

/// Runs the store's maintenance (sealing, late data, retention, log checkpoints) every
/// `interval`, in bounded steps on a blocking thread, so ingest never waits for it; until `stop`
/// fires.
pub async fn maintain(store: Arc<dyn Store>, usage: Arc<StoreUse>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        loop {
            let store = store.clone();
            match timeshard_clock::spawn_blocking(move || store.maintain(now_ns())).await {
                Ok(Ok(report)) if report.more => continue,
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    warn!(error = %e, "store maintenance failed; will retry");
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "store maintenance task failed");
                    break;
                }
            }
        }
        if usage.limited() {
            let (usage, store) = (usage.clone(), store.clone());
            let _ = timeshard_clock::spawn_blocking(move || usage.measure(&*store)).await;
        }
    }
}

/// What the store holds against its limits: `[store] max_bytes` (the bytes of its directory,
/// measured after each maintenance pass) and each class's `quota` (as the store measured it),
/// and whether replicas must refuse a write because of them.
#[derive(Debug)]
pub struct StoreUse {
    /// The store's directory (`<data_dir>/store`).
    dir: PathBuf,
    /// `[store] max_bytes`; 0: no limit.
    max: AtomicU64,
    used: AtomicU64,
    /// Bytes written since that measure, counted as open points: under load a measure can come
    /// late, and writes in between must not take the store far past `max`.
    added: AtomicU64,
    classes: RwLock<Vec<ClassUse>>,
    /// Whether some class has a quota.
    quotas: AtomicBool,
}

/// A class with a quota, and what it held at the last measure.
#[derive(Clone, Debug)]
pub struct ClassUse {
    pub class: String,
    pub metric_prefix: String,
    pub on_full: OnFull,
    /// Archived: never evicted before the archive holds it, so refused when full.
    pub archive: bool,
    /// Quota, bytes and evictions as the store measured them.
    pub store: QuotaUse,
    /// Bytes written to the class since that measure, counted as open points: writes between
    /// two measures cannot take the class far past its quota.
    added: Arc<AtomicU64>,
}

impl ClassUse {
    /// Bytes held: at the last measure, and written since.
    pub fn bytes(&self) -> u64 {
        self.store.bytes.saturating_add(self.added.load(Ordering::Relaxed))
    }

    /// The class as `timeshard status` and the control plane show it.
    pub fn status(&self) -> ClassStorage {
        ClassStorage {
            class: self.class.clone(),
            quota_bytes: self.store.max_bytes.unwrap_or(0),
            used_bytes: self.bytes(),
            on_full: self.on_full.to_string(),
            refusing: self.refuses(),
            evicted_blocks: self.store.evicted_blocks,
            evicted_points: self.store.evicted_points,
        }
    }

    /// Whether writes of the class are refused now.
    fn refuses(&self) -> bool {
        self.refuses_adding(0)
    }

    /// Whether a write of `incoming` more bytes (counted as open points) is refused: the class
    /// holds its quota, or (unless archived) the write would take it past it. Classes that
    /// evict never refuse. An archived class takes writes until it holds its quota, so that it
    /// always reaches the share at which its blocks go to the archive early (a write refused
    /// for what it would add could leave it below that share for good).
    fn refuses_adding(&self, incoming: u64) -> bool {
        let bytes = self.bytes();
        let ahead = if self.archive { 0 } else { incoming };
        (self.on_full == OnFull::Refuse || self.archive)
            && self.store.max_bytes.is_some_and(|max| bytes >= max || bytes.saturating_add(ahead) > max)
    }

    fn refusal(&self, incoming: u64) -> String {
        let (bytes, max) = (self.bytes(), self.store.max_bytes.unwrap_or(0));
        let held = if bytes >= max {
            format!("class {:?} holds {bytes} bytes in this node's store, at its quota of {max}", self.class)
        } else {
            format!(
                "class {:?} holds {bytes} bytes in this node's store, and this write (about {incoming} bytes) would \
                 pass its quota of {max}",
                self.class
            )
        };
        if self.archive {
            format!(
                "{held}: blocks not yet archived are never evicted, so writes of the class are refused until the \
                 archive takes them (see `timeshard archive status`) or the quota is raised"
            )
        } else {
            format!(
                "{held} (on_full = \"refuse\"): writes of the class are refused until retention frees room or \
                 the quota is raised"
            )
        }
    }
}

impl StoreUse {
    /// The store in `dir`, limited to `max` bytes (`None`: no limit, the directory is not
    /// measured), with the quotas of `classes`.
    pub fn new(dir: PathBuf, max: Option<u64>, classes: &[ClassConfig]) -> StoreUse {
        let usage = StoreUse {
            dir,
            max: AtomicU64::new(0),
            used: AtomicU64::new(0),
            added: AtomicU64::new(0),
            classes: RwLock::new(Vec::new()),
            quotas: AtomicBool::new(false),
        };
        usage.set_limits(max, classes);
        usage
    }

    /// Replaces the limits (a configuration reload); the next measure applies them.
    pub fn set_limits(&self, max: Option<u64>, classes: &[ClassConfig]) {
        self.max.store(max.unwrap_or(0), Ordering::Relaxed);
        let mut held = self.classes.write().unwrap_or_else(|e| e.into_inner());
        // Every class, those without a quota too: the longest prefix among all decides which
        // class a series belongs to.
        *held = classes
            .iter()
            .map(|c| ClassUse {
                class: c.name.clone(),
                metric_prefix: c.metric_prefix.clone(),
                on_full: c.on_full,
                archive: c.archive,
                store: held.iter().find(|h| h.class == c.name).map(|h| h.store.clone()).unwrap_or_default(),
                added: Arc::new(AtomicU64::new(0)),
            })
            .collect();
        for c in held.iter_mut() {
            c.store.max_bytes = classes.iter().find(|k| k.name == c.class).and_then(|k| k.quota).map(|q| q.0);
        }
        self.quotas.store(held.iter().any(|c| c.store.max_bytes.is_some()), Ordering::Relaxed);
    }

    /// Whether there is anything to measure.
    pub fn limited(&self) -> bool {
        self.max.load(Ordering::Relaxed) > 0 || self.quotas.load(Ordering::Relaxed)
    }

    /// Measures the store's files now, and takes the classes' use from `store`'s last measure.
    pub fn measure(&self, store: &dyn Store) {
        if self.max.load(Ordering::Relaxed) > 0 {
            self.used.store(dir_bytes(&self.dir), Ordering::Relaxed);
            self.added.store(0, Ordering::Relaxed);
        }
        let measured = store.quota_use();
        let mut classes = self.classes.write().unwrap_or_else(|e| e.into_inner());
        for c in classes.iter_mut() {
            if let Some(m) = measured.iter().find(|m| m.metric_prefix == c.metric_prefix)
                && m.measured_at != c.store.measured_at
            {
                c.store = QuotaUse { max_bytes: c.store.max_bytes, ..m.clone() };
                c.added.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Counts `blocks`, just stored, against their classes until the next measure.
    pub fn note_written(&self, blocks: &[BlockPoints]) {
        if self.max.load(Ordering::Relaxed) > 0 {
            self.added.fetch_add(open_bytes(blocks), Ordering::Relaxed);
        }
        if !self.quotas.load(Ordering::Relaxed) {
            return;
        }
        let classes = self.classes.read().unwrap_or_else(|e| e.into_inner());
        for b in blocks {
            if let Some(owner) = owner_of(&classes, b.series.metric())
                && owner.store.max_bytes.is_some()
            {
                owner.added.fetch_add(b.points.len() as u64 * timeshard_store::OPEN_POINT_BYTES, Ordering::Relaxed);
            }
        }
    }

    /// What to tell the control plane: the limits that refuse writes now.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self.refusal(&[]).into_iter().collect();
        let classes = self.classes.read().unwrap_or_else(|e| e.into_inner());
        problems.extend(classes.iter().filter(|c| c.refuses()).map(|c| c.refusal(0)));
        problems
    }

    /// The classes with a quota, as last measured.
    pub fn classes(&self) -> Vec<ClassUse> {
        let classes = self.classes.read().unwrap_or_else(|e| e.into_inner());
        classes.iter().filter(|c| c.store.max_bytes.is_some()).cloned().collect()
    }

    /// Why a write of `blocks` must be refused, if it must: the store held its limit at the
    /// last measure, or a class of theirs that does not evict held its quota.
    pub fn refusal(&self, blocks: &[BlockPoints]) -> Option<String> {
        let max = self.max.load(Ordering::Relaxed);
        let used = self.used.load(Ordering::Relaxed).saturating_add(self.added.load(Ordering::Relaxed));
        if max > 0 && used >= max {
            return Some(format!(
                "this node's store holds {used} bytes on disk, at its [store] max_bytes of {max}: writes are refused \
                 until retention frees room or the limit is raised"
            ));
        }
        if !self.quotas.load(Ordering::Relaxed) {
            return None;
        }
        let classes = self.classes.read().unwrap_or_else(|e| e.into_inner());
        // What the write adds to each class, as open points.
        let mut incoming: Vec<(usize, u64)> = Vec::new();
        for b in blocks {
            let Some(i) = owner_index(&classes, b.series.metric()) else { continue };
            let bytes = b.points.len() as u64 * timeshard_store::OPEN_POINT_BYTES;
            match incoming.iter_mut().find(|(c, _)| *c == i) {
                Some((_, n)) => *n += bytes,
                None => incoming.push((i, bytes)),
            }
        }
        incoming.into_iter().find_map(|(i, n)| classes[i].refuses_adding(n).then(|| classes[i].refusal(n)))
    }
}

/// What `blocks` add to a store before they are sealed: [`timeshard_store::OPEN_POINT_BYTES`] a point.
fn open_bytes(blocks: &[BlockPoints]) -> u64 {
    blocks.iter().map(|b| b.points.len() as u64).sum::<u64>() * timeshard_store::OPEN_POINT_BYTES
}

/// The class `metric` belongs to: the longest matching prefix among all classes.
fn owner_of<'a>(classes: &'a [ClassUse], metric: &str) -> Option<&'a ClassUse> {
    owner_index(classes, metric).map(|i| &classes[i])
}

/// [`owner_of`], as an index into `classes`.
fn owner_index(classes: &[ClassUse], metric: &str) -> Option<usize> {
    classes
        .iter()
        .enumerate()
        .filter(|(_, c)| metric.starts_with(&c.metric_prefix))
        .max_by_key(|(_, c)| c.metric_prefix.len())
        .map(|(i, _)| i)
}

/// Bytes in the files under `dir` (recursively); 0 if it does not exist.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// How full the filesystem holding the node's data is: what an operator of an SD card watches
/// before writes are refused with ENOSPC (`/metrics`, and the health the control plane sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSpace {
    /// The filesystem's size, in bytes.
    pub size: u64,
    /// Bytes the node may still write (free to unprivileged users).
    pub available: u64,
}

/// Below this share of the filesystem left, the node reports itself degraded.
const LOW_DISK_PERCENT: u64 = 10;

impl DiskSpace {
    /// The filesystem holding `dir`, by statvfs(3); `None` if it cannot be read.
    // The conversions are no-ops on x86_64 and aarch64, not on armv7 (32-bit fields).
    #[allow(clippy::useless_conversion)]
    pub fn of(dir: &Path) -> Option<DiskSpace> {
        let fs = nix::sys::statvfs::statvfs(dir).ok()?;
        let block = u64::from(fs.fragment_size()).max(1);
        Some(DiskSpace {
            size: u64::from(fs.blocks()).saturating_mul(block),
            available: u64::from(fs.blocks_available()).saturating_mul(block),
        })
    }

    /// What to tell the control plane when little is left.
    pub fn problem(&self) -> Option<String> {
        (self.size > 0 && self.available.saturating_mul(100) < self.size.saturating_mul(LOW_DISK_PERCENT)).then(|| {
            let full = 100 - self.available.saturating_mul(100) / self.size;
            format!("disk {full}% full: {} MiB left for the data directory", self.available >> 20)
        })
    }
}

#[cfg(test)]
mod disk_space_tests {
    use super::*;

    #[test]
    fn writes_are_refused_once_the_store_holds_its_max_bytes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wal")).unwrap();
        std::fs::write(dir.path().join("wal").join("0.wal"), vec![0u8; 3000]).unwrap();
        std::fs::write(dir.path().join("index.log"), vec![0u8; 1000]).unwrap();
        let store = MemStore::new(1000);
        let unlimited = StoreUse::new(dir.path().to_path_buf(), None, &[]);
        assert!(!unlimited.limited());
        unlimited.measure(&store);
        assert_eq!(unlimited.refusal(&[]), None);
        let limited = StoreUse::new(dir.path().to_path_buf(), Some(4000), &[]);
        assert_eq!(limited.refusal(&[]), None, "nothing measured yet");
        limited.measure(&store);
        let why = limited.refusal(&[]).expect("4000 bytes held of 4000");
        assert!(why.contains("holds 4000 bytes") && why.contains("max_bytes of 4000"), "{why}");
        std::fs::remove_file(dir.path().join("index.log")).unwrap();
        limited.measure(&store);
        assert_eq!(limited.refusal(&[]), None, "room again");
        limited.set_limits(Some(2000), &[]);
        limited.measure(&store);
        assert!(limited.refusal(&[]).is_some(), "a lower limit applies at the next measure");

        // Between measures, what is written counts (24 bytes a point): a measure that comes
        // late under load does not let writes run far past the limit.
        limited.set_limits(Some(4000), &[]);
        limited.measure(&store);
        assert_eq!(limited.refusal(&[]), None, "3000 bytes of 4000");
        let series: timeshard_proto::SeriesKey = "s.x".parse().unwrap();
        let len = timeshard_proto::QuantumLen::new(1_000_000_000).unwrap();
        let points = (0..50).map(|i| timeshard_proto::Point::new(i, 1.0)).collect();
        let block = BlockPoints { series, quantum: timeshard_proto::Quantum::at(0, len).unwrap(), points };
        limited.note_written(std::slice::from_ref(&block));
        let why = limited.refusal(&[]).expect("3000 + 50 x 24 bytes held of 4000");
        assert!(why.contains("holds 4200 bytes"), "{why}");
        limited.measure(&store);
        assert_eq!(limited.refusal(&[]), None, "a measure counts what reached the disk instead");
    }

    #[test]
    fn a_full_class_refuses_its_own_writes_only_and_an_evicting_one_never() {
        use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey};
        let dir = tempfile::tempdir().unwrap();
        let class = |name: &str, prefix: &str, on_full: OnFull, archive: bool| ClassConfig {
            name: name.into(),
            metric_prefix: prefix.into(),
            quota: Some(crate::config::ByteSize(64 << 10)),
            on_full,
            archive,
            ..ClassConfig::default()
        };
        let classes = vec![
            class("refusing", "r.", OnFull::Refuse, false),
            // Longer prefix, no quota: its series are not the refusing class's.
            ClassConfig { name: "free".into(), metric_prefix: "r.free".into(), ..ClassConfig::default() },
            class("archived", "a.", OnFull::EvictOldest, true),
            class("evicting", "e.", OnFull::EvictOldest, false),
        ];
        let rules = NodeConfig { classes: classes.clone(), ..NodeConfig::default() }.quota_rules();
        let store = DiskStore::open(dir.path(), DiskConfig { quotas: rules, ..DiskConfig::default() }).unwrap();
        let len = QuantumLen::new(1_000_000_000).unwrap();
        // Values that do not compress away.
        let noise = |x: i64| (x.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64) >> 40) as f64;
        let block = |metric: &str, i: i64| {
            let series: SeriesKey = metric.parse().unwrap();
            let points = (0..2000).map(|j| Point::new(i * 1_000_000_000 + j, noise(i * 1_000_003 + j))).collect();
            BlockPoints { series, quantum: Quantum::at(i * 1_000_000_000, len).unwrap(), points }
        };
        for i in 0..50 {
            let blocks: Vec<BlockPoints> = ["r.x", "r.free.x", "a.x", "e.x"].iter().map(|m| block(m, i)).collect();
            store.write(&blocks).unwrap();
        }
        store.maintain(100_000_000_000).unwrap();
        let usage = StoreUse::new(dir.path().to_path_buf(), None, &classes);
        assert!(usage.limited());
        assert_eq!(usage.refusal(&[block("r.x", 60)]), None, "nothing measured yet");
        usage.measure(&store);
        let why = usage
            .refusal(&[block("e.x", 60), block("r.x", 60)])
            .unwrap_or_else(|| panic!("the refusing class is full: {:?}", usage.classes()));
        assert!(why.contains("class \"refusing\"") && why.contains("quota of 65536"), "{why}");
        let why = usage.refusal(&[block("a.x", 60)]).expect("the archived class is full");
        assert!(why.contains("archive"), "{why}");
        assert_eq!(usage.refusal(&[block("r.free.x", 60)]), None, "a class without a quota under a longer prefix");
        assert_eq!(usage.refusal(&[block("e.x", 60)]), None, "the evicting class evicted instead");
        let evicting = usage.classes().into_iter().find(|c| c.class == "evicting").unwrap();
        assert!(evicting.store.evicted_blocks > 0 && !evicting.store.full(), "{evicting:?}");
        assert_eq!(usage.classes().len(), 3, "classes with a quota");

        // Between measures, what is written counts (24 bytes a point), and a write that would
        // take the class past its quota is refused before it is stored.
        let fresh = StoreUse::new(dir.path().to_path_buf(), None, &classes);
        assert_eq!(fresh.refusal(&[block("r.x", 60)]), None, "48,000 bytes of 65,536");
        fresh.note_written(&[block("r.x", 60), block("e.x", 60)]);
        let small = |i| BlockPoints { points: block("r.x", i).points[..500].to_vec(), ..block("r.x", i) };
        assert_eq!(fresh.refusal(&[small(61)]), None, "12,000 more: 60,000 of 65,536");
        let why = fresh.refusal(&[block("r.x", 61)]).expect("48,000 more would pass 65,536");
        assert!(why.contains("holds 48000 bytes") && why.contains("would pass its quota of 65536"), "{why}");
        let split = [small(61), small(62), small(63), small(64)];
        assert!(fresh.refusal(&split).is_some(), "the blocks of one write count together");
        assert_eq!(fresh.refusal(&[block("e.x", 61)]), None, "an evicting class never refuses");
        // An archived class fills to its quota (its early export starts at 80 %), then refuses.
        fresh.note_written(&[block("a.x", 60)]);
        assert_eq!(fresh.refusal(&[block("a.x", 61)]), None, "48,000 held: taken although it passes");
        fresh.note_written(&[block("a.x", 61)]);
        let why = fresh.refusal(&[block("a.x", 62)]).expect("96,000 held of 65,536");
        assert!(why.contains("class \"archived\" holds 96000"), "{why}");
        fresh.note_written(&[small(61)]);
        fresh.note_written(&[small(62)]);
        assert!(fresh.refusal(&[small(63)]).is_some_and(|why| why.contains("holds 72000 bytes")));
        fresh.measure(&store);
        assert!(fresh.refusal(&[small(63)]).is_some(), "the store's measure: still full");
    }

    #[test]
    fn low_disk_is_a_problem_with_how_full_and_what_is_left() {
        let gib = 1u64 << 30;
        assert_eq!(DiskSpace { size: 10 * gib, available: 2 * gib }.problem(), None);
        assert_eq!(
            DiskSpace { size: 10 * gib, available: gib / 2 }.problem(),
            Some("disk 95% full: 512 MiB left for the data directory".into())
        );
        assert_eq!(DiskSpace { size: 0, available: 0 }.problem(), None, "a filesystem that reports no size");
    }

    #[test]
    fn the_data_directory_filesystem_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let space = DiskSpace::of(dir.path()).expect("statvfs of a temporary directory");
        assert!(space.size > 0 && space.available <= space.size, "{space:?}");
        assert_eq!(DiskSpace::of(&dir.path().join("missing")), None);
    }
}

//! The catalog: which blocks the archive holds, where, and their summaries, as the committed
//! manifests say. Loaded lazily per (class, day, series), cached with bounds, and refreshed by
//! listing the manifests (at most every `listing_ttl`, at once after an export of this process).
//!
//! Every node writes in its own folder, so a listing is one listing of the archive's top (which
//! node folders exist, kept for a listing TTL) and one of the class's (or partition's)
//! manifests in each folder, a few at a time; plus the legacy layout's when the top holds one
//! and the handle reads it. The node's own folder is always listed (its export numbers come
//! from it); a folder another node made since the top was listed shows a TTL later at most,
//! which only delays a confirmation or costs a duplicate part that reads drop. Manifests whose
//! seal does not check are refused: logged and
//! counted once, remembered, and left out of every answer, so the rest stays readable.
//!
//! # Implementation notes
//!
//! A block may have several parts: its first export, then a part per export of late data that
//! held the points not yet archived (FORMAT.md, "Late data"). Each part records `base`, the
//! digest of the archived points it was diffed against. Parts are known to be disjoint when they
//! form a chain: starting from 0, each part's base is the sum of the digests before it. Then
//! the block's summary is the merge of the parts' summaries; otherwise (two exporters raced on
//! one block) reads merge the parts' points and drop duplicates, and aggregates read points.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path;
use timeshard_proto::{Quantum, SeriesKey};
use timeshard_store::Summary;
use tokio::time::Instant;

use crate::cache::Lru;
use crate::error::Error;
use crate::layout::{self, Day, FileId, Kind, Owner};
use crate::manifest::Manifest;
use crate::read::{DictionaryCache, ParquetFile};
use crate::seal::Keys;

/// Node folders listed at most; more are left out with a warning (a bucket where nodes cannot
/// make folders of other names never gets near it).
pub const MAX_NODE_FOLDERS: usize = 4096;
/// Folders listed at once.
const LIST_CONCURRENCY: usize = 8;
/// Refused manifests remembered (each is refused once, then skipped without reading).
const MAX_REFUSED_KEPT: usize = 4096;
/// Refusals whose reason is kept for status.
const REFUSALS_SHOWN: usize = 16;

/// The rows of one block in one points file.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// The export whose points file holds the rows.
    pub file: Arc<FileId>,
    /// First row in that file; the part is `summary.count` rows long.
    pub row_start: u64,
    pub summary: Summary,
    /// Digest of the hot block this part's export made the archive hold in full.
    pub covers: u64,
    /// Digest of the archived points this part was diffed against.
    pub base: u64,
    /// When its points were last written, as its export's manifest says (what retention by
    /// write time ages the part from).
    pub written_ns: i64,
}

/// One archived block: its quantum and parts, in commit order where known.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchivedBlock {
    pub quantum: Quantum,
    pub parts: Vec<Part>,
}

impl ArchivedBlock {
    /// The digest of the block's archived points when its parts are known to be disjoint
    /// (they chain, see the module docs); `None` when two parts may hold the same points.
    pub fn chain_digest(&self) -> Option<u64> {
        let mut rest: Vec<&Part> = self.parts.iter().filter(|p| p.summary.count > 0).collect();
        let mut sum = 0u64;
        while !rest.is_empty() {
            let mut next = rest.iter().enumerate().filter(|(_, p)| p.base == sum);
            let (i, p) = next.next()?;
            if next.next().is_some() {
                return None;
            }
            sum = sum.wrapping_add(p.summary.digest);
            rest.swap_remove(i);
        }
        Some(sum)
    }

    /// The summary of the block's archived points, when the parts are disjoint and hold any.
    pub fn summary(&self) -> Option<Summary> {
        self.chain_digest()?;
        self.parts.iter().filter(|p| p.summary.count > 0).map(|p| p.summary).reduce(|a, b| a.merge(&b))
    }

    /// Points the parts hold, duplicates across parts counted twice.
    pub fn rows(&self) -> u64 {
        self.parts.iter().map(|p| p.summary.count).sum()
    }

    /// Whether the archive holds every point of a hot block with digest `digest`.
    pub fn covers(&self, digest: u64) -> bool {
        self.parts.iter().any(|p| p.covers == digest) || self.chain_digest() == Some(digest)
    }
}

/// Bounds of the catalog's caches.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// How old a class's listing of manifests may be before a query lists again.
    pub listing_ttl: Duration,
    /// Block parts kept in memory (about 150 bytes each).
    pub max_parts: usize,
    /// Opened files (footer and page index) kept in memory.
    pub max_files: usize,
    /// Bytes of decompressed dictionary pages kept for the next read of their row group.
    pub max_dictionary_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            listing_ttl: Duration::from_secs(10),
            max_parts: 250_000,
            max_files: 256,
            max_dictionary_bytes: 16 << 20,
        }
    }
}

struct Listing {
    at: Instant,
    /// Committed manifests per day, sorted.
    days: BTreeMap<Day, Vec<FileId>>,
}

#[derive(Debug)]
struct DayBlocks {
    manifests: Vec<FileId>,
    blocks: Arc<Vec<ArchivedBlock>>,
}

type BlockKey = (String, Day, SeriesKey);

struct State {
    listings: HashMap<String, Listing>,
    blocks: Lru<BlockKey, Arc<DayBlocks>>,
    manifests: Lru<FileId, Arc<Manifest>>,
    points: Lru<FileId, Arc<ParquetFile>>,
}

/// The archive's top as last listed: node folders, and whether a legacy layout is there.
struct Top {
    at: Instant,
    nodes: Vec<String>,
    legacy: bool,
}

#[derive(Default)]
struct Refusals {
    files: HashMap<FileId, String>,
    total: u64,
    recent: std::collections::VecDeque<(String, String)>,
}

pub(crate) struct Catalog {
    store: Arc<dyn ObjectStore>,
    config: CacheConfig,
    keys: Option<Arc<Keys>>,
    read_legacy: bool,
    /// This node's folder: always listed, even before a listing of the top shows it (its
    /// export numbers are taken from it).
    me: String,
    state: Mutex<State>,
    top: Mutex<Option<Top>>,
    refusals: Mutex<Refusals>,
    dictionaries: Arc<DictionaryCache>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Catalog {
    pub fn new(store: Arc<dyn ObjectStore>, archive: &crate::Config) -> Catalog {
        let config = archive.cache.clone();
        let state = State {
            listings: HashMap::new(),
            blocks: Lru::new(config.max_parts),
            manifests: Lru::new(config.max_files),
            points: Lru::new(config.max_files),
        };
        let dictionaries = Arc::new(DictionaryCache::new(config.max_dictionary_bytes));
        Catalog {
            store,
            config,
            keys: archive.keys.clone(),
            read_legacy: archive.read_legacy,
            me: archive.node.clone(),
            state: Mutex::new(state),
            top: Mutex::new(None),
            refusals: Mutex::new(Refusals::default()),
            dictionaries,
        }
    }

    /// The folders to list: every node's, and the legacy layout's when there is one and it is
    /// read. The top is listed again when its listing is older than the TTL.
    async fn owners(&self) -> Result<Vec<Option<String>>, Error> {
        let fresh = |t: &Option<Top>| t.as_ref().is_some_and(|t| t.at.elapsed() < self.config.listing_ttl);
        if !fresh(&self.top.lock().unwrap_or_else(|e| e.into_inner())) {
            let listed =
                self.store.list_with_delimiter(None).await.map_err(Error::store("list", "the archive's top"))?;
            let mut nodes: Vec<String> = listed.common_prefixes.iter().filter_map(layout::parse_node_prefix).collect();
            nodes.sort();
            if nodes.len() > MAX_NODE_FOLDERS {
                tracing::warn!(
                    folders = nodes.len(),
                    max = MAX_NODE_FOLDERS,
                    "the archive holds more node folders than are read; the rest are left out"
                );
                nodes.truncate(MAX_NODE_FOLDERS);
            }
            let legacy = listed.common_prefixes.iter().any(|p| p.as_ref() == layout::MANIFESTS_DIR);
            *self.top.lock().unwrap_or_else(|e| e.into_inner()) = Some(Top { at: Instant::now(), nodes, legacy });
        }
        let top = self.top.lock().unwrap_or_else(|e| e.into_inner());
        let top = top.as_ref().expect("listed above");
        let mut owners: Vec<Option<String>> = top.nodes.iter().cloned().map(Some).collect();
        if top.nodes.binary_search(&self.me).is_err() {
            owners.push(Some(self.me.clone()));
        }
        if top.legacy && self.read_legacy {
            owners.push(None);
        }
        Ok(owners)
    }

    /// Records that `id` was refused (once per file), and logs it.
    fn refuse(&self, id: &FileId, error: &Error) {
        let mut r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if r.files.contains_key(id) {
            return;
        }
        tracing::warn!(file = %id.path(Kind::Manifest), error = %error, "archive manifest refused");
        if r.files.len() >= MAX_REFUSED_KEPT {
            r.files.clear();
        }
        r.files.insert(id.clone(), error.to_string());
        r.total += 1;
        if r.recent.len() == REFUSALS_SHOWN {
            r.recent.pop_front();
        }
        let reason = match error {
            Error::Refused { reason, .. } => reason.clone(),
            other => other.to_string(),
        };
        r.recent.push_back((id.path(Kind::Manifest).to_string(), reason));
    }

    fn is_refused(&self, id: &FileId) -> bool {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).files.contains_key(id)
    }

    /// Manifests refused so far, and the last few with their reasons.
    pub fn refused(&self) -> (u64, Vec<(String, String)>) {
        let r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        (r.total, r.recent.iter().cloned().collect())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every listing, so the next query lists the manifests again.
    pub fn refresh(&self) {
        self.state().listings.clear();
    }

    /// The committed manifests of `class` on the days `from..=to`, listing the class again when
    /// the cached listing is older than the TTL. When listing fails, an earlier listing is used
    /// (and listing is tried again only a TTL later), so an unreachable store slows no query
    /// more than once per TTL; only a class never listed fails.
    pub async fn manifests(&self, class: &str, from: Day, to: Day) -> Result<Vec<(Day, Vec<FileId>)>, Error> {
        let fresh = |s: &State| s.listings.get(class).is_some_and(|l| l.at.elapsed() < self.config.listing_ttl);
        if !fresh(&self.state()) {
            match self.list(class, None).await {
                Ok(days) => {
                    self.state().listings.insert(class.to_string(), Listing { at: Instant::now(), days });
                }
                Err(e) => {
                    let mut state = self.state();
                    let Some(stale) = state.listings.get_mut(class) else { return Err(e) };
                    tracing::warn!(class, error = %e, "listing the archive failed; using the previous listing");
                    stale.at = Instant::now();
                }
            }
        }
        let state = self.state();
        let Some(listing) = state.listings.get(class) else { return Ok(Vec::new()) };
        Ok(listing.days.range(from..=to).map(|(d, ids)| (*d, ids.clone())).collect())
    }

    /// The committed manifests of one partition, listed now (what an exporter bases its
    /// sequence number and diffs on); updates the cached listing.
    pub async fn manifests_now(&self, class: &str, day: Day) -> Result<Vec<FileId>, Error> {
        let days = self.list(class, Some(day)).await?;
        let ids = days.get(&day).cloned().unwrap_or_default();
        if let Some(l) = self.state().listings.get_mut(class) {
            l.days.insert(day, ids.clone());
        }
        Ok(ids)
    }

    /// The committed manifests of `class` (of one day, or all), in every folder read.
    async fn list(&self, class: &str, day: Option<Day>) -> Result<BTreeMap<Day, Vec<FileId>>, Error> {
        let prefixes: Vec<Path> = self
            .owners()
            .await?
            .iter()
            .map(|o| {
                let owner = o.as_deref().map_or(Owner::Legacy, Owner::Node);
                match day {
                    Some(d) => FileId::partition(owner, Kind::Manifest, class, d),
                    None => FileId::class_prefix(owner, Kind::Manifest, class),
                }
            })
            .collect();
        let listings: Vec<Vec<object_store::ObjectMeta>> = futures::stream::iter(prefixes)
            .map(|prefix| async move {
                self.store.list(Some(&prefix)).try_collect().await.map_err(Error::store("list", &prefix))
            })
            .buffer_unordered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        let mut days: BTreeMap<Day, Vec<FileId>> = BTreeMap::new();
        for m in listings.into_iter().flatten() {
            if let Some((id, Kind::Manifest)) = FileId::parse(&m.location)
                && (self.read_legacy || !id.legacy)
            {
                days.entry(id.day).or_default().push(id);
            }
        }
        days.values_mut().for_each(|v| v.sort());
        Ok(days)
    }

    /// Lists the manifests of `class` now and replaces the cached listing (kept on failure).
    pub async fn relist(&self, class: &str) -> Result<(), Error> {
        let days = self.list(class, None).await?;
        self.state().listings.insert(class.to_string(), Listing { at: Instant::now(), days });
        Ok(())
    }

    /// The newest day holding committed manifests of `class` as last listed (`Some(None)`:
    /// none), and the listing's age; `None` when the class was never listed. No I/O.
    pub fn newest_day(&self, class: &str) -> Option<(Option<Day>, Duration)> {
        let state = self.state();
        let l = state.listings.get(class)?;
        Some((l.days.keys().next_back().copied(), l.at.elapsed()))
    }

    /// Forgets a manifest this process just removed (expiry), and its opened files.
    pub fn note_removed(&self, id: &FileId) {
        let mut state = self.state();
        if let Some(l) = state.listings.get_mut(&id.class)
            && let Some(ids) = l.days.get_mut(&id.day)
        {
            ids.retain(|x| x != id);
            if ids.is_empty() {
                l.days.remove(&id.day);
            }
        }
        state.manifests.retain(|k| k != id);
        state.points.retain(|k| k != id);
    }

    /// Records a manifest this process just committed, so queries see it without listing.
    pub fn note_committed(&self, id: &FileId) {
        let mut state = self.state();
        if let Some(l) = state.listings.get_mut(&id.class) {
            let ids = l.days.entry(id.day).or_default();
            if let Err(at) = ids.binary_search(id) {
                ids.insert(at, id.clone());
            }
        }
    }

    /// The archived blocks of `series` in partition (`class`, `day`) whose manifests are
    /// `manifests`, sorted by quantum.
    pub async fn blocks(
        &self,
        class: &str,
        day: Day,
        series: &SeriesKey,
        manifests: &[FileId],
    ) -> Result<Arc<Vec<ArchivedBlock>>, Error> {
        let key = (class.to_string(), day, series.clone());
        let cached = self.state().blocks.get(&key);
        if let Some(hit) = &cached
            && hit.manifests == manifests
        {
            return Ok(Arc::clone(&hit.blocks));
        }
        // Every export round of every node adds a manifest to the day, so a day's list mostly
        // grows: decode only what it added to the list the cache was built from (decoding the
        // whole day again at every new manifest made lookups quadratic in the day's exports).
        let position: BTreeMap<&FileId, usize> = manifests.iter().enumerate().map(|(i, id)| (id, i)).collect();
        let (mut by_quantum, added): (BTreeMap<i64, ArchivedBlock>, Vec<&FileId>) = match &cached {
            Some(hit) if hit.manifests.iter().all(|id| position.contains_key(id)) => {
                let known: BTreeSet<&FileId> = hit.manifests.iter().collect();
                let blocks = hit.blocks.iter().map(|b| (b.quantum.start, b.clone())).collect();
                (blocks, manifests.iter().filter(|id| !known.contains(id)).collect())
            }
            _ => (BTreeMap::new(), manifests.iter().collect()),
        };
        for id in added {
            if self.is_refused(id) {
                continue;
            }
            let opened = match self.manifest(id).await {
                Ok(m) => m.entries(&*self.store, Some(series)).await.map(|e| (m, e)),
                Err(e) => Err(e),
            };
            let (manifest, entries) = match opened {
                Ok(got) => got,
                Err(e @ Error::Refused { .. }) => {
                    self.refuse(id, &e);
                    self.forget(id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let file = Arc::new(id.clone());
            for e in entries {
                let part = Part {
                    file: Arc::clone(&file),
                    row_start: e.row_start,
                    summary: e.summary,
                    covers: e.covers,
                    base: e.base,
                    written_ns: manifest.header.written(),
                };
                by_quantum
                    .entry(e.quantum.start)
                    .or_insert_with(|| ArchivedBlock { quantum: e.quantum, parts: Vec::new() })
                    .parts
                    .push(part);
            }
        }
        // Parts in the order of the list, as a decoding of the whole list gives them (a
        // block's chain digest reads them in commit order).
        for block in by_quantum.values_mut() {
            block.parts.sort_by_key(|p| position.get(&*p.file).copied().unwrap_or(usize::MAX));
        }
        let blocks: Arc<Vec<ArchivedBlock>> = Arc::new(by_quantum.into_values().collect());
        let weight = 1 + blocks.iter().map(|b| b.parts.len()).sum::<usize>();
        let entry = Arc::new(DayBlocks { manifests: manifests.to_vec(), blocks: Arc::clone(&blocks) });
        self.state().blocks.insert(key, entry, weight);
        Ok(blocks)
    }

    /// The manifest of `id`, opened once.
    pub async fn manifest(&self, id: &FileId) -> Result<Arc<Manifest>, Error> {
        if let Some(m) = self.state().manifests.get(id) {
            return Ok(m);
        }
        let m = Arc::new(Manifest::open(&*self.store, id, self.keys.as_deref()).await?);
        self.state().manifests.insert(id.clone(), Arc::clone(&m), 1);
        Ok(m)
    }

    /// The points file of `id`, opened once, checked against its manifest's size and rows.
    pub async fn points(&self, id: &FileId) -> Result<Arc<ParquetFile>, Error> {
        if let Some(f) = self.state().points.get(id) {
            return Ok(f);
        }
        let manifest = self.manifest(id).await?;
        let file = ParquetFile::open(&*self.store, &id.path(Kind::Points)).await?;
        let h = &manifest.header;
        if file.size != h.points_bytes || file.rows() != h.points_rows {
            return Err(Error::corrupt(
                &file.path,
                format!(
                    "{} bytes and {} rows, but its manifest says {} bytes and {} rows",
                    file.size,
                    file.rows(),
                    h.points_bytes,
                    h.points_rows
                ),
            ));
        }
        let file = Arc::new(file.with_dictionary_cache(Arc::clone(&self.dictionaries)));
        self.state().points.insert(id.clone(), Arc::clone(&file), 1);
        Ok(file)
    }

    /// Forgets cached opened files of `id` (after it was rewritten).
    pub fn forget(&self, id: &FileId) {
        let mut state = self.state();
        state.manifests.retain(|k| k != id);
        state.points.retain(|k| k != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use timeshard_proto::{Point, QuantumLen};

    fn part(points: &[Point], base: u64, covers: u64) -> Part {
        let file = Arc::new(FileId { class: "c".into(), day: Day(0), node: "n".into(), seq: 1, legacy: false });
        let summary = Summary::of(points).unwrap_or_else(crate::manifest::empty_summary);
        Part { file, row_start: 0, summary, covers, base, written_ns: 0 }
    }

    fn digest(points: &[Point]) -> u64 {
        timeshard_proto::point::set_digest(points)
    }

    #[test]
    fn chained_parts_merge_and_racing_parts_do_not() {
        let q = QuantumLen::DEFAULT.quantum_of(0);
        let a: Vec<Point> = (0..5).map(|t| Point::new(t, t as f64)).collect();
        let b: Vec<Point> = (5..8).map(|t| Point::new(t, t as f64)).collect();
        let all: Vec<Point> = a.iter().chain(&b).copied().collect();
        // First export, then late data diffed against it: a chain.
        let block =
            ArchivedBlock { quantum: q, parts: vec![part(&b, digest(&a), digest(&all)), part(&a, 0, digest(&a))] };
        assert_eq!(block.chain_digest(), Some(digest(&all)));
        assert_eq!(block.summary(), Summary::of(&all));
        assert!(block.covers(digest(&all)) && block.covers(digest(&a)) && !block.covers(digest(&b)));
        // Two first exports of the same points (a race): not disjoint, no summary.
        let raced = ArchivedBlock { quantum: q, parts: vec![part(&a, 0, digest(&a)), part(&a, 0, digest(&a))] };
        assert_eq!(raced.chain_digest(), None);
        assert_eq!(raced.summary(), None);
        assert!(raced.covers(digest(&a)));
        // A part that only records coverage (no rows) does not break the chain.
        let cover_only = ArchivedBlock { quantum: q, parts: vec![part(&a, 0, digest(&a)), part(&[], digest(&a), 77)] };
        assert_eq!(cover_only.chain_digest(), Some(digest(&a)));
        assert!(cover_only.covers(77));
    }

    proptest! {
        /// However late data is split into successive diffed exports, in whatever order their
        /// parts are listed, the chain's digest and summary are those of all the points.
        #[test]
        fn any_export_history_chains(
            ts in proptest::collection::btree_set(0i64..10_000, 1..200),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
            order in any::<prop::sample::Index>(),
        ) {
            let points: Vec<Point> = ts.iter().map(|&t| Point::new(t, (t % 13) as f64)).collect();
            let mut bounds: Vec<usize> = cuts.iter().map(|i| i.index(points.len())).collect();
            bounds.push(0);
            bounds.push(points.len());
            bounds.sort_unstable();
            bounds.dedup();
            // Export k holds a slice of the points (not contiguous in time in general: take every
            // point whose rank falls in the slice after a fixed shuffle), diffed against exports before.
            let mut shuffled = points.clone();
            shuffled.sort_by_key(|p| (p.ts * 7919) % 10_007);
            let mut parts = Vec::new();
            let mut archived = 0u64;
            for w in bounds.windows(2) {
                let mut slice = shuffled[w[0]..w[1]].to_vec();
                slice.sort();
                let covers = archived.wrapping_add(digest(&slice));
                parts.push(part(&slice, archived, covers));
                archived = covers;
            }
            let n = parts.len();
            parts.rotate_left(order.index(n));
            let block = ArchivedBlock { quantum: QuantumLen::DEFAULT.quantum_of(0), parts };
            prop_assert_eq!(block.chain_digest(), Some(digest(&points)));
            let s = block.summary().unwrap();
            let all = Summary::of(&points).unwrap();
            prop_assert_eq!((s.count, s.min, s.max, s.first, s.last, s.digest), (all.count, all.min, all.max, all.first, all.last, all.digest));
            prop_assert!(block.covers(digest(&points)));
        }
    }
}

//! Upkeep of the archive: what it holds (for `timeshard archive status`), and removing this
//! node's points files that no manifest committed (left by interrupted exports) once they are
//! old enough that no export can still be writing them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path as FsPath;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::Archive;
use crate::error::Error;
use crate::layout::{FileId, Kind};

/// The last export of this handle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LastExport {
    pub started_ns: i64,
    pub finished_ns: i64,
    pub class: String,
    /// Files committed, rows and bytes written, blocks confirmed, attempts retried.
    pub files: usize,
    pub rows: u64,
    pub bytes: u64,
    pub confirmed: usize,
    pub retries: u32,
    /// Why it stopped, if it failed.
    pub error: Option<String>,
}

/// What the archive holds of one class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClassStatus {
    pub class: String,
    /// Days with committed exports, and the first and last of them (`YYYY-MM-DD`).
    pub days: usize,
    pub first_day: Option<String>,
    pub last_day: Option<String>,
    /// Committed exports (manifests) and the bytes of their points files and manifests.
    pub exports: usize,
    pub points_bytes: u64,
    pub manifest_bytes: u64,
}

/// The archive as a listing shows it, plus this handle's last export.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveStatus {
    pub classes: Vec<ClassStatus>,
    /// Points files without a manifest: exports in progress or interrupted (never read;
    /// [`Archive::cleanup`] removes them after a grace age).
    pub uncommitted: Vec<String>,
    /// Manifests whose points file is missing (damage: their blocks cannot be read).
    pub dangling: Vec<String>,
    /// Committed exports in the legacy layout (before node folders: unsealed, read as
    /// unverified while `read_legacy` is on).
    pub legacy_exports: usize,
    /// Manifests this handle refused (their seal did not check), and the last few with why.
    pub refused_manifests: u64,
    pub refused: Vec<(String, String)>,
    pub last_export: Option<LastExport>,
}

/// What [`Archive::cleanup`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    /// Objects (and, for a local archive, leftover upload files) removed.
    pub removed: Vec<String>,
    /// Uncommitted points files younger than the grace age, left alone.
    pub young: usize,
}

struct Listed {
    committed: BTreeMap<FileId, u64>,
    points: BTreeMap<FileId, (u64, Option<SystemTime>)>,
}

impl Archive {
    async fn list_all(&self) -> Result<Listed, Error> {
        let mut listed = Listed { committed: BTreeMap::new(), points: BTreeMap::new() };
        {
            let metas: Vec<_> =
                self.store().list(None).try_collect().await.map_err(Error::store("list", "the archive"))?;
            for m in metas {
                match FileId::parse(&m.location) {
                    Some((id, Kind::Manifest)) => {
                        listed.committed.insert(id, m.size);
                    }
                    Some((id, Kind::Points)) => {
                        let modified = u64::try_from(m.last_modified.timestamp_millis())
                            .ok()
                            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
                        listed.points.insert(id, (m.size, modified));
                    }
                    None => {}
                }
            }
        }
        Ok(listed)
    }

    /// What the archive holds per class, its uncommitted and dangling files, and the last
    /// export of this handle (with its error, if it failed). Lists the whole archive.
    pub async fn status(&self) -> Result<ArchiveStatus, Error> {
        let listed = self.list_all().await?;
        let mut classes: BTreeMap<&str, (BTreeSet<crate::Day>, ClassStatus)> = BTreeMap::new();
        let mut dangling = Vec::new();
        for (id, manifest_bytes) in &listed.committed {
            let (days, c) = classes.entry(&id.class).or_default();
            days.insert(id.day);
            c.exports += 1;
            c.manifest_bytes += manifest_bytes;
            match listed.points.get(id) {
                Some((bytes, _)) => c.points_bytes += bytes,
                None => dangling.push(id.path(Kind::Points).to_string()),
            }
        }
        let classes = classes
            .into_iter()
            .map(|(name, (days, mut c))| {
                c.class = name.to_string();
                c.days = days.len();
                c.first_day = days.first().map(ToString::to_string);
                c.last_day = days.last().map(ToString::to_string);
                c
            })
            .collect();
        let uncommitted = listed
            .points
            .keys()
            .filter(|id| !listed.committed.contains_key(*id))
            .map(|id| id.path(Kind::Points).to_string())
            .collect();
        let last_export = self.inner.last_export.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let legacy_exports = listed.committed.keys().filter(|id| id.legacy).count();
        let (refused_manifests, refused) = self.refused();
        Ok(ArchiveStatus { classes, uncommitted, dangling, legacy_exports, refused_manifests, refused, last_export })
    }

    /// Removes this node's points files that no manifest commits and that were last written more than
    /// `grace` ago (choose it far longer than an export takes: a day is safe), and for a local
    /// archive, files of uploads interrupted as long ago. Committed files are never touched.
    pub async fn cleanup(&self, grace: Duration) -> Result<CleanupReport, Error> {
        let _no_export_meanwhile = self.inner.export_lock.lock().await;
        let listed = self.list_all().await?;
        let now = SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(timeshard_clock::now_ns()).unwrap_or(0));
        let old = |t: Option<SystemTime>| t.is_none_or(|t| now.duration_since(t).unwrap_or_default() >= grace);
        let mut report = CleanupReport::default();
        for (id, (_, modified)) in &listed.points {
            if listed.committed.contains_key(id) || id.node != self.inner.config.node {
                continue;
            }
            if !old(*modified) {
                report.young += 1;
                continue;
            }
            let path = id.path(Kind::Points);
            match self.store().delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => report.removed.push(path.to_string()),
                Err(e) => return Err(Error::store("delete", &path)(e)),
            }
        }
        if let Some(root) = &self.inner.local_root {
            // This node's folder and the legacy layout's (files it was writing before folders).
            let own = crate::layout::node_prefix(&self.inner.config.node);
            for dir in [own.as_ref(), crate::layout::POINTS_DIR, crate::layout::MANIFESTS_DIR] {
                remove_interrupted_uploads(&root.join(dir), &|t| old(Some(t)), &mut report.removed);
            }
        }
        Ok(report)
    }
}

/// The local store writes an upload to `<name>#<n>` and renames it when complete; a crash
/// leaves such files behind, invisible to listings.
fn remove_interrupted_uploads(dir: &FsPath, old: &dyn Fn(SystemTime) -> bool, removed: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            remove_interrupted_uploads(&path, old, removed);
            continue;
        }
        let name = entry.file_name();
        let staged = name
            .to_str()
            .and_then(|n| n.rsplit_once('#'))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if staged && meta.modified().is_ok_and(old) && std::fs::remove_file(&path).is_ok() {
            removed.push(path.display().to_string());
        }
    }
}

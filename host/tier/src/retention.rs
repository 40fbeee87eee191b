//! Retention of the archive: points past their class's retention are hidden from queries at
//! once, and the files holding them are removed once every point in them is past it.
//!
//! # Implementation notes
//!
//! - Age. By event time a block ages from its quantum's end, as in the hot store; by write time
//!   a part ages from its export's `written_ns` (the newest hot write time among the file's
//!   blocks), so a part is never hidden before its block's last write plus the retention.
//! - Hiding is per block (event time) or per part (write time): queries filter what the
//!   catalog lists ([`Archive::live_blocks`]), so a file half past retention answers only for
//!   the half inside it.
//! - Removal is per file, never a rewrite: a file goes when its newest point is past retention
//!   (by event time, when its whole day partition is; by write time, when its `written_ns` is).
//!   Files are immutable, so the archive is never rewritten to trim them; a file half past
//!   retention stays until its other half expires too, hidden meanwhile.
//! - Whose files: a node removes only its own (its folder, and legacy files named after it);
//!   another node's files are hidden when past retention, never removed here, so a node's
//!   credentials need delete rights on its own folder only. Files of a node that is gone stay
//!   (hidden) until an operator removes its folder or a bucket lifecycle rule expires them.
//! - Order: the manifest first, then the points file. The manifest is the commit marker: once
//!   it is gone no reader lists the file, and a crash before the points file goes leaves an
//!   uncommitted file, which [`Archive::cleanup`] removes. Removal takes the export lock, so
//!   no export of this handle diffs against a part being removed.
//! - Readers with a cached listing may still name a removed manifest for a listing TTL; they
//!   only open files of parts they query, and they hide expired parts themselves, so a caller
//!   passes a `now` a listing TTL (and any clock skew between nodes) behind the wall clock.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use serde::Serialize;
use timeshard_clock::now_ns;
use timeshard_proto::tier::expired;
use timeshard_proto::{AgeBy, SeriesClass, Timestamp};

use crate::Archive;
use crate::catalog::ArchivedBlock;
use crate::error::Error;
use crate::layout::{self, DAY_NS, Day, FileId, Kind, Owner};
use crate::retry::retry;

/// How long a class's points are kept, measured by event or write time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub keep_ns: i64,
    pub age_by: AgeBy,
}

/// Files removed per call of [`Archive::expire`] at most (the rest go at the next call).
const MAX_FILES_PER_CALL: usize = 1000;

/// Write times of exports kept at most (see [`Archive::expire`]).
const MAX_WRITTEN_KEPT: usize = 1 << 20;

/// What [`Archive::expire`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExpireReport {
    /// Exports whose manifest and points file were removed.
    pub removed: Vec<String>,
    /// More files were due than one call removes.
    pub more: bool,
}

impl ArchivedBlock {
    /// What of the block `retention` still keeps at `now`; `None` when nothing.
    pub fn live(&self, retention: &Retention, now: Timestamp) -> Option<ArchivedBlock> {
        let keep = retention.keep_ns;
        match retention.age_by {
            AgeBy::Event => (!expired(AgeBy::Event, self.quantum, 0, keep, now)).then(|| self.clone()),
            AgeBy::Write => {
                let parts: Vec<_> = self
                    .parts
                    .iter()
                    .filter(|p| !expired(AgeBy::Write, self.quantum, p.written_ns, keep, now))
                    .cloned()
                    .collect();
                (!parts.is_empty()).then_some(ArchivedBlock { quantum: self.quantum, parts })
            }
        }
    }

    /// Whether `retention` keeps all of the block at `now`.
    fn all_live(&self, retention: &Retention, now: Timestamp) -> bool {
        match retention.age_by {
            AgeBy::Event => !expired(AgeBy::Event, self.quantum, 0, retention.keep_ns, now),
            AgeBy::Write => {
                self.parts.iter().all(|p| !expired(AgeBy::Write, self.quantum, p.written_ns, retention.keep_ns, now))
            }
        }
    }
}

impl Archive {
    /// Sets the retention of `class` (`None`: keep forever): queries of this handle hide what
    /// it expired at once; [`Archive::expire`] removes the files.
    pub fn set_retention(&self, class: &str, retention: Option<Retention>) {
        let mut all = self.inner.retention.lock().unwrap_or_else(|e| e.into_inner());
        match retention {
            Some(r) => all.insert(class.to_string(), r),
            None => all.remove(class),
        };
    }

    /// The retention of `class`, if it has one.
    pub fn retention(&self, class: &str) -> Option<Retention> {
        self.inner.retention.lock().unwrap_or_else(|e| e.into_inner()).get(class).copied()
    }

    /// `blocks` of `class` less what its retention expired by now (the same list when nothing).
    pub(crate) fn live_blocks(&self, class: &str, blocks: Arc<Vec<ArchivedBlock>>) -> Arc<Vec<ArchivedBlock>> {
        let Some(r) = self.retention(class) else { return blocks };
        let now = now_ns();
        if blocks.iter().all(|b| b.all_live(&r, now)) {
            return blocks;
        }
        Arc::new(blocks.iter().filter_map(|b| b.live(&r, now)).collect())
    }

    /// Removes this node's exports of `class` whose every point `retention` expired by `now`
    /// (never another node's, see the module docs): each
    /// manifest first, then its points file (see the module docs). Pass a `now` at least a
    /// listing TTL behind the wall clock, so readers with a cached listing never open a removed
    /// file. Safe to repeat and to interrupt; at most 1000 files a call.
    pub async fn expire(
        &self,
        class: &SeriesClass,
        retention: Retention,
        now: Timestamp,
    ) -> Result<ExpireReport, Error> {
        layout::check_class(&class.name)?;
        let _no_export_meanwhile = self.inner.export_lock.lock().await;
        let policy = &self.inner.config.retry;
        let me = self.inner.config.node.as_str();
        let mut listed = Vec::new();
        for owner in [Owner::Node(me), Owner::Legacy] {
            let prefix = FileId::class_prefix(owner, Kind::Manifest, &class.name);
            listed.extend(
                retry(policy, "listing manifests", || async {
                    self.store()
                        .list(Some(&prefix))
                        .try_collect::<Vec<_>>()
                        .await
                        .map_err(Error::store("list", &prefix))
                })
                .await?,
            );
        }
        // Per day, this node's manifests and when each was written (an upper bound of
        // `written_ns`).
        let mut days: BTreeMap<Day, Vec<(FileId, Timestamp)>> = BTreeMap::new();
        for m in listed {
            if let Some((id, Kind::Manifest)) = FileId::parse(&m.location)
                && id.node == me
            {
                let modified = m.last_modified.timestamp_nanos_opt().unwrap_or(i64::MAX);
                days.entry(id.day).or_default().push((id, modified));
            }
        }
        let keep = retention.keep_ns;
        let mut report = ExpireReport::default();
        for (day, ids) in days {
            // Every block of a partition starts within its day, so ends before the next day
            // plus one quantum.
            let day_end = (day.start() + DAY_NS).saturating_add(class.quantum.ns());
            if retention.age_by == AgeBy::Event && day_end.saturating_add(keep) > now {
                break;
            }
            for (id, modified) in ids {
                // The object was written after its points were: when even that is past
                // retention, the manifest need not be read.
                if retention.age_by == AgeBy::Write && modified.saturating_add(keep) > now {
                    let written = match self.written_of(&id) {
                        Some(w) => w,
                        None => {
                            let m = retry(policy, "reading a manifest", || self.inner.catalog.manifest(&id)).await?;
                            self.note_written(&id, m.header.written());
                            m.header.written()
                        }
                    };
                    if written.saturating_add(keep) > now {
                        continue;
                    }
                }
                if report.removed.len() == MAX_FILES_PER_CALL {
                    report.more = true;
                    return Ok(report);
                }
                self.remove_export(&id).await?;
                report.removed.push(id.to_string());
            }
        }
        if !report.removed.is_empty() {
            tracing::info!(class = %class.name, files = report.removed.len(), "expired archive files past retention");
        }
        Ok(report)
    }

    /// The write time of export `id` if known (exports never change, so it is kept).
    fn written_of(&self, id: &FileId) -> Option<Timestamp> {
        self.inner.written.lock().unwrap_or_else(|e| e.into_inner()).get(id).copied()
    }

    fn note_written(&self, id: &FileId, written: Timestamp) {
        let mut all = self.inner.written.lock().unwrap_or_else(|e| e.into_inner());
        // A few dozen bytes per export of a class aged by write time; bounded all the same.
        if all.len() >= MAX_WRITTEN_KEPT {
            all.clear();
        }
        all.insert(id.clone(), written);
    }

    /// Removes one export: its manifest (the commit marker) first, then its points file.
    async fn remove_export(&self, id: &FileId) -> Result<(), Error> {
        let policy = &self.inner.config.retry;
        for kind in [Kind::Manifest, Kind::Points] {
            let path = id.path(kind);
            retry(policy, "removing an expired file", || async {
                match self.store().delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(Error::store("delete", &path)(e)),
                }
            })
            .await?;
            if kind == Kind::Manifest {
                self.inner.catalog.note_removed(id);
                self.inner.written.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
            }
        }
        Ok(())
    }
}

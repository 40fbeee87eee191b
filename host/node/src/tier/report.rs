//! `timeshard archive status`: the archive as a listing shows it now, and this node's export
//! rounds (pending blocks, what it exported and dropped, its last error).

use std::collections::BTreeMap;

use timeshard_proto::tier::{ArchiveClassReport, ArchiveReport, MAX_LISTED_FILES};

use super::Tier;

fn listed(mut files: Vec<String>) -> (Vec<String>, u64) {
    let total = files.len() as u64;
    files.truncate(MAX_LISTED_FILES);
    (files, total)
}

impl Tier {
    /// What the node reports about the cold tier. Lists the whole archive.
    pub async fn report(&self) -> ArchiveReport {
        let policy = self.policy();
        let mut classes: BTreeMap<String, ArchiveClassReport> = BTreeMap::new();
        for class in policy.classes.iter() {
            let t = policy.tier(class);
            classes.insert(
                class.name.clone(),
                ArchiveClassReport {
                    class: class.name.clone(),
                    archive: t.archive,
                    hot_ns: t.hot_ns,
                    age_by: t.age_by.to_string(),
                    ..ArchiveClassReport::default()
                },
            );
        }
        let mut report = ArchiveReport { url: self.url.clone(), ..ArchiveReport::default() };
        if let Some(archive) = self.archive() {
            match archive.status().await {
                Ok(status) => {
                    for c in status.classes {
                        let r = classes.entry(c.class.clone()).or_insert_with(|| ArchiveClassReport {
                            class: c.class.clone(),
                            ..ArchiveClassReport::default()
                        });
                        r.days = c.days as u64;
                        r.first_day = c.first_day.unwrap_or_default();
                        r.last_day = c.last_day.unwrap_or_default();
                        r.exports = c.exports as u64;
                        r.points_bytes = c.points_bytes;
                        r.manifest_bytes = c.manifest_bytes;
                    }
                    (report.uncommitted, report.uncommitted_total) = listed(status.uncommitted);
                    (report.dangling, report.dangling_total) = listed(status.dangling);
                    report.legacy_exports = status.legacy_exports as u64;
                }
                Err(e) => report.listing_error = Some(e.to_string()),
            }
        }
        if let Some(archive) = self.archive() {
            let (count, recent) = archive.refused();
            report.refused_manifests = count;
            report.refused = recent.into_iter().map(|(path, why)| format!("{path}: {why}")).collect();
        }
        let progress = self.progress();
        for (name, c) in &progress.classes {
            let r = classes
                .entry(name.clone())
                .or_insert_with(|| ArchiveClassReport { class: name.clone(), ..ArchiveClassReport::default() });
            r.exported_files = c.exported_files;
            r.exported_blocks = c.exported_blocks;
            r.exported_rows = c.exported_rows;
            r.exported_bytes = c.exported_bytes;
            r.dropped_blocks = c.dropped_blocks;
            r.pending_blocks = c.pending_blocks;
            r.waiting_for_owner = c.waiting_for_owner;
            r.expired_blocks = c.expired_blocks;
            r.expired_files = c.expired_files;
        }
        report.last_round_ns = progress.last_round_ns;
        report.last_error = progress.last_error.clone();
        report.last_error_ns = progress.last_error_ns;
        report.failed_rounds = progress.failed_rounds;
        report.classes = classes.into_values().collect();
        report
    }
}

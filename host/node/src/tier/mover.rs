//! The export loop: every `[tier] interval`, blocks past their hot window leave the hot store.
//!
//! One round:
//! 1. walks the hot store's blocks (`Store::list_blocks`, a page at a time, from memory) and
//!    keeps, per archived class, the due ones of the earliest days (at most
//!    `max_blocks_per_round`: `timeshard_proto::tier::RoundPicker`); blocks expired by
//!    write-time retention are dropped;
//! 2. asks the archive which due blocks it holds, each by this replica's own digest, and drops
//!    those hot copies (`Store::drop_block` with that digest: a copy that changed meanwhile is
//!    kept, and goes again as late data);
//! 3. exports the rest of the blocks this node is first in line for (`export_rank`,
//!    `exports_now`: the first owner at once, the next ones after `takeover_after` each); the
//!    archive confirms them, and the next round drops them here, by which time every
//!    replica's listing can see the export;
//! 4. removes this node's own archive files past their class's retention (`expire_archive`):
//!    each node deletes only in its own folder of the archive.
//!
//! Blocks past retention are never exported. Blocks of classes aged by write time age from
//! their durable write times ([`super::writes`]), whose records of blocks gone from the hot
//! store each walk forgets.
//!
//! A round that fails (the archive unreachable, failing, or corrupt) changes nothing hot: the
//! error is kept for `timeshard archive status`, and the next round waits twice as long, up to
//! `max_backoff`. The archive's own operations are retried with backoff inside each round too.
//! Uploads are rate-limited and stream one row group at a time (`[tier] row_group_rows`).
//! Points files that interrupted exports left behind are cleaned up about once an hour.
//!
//! A class with a quota past [`EARLY_EXPORT_PERCENT`] of it exports its sealed blocks without
//! waiting for its hot window (oldest days first), and drops them once archived: that is how
//! an archived class stays within its quota. While the archive cannot take them nothing is
//! dropped, and the replicas refuse the class's writes once it holds its quota.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_proto::placement::placement_id;
use timeshard_proto::tier::{RoundPicker, due_at, expired, export_rank, exports_now};
use timeshard_proto::{AgeBy, Id, Quantum, SeriesClass, SeriesKey, Timestamp};
use timeshard_store::{BlockInfo, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Tier;
use crate::membership::View;

/// Blocks listed per call (the store holds its lock for about this much work).
const LIST_PAGE: usize = 10_000;
/// How often uncommitted files are looked for.
const CLEANUP_EVERY: Duration = Duration::from_secs(3600);

/// A round that failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Archive(#[from] timeshard_tier::Error),
    #[error("the hot store failed: {0}")]
    Hot(#[from] StoreError),
    #[error("a store task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A due block.
#[derive(Clone, Debug)]
struct Due {
    series: SeriesKey,
    quantum: Quantum,
    digest: u64,
    due: Timestamp,
    last_write: Timestamp,
}

/// Runs export rounds until `stop` fires, as node `me`, which owns blocks as `view` says.
pub async fn run(tier: Arc<Tier>, me: Id, view: Arc<View>, stop: CancellationToken) {
    let interval = tier.config.interval;
    let mut last_cleanup: Option<tokio::time::Instant> = None;
    // Learn what the archive holds, so reads know which ranges are cold: of every class, as
    // one no longer archived may have history there.
    let classes: Vec<SeriesClass> =
        if tier.archive().is_some() { tier.policy().classes.iter().cloned().collect() } else { Vec::new() };
    for class in classes {
        if let Err(e) = tier.relist(&class).await {
            warn!(class = %class.name, error = %e, "cannot list the archive yet");
        }
    }
    loop {
        let failed = tier.progress().failed_rounds;
        let wait = interval.saturating_mul(1 << failed.min(16)).min(tier.config.max_backoff.max(interval));
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = round(&tier, me, &view) => r,
        };
        {
            let mut progress = tier.progress();
            progress.last_round_ns = now_ns();
            match result {
                Ok(()) => {
                    progress.failed_rounds = 0;
                    progress.last_success_ns = progress.last_round_ns;
                }
                Err(e) => {
                    progress.failed_rounds = progress.failed_rounds.saturating_add(1);
                    warn!(error = %e, failed_rounds = progress.failed_rounds, "archive round failed; hot data is kept");
                    progress.last_error = Some(e.to_string());
                    progress.last_error_ns = now_ns();
                }
            }
        }
        if let Some(archive) = tier.archive()
            && last_cleanup.is_none_or(|t| t.elapsed() >= CLEANUP_EVERY)
        {
            last_cleanup = Some(tokio::time::Instant::now());
            match archive.cleanup(tier.config.cleanup_grace).await {
                Ok(r) if !r.removed.is_empty() => info!(removed = r.removed.len(), "removed uncommitted archive files"),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "cleaning up the archive failed"),
            }
        }
    }
}

/// What one walk of the hot store found.
#[derive(Default)]
struct Walk {
    /// Per archived class: the class and its picked due blocks.
    due: HashMap<String, (SeriesClass, RoundPicker<Due>)>,
    expired: Vec<BlockInfo>,
    /// Blocks of classes aged by write time still held (their write times are kept).
    write_aged: HashSet<(SeriesKey, Timestamp)>,
    /// Per archived class: points and bytes due, and the oldest due time.
    behind: HashMap<String, (u64, u64, Timestamp)>,
}

/// Share of its quota past which an archived class's sealed blocks are exported without
/// waiting for their hot window, oldest first, so that it does not fill and refuse writes
/// while the archive can take them.
const EARLY_EXPORT_PERCENT: u64 = 80;

/// The metric prefixes of classes past [`EARLY_EXPORT_PERCENT`] of their quota, as the hot
/// store last measured them.
fn pressed_prefixes(tier: &Tier) -> HashSet<String> {
    tier.hot
        .quota_use()
        .into_iter()
        .filter(|u| {
            u.max_bytes.is_some_and(|max| u.bytes.saturating_mul(100) >= max.saturating_mul(EARLY_EXPORT_PERCENT))
        })
        .map(|u| u.metric_prefix)
        .collect()
}

/// Walks the hot store's blocks (see the module docs, step 1).
async fn walk(tier: &Arc<Tier>, now: Timestamp) -> Result<Walk, RoundError> {
    let pressed = pressed_prefixes(tier);
    let policy = tier.policy();
    let budget = tier.config.max_blocks_per_round;
    let mut found = Walk::default();
    let mut cursor = None;
    loop {
        let hot = tier.hot.clone();
        let page = timeshard_clock::spawn_blocking(move || hot.list_blocks(cursor, LIST_PAGE)).await??;
        for b in page.blocks {
            if b.series.metric().starts_with(timeshard_proto::key::RESERVED_METRIC_PREFIX) {
                continue;
            }
            let b = tier.with_write_time(&policy, b);
            let class = policy.classes.of(&b.series);
            let t = policy.tier(class);
            if t.age_by == AgeBy::Write {
                found.write_aged.insert((b.series.clone(), b.quantum.start));
            }
            if let Some(keep) = t.retention_ns
                && expired(t.age_by, b.quantum, b.last_write, keep, now)
            {
                // Never exported: by event time the store drops it, by write time this round.
                if t.age_by == AgeBy::Write && found.expired.len() < budget {
                    found.expired.push(b);
                }
                continue;
            }
            if !t.archive || tier.archive.is_none() {
                continue;
            }
            // A class near its quota exports what is sealed now: its hot window gives way
            // before its writes are refused.
            let hot_ns = if pressed.contains(&class.metric_prefix) { 0 } else { t.hot_ns };
            let due = due_at(t.age_by, b.quantum, b.last_write, hot_ns, tier.seal_grace_ns);
            if now < due {
                continue;
            }
            let behind = found.behind.entry(class.name.clone()).or_insert((0, 0, due));
            *behind = (behind.0 + b.count, behind.1 + b.bytes, behind.2.min(due));
            let (_, picker) =
                found.due.entry(class.name.clone()).or_insert_with(|| (class.clone(), RoundPicker::new(budget)));
            let block = Due { series: b.series, quantum: b.quantum, digest: b.digest, due, last_write: b.last_write };
            picker.offer(b.quantum, block);
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(found),
        }
    }
}

/// Drops hot blocks, in order, if they still have their digests; says which were dropped, up
/// to the first that failed (a full disk, say), and that failure: what was dropped before it
/// is counted all the same.
async fn drop_blocks(
    tier: &Arc<Tier>,
    blocks: Vec<(SeriesKey, Timestamp, u64)>,
) -> Result<(Vec<bool>, Option<RoundError>), RoundError> {
    if blocks.is_empty() {
        return Ok((Vec::new(), None));
    }
    let hot = tier.hot.clone();
    let (dropped, failed) = timeshard_clock::spawn_blocking(move || {
        let mut dropped = Vec::with_capacity(blocks.len());
        for (series, start, digest) in &blocks {
            match hot.drop_block(series, *start, *digest) {
                Ok(d) => dropped.push(d),
                Err(e) => return (dropped, Some(RoundError::Hot(e))),
            }
        }
        (dropped, None)
    })
    .await?;
    Ok((dropped, failed))
}

/// One round (see the module docs).
async fn round(tier: &Arc<Tier>, me: Id, view: &View) -> Result<(), RoundError> {
    if !tier.policy().has_work(tier.archive.is_some()) {
        return Ok(());
    }
    let now = now_ns();
    let mut found = walk(tier, now).await?;
    // Records of blocks gone from the hot store go; those of blocks written since the walk
    // began (dated later than it) stay.
    let live = std::mem::take(&mut found.write_aged);
    let tier2 = tier.clone();
    timeshard_clock::spawn_blocking(move || tier2.writes.retain(&live, now)).await?.map_err(|e| {
        RoundError::Hot(StoreError::Io { context: "rewriting the tier's write times".into(), source: e })
    })?;
    if !found.expired.is_empty() {
        let blocks = found.expired.iter().map(|b| (b.series.clone(), b.quantum.start, b.digest)).collect();
        let (dropped, failed) = drop_blocks(tier, blocks).await?;
        let policy = tier.policy();
        let mut progress = tier.progress();
        for (b, dropped) in found.expired.iter().zip(dropped) {
            let class = &policy.classes.of(&b.series).name;
            progress.classes.entry(class.clone()).or_default().expired_blocks += u64::from(dropped);
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    // Classes with nothing due now report nothing pending.
    {
        let mut progress = tier.progress();
        for c in progress.classes.values_mut() {
            c.pending_blocks = 0;
            c.waiting_for_owner = 0;
            (c.pending_points, c.pending_bytes, c.oldest_due_ns) = (0, 0, 0);
        }
        for (class, (points, bytes, oldest)) in std::mem::take(&mut found.behind) {
            let c = progress.classes.entry(class).or_default();
            (c.pending_points, c.pending_bytes, c.oldest_due_ns) = (points, bytes, oldest);
        }
    }
    let mut first_error = None;
    let order = {
        let policy = tier.policy();
        export_order(found.due, |c| policy.tier(c).export_priority)
    };
    for (name, (class, picker)) in order {
        let offered = picker.offered();
        let due = picker.finish();
        if let Err(e) = move_class(tier, me, view, &class, due, offered, now).await {
            warn!(class = %name, error = %e, "archiving failed; hot data is kept");
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = expire_archive(tier, now).await {
        warn!(error = %e, "expiring archive files past retention failed");
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// The classes with due blocks in the order a round exports them: higher `export_priority`
/// first (they share the rate limit, so a small uplink carries them first), then by name.
fn export_order<T>(
    due: HashMap<String, (SeriesClass, T)>,
    priority: impl Fn(&SeriesClass) -> u8,
) -> Vec<(String, (SeriesClass, T))> {
    let mut order: Vec<_> = due.into_iter().collect();
    order.sort_by(|(a, (ca, _)), (b, (cb, _))| priority(cb).cmp(&priority(ca)).then_with(|| a.cmp(b)));
    order
}

/// Removes this node's archive files past their class's retention (`timeshard_tier` hides
/// their points from queries already). Every node removes its own and nothing else, so its
/// archive credentials need no rights over other nodes' folders; files of a node that left
/// stay, hidden, until an operator removes its folder (README, "Archive credentials").
async fn expire_archive(tier: &Arc<Tier>, now: Timestamp) -> Result<(), RoundError> {
    let Some(archive) = tier.archive() else { return Ok(()) };
    let policy = tier.policy();
    // Readers with a listing up to a TTL old must never open a removed file.
    let ttl = i64::try_from(tier.config.listing_ttl.as_nanos()).unwrap_or(i64::MAX);
    let mut first_error = None;
    for class in policy.classes.iter() {
        let Some(retention) = policy.tier(class).archive_retention() else { continue };
        match archive.expire(class, retention, now.saturating_sub(ttl)).await {
            Ok(report) => {
                let mut progress = tier.progress();
                progress.classes.entry(class.name.clone()).or_default().expired_files += report.removed.len() as u64;
            }
            Err(e) => {
                warn!(class = %class.name, error = %e, "expiring archive files failed");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}

/// The blocks this node exports now, and those another owner is to export first.
// Not inside the async fn: closures over references held across its awaits trip rustc's `Send`
// inference for the spawned task.
fn split_by_turn(
    tier: &Tier,
    me: Id,
    view: &View,
    class: &SeriesClass,
    blocks: Vec<Due>,
    now: Timestamp,
) -> (Vec<Due>, Vec<Due>) {
    let policy = tier.policy();
    let rf = usize::from(class.replication.rf);
    let takeover = i64::try_from(tier.config.takeover_after.as_nanos()).unwrap_or(i64::MAX);
    blocks.into_iter().partition(|d| {
        let id = placement_id(&d.series, &d.quantum, &policy.classes);
        // A CoI class places blocks by location; index blocks (no location in their key) and
        // anything unplaceable fall back to the DHT owners for choosing the exporter.
        let target = timeshard_proto::placement::target(&d.series, id, class)
            .unwrap_or_else(|_| timeshard_proto::placement::Target::dht(id, rf));
        let owners = view.owners_of(&target).owners;
        exports_now(export_rank(&owners, me), d.due, d.last_write, now, takeover)
    })
}

/// Steps 2 and 3 of a round for one class's due blocks (`offered` were due in all).
async fn move_class(
    tier: &Arc<Tier>,
    me: Id,
    view: &View,
    class: &SeriesClass,
    due: Vec<Due>,
    offered: u64,
    now: Timestamp,
) -> Result<(), RoundError> {
    let Some(archive) = tier.archive() else { return Ok(()) };
    tier.progress().classes.entry(class.name.clone()).or_default().pending_blocks = offered;
    let asked: Vec<(SeriesKey, Quantum, u64)> = due.iter().map(|d| (d.series.clone(), d.quantum, d.digest)).collect();
    let held = archive.confirmed(class, &asked).await?;
    let mut covered = Vec::new();
    let mut rest = Vec::new();
    for (d, held) in due.into_iter().zip(held) {
        if held { covered.push(d) } else { rest.push(d) }
    }
    // The drop horizon first, durably: reads that skip the archive rely on it.
    if let Some(end) = covered.iter().map(|d| d.quantum.end()).max() {
        let (tier2, name) = (tier.clone(), class.name.clone());
        timeshard_clock::spawn_blocking(move || tier2.note_drops(&name, end))
            .await?
            .map_err(|e| RoundError::Hot(StoreError::Io { context: "recording the drop horizon".into(), source: e }))?;
    }
    let covered = covered.into_iter().map(|d| (d.series, d.quantum.start, d.digest)).collect();
    let (dropped, failed) = drop_blocks(tier, covered).await?;
    let dropped = dropped.into_iter().filter(|&d| d).count() as u64;
    let (mine, waiting) = split_by_turn(tier, me, view, class, rest, now);
    {
        let mut progress = tier.progress();
        let c = progress.classes.entry(class.name.clone()).or_default();
        c.dropped_blocks += dropped;
        c.pending_blocks = offered.saturating_sub(dropped);
        c.waiting_for_owner = waiting.len() as u64;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if mine.is_empty() {
        return Ok(());
    }
    let blocks: Vec<(SeriesKey, Quantum)> = mine.into_iter().map(|d| (d.series, d.quantum)).collect();
    info!(class = %class.name, blocks = blocks.len(), "exporting to the archive");
    // Through the tiered store: the export records the blocks' durable write times.
    let hot: Arc<dyn timeshard_store::Store> = Arc::new(super::store::TieredStore::new(tier.clone()));
    let report = archive.export(hot, class, blocks).await?;
    let written = report.confirmed.iter().filter(|c| !c.already).count() as u64;
    info!(class = %class.name, files = report.files.len(), blocks = written, rows = report.rows, "exported to the archive");
    for (series, quantum, why) in &report.unreadable {
        warn!(class = %class.name, %series, quantum = quantum.start, error = %why,
            "a damaged hot block was left out of the export and is kept hot");
    }
    let mut progress = tier.progress();
    let c = progress.classes.entry(class.name.clone()).or_default();
    c.unreadable_blocks = report.unreadable.len() as u64;
    c.exported_files += report.files.len() as u64;
    c.exported_blocks += written;
    c.exported_rows += report.rows;
    c.exported_bytes += report.bytes;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_exports_higher_priorities_first_then_by_name() {
        let due: HashMap<String, (SeriesClass, ())> = [("bulk", 0), ("alarms", 9), ("audit", 0), ("pmu", 5)]
            .into_iter()
            .map(|(name, _)| (name.to_string(), (SeriesClass { name: name.into(), ..SeriesClass::default() }, ())))
            .collect();
        let priority = |c: &SeriesClass| match c.name.as_str() {
            "alarms" => 9,
            "pmu" => 5,
            _ => 0,
        };
        let order: Vec<String> = export_order(due, priority).into_iter().map(|(n, _)| n).collect();
        assert_eq!(order, ["alarms", "pmu", "audit", "bulk"]);
    }
}

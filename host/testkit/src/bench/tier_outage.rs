//! The part of `timeshard bench tier` about being offline and full: a backlog exported once the
//! archive answers again after failed rounds, the same export under a rate cap, and the durable
//! store taking writes again once its disk has room (see [`super::tier::TierBenchReport`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use timeshard_proto::Point;
use timeshard_store::faulty_disk::{FailKind, FaultyDisk};
use timeshard_store::{DiskConfig, DiskStore, Store};
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::object_store::local::LocalFileSystem;
use timeshard_tier::{Archive, Config, RetryPolicy};

use super::store::{BenchError, to_blocks};
use super::tier::{TierBenchReport, TierOptions, blocks_of, class, fresh, hot_store, io, tier};
use crate::datasets::{pmu_points, pmu_series};
use crate::stats::{median, round3};

/// Failed rounds of each simulated outage.
const OUTAGE_ROUNDS: usize = 3;

/// Fills the outage figures of `r`.
pub(super) async fn outage(dir: &Path, opts: &TierOptions, r: &mut TierBenchReport) -> Result<(), BenchError> {
    let series = 4u32;
    let per = opts.backlog_points / series as usize;
    let hot_dir = fresh(dir, "outage-hot")?;
    let data = (0..series).map(|s| {
        let points: Box<dyn Iterator<Item = Point>> = Box::new(pmu_points(s, 0, per));
        (pmu_series(s), points)
    });
    let hot = hot_store(&hot_dir, opts.pmu_quantum, data)?;
    let blocks = blocks_of(&*hot)?;
    let pmu = class("pmu", opts.pmu_quantum);
    let mut config = Config::for_node("bench");
    config.retry =
        RetryPolicy { attempts: 2, first_backoff: Duration::from_millis(1), max_backoff: Duration::from_millis(2) };
    r.export_cap_bytes_per_s = opts.export_cap_bytes_per_s;
    for rep in 0..opts.reps {
        // The archive away for a few rounds, then back: time the export of the whole backlog.
        let adir = fresh(dir, &format!("outage-archive-{rep}"))?;
        let local = LocalFileSystem::new_with_prefix(&adir).map_err(|e| BenchError::Check(format!("archive: {e}")))?;
        let faulty = FaultyStore::new(Arc::new(local));
        faulty.set_fault(Fault::FailFrom(0));
        let archive = Archive::with_store(Arc::new(faulty.clone()), config.clone()).map_err(tier)?;
        for _ in 0..OUTAGE_ROUNDS {
            if archive.export(hot.clone(), &pmu, blocks.clone()).await.is_ok() {
                return Err(BenchError::Check("an export succeeded with the archive away".into()));
            }
        }
        r.runs.outage_failed_rounds = OUTAGE_ROUNDS;
        faulty.set_fault(Fault::None);
        let start = Instant::now();
        let report = archive.export(hot.clone(), &pmu, blocks.clone()).await.map_err(tier)?;
        let secs = start.elapsed().as_secs_f64();
        if report.confirmed.len() != blocks.len() {
            return Err(BenchError::Check(format!("{} of {} blocks exported", report.confirmed.len(), blocks.len())));
        }
        r.runs.backlog_drain_mb_per_s.push(round3(report.bytes as f64 / secs / 1e6));
        std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;

        // The same backlog under the rate cap.
        let adir = fresh(dir, &format!("capped-archive-{rep}"))?;
        let mut capped = config.clone();
        capped.export.rate_limit_bytes_per_s = Some(opts.export_cap_bytes_per_s);
        let archive = Archive::open(adir.to_str().unwrap_or("."), capped).map_err(tier)?;
        let start = Instant::now();
        let report = archive.export(hot.clone(), &pmu, blocks.clone()).await.map_err(tier)?;
        r.runs.export_bytes_per_s_capped.push((report.bytes as f64 / start.elapsed().as_secs_f64()) as u64);
        std::fs::remove_dir_all(&adir).map_err(io("clearing"))?;

        r.runs.enospc_recovery_s.push(enospc_recovery()?);
    }
    r.backlog_drain_mb_per_s = median(&r.runs.backlog_drain_mb_per_s);
    r.export_bytes_per_s_capped = median(&r.runs.export_bytes_per_s_capped);
    r.enospc_recovery_s = median(&r.runs.enospc_recovery_s);
    drop(hot);
    std::fs::remove_dir_all(&hot_dir).map_err(io("clearing"))?;
    Ok(())
}

/// A durable store whose disk fills (writes fail with ENOSPC) and then has room again: seconds
/// from the room to the first write it accepts, retrying as a client does (every millisecond).
fn enospc_recovery() -> Result<f64, BenchError> {
    let disk = FaultyDisk::new();
    let store = DiskStore::open_with_backend(Arc::new(disk.clone()), DiskConfig::default())?;
    let key = pmu_series(0);
    let quantum = timeshard_proto::QuantumLen::DEFAULT;
    let points: Vec<Point> = pmu_points(0, 0, 20_000).collect();
    store.write(&to_blocks(&key, quantum, &points[..10_000]))?;
    disk.fail_writes(FailKind::DiskFull);
    if store.write(&to_blocks(&key, quantum, &points[10_000..])).is_ok() {
        return Err(BenchError::Check("a write was accepted on a full disk".into()));
    }
    disk.heal();
    let start = Instant::now();
    while store.write(&to_blocks(&key, quantum, &points[10_000..])).is_err() {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(BenchError::Check("writes still refused 60 s after the disk had room".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(start.elapsed().as_secs_f64())
}

//! The cold tier under failures, on node processes: an S3-compatible archive (moto's server)
//! that is unreachable at first (rounds fail and back off, the error is reported, hot data
//! stays and reads of it are unaffected) and then comes up (history moves there, and reads and
//! aggregates across both tiers equal the raw data); and the exporting node killed with
//! SIGKILL in the middle of an export, then restarted: DuckDB finds no duplicate row and
//! nothing is missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;
use crate::tier_support::*;

/// Old data past the hot window and recent data, 5 s apart, for `n` series.
fn dataset(n: u64, now: i64) -> (Vec<SeriesKey>, Vec<Vec<Point>>, i64) {
    let old_end = now - 36 * HOUR;
    // The old part always spans two UTC days, so every exporter has more than one day's file
    // to write (and to be throttled over) whatever the time of day: just after midnight UTC,
    // `now - 2 days .. now - 36 h` lay within one day and node 0 finished before the kill.
    let old_start = (now - 2 * DAY).min(old_end - old_end.rem_euclid(DAY) - 6 * HOUR);
    let series = (0..n).map(|i| format!("pmu.freq{{bus={i}}}").parse().unwrap()).collect();
    let data = (0..n)
        .map(|i| {
            let mut p = points(i, old_start, old_end, 5 * SEC);
            p.extend(points(i, now - 3 * HOUR, now - MIN, 5 * SEC));
            p
        })
        .collect();
    (series, data, old_end)
}

fn old_blocks(data: &[Vec<Point>], old_end: i64) -> u64 {
    data.iter()
        .map(|p| {
            p.iter().filter(|x| x.ts < old_end).map(|x| x.ts.div_euclid(MIN)).collect::<BTreeSet<_>>().len() as u64
        })
        .sum()
}

async fn check_reads(client: &Client, series: &[SeriesKey], data: &[Vec<Point>], range: TimeRange) -> Result<()> {
    for (s, written) in series.iter().zip(data) {
        let want: Vec<Point> = written.iter().filter(|p| range.contains(p.ts)).copied().collect();
        let got = client.read(s, range).await?;
        ensure!(got == want, "{s}: read {} points, want {}", got.len(), want.len());
        for width in [HOUR, 90 * SEC] {
            let windows = client.aggregate(s, range, width).await?;
            assert_windows(&windows, &reference(written, range, width), &format!("{s} in windows of {width} ns"));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_archive_keeps_hot_data_then_takes_it_when_back() -> Result<()> {
    let mut moto = Moto::reserve();
    let (mut options, _dir) = ClusterOptions::for_tests(2, NODE);
    options.classes = vec![archived_class("pmu", "pmu.", 2)];
    options.tier = moto.tier("timeshard");
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    let now = now_ns();
    let (series, data, old_end) = dataset(2, now);
    for (s, p) in series.iter().zip(&data) {
        write(&client, s, p).await?;
    }
    let everything = TimeRange::new(now - 3 * DAY, now)?;

    // Rounds fail and say why; nothing is dropped; every read is served from the hot store,
    // promptly.
    let r = wait_reports(&cluster, &[0, 1], Duration::from_secs(120), "failed rounds reported", |r| {
        r.iter().all(|n| n.failed_rounds >= 1 && n.last_error.is_some())
    })
    .await?;
    assert_eq!(total(&r, "pmu", |c| c.dropped_blocks), 0);
    assert!(total(&r, "pmu", |c| c.pending_blocks) > 0, "{r:#?}");
    let error = r[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("object store"), "the error says what failed: {error}");
    // /metrics shows the outage: rounds failing, blocks waiting, no success yet.
    assert!(cluster.metric(0, "timeshard_archive_failed_rounds").await?.is_some_and(|n| n >= 1.0));
    assert!(cluster.metric(0, "timeshard_archive_last_error_timestamp_seconds").await?.is_some());
    assert_eq!(cluster.metric(0, "timeshard_archive_last_success_timestamp_seconds").await?, None);
    let waiting = cluster.metric(0, "timeshard_archive_pending_blocks{class=\"pmu\"}").await?;
    assert!(waiting.is_some_and(|n| n > 0.0), "pending blocks in /metrics: {waiting:?}");
    let t = Instant::now();
    check_reads(&client, &series, &data, everything).await?;
    assert!(t.elapsed() < Duration::from_secs(20), "reads did not wait for the archive: {:?}", t.elapsed());

    // The server comes up: the next rounds archive the history and drop it from both replicas.
    moto.start("timeshard")?;
    let archived = old_blocks(&data, old_end);
    let r = wait_reports(&cluster, &[0, 1], Duration::from_secs(180), "history archived on S3", |r| {
        total(r, "pmu", |c| c.dropped_blocks) == 2 * archived && total(r, "pmu", |c| c.pending_blocks) == 0
    })
    .await?;
    assert_eq!(total(&r, "pmu", |c| c.exported_blocks), archived, "each block exported once");
    assert!(r.iter().all(|n| n.failed_rounds == 0), "{r:#?}");
    let pmu = r[0].classes.iter().find(|c| c.class == "pmu").context("pmu")?;
    assert!(pmu.exports >= 2 && pmu.points_bytes > 0, "{pmu:?}");
    check_reads(&client, &series, &data, everything).await?;
    assert_eq!(cluster.metric(0, "timeshard_archive_failed_rounds").await?, Some(0.0));
    assert_eq!(cluster.metric(0, "timeshard_archive_pending_blocks{class=\"pmu\"}").await?, Some(0.0));
    let succeeded = cluster.metric(0, "timeshard_archive_last_success_timestamp_seconds").await?;
    assert!(succeeded.is_some_and(|t| t * 1e9 > now as f64), "last success after the data was written: {succeeded:?}");

    // The server goes away again: reads of the hot window are still served at once; cold
    // ranges fail, saying the archive failed.
    moto.stop();
    let t = Instant::now();
    check_reads(&client, &series, &data, TimeRange::new(now - 3 * HOUR, now)?).await?;
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let err = client.read(&series[0], TimeRange::new(now - 3 * DAY, old_end)?).await.unwrap_err();
    assert!(err.to_string().contains("archive"), "{err}");

    client.close().await;
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporting_node_killed_mid_export_resumes_without_duplicates() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(2, NODE);
    let root = dir.path().join("archive");
    options.classes = vec![archived_class("pmu", "pmu.", 2)];
    options.tier = quick_tier(root.to_str().unwrap());
    // Slow uploads, so the kill lands while an export runs.
    options.tier.rate_limit_bytes_per_sec = 24 * 1024;
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(1).await?;
    let now = now_ns();
    let (series, data, old_end) = dataset(3, now);
    for (s, p) in series.iter().zip(&data) {
        write(&client, s, p).await?;
    }

    // Node 0 exports the blocks it is first owner of, a file per day; kill it once it has
    // started, before it is done.
    let victim = cluster.id(0).to_hex();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = std::fs::read_to_string(cluster.log(0)).unwrap_or_default();
        if log.contains("exporting to the archive") {
            break;
        }
        ensure!(Instant::now() < deadline, "node 0 did not start exporting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(0).await?;
    let committed = files_under(&root, "/manifests/").iter().filter(|f| f.to_string_lossy().contains(&victim)).count();
    let reports = reports(&cluster, &[1]).await?;
    ensure!(total(&reports, "pmu", |c| c.pending_blocks) > 0, "node 0 was killed before it finished: {reports:#?}");

    // Restarted, it resumes: every block archived once, no row twice, nothing missing.
    cluster.restart(0).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let archived = old_blocks(&data, old_end);
    wait_reports(&cluster, &[0, 1], Duration::from_secs(240), "history archived after the restart", |r| {
        total(r, "pmu", |c| c.pending_blocks) == 0 && total(r, "pmu", |c| c.dropped_blocks) > 0
    })
    .await?;
    let db = duckdb(&root)?;
    let old_points: usize = data.iter().map(|p| p.iter().filter(|x| x.ts < old_end).count()).sum();
    assert_eq!((db.duplicates_committed, db.duplicates_all), (0, 0), "no duplicate row: {db:?}");
    assert_eq!(db.rows_all as usize, old_points, "every old point, in committed files only: {db:?}");
    assert_eq!((db.parts, db.blocks), (archived as i64, archived as i64), "each block exported once: {db:?}");
    assert!(committed < files_under(&root, "/manifests/").len(), "the restart committed more ({committed} before)");
    check_reads(&client, &series, &data, TimeRange::new(now - 3 * DAY, now)?).await?;

    client.close().await;
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

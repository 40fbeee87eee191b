//! Class quotas on node processes. A class that refuses stops taking writes before they would
//! pass its quota, saying so, and loses nothing. A class with `on_full = "evict_oldest"` over its quota keeps
//! its newest points, counts every point it dropped, and stays so after a SIGKILL and a
//! restart, while a class without a quota loses nothing; a smaller quota applies on SIGHUP. An archived class whose archive (moto's
//! S3 server) is down refuses writes at its quota, saying why, and evicts nothing; once the
//! archive is back it exports early, takes writes again, every acknowledged point reads back
//! and the archive holds no row twice.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;
use timeshard_node::config::{ByteSize, ClassConfig, OnFull};
use timeshard_proto::{Point, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;
use crate::disk_full::Ingest;
use crate::tier_support::{HOUR, Moto, MotoTier, archived_class, duckdb};

const QUOTA: u64 = 1 << 20;
/// 2026-06-01T00:00:00Z: fixed history, long ended.
const HISTORY: i64 = 1_780_272_000_000_000_000;
/// Points 10 ms apart: a batch covers 20 s of each series, 100 points per 1 s quantum.
const STEP: i64 = 10_000_000;

fn class(name: &str, prefix: &str) -> ClassConfig {
    ClassConfig {
        name: name.into(),
        metric_prefix: prefix.into(),
        quantum: Duration::from_secs(1),
        rf: 1,
        w: 1,
        r: 1,
        ..Default::default()
    }
}

/// Polls `metric` of node `i` until `ok` holds, for up to `within`.
async fn wait_metric(
    cluster: &LocalCluster,
    i: usize,
    metric: &str,
    within: Duration,
    ok: impl Fn(f64) -> bool,
) -> Result<f64> {
    let deadline = Instant::now() + within;
    loop {
        let v = cluster.metric(i, metric).await?;
        if let Some(v) = v.filter(|v| ok(*v)) {
            return Ok(v);
        }
        ensure!(Instant::now() < deadline, "{metric} is {v:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What each series of `ingest` holds now: a suffix of what was acknowledged (the newest
/// points), never empty. Returns the points missing in all.
async fn check_newest_kept(client: &Client, ingest: &Ingest) -> Result<(u64, Vec<Vec<Point>>)> {
    let mut missing = 0;
    let mut held = Vec::new();
    for (key, acked) in ingest.keys.iter().zip(&ingest.acked) {
        let got = client.read(key, TimeRange::new(acked[0].ts, now_ns())?).await?;
        ensure!(!got.is_empty(), "{key}: everything was evicted");
        ensure!(got.len() <= acked.len(), "{key}: {} points read, {} written", got.len(), acked.len());
        ensure!(got[..] == acked[acked.len() - got.len()..], "{key}: what is left is not the newest points");
        missing += (acked.len() - got.len()) as u64;
        held.push(got);
    }
    Ok((missing, held))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_class_over_its_quota_keeps_its_newest_points_and_counts_the_rest() -> Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    let evicting =
        ClassConfig { quota: Some(ByteSize(QUOTA)), on_full: OnFull::EvictOldest, ..class("evicting", "ev.") };
    let refusing = ClassConfig { quota: Some(ByteSize(QUOTA)), ..class("refusing", "rf.") };
    options.classes = vec![class("single", ""), evicting, refusing];
    options.store.maintenance_interval = Duration::from_millis(200);
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // About 10 MB of incompressible history into a class of 1 MiB, and 2 MB into a class
    // without a quota.
    let mut ev = Ingest::at("ev.history", HISTORY, STEP)?;
    let mut other = Ingest::at("other.history", HISTORY, STEP)?;
    ev.write(&client, 60).await?;
    other.write(&client, 12).await?;
    // Live points after it: newer than anything evicted.
    let mut live = Ingest::at("ev.live", now_ns() - 60_000_000_000, 1_000_000)?;
    live.write(&client, 2).await?;

    let evicted = "timeshard_class_evicted_points_total{class=\"evicting\"}";
    wait_metric(&cluster, 0, evicted, Duration::from_secs(60), |n| n > 0.0).await?;
    let used =
        wait_metric(&cluster, 0, "timeshard_class_used_bytes{class=\"evicting\"}", Duration::from_secs(30), |b| {
            b <= QUOTA as f64
        })
        .await?;
    let quota = cluster.metric(0, "timeshard_class_quota_bytes{class=\"evicting\"}").await?;
    ensure!(quota == Some(QUOTA as f64), "quota in /metrics: {quota:?}");
    // Nothing is written any more: the count settles.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counted = cluster.metric(0, evicted).await?.context("evicted points")? as u64;
    let (missing, held) = check_newest_kept(&client, &ev).await?;
    let (live_missing, _) = check_newest_kept(&client, &live).await?;
    ensure!(live_missing == 0, "{live_missing} live points evicted before older history");
    ensure!(missing == counted, "{missing} points gone, {counted} counted as evicted");
    let kept: usize = held.iter().map(Vec::len).sum();
    println!("evicting class: {used} bytes held of {QUOTA}; {kept} points kept, {missing} evicted and counted");
    other.check(&client).await?;
    ensure!(cluster.metric(0, "timeshard_class_used_bytes{class=\"single\"}").await?.is_none(), "no quota, not shown");

    // A class that refuses: writes stop before they would pass its quota, saying so; nothing it
    // took is lost, and it never holds more than its quota.
    let mut refused = Ingest::at("rf.history", HISTORY, STEP)?;
    let text = refused.until_refused(&client).await?.to_string();
    ensure!(text.contains("class \"refusing\"") && text.contains("quota of 1048576"), "the refusal says why: {text}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let taken = cluster.metric(0, "timeshard_class_used_bytes{class=\"refusing\"}").await?.context("refusing")?;
    ensure!(taken <= QUOTA as f64, "the refusing class holds {taken} bytes, past its quota of {QUOTA}");
    refused.check(&client).await?;
    let none = cluster.metric(0, "timeshard_class_evicted_points_total{class=\"refusing\"}").await?;
    ensure!(none == Some(0.0), "a refusing class evicted {none:?} points");
    println!("refusing class: {taken} bytes of {QUOTA}: {text}");

    // Killed and restarted: what was evicted stays gone, what was kept is all there.
    client.close().await;
    cluster.kill(0).await?;
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let (_, after) = check_newest_kept(&client, &ev).await?;
    ensure!(after == held, "the evicting class changed over a restart");
    other.check(&client).await?;
    live.check(&client).await?;

    // A smaller quota in the file applies on SIGHUP: more of the oldest goes, counted.
    cluster.edit_config(0, |c| {
        for class in c.classes.iter_mut().filter(|c| c.name == "evicting") {
            class.quota = Some(ByteSize(QUOTA / 2));
        }
    })?;
    cluster.reload(0)?;
    wait_metric(&cluster, 0, evicted, Duration::from_secs(30), |n| n > 0.0).await?;
    let used = "timeshard_class_used_bytes{class=\"evicting\"}";
    wait_metric(&cluster, 0, used, Duration::from_secs(30), |b| b <= (QUOTA / 2) as f64).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counted = cluster.metric(0, evicted).await?.context("evicted points")? as u64;
    let (missing_now, _) = check_newest_kept(&client, &ev).await?;
    ensure!(
        missing_now == missing + counted,
        "{missing_now} gone, {missing} before the reload + {counted} counted since"
    );
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// Copies every object of `bucket` on moto's server at `port` into `dest` (boto3 comes with
/// `moto[server]`).
pub(crate) fn download(port: u16, bucket: &str, dest: &Path) -> Result<()> {
    const SCRIPT: &str = r#"
import os, sys, boto3
port, bucket, dest = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                  aws_secret_access_key="testing", region_name="us-east-1")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
    for o in page.get("Contents", []):
        path = os.path.join(dest, o["Key"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, o["Key"], path)
"#;
    let out = Command::new(std::env::var("TIMESHARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
        .args(["-c", SCRIPT, &port.to_string(), bucket])
        .arg(dest)
        .output()
        .context("cannot run python3 with boto3: `pip install 'moto[server]'` (scripts/test does)")?;
    ensure!(out.status.success(), "downloading the archive failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archived_class_refuses_writes_while_its_archive_is_away_and_archives_every_point_once_back() -> Result<()> {
    let mut moto = Moto::reserve();
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    // Hot for a day: the data below is hours old, so only the quota can send it to the archive.
    let archived = ClassConfig {
        quantum: Duration::from_secs(1),
        quota: Some(ByteSize(QUOTA)),
        on_full: OnFull::EvictOldest,
        ..archived_class("archived", "arc.", 1)
    };
    options.classes = vec![class("single", ""), archived];
    options.tier = moto.tier("timeshard");
    options.store.maintenance_interval = Duration::from_millis(200);
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // The archive is away: the class fills to its quota and is refused, saying why. Between
    // measures a point counts as 24 bytes, more than it takes sealed: a refusal may lift at the
    // next measure, and the batch is retried (writes are idempotent) until refusals last.
    let mut ingest = Ingest::at("arc.recent", now_ns() - 5 * HOUR, STEP)?;
    let started = Instant::now();
    let mut batch = ingest.batch();
    let mut refused_since: Option<Instant> = None;
    let text = loop {
        ensure!(started.elapsed() < Duration::from_secs(180), "writes never stayed refused");
        match client.write_batch(batch.clone()).await {
            Ok(_) => {
                batch.into_iter().enumerate().for_each(|(i, s)| ingest.acked[i].extend(s.points));
                batch = ingest.batch();
                refused_since = None;
            }
            Err(e) if refused_since.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) => break e.to_string(),
            Err(_) => {
                refused_since.get_or_insert_with(Instant::now);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    batch.into_iter().enumerate().for_each(|(i, s)| ingest.refused[i].extend(s.points));
    ensure!(text.contains("class \"archived\"") && text.contains("archive"), "the refusal says why: {text}");
    ensure!(text.contains("retrying is safe"), "{text}");
    // A long outage, shortened: rounds keep failing, writes stay refused, nothing is evicted
    // or dropped, and everything acknowledged reads back.
    wait_metric(&cluster, 0, "timeshard_archive_failed_rounds", Duration::from_secs(60), |n| n >= 3.0).await?;
    ensure!(client.write_batch(ingest.batch()).await.is_err(), "a write taken while the class is full");
    let evicted = cluster.metric(0, "timeshard_class_evicted_points_total{class=\"archived\"}").await?;
    ensure!(evicted == Some(0.0), "an archived class evicted {evicted:?} points");
    let used = cluster.metric(0, "timeshard_class_used_bytes{class=\"archived\"}").await?.context("used")?;
    ensure!(used < 2.0 * QUOTA as f64, "the backlog grew to {used} bytes past its quota of {QUOTA}");
    ingest.check(&client).await?;
    println!("archive away: refused at {used} bytes of {QUOTA}: {text}");
    // `timeshard status` says how full and how far behind.
    let out = Command::new(NODE)
        .arg("status")
        .env("TIMESHARD_NODE", cluster.addr(0).to_string())
        .env("TIMESHARD_PKI", cluster.pki_dir())
        .output()?;
    let status = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "timeshard status: {}", String::from_utf8_lossy(&out.stderr));
    let behind = cluster.metric(0, "timeshard_archive_behind_seconds{class=\"archived\"}").await?;
    ensure!(behind.is_some_and(|s| s > 0.0), "how far behind in /metrics: {behind:?}");
    let pending = cluster.metric(0, "timeshard_archive_pending_points{class=\"archived\"}").await?;
    ensure!(pending.is_some_and(|n| n > 0.0), "points waiting in /metrics: {pending:?}");
    let bytes = cluster.metric(0, "timeshard_archive_pending_bytes{class=\"archived\"}").await?;
    ensure!(bytes.is_some_and(|b| b > 0.0 && b <= 2.0 * QUOTA as f64), "bytes waiting in /metrics: {bytes:?}");
    for says in
        ["disk: ", "class archived: ", "on_full = evict_oldest, REFUSING WRITES", "bytes) waiting, the oldest due "]
    {
        ensure!(status.contains(says), "status lacks {says:?}:\n{status}");
    }
    ensure!(status.contains("rounds failed in a row") && status.contains("; last error: object store"), "{status}");
    println!("{status}");

    // The archive is back: the class exports early, drops what is archived, and takes writes.
    moto.start("timeshard")?;
    let started = Instant::now();
    let more = ingest.batch();
    loop {
        match client.write_batch(more.clone()).await {
            Ok(_) => break,
            Err(e) => ensure!(started.elapsed() < Duration::from_secs(120), "still refused with the archive back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("writes taken again {:?} after the archive came back", started.elapsed());
    more.into_iter().enumerate().for_each(|(i, s)| ingest.acked[i].extend(s.points));
    ingest.check(&client).await?;
    let exported = wait_metric(&cluster, 0, "timeshard_archive_failed_rounds", Duration::from_secs(30), |n| n == 0.0);
    exported.await?;

    // The archive holds no row twice, and only points that were written.
    let copy = dir.path().join("archive-copy");
    download(moto.port, "timeshard", &copy)?;
    let db = duckdb(&copy.join("archive"))?;
    ensure!(db.rows_all > 0, "nothing reached the archive");
    ensure!(db.duplicates_all == 0 && db.duplicates_committed == 0, "rows twice in the archive: {db:?}");
    let rows: i64 = db.groups.iter().filter_map(|g| g["count"].as_i64()).sum();
    let written: usize = ingest.acked.iter().chain(&ingest.refused).map(Vec::len).sum();
    ensure!(rows as usize <= written && rows > 0, "{rows} committed rows of {written} points written");
    println!("archive: {rows} rows committed, none twice, of {written} points written");
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

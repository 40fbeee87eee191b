//! The cold tier end to end on node processes, the archive in a local directory: history past
//! the hot window moves to the archive (each block exported by one owner, dropped from every
//! replica once the archive holds it), and every point reads back through reads, window
//! aggregates, a query policy, `timeshard get` and the SDK across both tiers; late data for an archived quantum
//! is kept and read; DuckDB reads the archive directly and agrees with timeshard per series and
//! day; a corrupt Parquet file fails the reads that need it with an error naming it, while the
//! rest is still served.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;
use crate::tier_support::*;

/// Reads and window aggregates of every series over `range` equal the raw data.
async fn check_everything(client: &Client, series: &[SeriesKey], data: &[Vec<Point>], range: TimeRange) -> Result<()> {
    for (s, written) in series.iter().zip(data) {
        let want: Vec<Point> = written.iter().filter(|p| range.contains(p.ts)).copied().collect();
        let got = client.read(s, range).await?;
        ensure!(got.len() == want.len(), "{s}: read {} points of {}", got.len(), want.len());
        assert_eq!(got, want, "{s}: every point");
        for width in [HOUR, DAY, 90 * SEC] {
            let windows = client.aggregate(s, range, width).await?;
            assert_windows(&windows, &reference(written, range, width), &format!("{s} in windows of {width} ns"));
        }
    }
    Ok(())
}

/// Runs the `timeshard` command line against node 0.
fn cli(cluster: &LocalCluster, args: &[&str]) -> Result<String> {
    let out = Command::new(NODE)
        .args(args)
        .env("TIMESHARD_NODE", cluster.addr(0).to_string())
        .env("TIMESHARD_PKI", cluster.pki_dir())
        .output()
        .context("running timeshard")?;
    ensure!(out.status.success(), "timeshard {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_moves_to_the_archive_and_reads_span_both_tiers() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(3, NODE);
    let root = dir.path().join("archive");
    options.classes = vec![archived_class("pmu", "pmu.", 2)];
    options.tier = quick_tier(root.to_str().unwrap());
    options.policy = rms_policy(dir.path(), "pmu.")?;
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // A point every 5 s: 36 hours of history past the hot window (a day), and the last six
    // hours, hot. Nothing lies between them, so the set of archived blocks does not grow while
    // the test runs.
    let now = now_ns();
    let (old, recent) = ((now - 3 * DAY, now - 36 * HOUR), (now - 6 * HOUR, now - MIN));
    let series: Vec<SeriesKey> = (0..3).map(|i| format!("pmu.freq{{bus={i}}}").parse()).collect::<Result<_, _>>()?;
    let mut data = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let mut p = points(i as u64, old.0, old.1, 5 * SEC);
        p.extend(points(i as u64, recent.0, recent.1, 5 * SEC));
        write(&client, s, &p).await?;
        data.push(p);
    }
    let cold_blocks = |data: &[Vec<Point>]| -> u64 {
        data.iter()
            .map(|p| {
                p.iter().filter(|x| x.ts < old.1).map(|x| x.ts.div_euclid(MIN)).collect::<BTreeSet<_>>().len() as u64
            })
            .sum()
    };
    let archived = cold_blocks(&data);
    let all = [0, 1, 2];

    // Each old block is exported once (by one owner), and both replicas drop their copies.
    let settled = |want_dropped: u64| {
        move |r: &[timeshard_sdk::ArchiveReport]| {
            total(r, "pmu", |c| c.dropped_blocks) >= want_dropped && total(r, "pmu", |c| c.pending_blocks) == 0
        }
    };
    let r =
        wait_reports(&cluster, &all, std::time::Duration::from_secs(240), "old blocks archived", settled(2 * archived))
            .await?;
    let per_node: Vec<u64> = r.iter().map(|n| total(std::slice::from_ref(n), "pmu", |c| c.exported_blocks)).collect();
    assert_eq!(
        total(&r, "pmu", |c| c.exported_blocks),
        archived,
        "every old block exported exactly once: {per_node:?}"
    );
    assert_eq!(total(&r, "pmu", |c| c.dropped_blocks), 2 * archived, "and dropped from both replicas");
    assert!(r.iter().all(|n| n.last_error.is_none()), "{r:#?}");
    let db = duckdb(&root)?;
    assert_eq!((db.parts, db.blocks, db.late_parts), (archived as i64, archived as i64, 0), "{db:?}");

    // A corrupt points file: reads that need it fail naming it; the rest is served.
    let victim = files_under(&root, "/points/").into_iter().next().context("no points file")?;
    let name = victim.strip_prefix(&root)?.to_string_lossy().into_owned();
    let bytes = std::fs::read(&victim)?;
    std::fs::write(&victim, &bytes[..bytes.len() / 2])?;
    let day: i64 = name.split("day=").nth(1).and_then(|d| timeshard_tier::Day::parse(&d[..10])).context("day")?.start();
    let victim_day = TimeRange::new(day, day + DAY)?;
    let mut failures = 0;
    for s in &series {
        if let Err(e) = client.read(s, victim_day).await {
            assert!(e.to_string().contains(&name), "the error names the file: {e}");
            failures += 1;
        }
    }
    assert!(failures > 0, "some series has blocks in {name}");
    let other_day = if day <= old.0 { TimeRange::new(day + DAY, old.1)? } else { TimeRange::new(old.0, day)? };
    check_everything(&client, &series, &data, other_day).await?;
    check_everything(&client, &series, &data, TimeRange::new(recent.0, now)?).await?;
    std::fs::write(&victim, &bytes)?;

    // Everything, across both tiers: raw reads, aggregates, `timeshard get`.
    let everything = TimeRange::new(old.0 - MIN, now)?;
    check_everything(&client, &series, &data, everything).await?;
    // A query policy pushed down to the owners reads both tiers too.
    for (s, written) in series.iter().zip(&data) {
        let out = client.query(s, everything, "rms", &[]).await?;
        let value = |name: &str| out.values.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap_or(f64::NAN);
        let (want, count) = rms(written, everything);
        assert_eq!(value("count"), count, "{s}: rms over every point");
        assert!((value("rms") - want).abs() <= 1e-9 * want, "{s}: rms {} vs {want}", value("rms"));
    }
    let csv = cli(
        &cluster,
        &["get", series[1].as_str(), "--start", &everything.start().to_string(), "--end", &now.to_string()],
    )?;
    assert_eq!(csv.lines().count(), data[1].len() + 1, "timeshard get prints every point and a header");

    // Late data for archived quanta: kept, read at once, then archived as a diff.
    let late: Vec<Point> = [10 * HOUR, 20 * HOUR, 20 * HOUR + 30 * SEC]
        .iter()
        .map(|&d| Point::new(old.0 + d + 2_500_000_000, 7.25))
        .collect();
    client.write(&series[0], &late).await?;
    data[0].extend(&late);
    data[0].sort();
    check_everything(&client, &series[..1], &data[..1], everything).await?;
    let late_blocks = late.iter().map(|p| p.ts.div_euclid(MIN)).collect::<BTreeSet<_>>().len() as u64;
    let r = wait_reports(
        &cluster,
        &all,
        std::time::Duration::from_secs(120),
        "late data archived",
        settled(2 * (archived + late_blocks)),
    )
    .await?;
    assert_eq!(total(&r, "pmu", |c| c.exported_blocks), archived + late_blocks);
    check_everything(&client, &series, &data, everything).await?;

    // DuckDB reads the archive directly: each point once, and per series and day the same
    // counts, sums, min and max as timeshard's (every day of the old part is wholly cold).
    let db = duckdb(&root)?;
    assert_eq!((db.duplicates_committed, db.duplicates_all), (0, 0), "no duplicate row: {db:?}");
    assert_eq!(db.rows_all as usize, data.iter().map(|p| p.iter().filter(|x| x.ts < old.1).count()).sum::<usize>());
    assert_eq!(
        (db.parts, db.blocks, db.late_parts),
        ((archived + late_blocks) as i64, archived as i64, late_blocks as i64)
    );
    let mut ours = Vec::new();
    for s in &series {
        for w in client.aggregate(s, TimeRange::new(old.0, old.1)?, DAY).await? {
            ours.push((s.to_string(), timeshard_tier::Day::of(w.start).to_string(), w));
        }
    }
    assert_eq!(db.groups.len(), ours.len(), "series-days: {:?}", db.groups);
    for (g, (s, day, w)) in db.groups.iter().zip(&ours) {
        assert_eq!((g["series"].as_str(), g["day"].as_str()), (Some(s.as_str()), Some(day.as_str())));
        assert_eq!(g["count"].as_u64(), Some(w.count), "{s} {day}");
        let bits = |v: f64| Some(v.to_bits() as i64);
        assert_eq!((g["min_bits"].as_i64(), g["max_bits"].as_i64()), (bits(w.min), bits(w.max)), "{s} {day}");
        assert_eq!((g["first_ns"].as_i64(), g["last_ns"].as_i64()), (Some(w.first_ts), Some(w.last_ts)), "{s} {day}");
        let sum = g["sum"].as_f64().unwrap_or(f64::NAN);
        assert!((sum - w.sum).abs() <= 1e-6 * w.sum.abs().max(1.0), "{s} {day}: {sum} vs {}", w.sum);
    }

    // `timeshard archive status` tells what the archive holds.
    let status: serde_json::Value = serde_json::from_str(&cli(&cluster, &["archive", "status", "--json"])?)?;
    let pmu = status["classes"].as_array().and_then(|c| c.iter().find(|c| c["class"] == "pmu")).context("pmu")?;
    assert_eq!(pmu["archive"], true);
    assert!(pmu["exports"].as_u64().unwrap_or(0) >= 3 && pmu["days"].as_u64().unwrap_or(0) >= 2, "{status:#}");
    assert!(cli(&cluster, &["archive", "status"])?.contains("class pmu: archived after 1day by event time"));

    client.close().await;
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_time_ages_data_from_its_arrival() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    let root = dir.path().join("archive");
    // Hot for 4 s by write time, and kept 4 s by write time (no archive).
    let mut device = archived_class("device", "device.", 1);
    device.hot = Some(std::time::Duration::from_secs(4));
    device.age_by = timeshard_proto::AgeBy::Write;
    let scratch = timeshard_node::config::ClassConfig {
        name: "scratch".into(),
        metric_prefix: "scratch.".into(),
        rf: 1,
        w: 1,
        r: 1,
        retention: Some(std::time::Duration::from_secs(4)),
        age_by: timeshard_proto::AgeBy::Write,
        ..Default::default()
    };
    options.classes = vec![device, scratch];
    options.tier = quick_tier(root.to_str().unwrap());
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // A device back after four weeks uploads what it kept: by event time all of it would be
    // past any window at once; by write time it starts its hot window and retention now.
    let now = now_ns();
    let range = TimeRange::new(now - 30 * DAY, now)?;
    let (device, scratch): (SeriesKey, SeriesKey) = ("device.temp{id=1}".parse()?, "scratch.temp{id=1}".parse()?);
    let old = points(1, now - 28 * DAY, now - 27 * DAY, 60 * SEC);
    write(&client, &device, &old).await?;
    write(&client, &scratch, &old).await?;
    let written = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let r = reports(&cluster, &[0]).await?;
    if written.elapsed() < std::time::Duration::from_secs(4) {
        assert_eq!(total(&r, "device", |c| c.exported_blocks + c.pending_blocks), 0, "still hot: {r:#?}");
        assert_eq!(client.read(&scratch, range).await?, old, "still kept");
    }
    let blocks = old.iter().map(|p| p.ts.div_euclid(MIN)).collect::<BTreeSet<_>>().len() as u64;
    let r = wait_reports(&cluster, &[0], std::time::Duration::from_secs(60), "aged by write time", |r| {
        total(r, "device", |c| c.dropped_blocks) == blocks && total(r, "scratch", |c| c.expired_blocks) == blocks
    })
    .await?;
    assert!(written.elapsed() >= std::time::Duration::from_secs(4), "not before the window passed: {r:#?}");
    assert_eq!(client.read(&device, range).await?, old, "read back from the archive");
    assert!(client.read(&scratch, range).await?.is_empty(), "expired by write-time retention");
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// The UTC day (`YYYY-MM-DD`) an archive object's path names.
fn day_of_path(path: &std::path::Path) -> Option<String> {
    let p = path.to_string_lossy();
    Some(p.split("day=").nth(1)?.get(..10)?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_archived_history_past_it() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(2, NODE);
    let root = dir.path().join("archive");
    options.classes = vec![archived_class("pmu", "pmu.", 2)];
    options.tier = quick_tier(root.to_str().unwrap());
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // History before the four days the class will keep (up to an hour before the cut-off),
    // history inside them (from an hour after it), and a hot part; a point every 5 minutes.
    const KEEP: i64 = 4 * DAY;
    let now = now_ns();
    let (gone, kept, recent) =
        ((now - 6 * DAY, now - KEEP - HOUR), (now - KEEP + HOUR, now - 36 * HOUR), (now - 3 * HOUR, now));
    let series: Vec<SeriesKey> = (0..2).map(|i| format!("pmu.freq{{bus={i}}}").parse()).collect::<Result<_, _>>()?;
    let mut data = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let mut p = points(i as u64, gone.0, gone.1, 5 * MIN);
        p.extend(points(i as u64, kept.0, kept.1, 5 * MIN));
        p.extend(points(i as u64, recent.0, recent.1 - MIN, 5 * MIN));
        write(&client, s, &p).await?;
        data.push(p);
    }
    let archived: u64 = data.iter().map(|p| p.iter().filter(|x| x.ts < kept.1).count() as u64).sum();
    let all = [0, 1];
    wait_reports(&cluster, &all, std::time::Duration::from_secs(240), "history archived", |r| {
        total(r, "pmu", |c| c.dropped_blocks) >= 2 * archived && total(r, "pmu", |c| c.pending_blocks) == 0
    })
    .await?;
    let everything = TimeRange::new(gone.0 - MIN, now)?;
    check_everything(&client, &series, &data, everything).await?;

    // Four days of retention from now on (SIGHUP): what is older vanishes from reads, and the
    // files of days wholly past it from the archive; each node removes its own (and only those).
    // A node removes a day once its end is past its clock minus four days, so which days go
    // is decided by the time of the reload, not by `gone`: between 00:00 and 01:00 UTC the day
    // before the cut-off holds only points of `gone` and goes too (seen at 00:12 UTC: [2, 2]
    // against [1, 1]). A day ending within the next three minutes of the cut-off would go or
    // stay depending on when each node looks: the reload waits until it has passed.
    let mut cut_off = now_ns() - KEEP;
    let next_day_end = cut_off.div_euclid(DAY) * DAY + DAY;
    if next_day_end - cut_off <= 3 * MIN {
        tokio::time::sleep(std::time::Duration::from_nanos((next_day_end - cut_off + SEC) as u64)).await;
        cut_off = now_ns() - KEEP;
    }
    for i in all {
        cluster.edit_config(i, |c| c.classes[0].retention = Some(std::time::Duration::from_secs(4 * 86_400)))?;
        cluster.reload(i)?;
    }
    let must_go = |day: &str| timeshard_tier::Day::parse(day).is_some_and(|d| d.start() + DAY <= cut_off);
    let doomed =
        files_under(&root, "/manifests/").into_iter().filter(|f| day_of_path(f).is_some_and(|d| must_go(&d))).count();
    assert!(doomed >= 2, "days wholly past retention were archived: {doomed} files");
    // Per node, the expired manifests in its own folder.
    let doomed_by: Vec<u64> = all
        .iter()
        .map(|&i| {
            let folder = format!("node={}/", cluster.id(i).to_hex());
            files_under(&root, "/manifests/")
                .iter()
                .filter(|f| f.to_string_lossy().contains(&folder) && day_of_path(f).is_some_and(|d| must_go(&d)))
                .count() as u64
        })
        .collect();
    // Every node's own count, not only the files gone: the reports are read before the files
    // are listed, so a node that removed its files between the two still reported none (seen in
    // a fresh-clone run: [0, 2] against [2, 2]).
    let r = wait_reports(&cluster, &all, std::time::Duration::from_secs(120), "files past retention removed", |r| {
        r.iter().zip(&doomed_by).all(|(n, &mine)| total(std::slice::from_ref(n), "pmu", |c| c.expired_files) >= mine)
            && !files_under(&root, "class=pmu").iter().any(|f| day_of_path(f).is_some_and(|d| must_go(&d)))
    })
    .await?;
    let removers: Vec<u64> = r.iter().map(|n| total(std::slice::from_ref(n), "pmu", |c| c.expired_files)).collect();
    assert_eq!(removers, doomed_by, "each node removes exactly its own expired files");
    assert!(removers.iter().sum::<u64>() >= doomed as u64, "{removers:?} of {doomed}");
    let inside: Vec<Vec<Point>> = data.iter().map(|p| p.iter().filter(|x| x.ts >= kept.0).copied().collect()).collect();
    check_everything(&client, &series, &inside, everything).await?;

    // The archive's objects: nothing of a day wholly past retention; every point inside it,
    // once. (A day the cut-off crosses keeps its file, its expired part hidden, until the
    // whole day is past retention.)
    let db = duckdb(&root)?;
    assert_eq!((db.duplicates_committed, db.duplicates_all), (0, 0), "{db:?}");
    let mut seen = 0;
    for g in &db.groups {
        let (s, day) = (g["series"].as_str().context("series")?, g["day"].as_str().context("day")?);
        assert!(!must_go(day), "no rows of {day} are left: {g}");
        let i = series.iter().position(|x| x.as_str() == s).context("a known series")?;
        let day_start = timeshard_tier::Day::parse(day).context("a day")?.start();
        let of_day = |p: &&Point| p.ts >= day_start && p.ts < day_start + DAY && p.ts < kept.1;
        let kept_rows = inside[i].iter().filter(of_day).count() as u64;
        let all_rows = data[i].iter().filter(of_day).count() as u64;
        let count = g["count"].as_u64().context("count")?;
        assert!(count == kept_rows || count == all_rows, "{s} {day}: {count} rows, {kept_rows} kept of {all_rows}");
        seen += kept_rows;
    }
    let want: u64 = inside.iter().map(|p| p.iter().filter(|x| x.ts < kept.1).count() as u64).sum();
    assert_eq!(seen, want, "every archived point inside retention is in the archive");

    // Switching the archive off for the class keeps its history readable.
    for i in all {
        cluster.edit_config(i, |c| {
            c.classes[0].archive = false;
            c.classes[0].hot = None;
        })?;
        cluster.reload(i)?;
    }
    wait_reports(&cluster, &all, std::time::Duration::from_secs(30), "archive switched off", |r| {
        r.iter().all(|n| n.classes.iter().any(|c| c.class == "pmu" && !c.archive))
    })
    .await?;
    check_everything(&client, &series, &inside, everything).await?;

    client.close().await;
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_times_survive_a_kill_and_age_the_archive() -> Result<()> {
    use std::time::{Duration, Instant};
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    let root = dir.path().join("archive");
    // Archived 10 s after it is written and kept 30 s; not archived and kept 15 s.
    let mut device = archived_class("device", "device.", 1);
    device.hot = Some(Duration::from_secs(10));
    device.retention = Some(Duration::from_secs(30));
    device.age_by = timeshard_proto::AgeBy::Write;
    let scratch = timeshard_node::config::ClassConfig {
        name: "scratch".into(),
        metric_prefix: "scratch.".into(),
        rf: 1,
        w: 1,
        r: 1,
        retention: Some(Duration::from_secs(15)),
        age_by: timeshard_proto::AgeBy::Write,
        ..Default::default()
    };
    options.classes = vec![device, scratch];
    options.tier = quick_tier(root.to_str().unwrap());
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // Weeks-old data arrives: its hot window and retention count from now.
    let now = now_ns();
    let range = TimeRange::new(now - 30 * DAY, now)?;
    let (device, scratch): (SeriesKey, SeriesKey) = ("device.temp{id=1}".parse()?, "scratch.temp{id=1}".parse()?);
    let first = points(1, now - 28 * DAY, now - 28 * DAY + 2 * HOUR, 60 * SEC);
    write(&client, &device, &first).await?;
    write(&client, &scratch, &first).await?;
    let t0 = Instant::now();
    client.close().await;

    // SIGKILL, then a restart: the write times are those of the writes, not of the restart.
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.kill(0).await?;
    let restarted = Instant::now();
    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let blocks = first.len() as u64;
    let r = wait_reports(&cluster, &[0], Duration::from_secs(60), "scratch expired by write time", |r| {
        total(r, "scratch", |c| c.expired_blocks) == blocks
    })
    .await?;
    let expired_at = t0.elapsed();
    assert!(expired_at >= Duration::from_secs(15), "not before its retention passed: {expired_at:?}");
    assert!(restarted.elapsed() < Duration::from_secs(15), "by the write time, not the restart: {r:#?}");
    assert!(client.read(&scratch, range).await?.is_empty());
    wait_reports(&cluster, &[0], Duration::from_secs(60), "device archived by write time", |r| {
        total(r, "device", |c| c.dropped_blocks) == blocks
    })
    .await?;
    assert_eq!(client.read(&device, range).await?, first, "read back from the archive");

    // More old data, archived later; the first retention passes: its files leave the archive,
    // the second batch stays exactly.
    let second = points(1, now - 20 * DAY, now - 20 * DAY + HOUR, 60 * SEC);
    write(&client, &device, &second).await?;
    let t1 = Instant::now();
    let first_days: BTreeSet<String> = first.iter().map(|p| timeshard_tier::Day::of(p.ts).to_string()).collect();
    let of_first = || {
        files_under(&root, "class=device")
            .into_iter()
            .filter(|f| day_of_path(f).is_some_and(|d| first_days.contains(&d)))
    };
    assert!(of_first().count() >= 2, "the first batch was archived");
    let deadline = Instant::now() + Duration::from_secs(60);
    while of_first().count() > 0 {
        ensure!(Instant::now() < deadline, "the first batch's files were not removed");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(t0.elapsed() >= Duration::from_secs(30), "not before its retention passed");
    assert_eq!(client.read(&device, range).await?, second, "the first batch is gone, the second whole");
    ensure!(t1.elapsed() < Duration::from_secs(30), "the second batch should still be kept: the machine is too slow");
    // What is left in the archive is the second batch, once (if it was exported yet).
    let db = duckdb(&root)?;
    let second_days: BTreeSet<String> = second.iter().map(|p| timeshard_tier::Day::of(p.ts).to_string()).collect();
    assert!(db.groups.iter().all(|g| g["day"].as_str().is_some_and(|d| second_days.contains(d))), "{db:?}");
    let rows: u64 = db.groups.iter().filter_map(|g| g["count"].as_u64()).sum();
    assert!(rows == 0 || rows == second.len() as u64, "{db:?}");
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

//! The cold tier end to end on node processes, the archive in a local directory: history past
//! the hot window moves to the archive (each block exported by one owner, dropped from every
//! replica once the archive holds it), and every point reads back through reads, window
//! aggregates, a query policy, `timeshard get` and the SDK across both tiers; late data for an archived quantum
//! is kept and read; DuckDB reads the archive directly and agrees with timeshard per series and
//! day; a corrupt Parquet file fails the reads that need it with an error naming it, while the
//! rest is still served.

mod tier_support;

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use tier_support::*;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

const BIN: &str = env!("CARGO_BIN_EXE_timeshard-e2e");

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
    let out = Command::new(BIN)
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
    let (mut options, dir) = ClusterOptions::for_tests(3, BIN);
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
    let (mut options, dir) = ClusterOptions::for_tests(1, BIN);
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

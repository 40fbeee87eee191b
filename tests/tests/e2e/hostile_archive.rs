//! Damaged files in the archive (cold tier, in a local directory), read by a restarted node
//! process: a manifest cut in half, a manifest with a flipped byte, and a points file with a
//! flipped byte, each of its own UTC day. Reads of a damaged day either give exactly what was
//! written or fail with an error naming the damaged file, or, for a manifest whose seal no
//! longer checks (the byte fell in its sealed header), leave that manifest's blocks out while
//! `timeshard archive status` names it refused; the intact day and the hot data read back
//! exactly, and the node never panics.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;
use crate::tier_support::*;

const SERIES: u64 = 2;

/// Files under `root` whose path has `kind` (`/manifests/` or `/points/`) and day `day`.
fn of_day(root: &Path, kind: &str, day: &str) -> Vec<PathBuf> {
    files_under(root, kind).into_iter().filter(|p| p.to_string_lossy().contains(&format!("day={day}"))).collect()
}

fn day_name(start: i64) -> String {
    timeshard_tier::Day::of(start).to_string()
}

/// Every series read over `range`: exactly `data` within it, or an error naming one of `names`
/// (when `names` is empty, no error is allowed), or, with `refused_ok`, fewer points (checked
/// by the caller against the refused manifests). Returns how many reads failed, and how many
/// of those were short.
async fn check(
    client: &Client,
    series: &[SeriesKey],
    data: &[Vec<Point>],
    range: TimeRange,
    names: &[String],
    refused_ok: bool,
) -> Result<(usize, usize)> {
    let (mut failed, mut short) = (0, 0);
    for (s, written) in series.iter().zip(data) {
        let want: Vec<Point> = written.iter().filter(|p| range.contains(p.ts)).copied().collect();
        let named = |e: timeshard_sdk::Error| {
            let msg = e.to_string();
            ensure!(
                names.iter().any(|n| msg.contains(n.as_str())),
                "{s} over {range:?}: {msg} (names none of {names:?})"
            );
            Ok(())
        };
        match client.read(s, range).await {
            Ok(got) if got == want => {}
            Ok(got) => {
                ensure!(refused_ok, "{s} over {range:?}: {} points read, {} written", got.len(), want.len());
                // A refused manifest's blocks are left out of aggregates alike.
                failed += 1;
                short += 1;
                continue;
            }
            Err(e) => {
                named(e)?;
                failed += 1;
            }
        }
        // Whole days and hours are answered from the manifests' summaries, 90 s windows by
        // reading the points.
        for width in [DAY, HOUR, 90 * SEC] {
            match client.aggregate(s, range, width).await {
                Ok(windows) => assert_windows(
                    &windows,
                    &reference(written, range, width),
                    &format!("{s} in windows of {width} ns"),
                ),
                Err(e) => named(e)?,
            }
        }
    }
    Ok((failed, short))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_manifests_and_points_files_fail_naming_them_and_the_rest_is_served() -> Result<()> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    let root = dir.path().join("archive");
    options.classes = vec![archived_class("pmu", "pmu.", 1)];
    options.tier = quick_tier(root.to_str().unwrap());
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    // Four whole UTC days of history (a point every 5 minutes), past the hot window of a day,
    // and the last hour, hot.
    let now = now_ns();
    let first_day = now - 6 * DAY - (now - 6 * DAY).rem_euclid(DAY);
    let days: Vec<TimeRange> =
        (0..4).map(|d| TimeRange::new(first_day + d * DAY, first_day + (d + 1) * DAY)).collect::<Result<_, _>>()?;
    let hot = TimeRange::new(now - HOUR, now - MIN)?;
    let series: Vec<SeriesKey> =
        (0..SERIES).map(|i| format!("pmu.freq{{bus={i}}}").parse()).collect::<Result<_, _>>()?;
    let mut data = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let mut p = points(i as u64, days[0].start() - 1, days[3].end(), 5 * MIN);
        p.extend(points(i as u64, hot.start(), hot.end(), 5 * MIN));
        write(&client, s, &p).await?;
        data.push(p);
    }
    let cold: u64 = data.iter().map(|p| p.iter().filter(|x| x.ts < days[3].end()).count() as u64).sum();
    wait_reports(&cluster, &[0], Duration::from_secs(120), "history archived", |r| {
        total(r, "pmu", |c| c.dropped_blocks) >= cold && total(r, "pmu", |c| c.pending_blocks) == 0
    })
    .await?;
    for range in &days {
        ensure!(check(&client, &series, &data, *range, &[], false).await?.0 == 0, "before the damage");
    }
    client.close().await;
    assert!(cluster.terminate(0).await?, "the node stops cleanly");

    // Day 0: its manifests cut in half. Day 1: a byte flipped in the middle of each manifest.
    // Day 2: a byte flipped in the middle of each points file. Day 3 stays whole.
    let damaged: Vec<Vec<PathBuf>> = vec![
        of_day(&root, "/manifests/", &day_name(days[0].start())),
        of_day(&root, "/manifests/", &day_name(days[1].start())),
        of_day(&root, "/points/", &day_name(days[2].start())),
        Vec::new(),
    ];
    for (d, files) in damaged.iter().enumerate() {
        ensure!(d == 3 || !files.is_empty(), "no file of day {d} to damage under {}", root.display());
        for f in files {
            let mut bytes = std::fs::read(f)?;
            let mid = bytes.len() / 2;
            if d == 0 {
                bytes.truncate(mid);
            } else {
                bytes[mid] ^= 0x5a;
            }
            std::fs::write(f, bytes)?;
        }
    }
    let names = |d: usize| -> Vec<String> {
        damaged[d].iter().map(|f| f.strip_prefix(&root).unwrap_or(f).to_string_lossy().into_owned()).collect()
    };

    cluster.restart(0).await?;
    let client = cluster.client(0).await?;
    let mut failed = Vec::new();
    for (d, range) in days.iter().enumerate() {
        let (f, short) =
            check(&client, &series, &data, *range, &names(d), d == 1).await.with_context(|| format!("day {d}"))?;
        if short > 0 {
            let report = client.archive_status().await?;
            ensure!(
                report.refused.iter().any(|r| names(d).iter().any(|n| r.contains(n.as_str()))),
                "day {d}: reads left points out, but no damaged manifest is reported refused: {:?}",
                report.refused
            );
        }
        failed.push(f);
    }
    ensure!(failed[3] == 0, "the whole day fails nothing: {failed:?}");
    ensure!(failed[0] == SERIES as usize, "a manifest cut in half fails every read of its day: {failed:?}");
    ensure!(check(&client, &series, &data, hot, &[], false).await?.0 == 0, "the hot data");
    let log = std::fs::read_to_string(cluster.log(0)).unwrap_or_default();
    ensure!(!log.contains("panicked"), "the node panicked:\n{log}");
    println!(
        "reads failing per series, naming the file: {} of {SERIES} (manifest cut in half), {} (manifest with a \
         flipped byte), {} (points file with a flipped byte), {} (whole); the hot data and every other read exact",
        failed[0], failed[1], failed[2], failed[3]
    );
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// A rogue device (issue 25, "The archive"): it holds a valid node certificate of the fleet
/// and writes to the archive, sealing with its own key a copy of node 0's manifest that says it
/// is node 0's export, once in its own folder and once in node 0's (a bucket that lets it).
/// Node 0 refuses both, names and counts them in `timeshard archive status`, and every point
/// reads back exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_devices_manifests_are_refused_and_every_point_reads_back() -> Result<()> {
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    use timeshard_tier::layout::Kind;
    use timeshard_tier::manifest::{Header, Manifest};

    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    let root = dir.path().join("archive");
    options.classes = vec![archived_class("pmu", "pmu.", 1)];
    options.tier = quick_tier(root.to_str().unwrap());
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    let now = now_ns();
    let day = now - 3 * DAY - (now - 3 * DAY).rem_euclid(DAY);
    let range = TimeRange::new(day, day + DAY)?;
    let series: SeriesKey = "pmu.freq{bus=0}".parse()?;
    let data = points(0, range.start(), range.end(), 5 * MIN);
    write(&client, &series, &data).await?;
    wait_reports(&cluster, &[0], Duration::from_secs(120), "history archived", |r| {
        total(r, "pmu", |c| c.dropped_blocks) >= data.len() as u64 && total(r, "pmu", |c| c.pending_blocks) == 0
    })
    .await?;

    // The rogue: a node certificate the fleet CA issued, and the archive's files.
    let files = timeshard_node::pki::issue(&cluster.pki_dir(), "rogue", timeshard_node::pki::Role::Node)?;
    let rogue = timeshard_tier::seal::Keys::of(&timeshard_sdk::tls::Identity::load(&files)?)?;
    let victim = cluster.id(0).to_hex();
    let store =
        timeshard_tier::Location::parse(root.to_str().context("a UTF-8 path")?)?.open(&[], Duration::from_secs(5))?;
    let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(None)).await?;
    let genuine = listed
        .iter()
        .filter_map(|m| timeshard_tier::FileId::parse(&m.location))
        .find(|(id, k)| *k == Kind::Manifest && id.node == victim)
        .context("node 0's manifest")?
        .0;
    let manifest = Manifest::open(&*store, &genuine, None).await?;
    let entries = manifest.entries(&*store, None).await?;
    let mut planted = Vec::new();
    for folder in [rogue.node(), victim.clone()] {
        let id = timeshard_tier::FileId { node: folder, seq: 9, ..genuine.clone() };
        let header = Header { node: victim.clone(), seq: 9, ..manifest.header.clone() };
        let bytes = timeshard_tier::write::encode_manifest(&header, &entries, Some(&rogue))?;
        store.put(&id.path(Kind::Manifest), PutPayload::from(bytes)).await?;
        planted.push(id.path(Kind::Manifest).to_string());
    }

    // Past the listing TTL, reads see the planted manifests, refuse them, and read exactly.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        check(&client, std::slice::from_ref(&series), std::slice::from_ref(&data), range, &[], false).await?.0 == 0
    );
    let report = client.archive_status().await?;
    ensure!(report.refused_manifests == 2, "{:?}", report.refused);
    for p in &planted {
        ensure!(report.refused.iter().any(|r| r.contains(p.as_str())), "{p} not named in {:?}", report.refused);
    }
    ensure!(report.refused.iter().any(|r| r.contains(&format!("sealed by node {}", rogue.node()))));
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

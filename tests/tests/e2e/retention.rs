//! Retention is decided by the class that owns a series, and nothing else: a class without a
//! retention keeps its points even under a broader class that has one, and a catch-all
//! retention does not expire the quantum index of a keep-forever class. SIGHUP applies a
//! changed retention to a running node. Points are stamped ~100 days before now (live clock).

use std::time::{Duration, Instant};

use timeshard_node::config::ClassConfig;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;

const DAY: Duration = Duration::from_secs(86_400);
const SECOND_NS: i64 = 1_000_000_000;

fn class(name: &str, prefix: &str, retention: Option<Duration>) -> ClassConfig {
    ClassConfig { name: name.into(), metric_prefix: prefix.into(), rf: 1, w: 1, r: 1, retention, ..Default::default() }
}

/// One point a second for `seconds`, starting `days_ago` days before now.
fn points(days_ago: u64, seconds: i64) -> Vec<Point> {
    let now = timeshard_clock::now_ns();
    let start = (now - (DAY * days_ago as u32).as_nanos() as i64) / SECOND_NS * SECOND_NS;
    (0..seconds).map(|i| Point::new(start + i * SECOND_NS, i as f64)).collect()
}

async fn read_all(client: &Client, series: &SeriesKey, written: &[Point]) -> anyhow::Result<Vec<Point>> {
    let range = TimeRange::new(written[0].ts, written[written.len() - 1].ts + 1)?;
    Ok(client.read(series, range).await?)
}

/// Waits until `series` reads back empty (retention removed it).
async fn wait_expired(client: &Client, series: &SeriesKey, written: &[Point]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if read_all(client, series, written).await?.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{series} was not expired within 60 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owning_class_decides_retention_and_sighup_reloads_it() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![
        class("all", "", Some(DAY * 90)),
        class("pmu", "pmu.", Some(DAY * 90)),
        class("phase", "pmu.phase", None),
        class("keep", "keep.", None),
    ];
    let cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;

    let expiring: SeriesKey = "pmu.freq{bus=1}".parse()?;
    let phase: SeriesKey = "pmu.phase{bus=1}".parse()?;
    let other: SeriesKey = "misc.temp{room=1}".parse()?;
    // 20 minutes in 10 s quanta: 120 quanta, so reads go through the series' quantum index.
    let kept: SeriesKey = "keep.level{tank=1}".parse()?;
    let old = points(100, 1_200);
    for series in [&expiring, &phase, &other, &kept] {
        client.write(series, &old).await?;
    }

    // Retention passes run about once a minute; SIGHUP re-applies the (unchanged) rules and
    // runs one at once. Both 90-day classes expire their 100-day-old points ...
    cluster.reload(0)?;
    wait_expired(&client, &expiring, &old).await?;
    wait_expired(&client, &other, &old).await?;
    // ... and, after a few more maintenance passes, the keep-forever classes still hold
    // everything, the long read of `keep.` included (it needs the quantum index).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(read_all(&client, &phase, &old).await?, old, "pmu.phase keeps its points under pmu.'s 90 days");
    assert_eq!(read_all(&client, &kept, &old).await?, old, "keep.'s quantum index outlives the catch-all retention");

    // A retention given to pmu.phase in the file applies on SIGHUP, without a restart.
    cluster.edit_config(0, |c| {
        for class in c.classes.iter_mut().filter(|c| c.name == "phase") {
            class.retention = Some(DAY * 30);
        }
    })?;
    cluster.reload(0)?;
    wait_expired(&client, &phase, &old).await?;
    assert_eq!(read_all(&client, &kept, &old).await?, old, "keep. is untouched by the reload");

    client.close().await;
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

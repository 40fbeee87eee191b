//! Context-of-interest replication on 8 node processes: four around Atlanta, and Houston, San
//! Francisco, Chicago and Seattle. The `traffic.` class keeps 2 in-CoI replicas (quorum) and 1
//! out-of-CoI replica at least 1,000 km away (asynchronous).
//!
//! Points of Atlanta series (fixed historical timestamps, and live ones near now) are
//! acknowledged through an Atlanta node. Then every Atlanta node is killed with SIGKILL: every
//! acknowledged point still reads back, one by one, from the far replicas, through Houston;
//! writes to Atlanta's series are refused, retryably, naming the in-CoI owners down (no other
//! node stands in for them: an in-CoI quorum read would miss what only a stand-in holds). When
//! Atlanta comes back, the retried write is acknowledged and its quorum reads see every point.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use timeshard_node::config::{ClassConfig, CoiConfig};
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};
use timeshard_sdk::{Client, SeriesPoints};
use timeshard_testkit::bench::coi::{ATLANTA, HOUSTON, LOCATIONS};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::ledger::{Ledger, LiveWriter};

use crate::NODE;

/// A fixed historical time: 2021-01-01.
const T0: i64 = 1_609_459_200_000_000_000;

fn coi_class() -> ClassConfig {
    ClassConfig {
        name: "traffic".into(),
        metric_prefix: "traffic.".into(),
        quantum: Duration::from_secs(2),
        coi: Some(CoiConfig {
            n_in: 2,
            n_out: 1,
            in_coi_dist: "50km".into(),
            out_coi_dist: "1000km".into(),
            coi_size: "50km".into(),
            precision: 5,
            // Live series carry no location tags: they are Atlanta's.
            location: Some("33.749,-84.388".into()),
        }),
        ..ClassConfig::default()
    }
}

/// Reads every acknowledged point back, series by series, and returns those missing.
async fn missing(ledger: &Ledger, client: &Client) -> anyhow::Result<(usize, Vec<String>)> {
    let mut checked = 0;
    let mut missing = Vec::new();
    for (series, points) in ledger.acked() {
        let first = points.iter().map(|p| p.ts).min().unwrap_or(0);
        let last = points.iter().map(|p| p.ts).max().unwrap_or(0);
        let have: HashSet<PointKey> =
            client.read(series, TimeRange::new(first, last + 1)?).await?.iter().map(Point::key).collect();
        for p in points {
            checked += 1;
            if !have.contains(&p.key()) {
                missing.push(format!("{series} at {}", p.ts));
            }
        }
    }
    Ok((checked, missing))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_down_loses_no_acknowledged_point() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(LOCATIONS.len(), NODE);
    let mut sensors = coi_class();
    sensors.name = "sensor".into();
    sensors.metric_prefix = "sensor.".into();
    sensors.coi.as_mut().expect("coi").location = None;
    options.classes = vec![coi_class(), sensors];
    options.locations = LOCATIONS.iter().map(|l| Some(l.to_string())).collect();
    let mut cluster = LocalCluster::start_converged(options).await?;

    // A series of a CoI class without a location (no tags, no class default) is refused,
    // naming the tags to add; so is a malformed geohash.
    let atl = cluster.client(0).await?;
    let err = atl.write(&"sensor.temp".parse()?, &[Point::new(T0, 1.0)]).await.expect_err("no location: refused");
    assert!(err.to_string().contains("geohash=") && err.to_string().contains("lat="), "{err}");
    let bad: SeriesKey = "traffic.speed{geohash=dn5a}".parse()?;
    let err = atl.write(&bad, &[Point::new(T0, 1.0)]).await.expect_err("a malformed geohash is refused");
    assert!(err.to_string().contains("dn5a") && err.to_string().contains("geohash"), "{err}");

    // Fixed historical points of Atlanta series, tagged by geohash and by lat/lon.
    let mut ledger = Ledger::default();
    for seg in 0..6 {
        let series: SeriesKey = if seg % 2 == 0 {
            format!("traffic.speed{{geohash=dn5bpsb,seg={seg}}}").parse()?
        } else {
            format!("traffic.speed{{lat=33.76,lon=-84.39,seg={seg}}}").parse()?
        };
        let points: Vec<Point> = (0..2_000).map(|i| Point::new(T0 + i * 10_000_000, (seg * 1000 + i) as f64)).collect();
        atl.write_batch(vec![SeriesPoints { series: series.clone(), points: points.clone() }]).await?;
        ledger.ack(&series, &points);
    }
    // Live points near now, through another Atlanta node.
    let live = LiveWriter::start(cluster.client(1).await?, "traffic.live", 4);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (acked_live, ok, failed) = live.stop().await?;
    assert!(ok > 0, "live writes acknowledged: {ok}, failed {failed}");
    ledger.merge(acked_live);
    atl.close().await;
    // Out-of-CoI replicas are written asynchronously, right after the acknowledgement: give
    // them a moment before the region goes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    for i in ATLANTA {
        cluster.kill(i).await?;
    }
    let killed = Instant::now();
    println!("killed every Atlanta node; {} acknowledged points to check", ledger.points());

    let far = cluster.client(HOUSTON).await?;
    let (checked, lost) = missing(&ledger, &far).await?;
    assert!(
        lost.is_empty(),
        "{} of {checked} acknowledged points unreadable with Atlanta down: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    println!("{checked} points read back from the far replicas {:?} after the kill", killed.elapsed());

    // Writes to Atlanta's series are refused once the others see Atlanta down (suspect_after
    // 3 s): only in-CoI owners count towards the write's quorum. Nothing is written.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during: SeriesKey = "traffic.speed{geohash=dn5bpsb,seg=0}".parse()?;
    let now = timeshard_clock::now_ns();
    let new_points: Vec<Point> = (0..200)
        .map(|i| Point::new(now + i * 1_000_000, i as f64))
        .chain((0..200).map(|i| Point::new(T0 + 100_000_000_000 + i, 0.5)))
        .collect();
    let err = far.write(&during, &new_points).await.expect_err("no in-CoI owner is up: refused");
    assert!(err.to_string().contains("in-CoI owners") && err.to_string().contains("retry"), "{err}");
    let (_, lost) = missing(&ledger, &far).await?;
    assert!(lost.is_empty(), "a refused write lost nothing: {:?}", &lost[..lost.len().min(5)]);

    // Atlanta comes back; the client retries its write (idempotent) until it is acknowledged,
    // then an Atlanta client, inside the CoI, reads by quorum over the in-CoI replicas.
    for i in ATLANTA {
        cluster.restart(i).await?;
    }
    let back = Instant::now();
    while let Err(e) = far.write(&during, &new_points).await {
        assert!(back.elapsed() < Duration::from_secs(60), "writes still refused after Atlanta came back: {e}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ledger.ack(&during, &new_points);
    println!("the retried write was acknowledged {:?} after Atlanta's restart", back.elapsed());
    let back = Instant::now();
    loop {
        let atl = cluster.client(0).await?;
        let result = missing(&ledger, &atl).await;
        atl.close().await;
        match result {
            Ok((_, lost)) if lost.is_empty() => break,
            Ok((_, lost)) => {
                assert!(
                    back.elapsed() < Duration::from_secs(60),
                    "Atlanta did not catch up: {:?}",
                    &lost[..lost.len().min(5)]
                );
            }
            Err(e) => assert!(back.elapsed() < Duration::from_secs(60), "Atlanta reads still fail: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("Atlanta caught up {:?} after its restart", back.elapsed());
    far.close().await;
    assert_eq!(cluster.shutdown().await?, LOCATIONS.len(), "every node exits cleanly");
    Ok(())
}

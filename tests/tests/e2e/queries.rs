//! Window aggregates and series listing across a cluster of node processes, including a
//! replica that missed writes while it was down: answers still cover every acknowledged point.

use timeshard_node::config::ClassConfig;
use timeshard_proto::window::WindowStats;
use timeshard_proto::wire::{ErrorCode, SeriesFilter};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{self, T0};

use crate::NODE;

const SEC: i64 = 1_000_000_000;

/// One window as the reference computes it.
#[derive(Debug)]
struct Expected {
    start: i64,
    end: i64,
    count: u64,
    min: f64,
    max: f64,
    sum: f64,
    first: f64,
    last: f64,
}

/// The reference: windows computed directly from the points.
fn expected_windows(points: &[Point], range: &TimeRange, width: i64) -> Vec<Expected> {
    let mut out: Vec<Expected> = Vec::new();
    let mut sorted: Vec<Point> = points.iter().copied().filter(|p| range.contains(p.ts)).collect();
    timeshard_proto::point::sort_dedup(&mut sorted);
    for p in sorted {
        let w = p.ts.div_euclid(width);
        match out.last_mut() {
            Some(o) if o.start.div_euclid(width) == w => {
                o.count += 1;
                o.min = o.min.min(p.value);
                o.max = o.max.max(p.value);
                o.sum += p.value;
                o.last = p.value;
            }
            _ => out.push(Expected {
                start: (w * width).max(range.start()),
                end: ((w + 1) * width).min(range.end()),
                count: 1,
                min: p.value,
                max: p.value,
                sum: p.value,
                first: p.value,
                last: p.value,
            }),
        }
    }
    out
}

fn assert_windows(got: &[WindowStats], points: &[Point], range: &TimeRange, width: i64) {
    let want = expected_windows(points, range, width);
    assert_eq!(got.len(), want.len(), "number of windows");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.start, g.end, g.count), (w.start, w.end, w.count));
        assert_eq!((g.min, g.max, g.first, g.last), (w.min, w.max, w.first, w.last), "window at {}", g.start);
        assert!((g.sum - w.sum).abs() < 1e-6 * w.sum.abs().max(1.0), "sum {} vs {}", g.sum, w.sum);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_and_series_lists_cover_every_acknowledged_point() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(5, NODE);
    // Reads ask all three replicas, so a replica that missed writes is always among them.
    options.classes =
        vec![ClassConfig { name: "pmu".into(), metric_prefix: "pmu.".into(), rf: 3, w: 2, r: 3, ..Default::default() }];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let writer = cluster.client(0).await?;

    let a = datasets::pmu_series(1);
    let b: SeriesKey = "pmu.current{bus=2,site=bos}".parse()?;
    let mut points: Vec<Point> = datasets::pmu(1).take(5 * 60 * 60).collect();
    // Several events at one timestamp, and an exact duplicate.
    points.push(Point { ts: points[100].ts, value: 7.5, event: 3 });
    points.push(points[200]);
    writer.write(&a, &points).await?;
    writer.write(&b, &datasets::pmu(2).take(600).collect::<Vec<_>>()).await?;

    let reader = cluster.client(3).await?;
    let range = TimeRange::new(T0 + 7 * SEC + 123, T0 + 290 * SEC)?;
    for width in [60 * SEC, SEC, 25 * SEC] {
        let got = reader.aggregate(&a, range, width).await?;
        assert_windows(&got, &points, &range, width);
    }

    // A node misses writes while down, then comes back with its old data only.
    cluster.kill(4).await?;
    let late: Vec<Point> = datasets::pmu(1).skip(5 * 60 * 60).take(60 * 60).collect();
    writer.write(&a, &late).await?;
    cluster.restart(4).await?;
    cluster.wait_converged(std::time::Duration::from_secs(30)).await?;
    points.extend(&late);
    let range = TimeRange::new(T0, T0 + 6 * 60 * SEC)?;
    let got = reader.aggregate(&a, range, 60 * SEC).await?;
    assert_windows(&got, &points, &range, 60 * SEC);
    // Through the stale node itself, whose own (incomplete) answer comes first.
    let stale = cluster.client(4).await?;
    let got = stale.aggregate(&a, range, 60 * SEC).await?;
    assert_windows(&got, &points, &range, 60 * SEC);
    let raw = reader.read(&a, range).await?;
    assert_eq!(raw.len(), expected_windows(&points, &range, 60 * SEC).iter().map(|w| w.count as usize).sum::<usize>());

    // A sparse series: a minute now and a minute 30 days later. Reading the whole month (over
    // 259,000 quanta) touches only the quanta that hold data, found in the quantum index.
    let sparse: SeriesKey = "pmu.sparse{bus=9,site=atl}".parse()?;
    let month = 30 * 86_400 * SEC;
    let mut sparse_points: Vec<Point> = datasets::pmu(9).take(3_600).collect();
    sparse_points.extend(datasets::pmu(9).take(3_600).map(|p| Point { ts: p.ts + month, ..p }));
    writer.write(&sparse, &sparse_points).await?;
    let whole = TimeRange::new(T0 - 86_400 * SEC, T0 + month + 86_400 * SEC)?;
    let cluster_bytes = || async {
        let mut total = 0;
        for i in 0..5 {
            total += cluster.client(i).await?.status().await?.bytes_sent;
        }
        anyhow::Ok(total)
    };
    let before = cluster_bytes().await?;
    assert_eq!(reader.read(&sparse, whole).await?, sparse_points);
    let days = reader.aggregate(&sparse, whole, 86_400 * SEC).await?;
    assert_eq!(days.iter().map(|w| w.count).collect::<Vec<_>>(), vec![3_600, 3_600]);
    // Two reads of 7,200 points: a few hundred kilobytes. Asking every one of the month's
    // 259,000 quanta would take tens of megabytes of requests alone.
    let moved = cluster_bytes().await? - before;
    assert!(moved < 2_000_000, "reading a sparse month moved {moved} bytes");
    // timeshard's own bookkeeping series are not for clients.
    let err = reader.read(&"_timeshard.quanta{of=abc}".parse()?, whole).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidSeries), "{err}");

    // Listing by metric prefix and by tag.
    let all = SeriesFilter { metric_prefix: "pmu.".into(), tags: vec![] };
    let (listed, more) = reader.list_series(all, 100).await?;
    assert_eq!(listed, vec![b.clone(), a.clone(), sparse.clone()]);
    assert!(!more);
    let atl = SeriesFilter { metric_prefix: String::new(), tags: vec![("site".into(), "atl".into())] };
    assert_eq!(reader.list_series(atl, 100).await?.0, vec![a.clone(), sparse.clone()]);
    let (one, more) = reader.list_series(SeriesFilter::default(), 1).await?;
    assert_eq!((one.len(), more), (1, true));

    // Bad windows and unknown series are refused with their codes.
    let err = reader.aggregate(&a, range, 0).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidRange), "{err}");
    let err = reader.aggregate(&a, TimeRange::new(T0, T0 + 86_400 * SEC)?, 1_000).await.unwrap_err();
    assert!(err.to_string().contains("windows"), "{err}");
    let err = reader.aggregate(&"pmu.none".parse()?, range, SEC).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownSeries), "{err}");

    assert_eq!(cluster.shutdown().await?, 5);
    Ok(())
}

/// A node alone since its data began (no bootstrap peers, never another member) settles once
/// its catch-up round ran, so its replica answers count and window reads use block summaries.
/// Before, a round that reached no neighbour never completed: a single node never settled, and
/// every window read reconciled the raw points of every block (a day's 1-minute windows took
/// 750 ms instead of 27 ms in `bench http`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_alone_since_its_data_began_settles_and_reads_summaries() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig {
        name: "all".into(),
        quantum: std::time::Duration::from_secs(1),
        rf: 1,
        w: 1,
        r: 1,
        ..Default::default()
    }];
    let mut cluster = LocalCluster::start_converged(options).await?;
    let client = cluster.client(0).await?;
    let key = datasets::pmu_series(1);
    let points: Vec<Point> = datasets::pmu_points(1, 0, 6_000).collect();
    client.write(&key, &points).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cluster.status(0).await?.repair.settled {
        anyhow::ensure!(std::time::Instant::now() < deadline, "a lone node did not settle within 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let range = TimeRange::new(T0, T0 + 100 * SEC).unwrap();
    let windows = client.aggregate(&key, range, 10 * SEC).await?;
    assert_windows(&windows, &points, &range, 10 * SEC);
    client.close().await;
    // Restarted, it is still alone (no marker of peers in its data directory): it settles again.
    cluster.terminate(0).await?;
    cluster.restart(0).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cluster.status(0).await?.repair.settled {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the restarted lone node did not settle within 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(!cluster.data_dir(0).join("peers_seen").exists());
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

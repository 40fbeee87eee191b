//! Differential consistency of context-of-interest classes on node processes.
//!
//! - Never stale inside the CoI: on the 8-node topology of `bench coi` (four nodes around
//!   Atlanta, Houston, San Francisco, Chicago, Seattle) with WAN emulation, writer tasks add
//!   new points to a few Atlanta series while reader tasks ask for their `latest` point by
//!   in-CoI quorum (n_in 3: W 2, R 2), through Atlanta coordinators and through far ones whose
//!   clients declare an Atlanta location. No read may return an older point than the last
//!   update acknowledged before the read began.
//! - The client's declared location decides, not the coordinator's: with the out-of-CoI
//!   replica cut off from the region (so it lags), a Portland coordinator answers a client that
//!   declares nothing from that nearest replica (stale: eventual), and one that declares an
//!   Atlanta location by quorum over the in-CoI replicas (the acknowledged point).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use timeshard_clock::now_ns;
use timeshard_node::config::{ClassConfig, WanEmulation};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_testkit::bench::coi::{ATLANTA, LOCATIONS, city_coi};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::inspect::Inspector;

use crate::NODE;

/// Where the Atlanta clients say they are.
const ATL: (f64, f64) = (33.749, -84.388);

fn coi_class(n_in: u8) -> ClassConfig {
    ClassConfig {
        name: "traffic".into(),
        metric_prefix: "traffic.".into(),
        quantum: Duration::from_secs(2),
        coi: Some(city_coi(n_in)),
        ..ClassConfig::default()
    }
}

/// One acknowledged update or one read, with when it happened.
#[derive(Default)]
struct History {
    /// Per series: (acknowledged at, timestamp written).
    acks: HashMap<usize, Vec<(Instant, i64)>>,
    /// (series, read began at, timestamp returned).
    reads: Vec<(usize, Instant, i64)>,
    failed_writes: usize,
    failed_reads: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_coi_quorum_reads_never_see_a_stale_point() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(LOCATIONS.len(), NODE);
    options.classes = vec![coi_class(3)];
    options.locations = LOCATIONS.iter().map(|l| Some(l.to_string())).collect();
    options.wan_emulation = Some(WanEmulation { per_hop_ms: 0.2, route_factor: 1.5 });
    let cluster = LocalCluster::start_converged(options).await?;
    // In-CoI reads need every in-CoI owner settled (they fail, retryably, while one catches
    // up): a fresh node is not until its first catch-up round.
    cluster.wait_settled(Duration::from_secs(60)).await?;

    let series: Vec<SeriesKey> =
        (0..3).map(|i| format!("traffic.speed{{geohash=dn5bpsb,seg={i}}}").parse()).collect::<Result<_, _>>()?;
    let series = Arc::new(series);
    // Timestamps from one counter: a later update of a series carries a later timestamp (live
    // ones, in quanta that have not ended yet).
    let clock = Arc::new(AtomicI64::new(now_ns()));
    let next_ts = {
        let clock = clock.clone();
        move || clock.fetch_add(1_000_000, Ordering::SeqCst)
    };
    let history = Arc::new(Mutex::new(History::default()));
    let seed = cluster.client(ATLANTA[0]).await?;
    for (i, s) in series.iter().enumerate() {
        let ts = next_ts();
        seed.write(s, &[Point::new(ts, 0.0)]).await?;
        history.lock().unwrap().acks.entry(i).or_default().push((Instant::now(), ts));
    }
    seed.close().await;

    let run_for = Duration::from_secs(12);
    let started = Instant::now();
    let mut tasks = Vec::new();
    // Writers through Atlanta nodes.
    for w in 0..3 {
        let client = cluster.client(ATLANTA[w % ATLANTA.len()]).await?;
        let (series, history, next_ts) = (series.clone(), history.clone(), next_ts.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while started.elapsed() < run_for {
                let i = (w + n) % series.len();
                n += 1;
                let ts = next_ts();
                match client.write(&series[i], &[Point::new(ts, n as f64)]).await {
                    Ok(_) => history.lock().unwrap().acks.entry(i).or_default().push((Instant::now(), ts)),
                    Err(_) => history.lock().unwrap().failed_writes += 1,
                }
            }
            client.close().await;
        }));
    }
    // Readers: two through Atlanta coordinators (inside by their own location), two through
    // Houston and Chicago whose clients declare an Atlanta location.
    let readers: Vec<Client> = vec![
        cluster.client(ATLANTA[1]).await?,
        cluster.client(ATLANTA[2]).await?,
        cluster.client(4).await?.with_location(ATL.0, ATL.1)?,
        cluster.client(6).await?.with_location(ATL.0, ATL.1)?,
    ];
    for (r, client) in readers.into_iter().enumerate() {
        let (series, history) = (series.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while started.elapsed() < run_for {
                let i = (r + n) % series.len();
                n += 1;
                let began = Instant::now();
                match client.latest(&series[i]).await {
                    Ok(Some(p)) => history.lock().unwrap().reads.push((i, began, p.ts)),
                    Ok(None) => history.lock().unwrap().failed_reads.push(format!("{}: no point", series[i])),
                    Err(e) => history.lock().unwrap().failed_reads.push(e.to_string()),
                }
            }
            client.close().await;
        }));
    }
    for t in tasks {
        t.await?;
    }

    let history = std::mem::take(&mut *history.lock().unwrap());
    let acked: usize = history.acks.values().map(Vec::len).sum();
    println!(
        "{acked} updates acknowledged ({} failed), {} reads ({} failed) in {:?}",
        history.failed_writes,
        history.reads.len(),
        history.failed_reads.len(),
        started.elapsed()
    );
    assert!(acked >= 30, "too few updates acknowledged to mean anything: {acked}");
    assert!(
        history.reads.len() >= 30,
        "too few reads to mean anything: {}; the first failures: {:?}",
        history.reads.len(),
        &history.failed_reads[..history.failed_reads.len().min(5)]
    );
    assert!(
        history.failed_reads.len() * 20 <= history.reads.len(),
        "reads failed: {:?}",
        &history.failed_reads[..history.failed_reads.len().min(5)]
    );
    let mut stale = Vec::new();
    for &(i, began, got) in &history.reads {
        let must_see = history.acks[&i].iter().filter(|(at, _)| *at < began).map(|&(_, ts)| ts).max();
        if let Some(want) = must_see
            && got < want
        {
            stale.push(format!("{}: read {got}, but {want} was acknowledged before the read began", series[i]));
        }
    }
    assert!(
        stale.is_empty(),
        "{} of {} reads were stale: {:?}",
        stale.len(),
        history.reads.len(),
        &stale[..stale.len().min(5)]
    );
    assert_eq!(cluster.shutdown().await?, LOCATIONS.len(), "every node exits cleanly");
    Ok(())
}

/// Whether node `i` holds points of `series`.
async fn holds(
    inspector: &mut Inspector,
    cluster: &LocalCluster,
    i: usize,
    series: &SeriesKey,
) -> anyhow::Result<bool> {
    Ok(inspector.blocks(cluster.addr(i)).await?.iter().any(|b| &b.series == series && b.count > 0))
}

/// Nodes of the client-location test: two in Atlanta, one in Seattle, one in Portland.
const NW_LOCATIONS: [&str; 4] = ["33.749,-84.388", "33.775,-84.396", "47.606,-122.332", "45.515,-122.679"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_declared_location_decides_quorum_or_fastest_replica() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(NW_LOCATIONS.len(), NODE);
    options.classes = vec![coi_class(2)];
    options.locations = NW_LOCATIONS.iter().map(|l| Some(l.to_string())).collect();
    options.fault_injection = true;
    let cluster = LocalCluster::start_converged(options).await?;
    // Replicas answer as settled only after their first catch-up round; until then a read
    // asks further ones, and the lagging replica would not be the one answering.
    cluster.wait_settled(Duration::from_secs(30)).await?;
    let series: SeriesKey = "traffic.speed{geohash=dn5bpsb}".parse()?;
    let v1 = Point::new(now_ns(), 1.0);
    let atl = cluster.client(0).await?;
    atl.write(&series, &[v1]).await?;

    // The out-of-CoI replica is one of the two north-western nodes (both are over 1,000 km
    // away): the one that receives the point (asynchronously). The other coordinates.
    let mut inspector = Inspector::new(&cluster).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let far = loop {
        let seattle = holds(&mut inspector, &cluster, 2, &series).await?;
        let portland = holds(&mut inspector, &cluster, 3, &series).await?;
        assert!(!(seattle && portland), "one out-of-CoI replica, not two");
        match (seattle, portland) {
            (true, _) => break 2,
            (_, true) => break 3,
            _ => assert!(Instant::now() < deadline, "no out-of-CoI replica received the point"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let coordinator = 5 - far;
    inspector.close().await;

    // Cut the out-of-CoI replica off from the region: the next point is acknowledged by the
    // in-CoI quorum and reaches it only later.
    cluster.partition(&[&[0, 1], &[far]])?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let v2 = Point::new(v1.ts + 1_000_000, 2.0);
    atl.write(&series, &[v2]).await?;

    let plain = cluster.client(coordinator).await?;
    let got = plain.latest(&series).await?.map(|p| p.ts);
    assert_eq!(got, Some(v1.ts), "a client declaring nothing, through Portland/Seattle, reads the nearest replica");
    let inside = plain.with_location(ATL.0, ATL.1)?;
    assert_eq!(inside.location().map(|p| (p.lat, p.lon)), Some(ATL));
    let got = inside.latest(&series).await?.map(|p| p.ts);
    assert_eq!(got, Some(v2.ts), "a client declaring Atlanta reads by in-CoI quorum");
    // Streamed range reads (another path through the node) decide the same way.
    let range = TimeRange::new(v1.ts, v2.ts + 1)?;
    let streamed = async |client: &Client| -> anyhow::Result<Vec<i64>> {
        let batches: Vec<_> = client.read_stream(&series, range).collect().await;
        let mut ts = Vec::new();
        for b in batches {
            ts.extend(b?.timestamps.iter().copied());
        }
        Ok(ts)
    };
    assert_eq!(streamed(&plain).await?, [v1.ts], "streamed, declaring nothing: the nearest replica");
    assert_eq!(streamed(&inside).await?, [v1.ts, v2.ts], "streamed, declaring Atlanta: in-CoI quorum");
    // The CLI says the same with --location.
    let pki = cluster.pki_dir();
    let addr = cluster.addr(coordinator).to_string();
    let cli = |location: Option<&str>| {
        let mut cmd = std::process::Command::new(NODE);
        cmd.args(["get", series.as_str(), "--latest", "--node", &addr, "--pki"]).arg(&pki);
        if let Some(l) = location {
            cmd.args(["--location", l]);
        }
        cmd.output()
    };
    let out = cli(Some("33.749,-84.388"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&v2.ts.to_string()),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(Some("95,-84.388"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--location") && err.contains("latitude"), "{err}");
    assert!(plain.with_location(33.7, 181.0).unwrap_err().to_string().contains("longitude"));

    // Healed, the far replica catches up and the plain read sees the point too.
    cluster.heal()?;
    let healed = Instant::now();
    while plain.latest(&series).await?.map(|p| p.ts) != Some(v2.ts) {
        assert!(healed.elapsed() < Duration::from_secs(30), "the far replica did not catch up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    atl.close().await;
    plain.close().await;
    assert_eq!(cluster.shutdown().await?, NW_LOCATIONS.len(), "every node exits cleanly");
    Ok(())
}

//! Node certificates renew on their own, with node processes: a control plane issuing 1-minute
//! certificates and two enrolled nodes. Each node renews after two thirds of its certificate's
//! life and uses the new one for new handshakes, so past the first certificates' expiry the
//! nodes still form one cluster (a restarted node handshakes with the other), take writes and
//! read them back. And a control plane gone for longer than a certificate's life: the nodes
//! keep serving on their expired certificates (within the grace), one restarts from its cached
//! desired state and rejoins, and both renew once the control plane is back.

use std::time::Duration;

use timeshard_clock::now_ns;
use timeshard_control_api::files::{CERT_FILE, CONTROL_DIR};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::fleet::{Backend, ControlPlane};

use crate::{CONTROL, NODE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_certificates_renew_before_they_expire() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-renewal-").tempdir()?;
    let lifetime = vec!["--cert-lifetime".to_string(), "1m".to_string()];
    let control = ControlPlane::start_with(CONTROL, Backend::Sqlite, dir.path(), lifetime).await?;
    control.cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "2"]).await?;
    let (mut options, _) = ClusterOptions::for_tests(2, NODE);
    options.dir = dir.path().join("nodes");
    let mut cluster = control.enroll_cluster_labelled(options, &["site=atl".into(), "site=atl".into()]).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let cert = |i: usize| std::fs::read_to_string(cluster.data_dir(i).join(CONTROL_DIR).join(CERT_FILE));
    let first = [cert(0)?, cert(1)?];
    let expires = control.devices().await?.iter().map(|d| d.cert_not_after_ms).max().expect("two devices");
    let series: SeriesKey = "pmu.renewal{bus=1}".parse()?;
    let t0 = now_ns();
    let mut written = Vec::new();
    let mut write = |t: i64, v: f64| {
        written.push(Point::new(t, v));
        Point::new(t, v)
    };
    cluster.client(0).await?.write(&series, &[write(t0, 1.0)]).await?;

    // Both renew within the first two thirds of the minute plus a few seconds.
    let started = std::time::Instant::now();
    loop {
        if cert(0)? != first[0] && cert(1)? != first[1] {
            break;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "the nodes did not renew their certificates");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("both nodes renewed {:?} after the first check", started.elapsed());
    // Past the first certificates' expiry, new handshakes in both directions: node 1 restarts
    // and joins node 0 again; clients connect to each.
    let wait_ms = expires + 2_000 - now_ns() / 1_000_000;
    if wait_ms > 0 {
        tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
    }
    assert!(cluster.terminate(1).await?);
    cluster.restart(1).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    for i in 0..2 {
        // A dial that timed out while node 1 restarted is remembered for a moment: retry (writes
        // are idempotent) for a while, as a client would.
        let p = write(now_ns(), i as f64 + 2.0);
        let client = cluster.client(i).await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while let Err(e) = client.write(&series, &[p]).await {
            anyhow::ensure!(std::time::Instant::now() < deadline, "node {i} refused writes for 30 s: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let range = TimeRange::new(t0, now_ns() + 1)?;
    for i in 0..2 {
        let got = cluster.client(i).await?.read(&series, range).await?;
        for p in &written {
            assert!(got.iter().any(|g| g.ts == p.ts && g.value == p.value), "node {i} lost {p:?}: {got:?}");
        }
    }
    let renewed = control.devices().await?;
    assert!(renewed.iter().all(|d| d.cert_not_after_ms > expires), "every device holds a later certificate");
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

/// Writes `p` through node `i`, retrying for up to 30 s (a dial that failed while a node
/// restarted is remembered for a moment; writes are idempotent).
async fn write_through(cluster: &LocalCluster, i: usize, series: &SeriesKey, p: Point) -> anyhow::Result<()> {
    let client = cluster.client(i).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = client.write(series, &[p]).await {
        anyhow::ensure!(std::time::Instant::now() < deadline, "node {i} refused writes for 30 s: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_outlive_their_certificates_while_the_control_plane_is_gone_and_renew_when_it_returns()
-> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-grace-").tempdir()?;
    let lifetime = vec!["--cert-lifetime".to_string(), "1m".to_string()];
    let mut control = ControlPlane::start_with(CONTROL, Backend::Sqlite, dir.path(), lifetime).await?;
    control.cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "2"]).await?;
    let (mut options, _) = ClusterOptions::for_tests(2, NODE);
    options.dir = dir.path().join("nodes");
    let mut cluster = control.enroll_cluster_labelled(options, &["site=atl".into(), "site=atl".into()]).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let files = [0, 1].map(|i| cluster.data_dir(i).join(CONTROL_DIR).join(CERT_FILE));
    let cert = |i: usize| std::fs::read_to_string(&files[i]);
    let series: SeriesKey = "pmu.grace{bus=1}".parse()?;
    let mut written = Vec::new();
    let p = Point::new(now_ns(), 1.0);
    write_through(&cluster, 0, &series, p).await?;
    written.push(p);

    // The control plane goes away before anyone renews, and stays away past every certificate's
    // expiry.
    control.stop().await?;
    let held = [cert(0)?, cert(1)?];
    let expires = cert_expiry(&cluster)?;
    let wait_ms = expires + 3_000 - now_ns() / 1_000_000;
    anyhow::ensure!(wait_ms > 0, "the certificates expired before the control plane stopped");
    tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
    anyhow::ensure!([cert(0)?, cert(1)?] == held, "a node renewed without a control plane");

    // Expired, within the grace: both take writes; node 1, killed, restarts from its cached
    // desired state and handshakes with node 0 again.
    for i in 0..2 {
        let p = Point::new(now_ns(), 2.0 + i as f64);
        write_through(&cluster, i, &series, p).await?;
        written.push(p);
    }
    cluster.kill(1).await?;
    cluster.restart(1).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let p = Point::new(now_ns(), 9.0);
    write_through(&cluster, 1, &series, p).await?;
    written.push(p);
    let range = TimeRange::new(written[0].ts, now_ns() + 1)?;
    for i in 0..2 {
        let got = cluster.client(i).await?.read(&series, range).await?;
        anyhow::ensure!(got == written, "node {i} read {got:?}, want {written:?}");
    }

    // Back: both renew with their expired certificates, and the control plane lists the new ones.
    control.start_again().await?;
    let started = std::time::Instant::now();
    while cert(0)? == held[0] || cert(1)? == held[1] {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "no renewal after the control plane returned");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("both nodes renewed {:?} after the control plane returned", started.elapsed());
    let now_ms = now_ns() / 1_000_000;
    let devices = control.devices().await?;
    anyhow::ensure!(devices.iter().all(|d| d.cert_not_after_ms > now_ms), "{devices:?}");
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

/// When the later of the two nodes' certificates expires (Unix ms), from their files.
fn cert_expiry(cluster: &LocalCluster) -> anyhow::Result<i64> {
    let mut latest = 0;
    for i in 0..2 {
        let pem = std::fs::read(cluster.data_dir(i).join(CONTROL_DIR).join(CERT_FILE))?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)?;
        let cert = pem.parse_x509()?;
        latest = latest.max(cert.validity().not_after.timestamp() * 1000);
    }
    Ok(latest)
}

//! Nodes enrolled with a control plane from nothing (no hand-made PKI), as separate processes:
//! data across them, changes of desired state applied without a restart within a stated time
//! (or refused and reported, not half-applied), offline nodes and an offline control plane,
//! and revocation, also of nodes cut off from the control plane (through gossip). Every scenario runs on SQLite (one `serve`) and on a real PostgreSQL server
//! with two `serve` instances sharing it (nodes alternate between them).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use timeshard_clock::now_ns;
use timeshard_node::control::digest_prefix;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::{Client, NodeStatus};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::fleet::{Backend, ControlPlane};

use crate::{CONTROL, NODE};

/// A change of desired state is in force on every node that reaches the control plane within
/// this (README: the control plane's 5 s propagation bound plus applying it).
const CHANGE_BOUND: Duration = Duration::from_secs(10);
/// A revoked node is refused by every peer within this (README).
const REVOCATION_BOUND: Duration = Duration::from_secs(10);
/// A node that lost the control plane retries at most this often (`control::RETRY_MAX`), so it
/// catches up within this plus [`CHANGE_BOUND`] once the control plane is back.
const RETRY_MAX: Duration = timeshard_node::control::RETRY_MAX;

const DAY_NS: i64 = 86_400 * 1_000_000_000;

fn series() -> SeriesKey {
    "pmu.phase{bus=1,site=e2e}".parse().unwrap()
}

/// `n` points at 60 Hz from `start`.
fn points(start: i64, n: i64) -> Vec<Point> {
    (0..n).map(|i| Point::new(start + i * 16_666_666, (i as f64 * 0.1).sin())).collect()
}

async fn statuses(cluster: &LocalCluster, nodes: &[usize]) -> anyhow::Result<Vec<NodeStatus>> {
    let mut out = Vec::new();
    for &i in nodes {
        let client = cluster.client(i).await?;
        out.push(client.status().await?);
        client.close().await;
    }
    Ok(out)
}

/// Waits until `f` holds; fails after `limit`. Returns how long it took.
async fn within<F, Fut>(limit: Duration, what: &str, mut f: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) if start.elapsed() >= limit => return Err(e.context(format!("{what}: not within {limit:?}"))),
            Err(_) => {}
        }
        anyhow::ensure!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `nodes` run the fleet's current desired state (generation and digest) and the
/// control plane lists them as running it; returns that generation and how long it took.
async fn converge(
    control: &ControlPlane,
    cluster: &LocalCluster,
    nodes: &[usize],
    limit: Duration,
) -> anyhow::Result<(u64, Duration)> {
    let fleet = control.fleet().await?;
    let took = within(limit, &format!("nodes {nodes:?} at generation {}", fleet.generation), || async {
        let all = statuses(cluster, nodes).await?;
        Ok(all
            .iter()
            .all(|s| s.config_generation == fleet.generation && s.config_digest == digest_prefix(&fleet.digest)))
    })
    .await?;
    let ids: Vec<String> = nodes.iter().map(|&i| cluster.id(i).to_hex()).collect();
    within(limit, "the control plane lists what they run", || async {
        let devices = control.devices().await?;
        Ok(ids.iter().all(|id| {
            devices.iter().any(|d| {
                &d.node_id == id
                    && d.generation_applied == Some(fleet.generation)
                    && d.digest_applied.as_deref() == Some(fleet.digest.as_str())
            })
        }))
    })
    .await?;
    Ok((fleet.generation, took))
}

async fn start(backend: Backend, nodes: usize, dir: &Path) -> anyhow::Result<(ControlPlane, LocalCluster)> {
    let control = ControlPlane::start(CONTROL, backend, dir).await?;
    control
        .cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "3", "--w", "2", "--r", "2"])
        .await?;
    let (mut options, _) = ClusterOptions::for_tests(nodes, NODE);
    options.dir = dir.join("nodes");
    // Smaller than the default 20, so that a class with more replicas is one these nodes refuse.
    options.dht.k = 8;
    let cluster = control.enroll_cluster(options).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    Ok((control, cluster))
}

/// Five nodes enrolled from nothing: data written through one is read through another; a
/// retention change reaches all five and changes what they keep, without a restart; a change
/// they cannot run is reported by each and changes nothing.
async fn enrolled_nodes_follow_changes(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let (control, mut cluster) = start(backend, 5, dir.path()).await?;
    let (first, _) = converge(&control, &cluster, &[0, 1, 2, 3, 4], CHANGE_BOUND).await?;
    let devices = control.devices().await?;
    assert_eq!(devices.len(), 5);
    assert!(devices.iter().all(|d| d.labels.get("site").map(String::as_str) == Some("e2e")));

    let now = now_ns();
    let old = points(now - 2 * DAY_NS, 600);
    let recent = points(now - 20_000_000_000, 600);
    let writer = cluster.client(0).await?;
    writer.write(&series(), &old).await?;
    writer.write(&series(), &recent).await?;
    let reader = cluster.client(3).await?;
    let all = TimeRange::new(now - 3 * DAY_NS, now)?;
    let expected: Vec<Point> = old.iter().chain(&recent).copied().collect();
    assert_eq!(reader.read(&series(), all).await?, expected);

    // One day of retention: every node applies it, and the two-day-old points go.
    control.cli(&["class", "set", "pmu", "--retention", "1d"]).await?;
    let (second, took) = converge(&control, &cluster, &[0, 1, 2, 3, 4], CHANGE_BOUND).await?;
    assert!(second > first);
    println!("{backend:?}: retention change in force on 5 nodes after {took:?}");
    within(Duration::from_secs(20), "old points expire on every replica", || async {
        Ok(reader.read(&series(), all).await? == recent)
    })
    .await?;
    let out = tokio::process::Command::new(NODE)
        .args(["status", "--node", &cluster.addr(2).to_string(), "--cert-name", "node", "--pki"])
        .arg(cluster.data_dir(2).join("control"))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("configuration: generation {second}, digest")), "{text}");

    // More replicas than these nodes' k: every node refuses, reports why, and keeps running
    // generation `second` whole.
    control.cli(&["class", "set", "wide", "--prefix", "wide.", "--rf", "12", "--w", "7", "--r", "6"]).await?;
    let refused = control.fleet().await?.generation;
    within(CHANGE_BOUND, "every node reports the refusal", || async {
        let devices = control.devices().await?;
        Ok(devices.iter().all(|d| {
            d.apply_error.as_ref().is_some_and(|e| e.generation == refused && e.message.contains("dht.k"))
                && d.generation_applied == Some(second)
        }))
    })
    .await?;
    assert!(statuses(&cluster, &[0, 1, 2, 3, 4]).await?.iter().all(|s| s.config_generation == second));
    assert_eq!(reader.read(&series(), all).await?, recent);
    let listed = control.cli(&["devices"]).await?;
    assert_eq!(listed.matches("cannot apply").count(), 5, "{listed}");
    // Taking it back is a change they can run.
    control.cli(&["class", "rm", "wide"]).await?;
    converge(&control, &cluster, &[0, 1, 2, 3, 4], CHANGE_BOUND).await?;
    assert!(control.devices().await?.iter().all(|d| d.apply_error.is_none()));

    writer.close().await;
    reader.close().await;
    for i in 0..5 {
        assert!(cluster.is_running(i), "node {i} was never restarted");
    }
    assert!(cluster.terminate(4).await?);
    assert_eq!(cluster.shutdown().await?, 4, "every node exits cleanly");
    Ok(())
}

/// A node stopped during a change catches up when it is back; a node restarted while the
/// control plane is down serves from its last applied state, and catches up once the control
/// plane returns.
async fn offline_nodes_and_control_plane(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let (mut control, mut cluster) = start(backend, 3, dir.path()).await?;
    let (first, _) = converge(&control, &cluster, &[0, 1, 2], CHANGE_BOUND).await?;
    let data = points(now_ns() - 60_000_000_000, 1200);
    let all = TimeRange::new(data[0].ts, data[1199].ts + 1)?;
    cluster.client(0).await?.write(&series(), &data).await?;

    // Node 2 is away during a change, and catches up when it starts again.
    assert!(cluster.terminate(2).await?);
    control.cli(&["class", "set", "pmu", "--retention", "30d"]).await?;
    let (second, _) = converge(&control, &cluster, &[0, 1], CHANGE_BOUND).await?;
    assert!(second > first);
    cluster.restart(2).await?;
    let (caught_up, took) = converge(&control, &cluster, &[0, 1, 2], CHANGE_BOUND).await?;
    assert_eq!(caught_up, second);
    println!("{backend:?}: a restarted node caught up after {took:?}");

    // The control plane goes away; node 1 restarts meanwhile, from what it applied last.
    control.stop().await?;
    let stopped_at = now_ns();
    assert!(cluster.terminate(1).await?);
    cluster.restart(1).await?;
    let client = cluster.client(1).await?;
    let status = client.status().await?;
    assert_eq!(status.config_generation, second);
    assert_eq!(client.read(&series(), all).await?, data);
    let more = points(now_ns() - 1_000_000_000, 60);
    client.write(&series(), &more).await?;
    assert_eq!(cluster.client(2).await?.read(&series(), TimeRange::new(more[0].ts, more[59].ts + 1)?).await?, more);
    let log = std::fs::read_to_string(cluster.log(1))?;
    assert!(log.contains("cannot reach the control plane"), "node 1 says why it runs from disk");
    // /metrics tells how long ago the control plane answered: node 0 heard from it before it
    // stopped, node 1 not since it restarted.
    const CONTACT: &str = "timeshard_control_plane_last_contact_timestamp_seconds";
    let heard = cluster.metric(0, CONTACT).await?.context("node 0 heard from the control plane")?;
    assert!(heard * 1e9 < stopped_at as f64, "node 0's last contact {heard} is before the stop");
    assert_eq!(cluster.metric(1, CONTACT).await?, None, "node 1 has not heard from it since its restart");

    // Back: a change made now reaches every node, the restarted one included.
    control.start_again().await?;
    control.cli(&["class", "set", "pmu", "--retention", "60d"]).await?;
    let (third, took) = converge(&control, &cluster, &[0, 1, 2], RETRY_MAX + CHANGE_BOUND).await?;
    assert!(third > second);
    let heard = cluster.metric(1, CONTACT).await?.context("node 1 heard from the control plane again")?;
    assert!(heard * 1e9 > stopped_at as f64, "node 1's last contact {heard} is after the return");
    println!("{backend:?}: after the control plane returned, all nodes ran the next change after {took:?}");
    client.close().await;
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

/// A revoked node is refused by its peers within the stated bound: its open connections are
/// closed, new ones refused, its peers forget it; it learns it is revoked and stops.
async fn revoked_node_is_refused(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let (control, mut cluster) = start(backend, 4, dir.path()).await?;
    converge(&control, &cluster, &[0, 1, 2, 3], CHANGE_BOUND).await?;
    let victim = 3;
    let victim_tls = cluster.client_tls_of(victim);
    // A connection with the victim's key, open before the revocation.
    let open = Client::connect(cluster.addr(0), &victim_tls).await?;
    open.status().await?;

    let started = Instant::now();
    control.cli(&["device", "revoke", &cluster.id(victim).to_hex(), "--reason", "stolen"]).await?;
    within(REVOCATION_BOUND, "every peer refuses the revoked node", || async {
        let open_closed = open.status().await.is_err();
        let peers = statuses(&cluster, &[0, 1, 2]).await?;
        let forgotten = peers.iter().all(|s| s.peers == 2);
        Ok(open_closed && forgotten)
    })
    .await?;
    let took = started.elapsed();
    println!("{backend:?}: revoked node refused by every peer after {took:?}");
    for peer in 0..3 {
        let refused = match Client::connect(cluster.addr(peer), &victim_tls).await {
            Err(_) => true,
            Ok(c) => c.status().await.is_err(),
        };
        assert!(refused, "node {peer} still serves the revoked node's key");
    }
    // The revoked node learns it and stops, saying why.
    let status = cluster.wait_exit(victim, REVOCATION_BOUND).await?;
    assert!(!status.success());
    let log = std::fs::read_to_string(cluster.log(victim))?;
    assert!(log.contains("revoked this node's certificate"), "{log}");

    // The others carry on.
    let data = points(now_ns() - 5_000_000_000, 300);
    cluster.client(0).await?.write(&series(), &data).await?;
    let all = TimeRange::new(data[0].ts, data[299].ts + 1)?;
    assert_eq!(cluster.client(2).await?.read(&series(), all).await?, data);
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

/// A revocation reaches nodes cut off from the control plane, through gossip: nodes 1 and 2
/// lose the control plane (their enrollment points at an address nobody serves, and they
/// restart), node 3 is revoked; node 0 learns it from the control plane, and passes the signed
/// list on, so that nodes 1 and 2 refuse node 3 within the bound too.
async fn revocation_reaches_a_site_cut_off_from_the_control_plane(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let (control, mut cluster) = start(backend, 4, dir.path()).await?;
    converge(&control, &cluster, &[0, 1, 2, 3], CHANGE_BOUND).await?;
    let cut_off = [1, 2];
    for &i in &cut_off {
        assert!(cluster.terminate(i).await?);
        let record = cluster.data_dir(i).join("control").join("enrollment.json");
        let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&record)?)?;
        doc["url"] = "https://127.0.0.1:1".into();
        std::fs::write(&record, serde_json::to_vec(&doc)?)?;
        cluster.restart(i).await?;
    }
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let victim = 3;
    let victim_tls = cluster.client_tls_of(victim);

    let started = Instant::now();
    control.cli(&["device", "revoke", &cluster.id(victim).to_hex(), "--reason", "stolen"]).await?;
    within(REVOCATION_BOUND, "the cut-off nodes refuse the revoked node", || async {
        let peers = statuses(&cluster, &cut_off).await?;
        Ok(peers.iter().all(|s| s.peers == 2))
    })
    .await?;
    let took = started.elapsed();
    println!("{backend:?}: revocation reached the nodes cut off from the control plane after {took:?}");
    for &i in &cut_off {
        let refused = match Client::connect(cluster.addr(i), &victim_tls).await {
            Err(_) => true,
            Ok(c) => c.status().await.is_err(),
        };
        assert!(refused, "node {i}, cut off from the control plane, still serves the revoked node's key");
        let log = std::fs::read_to_string(cluster.log(i))?;
        assert!(log.contains("cannot reach the control plane"), "node {i} was not cut off");
        assert!(log.contains("learned a newer revocation list from a peer"), "node {i} did not learn it by gossip");
    }
    // Node 1 restarts alone: no peer to hear the list from again, no control plane. It keeps
    // refusing the revoked node from the list it kept.
    for i in [0, 2, 3] {
        cluster.kill(i).await?;
    }
    cluster.kill(1).await?;
    cluster.restart(1).await?;
    let refused = match Client::connect(cluster.addr(1), &victim_tls).await {
        Err(_) => true,
        Ok(c) => c.status().await.is_err(),
    };
    let log = std::fs::read_to_string(cluster.log(1))?;
    let kept: Vec<&str> = log.lines().filter(|l| l.contains("revocation")).collect();
    assert!(refused, "node 1, restarted alone, forgot the revocation it learned by gossip: {kept:#?}");
    Ok(())
}

/// Waits up to `within` for the node `child` started with `--ready-file ready` to be ready.
async fn wait_ready(
    child: &mut tokio::process::Child,
    ready: &Path,
    within: Duration,
) -> anyhow::Result<timeshard_node::process::Ready> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(ready)
            && let Ok(r) = serde_json::from_str(&text)
        {
            return Ok(r);
        }
        anyhow::ensure!(child.try_wait()?.is_none(), "the node exited before it was ready");
        anyhow::ensure!(Instant::now() < deadline, "the node was not ready within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A device started while the control plane cannot be reached waits for it, saying why, and
/// enrolls and starts once it is back; a refused token still ends the attempt at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_waits_for_an_unreachable_control_plane() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let mut control = ControlPlane::start(CONTROL, Backend::Sqlite, dir.path()).await?;
    control.cli(&["class", "set", "env", "--prefix", "env.", "--rf", "1", "--w", "1", "--r", "1"]).await?;
    let url = control.urls()[0].clone();
    let token = control.cli(&["token", "create", "--labels", "site=lab", "--expires", "10m"]).await?.trim().to_string();
    control.stop().await?;

    let data = dir.path().join("device");
    let (ready, log) = (dir.path().join("ready.json"), dir.path().join("node.log"));
    let mut child = tokio::process::Command::new(NODE)
        .args(["node", "--enroll", &url, "--token", &token, "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .arg("--ready-file")
        .arg(&ready)
        .env("TIMESHARD_LOG", "info")
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)?.contains("cannot enroll yet") {
        anyhow::ensure!(child.try_wait()?.is_none(), "the node gave up: {}", std::fs::read_to_string(&log)?);
        anyhow::ensure!(Instant::now() < deadline, "no word of waiting: {}", std::fs::read_to_string(&log)?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(child.try_wait()?.is_none(), "still waiting after a few attempts");
    assert!(
        !ready.exists()
            && !data
                .join(timeshard_control_api::files::CONTROL_DIR)
                .join(timeshard_control_api::files::ENROLLMENT_FILE)
                .exists(),
        "nothing enrolled yet"
    );

    // Back: the node enrolls within the longest retry wait (15 s) and starts.
    control.start_again().await?;
    let ready = wait_ready(&mut child, &ready, Duration::from_secs(45))
        .await
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let devices = control.devices().await?;
    assert_eq!(devices.len(), 1);
    let client =
        Client::connect(ready.addr, &timeshard_sdk::tls::TlsFiles::in_dir(&data.join("control"), "node")).await?;
    assert_eq!(client.status().await?.id.to_hex(), devices[0].node_id);
    client.close().await;
    child.kill().await?;

    // The token is used now: enrolling again with it is refused at once, not waited on.
    let out = tokio::process::Command::new(NODE)
        .args(["node", "--enroll", &url, "--token", &token])
        .arg("--data-dir")
        .arg(dir.path().join("second"))
        .output()
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("cannot enroll yet"), "{err}");
    Ok(())
}

/// `timeshard node --enroll URL --token TOKEN --data-dir DIR` once; afterwards `--data-dir`
/// alone starts the node as enrolled. Misuse is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enroll_from_the_command_line_then_start_from_the_data_dir() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let control = ControlPlane::start(CONTROL, Backend::Sqlite, dir.path()).await?;
    control.cli(&["class", "set", "env", "--prefix", "env.", "--rf", "1", "--w", "1", "--r", "1"]).await?;
    let url = &control.urls()[0];
    let token = |labels: &'static str| {
        let control = &control;
        async move {
            let out = control.cli(&["token", "create", "--labels", labels, "--expires", "10m"]).await?;
            anyhow::Ok(out.trim().to_string())
        }
    };
    let data = dir.path().join("device");
    let node = |args: Vec<String>| {
        let mut command = tokio::process::Command::new(NODE);
        command.arg("node").args(args).env("TIMESHARD_LOG", "info").kill_on_drop(true);
        command
    };
    let data_arg = data.display().to_string();

    // `--help` teaches it, with an example.
    let out = node(vec!["--help".into()]).output().await?;
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("timeshard node --enroll https://cp.example:7443 --token tsc1..."), "{help}");
    assert!(help.contains("starts need only --data-dir"), "{help}");
    let out = node(vec!["--enroll".into(), url.clone(), "--data-dir".into(), data_arg.clone()]).output().await?;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--token"));

    let serve = async |extra: &[&str]| -> anyhow::Result<NodeStatus> {
        let ready = dir.path().join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let mut args = vec!["--data-dir".to_string(), data_arg.clone(), "--listen".into(), "127.0.0.1:0".into()];
        args.extend(["--ready-file".to_string(), ready.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = node(args).stderr(std::process::Stdio::null()).spawn()?;
        let ready = wait_ready(&mut child, &ready, Duration::from_secs(60)).await?;
        let tls = timeshard_sdk::tls::TlsFiles::in_dir(&data.join("control"), "node");
        let client = Client::connect(ready.addr, &tls).await?;
        let status = client.status().await?;
        client.close().await;
        child.kill().await?;
        Ok(status)
    };
    let first = serve(&["--enroll", url, "--token", &token("site=lab").await?]).await?;
    let fleet = control.fleet().await?;
    assert_eq!((first.config_generation, first.config_digest), (fleet.generation, digest_prefix(&fleet.digest)));
    assert_eq!(control.devices().await?[0].node_id, first.id.to_hex());

    // Enrolling again into the same directory says what to do instead.
    let out = node(vec!["--enroll".into(), url.clone(), "--token".into(), token("site=lab").await?])
        .args(["--data-dir", &data_arg])
        .output()
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("already holds an enrollment"), "{err}");
    // The effective configuration: the enrollment's identity, the control plane's classes.
    let out = node(vec!["--data-dir".into(), data_arg.clone(), "--print-config".into()]).output().await?;
    let config = String::from_utf8_lossy(&out.stdout);
    assert!(config.contains(&data.join("control/node.pem").display().to_string()), "{config}");
    assert!(config.contains("name = \"env\""), "{config}");

    // Later starts: the data directory is all it needs.
    let again = serve(&[]).await?;
    assert_eq!((again.id, again.config_generation), (first.id, first.config_generation));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_enrolled_nodes_follow_changes() -> anyhow::Result<()> {
    enrolled_nodes_follow_changes(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_enrolled_nodes_follow_changes() -> anyhow::Result<()> {
    enrolled_nodes_follow_changes(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_offline_nodes_and_control_plane() -> anyhow::Result<()> {
    offline_nodes_and_control_plane(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_offline_nodes_and_control_plane() -> anyhow::Result<()> {
    offline_nodes_and_control_plane(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_revocation_reaches_a_site_cut_off_from_the_control_plane() -> anyhow::Result<()> {
    revocation_reaches_a_site_cut_off_from_the_control_plane(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_revocation_reaches_a_site_cut_off_from_the_control_plane() -> anyhow::Result<()> {
    revocation_reaches_a_site_cut_off_from_the_control_plane(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_revoked_node_is_refused() -> anyhow::Result<()> {
    revoked_node_is_refused(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_revoked_node_is_refused() -> anyhow::Result<()> {
    revoked_node_is_refused(Backend::Postgres).await
}

/// `bench fleet`'s revocation figure on node processes: it times the revocation reaching each
/// cut-off node, which only gossip can bring it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fleet_revocation_figure_times_the_spread_to_cut_off_nodes() -> anyhow::Result<()> {
    use timeshard_testkit::bench::fleet::revocation::{self, RevocationOptions};
    let dir = tempfile::Builder::new().prefix("timeshard-fleet-").tempdir()?;
    let options = RevocationOptions { control: CONTROL.into(), node: NODE.into(), cut_off: 2, rounds: 1 };
    let doc = revocation::measure(&options, dir.path()).await?;
    let spread = doc["revocation_spread_s"].as_f64().context("revocation_spread_s")?;
    assert!(spread > 0.0 && spread < 60.0, "{doc}");
    assert_eq!(doc["spread_s"].as_array().map(Vec::len), Some(1), "{doc}");
    // Node 0 follows the control plane: it often holds the list by the first reading (0.0).
    assert!(doc["follower_p50_s"].as_f64().is_some_and(|s| (0.0..60.0).contains(&s)), "{doc}");
    Ok(())
}

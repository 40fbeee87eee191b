//! Policy modules rolled out by the control plane to node processes enrolled from nothing: six
//! nodes, four labelled `site=atl` and two `site=sfo`. A version reaches the canary, then every
//! Atlanta node on promotion, while writes through every node keep working; San Francisco is
//! untouched; a node stopped during the rollout catches up, a node that joins `site=atl`
//! mid-rollout follows the documented rule (the stable version until completion). A version
//! that traps on every batch is aborted by the canary's failures and the previous version comes
//! back on its own. A module signed for another name or kind is refused by the node. A node
//! restarted while the control plane is away runs its modules from its cache. Queries
//! during a rollout of a query policy run one version or fail naming both. Every scenario runs
//! on SQLite and on PostgreSQL with two `serve` instances. A version revoked by a newer
//! signature's minimum version is refused when rolled out again, also after a restart (SQLite).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use timeshard_clock::now_ns;
use timeshard_control_api::policy::{RolloutState, RolloutStatus};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::NodeStatus;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::fleet::{Backend, ControlPlane};

use crate::{CONTROL, NODE};

/// A rollout's change (start, promote, abort) is in force on every node it concerns within this
/// (README: the 5 s propagation bound, plus fetching and compiling the module).
const ROLLOUT_BOUND: Duration = Duration::from_secs(10);
/// From the first failing call on the canary to the canary running the previous version again
/// (README: a report within 2 s, the monitor's look within about 1 s, then [`ROLLOUT_BOUND`]).
const ABORT_BOUND: Duration = Duration::from_secs(15);

fn series() -> SeriesKey {
    "pmu.phase{bus=1,site=e2e}".parse().unwrap()
}

/// The per-call deadline the rollouts give the policies: a call of microseconds in a release
/// build can outlast the nodes' default 10 ms in a debug build on a busy machine, and a write it
/// refused would fail the "none refused" checks (the testkit's `TEST_DEADLINE_MS`).
const DEADLINE_MS: &str = "2000";

/// A built guest component's path.
fn guest(name: &str) -> String {
    timeshard_policy::guest_artifact(&crate::guest_dir(), name)
        .expect("guests built by guest/build.sh")
        .display()
        .to_string()
}

async fn status(cluster: &LocalCluster, i: usize) -> anyhow::Result<NodeStatus> {
    let client = cluster.client(i).await?;
    let s = client.status().await;
    client.close().await;
    Ok(s?)
}

/// The versions of `name` node `i` has installed (the current one last).
async fn versions(cluster: &LocalCluster, i: usize, name: &str) -> anyhow::Result<Vec<String>> {
    let mut found: Vec<(bool, String)> = status(cluster, i)
        .await?
        .policies
        .into_iter()
        .filter(|p| p.name == name)
        .map(|p| (p.current, p.version))
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, v)| v).collect())
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

/// Waits until each of `nodes` runs `version` of `name` (and only it); returns how long it took.
async fn runs(cluster: &LocalCluster, nodes: &[usize], name: &str, version: &str) -> anyhow::Result<Duration> {
    within(ROLLOUT_BOUND, &format!("nodes {nodes:?} run {name}@{version}"), || async {
        for &i in nodes {
            if versions(cluster, i, name).await? != [version] {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

async fn rollout_status(control: &ControlPlane, name: &str) -> anyhow::Result<RolloutStatus> {
    Ok(serde_json::from_str(&control.cli(&["rollout", "status", name, "--json"]).await?)?)
}

/// The cluster index of node `id`.
fn index(cluster: &LocalCluster, id: &str) -> usize {
    (0..cluster.len()).find(|&i| cluster.id(i).to_hex() == id).expect("a node of the cluster")
}

async fn start(backend: Backend, dir: &Path) -> anyhow::Result<(ControlPlane, LocalCluster)> {
    let control = ControlPlane::start(CONTROL, backend, dir).await?;
    control
        .cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "3", "--w", "2", "--r", "2"])
        .await?;
    let (mut options, _) = ClusterOptions::for_tests(6, NODE);
    options.dir = dir.join("nodes");
    let labels: Vec<String> = (0..6).map(|i| if i < 4 { "site=atl" } else { "site=sfo" }.to_string()).collect();
    let cluster = control.enroll_cluster_labelled(options, &labels).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    Ok((control, cluster))
}

/// Writes through each of some nodes in turn until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Writer {
    async fn start(cluster: &LocalCluster, nodes: Vec<usize>) -> anyhow::Result<Writer> {
        let mut clients = Vec::new();
        for i in nodes {
            clients.push(cluster.client(i).await?);
        }
        let (stop, written): (Arc<AtomicBool>, Arc<AtomicU64>) = (Arc::default(), Arc::default());
        let (s, w) = (Arc::clone(&stop), Arc::clone(&written));
        let task = tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut round = 0i64;
            while !s.load(Ordering::Relaxed) {
                for c in &clients {
                    let t = now_ns() + round;
                    match c.write(&series(), &[Point::new(t, (round as f64 * 0.1).sin())]).await {
                        Ok(ack) if ack.rejected == 0 => {
                            w.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(ack) => errors.push(format!("{} points refused: {:?}", ack.rejected, ack.rejections)),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            errors
        });
        Ok(Writer { stop, written, task })
    }

    /// Stops; fails unless every write was stored whole.
    async fn finish(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self.task.await?;
        let written = self.written.load(Ordering::Relaxed);
        anyhow::ensure!(
            errors.is_empty(),
            "{} of {} writes failed: {errors:?}",
            errors.len(),
            written + errors.len() as u64
        );
        anyhow::ensure!(written > 0, "no write went through");
        Ok(written)
    }
}

/// v2 to Atlanta with a canary, then promoted; a stopped node catches up, a late joiner follows
/// the rule; v3 traps and is aborted by its canary's failures; re-signed modules are refused.
async fn staged_rollout(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-rollout-").tempdir()?;
    let (mut control, mut cluster) = start(backend, dir.path()).await?;
    let (atl, sfo) = ([0, 1, 2, 3], [4, 5]);
    control
        .cli(&["policy", "upload", "--name", "pmu-validate", "--version", "1.0.0", "--kind", "ingest", &guest("noop")])
        .await?;
    control
        .cli(&[
            "policy",
            "upload",
            "--name",
            "pmu-validate",
            "--version",
            "2.0.0",
            "--kind",
            "ingest",
            &guest("pmu-validate"),
        ])
        .await?;
    control
        .cli(&[
            "policy",
            "upload",
            "--name",
            "pmu-validate",
            "--version",
            "3.0.0",
            "--kind",
            "ingest",
            &guest("hostile-panic"),
        ])
        .await?;
    // Version 1 everywhere (one stage).
    control
        .cli(&[
            "rollout",
            "start",
            "pmu-validate@1.0.0",
            "--series",
            "pmu.",
            "--canary",
            "0",
            "--waves",
            "100%",
            "--deadline-ms",
            DEADLINE_MS,
        ])
        .await?;
    runs(&cluster, &[0, 1, 2, 3, 4, 5], "pmu-validate", "1.0.0").await?;

    let writer = Writer::start(&cluster, (0..6).collect()).await?;
    let s: RolloutStatus = serde_json::from_str(
        &control
            .cli(&[
                "rollout",
                "start",
                "pmu-validate@2.0.0",
                "--select",
                "site=atl",
                "--series",
                "pmu.",
                "--canary",
                "1",
                "--waves",
                "100%",
                "--abort-above",
                "5%",
                "--deadline-ms",
                DEADLINE_MS,
                "--json",
            ])
            .await?,
    )?;
    assert_eq!((s.state, s.stages.len(), s.nodes.len()), (RolloutState::Running, 2, 4));
    let canary = index(&cluster, &s.nodes.iter().find(|n| n.stage == Some(0)).unwrap().node_id);
    assert!(atl.contains(&canary));
    let took = runs(&cluster, &[canary], "pmu-validate", "2.0.0").await?;
    println!("{backend:?}: the canary ran 2.0.0 after {took:?}");
    let others: Vec<usize> = atl.iter().copied().filter(|&i| i != canary).collect();
    runs(&cluster, &others, "pmu-validate", "1.0.0").await?;

    // A node joins site=atl during the rollout: it is no target, and runs the stable version.
    let late = control.enroll_another(&mut cluster, "site=atl").await?;
    runs(&cluster, &[late], "pmu-validate", "1.0.0").await?;
    let s = rollout_status(&control, "pmu-validate").await?;
    let row = s.nodes.iter().find(|n| n.node_id == cluster.id(late).to_hex()).expect("late joiners are listed");
    assert_eq!((row.stage, row.desired.as_deref()), (None, Some("1.0.0")));

    // One Atlanta node is away when the rollout is promoted to the end; the others take writes.
    // (Not node 0: the others bootstrap through it, and it would come back knowing nobody.)
    let written = writer.finish().await?;
    let away = *others.iter().find(|&&i| i != 0).unwrap();
    assert!(cluster.terminate(away).await?);
    let online: Vec<usize> = atl.iter().copied().filter(|&i| i != away).chain([late]).collect();
    let writer = Writer::start(&cluster, online.iter().copied().chain(sfo).collect()).await?;
    let promoted = Instant::now();
    let s: RolloutStatus =
        serde_json::from_str(&control.cli(&["rollout", "promote", "pmu-validate", "--json"]).await?)?;
    assert_eq!(s.state, RolloutState::Completed);
    runs(&cluster, &online, "pmu-validate", "2.0.0").await?;
    println!("{backend:?}: every online Atlanta node ran 2.0.0 {:?} after the promotion", promoted.elapsed());
    runs(&cluster, &sfo, "pmu-validate", "1.0.0").await?;
    cluster.restart(away).await?;
    let took = runs(&cluster, &[away], "pmu-validate", "2.0.0").await?;
    println!("{backend:?}: the node that was away ran 2.0.0 {took:?} after it restarted");
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let written = written + writer.finish().await?;
    println!("{backend:?}: {written} writes through every running node during the rollout, none refused");
    // What the policy's calls cost is in the node's status, and `timeshard status` shows it.
    let used = status(&cluster, late).await?.policies.into_iter().find(|p| p.name == "pmu-validate").unwrap();
    assert_eq!((used.version.as_str(), used.kind.as_str(), used.traps, used.timeouts), ("2.0.0", "ingest", 0, 0));
    assert!(used.calls > 0 && used.time_us > 0 && used.peak_memory_bytes >= 65_536, "{used:?}");
    let out = tokio::process::Command::new(NODE)
        .args(["status", "--node", &cluster.addr(late).to_string(), "--cert-name", "node", "--pki"])
        .arg(cluster.data_dir(late).join("control"))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pmu-validate@2.0.0 (ingest)") && text.contains("peak memory"), "{text}");

    // Version 3 traps on every batch: the canary's failures abort it, and 2.0.0 comes back.
    let s: RolloutStatus = serde_json::from_str(
        &control
            .cli(&["rollout", "start", "pmu-validate@3.0.0", "--select", "site=atl", "--series", "pmu.", "--json"])
            .await?,
    )?;
    let canary = index(&cluster, &s.nodes.iter().find(|n| n.stage == Some(0)).unwrap().node_id);
    runs(&cluster, &[canary], "pmu-validate", "3.0.0").await?;
    let client = cluster.client(canary).await?;
    let started = Instant::now();
    let mut first_failure: Option<Instant> = None;
    loop {
        let failed = client.write(&series(), &[Point::new(now_ns(), 0.5)]).await.is_err();
        if failed && first_failure.is_none() {
            first_failure = Some(Instant::now());
        }
        if first_failure.is_some() && versions(&cluster, canary, "pmu-validate").await? == ["2.0.0"] {
            break;
        }
        assert!(started.elapsed() < ABORT_BOUND + ROLLOUT_BOUND, "the canary still runs 3.0.0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = first_failure.unwrap().elapsed();
    println!("{backend:?}: the canary ran 2.0.0 again {took:?} after its first failing call");
    assert!(took <= ABORT_BOUND, "the abort took {took:?}");
    let s = rollout_status(&control, "pmu-validate").await?;
    assert_eq!(s.state, RolloutState::Aborted);
    assert!(s.reason.as_deref().unwrap_or_default().contains("trapped"), "{:?}", s.reason);
    let audit = control.cli(&["audit"]).await?;
    assert!(audit.contains("rollout.abort"), "{audit}");
    let ack = client.write(&series(), &[Point::new(now_ns(), 0.5)]).await?;
    assert_eq!(ack.rejected, 0);
    client.close().await;

    // Modules the fleet's key signed, installed by hand under another name or kind: refused.
    let key = control.fleet().await?.policy_key.expect("the fleet's policy key");
    let files = dir.path().join("by-hand");
    std::fs::create_dir_all(&files)?;
    let noop = files.join("noop.wasm");
    control
        .cli(&["policy", "upload", "--name", "stats", "--version", "1.0.0", "--kind", "query", &guest("rms")])
        .await?;
    control.cli(&["policy", "download", "pmu-validate@1.0.0", "--out", noop.to_str().unwrap()]).await?;
    let rms = files.join("rms.wasm");
    control.cli(&["policy", "download", "stats@1.0.0", "--out", rms.to_str().unwrap()]).await?;
    let victim = sfo[1];
    cluster.edit_config(victim, |c| {
        c.policy = toml::from_str(&format!(
            "trusted_keys = [{key:?}]\n\
             [[modules]]\nname = \"not-noop\"\nversion = \"1.0.0\"\nkind = \"ingest\"\nwasm = {noop:?}\n\
             [[modules]]\nname = \"stats\"\nversion = \"1.0.0\"\nkind = \"ingest\"\nwasm = {rms:?}\n"
        ))
        .unwrap();
    })?;
    cluster.reload(victim)?;
    let id = cluster.id(victim).to_hex();
    within(ROLLOUT_BOUND, "the node reports both refusals", || async {
        let devices = control.devices().await?;
        let d = devices.iter().find(|d| d.node_id == id).unwrap();
        let said = |name: &str, signed: &str| {
            d.policy_errors
                .iter()
                .any(|e| e.name == name && e.error.contains(&format!("signature was made for {signed}")))
        };
        Ok(said("not-noop", "pmu-validate@1.0.0 (ingest policy)") && said("stats", "stats@1.0.0 (query policy)"))
    })
    .await?;
    assert_eq!(versions(&cluster, victim, "not-noop").await?, Vec::<String>::new());
    assert_eq!(versions(&cluster, victim, "pmu-validate").await?, ["1.0.0"], "the control plane's module still runs");
    assert!(control.cli(&["devices"]).await?.contains("cannot load not-noop@1.0.0"));

    // Without the control plane, a node restarts into what it ran, from its module cache.
    control.stop().await?;
    let restarted = atl[1];
    assert!(cluster.terminate(restarted).await?);
    cluster.restart(restarted).await?;
    assert_eq!(versions(&cluster, restarted, "pmu-validate").await?, ["2.0.0"]);
    within(ROLLOUT_BOUND, "the restarted node takes writes", || async {
        Ok(cluster.client(restarted).await?.write(&series(), &[Point::new(now_ns(), 0.25)]).await.is_ok())
    })
    .await?;
    assert_eq!(cluster.shutdown().await?, 7, "every node exits cleanly");
    Ok(())
}

/// A query policy rolled out to one canary: queries through a node that runs the stable version
/// run it everywhere (the canary keeps it installed); through the canary they run the new
/// version everywhere or fail naming both versions.
async fn queries_across_versions(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-rollout-").tempdir()?;
    let (control, cluster) = start(backend, dir.path()).await?;
    for v in ["1.0.0", "2.0.0"] {
        control.cli(&["policy", "upload", "--name", "rms", "--version", v, "--kind", "query", &guest("rms")]).await?;
    }
    control
        .cli(&[
            "rollout",
            "start",
            "rms@1.0.0",
            "--series",
            "pmu.",
            "--canary",
            "0",
            "--waves",
            "100%",
            "--deadline-ms",
            DEADLINE_MS,
        ])
        .await?;
    runs(&cluster, &[0, 1, 2, 3, 4, 5], "rms", "1.0.0").await?;
    let t0 = now_ns() - 120_000_000_000;
    let points: Vec<Point> = (0..1200).map(|i| Point::new(t0 + i * 100_000_000, 3.0)).collect();
    cluster.client(0).await?.write(&series(), &points).await?;
    let range = TimeRange::new(t0, t0 + 120_000_000_000)?;

    let s: RolloutStatus = serde_json::from_str(
        &control
            .cli(&[
                "rollout",
                "start",
                "rms@2.0.0",
                "--series",
                "pmu.",
                "--canary",
                "1",
                "--waves",
                "100%",
                "--deadline-ms",
                DEADLINE_MS,
                "--json",
            ])
            .await?,
    )?;
    let canary = index(&cluster, &s.nodes.iter().find(|n| n.stage == Some(0)).unwrap().node_id);
    within(ROLLOUT_BOUND, "the canary runs rms 2.0.0 and keeps 1.0.0", || async {
        Ok(versions(&cluster, canary, "rms").await? == ["1.0.0", "2.0.0"])
    })
    .await?;
    let other = (canary + 1) % 6;
    let out = cluster.client(other).await?.query(&series(), range, "rms", &[]).await?;
    assert_eq!(out.version, "1.0.0");
    let rms = out.values.iter().find(|(name, _)| name == "rms").map(|(_, v)| *v);
    assert_eq!(rms, Some(3.0), "{out:?}");
    match cluster.client(canary).await?.query(&series(), range, "rms", &[]).await {
        Ok(out) => assert_eq!(out.version, "2.0.0"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("rms@2.0.0") && text.contains("rms@1.0.0"), "{text}");
            println!("{backend:?}: through the canary: {text}");
        }
    }
    assert_eq!(cluster.shutdown().await?, 6);
    Ok(())
}

/// `rms` 1.1.0 uploaded with a minimum version of 1.1.0 revokes 1.0.0. Rolling 1.0.0 out again
/// (a rollback, or whoever holds the control plane replaying an old signed version) is refused
/// by both nodes, which report it and keep running 1.1.0; a node restarted into that desired
/// state still refuses 1.0.0 (the revocation is kept in its data directory).
async fn revoked_versions_stay_revoked(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-revoke-").tempdir()?;
    let control = ControlPlane::start(CONTROL, backend, dir.path()).await?;
    control.cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "2"]).await?;
    let (mut options, _) = ClusterOptions::for_tests(2, NODE);
    options.dir = dir.path().join("nodes");
    let mut cluster = control.enroll_cluster_labelled(options, &["site=atl".into(), "site=atl".into()]).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    let upload = |version: &'static str, min: Option<&'static str>| {
        let mut args = vec!["policy", "upload", "--name", "rms", "--version", version, "--kind", "query"];
        args.extend(min.map(|m| ["--min-version", m]).into_iter().flatten());
        let module = guest("rms");
        let control = &control;
        async move {
            let mut args: Vec<&str> = args;
            args.push(&module);
            control.cli(&args).await
        }
    };
    upload("1.0.0", None).await?;
    upload("1.1.0", Some("1.1.0")).await?;
    let roll_out = |version: &'static str| {
        let control = &control;
        async move {
            let policy = format!("rms@{version}");
            control.cli(&["rollout", "start", &policy, "--series", "pmu.", "--canary", "0", "--waves", "100%"]).await
        }
    };
    roll_out("1.0.0").await?;
    runs(&cluster, &[0, 1], "rms", "1.0.0").await?;
    roll_out("1.1.0").await?;
    runs(&cluster, &[0, 1], "rms", "1.1.0").await?;

    let ids: Vec<String> = (0..2).map(|i| cluster.id(i).to_hex()).collect();
    let revoked = |i: usize| {
        let (control, id) = (&control, ids[i].clone());
        async move {
            let devices = control.devices().await?;
            let d = devices.iter().find(|d| d.node_id == id).expect("an enrolled node");
            Ok(d.policy_errors.iter().any(|e| e.name == "rms" && e.version == "1.0.0" && e.error.contains("revoked")))
        }
    };
    roll_out("1.0.0").await?;
    for i in 0..2 {
        within(ROLLOUT_BOUND, &format!("node {i} reports 1.0.0 revoked"), || revoked(i)).await?;
        assert_eq!(versions(&cluster, i, "rms").await?, ["1.1.0"], "node {i} keeps running 1.1.0");
    }
    assert!(cluster.terminate(1).await?);
    cluster.restart(1).await?;
    within(ROLLOUT_BOUND, "the restarted node still refuses 1.0.0", || revoked(1)).await?;
    assert_eq!(versions(&cluster, 1, "rms").await?, Vec::<String>::new(), "nothing revoked runs");
    assert_eq!(cluster.shutdown().await?, 2);
    Ok(())
}

/// `timeshard-control policy upload` of the module at `module` as query policy `rms@version`.
async fn upload_rms(
    control: &ControlPlane,
    module: &str,
    version: &str,
    signature: Option<&str>,
) -> anyhow::Result<String> {
    let mut args = vec!["policy", "upload", "--name", "rms", "--version", version, "--kind", "query"];
    if let Some(sig) = signature {
        args.extend(["--signature", sig]);
    }
    args.push(module);
    control.cli(&args).await
}

/// Offline signing: the service started with `--policy-public-key` signs nothing and takes only
/// uploads signed with that key; the node pins the key it was told at enrollment. The same
/// database served again without the flag (a service that now signs with a key of its own, as
/// a compromised one could) gets its modules refused by the node, which keeps running the
/// offline-signed version.
async fn offline_signing_and_a_pinned_key(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-offline-").tempdir()?;
    let (key, public) = (dir.path().join("policy.key"), dir.path().join("policy.pub"));
    let out = tokio::process::Command::new(CONTROL)
        .args(["policy", "keygen", "--out", key.to_str().unwrap()])
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "keygen: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&public, &out.stdout)?;
    let serve_args = vec!["--policy-public-key".to_string(), public.display().to_string()];
    let mut control = ControlPlane::start_with(CONTROL, backend, dir.path(), serve_args).await?;
    control.cli(&["class", "set", "pmu", "--prefix", "pmu.", "--quantum", "10s", "--rf", "1"]).await?;
    let (mut options, _) = ClusterOptions::for_tests(1, NODE);
    options.dir = dir.path().join("nodes");
    let cluster = control.enroll_cluster_labelled(options, &["site=atl".into()]).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;

    // The module, copied so that its signature file lands beside the copy.
    let module = dir.path().join("rms.wasm");
    std::fs::copy(guest("rms"), &module)?;
    let module = module.display().to_string();
    let unsigned = upload_rms(&control, &module, "1.0.0", None).await.unwrap_err().to_string();
    assert!(unsigned.contains("signs no policy"), "{unsigned}");
    let sign = |version: &str| {
        let args = [
            "policy",
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--name",
            "rms",
            "--version",
            version,
            "--kind",
            "query",
            &module,
        ];
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        async move {
            let out = tokio::process::Command::new(CONTROL).args(&args).output().await?;
            anyhow::ensure!(out.status.success(), "sign: {}", String::from_utf8_lossy(&out.stderr));
            Ok::<_, anyhow::Error>(format!("{}.sig", args[args.len() - 1]))
        }
    };
    let sig = sign("1.0.0").await?;
    // A signature made for another version is refused by the service.
    let wrong = upload_rms(&control, &module, "1.0.1", Some(&sig)).await.unwrap_err().to_string();
    assert!(wrong.contains("signature is refused"), "{wrong}");
    upload_rms(&control, &module, "1.0.0", Some(&sig)).await?;
    control.cli(&["rollout", "start", "rms@1.0.0", "--series", "pmu.", "--canary", "0", "--waves", "100%"]).await?;
    runs(&cluster, &[0], "rms", "1.0.0").await?;
    let pinned = std::fs::read_to_string(cluster.data_dir(0).join("control").join("policy-key"))?;
    assert_eq!(pinned.trim(), std::fs::read_to_string(&public)?.trim(), "the node pinned the offline key");

    // The same fleet served without offline signing: the service signs 2.0.0 with its own key.
    control.stop().await?;
    control.start_again_with(Vec::new()).await?;
    upload_rms(&control, &module, "2.0.0", None).await?;
    control.cli(&["rollout", "start", "rms@2.0.0", "--series", "pmu.", "--canary", "0", "--waves", "100%"]).await?;
    let id = cluster.id(0).to_hex();
    within(ROLLOUT_BOUND, "the node refuses 2.0.0, signed by a key it never pinned", || async {
        let devices = control.devices().await?;
        let d = devices.iter().find(|d| d.node_id == id).expect("the enrolled node");
        Ok(d.policy_errors.iter().any(|e| e.version == "2.0.0" && e.error.contains("does not trust")))
    })
    .await?;
    assert_eq!(versions(&cluster, 0, "rms").await?, ["1.0.0"], "the offline-signed version keeps running");
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_offline_policy_signing_with_a_pinned_key() -> anyhow::Result<()> {
    offline_signing_and_a_pinned_key(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_revoked_policy_versions_stay_revoked() -> anyhow::Result<()> {
    revoked_versions_stay_revoked(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_staged_rollout() -> anyhow::Result<()> {
    staged_rollout(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_staged_rollout() -> anyhow::Result<()> {
    staged_rollout(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_queries_across_versions() -> anyhow::Result<()> {
    queries_across_versions(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queries_across_versions() -> anyhow::Result<()> {
    queries_across_versions(Backend::Postgres).await
}

//! One backend at fleet scale: `devices` simulated devices enroll (timed), then all of them
//! watch while class changes are made through the first instance (each change timed until
//! every watcher has it), a policy version is rolled out to all of them (timed from the
//! promotion until each reports it, see [`super::rollout`]), and the service's memory is read
//! with all of them watching.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use http::Method;
use serde_json::json;
use timeshard_control_api::ClassSpec;
use timeshard_control_api::agent::{self, NodeClient};
use timeshard_control_api::api::{Changed, CreateEnrollmentToken, PutClasses, TokenCreated, paths};
use tokio::sync::mpsc;

use super::{FleetOptions, percentile_ms, rollout};
use crate::control::Admin;
use crate::control::process::{ServeProcess, Storage};

/// What one backend measured.
#[derive(Debug, Clone)]
pub struct ScaleResult {
    pub instances: usize,
    pub enroll_per_s: f64,
    pub enroll_p50_ms: f64,
    pub enroll_p99_ms: f64,
    pub propagate_p50_ms: f64,
    pub propagate_p99_ms: f64,
    pub propagate_max_ms: f64,
    pub control_rss_mb: f64,
    pub control_peak_rss_mb: f64,
    pub rollout_p50_s: f64,
    pub rollout_p99_s: f64,
    pub rollout_max_s: f64,
}

impl ScaleResult {
    pub fn to_json(&self) -> serde_json::Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "instances": self.instances,
            "enroll_per_s": r(self.enroll_per_s),
            "enroll_p50_ms": self.enroll_p50_ms,
            "enroll_p99_ms": self.enroll_p99_ms,
            "propagate_p50_ms": self.propagate_p50_ms,
            "propagate_p99_ms": self.propagate_p99_ms,
            "propagate_max_ms": self.propagate_max_ms,
            "control_rss_mb": r(self.control_rss_mb),
            "control_peak_rss_mb": r(self.control_peak_rss_mb),
            // From `rollout promote` to each simulated node reporting the new version.
            "rollout_p50_s": self.rollout_p50_s,
            "rollout_p99_s": self.rollout_p99_s,
            "rollout_max_s": self.rollout_max_s,
        })
    }
}

/// Runs the measurement with `instances` services on `storage`, rolling out `module`.
pub async fn measure(
    exe: &Path,
    storage: &Storage,
    instances: usize,
    args: &FleetOptions,
    module: &[u8],
) -> anyhow::Result<ScaleResult> {
    let mut services = vec![ServeProcess::start(exe, storage, true, &[]).await?];
    for _ in 1..instances {
        services.push(ServeProcess::start(exe, storage, false, &[]).await?);
    }
    let admin_token = services[0].admin_token.clone().context("no admin token")?;
    let admin = Admin::new(&services[0].url, &admin_token)?;
    let urls: Vec<String> = services.iter().map(|s| s.url.clone()).collect();

    // Tokens first (not timed).
    let tokens: Vec<String> = futures::stream::iter(0..args.devices)
        .map(|i| {
            let admin = admin.clone();
            async move {
                let req = CreateEnrollmentToken {
                    labels: [("site".to_string(), format!("s{}", i % 10))].into(),
                    location: None,
                    expires_in_s: 3600,
                };
                admin.send::<_, TokenCreated>(Method::POST, paths::ENROLLMENT_TOKENS, &req).await.map(|t| t.token)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;

    // Enrollment, spread over the instances.
    let started = Instant::now();
    let enrolled: Vec<(agent::Enrolled, f64)> = futures::stream::iter(tokens.into_iter().enumerate())
        .map(|(i, token)| {
            let url = urls[i % urls.len()].clone();
            async move {
                let t = Instant::now();
                let e = agent::request_enrollment(&url, &token).await?;
                Ok::<_, anyhow::Error>((e, t.elapsed().as_secs_f64() * 1000.0))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let enroll_secs = started.elapsed().as_secs_f64();
    let mut enroll_ms: Vec<f64> = enrolled.iter().map(|(_, ms)| *ms).collect();
    eprintln!("bench: {} devices enrolled in {enroll_secs:.1} s", enrolled.len());

    // Every device watches (through the instance it enrolled with).
    let (tx, mut rx) = mpsc::channel::<(u64, Instant)>(4 * args.devices);
    let (policy_tx, mut policy_rx) = mpsc::channel::<(String, Instant)>(4 * args.devices);
    let mut watchers = Vec::with_capacity(enrolled.len());
    for (e, _) in enrolled {
        let client = NodeClient::new(e.credentials)?;
        let since = e.desired.generation;
        watchers.push(tokio::spawn(watch_loop(client, since, tx.clone(), policy_tx.clone())));
    }
    drop((tx, policy_tx));

    // A warm-up change that every watcher must see: then all are connected and waiting.
    let mut class = ClassSpec::new("bench", "bench.");
    let mut generation = change(&admin, &mut class, 0).await?;
    wait_all(&mut rx, generation, args.devices, Instant::now()).await.context("warm-up")?;
    let mut propagate_ms = Vec::with_capacity(args.devices * args.rounds);
    for round in 1..=args.rounds {
        // Let the watchers re-establish their long polls.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t0 = Instant::now();
        generation = change(&admin, &mut class, round).await?;
        propagate_ms.extend(wait_all(&mut rx, generation, args.devices, t0).await?);
    }
    let rounds = args.rounds.min(3);
    let mut rollout_s = rollout::measure(&admin, module, args.devices, rounds, &mut policy_rx).await?;
    // The propagation channel filled up meanwhile; nobody reads it any more.
    rx.close();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut rss, mut peak) = (0.0, 0.0);
    for s in &services {
        let (now, hwm) = s.rss_mb().context("cannot read the service's memory from /proc")?;
        rss += now;
        peak += hwm;
    }
    for w in &watchers {
        w.abort();
    }
    for s in &mut services {
        s.stop().await?;
    }
    Ok(ScaleResult {
        instances,
        enroll_per_s: args.devices as f64 / enroll_secs,
        enroll_p50_ms: percentile_ms(&mut enroll_ms, 50.0),
        enroll_p99_ms: percentile_ms(&mut enroll_ms, 99.0),
        propagate_p50_ms: percentile_ms(&mut propagate_ms, 50.0),
        propagate_p99_ms: percentile_ms(&mut propagate_ms, 99.0),
        propagate_max_ms: percentile_ms(&mut propagate_ms, 100.0),
        control_rss_mb: rss,
        control_peak_rss_mb: peak,
        // Seconds, kept to two decimals by the millisecond helper's rounding.
        rollout_p50_s: percentile_ms(&mut rollout_s, 50.0),
        rollout_p99_s: percentile_ms(&mut rollout_s, 99.0),
        rollout_max_s: percentile_ms(&mut rollout_s, 100.0),
    })
}

/// Changes the bench class's retention (a change every node must apply).
async fn change(admin: &Admin, class: &mut ClassSpec, round: usize) -> anyhow::Result<u64> {
    class.retention = Some(Duration::from_secs(86_400 * (round as u64 + 1)));
    let changed: Changed =
        admin.send(Method::PUT, paths::CLASSES, &PutClasses { classes: vec![class.clone()] }).await?;
    Ok(changed.generation)
}

/// Long-polls forever, telling `tx` every new generation it receives, and `policies` every
/// version of the benchmark's policy it reported running.
async fn watch_loop(
    client: NodeClient,
    mut since: u64,
    tx: mpsc::Sender<(u64, Instant)>,
    policies: mpsc::Sender<(String, Instant)>,
) {
    let (mut running, mut fetched) = (None, std::collections::HashSet::new());
    loop {
        match client.watch(since, Duration::from_secs(60)).await {
            Ok(Some(state)) => {
                since = state.generation;
                // A closed channel: the propagation figures are taken.
                let _ = tx.try_send((state.generation, Instant::now()));
                match rollout::follow_policy(&client, &state, &mut running, &mut fetched).await {
                    Ok(Some(version)) => {
                        if policies.send((version, Instant::now())).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "bench device: cannot follow the policy; retrying");
                        // Ask again for the same state.
                        since = since.saturating_sub(1);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "bench watcher: watch failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Waits until `n` watchers have reported `generation` (or later); their delays from `t0`.
async fn wait_all(
    rx: &mut mpsc::Receiver<(u64, Instant)>,
    generation: u64,
    n: usize,
    t0: Instant,
) -> anyhow::Result<Vec<f64>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut delays = Vec::with_capacity(n);
    while delays.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((g, at))) if g >= generation => {
                delays.push(at.saturating_duration_since(t0).as_secs_f64() * 1000.0)
            }
            Ok(Some(_)) => {}
            Ok(None) => bail!("the watchers stopped"),
            Err(_) => bail!("only {} of {n} watchers got generation {generation} within 60 s", delays.len()),
        }
    }
    Ok(delays)
}

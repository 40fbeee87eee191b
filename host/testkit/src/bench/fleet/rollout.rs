//! The rollout figure of the fleet benchmark: with every simulated device watching, a version
//! is rolled out to all of them with one canary, then promoted; timed from `rollout promote`
//! until each device has fetched the module and its report naming the new version was
//! accepted (`rollout_p99_s`). A simulated device does what a node does, but for compiling:
//! watch, fetch the module by hash once, report. Each version is another module (see
//! [`tagged`]), so each device fetches each.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http::Method;
use timeshard_control_api::DesiredState;
use timeshard_control_api::agent::NodeClient;
use timeshard_control_api::api::{HealthStatus, PolicyRun, Report, paths};
use timeshard_control_api::policy::{RolloutAction, RolloutSpec, RolloutState, RolloutStatus, Uploaded};
use tokio::sync::mpsc;

use crate::control::Admin;

/// The policy the benchmark rolls out.
pub const POLICY: &str = "bench-policy";

/// What a simulated device does with a desired state: when it names a new version of
/// [`POLICY`], fetches the module (once per hash) and reports running it. Returns the version
/// reported, if it reported one.
pub async fn follow_policy(
    client: &NodeClient,
    state: &DesiredState,
    running: &mut Option<String>,
    fetched: &mut HashSet<String>,
) -> anyhow::Result<Option<String>> {
    let Some(a) = state.policies.iter().find(|a| a.name == POLICY && a.bound) else { return Ok(None) };
    if running.as_deref() == Some(a.version.as_str()) {
        return Ok(None);
    }
    if !fetched.contains(&a.sha256) {
        client.fetch_module(&a.sha256).await?;
        fetched.insert(a.sha256.clone());
    }
    let report = Report {
        generation_applied: state.generation,
        digest_applied: state.digest.clone(),
        health: HealthStatus::Ok,
        message: None,
        apply_error: None,
        policies: vec![PolicyRun { name: POLICY.into(), version: a.version.clone(), ..Default::default() }],
        policy_errors: Vec::new(),
        storage: None,
    };
    client.report(&report).await?;
    *running = Some(a.version.clone());
    Ok(Some(a.version.clone()))
}

fn spec(version: &str, canary: u32) -> RolloutSpec {
    RolloutSpec {
        policy: POLICY.into(),
        version: version.into(),
        selector: Default::default(),
        series: Default::default(),
        settings: Default::default(),
        canary,
        waves: vec![100],
        abort_above_pct: 5.0,
    }
}

/// `module` with a custom section naming `version` appended: another module (another hash) for
/// each version, as in a real rollout, so every device fetches each one.
pub fn tagged(module: &[u8], version: &str) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"timeshard-bench-version";
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name);
    payload.extend_from_slice(version.as_bytes());
    let mut out = module.to_vec();
    out.push(0); // a custom section
    leb(payload.len(), &mut out);
    out.extend(payload);
    out
}

/// Waits until `n` devices reported `version`; their delays from `t0` in seconds.
async fn wait_reports(
    rx: &mut mpsc::Receiver<(String, Instant)>,
    version: &str,
    n: usize,
    t0: Instant,
) -> anyhow::Result<Vec<f64>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut delays = Vec::with_capacity(n);
    while delays.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((v, at))) if v == version => delays.push(at.saturating_duration_since(t0).as_secs_f64()),
            Ok(Some(_)) => {}
            Ok(None) => bail!("the simulated devices stopped"),
            Err(_) => bail!("only {} of {n} devices reported {version} within 120 s", delays.len()),
        }
    }
    Ok(delays)
}

/// Runs `rounds` rollouts over `devices` watching devices (whose reports arrive on `rx`) with
/// `module` as every version; returns the delays (s) from each promotion to each device's report.
pub async fn measure(
    admin: &Admin,
    module: &[u8],
    devices: usize,
    rounds: usize,
    rx: &mut mpsc::Receiver<(String, Instant)>,
) -> anyhow::Result<Vec<f64>> {
    let upload = |version: String| async move {
        let path = format!("{}?name={POLICY}&version={version}&kind=ingest", paths::POLICIES);
        admin
            .send_bytes::<Uploaded>(Method::POST, &path, tagged(module, &version))
            .await
            .context("uploading the module")
    };
    // Every device runs version 0 first (each fetches the module once).
    upload("0.0.0".into()).await?;
    admin.send::<_, RolloutStatus>(Method::POST, paths::ROLLOUTS, &spec("0.0.0", 0)).await?;
    wait_reports(rx, "0.0.0", devices, Instant::now()).await.context("the first version")?;
    let mut delays = Vec::with_capacity(devices * rounds);
    for round in 1..=rounds {
        let version = format!("{round}.0.0");
        upload(version.clone()).await?;
        let started: RolloutStatus = admin.send(Method::POST, paths::ROLLOUTS, &spec(&version, 1)).await?;
        anyhow::ensure!(started.state == RolloutState::Running, "the rollout is {}", started.state);
        wait_reports(rx, &version, 1, Instant::now()).await.context("the canary")?;
        // Let the watchers re-establish their long polls.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t0 = Instant::now();
        let path = format!("{}/{POLICY}/promote", paths::ROLLOUTS);
        let done: RolloutStatus = admin.send(Method::POST, &path, &RolloutAction::default()).await?;
        anyhow::ensure!(done.state == RolloutState::Completed, "the rollout is {}", done.state);
        delays.extend(wait_reports(rx, &version, devices - 1, t0).await.with_context(|| format!("round {round}"))?);
        eprintln!("bench: rollout round {round}: {} devices reported {version}", devices);
    }
    Ok(delays)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_modules_differ_and_stay_components() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest");
        let noop = std::fs::read(timeshard_policy::guest_artifact(&dir, "noop").unwrap()).unwrap();
        let (a, b) = (tagged(&noop, "1.0.0"), tagged(&noop, "2.0.0"));
        assert_ne!(a, b);
        for m in [&a, &b] {
            timeshard_policy::component::inspect(m, timeshard_policy::Kind::Ingest).unwrap();
        }
    }
}

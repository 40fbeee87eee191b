//! Policy modules and rollouts against the real service, with simulated devices: uploads
//! checked and signed, bad input refused whole, stages, late joiners, the automatic abort, and
//! promote, pause and rollback. Run on SQLite and on PostgreSQL with two instances.

use std::time::Duration;

use http::Method;
use timeshard_control_api::api::{AuditEntry, HealthStatus, PolicyLoadError, PolicyRun, Report, paths};
use timeshard_control_api::policy::{
    Kind, MAX_MODULE_BYTES, PolicyVersionInfo, RolloutAction, RolloutSpec, RolloutState, RolloutStatus, SeriesSelector,
    Uploaded,
};
use timeshard_control_api::state::{Selector, parse_labels};
use timeshard_control_api::{Agent, DesiredState};
use timeshard_policy::PolicyRef;
use timeshard_policy::signing::{self, Identity, Signature, TrustedKeys};

use super::{TestFleet, client_code, eventually};

/// The monitor aborts within this of the failing report (README: its 1 s look, plus a write).
pub const ABORT_BOUND: Duration = Duration::from_secs(5);

fn guest(name: &str) -> Vec<u8> {
    let path =
        timeshard_policy::guest_artifact(&crate::guest_dir(), name).expect("the guests, built by guest/build.sh");
    std::fs::read(path).unwrap()
}

async fn upload(fleet: &TestFleet, name: &str, version: &str, kind: &str, bytes: Vec<u8>) -> anyhow::Result<Uploaded> {
    let path = format!("{}?name={name}&version={version}&kind={kind}", paths::POLICIES);
    fleet.admin.send_bytes(Method::POST, &path, bytes).await
}

fn spec(version: &str, select: &str, canary: u32, waves: &[u32]) -> RolloutSpec {
    RolloutSpec {
        policy: "pmu-validate".into(),
        version: version.into(),
        selector: Selector { labels: parse_labels(select).unwrap(), geohash: None },
        series: SeriesSelector { metric_prefix: "pmu.".into(), ..Default::default() },
        settings: Default::default(),
        canary,
        waves: waves.to_vec(),
        abort_above_pct: 5.0,
    }
}

async fn start(fleet: &TestFleet, spec: &RolloutSpec) -> anyhow::Result<RolloutStatus> {
    fleet.admin.send(Method::POST, paths::ROLLOUTS, spec).await
}

async fn act(fleet: &TestFleet, action: &str) -> anyhow::Result<RolloutStatus> {
    let path = format!("{}/pmu-validate/{action}", paths::ROLLOUTS);
    fleet.admin.send(Method::POST, &path, &RolloutAction { reason: Some(format!("test {action}")) }).await
}

async fn status(fleet: &TestFleet) -> RolloutStatus {
    fleet.admin.get(&format!("{}/pmu-validate", paths::ROLLOUTS)).await.unwrap()
}

/// The version of pmu-validate `agent` is told to run now (long-polling from generation 0
/// answers at once).
async fn version_of(agent: &Agent) -> Option<String> {
    let state = agent.client().watch(0, Duration::from_secs(5)).await.unwrap().unwrap();
    bound(&state)
}

/// Waits until `agent` is told to run `version` of pmu-validate (with two instances, the one it
/// watches may learn of a change up to a second after the one that made it).
async fn told(agent: &Agent, version: &str) {
    let limit = super::scenarios::PROPAGATION_BOUND;
    eventually(limit, || async { version_of(agent).await.as_deref() == Some(version) }).await;
}

fn bound(state: &DesiredState) -> Option<String> {
    state.policies.iter().find(|p| p.name == "pmu-validate" && p.bound).map(|p| p.version.clone())
}

fn report(state: &DesiredState, runs: Vec<PolicyRun>, errors: Vec<PolicyLoadError>) -> Report {
    Report {
        generation_applied: state.generation,
        digest_applied: state.digest.clone(),
        health: HealthStatus::Ok,
        message: None,
        apply_error: None,
        policies: runs,
        policy_errors: errors,
        storage: None,
    }
}

fn run(version: &str, calls: u64, traps: u64) -> PolicyRun {
    PolicyRun { name: "pmu-validate".into(), version: version.into(), calls, traps, ..Default::default() }
}

/// Uploads: checked, stored by hash, signed over hash and identity; bad ones refused whole.
pub async fn uploads(fleet: &TestFleet) {
    let code = |r: anyhow::Result<Uploaded>| client_code(&r.unwrap_err());
    let refused = |r: anyhow::Result<Uploaded>| r.unwrap_err().to_string();
    let e = refused(upload(fleet, "bad", "1.0.0", "ingest", b"\0asm\x01\0\0\0".to_vec()).await);
    assert!(e.contains("not a component") && e.contains("policy_invalid"), "{e}");
    let e = refused(upload(fleet, "bad", "1.0.0", "ingest", guest("hostile-wasi-fs")).await);
    assert!(e.contains("imports `wasi:") && e.contains("timeshard:policy/host"), "{e}");
    let e = refused(upload(fleet, "bad", "1.0.0", "ingest", guest("rms")).await);
    assert!(e.contains("does not export `timeshard:policy/ingest@0.1.0`"), "{e}");
    let e = refused(upload(fleet, "bad", "1.0.0", "ingest", vec![0; MAX_MODULE_BYTES + 1]).await);
    assert!(e.contains("module_too_large") && e.contains(&MAX_MODULE_BYTES.to_string()), "{e}");
    let e = refused(upload(fleet, "bad", "1.0.0", "filter", guest("noop")).await);
    assert!(e.contains("ingest or query"), "{e}");
    let e = refused(upload(fleet, "bad!name", "1.0.0", "ingest", guest("noop")).await);
    assert!(e.contains("policy_invalid"), "{e}");
    let listed: Vec<PolicyVersionInfo> = fleet.admin.get(paths::POLICIES).await.unwrap();
    assert!(listed.is_empty(), "nothing of a refused upload is stored: {listed:?}");

    let first = upload(fleet, "pmu-validate", "1.0.0", "ingest", guest("noop")).await.unwrap();
    assert!(first.created);
    let again = upload(fleet, "pmu-validate", "1.0.0", "ingest", guest("noop")).await.unwrap();
    assert!(!again.created, "the same bytes again change nothing");
    assert_eq!(again.policy, first.policy);
    assert_eq!(
        code(upload(fleet, "pmu-validate", "1.0.0", "ingest", guest("pmu-validate")).await).as_deref(),
        Some("version_conflict")
    );
    assert_eq!(
        code(upload(fleet, "pmu-validate", "9.0.0", "query", guest("rms")).await).as_deref(),
        Some("kind_conflict")
    );

    // The signature is the fleet key's, over the hash, name, version and kind.
    let key = fleet.fleet_info().await.policy_key.expect("the fleet's policy key, made by the first upload");
    let trusted = TrustedKeys::from_texts([key.as_str()]).unwrap();
    let sig = Signature::from_text(&first.policy.signature).unwrap();
    let me = Identity::new(PolicyRef::new("pmu-validate", "1.0.0").unwrap(), Kind::Ingest);
    signing::verify(&trusted, &guest("noop"), &me, &sig, false).unwrap();
    let other = Identity::new(PolicyRef::new("noop", "1.0.0").unwrap(), Kind::Ingest);
    assert!(signing::verify(&trusted, &guest("noop"), &other, &sig, false).is_err());
    assert_eq!(first.policy.sha256, signing::hex(&signing::sha256(&guest("noop"))));
    // Operators can take the module and its signature, e.g. for a node configured by hand.
    let (ok, out, err) = fleet
        .cli(&["policy", "download", "pmu-validate@1.0.0", "--out", fleet.work.path().join("m.wasm").to_str().unwrap()])
        .await;
    assert!(ok, "{err}");
    assert!(out.contains("m.wasm.sig"), "{out}");
    assert_eq!(std::fs::read(fleet.work.path().join("m.wasm")).unwrap(), guest("noop"));

    let (ok, out, err) = fleet.cli(&["policy", "list"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("pmu-validate") && out.contains(&first.policy.sha256[..16]) && out.contains("token:"),
        "{out}"
    );
    let audit: Vec<AuditEntry> = fleet.admin.get(paths::AUDIT).await.unwrap();
    assert_eq!(audit.iter().filter(|a| a.action == "policy.upload").count(), 1, "{audit:?}");
}

/// Stages, late joiners, the automatic abort, promotion to completion, pause and rollback.
pub async fn rollouts(fleet: &TestFleet) {
    let mut atl = Vec::new();
    for i in 0..3 {
        atl.push(fleet.enroll(i, &format!("atl{i}"), "site=atl").await);
    }
    let sfo = fleet.enroll(1, "sfo0", "site=sfo").await;
    upload(fleet, "pmu-validate", "1.0.0", "ingest", guest("noop")).await.unwrap();
    upload(fleet, "pmu-validate", "2.0.0", "ingest", guest("pmu-validate")).await.unwrap();

    // Bad rollouts, each refused with nothing started.
    let code = |r: anyhow::Result<RolloutStatus>| client_code(&r.unwrap_err());
    assert_eq!(code(start(fleet, &spec("9.9.9", "", 0, &[100])).await).as_deref(), Some("unknown_version"));
    assert_eq!(
        code(start(fleet, &spec("1.0.0", "site=nyc", 0, &[100])).await).as_deref(),
        Some("rollout_targets_nothing")
    );
    assert_eq!(code(start(fleet, &spec("1.0.0", "", 0, &[50])).await).as_deref(), Some("bad_request"));
    assert!(fleet.admin.get::<RolloutStatus>(&format!("{}/pmu-validate", paths::ROLLOUTS)).await.is_err());

    // One stage: version 1 everywhere at once.
    let s = start(fleet, &spec("1.0.0", "", 0, &[100])).await.unwrap();
    assert_eq!(s.state, RolloutState::Completed);
    for a in atl.iter().chain([&sfo]) {
        told(a, "1.0.0").await;
    }
    // A node gets what it needs to fetch and check the module.
    let state = atl[0].client().watch(0, Duration::from_secs(5)).await.unwrap().unwrap();
    let assigned = &state.policies[0];
    let bytes = atl[0].client().fetch_module(&assigned.sha256).await.unwrap();
    assert_eq!(bytes, guest("noop"));
    let trusted = TrustedKeys::from_texts([state.policy_key.as_deref().unwrap()]).unwrap();
    let me = Identity::new(PolicyRef::new("pmu-validate", "1.0.0").unwrap(), Kind::Ingest);
    signing::verify(&trusted, &bytes, &me, &Signature::from_text(&assigned.signature).unwrap(), false).unwrap();
    assert_eq!(assigned.series.metric_prefix, "pmu.");

    // Version 2 to Atlanta with one canary.
    let s = start(fleet, &spec("2.0.0", "site=atl", 1, &[100])).await.unwrap();
    assert_eq!((s.state, s.stage, s.stages.len()), (RolloutState::Running, 0, 2));
    assert_eq!(code(start(fleet, &spec("2.0.0", "site=atl", 1, &[100])).await).as_deref(), Some("rollout_in_progress"));
    let canary = s.nodes.iter().find(|n| n.stage == Some(0)).unwrap().node_id.clone();
    for a in &atl {
        told(a, if a.node_id() == canary { "2.0.0" } else { "1.0.0" }).await;
    }
    assert_eq!(version_of(&sfo).await.as_deref(), Some("1.0.0"), "sfo is untouched");

    // A node joining site=atl now is no target: the stable version until completion.
    let late = fleet.enroll(0, "atl-late", "site=atl").await;
    assert_eq!(version_of(&late).await.as_deref(), Some("1.0.0"));
    let s = status(fleet).await;
    let row = s.nodes.iter().find(|n| n.node_id == late.node_id()).expect("late joiners are listed");
    assert_eq!((row.stage, row.desired.as_deref()), (None, Some("1.0.0")));

    // The canary reports traps: the rollout aborts on its own, and the canary goes back.
    let canary_agent = atl.iter().find(|a| a.node_id() == canary).unwrap();
    let state = canary_agent.client().watch(0, Duration::from_secs(5)).await.unwrap().unwrap();
    canary_agent.client().report(&report(&state, vec![run("2.0.0", 20, 20)], vec![])).await.unwrap();
    let took = eventually(ABORT_BOUND, || async { status(fleet).await.state == RolloutState::Aborted }).await;
    println!("{}: the rollout aborted {took:?} after the failing report", fleet.backend());
    told(canary_agent, "1.0.0").await;
    let s = status(fleet).await;
    assert!(s.reason.as_deref().unwrap().contains("20 of 20 calls"), "{:?}", s.reason);
    let audit: Vec<AuditEntry> = fleet.admin.get(paths::AUDIT).await.unwrap();
    let abort = audit.iter().find(|a| a.action == "rollout.abort").expect("the abort is audited");
    assert!(abort.actor.contains("rollout monitor"), "{abort:?}");

    // Start again; a load error aborts as well.
    canary_agent.client().report(&report(&state, vec![run("1.0.0", 20, 0)], vec![])).await.unwrap();
    let s = start(fleet, &spec("2.0.0", "site=atl", 1, &[100])).await.unwrap();
    let canary = s.nodes.iter().find(|n| n.stage == Some(0)).unwrap().node_id.clone();
    let canary_agent = atl.iter().chain([&late]).find(|a| a.node_id() == canary).unwrap();
    let error = PolicyLoadError { name: "pmu-validate".into(), version: "2.0.0".into(), error: "no space left".into() };
    canary_agent.client().report(&report(&state, vec![], vec![error])).await.unwrap();
    eventually(ABORT_BOUND, || async { status(fleet).await.state == RolloutState::Aborted }).await;
    assert!(status(fleet).await.reason.unwrap().contains("could not load pmu-validate@2.0.0"));
    canary_agent.client().report(&report(&state, vec![run("1.0.0", 20, 0)], vec![])).await.unwrap();

    // Healthy this time: pause, resume, promote to the end. Every Atlanta node runs version 2,
    // the late joiner too; San Francisco keeps version 1.
    start(fleet, &spec("2.0.0", "site=atl", 1, &[50, 100])).await.unwrap();
    assert_eq!(act(fleet, "pause").await.unwrap().state, RolloutState::Paused);
    assert_eq!(code(act(fleet, "promote").await).as_deref(), Some("rollout_state"));
    assert_eq!(act(fleet, "resume").await.unwrap().state, RolloutState::Running);
    assert_eq!(act(fleet, "promote").await.unwrap().stage, 1);
    let done = act(fleet, "promote").await.unwrap();
    assert_eq!(done.state, RolloutState::Completed);
    assert_eq!(code(act(fleet, "promote").await).as_deref(), Some("rollout_state"));
    for a in atl.iter().chain([&late]) {
        told(a, "2.0.0").await;
    }
    assert_eq!(version_of(&sfo).await.as_deref(), Some("1.0.0"));

    // Rolling back a completed rollout restores what its selector ran before.
    assert_eq!(act(fleet, "rollback").await.unwrap().state, RolloutState::RolledBack);
    for a in atl.iter().chain([&late, &sfo]) {
        told(a, "1.0.0").await;
    }
    let audit: Vec<AuditEntry> = fleet.admin.get(&format!("{}?limit=1000", paths::AUDIT)).await.unwrap();
    for action in ["rollout.start", "rollout.promote", "rollout.pause", "rollout.resume", "rollout.rollback"] {
        assert!(audit.iter().any(|a| a.action == action), "{action} is audited");
    }

    // The CLI shows the rollout, and where each version runs (from the reports).
    let (ok, out, err) = fleet.cli(&["rollout", "status", "pmu-validate"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("state rolled-back") && out.contains("canary"), "{out}");
    let (ok, out, err) = fleet.cli(&["policy", "show", "pmu-validate"]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&canary[..12]), "the canary reports 1.0.0: {out}");
}

//! The suite, run against SQLite (`tests/sqlite.rs`) and PostgreSQL with two instances
//! (`tests/postgres.rs`). Devices alternate between instances, and changes are made through
//! instance 0, so on PostgreSQL every propagation crosses instances.

use std::time::{Duration, Instant};

use http::Method;
use timeshard_control_api::agent::{self, Agent, AgentError};
use timeshard_control_api::api::{
    AuditEntry, Changed, ClassStorage, CreateApiToken, CreateHttpToken, DeviceInfo, EnrollRequest, EnrollResponse,
    HealthStatus, HttpTokenInfo, PutClasses, PutNodeConfig, Report, StorageStatus, TokenCreated, paths,
};
use timeshard_control_api::http::Endpoint;
use timeshard_control_api::state::{NodeSettings, Selector, parse_labels};
use timeshard_control_api::token::{Fingerprint, Token, TokenKind, sha256};
use timeshard_control_api::{ClassSpec, DesiredState, NodeClient, tls};

use super::{TestFleet, client_code, code};

/// A class change must reach every watching node within this (the README's stated bound).
pub const PROPAGATION_BOUND: Duration = Duration::from_secs(5);

async fn classes(fleet: &TestFleet) -> Vec<ClassSpec> {
    fleet.admin.get(paths::CLASSES).await.unwrap()
}

async fn devices(fleet: &TestFleet) -> Vec<DeviceInfo> {
    fleet.admin.get(paths::DEVICES).await.unwrap()
}

async fn audit(fleet: &TestFleet) -> Vec<AuditEntry> {
    fleet.admin.get(&format!("{}?limit=1000", paths::AUDIT)).await.unwrap()
}

async fn put_class(fleet: &TestFleet, class: ClassSpec) -> anyhow::Result<Changed> {
    fleet.admin.send(Method::PUT, paths::CLASSES, &PutClasses { classes: vec![class] }).await
}

/// Watches until the desired state reaches generation `at_least` (an answer may come from a
/// generation in between, as for any node).
pub async fn watch_to(client: &NodeClient, since: u64, at_least: u64) -> DesiredState {
    let mut since = since;
    loop {
        let state = client.watch(since, Duration::from_secs(10)).await.unwrap().expect("a change within 10 s");
        if state.generation >= at_least {
            return state;
        }
        since = state.generation;
    }
}

/// What a device on a small card reports: a class refusing at its quota, an archive behind.
fn small_card() -> StorageStatus {
    StorageStatus {
        disk_size_bytes: 8 << 30,
        disk_available_bytes: 1 << 30,
        classes: vec![ClassStorage {
            class: "pmu".into(),
            quota_bytes: 1 << 30,
            used_bytes: 1 << 30,
            on_full: "refuse".into(),
            refusing: true,
            ..ClassStorage::default()
        }],
        export_pending_blocks: 42,
        export_failed_rounds: 3,
        ..StorageStatus::default()
    }
}

fn report_of(state: &DesiredState) -> Report {
    Report {
        generation_applied: state.generation,
        digest_applied: state.digest.clone(),
        health: HealthStatus::Ok,
        message: None,
        apply_error: None,
        policies: vec![],
        policy_errors: vec![],
        storage: Some(small_card()),
    }
}

/// Devices enroll from nothing through the CLI's tokens, get certificates bound to their keys
/// and their labels and location, and a class change reaches all of them while they watch.
pub async fn enrollment_and_propagation(fleet: &TestFleet) {
    // A token from the CLI, as an operator would make it.
    let (ok, token, err) = fleet
        .cli(&["token", "create", "--labels", "site=atl,rack=3", "--location", "33.75,-84.39", "--expires", "10m"])
        .await;
    assert!(ok, "{err}");
    let token = token.trim().to_string();
    assert!(token.starts_with("tsc1."), "{token}");
    assert!(err.contains("single use"), "{err}");

    let first = agent::enroll(fleet.url(1), &token, &fleet.device_dir("d0")).await.unwrap();
    let desired = first.applied().clone();
    assert_eq!(desired.labels, parse_labels("site=atl,rack=3").unwrap());
    assert_eq!(desired.location.as_ref().unwrap().geohash, "dn5bp8j04");
    assert_eq!(desired.node_id, first.node_id());
    // The files a node needs, where timeshard_sdk::tls::TlsFiles::in_dir(dir, "node") looks.
    for f in ["ca.pem", "node.pem", "node.key", "enrollment.json", "desired.json"] {
        assert!(first.dir().join(f).exists(), "{f}");
    }
    // The certificate binds the node's key: its public key hashes to the node id.
    let cert = tls::certs_from_pem("c", &first.client().credentials().cert_pem).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&cert[0]).unwrap();
    assert_eq!(timeshard_proto::Id::of_public_key(parsed.public_key().raw).to_hex(), first.node_id());
    let lifetime = parsed.validity().not_after.timestamp() - parsed.validity().not_before.timestamp();
    assert!((7 * 86_400..=7 * 86_400 + 600).contains(&lifetime), "default lifetime 7 days, got {lifetime} s");
    // Reopening needs no network.
    assert_eq!(Agent::open(&fleet.device_dir("d0")).unwrap().applied(), &desired);

    let mut agents = vec![first];
    for i in 1..5 {
        agents.push(fleet.enroll(i, &format!("d{i}"), if i % 2 == 0 { "site=atl" } else { "site=sfo" }).await);
    }
    let listed = devices(fleet).await;
    assert_eq!(listed.len(), 5);
    assert!(listed.iter().all(|d| d.revoked_at_ms.is_none() && d.cert_not_after_ms > 0));

    // Everyone watches from what they have; a class change reaches all of them.
    let since: Vec<u64> = agents.iter().map(|a| a.applied().generation).collect();
    let watchers: Vec<_> = agents
        .iter()
        .zip(since)
        .map(|(a, since)| {
            let client = a.client().clone();
            tokio::spawn(async move {
                let got = client.watch(since, Duration::from_secs(20)).await.unwrap();
                (got, Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut pmu = ClassSpec::new("pmu", "pmu.");
    pmu.retention = Some(Duration::from_secs(7 * 86_400));
    let changed_at = Instant::now();
    let changed = put_class(fleet, pmu.clone()).await.unwrap();
    for (agent, w) in agents.iter_mut().zip(watchers) {
        let (got, at) = w.await.unwrap();
        let state = got.expect("a new desired state, not a timeout");
        assert!(at - changed_at < PROPAGATION_BOUND, "took {:?}", at - changed_at);
        assert_eq!(state.generation, changed.generation);
        assert_eq!(state.classes, vec![pmu.clone()]);
        agent.save_applied(state.clone()).unwrap();
        agent.client().report(&report_of(&state)).await.unwrap();
    }
    let info = fleet.fleet_info().await;
    for d in devices(fleet).await {
        assert_eq!(d.generation_applied, Some(changed.generation));
        assert_eq!(d.digest_applied.as_deref(), Some(info.digest.as_str()));
        assert_eq!(d.health, Some(HealthStatus::Ok));
        assert!(d.last_seen_ms.is_some());
        assert_eq!(d.storage, Some(small_card()), "the storage report is kept");
    }
    // The CLI shows them as current, with their disk and export backlog.
    let (ok, out, err) = fleet.cli(&["devices"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.matches("(current)").count(), 5, "{out}");
    assert_eq!(out.matches("1024 MiB (12%); pmu 100% of quota, refusing").count(), 5, "{out}");
    assert_eq!(out.matches("42 blocks, 3 rounds failed").count(), 5, "{out}");
    // A report too large to keep is refused.
    let mut huge = report_of(agents[0].applied());
    huge.storage.as_mut().unwrap().export_last_error = Some("x".repeat(5000));
    let err = agents[0].client().report(&huge).await.unwrap_err().to_string();
    assert!(err.contains("storage"), "{err}");
}

/// A node offline during changes catches up at once when back, even after a restart of its
/// own (from its files), and a watch without changes answers "nothing new" after its wait.
pub async fn offline_node_catches_up(fleet: &TestFleet) {
    let agent = fleet.enroll(1, "offline", "site=atl").await;
    let was = agent.applied().generation;
    drop(agent);
    put_class(fleet, ClassSpec::new("a", "a.")).await.unwrap();
    let last = put_class(fleet, ClassSpec::new("b", "b.")).await.unwrap();
    // Back: a restarted node starts from its last applied state, then catches up.
    let agent = Agent::open(&fleet.device_dir("offline")).unwrap();
    assert_eq!(agent.applied().generation, was);
    let start = Instant::now();
    let state = watch_to(agent.client(), was, last.generation).await;
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    assert_eq!(state.generation, last.generation);
    assert_eq!(state.classes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let none = agent.client().watch(state.generation, Duration::from_millis(300)).await.unwrap();
    assert!(none.is_none());
}

/// Reused, expired, forged, tampered, wrong-fleet and malformed tokens, malformed CSRs and
/// CSRs for enrolled keys are refused with clear errors and issue nothing.
pub async fn token_misuse(fleet: &TestFleet) {
    let token = fleet.token("site=atl", None, 600).await;
    let used = agent::enroll(fleet.url(0), &token, &fleet.device_dir("m0")).await.unwrap();
    let count = devices(fleet).await.len();

    // Reused (through the other instance, where there is one).
    let err = agent::request_enrollment(fleet.url(1), &token).await.unwrap_err();
    assert_eq!(code(&err), Some("token_used"), "{err}");
    assert!(err.to_string().contains("single-use") && err.to_string().contains(used.node_id()), "{err}");

    // Expired.
    let short = fleet.token("", None, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let err = agent::request_enrollment(fleet.url(0), &short).await.unwrap_err();
    assert_eq!(code(&err), Some("token_expired"), "{err}");

    // Forged: the right fleet, an id and secret nobody issued.
    let fp = fleet.fleet_info().await.ca_fingerprint.parse::<Fingerprint>().unwrap();
    let forged = Token::generate(TokenKind::Enrollment, fp).to_string();
    let err = agent::request_enrollment(fleet.url(0), &forged).await.unwrap_err();
    assert_eq!(code(&err), Some("token_unknown"), "{err}");

    // Tampered: a real id with a wrong secret; the real token still works afterwards.
    let real = fleet.token("", None, 600).await;
    let (head, _) = real.rsplit_once('.').unwrap();
    let tampered = format!("{head}.{}", "0".repeat(64));
    let err = agent::request_enrollment(fleet.url(0), &tampered).await.unwrap_err();
    assert_eq!(code(&err), Some("token_unknown"), "{err}");
    agent::request_enrollment(fleet.url(1), &real).await.unwrap();

    // Wrong fleet: the device refuses the server before sending anything...
    let other = Token::generate(TokenKind::Enrollment, Fingerprint(sha256(b"another fleet"))).to_string();
    let err = agent::request_enrollment(fleet.url(0), &other).await.unwrap_err();
    assert!(err.to_string().contains("nothing was sent") && err.to_string().contains(&fp.to_string()), "{err}");
    // ...and the server refuses a token of another fleet sent to it anyway.
    let endpoint = Endpoint::new(fleet.url(0), tls::pinned_config(fp).unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default().serialize_request(&key).unwrap().pem().unwrap();
    let sent = endpoint
        .send::<_, EnrollResponse>(
            Method::POST,
            paths::ENROLL,
            None,
            &EnrollRequest { token: other, csr_pem: csr.clone() },
        )
        .await
        .unwrap_err();
    assert_eq!(sent.code(), Some("token_wrong_fleet"), "{sent}");

    // Malformed token text: refused on the device.
    let err = agent::request_enrollment(fleet.url(0), "tsc1.nonsense").await.unwrap_err();
    assert!(matches!(err, AgentError::Token(_)), "{err}");

    // A malformed CSR and a CSR for an enrolled key consume nothing: the token works after.
    let token = fleet.token("", None, 600).await;
    let garbage = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
    let sent = endpoint
        .send::<_, EnrollResponse>(
            Method::POST,
            paths::ENROLL,
            None,
            &EnrollRequest { token: token.clone(), csr_pem: garbage.into() },
        )
        .await
        .unwrap_err();
    assert_eq!(sent.code(), Some("csr_invalid"), "{sent}");
    let enrolled_key = rcgen::KeyPair::from_pem(&used.client().credentials().key_pem).unwrap();
    let again = rcgen::CertificateParams::default().serialize_request(&enrolled_key).unwrap().pem().unwrap();
    let sent = endpoint
        .send::<_, EnrollResponse>(
            Method::POST,
            paths::ENROLL,
            None,
            &EnrollRequest { token: token.clone(), csr_pem: again },
        )
        .await
        .unwrap_err();
    assert_eq!(sent.code(), Some("key_enrolled"), "{sent}");
    assert!(sent.to_string().contains(used.node_id()), "{sent}");
    assert_eq!(devices(fleet).await.len(), count + 1, "only the tampered-then-real enrollment added a device");
    let answer: EnrollResponse =
        endpoint.send(Method::POST, paths::ENROLL, None, &EnrollRequest { token, csr_pem: csr }).await.unwrap();
    assert_eq!(answer.issued.node_id, agent::node_id_of(&key));

    // A data directory that holds an enrollment is not enrolled over.
    let token = fleet.token("", None, 600).await;
    let err = agent::enroll(fleet.url(0), &token, &fleet.device_dir("m0")).await.unwrap_err();
    assert!(matches!(err, AgentError::AlreadyEnrolled { .. }), "{err}");
    // Every enrollment is in the audit log, with the token that allowed it.
    let enrolls: Vec<_> = audit(fleet).await.into_iter().filter(|e| e.action == "device.enroll").collect();
    assert_eq!(enrolls.len(), count + 2);
    assert!(enrolls.iter().all(|e| e.actor.starts_with("enrollment:")));
}

/// A revoked device is in every node's revocation list within the bound, and the control plane
/// refuses it from then on.
pub async fn revocation(fleet: &TestFleet) {
    let victim = fleet.enroll(0, "victim", "site=atl").await;
    let witness = fleet.enroll(1, "witness", "site=atl").await;
    let since = witness.applied().generation;
    let client = witness.client().clone();
    let watch =
        tokio::spawn(async move { (client.watch(since, Duration::from_secs(20)).await.unwrap(), Instant::now()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    let (ok, _, err) = fleet.cli(&["device", "revoke", victim.node_id(), "--reason", "stolen"]).await;
    assert!(ok, "{err}");
    let (state, at) = watch.await.unwrap();
    let state = state.unwrap();
    assert!(at - start < PROPAGATION_BOUND, "took {:?}", at - start);
    assert!(state.revoked.contains(&victim.node_id().to_string()));
    assert!(!state.revoked.contains(&witness.node_id().to_string()));

    for err in [
        victim.client().watch(0, Duration::from_millis(100)).await.unwrap_err(),
        victim.client().report(&report_of(victim.applied())).await.unwrap_err(),
        victim.client().clone().renew().await.map(|_| ()).unwrap_err(),
    ] {
        assert!(err.is_revoked(), "{err}");
    }
    let listed = devices(fleet).await;
    assert!(listed.iter().find(|d| d.node_id == victim.node_id()).unwrap().revoked_at_ms.is_some());
    let entry = audit(fleet).await.into_iter().find(|e| e.action == "device.revoke").unwrap();
    assert_eq!(entry.target, victim.node_id());
    assert!(entry.actor.contains("initial-admin"));
    assert_eq!(entry.after.unwrap()["reason"], "stolen");
    // Revoking twice says so.
    let (ok, _, err) = fleet.cli(&["device", "revoke", victim.node_id()]).await;
    assert!(!ok && err.contains("revoked"), "{err}");
}

/// Renewal keeps the key and the node id, replaces the certificate on disk, and is audited.
pub async fn renewal(fleet: &TestFleet) {
    let mut agent = fleet.enroll(1, "renew", "").await;
    let before = agent.client().credentials().cert_pem.clone();
    let now = std::time::SystemTime::now();
    assert!(!agent.client().renewal_due(now));
    assert!(agent.client().renewal_due(now + Duration::from_secs(21 * 86_400)));
    let issued = agent.renew().await.unwrap();
    assert_eq!(issued.node_id, agent.node_id());
    assert_ne!(issued.certificate_pem, before);
    let reopened = Agent::open(&fleet.device_dir("renew")).unwrap();
    assert_eq!(reopened.client().credentials().cert_pem, issued.certificate_pem);
    // The new certificate authenticates.
    reopened.client().report(&report_of(reopened.applied())).await.unwrap();
    let entry = audit(fleet).await.into_iter().find(|e| e.action == "device.renew").unwrap();
    assert_eq!(entry.actor, format!("device:{}", agent.node_id()));
    assert_ne!(entry.before, entry.after);
}

/// Invalid changes are refused whole with clear errors; nothing is written, the generation and
/// the audit log stay as they were.
pub async fn bad_input(fleet: &TestFleet) {
    fleet.enroll(0, "bad-input", "site=atl").await;
    put_class(fleet, ClassSpec::new("pmu", "pmu.")).await.unwrap();
    let (gen_before, audit_before, classes_before) =
        (fleet.fleet_info().await.generation, audit(fleet).await.len(), classes(fleet).await);

    // A class with another's prefix; a batch where one class is bad; an identity change.
    let err = put_class(fleet, ClassSpec::new("pmu2", "pmu.")).await.unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("class_conflict"), "{err}");
    assert!(err.to_string().contains("\"pmu\""), "{err}");
    let mut bad = ClassSpec::new("bad", "bad.");
    bad.w = 5;
    let batch = PutClasses { classes: vec![ClassSpec::new("fine", "fine."), bad] };
    let err = fleet.admin.send::<_, Changed>(Method::PUT, paths::CLASSES, &batch).await.unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("class_invalid"), "{err}");
    let dup = PutClasses { classes: vec![ClassSpec::new("x", "x."), ClassSpec::new("x", "y.")] };
    let err = fleet.admin.send::<_, Changed>(Method::PUT, paths::CLASSES, &dup).await.unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");
    let mut requantized = ClassSpec::new("pmu", "pmu.");
    requantized.quantum = Duration::from_secs(60);
    let err = put_class(fleet, requantized).await.unwrap_err();
    assert!(err.to_string().contains("quantum cannot change"), "{err}");
    // Through the CLI: a class without its prefix, and a conflicting one.
    let (ok, _, err) = fleet.cli(&["class", "set", "newclass"]).await;
    assert!(!ok && err.contains("--prefix"), "{err}");
    let (ok, _, err) = fleet.cli(&["class", "set", "pmu3", "--prefix", "pmu."]).await;
    assert!(!ok && err.contains("conflicts with class \"pmu\""), "{err}");
    // Quotas and export priorities: checked, kept, listed.
    let (ok, _, err) = fleet.cli(&["class", "set", "bulk", "--prefix", "bulk.", "--on-full", "evict_oldest"]).await;
    assert!(!ok && err.contains("needs a quota"), "{err}");
    let (ok, _, err) = fleet.cli(&["class", "set", "bulk", "--prefix", "bulk.", "--export-priority", "3"]).await;
    assert!(!ok && err.contains("archived classes only"), "{err}");

    // A selector that matches nothing (unless asked for), invalid settings.
    let nobody = PutNodeConfig {
        selector: Selector { labels: parse_labels("site=nowhere").unwrap(), geohash: None },
        priority: 0,
        settings: NodeSettings { bootstrap: Some(vec!["10.0.0.1:7400".into()]), ..Default::default() },
        allow_empty: false,
    };
    let path = format!("{}/nowhere", paths::NODE_CONFIGS);
    let err = fleet.admin.send::<_, Changed>(Method::PUT, &path, &nobody).await.unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("selector_matches_nothing"), "{err}");
    let (ok, _, err) = fleet.cli(&["node-config", "set", "x", "--select", "site=atl", "--bootstrap", "no-port"]).await;
    assert!(!ok && err.contains("host:port"), "{err}");
    let (ok, _, err) = fleet.cli(&["node-config", "set", "x", "--limit", "max_message_bytes=5"]).await;
    assert!(!ok && err.contains("unknown limit"), "{err}");
    let (ok, _, err) = fleet.cli(&["node-config", "set", "x", "--geohash", "dna"]).await;
    assert!(!ok && err.contains("geohash"), "{err}");

    // Roles: unknown role; a viewer cannot change anything; a bad token is unauthorized.
    let req = CreateApiToken { name: "eve".into(), role: "superuser".into(), expires_in_s: None };
    let err = fleet.admin.send::<_, TokenCreated>(Method::POST, paths::API_TOKENS, &req).await.unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("unknown_role"), "{err}");
    assert!(err.to_string().contains("admin, operator and viewer"), "{err}");

    // Oversize body.
    let huge = vec![b' '; 100 * 1024];
    let endpoint = Endpoint::new(
        fleet.url(0),
        tls::pinned_config(fleet.fleet_info().await.ca_fingerprint.parse().unwrap()).unwrap(),
    )
    .unwrap();
    let answer = endpoint
        .call(Method::PUT, paths::CLASSES, Some(&fleet.admin_token), Some(huge), Duration::from_secs(10))
        .await
        .unwrap();
    let err = answer.check().unwrap_err();
    assert_eq!(err.code(), Some("too_large"), "{err}");
    // Malformed JSON.
    let answer = endpoint
        .call(
            Method::PUT,
            paths::CLASSES,
            Some(&fleet.admin_token),
            Some(b"{\"classes\": [{\"nam\": 1}]}".to_vec()),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(answer.check().unwrap_err().code(), Some("bad_request"));

    assert_eq!(fleet.fleet_info().await.generation, gen_before, "a refused change made a generation");
    assert_eq!(audit(fleet).await.len(), audit_before, "a refused change was audited as done");
    assert_eq!(classes(fleet).await, classes_before);

    // A good quota after the refused ones: kept and listed.
    let (ok, _, err) =
        fleet.cli(&["class", "set", "bulk", "--prefix", "bulk.", "--quota", "2GiB", "--on-full", "evict_oldest"]).await;
    assert!(ok, "{err}");
    let bulk = classes(fleet).await.into_iter().find(|c| c.name == "bulk").expect("bulk");
    assert_eq!((bulk.quota.map(|q| q.0), bulk.on_full.to_string()), (Some(2 << 30), "evict_oldest".into()));
    let (ok, out, err) = fleet.cli(&["class", "list"]).await;
    assert!(ok && out.contains("2048MiB, then evict_oldest"), "{out}{err}");
    let (ok, _, err) = fleet.cli(&["class", "rm", "bulk"]).await;
    assert!(ok, "{err}");

    // Roles after the checks above (creating a token is a change of its own).
    let viewer: TokenCreated = fleet
        .admin
        .send(
            Method::POST,
            paths::API_TOKENS,
            &CreateApiToken { name: "grafana".into(), role: "viewer".into(), expires_in_s: None },
        )
        .await
        .unwrap();
    // Operator tokens expire by default: 90 days.
    let left_ms =
        viewer.expires_at_ms.expect("an API token expires by default") - timeshard_clock::now_ns() / 1_000_000;
    assert!((left_ms - 90 * 86_400_000).abs() < 60_000, "{left_ms} ms left");
    let as_viewer = fleet.client(1, &viewer.token);
    as_viewer.get::<Vec<ClassSpec>>(paths::CLASSES).await.unwrap();
    let err = as_viewer
        .send::<_, Changed>(Method::PUT, paths::CLASSES, &PutClasses { classes: vec![ClassSpec::new("v", "v.")] })
        .await
        .unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("forbidden"), "{err}");
    let (ok, _, err) = fleet.cli_as(&viewer.token, &["token", "create"]).await;
    assert!(!ok && err.contains("operator role"), "{err}");
    let (ok, _, err) = fleet.cli_as("tsa1.nope", &["devices"]).await;
    assert!(!ok && err.contains("TIMESHARD_CONTROL_TOKEN"), "{err}");
    let fp: Fingerprint = fleet.fleet_info().await.ca_fingerprint.parse().unwrap();
    let forged = Token::generate(TokenKind::Api, fp).to_string();
    let err = fleet.client(0, &forged).get::<Vec<ClassSpec>>(paths::CLASSES).await.unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("token_unknown"), "{err}");
}

/// Node configurations select devices by labels and geohash; the audit log has before and
/// after of every change.
pub async fn node_configs_and_audit(fleet: &TestFleet) {
    let atl = fleet.enroll(0, "nc-atl", "site=atl").await;
    let sfo = fleet.enroll(1, "nc-sfo", "site=sfo").await;
    let mut settings = NodeSettings { bootstrap: Some(vec!["10.0.0.5:7400".into()]), ..Default::default() };
    settings.limits.set("max_connections", 64).unwrap();
    let req = PutNodeConfig {
        selector: Selector { labels: parse_labels("site=atl").unwrap(), geohash: None },
        priority: 0,
        settings,
        allow_empty: false,
    };
    let changed: Changed = fleet.admin.send(Method::PUT, &format!("{}/atl", paths::NODE_CONFIGS), &req).await.unwrap();
    assert_eq!(changed.matched, Some(1));
    let (ok, _, err) = fleet
        .cli(&[
            "node-config",
            "set",
            "georgia",
            "--geohash",
            "dn5",
            "--priority",
            "10",
            "--limit",
            "max_connections=32",
        ])
        .await;
    assert!(ok, "{err}");
    assert!(err.contains("selects 2 device"), "{err}");
    let target = changed.generation + 1;
    let a = watch_to(atl.client(), atl.applied().generation, target).await;
    assert_eq!(a.bootstrap, vec!["10.0.0.5:7400".to_string()]);
    assert_eq!(a.limits.max_connections, Some(32), "the higher priority wins");
    let s = watch_to(sfo.client(), sfo.applied().generation, target).await;
    assert!(s.bootstrap.is_empty());
    assert_eq!(s.limits.max_connections, Some(32), "every test device is in Atlanta");
    assert_eq!(a.digest, s.digest, "the digest covers what all nodes share");

    let mut pmu = ClassSpec::new("audited", "audited.");
    put_class(fleet, pmu.clone()).await.unwrap();
    pmu.retention = Some(Duration::from_secs(3600));
    put_class(fleet, pmu.clone()).await.unwrap();
    let entry = audit(fleet).await.into_iter().find(|e| e.action == "class.set" && e.target == "audited").unwrap();
    assert_eq!(entry.before.unwrap()["retention"], serde_json::Value::Null);
    assert_eq!(entry.after.unwrap()["retention"], "1h");
    assert!(entry.actor.contains("initial-admin") && entry.at_ms > 0);
    let (ok, out, _) = fleet.cli(&["audit", "--limit", "3"]).await;
    assert!(ok && out.contains("class.set") && out.contains("audited"), "{out}");
    let (ok, _, err) = fleet.cli(&["class", "rm", "audited"]).await;
    assert!(ok, "{err}");
    let entry = audit(fleet).await.into_iter().next().unwrap();
    assert_eq!((entry.action.as_str(), entry.after.is_none()), ("class.rm", true));
}

/// HTTP tokens: an operator issues one for a selector; the selected devices' desired state
/// carries its id and the hash of its secret (never the secret), the others' does not; revoking
/// it is a new generation without it; a viewer may list but not create; bad input is refused.
pub async fn http_tokens(fleet: &TestFleet) {
    let atl = fleet.enroll(0, "ht-atl", "site=atl").await;
    let sfo = fleet.enroll(1, "ht-sfo", "site=sfo").await;
    let before = fleet.fleet_info().await.generation;
    let req = CreateHttpToken {
        name: "grafana-atl".into(),
        selector: Selector { labels: parse_labels("site=atl").unwrap(), geohash: None },
        expires_in_s: Some(3600),
    };
    let created: TokenCreated = fleet.admin.send(Method::POST, paths::HTTP_TOKENS, &req).await.unwrap();
    let token = Token::parse(&created.token, TokenKind::Http).unwrap();
    let a = watch_to(atl.client(), atl.applied().generation, before + 1).await;
    assert_eq!(a.http_tokens.len(), 1);
    assert_eq!((a.http_tokens[0].id.as_str(), a.http_tokens[0].name.as_str()), (token.id.as_str(), "grafana-atl"));
    assert_eq!(a.http_tokens[0].secret_hash, token.secret_hash());
    assert!(a.http_tokens[0].expires_at_ms.is_some_and(|at| at == created.expires_at_ms.unwrap()));
    assert!(!serde_json::to_string(&a).unwrap().contains(&created.token), "no secret in the desired state");
    let s = watch_to(sfo.client(), sfo.applied().generation, before + 1).await;
    assert!(s.http_tokens.is_empty(), "not selected");

    // The CLI: a fleet-wide token, listed without secrets.
    let (ok, out, err) = fleet.cli(&["http-token", "create", "--name", "telegraf"]).await;
    assert!(ok && out.trim().starts_with("tsh1."), "{out} {err}");
    let listed: Vec<HttpTokenInfo> = fleet.admin.get(paths::HTTP_TOKENS).await.unwrap();
    assert_eq!(listed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["grafana-atl", "telegraf"]);
    let (ok, table, _) = fleet.cli(&["http-token", "list"]).await;
    assert!(
        ok && table.contains("site=atl") && table.contains("every device") && !table.contains(out.trim()),
        "{table}"
    );
    let s = watch_to(sfo.client(), sfo.applied().generation, before + 2).await;
    assert_eq!(s.http_tokens.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["telegraf"]);

    // Revoked: the next generation no longer carries it; twice is an error.
    let changed: Changed =
        fleet.admin.send(Method::DELETE, &format!("{}/{}", paths::HTTP_TOKENS, token.id), &()).await.unwrap();
    let a = watch_to(atl.client(), a.generation, changed.generation).await;
    assert_eq!(a.http_tokens.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["telegraf"]);
    let (ok, _, err) = fleet.cli(&["http-token", "revoke", &token.id]).await;
    assert!(!ok && err.contains("unrevoked HTTP token"), "{err}");
    let entry = audit(fleet).await.into_iter().find(|e| e.action == "http-token.revoke").unwrap();
    assert_eq!(entry.target, token.id);

    // Bad input and roles.
    for (name, selector) in
        [("", Selector::default()), ("x", Selector { geohash: Some("dna".into()), ..Default::default() })]
    {
        let bad = CreateHttpToken { name: name.into(), selector, expires_in_s: None };
        let err = fleet.admin.send::<_, TokenCreated>(Method::POST, paths::HTTP_TOKENS, &bad).await.unwrap_err();
        assert_eq!(client_code(&err).as_deref(), Some("bad_request"), "{err}");
    }
    let viewer: TokenCreated = fleet
        .admin
        .send(
            Method::POST,
            paths::API_TOKENS,
            &CreateApiToken { name: "ht-viewer".into(), role: "viewer".into(), expires_in_s: None },
        )
        .await
        .unwrap();
    let (ok, _, err) = fleet.cli_as(&viewer.token, &["http-token", "create", "--name", "nope"]).await;
    assert!(!ok && err.contains("operator role"), "{err}");
    let (ok, out, err) = fleet.cli_as(&viewer.token, &["http-token", "list"]).await;
    assert!(ok && out.contains("telegraf"), "{err}");
}

/// A restart of the service (every instance) keeps the CA, tokens, devices and desired state.
pub async fn restart_keeps_state(fleet: &mut TestFleet) {
    fleet.enroll(0, "restart", "site=atl").await;
    let used = fleet.token("", None, 600).await;
    agent::request_enrollment(fleet.url(0), &used).await.unwrap();
    put_class(fleet, ClassSpec::new("kept", "kept.")).await.unwrap();
    let before = fleet.fleet_info().await;
    fleet.restart().await;
    let after = fleet.fleet_info().await;
    assert_eq!(after.ca_fingerprint, before.ca_fingerprint);
    assert_eq!((after.generation, &after.digest), (before.generation, &before.digest));
    assert!(classes(fleet).await.iter().any(|c| c.name == "kept"));
    let err = agent::request_enrollment(fleet.url(1), &used).await.unwrap_err();
    assert_eq!(code(&err), Some("token_used"), "{err}");
    // The device reaches the restarted service at its new address with its stored identity.
    let mut creds = Agent::open(&fleet.device_dir("restart")).unwrap().client().credentials().clone();
    creds.url = fleet.url(1).to_string();
    let client = timeshard_control_api::NodeClient::new(creds).unwrap();
    let state = client.watch(0, Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(state.generation, after.generation);
    assert!(state.classes.iter().any(|c| c.name == "kept"));
}

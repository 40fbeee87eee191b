//! What changes while a node runs, in process with a development PKI: revocations refuse a
//! peer in both directions and close what is open, a new configuration is applied whole or not
//! at all, and a renewed certificate is presented to new handshakes only.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use timeshard_node::RunningNode;
use timeshard_node::config::{ClassConfig, DhtConfig, NodeConfig, StoreEngine, TlsConfig};
use timeshard_node::control::config_digest_u64;
use timeshard_node::net::NetError;
use timeshard_node::reconfigure::ReconfigureError;
use timeshard_proto::wire::Request;
use timeshard_proto::{Id, Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_sdk::tls::{Identity, TlsFiles};

fn config(dir: &Path, pki: &Path, name: &str, bootstrap: Vec<String>) -> NodeConfig {
    let files = TlsFiles::in_dir(pki, name);
    let mut config = NodeConfig { listen: "127.0.0.1:0".parse().unwrap(), bootstrap, ..NodeConfig::default() };
    config.resolve_paths(&dir.join(name));
    config.tls = TlsConfig { ca: files.ca, cert: files.cert, key: files.key };
    config.dht = DhtConfig {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        ..DhtConfig::default()
    };
    config.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    // Several nodes share this process: each takes a free HTTP port, not InfluxDB's 8086.
    config.http.listen = "127.0.0.1:0".parse().unwrap();
    config
}

async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn id_of(pki: &Path, name: &str) -> Id {
    Identity::load(&TlsFiles::in_dir(pki, name)).unwrap().id().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_peers_are_refused_both_ways_and_open_connections_close() {
    let dir = tempfile::tempdir().unwrap();
    let pki = timeshard_node::pki::dev_pki(&dir.path().join("pki"), 2).unwrap();
    let mut a_config = config(dir.path(), &pki, "node-0", vec![]);
    a_config.store.engine = StoreEngine::Memory;
    let a = RunningNode::start(a_config).await.unwrap();
    let mut b_config = config(dir.path(), &pki, "node-1", vec![a.addr().to_string()]);
    b_config.store.engine = StoreEngine::Memory;
    let b = RunningNode::start(b_config).await.unwrap();
    let b_id = id_of(&pki, "node-1");
    eventually("a knows b", async || a.node().dht().peer_count() == 1).await;
    // B's key used as a client, before and after.
    let as_b = Client::connect(a.addr(), &TlsFiles::in_dir(&pki, "node-1")).await.unwrap();
    as_b.status().await.unwrap();

    let revoked = vec![b_id.to_hex()];
    let prepared = a.node().prepare((*a.node().config()).clone(), &revoked, 5).unwrap();
    let changed = a.node().reconfigure(prepared);
    assert!(changed.iter().any(|c| c.contains("1 node(s) revoked (1 were peers)")), "{changed:?}");
    assert_eq!(a.node().dht().peer_count(), 0);
    assert_eq!(a.node().config_generation(), 5);
    let revoked_set: HashSet<Id> = [b_id].into();
    assert_eq!(a.node().config_digest(), config_digest_u64(&a.node().config().classes, &revoked_set));

    // A refuses to call B, B's calls to A fail, and B's open client connection is closed.
    let err = a.node().net().call(b.addr(), None, &Request::Ping).await.unwrap_err();
    assert!(matches!(err, NetError::Revoked { id, .. } if id == b_id), "{err}");
    assert!(b.node().net().call(a.addr(), None, &Request::Ping).await.is_err());
    eventually("b's open connection closes", async || as_b.status().await.is_err()).await;
    let again = Client::connect(a.addr(), &TlsFiles::in_dir(&pki, "node-1")).await;
    assert!(again.is_err() || again.unwrap().status().await.is_err());
    // Another client is served as before.
    let client = Client::connect(a.addr(), &TlsFiles::in_dir(&pki, "client")).await.unwrap();
    assert_eq!(client.status().await.unwrap().config_generation, 5);

    // Lifted: B is welcome again.
    let prepared = a.node().prepare((*a.node().config()).clone(), &[], 6).unwrap();
    a.node().reconfigure(prepared);
    b.node().net().call(a.addr(), None, &Request::Ping).await.unwrap();
    a.node().net().call(b.addr(), Some(b_id), &Request::Ping).await.unwrap();
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_configuration_is_applied_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let pki = timeshard_node::pki::dev_pki(&dir.path().join("pki"), 1).unwrap();
    let mut base = config(dir.path(), &pki, "node-0", vec![]);
    base.classes.push(ClassConfig {
        name: "pmu".into(),
        metric_prefix: "pmu.".into(),
        rf: 1,
        w: 1,
        r: 1,
        ..Default::default()
    });
    let node = RunningNode::start(base.clone()).await.unwrap();
    let client = Client::connect(node.addr(), &TlsFiles::in_dir(&pki, "client")).await.unwrap();
    let before = client.status().await.unwrap();
    assert_eq!(before.config_generation, 0);
    assert_eq!(before.config_digest, config_digest_u64(&base.classes, &HashSet::new()));

    // Points two days old, kept forever for now.
    let series: SeriesKey = "pmu.f{bus=1}".parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let old = now - 2 * 86_400 * 1_000_000_000;
    let points: Vec<Point> = (0..100).map(|i| Point::new(old + i * 1_000_000, i as f64)).collect();
    client.write(&series, &points).await.unwrap();
    let all = TimeRange::new(old - 1, now).unwrap();
    assert_eq!(client.read(&series, all).await.unwrap().len(), 100);

    // Refused whole: a fixed setting, a class that moves, a malformed revocation.
    let mut moved = base.clone();
    moved.listen = "127.0.0.1:1".parse().unwrap();
    moved.limits.read_parallelism = 2;
    let err = node.node().prepare(moved, &[], 3).unwrap_err();
    assert!(matches!(err, ReconfigureError::Fixed { setting: "listen" }), "{err}");
    let mut requantized = base.clone();
    requantized.classes[1].quantum = Duration::from_secs(60);
    let err = node.node().prepare(requantized, &[], 3).unwrap_err();
    assert!(err.to_string().contains("quantum cannot change"), "{err}");
    assert!(node.node().prepare(base.clone(), &["nope".into()], 3).is_err());
    assert_eq!(node.node().coordinator().limits().read_parallelism, base.limits.read_parallelism);
    assert_eq!(client.status().await.unwrap().config_generation, 0);

    // Applied: one day of retention, fewer requests at once, smaller read parallelism.
    let mut next = base.clone();
    next.classes[1].retention = Some(Duration::from_secs(86_400));
    next.limits.read_parallelism = 3;
    next.limits.max_concurrent_requests = 2;
    let prepared = node.node().prepare(next.clone(), &[], 3).unwrap();
    let changed = node.node().reconfigure(prepared);
    assert_eq!(changed, ["classes (2)", "retention", "limits"]);
    assert_eq!(node.node().coordinator().classes().of(&series).name, "pmu");
    assert_eq!(node.node().coordinator().limits().read_parallelism, 3);
    // (A request that just answered may still hold its permit for a moment.)
    eventually("two request slots", async || node.node().request_slots().available_permits() == 2).await;
    let status = client.status().await.unwrap();
    assert_eq!(status.config_generation, 3);
    assert_eq!(status.config_digest, config_digest_u64(&next.classes, &HashSet::new()));
    // The store's retention follows: the old points expire without a restart.
    eventually("old points expire", async || client.read(&series, all).await.unwrap().is_empty()).await;
    let fresh = [Point::new(now - 1_000_000_000, 1.0)];
    client.write(&series, &fresh).await.unwrap();
    assert_eq!(client.read(&series, all).await.unwrap(), fresh);
    client.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_bootstrap_peers_are_joined_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pki = timeshard_node::pki::dev_pki(&dir.path().join("pki"), 2).unwrap();
    let mut a_config = config(dir.path(), &pki, "node-0", vec![]);
    a_config.store.engine = StoreEngine::Memory;
    let a = RunningNode::start(a_config).await.unwrap();
    let mut b_config = config(dir.path(), &pki, "node-1", vec![]);
    b_config.store.engine = StoreEngine::Memory;
    let b = RunningNode::start(b_config.clone()).await.unwrap();
    assert_eq!(b.node().dht().peer_count(), 0);
    b_config.bootstrap = vec![a.addr().to_string()];
    let prepared = b.node().prepare(b_config, &[], 2).unwrap();
    let changed = b.node().reconfigure(prepared);
    assert_eq!(changed, [format!("bootstrap peers ({})", a.addr())]);
    eventually("b joins through its new bootstrap peer", async || {
        b.node().dht().peer_count() == 1 && a.node().dht().peer_count() == 1
    })
    .await;
    b.shutdown().await;
    a.shutdown().await;
}

/// Signs a new certificate for the key in `name.key` with the CA in `pki` (what renewal gets
/// from the control plane: same key, same id, new certificate).
fn reissue(pki: &Path, name: &str) {
    use rcgen::{CertificateParams, Issuer, KeyPair};
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.join("ca.pem")).unwrap(), ca_key).unwrap();
    let key = KeyPair::from_pem(&std::fs::read_to_string(pki.join(format!("{name}.key"))).unwrap()).unwrap();
    let mut params = CertificateParams::new(vec![timeshard_sdk::tls::NODE_NAME.to_string()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} renewed"));
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(pki.join(format!("{name}.pem")), cert.pem()).unwrap();
}

fn presented(conn: &quinn::Connection) -> Vec<u8> {
    let certs = conn.peer_identity().unwrap().downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>().unwrap();
    certs[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_presented_to_new_handshakes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = timeshard_node::pki::dev_pki(&dir.path().join("pki"), 2).unwrap();
    let mut a_config = config(dir.path(), &pki, "node-0", vec![]);
    a_config.store.engine = StoreEngine::Memory;
    let a = RunningNode::start(a_config.clone()).await.unwrap();
    let mut b_config = config(dir.path(), &pki, "node-1", vec![]);
    b_config.store.engine = StoreEngine::Memory;
    let b = RunningNode::start(b_config).await.unwrap();
    let old_conn = b.node().net().connection(a.addr()).await.unwrap();
    let old_cert = presented(&old_conn);

    reissue(&pki, "node-0");
    let identity = Identity::load(&a_config.tls_files()).unwrap();
    assert_eq!(identity.id().unwrap(), a.node().dht().me().id, "same key, same id");
    a.node().net().set_identity(&a_config, &identity).unwrap();
    // The open connection keeps working; a new one sees the new certificate.
    b.node().net().call(a.addr(), None, &Request::Ping).await.unwrap();
    let client = Client::connect(a.addr(), &TlsFiles::in_dir(&pki, "client")).await.unwrap();
    client.status().await.unwrap();
    let fresh = quinn_connect(&pki, a.addr()).await;
    assert_ne!(presented(&fresh), old_cert);
    assert_eq!(presented(&fresh), identity.chain[0].to_vec());
    fresh.close(0u32.into(), b"done");
    a.shutdown().await;
    b.shutdown().await;
}

/// A bare QUIC connection to `addr` with the client certificate.
async fn quinn_connect(pki: &Path, addr: std::net::SocketAddr) -> quinn::Connection {
    let identity = Identity::load(&TlsFiles::in_dir(pki, "client")).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(timeshard_sdk::tls::client_config(&identity).unwrap());
    endpoint.connect(addr, timeshard_sdk::tls::NODE_NAME).unwrap().await.unwrap()
}

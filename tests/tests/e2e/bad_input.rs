//! Bad input, each case on its own: a typed error with a clear message, and the node keeps
//! serving. One in-process node with RF 1 serves all cases.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use timeshard_node::config::{ClassConfig, NodeConfig, TlsConfig};
use timeshard_node::{RunningNode, pki};
use timeshard_proto::wire::{self, ErrorCode, Request, Response, WriteSeries};
use timeshard_proto::{Point, TimeRange};
use timeshard_sdk::tls::{self, Identity, NODE_NAME, TlsFiles};
use timeshard_sdk::transport::{self, CallError};
use timeshard_sdk::{Client, ClientOptions, Error};

const MAX_BATCH: u32 = 1_000;

struct Fixture {
    node: RunningNode,
    pki: TlsFiles,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    pki::dev_pki(&pki_dir, 1).unwrap();
    let node_tls = TlsFiles::in_dir(&pki_dir, "node-0");
    let mut cfg = NodeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("data"),
        tls: TlsConfig { ca: node_tls.ca, cert: node_tls.cert, key: node_tls.key },
        classes: vec![ClassConfig { name: "single".into(), rf: 1, w: 1, r: 1, ..Default::default() }],
        ..NodeConfig::default()
    };
    cfg.limits.max_batch_points = MAX_BATCH;
    cfg.http.listen = "127.0.0.1:0".parse().unwrap();
    cfg.dht.request_timeout = Duration::from_secs(2);
    // An in-process node counts this whole test process as its resident memory, the other
    // scenarios running beside it included (one e2e binary): a budget they cannot exceed, or
    // its writes are refused as over budget whenever a heavy neighbour runs.
    cfg.memory.budget = timeshard_node::config::ByteSize(8 << 30);
    let node = RunningNode::start(cfg).await.unwrap();
    Fixture { node, pki: TlsFiles::in_dir(&pki_dir, "client"), _dir: dir }
}

impl Fixture {
    fn addr(&self) -> SocketAddr {
        self.node.addr()
    }

    async fn client(&self) -> Client {
        let options = ClientOptions { max_batch_points: 10 * MAX_BATCH as usize, ..ClientOptions::default() };
        Client::connect_with(self.addr(), &Identity::load(&self.pki).unwrap(), options).await.unwrap()
    }

    /// A raw QUIC connection with the client certificate, for sending hand-made bytes.
    async fn raw(&self) -> quinn::Connection {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(tls::client_config(&Identity::load(&self.pki).unwrap()).unwrap());
        endpoint.connect(self.addr(), NODE_NAME).unwrap().await.unwrap()
    }

    /// The node still answers a valid write and read.
    async fn assert_serving(&self) {
        let client = self.client().await;
        let s = "health.check".parse().unwrap();
        let p = Point::new(1_700_000_000_000_000_000, 1.0);
        client.write(&s, &[p]).await.expect("the node still takes writes");
        let got = client.read(&s, TimeRange::new(p.ts, p.ts + 1).unwrap()).await.expect("the node still reads");
        assert_eq!(got, vec![p]);
    }
}

async fn send_raw(conn: &quinn::Connection, bytes: &[u8]) -> Response {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    let _ = send.finish();
    let body = transport::read_frame_bytes(&mut recv, 1 << 20).await.unwrap();
    wire::decode(&body).unwrap()
}

fn expect_error(resp: Response, code: ErrorCode) -> String {
    match resp {
        Response::Error(e) => {
            assert_eq!(e.code, code, "{}", e.message);
            e.message
        }
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

fn expect_code(result: Result<impl std::fmt::Debug, Error>, code: ErrorCode) -> String {
    match result {
        Err(e) => {
            assert_eq!(e.code(), Some(code), "{e}");
            e.to_string()
        }
        Ok(v) => panic!("expected {code:?}, got {v:?}"),
    }
}

#[tokio::test]
async fn malformed_message_is_refused() {
    let f = fixture().await;
    let conn = f.raw().await;
    let garbage = [0u8, 0, 0, 5, 0xff, 0xfe, 0xfd, 0xfc, 0xfb];
    let msg = expect_error(send_raw(&conn, &garbage).await, ErrorCode::Malformed);
    assert!(msg.contains("cannot decode"), "{msg}");
    // A truncated frame (header promises more than arrives) gets no answer, and the stream
    // ends; the connection and node stay up.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&[0, 0, 0, 50, 1, 2]).await.unwrap();
    let _ = send.finish();
    assert!(transport::read_frame_bytes(&mut recv, 1 << 20).await.is_err());
    assert!(matches!(
        transport::call(&conn, &Request::Ping, 1 << 20, Duration::from_secs(2)).await,
        Ok(Response::Pong { .. })
    ));
    f.assert_serving().await;
}

#[tokio::test]
async fn oversize_message_is_refused_before_reading_it() {
    let f = fixture().await;
    let conn = f.raw().await;
    let header = (512u32 * 1024 * 1024).to_be_bytes();
    let msg = expect_error(send_raw(&conn, &header).await, ErrorCode::TooLarge);
    assert!(msg.contains("exceeds the limit"), "{msg}");
    f.assert_serving().await;
}

#[tokio::test]
async fn batch_over_the_limit_is_refused_and_nothing_of_it_is_stored() {
    let f = fixture().await;
    let client = f.client().await;
    let s = "big.batch".parse().unwrap();
    let points: Vec<Point> =
        (0..MAX_BATCH as i64 + 1).map(|i| Point::new(1_700_000_000_000_000_000 + i, 0.5)).collect();
    let msg = expect_code(client.write(&s, &points).await, ErrorCode::BatchTooLarge);
    assert!(msg.contains("1001 points") && msg.contains("1000"), "{msg}");
    let range = TimeRange::new(points[0].ts, points[0].ts + 10_000).unwrap();
    expect_code(client.read(&s, range).await, ErrorCode::UnknownSeries);
    f.assert_serving().await;
}

#[tokio::test]
async fn inverted_and_empty_ranges_are_refused() {
    let f = fixture().await;
    let conn = f.raw().await;
    let read = |start, end| Request::Read { series: "m".into(), start, end, after: None, limit: 100 };
    let timeout = Duration::from_secs(2);
    for (req, word) in [(read(10, 5), "inverted"), (read(7, 7), "empty"), (read(-3, 5), "out of range")] {
        match transport::call(&conn, &req, 1 << 20, timeout).await {
            Err(CallError::Remote(e)) => {
                assert_eq!(e.code, ErrorCode::InvalidRange);
                assert!(e.message.contains(word), "{}", e.message);
            }
            other => panic!("expected InvalidRange, got {other:?}"),
        }
    }
    f.assert_serving().await;
}

#[tokio::test]
async fn timestamps_out_of_range_are_refused() {
    let f = fixture().await;
    let client = f.client().await;
    let s = "ts.check".parse().unwrap();
    for ts in [-1, i64::MAX, 7_258_118_400_000_000_000] {
        let msg = expect_code(client.write(&s, &[Point::new(ts, 1.0)]).await, ErrorCode::TimestampOutOfRange);
        assert!(msg.contains(&ts.to_string()) && msg.contains("check the unit"), "{msg}");
    }
    f.assert_serving().await;
}

#[tokio::test]
async fn unknown_and_malformed_series_are_refused() {
    let f = fixture().await;
    let client = f.client().await;
    let range = TimeRange::new(0, 1_000_000_000).unwrap();
    let msg = expect_code(client.read(&"never.written{x=1}".parse().unwrap(), range).await, ErrorCode::UnknownSeries);
    assert!(msg.contains("never.written{x=1}"), "{msg}");
    let conn = f.raw().await;
    let bad =
        Request::Write { batch: vec![WriteSeries { series: "bad key{".into(), points: vec![Point::new(1, 1.0)] }] };
    match transport::call(&conn, &bad, 1 << 20, Duration::from_secs(2)).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::InvalidSeries, "{}", e.message),
        other => panic!("expected InvalidSeries, got {other:?}"),
    }
    f.assert_serving().await;
}

#[tokio::test]
async fn clients_without_a_certificate_from_the_ca_are_refused() {
    let f = fixture().await;
    let identity = Identity::load(&f.pki).unwrap();

    // No client certificate at all.
    let crypto = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(identity.roots.clone())
        .with_no_client_auth();
    let mut crypto = crypto;
    crypto.alpn_protocols = vec![wire::ALPN.to_vec()];
    let config = quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(crypto).unwrap()));
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let outcome: Result<Response, String> = async {
        let conn = endpoint.connect_with(config, f.addr(), NODE_NAME).unwrap().await.map_err(|e| e.to_string())?;
        // With TLS 1.3 the server may reject the missing certificate just after the handshake:
        // the first request must fail then.
        transport::call(&conn, &Request::Ping, 1 << 20, Duration::from_secs(2)).await.map_err(|e| e.to_string())
    }
    .await;
    let err = outcome.expect_err("a client without a certificate was served");
    assert!(err.contains("certificate"), "{err}");

    // A certificate from another CA.
    let other = tempfile::tempdir().unwrap();
    pki::dev_pki(other.path(), 0).unwrap();
    let foreign = Identity::load(&TlsFiles::in_dir(other.path(), "client")).unwrap();
    let foreign = Identity { roots: identity.roots.clone(), ..foreign };
    let result = Client::connect_with(f.addr(), &foreign, ClientOptions::default()).await;
    let served = match result {
        Err(Error::Connect { .. }) => false,
        Err(e) => panic!("unexpected error {e}"),
        Ok(c) => c.status().await.is_ok(),
    };
    assert!(!served, "a client with a foreign CA's certificate was served");
    f.assert_serving().await;
}

#[tokio::test]
async fn client_certificates_may_not_act_as_peers() {
    let f = fixture().await;
    let conn = f.raw().await;
    let store = Request::FindNode { target: timeshard_proto::Id::ZERO };
    match transport::call(&conn, &store, 1 << 20, Duration::from_secs(2)).await {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(e.message.contains("client"), "{}", e.message);
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    // Nor through the envelope that carries a client's location, which takes client writes
    // and reads only; a location out of range is refused too.
    let atl = timeshard_proto::geo::GeoPoint { lat: 33.75, lon: -84.39 };
    let smuggled = Request::Located { at: atl, request: Box::new(store) };
    let far_north = Request::Located {
        at: timeshard_proto::geo::GeoPoint { lat: 91.0, lon: 0.0 },
        request: Box::new(Request::Status),
    };
    for (req, expect) in [(smuggled, "not find_node"), (far_north, "latitude")] {
        match transport::call(&conn, &req, 1 << 20, Duration::from_secs(2)).await {
            Err(CallError::Remote(e)) => {
                assert_eq!(e.code, ErrorCode::Malformed);
                assert!(e.message.contains(expect), "{}", e.message);
            }
            other => panic!("expected Malformed, got {other:?}"),
        }
    }
    f.assert_serving().await;
}

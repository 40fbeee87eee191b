//! Hand-made QUIC traffic for the hostile-input tests and `bench hostile`: a bare quinn endpoint
//! holding a certificate (no SDK client in between), frames sent as raw bytes, located envelopes
//! nested to any depth, and floods of connections with what became of each.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use timeshard_node::admission::CLOSE_TOO_MANY;
use timeshard_proto::geo::GeoPoint;
use timeshard_proto::wire::{self, Request, Response};
use timeshard_sdk::tls::{self, Identity, NODE_NAME, TlsFiles};
use timeshard_sdk::transport;

/// A client endpoint holding `tls`'s certificate, for hand-made bytes and many connections.
pub fn endpoint(tls: &TlsFiles) -> Result<quinn::Endpoint> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(tls::client_config(&Identity::load(tls)?)?);
    Ok(endpoint)
}

/// One connection of `endpoint` to the node at `addr`.
pub async fn connect(endpoint: &quinn::Endpoint, addr: SocketAddr) -> Result<quinn::Connection> {
    Ok(endpoint.connect(addr, NODE_NAME)?.await?)
}

/// Sends `bytes` on a new stream and reads the one answer.
pub async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> Result<Response> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(bytes).await?;
    let _ = send.finish();
    let body = transport::read_frame_bytes(&mut recv, 16 << 20).await?;
    Ok(wire::decode(&body)?)
}

/// A frame of `depth` located envelopes around a request for the newest point of `series`
/// (built by repeating one envelope's bytes: encoding it as a value would recurse as deep).
pub fn nested_located(depth: usize, series: &str) -> Vec<u8> {
    let at = GeoPoint::new(33.75, -84.39).expect("a valid location");
    let body_of = |r: &Request| wire::encode(r, u32::MAX).expect("a small request")[wire::HEADER_BYTES..].to_vec();
    let latest = Request::Latest { series: series.into(), before: i64::MAX / 2 };
    let one = body_of(&Request::Located { at, request: Box::new(latest.clone()) });
    let inner = body_of(&latest);
    let mut body = one[..one.len() - inner.len()].repeat(depth);
    body.extend_from_slice(&inner);
    [&(body.len() as u32).to_be_bytes()[..], &body].concat()
}

/// What became of one connection of a flood.
#[derive(Debug)]
pub enum Outcome {
    Open(quinn::Connection),
    /// Closed by the node's connection cap, with its reason.
    Refused(String),
    /// Refused before any crypto by the node's limit of handshakes per source address
    /// (`CONNECTION_REFUSED`).
    RateLimited,
    /// Anything else (a handshake that timed out under the load).
    Failed(String),
}

impl Outcome {
    pub fn of(connected: Result<quinn::Connection, quinn::ConnectionError>) -> Outcome {
        match connected {
            Ok(c) => Outcome::Open(c),
            Err(quinn::ConnectionError::ApplicationClosed(close))
                if close.error_code.into_inner() == u64::from(CLOSE_TOO_MANY) =>
            {
                Outcome::Refused(String::from_utf8_lossy(&close.reason).into_owned())
            }
            Err(quinn::ConnectionError::ConnectionClosed(close))
                if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
            {
                Outcome::RateLimited
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    fn still_open(&self) -> bool {
        matches!(self, Outcome::Open(c) if c.close_reason().is_none())
    }
}

/// `n` connections of `endpoint` to `addr`, `parallel` handshakes at a time, left idle.
pub async fn flood(endpoint: &quinn::Endpoint, addr: SocketAddr, n: usize, parallel: usize) -> Vec<Outcome> {
    futures::stream::iter(0..n)
        .map(|_| async move {
            match endpoint.connect(addr, NODE_NAME) {
                Ok(connecting) => Outcome::of(connecting.await),
                Err(e) => Outcome::Failed(e.to_string()),
            }
        })
        .buffer_unordered(parallel)
        .collect()
        .await
}

/// `outcomes` once the node's closes have arrived: the node closes the connections over its
/// cap as soon as their handshakes show who they are, and the close reaches this side a moment
/// later (longer on a loaded machine). Waits until at most `cap` are open, or `within`.
pub async fn settle(outcomes: Vec<Outcome>, cap: usize, within: Duration) -> Vec<Outcome> {
    let deadline = Instant::now() + within;
    tokio::time::sleep(Duration::from_millis(500).min(within)).await;
    while outcomes.iter().filter(|o| o.still_open()).count() > cap && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Open(c) => match c.close_reason() {
                Some(reason) => Outcome::of(Err(reason)),
                None => Outcome::Open(c),
            },
            other => other,
        })
        .collect()
}

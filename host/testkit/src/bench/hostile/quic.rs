//! The QUIC side of `bench hostile`: located envelopes nested 100,000 deep, floods of idle
//! connections from one client certificate, and a well-behaved SDK client reading over QUIC
//! beside every phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use timeshard_proto::wire::Response;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_sdk::Client;
use timeshard_sdk::tls::TlsFiles;

use super::{Statuses, repeat};
use crate::raw_quic::{self, Outcome};
use crate::stats::Latencies;

/// Depth of the nested located envelopes.
pub(super) const LOCATED_DEPTH: usize = 100_000;
/// Handshakes the idle-connection attacker has in flight at once.
const HANDSHAKES_AT_ONCE: usize = 64;
/// The well-behaved QUIC client's pause between reads: it samples the node's latency without
/// taking a core of its own from the two the node, the attackers and the HTTP client share.
const QUIC_PAUSE: Duration = Duration::from_millis(5);

/// Where the QUIC attacks aim and as whom.
pub(super) struct QuicTarget {
    pub addr: SocketAddr,
    /// The attacker's client certificate (the cluster's, not the well-behaved client's).
    pub tls: TlsFiles,
    /// The node's `[limits] max_connections_per_identity`.
    pub per_identity: usize,
}

/// The well-behaved SDK client: reads `points` of `series` back until `stop`, checking every
/// answer.
pub(super) async fn well_behaved(
    client: Client,
    series: SeriesKey,
    points: Vec<Point>,
    stop: Arc<AtomicBool>,
) -> Result<Latencies> {
    let range = TimeRange::new(points[0].ts, points[points.len() - 1].ts + 1)?;
    let mut lat = Latencies::default();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let got = client.read(&series, range).await?;
        if got != points {
            bail!("the well-behaved QUIC read got {} points, not the {} written", got.len(), points.len());
        }
        lat.push(started.elapsed());
        tokio::time::sleep(QUIC_PAUSE).await;
    }
    Ok(lat)
}

/// Frames of [`LOCATED_DEPTH`] located envelopes, two streams at a time on one connection,
/// until `stop`; the answers by error code.
pub(super) async fn nested_located(target: &QuicTarget, stop: &Arc<AtomicBool>) -> Result<Statuses> {
    let endpoint = raw_quic::endpoint(&target.tls)?;
    let conn = raw_quic::connect(&endpoint, target.addr).await?;
    let frame = Arc::new(raw_quic::nested_located(LOCATED_DEPTH, "well.quic"));
    let statuses = repeat(2, stop, move || {
        let (conn, frame) = (conn.clone(), frame.clone());
        async move {
            Ok(match raw_quic::exchange(&conn, &frame).await {
                Ok(Response::Error(e)) => format!("{:?}", e.code),
                Ok(_) => "answered".to_string(),
                Err(_) => {
                    // A closed connection fails at once: do not spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    "failed".to_string()
                }
            })
        }
    })
    .await;
    endpoint.close(0u32.into(), b"done");
    statuses
}

/// Rounds of `n` connections from the attacker's certificate, [`HANDSHAKES_AT_ONCE`] handshakes
/// at a time, until `stop` (a round begun is finished); the connections a round got are held
/// idle until the next round has ended. Counts `open` (held after the round), `refused` (closed
/// by the node's cap), `rate_limited` (refused before any crypto by the node's limit of
/// handshakes per address) and `failed` (any other end, such as a handshake timeout).
pub(super) async fn idle_connections(target: &QuicTarget, n: usize, stop: &Arc<AtomicBool>) -> Result<Statuses> {
    let endpoint = raw_quic::endpoint(&target.tls)?;
    let mut statuses = Statuses::default();
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let outcomes = raw_quic::flood(&endpoint, target.addr, n, HANDSHAKES_AT_ONCE).await;
        let outcomes = raw_quic::settle(outcomes, target.per_identity, Duration::from_secs(5)).await;
        let mut open = Vec::new();
        for o in outcomes {
            match o {
                Outcome::Open(c) => {
                    statuses.add("open");
                    open.push(c);
                }
                Outcome::Refused(_) => statuses.add("refused"),
                Outcome::RateLimited => statuses.add("rate_limited"),
                Outcome::Failed(_) => statuses.add("failed"),
            }
        }
        held = open;
    }
    drop(held);
    endpoint.close(0u32.into(), b"done");
    Ok(statuses)
}

//! Async Rust client for timeshard.
//!
//! Connects to any node over QUIC with a client certificate from the fleet CA, writes batches of
//! points and reads time ranges back. The node it connects to coordinates: it places each
//! (series, quantum) block on its replicas and waits for the write quorum, and fans a read out
//! to the owner nodes of the range, streaming the points back ([`Client::read_stream`]).
//!
//! ```no_run
//! use timeshard_sdk::{Client, Point, SeriesKey, TimeRange, tls::TlsFiles};
//!
//! # async fn example() -> Result<(), timeshard_sdk::Error> {
//! let tls = TlsFiles::in_dir("pki".as_ref(), "client");
//! let client = Client::connect("127.0.0.1:7400".parse().unwrap(), &tls).await?;
//! let series: SeriesKey = "pmu.phase{bus=7,site=atl}".parse()?;
//! let t0 = 1_700_000_000_000_000_000;
//! client.write(&series, &[Point::new(t0, 49.98), Point::new(t0 + 16_666_666, 50.01)]).await?;
//! let points = client.read(&series, TimeRange::new(t0, t0 + 1_000_000_000)?).await?;
//! assert_eq!(points.len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`Client::write_batch`] splits a batch into requests within the node's limits of points and
//! of series ([`ClientOptions`]), with the splitter the node's HTTP side uses too
//! (`timeshard_proto::batch`).
//!
//! It does not retry failed writes itself: writes are idempotent, so retrying a failed batch
//! is always safe and left to the caller, who knows how long to keep trying.

mod cert_grace;
mod client;
pub mod tls;
pub mod transport;

pub use client::{Client, ClientOptions, WriteAck};
pub use timeshard_proto::point::{ColumnBatch, SeriesPoints};
pub use timeshard_proto::repair::{LeaveProgress, RepairStatus};
pub use timeshard_proto::tier::{ArchiveClassReport, ArchiveReport};
pub use timeshard_proto::window::WindowStats;
pub use timeshard_proto::wire::{ErrorCode, ErrorReply, NodeStatus, QueryOutput, RejectedPoint, SeriesFilter};
pub use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange, Timestamp};

use std::net::SocketAddr;

/// Everything that can go wrong talking to a node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Certificates could not be loaded or used.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The node could not be reached or refused the handshake (e.g. our certificate is not from
    /// its CA).
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    /// The exchange failed after connecting.
    #[error("request to {addr} failed: {source}")]
    Transport {
        addr: SocketAddr,
        #[source]
        source: transport::CallError,
    },
    /// The node refused the request; `code` says why.
    #[error("{addr} refused the request: {} ({:?})", .reply.message, .reply.code)]
    Server { addr: SocketAddr, reply: ErrorReply },
    /// The node answered with a message that does not fit the request.
    #[error("unexpected answer from {addr}: {what}")]
    Protocol { addr: SocketAddr, what: String },
    /// A series key given to the SDK is malformed.
    #[error(transparent)]
    Series(#[from] timeshard_proto::series::SeriesKeyError),
    /// A time range or timestamp given to the SDK is invalid.
    #[error(transparent)]
    Time(#[from] timeshard_proto::time::TimeError),
    /// A location, radius or geohash given to the SDK is invalid.
    #[error(transparent)]
    Geo(#[from] timeshard_proto::geo::GeoError),
    /// A geographic read matched more series than it may read at once.
    #[error("{0}")]
    TooManySeries(String),
}

impl Error {
    /// The server's error code, if the node refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { reply, .. } => Some(reply.code),
            _ => None,
        }
    }
}

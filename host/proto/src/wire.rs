//! Wire messages between nodes and between clients and nodes, and their framing.
//!
//! One request per bidirectional QUIC stream: the opener writes one [`Request`] frame, the other
//! side answers with one [`Response`] frame. A frame is a 4-byte big-endian length followed by
//! that many bytes of postcard-encoded message. Frames above the configured limit are refused
//! before their body is read. The protocol version is carried by the ALPN string, so mismatched
//! peers fail at the handshake instead of misreading each other.
//!
//! Deserialization validates series keys, time ranges and quanta; [`Request::validate`] checks the
//! remaining limits (batch sizes, timestamps).

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::geo::GeoPoint;
use crate::id::Id;
use crate::membership::{self, DigestItem, GossipEntry};
use crate::point::{Point, PointKey};
use crate::repair::{
    self, BlockCursor, BlockRef, LeaveProgress, ListCursor, ListedBlock, RepairEntry, RepairScope, RepairStatus,
    TreeNode,
};
use crate::routing::Contact;
use crate::series::{SeriesKey, SeriesKeyError};
use crate::stream::{FetchPart, PartChunk, ReadRun};
use crate::time::{Quantum, TimeError, TimeRange, check_timestamp};
use crate::window::WindowStats;

/// ALPN protocol id; the trailing number is the wire protocol version.
pub const ALPN: &[u8] = b"timeshard/2";

/// DNS name in every node certificate; clients and peers verify a node against it. The SDK,
/// the node and the control plane's CA all take it from here.
pub const NODE_NAME: &str = "node.timeshard";
/// DNS name in every client certificate.
pub const CLIENT_NAME: &str = "client.timeshard";

/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 4;

/// Hard limits on what a peer may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest frame body accepted, in bytes.
    pub max_message_bytes: u32,
    /// Most points in one write or store request.
    pub max_batch_points: u32,
    /// Most series in one write request.
    pub max_batch_series: u32,
    /// Most points in one page of a read.
    pub max_page_points: u32,
    /// Most contacts in a FIND_NODE answer.
    pub max_contacts: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 16 * 1024 * 1024,
            max_batch_points: 100_000,
            max_batch_series: 10_000,
            max_page_points: 100_000,
            max_contacts: 64,
        }
    }
}

/// Points of one series, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoints {
    pub series: SeriesKey,
    pub points: Vec<Point>,
}

/// Points of one series as a client sends them. The series key travels as plain text and is
/// checked by the receiver, so a bad key gets an error that says what is wrong with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriteSeries {
    pub series: String,
    pub points: Vec<Point>,
}

impl From<SeriesPoints> for WriteSeries {
    fn from(s: SeriesPoints) -> WriteSeries {
        WriteSeries { series: s.series.into(), points: s.points }
    }
}

/// Points of one block (series, quantum), as a coordinator sends them to a replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockPoints {
    pub series: SeriesKey,
    pub quantum: Quantum,
    pub points: Vec<Point>,
}

/// A request. The first group is the peer protocol between nodes, the second the client
/// protocol; nodes accept the peer protocol only from peers holding a node certificate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Liveness check; answered with [`Response::Pong`].
    Ping,
    /// The contacts the receiver knows closest to `target`; answered with [`Response::Nodes`].
    FindNode { target: Id },
    /// Store points as a replica; answered with [`Response::Stored`] once durable.
    Store { blocks: Vec<BlockPoints> },
    /// Raw points of one block within `range` (which lies inside `quantum`), strictly after
    /// `after`, at most `limit`; answered with [`Response::Points`].
    Fetch { series: SeriesKey, quantum: Quantum, range: TimeRange, after: Option<PointKey>, limit: u32 },
    /// The points of `parts` of one series (at most [`MAX_BLOCK_PARTS`]), or only their count
    /// and digest where a part says so; answered with a stream of [`Response::PartPages`]
    /// frames of at most `page_points` points each, parts in the order asked, the last frame
    /// with `more: false`.
    FetchParts { series: SeriesKey, parts: Vec<FetchPart>, page_points: u32 },
    /// Record that these series exist (the series dictionary); answered with [`Response::Stored`].
    RegisterSeries { series: Vec<SeriesKey> },
    /// Whether the receiver holds the registration of `series`; answered with
    /// [`Response::SeriesKnown`].
    HasSeries { series: SeriesKey },
    /// Run query policy `policy` over the raw points of each block part (at most
    /// [`MAX_BLOCK_PARTS`]); answered with [`Response::Partials`], one entry per part.
    Summarize { series: SeriesKey, parts: Vec<BlockPart>, policy: String, params: Vec<(String, String)> },
    /// Window aggregates of each block part (at most [`MAX_BLOCK_PARTS`]); answered with
    /// [`Response::BlockWindows`], one entry per part.
    FetchWindows { series: SeriesKey, parts: Vec<BlockPart>, width_ns: i64 },
    /// Registered series the receiver holds that pass the filter, at most `limit`; answered
    /// with [`Response::SeriesList`].
    FindSeries { filter: SeriesFilter, limit: u32 },

    /// Client: write points, coordinated by the receiver; answered with [`Response::Written`].
    /// Checked with [`check_write`].
    Write { batch: Vec<WriteSeries> },
    /// Client: read `[start, end)` of one series, strictly after `after`, at most `limit`
    /// points; answered with [`Response::Page`]. Checked with [`check_read`].
    Read { series: String, start: i64, end: i64, after: Option<PointKey>, limit: u32 },
    /// Client: every point of `[start, end)` of one series strictly after `after`, streamed:
    /// answered with [`Response::Batch`] frames of at most `batch_points` points in order, the
    /// last with `more: false`, or an error frame. Checked with [`check_read`].
    ReadStream { series: String, start: i64, end: i64, after: Option<PointKey>, batch_points: u32 },
    /// Client: what the receiver knows of itself and the cluster; answered with
    /// [`Response::Status`].
    Status,
    /// Client: run query policy `policy` over `[start, end)` of one series, pushed down to the
    /// nodes that own each quantum; answered with [`Response::QueryResult`].
    Query { series: String, start: i64, end: i64, policy: String, params: Vec<(String, String)> },
    /// Client: min, max, sum, count, first and last of `[start, end)` of one series in windows
    /// of `width_ns` aligned to the epoch; answered with [`Response::Windows`].
    Aggregate { series: String, start: i64, end: i64, width_ns: i64 },
    /// Client: the series of the whole cluster that pass the filter, sorted, at most `limit`;
    /// answered with [`Response::SeriesList`].
    ListSeries { filter: SeriesFilter, limit: u32 },

    /// Membership gossip: the sender's digest of its view (at most [`membership::MAX_MEMBERS`]
    /// items) and entries it pushes (at most [`membership::MAX_GOSSIP_ENTRIES`]: those the
    /// receiver asked for in an earlier answer); answered with [`Response::Gossip`].
    Gossip { digest: Vec<DigestItem>, entries: Vec<GossipEntry> },

    /// Anti-entropy: the sender's hashes of some nodes of its digest tree (at most
    /// [`repair::LEAVES`]); the receiver compares them with its tree of the blocks it holds that
    /// the sender owns, and answers with [`Response::RepairTree`]: for each node that differs,
    /// its hashes `descend` levels down.
    RepairTree { scope: RepairScope, nodes: Vec<(TreeNode, u64)>, descend: u8 },
    /// Anti-entropy: the receiver's entries of those blocks in these leaves, at most `limit`;
    /// answered with [`Response::RepairLeaves`].
    RepairLeaves { scope: RepairScope, leaves: Vec<u16>, limit: u32 },
    /// The points of whole blocks (at most [`repair::MAX_REQUEST_BLOCKS`]), at most `limit`
    /// per answer, from `after` on; answered with [`Response::Blocks`].
    ReadBlocks { blocks: Vec<(SeriesKey, Quantum)>, after: Option<BlockCursor>, limit: u32 },
    /// The receiver's digest and count of each block (at most
    /// [`repair::MAX_REQUEST_BLOCKS`]); answered with [`Response::BlockDigests`].
    BlockDigests { blocks: Vec<BlockRef> },
    /// The blocks the receiver holds, a page of at most `limit`; answered with
    /// [`Response::BlockList`].
    ListBlocks { after: Option<ListCursor>, limit: u32 },
    /// Hand every block off to the other owners, then leave the cluster and exit. Only the
    /// node's own certificate may ask; answered with [`Response::Leaving`] (asking again
    /// reports progress).
    Leave,

    /// Client: the cold tier as the receiver sees it (what the archive holds, this node's
    /// pending exports and last error); answered with [`Response::Archive`].
    ArchiveStatus,
    /// Client: the newest point of one series strictly before `before` (ns); answered with
    /// [`Response::Latest`].
    Latest { series: String, before: i64 },
    /// Client: `request` (a write or a read: see [`Request::is_locatable`]) from a client at
    /// `at`, answered as `request` is. A coordinator decides by it, not by its own location,
    /// whether the client is inside a series' context of interest (quorum reads over the
    /// in-CoI replicas) or outside (the fastest replica). Appended last, so older encodings of
    /// every other request stay valid.
    Located { at: GeoPoint, request: Box<Request> },
}

/// Which series to list: a metric prefix and tags that must match exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesFilter {
    /// Series whose metric starts with this (empty: every series).
    pub metric_prefix: String,
    /// `(name, value)` pairs a series must carry.
    pub tags: Vec<(String, String)>,
}

impl SeriesFilter {
    /// Whether `series` passes.
    pub fn matches(&self, series: &SeriesKey) -> bool {
        series.metric().starts_with(&self.metric_prefix) && self.tags.iter().all(|(k, v)| series.tag(k) == Some(v))
    }
}

/// An answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Pong {
        id: Id,
    },
    Nodes {
        closest: Vec<Contact>,
    },
    Stored {
        points: u64,
    },
    Points {
        points: Vec<Point>,
        more: bool,
        /// Whether the replica holds every block it owns (see [`crate::repair::settle`]).
        settled: bool,
    },
    SeriesKnown {
        known: bool,
    },
    /// One frame of the answer to a [`Request::FetchParts`]; `more` until the last.
    PartPages {
        chunks: Vec<PartChunk>,
        settled: bool,
        more: bool,
    },
    /// One frame of the answer to a [`Request::ReadStream`]; `more` until the last.
    Batch {
        runs: Vec<ReadRun>,
        more: bool,
    },
    /// A write was acknowledged by at least W replicas of every block it touched.
    Written {
        points: u64,
        blocks: u64,
        /// Points an ingest policy refused.
        rejected: u64,
        /// The first of them with reasons (at most [`MAX_REPORTED_REJECTIONS`]).
        rejections: Vec<RejectedPoint>,
    },
    /// Partial results of a query policy over one block, with the count and digest of the
    /// points they were computed from (replicas holding the same points give the same digest).
    Partials {
        parts: Vec<Summarized>,
        settled: bool,
    },
    /// Window aggregates of each block part asked for, in time order (only windows holding
    /// points).
    BlockWindows {
        parts: Vec<Vec<WindowStats>>,
        settled: bool,
    },
    /// Window aggregates of a client's query, in time order (only windows holding points).
    Windows {
        windows: Vec<WindowStats>,
    },
    /// Series keys, sorted; `more` when the limit cut the list.
    SeriesList {
        series: Vec<SeriesKey>,
        more: bool,
    },
    /// The merged result of a query policy.
    QueryResult(QueryOutput),
    /// One page of a read, sorted and deduplicated. If `next` is set the range holds more:
    /// ask again with `after = next`.
    Page {
        points: Vec<Point>,
        next: Option<PointKey>,
    },
    Status(Box<NodeStatus>),
    Error(ErrorReply),
    /// The entries the gossip's sender lacks or holds older, and the ids of its digest the
    /// receiver wants pushed (each at most [`membership::MAX_GOSSIP_ENTRIES`]).
    Gossip {
        entries: Vec<GossipEntry>,
        want: Vec<Id>,
    },
    /// Hashes of the receiver's tree below the nodes that differed; `view_matches` is false
    /// (and nothing compared) when the receiver places blocks by another view.
    RepairTree {
        view_matches: bool,
        hashes: Vec<(TreeNode, u64)>,
    },
    /// Entries of the leaves asked, whole leaves in the order asked: the first `done` leaves
    /// are complete (ask again for the rest).
    RepairLeaves {
        view_matches: bool,
        entries: Vec<RepairEntry>,
        done: u32,
    },
    /// Points of the blocks asked, in order; continue from `next` if set.
    Blocks {
        blocks: Vec<BlockPoints>,
        next: Option<BlockCursor>,
    },
    /// (digest, count) of each block asked, `None` where the receiver holds nothing of it.
    BlockDigests {
        digests: Vec<Option<(u64, u64)>>,
    },
    /// A page of the receiver's blocks; continue from `next` if set.
    BlockList {
        blocks: Vec<ListedBlock>,
        next: Option<ListCursor>,
    },
    Leaving(LeaveProgress),
    Archive(Box<crate::tier::ArchiveReport>),
    /// The newest point of a series, if it holds any.
    Latest {
        point: Option<Point>,
    },
}

/// What a node reports about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: Id,
    pub addr: std::net::SocketAddr,
    pub peers: u32,
    /// Application bytes (message frames) this node has sent and received since it started.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub version: String,
    /// Generation of the control plane's desired state the node runs; 0 when it is configured
    /// by hand (no enrollment).
    pub config_generation: u64,
    /// First 64 bits of the SHA-256 digest of what every node must agree on (its classes and
    /// revocations, as the control plane's digest): nodes that differ here may answer
    /// differently.
    pub config_digest: u64,
    /// Members of this node's membership view that are up, down (silent, still owners) and
    /// gone (no longer owners), this node included.
    pub members_up: u32,
    pub members_down: u32,
    pub members_gone: u32,
    /// Bumped whenever the members that own blocks change.
    pub view_generation: u64,
    /// Hints this node holds for replicas that missed writes, and their bytes on disk.
    pub hints_pending: u64,
    pub hints_pending_bytes: u64,
    /// Hints delivered to their replicas since the node started.
    pub hints_replayed: u64,
    /// Hints dropped (too old, over the byte bound, damaged) since the node started.
    pub hints_dropped: u64,
    /// Writes to replicas still running after their write was answered.
    pub replica_writes_in_flight: u32,
    /// Anti-entropy, handoff, read repair and leaving.
    pub repair: RepairStatus,
    /// Bytes of the write-ahead log on disk (0 for the memory engine).
    pub wal_bytes: u64,
    /// The policy modules installed, with what their calls cost since they were installed.
    pub policies: Vec<PolicyUsage>,
}

/// One installed policy module and its calls, as a node's status shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyUsage {
    pub name: String,
    pub version: String,
    /// `ingest` or `query`.
    pub kind: String,
    /// Whether it is its name's current version; an older one stays installed beside it while
    /// a rollout of a query policy runs, so queries pinned to it still run here.
    pub current: bool,
    pub calls: u64,
    /// Time spent in calls, microseconds.
    pub time_us: u64,
    /// The most linear memory one call used.
    pub peak_memory_bytes: u64,
    pub traps: u64,
    pub timeouts: u64,
    /// Calls that failed otherwise (limits, errors the policy returned).
    pub failures: u64,
    /// Ingest policies: points given, and points refused.
    pub points: u64,
    pub rejected: u64,
}

/// A typed error sent back to the requester.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    /// An error with `code` and a message for a person.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply { code, message: message.into() }
    }
}

/// What kind of failure an [`ErrorReply`] reports. Append only: the wire encodes the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request could not be decoded.
    Malformed,
    /// The frame was larger than the receiver's limit.
    TooLarge,
    /// A batch held more points or series than the limit.
    BatchTooLarge,
    /// A time range was inverted, empty or out of bounds.
    InvalidRange,
    /// A timestamp was outside the accepted range.
    TimestampOutOfRange,
    /// A series key was malformed.
    InvalidSeries,
    /// The series was never written.
    UnknownSeries,
    /// Too few replicas acknowledged a write or answered a read.
    Unavailable,
    /// The receiver is at its limit of concurrent work; retry later.
    Overloaded,
    /// The peer may not make this request (e.g. a client certificate sending peer requests).
    Forbidden,
    /// The local store failed.
    Storage,
    /// Anything else; the message says what.
    Internal,
    /// An ingest policy refused the whole batch; nothing of it was stored.
    Rejected,
    /// A query policy is not installed, not bound to the series, or failed.
    Policy,
}

impl ErrorCode {
    /// Whether an error from one replica may not recur at another, so asking the next replica
    /// helps; the other codes say the request itself is wrong and would fail everywhere.
    pub fn is_replica_fault(self) -> bool {
        matches!(
            self,
            ErrorCode::Unavailable
                | ErrorCode::Overloaded
                | ErrorCode::Storage
                | ErrorCode::Internal
                | ErrorCode::TooLarge
        )
    }
}

/// Most rejected points a write answer lists one by one.
pub const MAX_REPORTED_REJECTIONS: usize = 1_000;
/// Most parameters of a query, and their longest name or value in bytes.
pub const MAX_QUERY_PARAMS: usize = 64;
pub const MAX_PARAM_BYTES: usize = 1_024;

/// A point an ingest policy refused, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectedPoint {
    pub series: String,
    pub point: Point,
    pub reason: String,
}

/// A query policy's partial result over one piece of one block, sent from the node that owns
/// the block to the coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartialResult {
    pub policy: String,
    pub version: String,
    pub range: TimeRange,
    pub numbers: Vec<f64>,
    pub points: Vec<Point>,
}

/// Most block parts one summarize or window request carries.
pub const MAX_BLOCK_PARTS: usize = 4_096;

/// Part of one block: a quantum and the part of a queried range inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockPart {
    pub quantum: Quantum,
    pub range: TimeRange,
}

/// A query policy's partials over one block part, with the count and digest of the points
/// they were computed from: replicas holding the same points report the same digest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summarized {
    pub partials: Vec<PartialResult>,
    pub points: u64,
    pub digest: u64,
}

/// The merged result of a query policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryOutput {
    pub policy: String,
    pub version: String,
    pub values: Vec<(String, f64)>,
    pub points: Vec<Point>,
}

/// Framing failures.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The announced or encoded length exceeds the limit.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: u64, limit: u32 },
    /// The bytes do not decode as the expected message.
    #[error("malformed message: {0}")]
    Malformed(#[from] postcard::Error),
}

/// Encodes `msg` as one frame (header and body).
pub fn encode<T: Serialize>(msg: &T, limit: u32) -> Result<Vec<u8>, FrameError> {
    let mut out = postcard::to_extend(msg, vec![0u8; HEADER_BYTES])?;
    let body = out.len() - HEADER_BYTES;
    if body > limit as usize {
        return Err(FrameError::TooLarge { len: body as u64, limit });
    }
    out[..HEADER_BYTES].copy_from_slice(&(body as u32).to_be_bytes());
    Ok(out)
}

/// Reads the body length from a frame header, refusing lengths above `limit`.
pub fn body_len(header: [u8; HEADER_BYTES], limit: u32) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len > limit {
        return Err(FrameError::TooLarge { len: u64::from(len), limit });
    }
    Ok(len as usize)
}

/// Decodes a frame body. Trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(body)?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

/// A request that is well formed but breaks a limit or carries invalid data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("batch holds {points} points; the limit is {limit}: split it into smaller batches")]
    TooManyPoints { points: u64, limit: u32 },
    #[error("batch holds {series} series; the limit is {limit}: split it into smaller batches")]
    TooManySeries { series: u64, limit: u32 },
    #[error("point of series {series} has {source}")]
    Timestamp { series: SeriesKey, source: TimeError },
    #[error("point of series {series} at {ts} lies outside its block's quantum starting at {quantum}")]
    OutsideQuantum { series: SeriesKey, ts: i64, quantum: i64 },
    #[error("range {range:?} is not inside quantum starting at {quantum}")]
    RangeOutsideQuantum { range: TimeRange, quantum: i64 },
    #[error("page limit {limit} must be between 1 and {max}")]
    BadPageLimit { limit: u32, max: u32 },
    #[error("FIND_NODE answer holds {count} contacts; the limit is {limit}")]
    TooManyContacts { count: usize, limit: u32 },
    #[error(transparent)]
    Series(#[from] SeriesKeyError),
    #[error(transparent)]
    Range(TimeError),
    #[error(
        "a query carries {count} parameters or one longer than {MAX_PARAM_BYTES} bytes; the limit is {MAX_QUERY_PARAMS}"
    )]
    BadParams { count: usize },
    #[error("policy {0:?} is empty or longer than {MAX_POLICY_BYTES} bytes (a name, or name@version)")]
    BadPolicyName(String),
    #[error("{0}")]
    Windows(String),
    #[error("a request carries {parts} block parts; the limit is {MAX_BLOCK_PARTS}")]
    TooManyParts { parts: usize },
    #[error("series {0} is reserved: metrics starting with {prefix} are timeshard's own", prefix = crate::key::RESERVED_METRIC_PREFIX)]
    Reserved(SeriesKey),
    #[error(
        "a gossip message carries {digest} digest items and {entries} entries; the limits are {} and {}",
        membership::MAX_MEMBERS,
        membership::MAX_GOSSIP_ENTRIES
    )]
    TooMuchGossip { digest: usize, entries: usize },
    #[error("invalid repair request: {0}")]
    Repair(String),
    #[error("client location: {0}")]
    Location(crate::geo::GeoError),
    #[error("a located request must carry a write or a read, not {0}")]
    NotLocatable(&'static str),
}

impl InvalidRequest {
    /// The error code a client sees for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            InvalidRequest::TooManyPoints { .. } | InvalidRequest::TooManySeries { .. } => ErrorCode::BatchTooLarge,
            InvalidRequest::Timestamp { .. } => ErrorCode::TimestampOutOfRange,
            InvalidRequest::OutsideQuantum { .. } | InvalidRequest::RangeOutsideQuantum { .. } => ErrorCode::Malformed,
            InvalidRequest::BadPageLimit { .. } => ErrorCode::Malformed,
            InvalidRequest::TooManyContacts { .. } => ErrorCode::Malformed,
            InvalidRequest::Series(_) => ErrorCode::InvalidSeries,
            InvalidRequest::Range(_) => ErrorCode::InvalidRange,
            InvalidRequest::BadParams { .. } | InvalidRequest::BadPolicyName(_) => ErrorCode::Malformed,
            InvalidRequest::Windows(_) => ErrorCode::InvalidRange,
            InvalidRequest::TooManyParts { .. } => ErrorCode::BatchTooLarge,
            InvalidRequest::Reserved(_) => ErrorCode::InvalidSeries,
            InvalidRequest::TooMuchGossip { .. } => ErrorCode::BatchTooLarge,
            InvalidRequest::Repair(_) => ErrorCode::Malformed,
            InvalidRequest::Location(_) | InvalidRequest::NotLocatable(_) => ErrorCode::Malformed,
        }
    }
}

impl From<InvalidRequest> for ErrorReply {
    fn from(e: InvalidRequest) -> ErrorReply {
        ErrorReply::new(e.code(), e.to_string())
    }
}

fn check_points<'a>(
    series: &SeriesKey,
    points: impl IntoIterator<Item = &'a Point>,
    quantum: Option<&Quantum>,
) -> Result<(), InvalidRequest> {
    for p in points {
        check_timestamp(p.ts).map_err(|source| InvalidRequest::Timestamp { series: series.clone(), source })?;
        if let Some(q) = quantum
            && !q.contains(p.ts)
        {
            return Err(InvalidRequest::OutsideQuantum { series: series.clone(), ts: p.ts, quantum: q.start });
        }
    }
    Ok(())
}

/// Longest policy a query names: a name of up to 64 bytes, or `name@version` of up to 64 each
/// (owners are asked for the exact version the coordinator runs).
pub const MAX_POLICY_BYTES: usize = 129;

fn check_policy(policy: &str, params: &[(String, String)]) -> Result<(), InvalidRequest> {
    if policy.is_empty() || policy.len() > MAX_POLICY_BYTES {
        return Err(InvalidRequest::BadPolicyName(policy.chars().take(80).collect()));
    }
    if params.len() > MAX_QUERY_PARAMS
        || params.iter().any(|(k, v)| k.len() > MAX_PARAM_BYTES || v.len() > MAX_PARAM_BYTES)
    {
        return Err(InvalidRequest::BadParams { count: params.len() });
    }
    Ok(())
}

fn check_parts(parts: &[BlockPart]) -> Result<(), InvalidRequest> {
    if parts.len() > MAX_BLOCK_PARTS {
        return Err(InvalidRequest::TooManyParts { parts: parts.len() });
    }
    for p in parts {
        if p.quantum.clip(&p.range) != Some(p.range) {
            return Err(InvalidRequest::RangeOutsideQuantum { range: p.range, quantum: p.quantum.start });
        }
    }
    Ok(())
}

fn check_page(limit: u32, limits: &Limits) -> Result<(), InvalidRequest> {
    if limit == 0 || limit > limits.max_page_points {
        return Err(InvalidRequest::BadPageLimit { limit, max: limits.max_page_points });
    }
    Ok(())
}

/// A series key from a client: well formed and not one of timeshard's own.
fn client_series(key: &str) -> Result<SeriesKey, InvalidRequest> {
    let series: SeriesKey = key.parse()?;
    if series.metric().starts_with(crate::key::RESERVED_METRIC_PREFIX) {
        return Err(InvalidRequest::Reserved(series));
    }
    Ok(series)
}

/// Checks a client's write batch (already size-checked by [`Request::validate`]): series keys
/// and timestamps. Returns it with parsed keys.
pub fn check_write(batch: Vec<WriteSeries>) -> Result<Vec<SeriesPoints>, InvalidRequest> {
    batch
        .into_iter()
        .map(|w| {
            let series = client_series(&w.series)?;
            check_points(&series, &w.points, None)?;
            Ok(SeriesPoints { series, points: w.points })
        })
        .collect()
}

/// Checks a client's read: the series key and the range.
pub fn check_read(series: &str, start: i64, end: i64) -> Result<(SeriesKey, TimeRange), InvalidRequest> {
    Ok((client_series(series)?, TimeRange::new(start, end).map_err(InvalidRequest::Range)?))
}

/// Checks a client's aggregate: the series key, the range and the window width.
pub fn check_aggregate(
    series: &str,
    start: i64,
    end: i64,
    width_ns: i64,
) -> Result<(SeriesKey, TimeRange), InvalidRequest> {
    let (series, range) = check_read(series, start, end)?;
    crate::window::check_windows(&range, width_ns).map_err(InvalidRequest::Windows)?;
    Ok((series, range))
}

impl Request {
    /// Checks the limits that deserialization does not: batch sizes, timestamps, page sizes.
    pub fn validate(&self, limits: &Limits) -> Result<(), InvalidRequest> {
        match self {
            Request::Write { batch } => {
                if batch.len() as u64 > u64::from(limits.max_batch_series) {
                    return Err(InvalidRequest::TooManySeries {
                        series: batch.len() as u64,
                        limit: limits.max_batch_series,
                    });
                }
                let points: u64 = batch.iter().map(|s| s.points.len() as u64).sum();
                if points > u64::from(limits.max_batch_points) {
                    return Err(InvalidRequest::TooManyPoints { points, limit: limits.max_batch_points });
                }
                Ok(())
            }
            Request::Store { blocks } => {
                let points: u64 = blocks.iter().map(|b| b.points.len() as u64).sum();
                if points > u64::from(limits.max_batch_points) {
                    return Err(InvalidRequest::TooManyPoints { points, limit: limits.max_batch_points });
                }
                blocks.iter().try_for_each(|b| check_points(&b.series, &b.points, Some(&b.quantum)))
            }
            Request::RegisterSeries { series } => {
                if series.len() as u64 > u64::from(limits.max_batch_series) {
                    return Err(InvalidRequest::TooManySeries {
                        series: series.len() as u64,
                        limit: limits.max_batch_series,
                    });
                }
                Ok(())
            }
            Request::Fetch { quantum, range, limit, .. } => {
                if quantum.clip(range) != Some(*range) {
                    return Err(InvalidRequest::RangeOutsideQuantum { range: *range, quantum: quantum.start });
                }
                check_page(*limit, limits)
            }
            Request::Read { limit, .. } => check_page(*limit, limits),
            Request::ReadStream { batch_points, .. } => check_page(*batch_points, limits),
            Request::FetchParts { parts, page_points, .. } => {
                let parts: Vec<BlockPart> = parts.iter().map(|p| p.part).collect();
                check_parts(&parts)?;
                check_page(*page_points, limits)
            }
            Request::Summarize { parts, policy, params, .. } => {
                check_parts(parts)?;
                check_policy(policy, params)
            }
            Request::Query { policy, params, .. } => check_policy(policy, params),
            Request::FetchWindows { parts, width_ns, .. } => {
                check_parts(parts)?;
                let windows: u64 = parts
                    .iter()
                    .map(|p| crate::window::check_windows(&p.range, *width_ns).map_err(InvalidRequest::Windows))
                    .sum::<Result<u64, _>>()?;
                if windows > crate::window::MAX_WINDOWS {
                    return Err(InvalidRequest::Windows(format!(
                        "the parts hold {windows} windows; at most {} per request",
                        crate::window::MAX_WINDOWS
                    )));
                }
                Ok(())
            }
            Request::Aggregate { .. } => Ok(()),
            Request::FindSeries { filter, limit } | Request::ListSeries { filter, limit } => {
                check_page(*limit, limits)?;
                if filter.tags.len() > crate::series::MAX_TAGS {
                    return Err(InvalidRequest::BadParams { count: filter.tags.len() });
                }
                Ok(())
            }
            Request::Gossip { digest, entries } => {
                if digest.len() > membership::MAX_MEMBERS || entries.len() > membership::MAX_GOSSIP_ENTRIES {
                    return Err(InvalidRequest::TooMuchGossip { digest: digest.len(), entries: entries.len() });
                }
                Ok(())
            }
            Request::RepairTree { .. }
            | Request::RepairLeaves { .. }
            | Request::ReadBlocks { .. }
            | Request::BlockDigests { .. }
            | Request::ListBlocks { .. } => repair::check(self, limits.max_page_points),
            Request::Ping
            | Request::FindNode { .. }
            | Request::HasSeries { .. }
            | Request::Status
            | Request::Leave
            | Request::ArchiveStatus
            | Request::Latest { .. } => Ok(()),
            Request::Located { at, request } => {
                GeoPoint::new(at.lat, at.lon).map_err(InvalidRequest::Location)?;
                if !request.is_locatable() {
                    return Err(InvalidRequest::NotLocatable(request.kind()));
                }
                request.validate(limits)
            }
        }
    }

    /// Whether a client may wrap this request in [`Request::Located`]: the writes and reads a
    /// coordinator serves for a client.
    pub fn is_locatable(&self) -> bool {
        matches!(
            self,
            Request::Write { .. }
                | Request::Read { .. }
                | Request::ReadStream { .. }
                | Request::Query { .. }
                | Request::Aggregate { .. }
                | Request::Latest { .. }
        )
    }

    /// `self` wrapped with the client's location, when it has one and the request takes it.
    pub fn located(self, at: Option<GeoPoint>) -> Request {
        match at {
            Some(at) if self.is_locatable() => Request::Located { at, request: Box::new(self) },
            _ => self,
        }
    }

    /// The request a [`Request::Located`] carries and the client's location, checked; any
    /// other request as it is, without a location.
    pub fn into_located(self) -> Result<(Request, Option<GeoPoint>), InvalidRequest> {
        match self {
            Request::Located { at, request } => {
                let at = GeoPoint::new(at.lat, at.lon).map_err(InvalidRequest::Location)?;
                if !request.is_locatable() {
                    return Err(InvalidRequest::NotLocatable(request.kind()));
                }
                Ok((*request, Some(at)))
            }
            other => Ok((other, None)),
        }
    }

    /// Whether only nodes may send this request.
    pub fn is_peer_only(&self) -> bool {
        matches!(
            self,
            Request::FindNode { .. }
                | Request::Store { .. }
                | Request::Fetch { .. }
                | Request::FetchParts { .. }
                | Request::RegisterSeries { .. }
                | Request::HasSeries { .. }
                | Request::Summarize { .. }
                | Request::FetchWindows { .. }
                | Request::FindSeries { .. }
                | Request::Gossip { .. }
                | Request::RepairTree { .. }
                | Request::RepairLeaves { .. }
                | Request::ReadBlocks { .. }
                | Request::BlockDigests { .. }
                | Request::ListBlocks { .. }
                | Request::Leave
        )
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Ping => "ping",
            Request::FindNode { .. } => "find_node",
            Request::Store { .. } => "store",
            Request::Fetch { .. } => "fetch",
            Request::RegisterSeries { .. } => "register_series",
            Request::HasSeries { .. } => "has_series",
            Request::Write { .. } => "write",
            Request::Read { .. } => "read",
            Request::ReadStream { .. } => "read_stream",
            Request::FetchParts { .. } => "fetch_parts",
            Request::Status => "status",
            Request::Summarize { .. } => "summarize",
            Request::Query { .. } => "query",
            Request::FetchWindows { .. } => "fetch_windows",
            Request::FindSeries { .. } => "find_series",
            Request::Aggregate { .. } => "aggregate",
            Request::ListSeries { .. } => "list_series",
            Request::Gossip { .. } => "gossip",
            Request::RepairTree { .. } => "repair_tree",
            Request::RepairLeaves { .. } => "repair_leaves",
            Request::ReadBlocks { .. } => "read_blocks",
            Request::BlockDigests { .. } => "block_digests",
            Request::ListBlocks { .. } => "list_blocks",
            Request::Leave => "leave",
            Request::ArchiveStatus => "archive_status",
            Request::Latest { .. } => "latest",
            Request::Located { request, .. } => request.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{NANOS_PER_SEC, QuantumLen};
    use proptest::prelude::*;

    fn series() -> SeriesKey {
        "pmu.phase{bus=1,site=atl}".parse().unwrap()
    }

    #[test]
    fn located_requests_carry_a_checked_client_location() {
        let limits = Limits::default();
        let latest = Request::Latest { series: series().into(), before: 10 };
        let atl = GeoPoint::new(33.75, -84.39).unwrap();
        let req = latest.clone().located(Some(atl));
        assert_eq!(decode::<Request>(&encode(&req, 1024).unwrap()[4..]).unwrap(), req);
        req.validate(&limits).unwrap();
        assert_eq!(req.kind(), "latest");
        assert_eq!(req.clone().into_located().unwrap(), (latest.clone(), Some(atl)));
        assert_eq!(latest.clone().into_located().unwrap(), (latest.clone(), None));
        // Only client writes and reads take a location; status is sent as it is.
        assert_eq!(Request::Status.located(Some(atl)), Request::Status);
        let bad = |at: GeoPoint, request: Request| Request::Located { at, request: Box::new(request) };
        for (req, expect) in [
            (bad(GeoPoint { lat: 95.0, lon: 0.0 }, latest.clone()), "latitude"),
            (bad(GeoPoint { lat: f64::NAN, lon: 0.0 }, latest.clone()), "latitude"),
            (bad(GeoPoint { lat: 0.0, lon: -181.0 }, latest.clone()), "longitude"),
            (bad(atl, Request::Leave), "not leave"),
            (bad(atl, req.clone()), "not latest"),
        ] {
            let err = req.validate(&limits).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Malformed);
            assert!(err.to_string().contains(expect), "{err}");
            assert!(req.into_located().is_err());
        }
        // The envelope checks what it carries.
        let huge = Request::Write {
            batch: vec![WriteSeries { series: series().into(), points: vec![Point::new(1, 0.0); 3] }],
        };
        let small = Limits { max_batch_points: 2, ..limits };
        assert!(matches!(huge.located(Some(atl)).validate(&small), Err(InvalidRequest::TooManyPoints { .. })));
    }

    #[test]
    fn frames_round_trip() {
        let req = Request::Write {
            batch: vec![WriteSeries { series: series().into(), points: vec![Point::new(1, 2.5), Point::new(3, -1.0)] }],
        };
        let frame = encode(&req, 1024).unwrap();
        let len = body_len(frame[..4].try_into().unwrap(), 1024).unwrap();
        assert_eq!(len, frame.len() - 4);
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), req);
    }

    #[test]
    fn oversize_frames_are_refused_both_ways() {
        let req = Request::Write {
            batch: vec![WriteSeries { series: series().into(), points: vec![Point::new(1, 0.0); 100] }],
        };
        assert!(matches!(encode(&req, 64), Err(FrameError::TooLarge { .. })));
        assert!(matches!(body_len(1000u32.to_be_bytes(), 999), Err(FrameError::TooLarge { len: 1000, limit: 999 })));
    }

    #[test]
    fn invalid_values_fail_to_decode() {
        // A peer's fetch carries a validated range: an inverted one, encoded by hand, must not
        // decode.
        #[derive(Serialize)]
        struct Raw {
            start: i64,
            end: i64,
        }
        #[derive(Serialize)]
        enum RawRequest {
            _Ping,
            _FindNode,
            _Store,
            Fetch { series: String, quantum: (i64, i64), range: Raw, after: Option<PointKey>, limit: u32 },
        }
        let fetch = |start, end| {
            postcard::to_stdvec(&RawRequest::Fetch {
                series: "m".into(),
                quantum: (0, 10 * NANOS_PER_SEC),
                range: Raw { start, end },
                after: None,
                limit: 10,
            })
            .unwrap()
        };
        assert!(decode::<Request>(&fetch(10, 5)).is_err());
        let good = fetch(5, 10);
        assert!(decode::<Request>(&good).is_ok());
        // Trailing garbage is refused.
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode::<Request>(&trailing).is_err());
    }

    #[test]
    fn client_input_errors_say_what_is_wrong() {
        let e = check_read("m", 10, 5).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidRange);
        assert!(e.to_string().contains("inverted"), "{e}");
        assert_eq!(check_read("m", 5, 5).unwrap_err().code(), ErrorCode::InvalidRange);
        let e = check_read("bad key", 0, 5).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidSeries);
        assert!(e.to_string().contains("bad key"), "{e}");
        let bad_ts = vec![WriteSeries { series: "m".into(), points: vec![Point::new(-5, 0.0)] }];
        assert_eq!(check_write(bad_ts).unwrap_err().code(), ErrorCode::TimestampOutOfRange);
        let ok = check_write(vec![WriteSeries { series: "m{b=1,a=2}".into(), points: vec![Point::new(5, 0.0)] }]);
        assert_eq!(ok.unwrap()[0].series.as_str(), "m{a=2,b=1}");
    }

    #[test]
    fn validation_enforces_limits() {
        let limits = Limits { max_batch_points: 10, max_batch_series: 2, ..Limits::default() };
        let big = Request::Write {
            batch: vec![WriteSeries { series: series().into(), points: vec![Point::new(1, 0.0); 11] }],
        };
        assert_eq!(big.validate(&limits).unwrap_err().code(), ErrorCode::BatchTooLarge);
        let q = QuantumLen::DEFAULT.quantum_of(20 * NANOS_PER_SEC);
        let outside = Request::Store {
            blocks: vec![BlockPoints { series: series(), quantum: q, points: vec![Point::new(5, 0.0)] }],
        };
        assert!(matches!(outside.validate(&limits), Err(InvalidRequest::OutsideQuantum { .. })));
        let read = Request::Read { series: series().into(), start: 0, end: 10, after: None, limit: 0 };
        assert!(matches!(read.validate(&limits), Err(InvalidRequest::BadPageLimit { .. })));
    }

    #[test]
    fn only_replica_faults_are_worth_asking_another_replica() {
        assert!(ErrorCode::Unavailable.is_replica_fault());
        assert!(ErrorCode::Storage.is_replica_fault());
        assert!(!ErrorCode::Malformed.is_replica_fault());
        assert!(!ErrorCode::Policy.is_replica_fault());
        assert!(!ErrorCode::InvalidRange.is_replica_fault());
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Response>(&bytes);
        }
    }
}

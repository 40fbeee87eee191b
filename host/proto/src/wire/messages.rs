//! The messages: every [`Request`] a node or a client may send, and every [`Response`].
//!
//! Append only: postcard encodes an enum variant by its index, so a new request, answer or
//! error code goes last and older encodings stay valid.

use serde::{Deserialize, Serialize};

use crate::geo::GeoPoint;
use crate::id::Id;
use crate::membership::{DigestItem, GossipEntry, RevocationNews};
use crate::point::{BlockPoints, Point, PointKey, WriteSeries};
use crate::repair::{
    BlockCursor, BlockRef, LeaveProgress, ListCursor, ListedBlock, RepairEntry, RepairScope, RepairStatus, TreeNode,
};
use crate::routing::Contact;
use crate::series::SeriesKey;
use crate::stream::{FetchPart, PartChunk, ReadRun};
use crate::time::{BlockPart, Quantum, TimeRange};
use crate::window::{Grid, WindowStats};

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
    /// `after`, at most `limit`; answered with [`Response::Points`]. `in_coi` on this and
    /// the other read requests: the asker counts the receiver as an in-CoI owner of every
    /// block asked about (a strict in-CoI read) and names the series that places them (the
    /// series itself, or the one an index series indexes), so the answer is settled only if
    /// the receiver's own view places those blocks' in-CoI owners on it too: a view that has
    /// not yet seen a location change must not vouch for blocks it does not know it owns.
    Fetch {
        series: SeriesKey,
        quantum: Quantum,
        range: TimeRange,
        after: Option<PointKey>,
        limit: u32,
        in_coi: Option<SeriesKey>,
    },
    /// The points of `parts` of one series (at most [`MAX_BLOCK_PARTS`]), or only their count
    /// and digest where a part says so; answered with a stream of [`Response::PartPages`]
    /// frames of at most `page_points` points each, parts in the order asked, the last frame
    /// with `more: false`.
    FetchParts { series: SeriesKey, parts: Vec<FetchPart>, page_points: u32, in_coi: Option<SeriesKey> },
    /// Record that these series exist (the series dictionary); answered with [`Response::Stored`].
    RegisterSeries { series: Vec<SeriesKey> },
    /// Whether the receiver holds the registration of `series`; answered with
    /// [`Response::SeriesKnown`].
    HasSeries { series: SeriesKey },
    /// Run query policy `policy` over the raw points of each block part (at most
    /// [`MAX_BLOCK_PARTS`]); answered with [`Response::Partials`], one entry per part.
    Summarize {
        series: SeriesKey,
        parts: Vec<BlockPart>,
        policy: String,
        params: Vec<(String, String)>,
        in_coi: Option<SeriesKey>,
    },
    /// Window aggregates of each block part (at most [`MAX_BLOCK_PARTS`]); answered with
    /// [`Response::BlockWindows`], one entry per part, in windows on `grid`.
    FetchWindows { series: SeriesKey, parts: Vec<BlockPart>, grid: Grid, in_coi: Option<SeriesKey> },
    /// Registered series the receiver holds that pass the filter, at most `limit`; answered
    /// with [`Response::SeriesList`].
    FindSeries { filter: SeriesFilter, limit: u32 },

    /// Client: write points, coordinated by the receiver; answered with [`Response::Written`].
    /// Checked with [`super::check_write`].
    Write { batch: Vec<WriteSeries> },
    /// Client: read `[start, end)` of one series, strictly after `after`, at most `limit`
    /// points; answered with [`Response::Page`]. Checked with [`super::check_read`].
    Read { series: String, start: i64, end: i64, after: Option<PointKey>, limit: u32 },
    /// Client: every point of `[start, end)` of one series strictly after `after`, streamed:
    /// answered with [`Response::Batch`] frames of at most `batch_points` points in order, the
    /// last with `more: false`, or an error frame. Checked with [`super::check_read`].
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

    /// Membership gossip: the sender's digest of its view (at most [`crate::membership::MAX_MEMBERS`]
    /// items) and entries it pushes (at most [`crate::membership::MAX_GOSSIP_ENTRIES`]: those the
    /// receiver asked for in an earlier answer), and the revocation list it holds (the list
    /// itself when the receiver is known to be behind); answered with [`Response::Gossip`].
    Gossip { digest: Vec<DigestItem>, entries: Vec<GossipEntry>, revocations: RevocationNews },

    /// Anti-entropy: the sender's hashes of some nodes of its digest tree (at most
    /// [`crate::repair::LEAVES`]); the receiver compares them with its tree of the blocks it holds that
    /// the sender owns, and answers with [`Response::RepairTree`]: for each node that differs,
    /// its hashes `descend` levels down.
    RepairTree { scope: RepairScope, nodes: Vec<(TreeNode, u64)>, descend: u8 },
    /// Anti-entropy: the receiver's entries of those blocks in these leaves, at most `limit`;
    /// answered with [`Response::RepairLeaves`].
    RepairLeaves { scope: RepairScope, leaves: Vec<u16>, limit: u32 },
    /// The points of whole blocks (at most [`crate::repair::MAX_REQUEST_BLOCKS`]), at most `limit`
    /// per answer, from `after` on; answered with [`Response::Blocks`].
    ReadBlocks { blocks: Vec<(SeriesKey, Quantum)>, after: Option<BlockCursor>, limit: u32 },
    /// The receiver's digest and count of each block (at most
    /// [`crate::repair::MAX_REQUEST_BLOCKS`]); answered with [`Response::BlockDigests`].
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
    /// every other request stay valid. Decoding refuses a located request inside another
    /// before reading it (see [`super::nesting`]), so hostile bytes cannot recurse.
    Located {
        at: GeoPoint,
        #[serde(deserialize_with = "super::nesting::located")]
        request: Box<Request>,
    },
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
    /// receiver wants pushed (each at most [`crate::membership::MAX_GOSSIP_ENTRIES`]).
    Gossip {
        entries: Vec<GossipEntry>,
        want: Vec<Id>,
        /// The revocation list the receiver holds, and the list itself when the sender's is
        /// older.
        revocations: RevocationNews,
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
    /// How full the node is and how far behind: disk, quotas, export, control plane.
    pub storage: StorageStatus,
}

/// How full a node is and how far behind it is, as `timeshard status` and the control plane's
/// device list show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageStatus {
    /// The filesystem holding the data directory: its size and the bytes still available (0
    /// when it cannot be read).
    pub disk_size_bytes: u64,
    pub disk_available_bytes: u64,
    /// `[store] max_bytes` (0: none).
    pub store_max_bytes: u64,
    /// Classes with a quota.
    pub classes: Vec<ClassStorage>,
    /// With an archive: blocks waiting to be exported, rounds failed in a row, when a round
    /// last succeeded (Unix ms, 0: not since start) and the last error.
    pub export_pending_blocks: u64,
    /// Points in those blocks, the bytes they take in the hot store, and when the oldest of
    /// them became due (Unix ms; 0: none).
    pub export_pending_points: u64,
    pub export_pending_bytes: u64,
    pub export_oldest_due_ms: u64,
    pub export_failed_rounds: u32,
    pub export_last_success_ms: u64,
    pub export_last_error: Option<String>,
    /// When the control plane last answered (Unix ms; 0: not since start, or not enrolled).
    pub control_plane_contact_ms: u64,
}

/// A class's quota on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassStorage {
    pub class: String,
    pub quota_bytes: u64,
    pub used_bytes: u64,
    /// `refuse` or `evict_oldest`.
    pub on_full: String,
    /// Whether the class's writes are refused now.
    pub refusing: bool,
    /// Blocks and points evicted since the node started.
    pub evicted_blocks: u64,
    pub evicted_points: u64,
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

impl Request {
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
    use serde::Serialize;

    use super::*;
    use crate::time::NANOS_PER_SEC;
    use crate::wire::decode;

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
            Fetch {
                series: String,
                quantum: (i64, i64),
                range: Raw,
                after: Option<PointKey>,
                limit: u32,
                in_coi: Option<String>,
            },
        }
        let fetch = |start, end| {
            postcard::to_stdvec(&RawRequest::Fetch {
                series: "m".into(),
                quantum: (0, 10 * NANOS_PER_SEC),
                range: Raw { start, end },
                after: None,
                limit: 10,
                in_coi: None,
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
    fn only_replica_faults_are_worth_asking_another_replica() {
        assert!(ErrorCode::Unavailable.is_replica_fault());
        assert!(ErrorCode::Storage.is_replica_fault());
        assert!(!ErrorCode::Malformed.is_replica_fault());
        assert!(!ErrorCode::Policy.is_replica_fault());
        assert!(!ErrorCode::InvalidRange.is_replica_fault());
    }
}

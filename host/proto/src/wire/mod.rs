//! Wire messages between nodes and between clients and nodes: what they say
//! ([`messages`]), how they travel ([`framing`]) and what a receiver checks ([`validation`]).
//!
//! One request per bidirectional QUIC stream: the opener writes one [`Request`] frame, the other
//! side answers with one [`Response`] frame. The protocol version is carried by the ALPN string,
//! so mismatched peers fail at the handshake instead of misreading each other.
//!
//! Deserialization validates series keys, time ranges and quanta; [`Request::validate`] checks the
//! remaining limits (batch sizes, timestamps); [`nesting`] bounds how deep a message may nest. The points a message carries are
//! [`crate::point`]'s types, re-exported here for the crates that name them by this path.

pub mod framing;
pub mod messages;
pub mod nesting;
pub mod validation;

use serde::{Deserialize, Serialize};

pub use crate::point::{BlockPoints, SeriesPoints, WriteSeries};
pub use crate::time::BlockPart;
pub use framing::{FrameError, HEADER_BYTES, body_len, decode, encode, frame_bytes};
pub use messages::{
    ClassStorage, ErrorCode, ErrorReply, MAX_BLOCK_PARTS, MAX_PARAM_BYTES, MAX_QUERY_PARAMS, MAX_REPORTED_REJECTIONS,
    NodeStatus, PartialResult, PolicyUsage, QueryOutput, RejectedPoint, Request, Response, SeriesFilter, StorageStatus,
    Summarized,
};
pub use validation::{InvalidRequest, MAX_POLICY_BYTES, check_aggregate, check_read, check_write};

/// ALPN protocol id; the trailing number is the wire protocol version.
pub const ALPN: &[u8] = b"timeshard/2";

/// DNS name in every node certificate; clients and peers verify a node against it. The SDK,
/// the node and the control plane's CA all take it from here.
pub const NODE_NAME: &str = "node.timeshard";
/// DNS name in every client certificate.
pub const CLIENT_NAME: &str = "client.timeshard";

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

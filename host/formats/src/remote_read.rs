//! Prometheus remote read, sans I/O: a snappy-compressed protobuf `ReadRequest` in (bounded:
//! body size, queries, matchers, regex size), and the two answers Prometheus accepts out:
//! a snappy-compressed `ReadResponse` of samples, or `STREAMED_XOR_CHUNKS`, a stream of
//! frames each holding one `ChunkedReadResponse` (uvarint length, CRC32-Castagnoli of the
//! message big-endian, the message) whose series carry [`chunkenc`](crate::chunkenc) chunks.
//!
//! Messages are declared with prost's derive (no protoc), with the field numbers of
//! Prometheus' `prompb/remote.proto` and `types.proto`.

use prost::Message;

use crate::chunkenc::{self, ChunkError, SAMPLES_PER_CHUNK};
use crate::compression::{self, DecompressError};
use crate::promql::matcher::{MatchOp, Matcher, RegexError};
use crate::promql::source::Sample;
use crate::promql::{Labels, Limits};
use crate::remote_write::{self, Label, TimeSeries};

/// `Content-Type` of a sampled answer (with `Content-Encoding: snappy`).
pub const SAMPLED_CONTENT_TYPE: &str = "application/x-protobuf";
/// `Content-Type` of a streamed answer.
pub const STREAMED_CONTENT_TYPE: &str = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse";
/// Prometheus' default bound on one frame's message (`--storage.remote.read-max-bytes-in-frame`).
pub const DEFAULT_FRAME_BYTES: usize = 1 << 20;

/// `prometheus.ReadRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ReadRequest {
    #[prost(message, repeated, tag = "1")]
    pub queries: Vec<Query>,
    /// [`ResponseType`]s, in the client's order of preference.
    #[prost(enumeration = "ResponseType", repeated, tag = "2")]
    pub accepted_response_types: Vec<i32>,
}

/// `prometheus.ReadRequest.ResponseType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ResponseType {
    Samples = 0,
    StreamedXorChunks = 1,
}

/// `prometheus.Query`.
#[derive(Clone, PartialEq, Message)]
pub struct Query {
    #[prost(int64, tag = "1")]
    pub start_timestamp_ms: i64,
    #[prost(int64, tag = "2")]
    pub end_timestamp_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub matchers: Vec<LabelMatcher>,
    #[prost(message, optional, tag = "4")]
    pub hints: Option<ReadHints>,
}

/// `prometheus.LabelMatcher`.
#[derive(Clone, PartialEq, Message)]
pub struct LabelMatcher {
    /// 0 `=`, 1 `!=`, 2 `=~`, 3 `!~`.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub value: String,
}

/// `prometheus.ReadHints`: what the client will compute, a chance to compute it here.
#[derive(Clone, PartialEq, Message)]
pub struct ReadHints {
    #[prost(int64, tag = "1")]
    pub step_ms: i64,
    #[prost(string, tag = "2")]
    pub func: String,
    #[prost(int64, tag = "3")]
    pub start_ms: i64,
    #[prost(int64, tag = "4")]
    pub end_ms: i64,
    #[prost(string, repeated, tag = "5")]
    pub grouping: Vec<String>,
    #[prost(bool, tag = "6")]
    pub by: bool,
    #[prost(int64, tag = "7")]
    pub range_ms: i64,
}

/// `prometheus.ReadResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct ReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<QueryResult>,
}

/// `prometheus.QueryResult`.
#[derive(Clone, PartialEq, Message)]
pub struct QueryResult {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.ChunkedReadResponse`: one frame of a streamed answer.
#[derive(Clone, PartialEq, Message)]
pub struct ChunkedReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub chunked_series: Vec<ChunkedSeries>,
    #[prost(int64, tag = "2")]
    pub query_index: i64,
}

/// `prometheus.ChunkedSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct ChunkedSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub chunks: Vec<Chunk>,
}

/// `prometheus.Chunk`.
#[derive(Clone, PartialEq, Message)]
pub struct Chunk {
    #[prost(int64, tag = "1")]
    pub min_time_ms: i64,
    #[prost(int64, tag = "2")]
    pub max_time_ms: i64,
    /// 1: XOR.
    #[prost(int32, tag = "3")]
    pub r#type: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// `prometheus.Chunk.Encoding.XOR`.
pub const CHUNK_XOR: i32 = 1;

/// The bounds on a read request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadLimits {
    /// Decompressed request bytes.
    pub max_request_bytes: usize,
    pub max_queries: usize,
    /// Matchers in one query (and the regex size limit of [`Limits`]).
    pub max_matchers: usize,
    pub max_regex_bytes: usize,
}

impl Default for ReadLimits {
    fn default() -> ReadLimits {
        let l = Limits::default();
        ReadLimits {
            max_request_bytes: 1 << 20,
            max_queries: 64,
            max_matchers: l.max_matchers,
            max_regex_bytes: l.max_regex_bytes,
        }
    }
}

/// A request that is not a remote-read request, or asks too much.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    #[error("the body is not a valid remote-read protobuf message (prometheus.ReadRequest): {0}")]
    Protobuf(String),
    #[error("the request has {got} queries, more than the limit of {limit}")]
    TooManyQueries { got: usize, limit: usize },
    #[error("query {query} has {got} label matchers, more than the limit of {limit}")]
    TooManyMatchers { query: usize, got: usize, limit: usize },
    #[error("query {query}: unknown label matcher type {kind} (0 to 3 are =, !=, =~, !~)")]
    MatcherType { query: usize, kind: i32 },
    #[error("query {query}: {source}")]
    Regex { query: usize, source: RegexError },
    #[error("query {query}: the time range ends ({end} ms) before it starts ({start} ms)")]
    Range { query: usize, start: i64, end: i64 },
}

/// One query of a request, its matchers compiled.
#[derive(Debug, Clone)]
pub struct ReadQuery {
    pub start_ms: i64,
    pub end_ms: i64,
    pub matchers: Vec<Matcher>,
    pub hints: Option<ReadHints>,
}

/// A decoded request: its queries and the answer the client prefers.
#[derive(Debug, Clone)]
pub struct Request {
    pub queries: Vec<ReadQuery>,
    pub response: ResponseType,
}

/// Decodes a snappy-compressed request body within `limits`.
pub fn decode_request(body: &[u8], limits: &ReadLimits) -> Result<Request, ReadError> {
    let raw = compression::unsnappy(body, limits.max_request_bytes)?;
    let req = ReadRequest::decode(raw.as_slice()).map_err(|e| ReadError::Protobuf(e.to_string()))?;
    if req.queries.len() > limits.max_queries {
        return Err(ReadError::TooManyQueries { got: req.queries.len(), limit: limits.max_queries });
    }
    // The first type the client accepts that we serve (both); none listed means samples.
    let response = req
        .accepted_response_types
        .iter()
        .find_map(|&t| ResponseType::try_from(t).ok())
        .unwrap_or(ResponseType::Samples);
    let mut queries = Vec::with_capacity(req.queries.len());
    for (i, q) in req.queries.into_iter().enumerate() {
        if q.matchers.len() > limits.max_matchers {
            return Err(ReadError::TooManyMatchers { query: i, got: q.matchers.len(), limit: limits.max_matchers });
        }
        if q.end_timestamp_ms < q.start_timestamp_ms {
            return Err(ReadError::Range { query: i, start: q.start_timestamp_ms, end: q.end_timestamp_ms });
        }
        let mut matchers = Vec::with_capacity(q.matchers.len());
        for m in &q.matchers {
            let op = match m.r#type {
                0 => MatchOp::Equal,
                1 => MatchOp::NotEqual,
                2 => MatchOp::Regex,
                3 => MatchOp::NotRegex,
                kind => return Err(ReadError::MatcherType { query: i, kind }),
            };
            matchers.push(
                Matcher::new(&m.name, op, &m.value, limits.max_regex_bytes)
                    .map_err(|source| ReadError::Regex { query: i, source })?,
            );
        }
        queries.push(ReadQuery {
            start_ms: q.start_timestamp_ms,
            end_ms: q.end_timestamp_ms,
            matchers,
            hints: q.hints,
        });
    }
    Ok(Request { queries, response })
}

fn labels_pb(labels: &Labels) -> Vec<Label> {
    labels.iter().map(|(n, v)| Label { name: n.to_string(), value: v.to_string() }).collect()
}

/// A sampled answer: for each query, its series and samples; snappy-compressed.
pub fn sampled_response<'a>(results: impl IntoIterator<Item = Vec<(&'a Labels, &'a [Sample])>>) -> Vec<u8> {
    let resp = ReadResponse {
        results: results
            .into_iter()
            .map(|series| QueryResult {
                timeseries: series
                    .into_iter()
                    .map(|(l, s)| TimeSeries {
                        labels: labels_pb(l),
                        samples: s.iter().map(|x| remote_write::Sample { value: x.v, timestamp: x.t }).collect(),
                    })
                    .collect(),
            })
            .collect(),
    };
    compression::snappy(&resp.encode_to_vec())
}

/// The XOR chunks of a series' samples, [`SAMPLES_PER_CHUNK`] each.
pub fn chunks_of(samples: &[Sample]) -> Vec<Chunk> {
    samples
        .chunks(SAMPLES_PER_CHUNK)
        .map(|c| Chunk {
            min_time_ms: c[0].t,
            max_time_ms: c[c.len() - 1].t,
            r#type: CHUNK_XOR,
            data: chunkenc::encode_xor(c),
        })
        .collect()
}

/// Builds the frames of a streamed answer, one query at a time: series are added as they are
/// read, and a frame comes out whenever the next series would take its message past the
/// frame size (a series larger than that gets a frame of its own).
#[derive(Debug)]
pub struct StreamEncoder {
    max_frame_bytes: usize,
    query_index: i64,
    pending: ChunkedReadResponse,
}

impl StreamEncoder {
    pub fn new(query_index: usize, max_frame_bytes: usize) -> StreamEncoder {
        StreamEncoder {
            max_frame_bytes,
            query_index: query_index as i64,
            pending: ChunkedReadResponse { chunked_series: Vec::new(), query_index: query_index as i64 },
        }
    }

    /// Adds a series; returns a finished frame when one is due.
    pub fn push(&mut self, labels: &Labels, samples: &[Sample]) -> Option<Vec<u8>> {
        if samples.is_empty() {
            return None;
        }
        let series = ChunkedSeries { labels: labels_pb(labels), chunks: chunks_of(samples) };
        let out = if !self.pending.chunked_series.is_empty()
            && self.pending.encoded_len() + series.encoded_len() + 8 > self.max_frame_bytes
        {
            self.take()
        } else {
            None
        };
        self.pending.chunked_series.push(series);
        out
    }

    /// The last frame, if any series are waiting.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        self.take()
    }

    fn take(&mut self) -> Option<Vec<u8>> {
        if self.pending.chunked_series.is_empty() {
            return None;
        }
        let msg = std::mem::replace(
            &mut self.pending,
            ChunkedReadResponse { chunked_series: Vec::new(), query_index: self.query_index },
        );
        Some(frame(&msg.encode_to_vec()))
    }
}

/// One frame: uvarint length, CRC32-Castagnoli (big-endian), the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 14);
    let mut n = message.len() as u64;
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(&crc32c::crc32c(message).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A streamed answer that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame {index}: truncated")]
    Truncated { index: usize },
    #[error("frame {index}: its message of {size} bytes exceeds the limit of {limit}")]
    TooLarge { index: usize, size: u64, limit: usize },
    #[error("frame {index}: corrupted frame; checksum mismatch")]
    Checksum { index: usize },
    #[error("frame {index}: not a prometheus.ChunkedReadResponse: {message}")]
    Protobuf { index: usize, message: String },
}

/// Reads the frames of a streamed answer (a client's side, and the tests').
#[derive(Debug)]
pub struct FrameReader<'a> {
    data: &'a [u8],
    index: usize,
    max_frame_bytes: usize,
}

impl<'a> FrameReader<'a> {
    pub fn new(data: &'a [u8], max_frame_bytes: usize) -> FrameReader<'a> {
        FrameReader { data, index: 0, max_frame_bytes }
    }

    /// The next frame's message, checked.
    pub fn next_message(&mut self) -> Option<Result<ChunkedReadResponse, FrameError>> {
        if self.data.is_empty() {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let r = self.read(index);
        if r.is_err() {
            // A bad frame ends the stream: what follows cannot be framed reliably.
            self.data = &[];
        }
        Some(r)
    }

    fn read(&mut self, index: usize) -> Result<ChunkedReadResponse, FrameError> {
        let mut size = 0u64;
        let mut i = 0;
        loop {
            let b = *self.data.get(i).ok_or(FrameError::Truncated { index })?;
            if i == 9 && b > 1 {
                return Err(FrameError::TooLarge { index, size: u64::MAX, limit: self.max_frame_bytes });
            }
            size |= u64::from(b & 0x7f) << (7 * i);
            i += 1;
            if b < 0x80 {
                break;
            }
        }
        if size > self.max_frame_bytes as u64 {
            return Err(FrameError::TooLarge { index, size, limit: self.max_frame_bytes });
        }
        let end = i + 4 + size as usize;
        if self.data.len() < end {
            return Err(FrameError::Truncated { index });
        }
        let crc = u32::from_be_bytes([self.data[i], self.data[i + 1], self.data[i + 2], self.data[i + 3]]);
        let msg = &self.data[i + 4..end];
        self.data = &self.data[end..];
        if crc32c::crc32c(msg) != crc {
            return Err(FrameError::Checksum { index });
        }
        ChunkedReadResponse::decode(msg).map_err(|e| FrameError::Protobuf { index, message: e.to_string() })
    }
}

/// The samples of a chunked series (XOR chunks only), at most `max_samples` per chunk.
pub fn series_samples(series: &ChunkedSeries, max_samples: usize) -> Result<Vec<Sample>, ChunkError> {
    let mut out = Vec::new();
    for c in &series.chunks {
        out.extend(chunkenc::decode_xor(&c.data, max_samples)?);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "remote_read_tests.rs"]
mod tests;

//! Prometheus remote write 1.0, sans I/O: a snappy-compressed protobuf `WriteRequest` in, a
//! validated write batch out.
//!
//! Only the messages a sender of samples uses are declared (`WriteRequest`, `TimeSeries`,
//! `Label`, `Sample`); metadata, exemplars and native histograms are skipped as unknown
//! fields. Sample timestamps are milliseconds; staleness markers (Prometheus' special NaN) are
//! dropped, since they mark the end of a series rather than a measurement. Names map to series
//! keys as [`crate::names`] says.

use std::collections::HashMap;

use prost::Message;
use timeshard_proto::Point;
use timeshard_proto::point::SeriesPoints;
use timeshard_proto::time::check_timestamp;

use crate::compression::{self, DecompressError};
use crate::line_protocol::{LineError, MAX_REPORTED_ERRORS};
use crate::names;

/// The bit pattern of Prometheus' staleness marker.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// A body that is not a remote-write request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    #[error("the body is not a valid remote-write protobuf message (prometheus.WriteRequest): {0}")]
    Protobuf(String),
}

/// What a request holds.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub batch: Vec<SeriesPoints>,
    pub samples: usize,
    /// Staleness markers skipped.
    pub stale: usize,
    /// Series or samples refused, the first [`MAX_REPORTED_ERRORS`] of them; `line` is the
    /// series' 1-based position in the request.
    pub errors: Vec<LineError>,
    pub failed: usize,
}

/// Most bytes of memory one decompressed byte may take once decoded: an empty label is 2 bytes
/// of protobuf and a `Label` of two empty `String`s (48 bytes); charge a body at this much
/// before decoding it.
pub const DECODED_BYTES_PER_BYTE: usize = 24;

/// Decodes a snappy-compressed body of at most `limit` bytes decompressed.
pub fn decode(body: &[u8], limit: usize) -> Result<Decoded, DecodeError> {
    let raw = compression::unsnappy(body, limit)?;
    let request = WriteRequest::decode(raw.as_slice()).map_err(|e| DecodeError::Protobuf(e.to_string()))?;
    Ok(to_batch(request))
}

/// The write batch of a decoded request: one entry per distinct series.
pub fn to_batch(request: WriteRequest) -> Decoded {
    let mut out = Decoded::default();
    let mut index: HashMap<timeshard_proto::SeriesKey, usize> = HashMap::new();
    let fail = |out: &mut Decoded, n: usize, message: String| {
        out.failed += 1;
        if out.errors.len() < MAX_REPORTED_ERRORS {
            out.errors.push(LineError { line: n, message });
        }
    };
    for (n, ts) in request.timeseries.into_iter().enumerate() {
        let key = match names::prometheus_key(ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str()))) {
            Ok(k) => k,
            Err(e) => {
                let labels: Vec<String> =
                    ts.labels.iter().take(8).map(|l| format!("{}={:?}", l.name, l.value)).collect();
                fail(&mut out, n + 1, format!("series {{{}}}: {e}", labels.join(",")));
                continue;
            }
        };
        let mut points = Vec::with_capacity(ts.samples.len());
        for s in ts.samples {
            if s.value.to_bits() == STALE_NAN_BITS {
                out.stale += 1;
                continue;
            }
            match s.timestamp.checked_mul(1_000_000).map(check_timestamp) {
                Some(Ok(t)) => points.push(Point::new(t, s.value)),
                _ => {
                    fail(&mut out, n + 1, format!("series {key}: sample timestamp {} ms is out of range", s.timestamp))
                }
            }
        }
        if points.is_empty() {
            continue;
        }
        out.samples += points.len();
        let next = out.batch.len();
        let i = *index.entry(key.clone()).or_insert(next);
        if i == next {
            out.batch.push(SeriesPoints { series: key, points });
        } else {
            out.batch[i].points.extend(points);
        }
    }
    out
}

/// A snappy-compressed request body, as Prometheus sends it (for tests and benchmarks).
pub fn encode(request: &WriteRequest) -> Vec<u8> {
    compression::snappy(&request.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(labels: &[(&str, &str)], samples: &[(f64, i64)]) -> TimeSeries {
        TimeSeries {
            labels: labels.iter().map(|(n, v)| Label { name: n.to_string(), value: v.to_string() }).collect(),
            samples: samples.iter().map(|&(value, timestamp)| Sample { value, timestamp }).collect(),
        }
    }

    #[test]
    fn requests_round_trip_into_batches() {
        let req = WriteRequest {
            timeseries: vec![
                series(
                    &[("__name__", "up"), ("job", "node"), ("instance", "127.0.0.1:9100")],
                    &[(1.0, 1_700_000_000_000)],
                ),
                series(
                    &[("__name__", "bucket"), ("le", "+Inf")],
                    &[(3.0, 1_700_000_000_000), (f64::from_bits(STALE_NAN_BITS), 1_700_000_001_000)],
                ),
                series(&[("job", "nameless")], &[(1.0, 1)]),
                series(&[("__name__", "old")], &[(1.0, -5)]),
                series(
                    &[("instance", "127.0.0.1:9100"), ("__name__", "up"), ("job", "node")],
                    &[(0.0, 1_700_000_015_000)],
                ),
            ],
        };
        let d = decode(&encode(&req), 1 << 20).unwrap();
        assert_eq!(d.samples, 3);
        assert_eq!(d.stale, 1);
        assert_eq!(d.failed, 2);
        assert!(d.errors[0].message.contains("__name__"), "{:?}", d.errors);
        assert!(d.errors[1].message.contains("out of range"), "{:?}", d.errors);
        assert_eq!(d.batch.len(), 2);
        assert_eq!(d.batch[0].series.as_str(), "up{instance=127.0.0.1:9100,job=node}");
        assert_eq!(
            d.batch[0].points,
            vec![Point::new(1_700_000_000_000_000_000, 1.0), Point::new(1_700_000_015_000_000_000, 0.0)]
        );
        assert_eq!(d.batch[1].series.as_str(), "bucket{le=%2BInf}");
    }

    #[test]
    fn bodies_that_are_not_remote_write_are_refused() {
        assert!(matches!(decode(b"plain text", 1 << 20), Err(DecodeError::Decompress(DecompressError::Snappy(_)))));
        let not_protobuf = compression::snappy(b"\xff\xff\xff\xff not a message");
        let err = decode(&not_protobuf, 1 << 20).unwrap_err();
        assert!(matches!(err, DecodeError::Protobuf(_)), "{err}");
        assert!(err.to_string().contains("prometheus.WriteRequest"), "{err}");
        let big = encode(&WriteRequest { timeseries: vec![series(&[("__name__", "x")], &[(1.0, 1); 100])] });
        assert!(matches!(decode(&big, 64), Err(DecodeError::Decompress(DecompressError::TooLarge { .. }))));
    }
}

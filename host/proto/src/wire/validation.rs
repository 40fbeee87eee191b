//! What a receiver checks beyond what deserialization does: batch sizes, timestamps, page
//! sizes, the parts and parameters of queries, repair requests, and a client's series keys,
//! ranges and location.

use crate::geo::GeoPoint;
use crate::membership;
use crate::point::{Point, SeriesPoints, WriteSeries};
use crate::repair::{self, LEAVES, MAX_LEAF_ENTRIES, MAX_REQUEST_BLOCKS};
use crate::series::{SeriesKey, SeriesKeyError};
use crate::time::{BlockPart, Quantum, TimeError, TimeRange, check_timestamp};

use super::Limits;
use super::messages::{ErrorCode, ErrorReply, MAX_BLOCK_PARTS, MAX_PARAM_BYTES, MAX_QUERY_PARAMS, Request};

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
    #[error(
        "a gossip entry's proof carries more than {} certificates or an item over {} bytes, or a revocation list is over {} bytes",
        membership::MAX_PROOF_CERTS,
        membership::MAX_PROOF_ITEM_BYTES,
        membership::MAX_REVOCATIONS_BYTES
    )]
    OversizedProof,
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
            InvalidRequest::TooMuchGossip { .. } | InvalidRequest::OversizedProof => ErrorCode::BatchTooLarge,
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
    crate::window::check_windows(&range, crate::window::Grid::epoch(width_ns)).map_err(InvalidRequest::Windows)?;
    Ok((series, range))
}

/// Checks the limits of a repair request that deserialization does not.
fn check_repair(req: &Request, max_page_points: u32) -> Result<(), InvalidRequest> {
    let bad = |m: String| Err(InvalidRequest::Repair(m));
    let page = |limit: u32, max: u32| {
        if limit == 0 || limit > max { bad(format!("page limit {limit} must be between 1 and {max}")) } else { Ok(()) }
    };
    match req {
        Request::RepairTree { nodes, descend, .. } => {
            if nodes.len() > LEAVES || *descend > repair::tree::MAX_DESCEND || nodes.iter().any(|(n, _)| !n.is_valid())
            {
                return bad(format!("{} tree nodes, descending {descend}; at most {LEAVES} valid nodes", nodes.len()));
            }
            Ok(())
        }
        Request::RepairLeaves { leaves, limit, .. } => {
            if leaves.len() > LEAVES || leaves.iter().any(|&l| usize::from(l) >= LEAVES) {
                return bad(format!("{} leaves; at most {LEAVES}, each below {LEAVES}", leaves.len()));
            }
            page(*limit, MAX_LEAF_ENTRIES)
        }
        Request::ReadBlocks { blocks, limit, .. } => {
            if blocks.len() > MAX_REQUEST_BLOCKS {
                return bad(format!("{} blocks; at most {MAX_REQUEST_BLOCKS}", blocks.len()));
            }
            page(*limit, max_page_points)
        }
        Request::BlockDigests { blocks } if blocks.len() > MAX_REQUEST_BLOCKS => {
            bad(format!("{} blocks; at most {MAX_REQUEST_BLOCKS}", blocks.len()))
        }
        Request::ListBlocks { limit, .. } => page(*limit, max_page_points),
        _ => Ok(()),
    }
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
            Request::FetchWindows { parts, grid, .. } => {
                check_parts(parts)?;
                let windows: u64 = parts
                    .iter()
                    .map(|p| crate::window::check_windows(&p.range, *grid).map_err(InvalidRequest::Windows))
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
            Request::Gossip { digest, entries, revocations } => {
                if revocations.list.as_ref().is_some_and(|l| !l.is_bounded()) {
                    return Err(InvalidRequest::OversizedProof);
                }
                if digest.len() > membership::MAX_MEMBERS || entries.len() > membership::MAX_GOSSIP_ENTRIES {
                    return Err(InvalidRequest::TooMuchGossip { digest: digest.len(), entries: entries.len() });
                }
                if entries.iter().any(|e| e.proof.as_ref().is_some_and(|p| !p.is_bounded())) {
                    return Err(InvalidRequest::OversizedProof);
                }
                Ok(())
            }
            Request::RepairTree { .. }
            | Request::RepairLeaves { .. }
            | Request::ReadBlocks { .. }
            | Request::BlockDigests { .. }
            | Request::ListBlocks { .. } => check_repair(self, limits.max_page_points),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{NANOS_PER_SEC, QuantumLen};
    use crate::wire::{BlockPoints, decode, encode};

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
}

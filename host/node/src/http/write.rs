//! Write endpoints: InfluxDB line protocol (`/write`, `/api/v2/write`) and Prometheus remote
//! write (`/api/v1/write`). Bodies are decoded sans I/O by `timeshard_formats`, then written
//! through the coordinator like an SDK write, in batches within the node's limits.
//!
//! Partial writes as InfluxDB does them: the valid lines are stored, and the answer is `400`
//! with the refused lines and `dropped=N` (`204` when everything was stored). Points an ingest
//! policy refuses are reported the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use timeshard_formats::compression;
use timeshard_formats::line_protocol::{self, LineError, Precision};
use timeshard_formats::long_lines::{self, LongLines, MAX_LINE_BYTES};
use timeshard_formats::remote_write;
use timeshard_proto::batch;
use timeshard_proto::point::SeriesPoints;

use super::body::{LeftOut, wait_for_room};
use super::error::{ApiError, V2};
use super::{AppState, Body};
use crate::budget::{Ledger, OwnedAdmitted, recent_resident_bytes};
use crate::metrics::Ingest;

/// The query parameters of a request.
pub fn params(query: Option<&str>) -> Result<HashMap<String, String>, ApiError> {
    serde_urlencoded::from_str(query.unwrap_or_default())
        .map_err(|e| ApiError::BadRequest(format!("cannot read the query parameters: {e}")))
}

/// How a body is encoded (`Content-Encoding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    pub(super) fn of(headers: &HeaderMap) -> Result<Encoding, ApiError> {
        let Some(value) = headers.get(header::CONTENT_ENCODING) else { return Ok(Encoding::Identity) };
        match String::from_utf8_lossy(value.as_bytes()).trim() {
            "" | "identity" => Ok(Encoding::Identity),
            e if e.eq_ignore_ascii_case("gzip") => Ok(Encoding::Gzip),
            other => Err(ApiError::UnsupportedMediaType(format!(
                "Content-Encoding {other:?} is not supported: send the body plain or gzip-compressed"
            ))),
        }
    }
}

/// A gzip body's decompressed size as its trailer declares it, charged to `ledger` before any
/// of it is inflated: a body declaring more than `limit` is refused as too large, and one the
/// budget cannot take now waits for room as an unread body does, and is refused then
/// (retryable), not after inflating part of it. Returns the charge and the bytes it prepays.
async fn charge_inflated(body: &[u8], limit: usize, ledger: Option<&Arc<Ledger>>) -> Result<Prepaid, ApiError> {
    let declared = compression::gzip_declared_len(body).unwrap_or(0);
    if declared > limit {
        return Err(ApiError::TooLarge { limit });
    }
    let Some(ledger) = ledger else { return Ok(Prepaid { charge: None, bytes: declared }) };
    if declared == 0 {
        return Ok(Prepaid { charge: None, bytes: 0 });
    }
    let bytes = declared as u64;
    let charge = wait_for_room(
        || ledger.try_admit_body_owned(bytes, recent_resident_bytes()),
        || ledger.admit_body_owned(bytes, recent_resident_bytes()),
    )
    .await
    .map_err(|e| ApiError::Node(e.into()))?;
    Ok(Prepaid { charge: Some(charge), bytes: declared })
}

/// What was charged for a body's output before it was decompressed.
struct Prepaid {
    charge: Option<OwnedAdmitted>,
    bytes: usize,
}

/// The body, gunzipped if it is gzip, with what decompressing it took beyond `prepaid`
/// charged to `ledger` (step by step, before the output grows); hold the charges until the
/// body's points are stored.
fn decoded(
    encoding: Encoding,
    body: Bytes,
    limit: usize,
    ledger: Option<Arc<Ledger>>,
    prepaid: Prepaid,
) -> Result<(Bytes, Vec<OwnedAdmitted>), ApiError> {
    if encoding == Encoding::Identity {
        return Ok((body, Vec::new()));
    }
    let Prepaid { charge, bytes: mut prepaid } = prepaid;
    let mut charges: Vec<OwnedAdmitted> = charge.into_iter().collect();
    let mut refusal = None;
    let admit = |bytes: usize| {
        // The declared size first; only output past it (a body that lied) is charged anew.
        let covered = bytes.min(prepaid);
        prepaid -= covered;
        let Some(ledger) = &ledger else { return true };
        if bytes == covered {
            return true;
        }
        match ledger.admit_body_owned((bytes - covered) as u64, recent_resident_bytes()) {
            Ok(charge) => charges.push(charge),
            Err(e) => refusal = Some(e),
        }
        refusal.is_none()
    };
    let out = compression::gunzip_within(&body, limit, admit).map_err(|e| match e {
        compression::DecompressError::TooLarge { limit } => ApiError::TooLarge { limit },
        compression::DecompressError::Refused { .. } => match refusal.take() {
            Some(e) => ApiError::Node(e.into()),
            None => ApiError::Internal("decompression was refused without a reason".into()),
        },
        other => ApiError::BadRequest(other.to_string()),
    })?;
    Ok((Bytes::from(out), charges))
}

/// Writes a decoded batch through the coordinator, split into writes within the node's limits
/// of points and series; returns the points stored and the points ingest policies refused
/// (with their reasons, as line errors).
async fn store(s: &AppState, batch: Vec<SeriesPoints>) -> Result<(u64, u64, Vec<LineError>), ApiError> {
    let limits = &s.node.config().limits;
    let (mut stored, mut rejected, mut reasons) = (0, 0, Vec::new());
    for chunk in batch::split(batch, limits.max_batch_points as usize, limits.max_batch_series as usize) {
        let outcome = s.node.coordinator().write(chunk).await?;
        stored += outcome.points;
        rejected += outcome.rejected;
        for r in outcome.rejections.into_iter().take(line_protocol::MAX_REPORTED_ERRORS.saturating_sub(reasons.len())) {
            reasons.push(LineError {
                line: 0,
                message: format!(
                    "point {}@{} of {} refused by an ingest policy: {}",
                    r.point.value, r.point.ts, r.series, r.reason
                ),
            });
        }
    }
    Ok((stored, rejected, reasons))
}

/// The answer to a write: `204`, or a partial write naming what was refused.
fn answer(
    mut errors: Vec<LineError>,
    failed: usize,
    rejected: u64,
    policy_reasons: Vec<LineError>,
) -> Result<Response, ApiError> {
    if failed == 0 && rejected == 0 {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    errors.extend(policy_reasons);
    Err(ApiError::PartialWrite(line_protocol::partial_write_message(&errors, failed + rejected as usize)))
}

/// Parses a line-protocol body and stores what it holds. `left_out`: the lines over
/// [`MAX_LINE_BYTES`] already left out as the body arrived (a gzip body's are left out here).
async fn line_protocol(
    s: &AppState,
    headers: &HeaderMap,
    body: Bytes,
    left_out: Option<LongLines>,
    precision: Precision,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let limit = s.config().max_body_bytes;
    let len = body.len();
    let now = timeshard_clock::now_ns();
    let result = async {
        let encoding = Encoding::of(headers)?;
        let ledger = s.node.coordinator().budget().cloned();
        let prepaid = match encoding {
            Encoding::Gzip => charge_inflated(&body, limit, ledger.as_ref()).await?,
            Encoding::Identity => Prepaid { charge: None, bytes: 0 },
        };
        // A compressed body's size says nothing of the work it makes: inflate it off the runtime.
        let work = if encoding == Encoding::Gzip { usize::MAX } else { len };
        let (parsed, _charges) = s
            .bulk
            .run(work, move || {
                let (body, charges) = decoded(encoding, body, limit, ledger, prepaid)?;
                let (body, left_out) = match left_out {
                    Some(lines) => (std::borrow::Cow::Borrowed(&body[..]), lines),
                    None => long_lines::without_long_lines(&body, MAX_LINE_BYTES),
                };
                let mut parsed = line_protocol::parse(&body, precision, now);
                left_out.refuse_in(&mut parsed);
                Ok::<_, ApiError>((parsed, charges))
            })
            .await??;
        let (stored, rejected, reasons) = store(s, parsed.batch).await?;
        Ok::<_, ApiError>((
            stored,
            parsed.failed_lines as u64 + rejected,
            answer(parsed.errors, parsed.failed_lines, rejected, reasons),
        ))
    }
    .await;
    let metrics = s.node.metrics();
    match result {
        Ok((stored, refused, response)) => {
            metrics.record_ingest(Ingest::LineProtocol, stored, refused, true, started.elapsed());
            response
        }
        Err(e) => {
            metrics.record_ingest(Ingest::LineProtocol, 0, 0, false, started.elapsed());
            Err(e)
        }
    }
}

fn precision(p: Option<&String>) -> Result<Precision, ApiError> {
    match p {
        None => Ok(Precision::Ns),
        Some(p) => Precision::parse(p).map_err(|e| ApiError::BadRequest(e.to_string())),
    }
}

/// `POST /write?db=...&precision=n|u|ms|s|m|h`: InfluxDB 1.x line protocol. `db` and `rp`
/// are accepted and ignored: a node has one namespace.
pub async fn influx_v1(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    left_out: Option<Extension<LeftOut>>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let params = params(q.as_deref())?;
    let precision = precision(params.get("precision"))?;
    line_protocol(&s, &headers, body, left_out.and_then(|e| e.take()), precision).await
}

/// `POST /api/v2/write?org=...&bucket=...&precision=ns|us|ms|s`: InfluxDB 2.x line protocol;
/// errors in 2.x's shape (an oversize body's too). `org` and `bucket` are accepted and ignored.
pub async fn influx_v2(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    left_out: Option<Extension<LeftOut>>,
    body: Result<Body, ApiError>,
) -> Result<Response, V2> {
    let Body(body) = body?;
    let params = params(q.as_deref())?;
    let precision = precision(params.get("precision"))?;
    Ok(line_protocol(&s, &headers, body, left_out.and_then(|e| e.take()), precision).await?)
}

/// Charges what a remote-write body may take decoded to the memory budget, from the length its
/// snappy header declares, before it is decompressed; one that could not fit even alone is
/// refused as too large.
fn charge_decoded<'a>(s: &'a AppState, body: &[u8]) -> Result<Option<crate::budget::Admitted<'a>>, ApiError> {
    let declared = compression::snappy_len(body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let Some(ledger) = s.node.coordinator().budget() else { return Ok(None) };
    let expanded = (declared as u64).saturating_mul(remote_write::DECODED_BYTES_PER_BYTE as u64);
    let share = ledger.shares().queues;
    if expanded > share {
        return Err(ApiError::DecodesTooLarge { declared, expanded, share });
    }
    let admitted =
        ledger.admit_body(expanded, crate::budget::recent_resident_bytes()).map_err(|e| ApiError::Node(e.into()))?;
    Ok(Some(admitted))
}

/// `POST /api/v1/write`: Prometheus remote write 1.0 (protobuf `WriteRequest`, snappy).
pub async fn prometheus(State(s): State<AppState>, headers: HeaderMap, Body(body): Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.contains("io.prometheus.write.v2") {
        return Err(ApiError::UnsupportedMediaType(
            "remote write 2.0 is not supported: send prometheus.WriteRequest (remote write 1.0, Prometheus' default)"
                .into(),
        ));
    }
    let limit = s.config().max_body_bytes;
    let result = async {
        let _charge = charge_decoded(&s, &body)?;
        let decoded =
            s.bulk.run(body.len(), move || remote_write::decode(&body, limit)).await?.map_err(|e| match e {
                remote_write::DecodeError::Decompress(compression::DecompressError::TooLarge { limit }) => {
                    ApiError::TooLarge { limit }
                }
                other => ApiError::BadRequest(other.to_string()),
            })?;
        let (stored, rejected, reasons) = store(&s, decoded.batch).await?;
        Ok::<_, ApiError>((
            stored,
            decoded.failed as u64 + rejected,
            answer(decoded.errors, decoded.failed, rejected, reasons),
        ))
    }
    .await;
    let metrics = s.node.metrics();
    match result {
        Ok((stored, refused, response)) => {
            metrics.record_ingest(Ingest::RemoteWrite, stored, refused, true, started.elapsed());
            response
        }
        Err(e) => {
            metrics.record_ingest(Ingest::RemoteWrite, 0, 0, false, started.elapsed());
            Err(e)
        }
    }
}

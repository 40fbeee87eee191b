//! `GET /v1/read`: a series' raw points over a range, streamed as the coordinator merges them
//! ([`Coordinator::read_stream`], the path the SDK's `read_stream` takes, packed parts and
//! all), written out batch by batch in columns ([`ColumnsWriter`]): JSON, CSV, Arrow IPC or
//! Parquet, by
//! `format=` or `Accept`. Whatever the range, the node holds a few batches of it, charged to
//! the memory budget for the answer's life.
//!
//! Errors before the first batch (a bad request, an unknown series, too few replicas) answer
//! with their status as every endpoint does. An error after the answer started cannot change
//! its status: the body is cut off, which every HTTP client reports as an incomplete answer
//! (a JSON body then also lacks its closing `count` and `next`).

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::stream;
use timeshard_formats::columns::{ColumnsFormat, ColumnsWriter, PARQUET_ROW_GROUP};
use timeshard_proto::stream::ColumnBatch;
use timeshard_proto::wire::{ErrorCode, ErrorReply};
use timeshard_proto::{Point, PointKey};

use super::AppState;
use super::api::{cursor_parse, cursor_text, params};
use super::error::ApiError;
use crate::budget::OwnedAdmitted;
use crate::coordinator::stream::{ColumnReader, STREAM_PAGE_POINTS};
use crate::metrics::{Metrics, Query};
use crate::replica::FRAMES_AHEAD;

/// Bytes a streamed answer in `format` holds at once with batches of `batch` points, charged
/// to the budget: the batches waiting in its channel and the one being written (decoded at 20
/// bytes a point, about 40 more written out), the merge's frames per owner node, and for
/// Parquet the row group being gathered.
fn answer_bytes(format: ColumnsFormat, batch: u64) -> u64 {
    let batches = (FRAMES_AHEAD as u64 + 2) * batch * 64;
    match format {
        ColumnsFormat::Parquet => batches + PARQUET_ROW_GROUP as u64 * 24,
        _ => batches,
    }
}

/// The format asked for: `format=` first, then the first type of `Accept` offered, JSON by
/// default (and for `*/*`).
fn format_asked(format: Option<&str>, headers: &HeaderMap) -> Result<ColumnsFormat, ApiError> {
    if let Some(f) = format {
        return match f.to_ascii_lowercase().as_str() {
            "json" => Ok(ColumnsFormat::Json),
            "csv" => Ok(ColumnsFormat::Csv),
            "arrow" => Ok(ColumnsFormat::Arrow),
            "parquet" => Ok(ColumnsFormat::Parquet),
            _ => Err(ApiError::BadRequest(format!("format={f:?} is not a format: json, csv, arrow or parquet"))),
        };
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    for kind in accept.split(',').map(|t| t.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()) {
        match kind.as_str() {
            "application/json" | "*/*" | "application/*" => return Ok(ColumnsFormat::Json),
            "text/csv" | "text/*" => return Ok(ColumnsFormat::Csv),
            "application/vnd.apache.arrow.stream" => return Ok(ColumnsFormat::Arrow),
            "application/vnd.apache.parquet" => return Ok(ColumnsFormat::Parquet),
            _ => {}
        }
    }
    Ok(ColumnsFormat::Json)
}

/// `GET /v1/read?series=&start=&end=[&format=json|csv|arrow|parquet][&limit=][&after=]`:
/// every raw point of `[start, end)` strictly after the cursor `after`, or the first `limit` of
/// them and, in JSON, the cursor (`next`) to continue from.
pub async fn read(State(s): State<AppState>, headers: HeaderMap, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let started = Instant::now();
    let metrics = s.node.metrics().clone();
    let opened = open(&s, &headers, q, started).await;
    match opened {
        Ok((format, answer)) => {
            let body =
                Body::from_stream(stream::unfold(answer, |mut a| async move { a.next_bytes().await.map(|n| (n, a)) }));
            let mut response = body.into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            Ok(response)
        }
        Err(e) => {
            metrics.record_query(Query::Read, false, started.elapsed());
            Err(e)
        }
    }
}

/// Checks the request, starts the read and waits for its first batch (or its error).
async fn open(
    s: &AppState,
    headers: &HeaderMap,
    q: Option<String>,
    started: Instant,
) -> Result<(ColumnsFormat, Answer), ApiError> {
    let p = params(q)?;
    let (series, range) = (p.series()?, p.range()?);
    let format = format_asked(p.get("format"), headers)?;
    let limit = p.number::<u64>("limit")?;
    if limit == Some(0) {
        return Err(ApiError::BadRequest("limit must be at least 1 (leave it out for every point)".into()));
    }
    let after = p.get("after").map(cursor_parse).transpose()?;
    let coordinator = s.node.coordinator().clone();
    // Small limits are answered from a batch their size (and one more point, to know whether
    // the range goes on).
    let batch = limit.map_or(STREAM_PAGE_POINTS as u64, |l| l.saturating_add(1).min(STREAM_PAGE_POINTS as u64));
    let charge = match coordinator.budget() {
        Some(ledger) => Some(ledger.admit_answer(answer_bytes(format, batch)).map_err(ErrorReply::from)?),
        None => None,
    };
    let mut reader = coordinator.read_columns(series.clone(), range, after, batch as usize);
    // The first batch decides the status: a read that fails at once answers with its error.
    let first = match reader.next().await {
        Some(Err(e)) => return Err(e.into()),
        first => first,
    };
    let mut head = Vec::new();
    let writer = ColumnsWriter::start(format, series.as_str(), &mut head)
        .map_err(|e| ApiError::Internal(format!("cannot start the answer: {e}")))?;
    let answer = Answer {
        reader,
        first: Some(first),
        head,
        writer: Some(writer),
        limit,
        metrics: s.node.metrics().clone(),
        started,
        completed: false,
        _charge: charge,
    };
    Ok((format, answer))
}

/// A read being written out.
struct Answer {
    reader: ColumnReader,
    /// The first message, taken to decide the status.
    first: Option<Option<Result<ColumnBatch, ErrorReply>>>,
    /// The document's head, sent with the first batch.
    head: Vec<u8>,
    /// `None` once the answer is written whole.
    writer: Option<ColumnsWriter>,
    limit: Option<u64>,
    metrics: std::sync::Arc<Metrics>,
    started: Instant,
    /// Written whole; an answer dropped before (its client gone, or cut off) counts as failed.
    completed: bool,
    _charge: Option<OwnedAdmitted>,
}

impl Answer {
    async fn message(&mut self) -> Option<Result<ColumnBatch, ErrorReply>> {
        match self.first.take() {
            Some(first) => first,
            None => self.reader.next().await,
        }
    }

    /// The next piece of the body; `None` when it is whole, an error to cut it off.
    async fn next_bytes(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let written = self.writer.as_ref()?.points();
        let mut buf = std::mem::take(&mut self.head);
        let (batch, more) = match self.message().await {
            None => (ColumnBatch::default(), false),
            Some(Ok(batch)) => (batch, true),
            Some(Err(e)) => return Some(Err(cut(e))),
        };
        let (batch, next) = match self.limit {
            Some(limit) => self.within_limit(batch, limit - written).await,
            None => (batch, None),
        };
        let mut writer = self.writer.take().expect("checked above");
        let unwritable = |e| cut(ErrorReply::new(ErrorCode::Internal, format!("cannot write the answer: {e}")));
        if let Err(e) = writer.batch(&batch, &mut buf) {
            return Some(Err(unwritable(e)));
        }
        if more && next.is_none() && self.limit.is_none_or(|l| writer.points() < l) {
            self.writer = Some(writer);
        } else {
            if let Err(e) = writer.finish(next.as_ref().map(cursor_text).as_deref(), &mut buf) {
                return Some(Err(unwritable(e)));
            }
            self.completed = true;
        }
        Some(Ok(Bytes::from(buf)))
    }

    /// `batch` cut to the `left` points the limit allows, with the cursor after the last one
    /// kept when the range goes on past it (looking at the next batch when it ends exactly).
    async fn within_limit(&mut self, mut batch: ColumnBatch, left: u64) -> (ColumnBatch, Option<PointKey>) {
        let left = left as usize;
        if batch.len() < left {
            return (batch, None);
        }
        let goes_on = batch.len() > left || self.goes_on().await;
        batch.timestamps.truncate(left);
        batch.values.truncate(left);
        batch.events.truncate(left);
        let last = batch.points().last().as_ref().map(Point::key);
        (batch, if goes_on { last } else { None })
    }

    /// Whether the read holds another point.
    async fn goes_on(&mut self) -> bool {
        loop {
            match self.message().await {
                Some(Ok(batch)) if batch.is_empty() => continue,
                Some(Ok(_)) => return true,
                // An error past the limit's last point does not touch the points answered.
                Some(Err(_)) | None => return false,
            }
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.metrics.record_query(Query::Read, self.completed, self.started.elapsed());
    }
}

/// Ends an answer that already started: the body is cut off (logged, since its status cannot
/// say it).
fn cut(e: ErrorReply) -> std::io::Error {
    tracing::warn!(error = %e.message, "a streamed read failed after its answer started");
    std::io::Error::other(e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn the_format_comes_from_the_parameter_then_accept() {
        let none = HeaderMap::new();
        assert_eq!(format_asked(None, &none).unwrap(), ColumnsFormat::Json);
        assert_eq!(format_asked(Some("CSV"), &accept("application/json")).unwrap(), ColumnsFormat::Csv);
        assert_eq!(format_asked(None, &accept("text/csv;q=0.9, application/json")).unwrap(), ColumnsFormat::Csv);
        assert_eq!(format_asked(None, &accept("application/xml, */*")).unwrap(), ColumnsFormat::Json);
        assert_eq!(format_asked(None, &accept("image/png")).unwrap(), ColumnsFormat::Json);
        assert_eq!(format_asked(Some("parquet"), &none).unwrap(), ColumnsFormat::Parquet);
        assert_eq!(format_asked(None, &accept("application/vnd.apache.parquet")).unwrap(), ColumnsFormat::Parquet);
        assert_eq!(format_asked(Some("arrow"), &none).unwrap(), ColumnsFormat::Arrow);
        assert_eq!(format_asked(None, &accept("application/vnd.apache.arrow.stream")).unwrap(), ColumnsFormat::Arrow);
        assert!(format_asked(Some("xml"), &none).is_err());
    }

    #[test]
    fn an_answer_is_charged_by_its_batches_and_parquet_by_its_row_group_too() {
        let full = answer_bytes(ColumnsFormat::Json, STREAM_PAGE_POINTS as u64);
        assert_eq!(full, 4 * 16_384 * 64, "4 MiB: 16 unlimited reads in the default queues' share");
        assert_eq!(answer_bytes(ColumnsFormat::Csv, 4), 4 * 4 * 64);
        assert_eq!(answer_bytes(ColumnsFormat::Parquet, 4), 4 * 4 * 64 + 65_536 * 24);
    }
}

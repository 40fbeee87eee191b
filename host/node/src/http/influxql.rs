//! `/query`: the InfluxQL subset (parsed by `timeshard_formats::influxql`), run against the
//! coordinator: the series each statement names are listed across the cluster (exact tags
//! pushed down), each series' windows or points are read the way the SDK reads them, and the
//! answer is built in InfluxDB's JSON shape.
//!
//! A query that does not parse, or goes beyond the subset, is refused whole with `400` and the
//! reason (`{"error": "..."}`), before anything runs; a statement that fails while running gets
//! its error in its own entry of `results`, as InfluxDB answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use timeshard_clock::now_ns;
use timeshard_formats::influxql::answer::{self, Data, SeriesData};
use timeshard_formats::influxql::time::Epoch;
use timeshard_formats::influxql::{self, Select, Statement};
use timeshard_proto::time::MAX_TIMESTAMP;
use timeshard_proto::window::Grid;
use timeshard_proto::wire::ErrorCode;
use timeshard_proto::{Point, SeriesKey, TimeRange};

use super::error::ApiError;
use super::write::params;
use super::{AppState, Body};
use crate::coordinator::stream::STREAM_PAGE_POINTS;
use crate::metrics::Query;

/// Series read at once by one statement.
const SERIES_PARALLELISM: usize = 16;

/// `GET|POST /query?q=...[&db=...][&epoch=ns|u|ms|s|m|h][&chunked=true[&chunk_size=N]]` (a
/// POST may carry the parameters as a form body, as the InfluxDB clients send them). Chunked,
/// the answer is one JSON document per line, as InfluxDB 1.x writes it ([`answer::chunked`]).
pub async fn query(
    State(s): State<AppState>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let result = run(&s, method, &headers, q, &body).await;
    s.node.metrics().record_query(Query::InfluxQl, result.is_ok(), started.elapsed());
    let (results, chunk_size) = result?;
    let Some(chunk_size) = chunk_size else { return Ok(Json(json!({"results": results})).into_response()) };
    let mut body = Vec::new();
    for doc in answer::chunked(results, chunk_size) {
        serde_json::to_writer(&mut body, &doc).map_err(|e| ApiError::Internal(e.to_string()))?;
        body.push(b'\n');
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `chunk_size` when the query asks `chunked=true` (InfluxDB's default size unless it says).
fn chunking(params: &std::collections::HashMap<String, String>) -> Result<Option<usize>, ApiError> {
    match params.get("chunked").map(String::as_str) {
        None | Some("false") => Ok(None),
        Some("true") => match params.get("chunk_size") {
            None => Ok(Some(answer::DEFAULT_CHUNK_SIZE)),
            Some(n) => match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(ApiError::BadRequest(format!("chunk_size={n:?} is not a positive number of rows"))),
            },
        },
        Some(other) => Err(ApiError::BadRequest(format!("chunked={other:?}: use true or false"))),
    }
}

async fn run(
    s: &AppState,
    method: Method,
    headers: &HeaderMap,
    q: Option<String>,
    body: &[u8],
) -> Result<(Vec<Value>, Option<usize>), ApiError> {
    let mut params = params(q.as_deref())?;
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    if method == Method::POST && form {
        params.extend(super::write::params(Some(&String::from_utf8_lossy(body)))?);
    }
    let text = params.get("q").ok_or_else(|| ApiError::BadRequest("missing parameter q: the InfluxQL query".into()))?;
    let epoch = Epoch::parse(params.get("epoch").map(String::as_str)).map_err(ApiError::BadRequest)?;
    let chunk_size = chunking(&params)?;
    let statements = influxql::parse(text, now_ns()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut results = Vec::with_capacity(statements.len());
    for (id, statement) in statements.iter().enumerate() {
        let outcome = match statement {
            Statement::Select(select) => run_select(s, select, epoch).await,
            other => run_show(s, other).await,
        };
        results.push(answer::statement(id, outcome.map_err(|e| e.to_string())));
    }
    Ok((results, chunk_size))
}

/// Most series a statement may read, and which setting says so.
#[derive(Clone, Copy, Debug)]
enum SeriesCap {
    /// `[http] max_query_series`.
    Series(usize),
    /// An aggregate's `windows` each: `[http] max_query_windows` over them, `series` at most.
    Windows { windows: u64, series: usize },
}

impl SeriesCap {
    fn most(self) -> usize {
        match self {
            SeriesCap::Series(n) | SeriesCap::Windows { series: n, .. } => n,
        }
    }

    fn exceeded(self, s: &AppState) -> ApiError {
        match self {
            SeriesCap::Series(max) => ApiError::BadRequest(format!(
                "more than {max} series match ([http] max_query_series); narrow the statement with tags in WHERE"
            )),
            SeriesCap::Windows { windows, series } => {
                let max = s.config().max_query_windows;
                ApiError::BadRequest(format!(
                    "the statement asks for {windows} windows x more than {series} series, more than {max} aggregates \
                     ([http] max_query_windows): use wider windows in GROUP BY time(), a shorter range, or fewer series"
                ))
            }
        }
    }
}

/// The series cap of `select` over `range`: for an aggregate, its windows are counted first
/// and `[http] max_query_windows` over them bounds the series listed, so a statement asking
/// for too many windows is refused after listing a few series, not the whole dictionary.
fn series_cap(s: &AppState, select: &Select, range: TimeRange) -> Result<SeriesCap, ApiError> {
    let max_series = s.config().max_query_series;
    // Without GROUP BY time(), one window covering the range.
    let (true, Some(width)) = (select.aggregates(), select.interval) else { return Ok(SeriesCap::Series(max_series)) };
    let windows =
        timeshard_proto::window::check_windows(&range, Grid::epoch(width)).map_err(ApiError::BadRequest)?.max(1);
    let by_windows = usize::try_from(s.config().max_query_windows as u64 / windows).unwrap_or(usize::MAX);
    if by_windows >= max_series {
        return Ok(SeriesCap::Series(max_series));
    }
    let cap = SeriesCap::Windows { windows, series: by_windows };
    if by_windows == 0 {
        return Err(cap.exceeded(s));
    }
    Ok(cap)
}

async fn list(
    s: &AppState,
    filter: timeshard_proto::wire::SeriesFilter,
    cap: SeriesCap,
) -> Result<Vec<SeriesKey>, ApiError> {
    let max = cap.most();
    let limit = u32::try_from(max + 1).unwrap_or(u32::MAX).min(s.node.config().limits.max_page_points);
    let (series, more) = s.node.coordinator().list_series(filter, limit).await?;
    if more || series.len() > max {
        return Err(cap.exceeded(s));
    }
    Ok(series)
}

async fn run_show(s: &AppState, statement: &Statement) -> Result<Vec<Value>, ApiError> {
    let listed = match statement.listing() {
        Some(filter) => list(s, filter, SeriesCap::Series(s.config().max_query_series)).await?,
        None => Vec::new(),
    };
    Ok(answer::show(statement, &listed))
}

async fn run_select(s: &AppState, select: &Select, epoch: Epoch) -> Result<Vec<Value>, ApiError> {
    let range =
        TimeRange::new(select.start, select.end.min(MAX_TIMESTAMP)).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let cap = series_cap(s, select, range)?;
    let mut targets: Vec<(SeriesKey, String)> = Vec::new();
    for (field, metric) in select.fields() {
        for key in list(s, select.filter(&metric), cap).await? {
            if select.matches(&key, &metric) {
                targets.push((key, field.clone()));
            }
        }
    }
    if targets.len() > cap.most() {
        return Err(cap.exceeded(s));
    }
    // Raw points read by every series together, so the bound holds while reading, not after.
    let read_points = &AtomicUsize::new(0);
    let reads = targets.into_iter().map(|(key, field)| async move {
        let data = read_series(s, select, &key, range, read_points).await?;
        Ok::<_, ApiError>(SeriesData { key, field, data })
    });
    let data: Vec<SeriesData> = futures::stream::iter(reads)
        .buffer_unordered(SERIES_PARALLELISM)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    if !select.aggregates() {
        let points: usize = data.iter().map(|d| if let Data::Points(p) = &d.data { p.len() } else { 0 }).sum();
        if points > s.config().max_query_points {
            return Err(too_many_points(s));
        }
    }
    Ok(answer::select(select, data, epoch))
}

fn too_many_points(s: &AppState) -> ApiError {
    ApiError::BadRequest(format!(
        "the statement reads more than {} raw points ([http] max_query_points): narrow the time range, add LIMIT, or \
         aggregate with GROUP BY time()",
        s.config().max_query_points
    ))
}

/// One series' windows (aggregates) or points (raw) for `select`; raw points read count
/// against `read_points`, shared by the statement's series.
async fn read_series(
    s: &AppState,
    select: &Select,
    key: &SeriesKey,
    range: TimeRange,
    read_points: &AtomicUsize,
) -> Result<Data, ApiError> {
    let coordinator = s.node.coordinator();
    let empty_if_unknown =
        |e: timeshard_proto::wire::ErrorReply| if e.code == ErrorCode::UnknownSeries { Ok(()) } else { Err(e) };
    if select.aggregates() {
        // Without GROUP BY time(), one window covering the range (at most two, merged).
        let width = select.interval.unwrap_or_else(|| range.len_ns());
        return match coordinator.aggregate(key.clone(), range, Grid::epoch(width)).await {
            Ok(w) => Ok(Data::Windows(w)),
            Err(e) => empty_if_unknown(e).map(|()| Data::Windows(Vec::new())).map_err(ApiError::from),
        };
    }
    // The newest point: found from the newest quanta backwards, not by reading the range.
    if select.descending && select.limit == Some(1) && select.offset == 0 {
        return match coordinator.latest(key.clone(), range.end()).await {
            Ok(p) => Ok(Data::Points(p.filter(|p| p.ts >= range.start()).into_iter().collect())),
            Err(e) => empty_if_unknown(e).map(|()| Data::Points(Vec::new())).map_err(ApiError::from),
        };
    }
    let budget = s.config().max_query_points;
    // Ascending with a LIMIT needs no more than that many points of each series.
    let wanted = match (select.descending, select.limit) {
        (false, Some(limit)) => (select.offset + limit).min(budget),
        _ => budget,
    };
    // The streamed read, stopped (dropped) once it gave one point more than wanted.
    let batch = (wanted + 1).min(STREAM_PAGE_POINTS as usize);
    let mut reader = coordinator.read_columns(key.clone(), range, None, batch);
    let mut points: Vec<Point> = Vec::new();
    while let Some(batch) = reader.next().await {
        match batch {
            Ok(batch) => {
                let before = read_points.fetch_add(batch.len(), Ordering::Relaxed);
                if before + batch.len() > budget {
                    return Err(too_many_points(s));
                }
                points.extend(batch.points());
                if points.len() > wanted {
                    break;
                }
            }
            Err(e) => {
                empty_if_unknown(e)?;
                break;
            }
        }
    }
    points.truncate(wanted);
    Ok(Data::Points(points))
}

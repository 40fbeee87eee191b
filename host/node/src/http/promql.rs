//! Prometheus' query API (`/api/v1/query`, `query_range`, `series`, `labels`,
//! `label/<name>/values`, `metadata`) and remote read (`POST /api/v1/read`), over the
//! coordinator, for Grafana's Prometheus data source and for a Prometheus with `remote_read`.
//!
//! The language, the evaluator and the answers are `timeshard_formats::promql`'s, sans I/O. This
//! module does the I/O: it asks the parsed query what it will read
//! ([`promql::data_needed`]: each selector's matchers and time span), lists the matching series
//! across the cluster (the metric name and exact labels pushed down, the other matchers checked
//! here on the decoded labels), reads their points the way the SDK reads them into a
//! [`MemorySource`], and evaluates against that on a blocking thread. When every selector is an
//! instant vector selector with the same offset ([`promql::last_samples`]), it reads instead
//! the last point of each window ending at a step, computed by the owners next to the data
//! (window aggregates on a [`Grid`] whose windows end at the steps): the same answer, from one
//! point per step and series.
//!
//! Bounds: a selector matches at most `[http] max_query_series` series, and one query reads at
//! most `[http] max_query_points` points over all its series (past either, Prometheus' error of
//! type `execution`); the evaluator's own limits (query size, depth, regex size, points per
//! series, points answered) are [`promql::Limits`]' defaults. Names map as
//! `timeshard_formats::names` says: a series written by remote write or line protocol is found
//! by the same metric and labels. Timestamps are milliseconds; points of one series in one
//! millisecond (several events, or nanosecond times) answer as the last of them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::extract::{FromRequest, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use timeshard_clock::now_ns;
use timeshard_formats::names;
use timeshard_formats::promql::api::{self, Answer};
use timeshard_formats::promql::eval::Options;
use timeshard_formats::promql::matcher::{matches_all, metric_name};
use timeshard_formats::promql::source::{SelectedSeries, SeriesId, Source, SourceError};
use timeshard_formats::promql::{self, EvalError, Labels, LastSamples, Limits, MatchOp, Matcher, MemorySource, Sample};
use timeshard_formats::remote_read::{self, ReadLimits, ResponseType};
use timeshard_proto::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};
use timeshard_proto::window::{Grid, check_windows};
use timeshard_proto::wire::{ErrorCode, SeriesFilter};
use timeshard_proto::{Point, SeriesKey, TimeRange};

use super::{AppState, Body};
use crate::coordinator::stream::STREAM_PAGE_POINTS;
use crate::metrics::Query;

/// Series read at once by one query.
const SERIES_PARALLELISM: usize = 16;
const NS_PER_MS: i64 = 1_000_000;

/// The evaluator's limits on this node: the defaults, with `[http]`'s series bound.
fn limits(s: &AppState) -> Limits {
    Limits { max_series: s.config().max_query_series, ..Limits::default() }
}

/// The parameters of a GET's query string, and of a POST's form body as Prometheus' clients
/// send them, in order, repeats (`match[]`) kept.
fn params(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> Result<Vec<(String, String)>, Answer> {
    let bad = |e: serde_urlencoded::de::Error| {
        Answer::error(&api::ApiError::bad_data(format!("cannot read the parameters: {e}")))
    };
    let mut out: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or_default()).map_err(bad)?;
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    if *method == Method::POST && form {
        out.extend(serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).map_err(bad)?);
    }
    Ok(out)
}

/// The parameters of a Prometheus API request ([`params`]), or the answer to give when they
/// cannot be read.
#[derive(Debug)]
pub struct PromParams(Result<Vec<(String, String)>, Answer>);

impl FromRequest<AppState> for PromParams {
    type Rejection = Response;
    async fn from_request(req: Request, state: &AppState) -> Result<PromParams, Response> {
        let (method, headers) = (req.method().clone(), req.headers().clone());
        let query = req.uri().query().map(str::to_owned);
        let Body(body) = Body::from_request(req, state).await.map_err(IntoResponse::into_response)?;
        Ok(PromParams(params(&method, &headers, query.as_deref(), &body)))
    }
}

fn json(answer: Answer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], answer.body).into_response()
}

fn failed(e: EvalError) -> Answer {
    Answer::error(&api::ApiError::from(e))
}

/// The series of the cluster whose labels satisfy `matchers`, at most `max` (more is
/// [`SourceError::TooManySeries`]). The metric name and labels matched exactly are pushed down
/// to the owners' dictionaries; the rest are checked here.
async fn list_matching(s: &AppState, matchers: &[Matcher], max: usize) -> Result<Vec<(SeriesKey, Labels)>, EvalError> {
    let metric = metric_name(matchers).map(|m| names::encode_name(m).into_owned());
    let tags = matchers
        .iter()
        .filter(|m| m.op == MatchOp::Equal && m.name != promql::METRIC_NAME && !m.value.is_empty())
        .map(|m| (names::encode_name(&m.name).into_owned(), names::encode_name(&m.value).into_owned()))
        .collect();
    let filter = SeriesFilter { metric_prefix: metric.clone().unwrap_or_default(), tags };
    let limit = u32::try_from(max + 1).unwrap_or(u32::MAX).min(s.node.config().limits.max_page_points);
    let (keys, more) = s
        .node
        .coordinator()
        .list_series(filter, limit)
        .await
        .map_err(|e| EvalError::Source(SourceError::Failed(e.to_string())))?;
    let too_many = || {
        let selector: Vec<String> = matchers.iter().map(|m| m.to_string()).collect();
        EvalError::Source(SourceError::TooManySeries { selector: format!("{{{}}}", selector.join(", ")), limit: max })
    };
    if more {
        return Err(too_many());
    }
    let mut out = Vec::new();
    for key in keys {
        if metric.as_deref().is_some_and(|m| key.metric() != m) {
            continue;
        }
        let labels = Labels::from_key(&key);
        if matches_all(matchers, &labels) {
            if out.len() == max {
                return Err(too_many());
            }
            out.push((key, labels));
        }
    }
    Ok(out)
}

/// One series' samples with `start_ms <= t <= end_ms`, one per millisecond (the last point of
/// each); the points read count against `read`, shared by the whole query, up to `max`.
async fn samples(
    s: &AppState,
    key: &SeriesKey,
    start_ms: i64,
    end_ms: i64,
    read: &AtomicUsize,
    max: usize,
) -> Result<Vec<Sample>, EvalError> {
    let Some(range) = ms_range(start_ms, end_ms) else { return Ok(Vec::new()) };
    let mut out: Vec<Sample> = Vec::new();
    let mut reader = s.node.coordinator().read_columns(key.clone(), range, None, STREAM_PAGE_POINTS as usize);
    while let Some(batch) = reader.next().await {
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) if e.code == ErrorCode::UnknownSeries => break,
            Err(e) => return Err(EvalError::Source(SourceError::Failed(e.to_string()))),
        };
        if read.fetch_add(batch.len(), Ordering::Relaxed) + batch.len() > max {
            return Err(too_many_points(max));
        }
        push_points(&mut out, batch.points());
    }
    Ok(out)
}

/// The last sample of each of `windows` within `start_ms..=end_ms` of one series, computed by
/// the owners; the windows count against `read` as points would, up to `max`.
async fn last_samples(
    s: &AppState,
    key: &SeriesKey,
    (start_ms, end_ms): (i64, i64),
    grid: Grid,
    read: &AtomicUsize,
    max: usize,
) -> Result<Vec<Sample>, EvalError> {
    let Some(range) = ms_range(start_ms, end_ms) else { return Ok(Vec::new()) };
    let windows = match s.node.coordinator().aggregate(key.clone(), range, grid).await {
        Ok(windows) => windows,
        Err(e) if e.code == ErrorCode::UnknownSeries => return Ok(Vec::new()),
        Err(e) => return Err(EvalError::Source(SourceError::Failed(e.to_string()))),
    };
    if read.fetch_add(windows.len(), Ordering::Relaxed) + windows.len() > max {
        return Err(too_many_points(max));
    }
    // Windows end on millisecond boundaries, so a window's last point is also the last of its
    // millisecond, as `push_points` keeps it.
    Ok(windows
        .iter()
        .filter(|w| w.count > 0)
        .map(|w| Sample { t: w.last_ts.div_euclid(NS_PER_MS), v: w.last })
        .collect())
}

/// The grid of `windows` in nanoseconds, if it makes few enough windows over `start_ms..=end_ms`.
fn grid_of(windows: LastSamples, (start_ms, end_ms): (i64, i64)) -> Option<Grid> {
    let width_ns = windows.width_ms.checked_mul(NS_PER_MS)?;
    let origin = (i128::from(windows.boundary_ms) * i128::from(NS_PER_MS)).rem_euclid(i128::from(width_ns));
    let grid = Grid::new(width_ns, i64::try_from(origin).ok()?);
    check_windows(&ms_range(start_ms, end_ms)?, grid).ok().map(|_| grid)
}

/// `start_ms..=end_ms` in nanoseconds, within the timestamps a store holds.
fn ms_range(start_ms: i64, end_ms: i64) -> Option<TimeRange> {
    let start = start_ms.saturating_mul(NS_PER_MS).clamp(MIN_TIMESTAMP, MAX_TIMESTAMP);
    let end = end_ms.saturating_mul(NS_PER_MS).saturating_add(NS_PER_MS - 1).clamp(MIN_TIMESTAMP, MAX_TIMESTAMP);
    TimeRange::new(start, end).ok()
}

fn too_many_points(max: usize) -> EvalError {
    EvalError::Execution(format!(
        "the query reads more than {max} points ([http] max_query_points): narrow the time range or the selectors"
    ))
}

/// Appends points (sorted by time) as samples in milliseconds, the last point of a millisecond
/// standing for it.
fn push_points(out: &mut Vec<Sample>, points: impl IntoIterator<Item = Point>) {
    for p in points {
        let t = p.ts.div_euclid(NS_PER_MS);
        match out.last_mut() {
            Some(last) if last.t == t => last.v = p.value,
            _ => out.push(Sample { t, v: p.value }),
        }
    }
}

/// Reads what the selectors need: the series each matches, each over the union of the spans
/// asked of it; with `windows`, only the last point of each.
async fn fetch(
    s: &AppState,
    needs: &[(Vec<Matcher>, i64, i64)],
    windows: Option<LastSamples>,
    limits: &Limits,
) -> Result<MemorySource, EvalError> {
    let mut spans: HashMap<SeriesKey, (Labels, i64, i64)> = HashMap::new();
    for (matchers, start, end) in needs {
        for (key, labels) in list_matching(s, matchers, limits.max_series).await? {
            let span = spans.entry(key).or_insert((labels, *start, *end));
            span.1 = span.1.min(*start);
            span.2 = span.2.max(*end);
        }
    }
    let read = &AtomicUsize::new(0);
    let max = s.config().max_query_points;
    let reads = spans.into_iter().map(|(key, (labels, start, end))| async move {
        let samples = match windows.and_then(|w| grid_of(w, (start, end))) {
            Some(grid) => last_samples(s, &key, (start, end), grid, read, max).await?,
            None => samples(s, &key, start, end, read, max).await?,
        };
        Ok::<_, EvalError>((labels, samples))
    });
    let mut source = MemorySource::new();
    let mut results = futures::stream::iter(reads).buffer_unordered(SERIES_PARALLELISM);
    while let Some(result) = results.next().await {
        let (labels, samples) = result?;
        source.insert(labels, samples);
    }
    Ok(source)
}

/// Parses `query`, reads what it needs over `range`, and answers with `answer` (run on a
/// blocking thread under one of the bulk permits: evaluation is CPU work).
async fn evaluate(
    s: &AppState,
    query: &str,
    range: promql::Range,
    answer: impl FnOnce(&MemorySource, &Limits) -> Answer + Send + 'static,
) -> Answer {
    let limits = limits(s);
    let expr = match promql::parse(query, &limits) {
        Ok(e) => e,
        Err(e) => return Answer::error(&api::ApiError::bad_data(e.to_string())),
    };
    let needs: Vec<(Vec<Matcher>, i64, i64)> = promql::data_needed(&expr, range, Options::default().lookback_ms)
        .into_iter()
        .map(|(selector, start, end)| (selector.matchers.clone(), start, end))
        .collect();
    let windows = promql::last_samples(&expr, range, Options::default().lookback_ms);
    let source = match fetch(s, &needs, windows, &limits).await {
        Ok(source) => source,
        Err(e) => return failed(e),
    };
    // Under a bulk permit, as large bodies are decoded: a flood of heavy queries waits for one
    // instead of taking every core from the async threads.
    s.bulk
        .run(usize::MAX, move || answer(&source, &limits))
        .await
        .unwrap_or_else(|e| Answer::error(&api::ApiError::bad_data(format!("the query failed: {e}"))))
}

/// The query endpoints: reads the parameters, `range_of` checks them and gives the query and
/// its range, then `answer` evaluates over what the query reads.
async fn run_query(
    s: AppState,
    params: PromParams,
    range_of: impl FnOnce(&[(String, String)], &Limits) -> Result<(String, promql::Range, Option<i64>), api::ApiError>,
    answer: impl FnOnce(&[(String, String)], &MemorySource, &Limits) -> Answer + Send + 'static,
) -> Response {
    let started = Instant::now();
    let result = match params.0 {
        Err(a) => a,
        Ok(params) => match range_of(&params, &limits(&s)) {
            Err(e) => Answer::error(&e),
            Ok((query, range, _)) => {
                evaluate(&s, &query, range, move |source, limits| answer(&params, source, limits)).await
            }
        },
    };
    s.node.metrics().record_query(Query::PromQl, result.status == 200, started.elapsed());
    json(result)
}

/// `GET|POST /api/v1/query`.
pub async fn query(State(s): State<AppState>, params: PromParams) -> Response {
    let now_ms = now_ns().div_euclid(NS_PER_MS);
    run_query(
        s,
        params,
        |params, _| api::instant_params(params, now_ms),
        move |params, source, limits| api::query(params, now_ms, source, limits, Options::default()),
    )
    .await
}

/// `GET|POST /api/v1/query_range`.
pub async fn query_range(State(s): State<AppState>, params: PromParams) -> Response {
    run_query(s, params, api::range_params, |params, source, limits| {
        api::query_range(params, source, limits, Options::default())
    })
    .await
}

/// The series dictionary as a [`Source`] for the label endpoints: the series listed for their
/// `match[]` selectors, with no samples. The dictionary is not indexed by time, so `start`
/// and `end` do not narrow the answer.
struct Listed(Vec<Labels>);

impl Source for Listed {
    fn select(
        &self,
        matchers: &[Matcher],
        _start_ms: i64,
        _end_ms: i64,
        limit: usize,
    ) -> Result<Vec<SelectedSeries>, SourceError> {
        let found: Vec<SelectedSeries> = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, labels)| matches_all(matchers, labels))
            .map(|(i, labels)| SelectedSeries { id: SeriesId(i as u64), labels: labels.clone() })
            .collect();
        if found.len() > limit {
            return Err(SourceError::TooManySeries { selector: "match[]".into(), limit });
        }
        Ok(found)
    }

    fn samples(&self, _: &SelectedSeries, _: i64, _: i64, _: &mut Vec<Sample>) -> Result<(), SourceError> {
        Ok(())
    }
}

/// Lists the series of every `match[]` selector (every series when there is none).
async fn listed(s: &AppState, params: &[(String, String)], limits: &Limits) -> Result<Listed, Answer> {
    let mut sets = Vec::new();
    for m in params.iter().filter(|(n, _)| n == "match[]").map(|(_, v)| v) {
        match promql::parse(m, limits) {
            Ok(promql::Expr::Selector(selector)) => sets.push(selector.matchers),
            Ok(_) => {
                return Err(Answer::error(&api::ApiError::bad_data(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                ))));
            }
            Err(e) => return Err(Answer::error(&api::ApiError::bad_data(e.to_string()))),
        }
    }
    if sets.is_empty() {
        sets.push(Vec::new());
    }
    let mut all: BTreeMap<SeriesKey, Labels> = BTreeMap::new();
    for matchers in sets {
        all.extend(list_matching(s, &matchers, limits.max_series).await.map_err(failed)?);
    }
    Ok(Listed(all.into_values().collect()))
}

/// The label endpoints: `answer` over the listed series.
async fn labelled(
    s: AppState,
    params: PromParams,
    answer: impl FnOnce(&[(String, String)], &Listed, &Limits) -> Answer,
) -> Response {
    let started = Instant::now();
    let limits = limits(&s);
    let result = match params.0 {
        Err(a) => a,
        Ok(params) => match listed(&s, &params, &limits).await {
            Ok(listed) => answer(&params, &listed, &limits),
            Err(a) => a,
        },
    };
    s.node.metrics().record_query(Query::Series, result.status == 200, started.elapsed());
    json(result)
}

/// `GET|POST /api/v1/series`.
pub async fn series(State(s): State<AppState>, params: PromParams) -> Response {
    labelled(s, params, |p, source, limits| api::series(p, source, limits)).await
}

/// `GET|POST /api/v1/labels`.
pub async fn labels(State(s): State<AppState>, params: PromParams) -> Response {
    labelled(s, params, |p, source, limits| api::label_names(p, source, limits)).await
}

/// `GET /api/v1/label/<name>/values`.
pub async fn label_values(State(s): State<AppState>, Path(name): Path<String>, params: PromParams) -> Response {
    labelled(s, params, move |p, source, limits| api::label_values(&name, p, source, limits)).await
}

/// `GET /api/v1/metadata`: timeshard keeps no metric metadata (remote write's is not stored),
/// so the answer is empty, as Prometheus answers for metrics it has none for.
pub async fn metadata(RawQuery(q): RawQuery) -> Response {
    let params: Vec<(String, String)> =
        serde_urlencoded::from_str(q.as_deref().unwrap_or_default()).unwrap_or_default();
    json(api::metadata(&params, &BTreeMap::new()))
}

/// `POST /api/v1/read`: Prometheus remote read. Answers with samples, or with streamed XOR
/// chunks when the client accepts them (Prometheus does).
pub async fn remote_read(State(s): State<AppState>, Body(body): Body) -> Response {
    let started = Instant::now();
    let response = read(&s, &body).await;
    s.node.metrics().record_query(Query::PromQl, response.status().is_success(), started.elapsed());
    response
}

/// The series of `source` that hold samples, borrowed (not copied).
fn with_samples(source: &MemorySource) -> Vec<(&Labels, &[Sample])> {
    source.iter().filter(|(_, samples)| !samples.is_empty()).collect()
}

async fn read(s: &AppState, body: &[u8]) -> Response {
    let text = |status: StatusCode, message: String| (status, message).into_response();
    let limits = limits(s);
    let request = match remote_read::decode_request(body, &ReadLimits::default()) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("cannot read the remote-read request: {e}")),
    };
    let mut results = Vec::with_capacity(request.queries.len());
    for q in &request.queries {
        // Raw samples: the remote reader evaluates over them itself.
        let needs = [(q.matchers.clone(), q.start_ms, q.end_ms)];
        match fetch(s, &needs, None, &limits).await {
            Ok(source) => results.push(source),
            Err(e) => {
                let status = match api::ApiError::from(e.clone()).kind.status() {
                    400 => StatusCode::BAD_REQUEST,
                    _ => StatusCode::UNPROCESSABLE_ENTITY,
                };
                return text(status, e.to_string());
            }
        }
    }
    match request.response {
        ResponseType::Samples => {
            let body = remote_read::sampled_response(results.iter().map(with_samples));
            let headers = [
                (header::CONTENT_TYPE, HeaderValue::from_static(remote_read::SAMPLED_CONTENT_TYPE)),
                (header::CONTENT_ENCODING, HeaderValue::from_static("snappy")),
            ];
            (StatusCode::OK, headers, body).into_response()
        }
        ResponseType::StreamedXorChunks => {
            let mut out = Vec::new();
            for (i, source) in results.iter().enumerate() {
                let mut encoder = remote_read::StreamEncoder::new(i, remote_read::DEFAULT_FRAME_BYTES);
                for (labels, samples) in with_samples(source) {
                    if let Some(frame) = encoder.push(labels, samples) {
                        out.extend_from_slice(&frame);
                    }
                }
                if let Some(frame) = encoder.finish() {
                    out.extend_from_slice(&frame);
                }
            }
            let headers = [(header::CONTENT_TYPE, HeaderValue::from_static(remote_read::STREAMED_CONTENT_TYPE))];
            (StatusCode::OK, headers, out).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_in_one_millisecond_answer_as_the_last() {
        let mut out = Vec::new();
        let points = [Point::new(1_000_000, 1.0), Point::new(1_500_000, 2.0), Point::new(2_000_000, 3.0)];
        push_points(&mut out, points);
        assert_eq!(out, vec![Sample { t: 1, v: 2.0 }, Sample { t: 2, v: 3.0 }]);
        // Before the epoch, a millisecond still holds the nanoseconds after it.
        let mut out = Vec::new();
        push_points(&mut out, [Point::new(-1, 5.0)]);
        assert_eq!(out, vec![Sample { t: -1, v: 5.0 }]);
    }

    #[test]
    fn the_dictionary_source_selects_by_every_matcher_within_the_limit() {
        let key = |s: &str| Labels::from_key(&s.parse::<SeriesKey>().unwrap());
        let listed = Listed(vec![key("up{job=a}"), key("up{job=b}"), key("temp{site=atl}")]);
        let job = Matcher::new("job", MatchOp::Regex, "a|b", 1 << 20).unwrap();
        assert_eq!(listed.select(std::slice::from_ref(&job), 0, 0, 10).unwrap().len(), 2);
        assert!(matches!(listed.select(&[job], 0, 0, 1), Err(SourceError::TooManySeries { limit: 1, .. })));
        assert_eq!(listed.select(&[], 0, 0, 10).unwrap().len(), 3);
    }
}

//! The JSON API under `/v1/`: window aggregates, the latest point, series listing
//! and policy queries, each a thin layer over the coordinator (the same calls the SDK makes).
//!
//! Times are nanoseconds since the epoch, RFC 3339 (`2023-11-14T22:13:20Z`), `now`, or
//! `now-<duration>` or `now+<duration>` (`now-15m`; units ns, u, ms, s, m, h, d, w). Values that JSON cannot hold
//! (NaN, infinities) are written as strings, as `timeshard get --format json` writes them.

use std::time::Instant;

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};
use timeshard_clock::now_ns;
use timeshard_formats::influxql::time::{parse_api_time, parse_duration};
use timeshard_proto::time::MAX_TIMESTAMP;
use timeshard_proto::window::Grid;
use timeshard_proto::wire::{self, SeriesFilter};
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};

use super::AppState;
use super::error::ApiError;
use crate::metrics::Query;

/// Series a listing answers when it does not say.
const DEFAULT_SERIES_LIMIT: u32 = 1_000;

/// Parses a time as the API accepts it ([`parse_api_time`]).
pub fn parse_time(s: &str) -> Result<i64, ApiError> {
    parse_api_time(s, now_ns()).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "cannot read time {:?}: use nanoseconds since the epoch, RFC 3339 (2023-11-14T22:13:20Z), now, or now-15m",
            s.trim()
        ))
    })
}

/// The parameters of a request, in order, repeats kept.
fn pairs(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_str(query.unwrap_or_default())
        .map_err(|e| ApiError::BadRequest(format!("cannot read the query parameters: {e}")))
}

pub(super) struct Params(Vec<(String, String)>);

impl Params {
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name).ok_or_else(|| ApiError::BadRequest(format!("missing parameter {name}")))
    }

    pub(super) fn series(&self) -> Result<SeriesKey, ApiError> {
        let (series, _) =
            wire::check_read(self.required("series")?, 0, 1).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        Ok(series)
    }

    pub(super) fn range(&self) -> Result<TimeRange, ApiError> {
        let start = parse_time(self.required("start")?)?;
        let end = parse_time(self.required("end")?)?;
        TimeRange::new(start, end).map_err(|e| ApiError::BadRequest(e.to_string()))
    }

    pub(super) fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|v| v.parse().map_err(|_| ApiError::BadRequest(format!("parameter {name}={v:?} is not a number"))))
            .transpose()
    }
}

pub(super) fn params(q: Option<String>) -> Result<Params, ApiError> {
    pairs(q.as_deref()).map(Params)
}

/// A number as JSON: non-finite values as strings.
pub fn number(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { json!(v.to_string()) }
}

fn point(p: &Point) -> Value {
    json!({"ts": p.ts, "value": number(p.value), "event": p.event})
}

pub(super) fn cursor_text(k: &PointKey) -> String {
    format!("{}.{}.{}", k.ts, k.event, k.value_bits)
}

pub(super) fn cursor_parse(s: &str) -> Result<PointKey, ApiError> {
    let mut parts = s.split('.').map(str::parse::<u64>);
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(Ok(ts)), Some(Ok(event)), Some(Ok(value_bits)), None) => {
            Ok(PointKey { ts: ts as i64, event, value_bits })
        }
        _ => Err(ApiError::BadRequest(format!("parameter after={s:?} is not a cursor this API returned"))),
    }
}

/// Runs a query handler, counting it.
async fn counted<F>(s: &AppState, kind: Query, work: F) -> Result<Json<Value>, ApiError>
where
    F: Future<Output = Result<Value, ApiError>>,
{
    let started = Instant::now();
    let result = work.await;
    s.node.metrics().record_query(kind, result.is_ok(), started.elapsed());
    result.map(Json)
}

/// `GET /v1/windows?series=&start=&end=&width=`: count, min, max, mean, sum, first and last in
/// windows of `width` (a duration: `1m`, or nanoseconds) aligned to the epoch.
pub async fn windows(State(s): State<AppState>, RawQuery(q): RawQuery) -> Result<Json<Value>, ApiError> {
    counted(&s, Query::Aggregate, async {
        let p = params(q)?;
        let (series, range) = (p.series()?, p.range()?);
        let width = p.required("width")?;
        let width_ns = width.parse::<i64>().ok().or_else(|| parse_duration(width)).ok_or_else(|| {
            ApiError::BadRequest(format!("width={width:?} is not a duration (e.g. 1m) or nanoseconds"))
        })?;
        let (series, range) = wire::check_aggregate(series.as_str(), range.start(), range.end(), width_ns)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let windows = s.node.coordinator().aggregate(series.clone(), range, Grid::epoch(width_ns)).await?;
        let rows: Vec<Value> = windows
            .iter()
            .map(|w| {
                json!({"start": w.start, "end": w.end, "count": w.count, "min": number(w.min), "max": number(w.max),
                    "mean": number(w.mean()), "sum": number(w.sum), "first": number(w.first), "first_ts": w.first_ts,
                    "last": number(w.last), "last_ts": w.last_ts})
            })
            .collect();
        Ok(json!({"series": series.as_str(), "width_ns": width_ns, "windows": rows}))
    })
    .await
}

/// `GET /v1/latest?series=[&before=]`: the newest point (before `before`, default: any time).
pub async fn latest(State(s): State<AppState>, RawQuery(q): RawQuery) -> Result<Json<Value>, ApiError> {
    counted(&s, Query::Latest, async {
        let p = params(q)?;
        let series = p.series()?;
        let before = p.get("before").map(parse_time).transpose()?.unwrap_or(MAX_TIMESTAMP);
        let found = s.node.coordinator().latest(series.clone(), before).await?;
        Ok(json!({"series": series.as_str(), "point": found.as_ref().map(point)}))
    })
    .await
}

/// `GET /v1/series[?metric=<prefix>][&tag=<name>=<value>...][&limit=]`: the cluster's series.
pub async fn series(State(s): State<AppState>, RawQuery(q): RawQuery) -> Result<Json<Value>, ApiError> {
    counted(&s, Query::Series, async {
        let p = params(q)?;
        let mut filter =
            SeriesFilter { metric_prefix: p.get("metric").unwrap_or_default().to_string(), tags: Vec::new() };
        for (_, tag) in p.0.iter().filter(|(k, _)| k == "tag") {
            let (k, v) =
                tag.split_once('=').ok_or_else(|| ApiError::BadRequest(format!("tag={tag:?} is not name=value")))?;
            filter.tags.push((k.to_string(), v.to_string()));
        }
        let max = s.node.config().limits.max_page_points;
        let limit = p.number::<u32>("limit")?.unwrap_or(DEFAULT_SERIES_LIMIT);
        if limit == 0 || limit > max {
            return Err(ApiError::BadRequest(format!("limit must be between 1 and {max}")));
        }
        let (series, more) = s.node.coordinator().list_series(filter, limit).await?;
        Ok(json!({"series": series.iter().map(SeriesKey::as_str).collect::<Vec<_>>(), "more": more}))
    })
    .await
}

/// `GET /v1/query?series=&start=&end=&policy=[&param.<name>=<value>...]`: a query policy,
/// pushed down to the nodes that hold the range.
pub async fn policy_query(State(s): State<AppState>, RawQuery(q): RawQuery) -> Result<Json<Value>, ApiError> {
    counted(&s, Query::Policy, async {
        let p = params(q)?;
        let (series, range) = (p.series()?, p.range()?);
        let policy = p.required("policy")?.to_string();
        let params: Vec<(String, String)> =
            p.0.iter().filter_map(|(k, v)| k.strip_prefix("param.").map(|k| (k.to_string(), v.clone()))).collect();
        if params.len() > wire::MAX_QUERY_PARAMS {
            return Err(ApiError::BadRequest(format!("at most {} parameters", wire::MAX_QUERY_PARAMS)));
        }
        let out = s.node.coordinator().query(series.clone(), range, policy, params).await?;
        let values: serde_json::Map<String, Value> = out.values.iter().map(|(k, v)| (k.clone(), number(*v))).collect();
        Ok(json!({"series": series.as_str(), "policy": out.policy, "version": out.version, "values": values,
            "points": out.points}))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_cursors_read_back() {
        assert_eq!(parse_time("1700000000000000000").unwrap(), 1_700_000_000_000_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000_000_000_000);
        let ago = parse_time("now").unwrap() - parse_time("now-1h").unwrap();
        assert!((3_599_000_000_000..=3_600_000_000_000).contains(&ago), "{ago}");
        assert!(parse_time("tomorrow").unwrap_err().to_string().contains("RFC 3339"));
        let k = PointKey { ts: 5, event: 2, value_bits: 1.5f64.to_bits() };
        assert_eq!(cursor_parse(&cursor_text(&k)).unwrap(), k);
        assert!(cursor_parse("1.2").is_err());
    }
}

//! Prometheus' HTTP API, sans I/O: request parameters in (the query string and form body as
//! name/value pairs), `{"status": ..., "data": ...}` JSON out, with its error types and status
//! codes and its number formatting (`"+Inf"`, `"NaN"`, Go's shortest `'f'` formatting, `'e'`
//! below 1e-6 and from 1e21).
//!
//! Covers `/api/v1/query`, `/api/v1/query_range`, `/api/v1/series`, `/api/v1/labels`,
//! `/api/v1/label/<name>/values` and `/api/v1/metadata`. Each endpoint is one function taking
//! the parameters and a [`Source`] and giving an [`Answer`] (status code and body), so the
//! node's handlers only move bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::eval::{self, EvalError, Options, QueryValue, Range, Series};
use super::labels::Labels;
use super::source::{Source, SourceError};
use super::{Limits, parse};

/// Prometheus' `errorType`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    BadData,
    Execution,
    Timeout,
    Canceled,
    Internal,
    Unavailable,
    NotFound,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::BadData => "bad_data",
            ErrorType::Execution => "execution",
            ErrorType::Timeout => "timeout",
            ErrorType::Canceled => "canceled",
            ErrorType::Internal => "internal",
            ErrorType::Unavailable => "unavailable",
            ErrorType::NotFound => "not_found",
        }
    }

    /// The HTTP status Prometheus answers with.
    pub fn status(self) -> u16 {
        match self {
            ErrorType::BadData => 400,
            ErrorType::Execution => 422,
            ErrorType::Timeout | ErrorType::Canceled | ErrorType::Unavailable => 503,
            ErrorType::Internal => 500,
            ErrorType::NotFound => 404,
        }
    }
}

/// An API error: its type and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ApiError {
    pub kind: ErrorType,
    pub message: String,
}

impl ApiError {
    pub fn bad_data(message: impl Into<String>) -> ApiError {
        ApiError { kind: ErrorType::BadData, message: message.into() }
    }

    fn invalid_param(name: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::bad_data(format!("invalid parameter {name:?}: {message}"))
    }
}

impl From<EvalError> for ApiError {
    fn from(e: EvalError) -> ApiError {
        let kind = match &e {
            EvalError::BadData(_) | EvalError::TooManyPoints { .. } => ErrorType::BadData,
            EvalError::Execution(_) | EvalError::TooManySamples { .. } => ErrorType::Execution,
            EvalError::Timeout | EvalError::Source(SourceError::Timeout) => ErrorType::Timeout,
            EvalError::Source(SourceError::Canceled) => ErrorType::Canceled,
            EvalError::Source(SourceError::TooManySeries { .. }) => ErrorType::Execution,
            EvalError::Source(SourceError::Failed(_)) => ErrorType::Unavailable,
        };
        ApiError { kind, message: e.to_string() }
    }
}

/// An HTTP answer: status code and JSON body (`application/json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    fn ok(data_json: &str) -> Answer {
        Answer { status: 200, body: format!(r#"{{"status":"success","data":{data_json}}}"#) }
    }

    pub fn error(e: &ApiError) -> Answer {
        let mut body = String::from(r#"{"status":"error","errorType":"#);
        json_str(&mut body, e.kind.as_str());
        body.push_str(r#","error":"#);
        json_str(&mut body, &e.message);
        body.push('}');
        Answer { status: e.kind.status(), body }
    }

    fn from_result(r: Result<String, ApiError>) -> Answer {
        match r {
            Ok(data) => Answer::ok(&data),
            Err(e) => Answer::error(&e),
        }
    }
}

/// Earliest and latest times the label endpoints default to (far enough from the i64 ends for
/// any offset arithmetic).
pub const MIN_TIME_MS: i64 = i64::MIN / 4;
pub const MAX_TIME_MS: i64 = i64::MAX / 4;

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

fn params_all<'a>(params: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    params.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
}

/// A time parameter: Unix seconds with a fraction, or RFC 3339. In milliseconds.
pub fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(t) = s.parse::<f64>()
        && !s.eq_ignore_ascii_case("nan")
        && !s.to_ascii_lowercase().contains("inf")
    {
        let secs = t.trunc();
        let ms = secs * 1000.0 + ((t - secs) * 1000.0).round();
        if ms.is_finite() && ms.abs() < MAX_TIME_MS as f64 {
            return Ok(ms as i64);
        }
        return Err(format!("cannot parse {s:?} to a valid timestamp"));
    }
    rfc3339_ms(s).ok_or_else(|| format!("cannot parse {s:?} to a valid timestamp"))
}

/// A duration parameter: seconds with a fraction, or a Prometheus duration (`1m30s`). In
/// milliseconds.
pub fn parse_duration(s: &str) -> Result<i64, String> {
    if let Ok(d) = s.parse::<f64>() {
        let ms = d * 1000.0;
        if !ms.is_finite() || ms.abs() >= 9.2e15 {
            return Err(format!("cannot parse {s:?} to a valid duration. It overflows int64"));
        }
        return Ok(ms as i64);
    }
    super::lexer::parse_duration(s).ok_or_else(|| format!("cannot parse {s:?} to a valid duration"))
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` to milliseconds.
fn rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes().all(|c| c.is_ascii_digit()).then(|| t.parse().ok())?
    };
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = &s[start..i.min(start + 3)];
        frac_ms = digits.parse::<i64>().ok()? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_min = match &s[i..] {
        "Z" | "z" => 0,
        rest if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) && rest.as_bytes()[3] == b':' => {
            let oh: i64 = rest[1..3].parse().ok()?;
            let om: i64 = rest[4..6].parse().ok()?;
            let m = oh * 60 + om;
            if rest.starts_with('-') { -m } else { m }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (yy, mm) = if mo <= 2 { (y - 1, mo + 9) } else { (y, mo - 3) };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * mm + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60) * 1000) + frac_ms)
}

/// A sample value as Prometheus writes it.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    let abs = v.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go's 'e' format: the exponent signed and at least two digits.
        let s = format!("{v:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    format!("{v}")
}

/// A timestamp in seconds as Prometheus writes it: `1700000000`, `1700000000.5`, `1.05`.
pub fn format_timestamp(ms: i64, out: &mut String) {
    let (sign, ms) = if ms < 0 { ("-", ms.unsigned_abs()) } else { ("", ms as u64) };
    let _ = write!(out, "{sign}{}", ms / 1000);
    let frac = ms % 1000;
    if frac != 0 {
        let _ = write!(out, ".{frac:03}");
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

fn labels_json(out: &mut String, l: &Labels) {
    out.push('{');
    for (i, (n, v)) in l.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(out, n);
        out.push(':');
        json_str(out, v);
    }
    out.push('}');
}

fn point_json(out: &mut String, t: i64, v: &str) {
    out.push('[');
    format_timestamp(t, out);
    out.push_str(",\"");
    out.push_str(v);
    out.push_str("\"]");
}

fn series_json(out: &mut String, series: &[Series], instant: bool) {
    out.push('[');
    for (i, s) in series.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"metric\":");
        labels_json(out, &s.labels);
        if instant {
            out.push_str(",\"value\":");
            if let Some(p) = s.samples.first() {
                point_json(out, p.t, &format_value(p.v));
            }
        } else {
            out.push_str(",\"values\":[");
            for (j, p) in s.samples.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                point_json(out, p.t, &format_value(p.v));
            }
            out.push(']');
        }
        out.push('}');
    }
    out.push(']');
}

/// The `data` of a query answer: `{"resultType": ..., "result": ...}`.
pub fn query_data_json(value: &QueryValue) -> String {
    let mut out = String::from("{\"resultType\":");
    json_str(&mut out, value.value_type().result_type());
    out.push_str(",\"result\":");
    match value {
        QueryValue::Scalar(s) => point_json(&mut out, s.t, &format_value(s.v)),
        QueryValue::String { t, value } => {
            let quoted = serde_json::Value::from(value.as_str()).to_string();
            point_json(&mut out, *t, &quoted[1..quoted.len() - 1]);
        }
        QueryValue::Vector(s) => series_json(&mut out, s, true),
        QueryValue::Matrix(s) => series_json(&mut out, s, false),
    }
    out.push('}');
    out
}

/// Parses and evaluates a query, errors mapped to the API's.
pub fn run(
    query: &str,
    range: Range,
    source: &dyn Source,
    limits: &Limits,
    options: Options<'_>,
) -> Result<QueryValue, ApiError> {
    let expr = parse(query, limits).map_err(|e| ApiError::bad_data(e.to_string()))?;
    Ok(eval::evaluate(&expr, range, source, limits, options)?)
}

/// The parameters of `/api/v1/query`: the query, its time (default `now_ms`) and timeout.
pub fn instant_params(params: &[(String, String)], now_ms: i64) -> Result<(String, Range, Option<i64>), ApiError> {
    let query = param(params, "query").ok_or_else(|| ApiError::invalid_param("query", "the query is missing"))?;
    let t = match param(params, "time") {
        Some(t) => parse_time(t).map_err(|e| ApiError::invalid_param("time", e))?,
        None => now_ms,
    };
    Ok((query.to_string(), Range::instant(t), timeout(params)?))
}

/// The parameters of `/api/v1/query_range`, checked as Prometheus checks them.
pub fn range_params(params: &[(String, String)], limits: &Limits) -> Result<(String, Range, Option<i64>), ApiError> {
    let query = param(params, "query").ok_or_else(|| ApiError::invalid_param("query", "the query is missing"))?;
    let get = |name: &str| param(params, name).ok_or_else(|| ApiError::invalid_param(name, "it is missing"));
    let start = parse_time(get("start")?).map_err(|e| ApiError::invalid_param("start", e))?;
    let end = parse_time(get("end")?).map_err(|e| ApiError::invalid_param("end", e))?;
    if end < start {
        return Err(ApiError::invalid_param("end", "end timestamp must not be before start time"));
    }
    let step = parse_duration(get("step")?).map_err(|e| ApiError::invalid_param("step", e))?;
    if step <= 0 {
        return Err(ApiError::invalid_param(
            "step",
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        ));
    }
    if (end - start) / step > limits.max_points_per_series as i64 {
        return Err(ApiError::bad_data(format!(
            "exceeded maximum resolution of {} points per timeseries. Try decreasing the query resolution (?step=XX)",
            group_thousands(limits.max_points_per_series)
        )));
    }
    Ok((query.to_string(), Range { start_ms: start, end_ms: end, step_ms: step }, timeout(params)?))
}

fn group_thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn timeout(params: &[(String, String)]) -> Result<Option<i64>, ApiError> {
    param(params, "timeout").map(|t| parse_duration(t).map_err(|e| ApiError::invalid_param("timeout", e))).transpose()
}

/// `/api/v1/query`.
pub fn query(
    params: &[(String, String)],
    now_ms: i64,
    source: &dyn Source,
    limits: &Limits,
    options: Options<'_>,
) -> Answer {
    Answer::from_result(
        instant_params(params, now_ms)
            .and_then(|(q, range, _)| run(&q, range, source, limits, options))
            .map(|v| query_data_json(&v)),
    )
}

/// `/api/v1/query_range`.
pub fn query_range(params: &[(String, String)], source: &dyn Source, limits: &Limits, options: Options<'_>) -> Answer {
    Answer::from_result(
        range_params(params, limits)
            .and_then(|(q, range, _)| run(&q, range, source, limits, options))
            .map(|v| query_data_json(&v)),
    )
}

/// The `match[]` selectors and time range of the series and label endpoints.
fn selection(
    params: &[(String, String)],
    limits: &Limits,
    required: bool,
) -> Result<(Vec<Vec<super::Matcher>>, i64, i64), ApiError> {
    let mut sets = Vec::new();
    for m in params_all(params, "match[]") {
        let e = parse(m, limits).map_err(|e| ApiError::bad_data(e.to_string()))?;
        match e {
            super::Expr::Selector(s) => sets.push(s.matchers),
            _ => {
                return Err(ApiError::bad_data(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                )));
            }
        }
    }
    if required && sets.is_empty() {
        return Err(ApiError::bad_data("no match[] parameter provided"));
    }
    let t = |name: &str, default: i64| {
        param(params, name).map_or(Ok(default), |v| parse_time(v).map_err(|e| ApiError::invalid_param(name, e)))
    };
    Ok((sets, t("start", MIN_TIME_MS)?, t("end", MAX_TIME_MS)?))
}

fn selected_labels(
    params: &[(String, String)],
    source: &dyn Source,
    limits: &Limits,
    required: bool,
) -> Result<BTreeSet<Labels>, ApiError> {
    let (sets, start, end) = selection(params, limits, required)?;
    let sets = if sets.is_empty() { vec![Vec::new()] } else { sets };
    let mut out = BTreeSet::new();
    for matchers in sets {
        for s in source.select(&matchers, start, end, limits.max_series).map_err(EvalError::from)? {
            out.insert(s.labels);
            if out.len() > limits.max_series {
                return Err(EvalError::Source(SourceError::TooManySeries {
                    selector: "match[]".into(),
                    limit: limits.max_series,
                })
                .into());
            }
        }
    }
    Ok(out)
}

fn string_list_json(items: impl IntoIterator<Item = String>) -> String {
    let mut out = String::from("[");
    for (i, s) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(&mut out, &s);
    }
    out.push(']');
    out
}

/// `/api/v1/series`: the label sets of the series matching any `match[]`.
pub fn series(params: &[(String, String)], source: &dyn Source, limits: &Limits) -> Answer {
    Answer::from_result(selected_labels(params, source, limits, true).map(|set| {
        let mut out = String::from("[");
        for (i, l) in set.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            labels_json(&mut out, l);
        }
        out.push(']');
        out
    }))
}

/// `/api/v1/labels`: the label names of the matching series (all series without `match[]`).
pub fn label_names(params: &[(String, String)], source: &dyn Source, limits: &Limits) -> Answer {
    Answer::from_result(selected_labels(params, source, limits, false).map(|set| {
        let names: BTreeSet<String> = set.iter().flat_map(|l| l.iter().map(|(n, _)| n.to_string())).collect();
        string_list_json(names)
    }))
}

/// `/api/v1/label/<name>/values`.
pub fn label_values(name: &str, params: &[(String, String)], source: &dyn Source, limits: &Limits) -> Answer {
    let valid = !name.is_empty()
        && name.bytes().enumerate().all(|(i, c)| c == b'_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    if !valid {
        return Answer::error(&ApiError::bad_data(format!("invalid label name: {name:?}")));
    }
    Answer::from_result(selected_labels(params, source, limits, false).map(|set| {
        let values: BTreeSet<String> = set.iter().filter_map(|l| l.get(name).map(str::to_string)).collect();
        string_list_json(values)
    }))
}

/// What Prometheus knows of a metric (`# TYPE`, `# HELP`, `# UNIT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub kind: String,
    pub help: String,
    pub unit: String,
}

/// `/api/v1/metadata` (`metric=` filters, `limit=` bounds the metrics listed).
pub fn metadata(params: &[(String, String)], known: &BTreeMap<String, Vec<Metadata>>) -> Answer {
    let limit = match param(params, "limit").map(str::parse::<i64>) {
        None => None,
        Some(Ok(n)) if n >= 0 => Some(n as usize),
        Some(_) => return Answer::error(&ApiError::bad_data("limit must be a number")),
    };
    let metric = param(params, "metric");
    let mut out = String::from("{");
    let entries =
        known.iter().filter(|(m, _)| metric.is_none_or(|x| x == m.as_str())).take(limit.unwrap_or(usize::MAX));
    for (i, (m, list)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(&mut out, m);
        out.push_str(":[");
        for (j, md) in list.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str("{\"type\":");
            json_str(&mut out, &md.kind);
            out.push_str(",\"help\":");
            json_str(&mut out, &md.help);
            out.push_str(",\"unit\":");
            json_str(&mut out, &md.unit);
            out.push('}');
        }
        out.push(']');
    }
    out.push('}');
    Answer::ok(&out)
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;

//! The three guest calls (`process`, `summarize`, `merge`): what goes in, bounded, and what
//! comes out, checked. Inputs over the limits are refused before the guest runs; outputs over
//! them fail the call with `OutputTooLarge`, strings coming out are truncated.

use std::sync::Arc;

use timeshard_proto::time::check_timestamp;
use timeshard_proto::{Point, SeriesKey, TimeRange};

use crate::bindings::types as wit;
use crate::engine::{CallLimits, Pre, Runtime};
use crate::host_log::truncate;
use crate::types::MAX_PARTIAL_NUMBERS;
use crate::{IngestOutcome, NamedValue, Params, Partial, PolicyError, PolicyRef, QueryResult, Rejection};

/// A loaded policy: what [`Runtime::load`] made of a module, with its settings.
pub(crate) struct Loaded {
    pub(crate) id: PolicyRef,
    /// `name@version`, shared with every call's store for log lines and errors.
    pub(crate) label: Arc<str>,
    pub(crate) pre: Pre,
    pub(crate) limits: CallLimits,
    pub(crate) config: Vec<wit::Setting>,
    pub(crate) on_failure: crate::OnFailure,
}

/// Points as the guest sees them: columns.
fn to_columns(points: &[Point]) -> wit::Points {
    wit::Points {
        ts: points.iter().map(|p| p.ts).collect(),
        value: points.iter().map(|p| p.value).collect(),
        event: points.iter().map(|p| p.event).collect(),
    }
}

/// The longest column: how many points a guest tried to return.
fn columns_len(cols: &wit::Points) -> usize {
    cols.ts.len().max(cols.value.len()).max(cols.event.len())
}

/// Columns from a guest, checked: equal lengths, valid timestamps.
fn from_columns(policy: &Loaded, what: &str, cols: wit::Points) -> Result<Vec<Point>, PolicyError> {
    let n = cols.ts.len();
    if cols.value.len() != n || cols.event.len() != n {
        return Err(bad_output(
            policy,
            format!(
                "{what} have columns of different lengths: {} timestamps, {} values, {} event ids",
                n,
                cols.value.len(),
                cols.event.len()
            ),
        ));
    }
    if let Some(ts) = cols.ts.iter().find(|&&ts| check_timestamp(ts).is_err()) {
        return Err(bad_output(policy, format!("{what} include timestamp {ts}, outside the accepted range")));
    }
    Ok((0..n).map(|i| Point { ts: cols.ts[i], value: cols.value[i], event: cols.event[i] }).collect())
}

fn series_to_wit(series: &SeriesKey) -> wit::Series {
    wit::Series {
        key: series.as_str().to_string(),
        metric: series.metric().to_string(),
        tags: series
            .tags()
            .map(|(name, value)| wit::Setting { name: name.to_string(), value: value.to_string() })
            .collect(),
    }
}

fn range_to_wit(r: &TimeRange) -> wit::TimeRange {
    wit::TimeRange { start: r.start(), end: r.end() }
}

/// Settings or parameters as the guest sees them, bounded.
pub(crate) fn settings_to_wit(
    what: &'static str,
    params: &Params,
    runtime: &Runtime,
) -> Result<Vec<wit::Setting>, PolicyError> {
    let limits = &runtime.limits;
    if params.len() > limits.max_settings {
        return Err(PolicyError::InputTooLarge { what, got: params.len() as u64, limit: limits.max_settings as u64 });
    }
    params
        .iter()
        .map(|(name, value)| {
            let len = name.len().max(value.len());
            if len > limits.max_string_bytes {
                return Err(PolicyError::InputTooLarge {
                    what: "bytes in a setting's name or value",
                    got: len as u64,
                    limit: limits.max_string_bytes as u64,
                });
            }
            Ok(wit::Setting { name: name.clone(), value: value.clone() })
        })
        .collect()
}

fn too_many(policy: &Loaded, what: &'static str, got: usize, limit: usize) -> PolicyError {
    PolicyError::OutputTooLarge { policy: policy.id.to_string(), what, got: got as u64, limit: limit as u64 }
}

fn bad_output(policy: &Loaded, reason: String) -> PolicyError {
    PolicyError::BadOutput { policy: policy.id.to_string(), reason }
}

fn guest_error(runtime: &Runtime, policy: &Loaded, message: String) -> PolicyError {
    PolicyError::Guest { policy: policy.id.to_string(), message: truncate(message, runtime.limits.max_string_bytes) }
}

/// Runs an ingest policy over one batch.
pub(crate) fn ingest(
    runtime: &Runtime,
    policy: &Loaded,
    series: &SeriesKey,
    points: &[Point],
) -> Result<IngestOutcome, PolicyError> {
    let Pre::Ingest(pre) = &policy.pre else {
        return Err(PolicyError::Config(format!("{} is a query policy, bound as an ingest policy", policy.id)));
    };
    let limit = runtime.limits.max_batch_points;
    if points.len() > limit {
        return Err(PolicyError::InputTooLarge {
            what: "points in one ingest batch",
            got: points.len() as u64,
            limit: limit as u64,
        });
    }
    let batch = to_columns(points);
    let series = series_to_wit(series);
    let out = runtime.run(&policy.label, policy.limits, |store| {
        let instance = pre.instantiate(&mut *store)?;
        instance.timeshard_policy_ingest().call_process(store, &series, &policy.config, &batch)
    })?;
    let out = out.map_err(|m| guest_error(runtime, policy, m))?;

    // No more points out than in, no more rejections than points, every index in range.
    let kept = columns_len(&out.keep);
    if kept > points.len() {
        return Err(too_many(policy, "points to keep", kept, points.len()));
    }
    if out.rejected.len() > points.len() {
        return Err(too_many(policy, "rejections", out.rejected.len(), points.len()));
    }
    let keep = from_columns(policy, "points to keep", out.keep)?;
    let mut rejected = Vec::with_capacity(out.rejected.len());
    for r in out.rejected {
        let Some(point) = points.get(r.index as usize) else {
            return Err(bad_output(
                policy,
                format!("a rejection names point {} of a batch of {}", r.index, points.len()),
            ));
        };
        rejected.push(Rejection { point: *point, reason: truncate(r.reason, runtime.limits.max_string_bytes) });
    }
    Ok(IngestOutcome { keep, rejected, policy: Some(policy.id.clone()), passed_through: None })
}

/// Runs a query policy's `summarize` over the points of one quantum (`range` is the part of
/// the queried range inside it), split into pieces of at most `max_summarize_points`.
pub(crate) fn summarize(
    runtime: &Runtime,
    policy: &Loaded,
    series: &SeriesKey,
    range: TimeRange,
    points: &[Point],
    params: &Params,
) -> Result<Vec<Partial>, PolicyError> {
    let Pre::Query(pre) = &policy.pre else {
        return Err(PolicyError::Config(format!("{} is an ingest policy, not a query policy", policy.id)));
    };
    if let Some(p) = points.iter().find(|p| !range.contains(p.ts)) {
        return Err(PolicyError::Config(format!("point at {} is outside the summarized range {range:?}", p.ts)));
    }
    let mut sorted;
    let points = if points.is_sorted() {
        points
    } else {
        sorted = points.to_vec();
        sorted.sort_unstable();
        &sorted[..]
    };
    let params = settings_to_wit("query parameters", params, runtime)?;
    let series = series_to_wit(series);
    let mut partials = Vec::new();
    for (piece, piece_range) in pieces(points, range, runtime.limits.max_summarize_points)? {
        let batch = to_columns(piece);
        let wit_range = range_to_wit(&piece_range);
        let out = runtime.run(&policy.label, policy.limits, |store| {
            let instance = pre.instantiate(&mut *store)?;
            instance.timeshard_policy_query().call_summarize(store, &series, wit_range, &params, &batch)
        })?;
        let out = out.map_err(|m| guest_error(runtime, policy, m))?;
        if (out.range.start, out.range.end) != (wit_range.start, wit_range.end) {
            return Err(bad_output(
                policy,
                format!(
                    "the partial covers [{}, {}) instead of the range it was given, {piece_range:?}",
                    out.range.start, out.range.end
                ),
            ));
        }
        if out.numbers.len() > MAX_PARTIAL_NUMBERS {
            return Err(too_many(policy, "numbers in a partial", out.numbers.len(), MAX_PARTIAL_NUMBERS));
        }
        let got = columns_len(&out.points);
        if got > piece.len() + 2 {
            return Err(too_many(policy, "points in a partial", got, piece.len() + 2));
        }
        let points = from_columns(policy, "partial points", out.points)?;
        partials.push(Partial { policy: policy.id.clone(), range: piece_range, numbers: out.numbers, points });
    }
    Ok(partials)
}

/// Splits sorted `points` in `range` into consecutive pieces of at most `max` points, each
/// with the sub-range it covers. A split never separates points with the same timestamp, so
/// the sub-ranges are disjoint and cover `range`.
fn pieces(points: &[Point], range: TimeRange, max: usize) -> Result<Vec<(&[Point], TimeRange)>, PolicyError> {
    let max = max.max(1);
    let mut out = Vec::new();
    let (mut rest, mut start) = (points, range.start());
    while rest.len() > max {
        let mut cut = max;
        while cut < rest.len() && rest[cut].ts == rest[cut - 1].ts {
            cut += 1;
        }
        if cut == rest.len() {
            break;
        }
        let end = rest[cut].ts;
        let sub =
            TimeRange::new(start, end).map_err(|e| PolicyError::Config(format!("cannot split the range: {e}")))?;
        out.push((&rest[..cut], sub));
        rest = &rest[cut..];
        start = end;
    }
    let sub =
        TimeRange::new(start, range.end()).map_err(|e| PolicyError::Config(format!("cannot split the range: {e}")))?;
    out.push((rest, sub));
    Ok(out)
}

/// Runs a query policy's `merge` over partials from the owners.
pub(crate) fn merge(
    runtime: &Runtime,
    policy: &Loaded,
    mut partials: Vec<Partial>,
    params: &Params,
) -> Result<QueryResult, PolicyError> {
    let Pre::Query(pre) = &policy.pre else {
        return Err(PolicyError::Config(format!("{} is an ingest policy, not a query policy", policy.id)));
    };
    let limits = &runtime.limits;
    if partials.len() > limits.max_partials {
        return Err(PolicyError::InputTooLarge {
            what: "partials in one merge",
            got: partials.len() as u64,
            limit: limits.max_partials as u64,
        });
    }
    let total: usize = partials.iter().map(|p| p.points.len()).sum();
    if total > limits.max_merge_points {
        return Err(PolicyError::InputTooLarge {
            what: "points carried by the partials of one merge",
            got: total as u64,
            limit: limits.max_merge_points as u64,
        });
    }
    let bad = |reason: String| PolicyError::BadPartials { policy: policy.id.to_string(), reason };
    if let Some(p) = partials.iter().find(|p| p.numbers.len() > MAX_PARTIAL_NUMBERS) {
        return Err(bad(format!(
            "a partial carries {} numbers; at most {MAX_PARTIAL_NUMBERS} are accepted",
            p.numbers.len()
        )));
    }
    partials.sort_by_key(|p| (p.range.start(), p.range.end()));
    if let Some(w) = partials.windows(2).find(|w| w[0].range.end() > w[1].range.start()) {
        return Err(bad(format!(
            "partials for {:?} and {:?} overlap: each piece of the range must be summarized once",
            w[0].range, w[1].range
        )));
    }
    let params = settings_to_wit("query parameters", params, runtime)?;
    let wit_partials: Vec<wit::Partial> = partials
        .iter()
        .map(|p| wit::Partial {
            range: range_to_wit(&p.range),
            numbers: p.numbers.clone(),
            points: to_columns(&p.points),
        })
        .collect();
    let out = runtime.run(&policy.label, policy.limits, |store| {
        let instance = pre.instantiate(&mut *store)?;
        instance.timeshard_policy_query().call_merge(store, &params, &wit_partials)
    })?;
    let out = out.map_err(|m| guest_error(runtime, policy, m))?;
    if out.values.len() > MAX_PARTIAL_NUMBERS {
        return Err(too_many(policy, "values in a result", out.values.len(), MAX_PARTIAL_NUMBERS));
    }
    let got = columns_len(&out.points);
    if got > total {
        return Err(too_many(policy, "points in a result", got, total));
    }
    let points = from_columns(policy, "result points", out.points)?;
    Ok(QueryResult {
        policy: policy.id.clone(),
        values: out
            .values
            .into_iter()
            .map(|v| NamedValue { name: truncate(v.name, limits.max_string_bytes), value: v.value })
            .collect(),
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(ts: &[i64]) -> Vec<Point> {
        ts.iter().map(|&t| Point::new(t, 0.0)).collect()
    }

    #[test]
    fn pieces_tile_the_range_without_splitting_a_timestamp() {
        let range = TimeRange::new(0, 100).unwrap();
        let points = pts(&[1, 2, 2, 2, 5, 6, 7, 9]);
        let parts = pieces(&points, range, 2).unwrap();
        assert_eq!(parts.first().unwrap().1.start(), 0);
        assert_eq!(parts.last().unwrap().1.end(), 100);
        for w in parts.windows(2) {
            assert_eq!(w[0].1.end(), w[1].1.start());
        }
        assert_eq!(parts.iter().map(|(p, _)| p.len()).sum::<usize>(), points.len());
        for (piece, r) in &parts {
            assert!(piece.iter().all(|p| r.contains(p.ts)), "{r:?}");
        }
        // The three points at ts 2 stay together.
        assert_eq!(parts[0].0.len(), 4);
        // Everything at one timestamp cannot be split: one piece.
        assert_eq!(pieces(&pts(&[3, 3, 3, 3]), range, 2).unwrap().len(), 1);
        assert_eq!(pieces(&[], range, 2).unwrap().len(), 1);
    }
}

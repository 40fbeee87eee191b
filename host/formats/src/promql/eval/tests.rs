//! The evaluator's tests over a [`MemorySource`]: Prometheus' lookback, staleness, offsets,
//! name dropping, matching rules, and the limits.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::promql::source::{MemorySource, STALE_NAN_BITS};
use crate::promql::{Limits, parse};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_pairs(pairs.iter().copied())
}

/// `up{job=a|b}` every 15 s from 0 to 600 s; `a` goes stale at 300 s and comes back at 420 s.
fn source() -> MemorySource {
    let mut m = MemorySource::new();
    let stale = f64::from_bits(STALE_NAN_BITS);
    m.insert(
        labels(&[("__name__", "up"), ("job", "a")]),
        (0..=40)
            .filter(|i| !(21..28).contains(i))
            .map(|i| Sample { t: i * 15_000, v: if i == 20 { stale } else { i as f64 } }),
    );
    m.insert(
        labels(&[("__name__", "up"), ("job", "b")]),
        (0..=40).map(|i| Sample { t: i * 15_000, v: 100.0 + i as f64 }),
    );
    m.insert(labels(&[("__name__", "lonely")]), [Sample { t: 0, v: 7.0 }]);
    m
}

fn run(q: &str, range: Range) -> Result<QueryValue, EvalError> {
    let e = parse(q, &Limits::default()).unwrap_or_else(|e| panic!("{q}: {e}"));
    evaluate(&e, range, &source(), &Limits::default(), Options::default())
}

fn instant(q: &str, t_ms: i64) -> Vec<(Labels, f64)> {
    match run(q, Range::instant(t_ms)).unwrap_or_else(|e| panic!("{q}: {e}")) {
        QueryValue::Vector(v) => v.into_iter().map(|s| (s.labels, s.samples[0].v)).collect(),
        other => panic!("{q}: {other:?}"),
    }
}

#[test]
fn lookback_and_staleness() {
    // At 250 s the latest samples are at 240 s.
    assert_eq!(instant("up", 250_000).len(), 2);
    // `lonely` was written at 0 and is visible for 5 minutes, both ends included.
    assert_eq!(instant("lonely", 300_000), vec![(labels(&[("__name__", "lonely")]), 7.0)]);
    assert!(instant("lonely", 300_001).is_empty());
    // At 310 s the latest sample of `a` is the staleness marker: `a` is gone, without waiting
    // for the lookback.
    assert_eq!(instant("up", 310_000).iter().map(|x| x.0.value("job").to_string()).collect::<Vec<_>>(), vec!["b"]);
    // offset looks back: at 610 s, offset 5m reads 310 s.
    assert_eq!(instant("up offset 5m", 610_000).len(), 1);
}

#[test]
fn functions_drop_the_name_except_last_over_time() {
    let r = instant("rate(up{job=\"b\"}[1m])", 600_000);
    assert_eq!(r, vec![(labels(&[("job", "b")]), 1.0 / 15.0)]);
    let r = instant("last_over_time(up{job=\"b\"}[1m])", 600_000);
    assert_eq!(r[0].0.name(), Some("up"));
    let r = instant("up{job=\"b\"} > 130", 600_000);
    assert_eq!(r[0].0.name(), Some("up"), "a filtering comparison keeps the name");
    let r = instant("up{job=\"b\"} > bool 130", 600_000);
    assert_eq!(r, vec![(labels(&[("job", "b")]), 1.0)]);
    let r = instant("-up{job=\"b\"}", 600_000);
    assert_eq!(r, vec![(labels(&[("job", "b")]), -140.0)]);
    // Found by the oracle: Prometheus 2.x keeps the name through atan2.
    let r = instant("up{job=\"b\"} atan2 2", 600_000);
    assert_eq!(r[0].0.name(), Some("up"));
    let r = instant("1 < up{job=\"b\"}", 600_000);
    assert_eq!(r[0].1, 140.0, "the vector's value, though on the right");
}

#[test]
fn range_queries_give_sorted_matrices_on_the_step_grid() {
    let range = Range { start_ms: 240_000, end_ms: 480_000, step_ms: 60_000 };
    let QueryValue::Matrix(m) = run("up", range).unwrap() else { panic!() };
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].labels.value("job"), "a");
    // `a`: 240 s yes, 300 s is the marker (gone), 360 s gone, 420 s and 480 s back.
    assert_eq!(m[0].samples.iter().map(|s| s.t).collect::<Vec<_>>(), vec![240_000, 420_000, 480_000]);
    let QueryValue::Matrix(m) = run("time()", range).unwrap() else { panic!() };
    assert_eq!(m[0].samples[1], Sample { t: 300_000, v: 300.0 });
    assert!(matches!(run("up[1m]", range), Err(EvalError::BadData(m)) if m.contains("for range query")));
}

#[test]
fn aggregations_group_by_and_without() {
    let r = instant("sum(up)", 600_000);
    assert_eq!(r, vec![(Labels::new(), 40.0 + 140.0)]);
    let r = instant("max by (job) (up)", 600_000);
    assert_eq!(r.len(), 2);
    let r = instant("count without (job) (up)", 600_000);
    assert_eq!(r, vec![(Labels::new(), 2.0)], "without drops the name too");
    let r = instant("topk(1, up)", 600_000);
    assert_eq!(r, vec![(labels(&[("__name__", "up"), ("job", "b")]), 140.0)], "topk keeps labels");
    let r = instant("quantile(0.5, up)", 600_000);
    assert_eq!(r[0].1, 90.0);
    let r = instant("avg(up)", 600_000);
    assert_eq!(r[0].1, 90.0);
}

#[test]
fn vector_matching_rules_and_errors() {
    let r = instant("up - on(job) up", 600_000);
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|(l, v)| *v == 0.0 && l.name().is_none()));
    let e = run("up + on() up", Range::instant(600_000)).unwrap_err();
    assert!(e.to_string().contains("found duplicate series for the match group {} on the right hand-side"), "{e}");
    let e = run("up + on() group_left lonely", Range::instant(400_000)).unwrap();
    assert!(matches!(e, QueryValue::Vector(v) if v.is_empty()), "lonely is gone at 400 s");
    assert_eq!(instant("up + on() group_left lonely", 200_000).len(), 2);
    let r = instant("up * on() group_left vector(2)", 600_000);
    assert_eq!(r.len(), 2);
    let r = instant("up and up{job=\"a\"}", 600_000);
    assert_eq!(r.len(), 1);
    let r = instant("up unless up{job=\"a\"}", 600_000);
    assert_eq!(r[0].0.value("job"), "b");
    let r = instant("up{job=\"a\"} or vector(1)", 600_000);
    assert_eq!(r.len(), 2);
    let e = run("label_replace(up, \"job\", \"x\", \"job\", \".*\")", Range::instant(600_000)).unwrap_err();
    assert!(e.to_string().contains("vector cannot contain metrics with the same labelset"), "{e}");
}

#[test]
fn label_replace_and_histogram_quantile() {
    let r = instant(r#"label_replace(up, "team", "t-$1", "job", "(.)")"#, 600_000);
    assert_eq!(r[0].0.value("team"), "t-a");
    assert_eq!(r[0].0.name(), Some("up"), "label_replace keeps the name");
    let r = instant(r#"label_replace(up, "team", "$1x", "job", "(.)")"#, 600_000);
    assert_eq!(r[0].0.get("team"), None, "$1x names group \"1x\", which is empty, as in Go");
    let mut m = MemorySource::new();
    for (le, v) in [("0.1", 10.0), ("1", 30.0), ("+Inf", 40.0)] {
        m.insert(labels(&[("__name__", "h_bucket"), ("le", le), ("job", "a")]), [Sample { t: 0, v }]);
    }
    let e = parse("histogram_quantile(0.5, h_bucket)", &Limits::default()).unwrap();
    let QueryValue::Vector(v) = evaluate(&e, Range::instant(0), &m, &Limits::default(), Options::default()).unwrap()
    else {
        panic!()
    };
    assert_eq!(v[0].labels, labels(&[("job", "a")]));
    assert!((v[0].samples[0].v - (0.1 + 0.9 * 0.5)).abs() < 1e-12, "{v:?}");
}

#[test]
fn scalar_vector_and_clamps() {
    assert_eq!(instant("vector(scalar(up{job=\"b\"}))", 600_000), vec![(Labels::new(), 140.0)]);
    assert!(instant("vector(scalar(up))", 600_000)[0].1.is_nan(), "two samples: NaN");
    assert_eq!(instant("clamp(up{job=\"b\"}, 0, 10)", 600_000)[0].1, 10.0);
    assert!(instant("clamp(up, 10, 0)", 600_000).is_empty(), "max below min: nothing");
    assert_eq!(instant("round(up{job=\"b\"} / 3, 5)", 600_000)[0].1, 45.0);
    assert_eq!(instant("clamp_min(-up{job=\"b\"}, 0)", 600_000)[0].1, 0.0);
}

#[test]
fn limits_stop_big_queries() {
    let e = parse("up", &Limits::default()).unwrap();
    let small = Limits { max_samples: 10, ..Limits::default() };
    let err = evaluate(&e, Range::instant(600_000), &source(), &small, Options::default()).unwrap_err();
    assert!(err.to_string().contains("too many samples"), "{err}");
    let small = Limits { max_series: 1, ..Limits::default() };
    let err = evaluate(&e, Range::instant(600_000), &source(), &small, Options::default()).unwrap_err();
    assert!(err.to_string().contains("more than the limit of 1 series"), "{err}");
    let small = Limits { max_output_points: 10, ..Limits::default() };
    let range = Range { start_ms: 0, end_ms: 600_000, step_ms: 15_000 };
    let err = evaluate(&e, range, &source(), &small, Options::default()).unwrap_err();
    assert!(matches!(err, EvalError::TooManyPoints { limit: 10 }), "{err}");
    let stop = AtomicBool::new(true);
    let err = evaluate(&e, range, &source(), &Limits::default(), Options { stop: Some(&stop), ..Options::default() })
        .unwrap_err();
    assert_eq!(err, EvalError::Timeout);
}

#[test]
fn evaluation_at_the_depth_limit_fits_the_stack() {
    let limits = Limits::default();
    let q = format!("{}up{}", "abs(".repeat(limits.max_depth - 1), ")".repeat(limits.max_depth - 1));
    let e = parse(&q, &limits).unwrap();
    // Test threads have 2 MiB stacks, as tokio's workers do.
    let r =
        evaluate(&e, Range { start_ms: 0, end_ms: 600_000, step_ms: 60_000 }, &source(), &limits, Options::default());
    assert!(r.is_ok());
    let q = format!("up{}", " + up".repeat(limits.max_depth - 1));
    let e = parse(&q, &limits).unwrap();
    assert!(evaluate(&e, Range::instant(600_000), &source(), &limits, Options::default()).is_ok());
}

#[test]
fn data_needed_covers_what_evaluation_reads() {
    let e = parse("rate(up[5m] offset 1m) + lonely", &Limits::default()).unwrap();
    let range = Range { start_ms: 600_000, end_ms: 900_000, step_ms: 60_000 };
    let need = data_needed(&e, range, DEFAULT_LOOKBACK_MS);
    assert_eq!(need.len(), 2);
    assert_eq!((need[0].1, need[0].2), (600_000 - 60_000 - 300_000, 900_000 - 60_000));
    assert_eq!((need[1].1, need[1].2), (300_000, 900_000));
    // Evaluating against only the needed data gives the same answer as against all of it.
    let full = source();
    let mut part = MemorySource::new();
    for (sel, start, end) in &need {
        for s in full.select(&sel.matchers, *start, *end, 100).unwrap() {
            let mut buf = Vec::new();
            full.samples(&s, *start, *end, &mut buf).unwrap();
            part.insert(s.labels, buf);
        }
    }
    let a = evaluate(&e, range, &full, &Limits::default(), Options::default()).unwrap();
    let b = evaluate(&e, range, &part, &Limits::default(), Options::default()).unwrap();
    assert_eq!(a, b);
}

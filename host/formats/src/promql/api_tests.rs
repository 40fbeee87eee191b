//! The API's tests: number and time formats, parameter checks, answer shapes.

use super::*;
use crate::promql::source::{MemorySource, Sample};

fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn values_format_like_go() {
    for (v, want) in [
        (1.0, "1"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-07"),
        (0.000001, "0.000001"),
        (123456789.125, "123456789.125"),
        (1.0 / 3.0, "0.3333333333333333"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
        (0.0, "0"),
        (-0.0, "-0"),
        (2.5e300, "2.5e+300"),
    ] {
        assert_eq!(format_value(v), want, "{v}");
    }
    let mut s = String::new();
    format_timestamp(1_700_000_000_050, &mut s);
    s.push(' ');
    format_timestamp(1_700_000_000_000, &mut s);
    s.push(' ');
    format_timestamp(-1_500, &mut s);
    assert_eq!(s, "1700000000.050 1700000000 -1.500");
}

#[test]
fn times_and_durations_parse_like_prometheus() {
    assert_eq!(parse_time("1700000000"), Ok(1_700_000_000_000));
    assert_eq!(parse_time("1700000000.123"), Ok(1_700_000_000_123));
    assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
    assert_eq!(parse_time("2023-11-14T23:13:20.5+01:00"), Ok(1_700_000_000_500));
    assert!(parse_time("yesterday").unwrap_err().contains("cannot parse \"yesterday\" to a valid timestamp"));
    assert!(parse_time("NaN").is_err());
    assert_eq!(parse_duration("15"), Ok(15_000));
    assert_eq!(parse_duration("0.5"), Ok(500));
    assert_eq!(parse_duration("1m30s"), Ok(90_000));
    assert!(parse_duration("1e30").unwrap_err().contains("overflows int64"));
}

#[test]
fn range_parameters_are_checked_as_prometheus_checks_them() {
    let limits = Limits::default();
    let ok = range_params(&p(&[("query", "up"), ("start", "0"), ("end", "3600"), ("step", "60")]), &limits).unwrap();
    assert_eq!(ok.1, Range { start_ms: 0, end_ms: 3_600_000, step_ms: 60_000 });
    for (params, want) in [
        (
            vec![("query", "up"), ("start", "10"), ("end", "0"), ("step", "1")],
            "end timestamp must not be before start time",
        ),
        (vec![("query", "up"), ("start", "0"), ("end", "10"), ("step", "0")], "zero or negative query resolution step"),
        (
            vec![("query", "up"), ("start", "0"), ("end", "11001"), ("step", "1")],
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
        ),
        (vec![("start", "0"), ("end", "1"), ("step", "1")], "invalid parameter \"query\""),
        (vec![("query", "up"), ("start", "x"), ("end", "1"), ("step", "1")], "invalid parameter \"start\""),
    ] {
        let e = range_params(&p(&params), &limits).unwrap_err();
        assert_eq!(e.kind, ErrorType::BadData);
        assert!(e.message.contains(want), "{params:?}: {}", e.message);
    }
    assert!(range_params(&p(&[("query", "up"), ("start", "0"), ("end", "11000"), ("step", "1")]), &limits).is_ok());
}

fn source() -> MemorySource {
    let mut m = MemorySource::new();
    for (job, v) in [("api", 1.0), ("web", f64::INFINITY)] {
        m.insert(
            Labels::from_pairs([("__name__", "up"), ("job", job)]),
            (0..5).map(|i| Sample { t: i * 15_000, v: v + i as f64 }),
        );
    }
    m
}

#[test]
fn answers_have_prometheus_shapes() {
    let m = source();
    let limits = Limits::default();
    let a = query(&p(&[("query", "up"), ("time", "30")]), 0, &m, &limits, Options::default());
    assert_eq!(a.status, 200);
    assert_eq!(
        a.body,
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up","job":"api"},"value":[30,"3"]},{"metric":{"__name__":"up","job":"web"},"value":[30,"+Inf"]}]}}"#
    );
    let a = query_range(
        &p(&[("query", "up{job=\"api\"} * 2"), ("start", "0"), ("end", "30"), ("step", "15")]),
        &m,
        &limits,
        Options::default(),
    );
    assert_eq!(
        a.body,
        r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"job":"api"},"values":[[0,"2"],[15,"4"],[30,"6"]]}]}}"#
    );
    let a = query(&p(&[("query", "1 + 1"), ("time", "1.5")]), 0, &m, &limits, Options::default());
    assert_eq!(a.body, r#"{"status":"success","data":{"resultType":"scalar","result":[1.500,"2"]}}"#);
    let a = query(&p(&[("query", "\"a\\\"b\""), ("time", "1")]), 0, &m, &limits, Options::default());
    assert_eq!(a.body, r#"{"status":"success","data":{"resultType":"string","result":[1,"a\"b"]}}"#);
    let a = query(&p(&[("query", "up[20s]"), ("time", "30")]), 0, &m, &limits, Options::default());
    assert!(a.body.contains(r#""values":[[15,"2"],[30,"3"]]"#), "{}", a.body);
}

#[test]
fn errors_have_prometheus_types_and_statuses() {
    let m = source();
    let limits = Limits::default();
    let a = query(&p(&[("query", "sort(up)")]), 0, &m, &limits, Options::default());
    assert_eq!(a.status, 400);
    assert!(
        a.body.starts_with(
            r#"{"status":"error","errorType":"bad_data","error":"1:1: parse error: function \"sort\" is not supported"#
        ),
        "{}",
        a.body
    );
    let a = query(&p(&[("query", "up + on() up"), ("time", "30")]), 0, &m, &limits, Options::default());
    assert_eq!(a.status, 422, "{}", a.body);
    assert!(a.body.contains(r#""errorType":"execution""#), "{}", a.body);
    let a = query_range(
        &p(&[("query", "up[5m]"), ("start", "0"), ("end", "30"), ("step", "15")]),
        &m,
        &limits,
        Options::default(),
    );
    assert!(a.body.contains("invalid expression type \\\"range vector\\\" for range query"), "{}", a.body);
}

#[test]
fn label_endpoints_list_what_matches() {
    let m = source();
    let limits = Limits::default();
    let a = series(&p(&[("match[]", "up{job=~\"a.*\"}")]), &m, &limits);
    assert_eq!(a.body, r#"{"status":"success","data":[{"__name__":"up","job":"api"}]}"#);
    let a = series(&p(&[]), &m, &limits);
    assert_eq!((a.status, a.body.contains("no match[] parameter provided")), (400, true));
    let a = series(&p(&[("match[]", "rate(up[5m])")]), &m, &limits);
    assert!(a.body.contains("is not a series selector"), "{}", a.body);
    assert_eq!(label_names(&p(&[]), &m, &limits).body, r#"{"status":"success","data":["__name__","job"]}"#);
    assert_eq!(label_values("job", &p(&[]), &m, &limits).body, r#"{"status":"success","data":["api","web"]}"#);
    assert_eq!(label_values("1x", &p(&[]), &m, &limits).status, 400);
    let a = label_values("job", &p(&[("start", "100"), ("end", "200")]), &m, &limits);
    assert_eq!(a.body, r#"{"status":"success","data":[]}"#, "no sample in that time range");
    let mut known = BTreeMap::new();
    known.insert("up".to_string(), vec![Metadata { kind: "gauge".into(), help: "Up.".into(), unit: String::new() }]);
    assert_eq!(
        metadata(&p(&[]), &known).body,
        r#"{"status":"success","data":{"up":[{"type":"gauge","help":"Up.","unit":""}]}}"#
    );
    assert_eq!(metadata(&p(&[("metric", "x")]), &known).body, r#"{"status":"success","data":{}}"#);
}

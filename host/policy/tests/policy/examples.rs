//! Each example guest run through the host: ingest policies over batches, query policies
//! pushed down per quantum and merged.

use timeshard_policy::{FailureKind, Kind, Params, PolicyError, Settings};
use timeshard_proto::time::quanta;
use timeshard_proto::{Point, QuantumLen, TimeRange};

use crate::common::*;

#[test]
fn pmu_validate_drops_bad_values_and_duplicates() {
    let f = Fixture::new();
    f.install_everywhere("pmu-validate", Kind::Ingest, settings(&[("min", "-100"), ("max", "100")]));
    let mut batch = points(&[1.0, f64::NAN, 2.0, f64::INFINITY, 150.0, -100.0, f64::NEG_INFINITY]);
    batch.push(batch[0]); // an exact duplicate
    batch.push(Point { event: 1, ..batch[0] }); // same time, another event: kept
    batch.reverse(); // out of order on purpose

    let out = f.registry.ingest(&series(), batch.clone()).unwrap();
    assert_eq!(out.policy.unwrap().to_string(), "pmu-validate@1.0.0");
    let kept: Vec<f64> = out.keep.iter().map(|p| p.value).collect();
    assert_eq!(kept, [1.0, 1.0, 2.0, -100.0], "sorted by time, duplicate removed");
    assert_eq!(out.keep[0].event, 0);
    assert_eq!(out.keep[1].event, 1);
    let mut reasons: Vec<&str> = out.rejected.iter().map(|r| r.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons, ["value 150 is outside [-100, 100]", "value is NaN", "value is infinite", "value is infinite"]);
    // Rejections carry the input point they refer to.
    let r150 = out.rejected.iter().find(|r| r.reason.contains("150")).unwrap();
    assert_eq!(r150.point.value, 150.0);
    assert!(out.passed_through.is_none());
}

#[test]
fn a_guest_error_names_the_setting() {
    let f = Fixture::new();
    f.install_everywhere("pmu-validate", Kind::Ingest, settings(&[("min", "low")]));
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert!(matches!(err, PolicyError::Guest { .. }), "{err}");
    assert!(err.to_string().contains("\"min\""), "{err}");
}

#[test]
fn deadband_keeps_points_outside_the_band() {
    let f = Fixture::new();
    f.install_everywhere("deadband", Kind::Ingest, settings(&[("d", "0.5")]));
    let batch = points(&[10.0, 10.2, 10.4, 10.6, 10.7, 9.9, 10.0, f64::NAN, 12.0]);
    let out = f.registry.ingest(&series(), batch.clone()).unwrap();
    let kept: Vec<f64> = out.keep.iter().map(|p| p.value).collect();
    assert_eq!(kept, [10.0, 10.6, 9.9, 12.0]);
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(out.rejected[0].point, batch[7]);
    // Timestamps come through untouched.
    assert_eq!(out.keep[1].ts, batch[3].ts);
}

#[test]
fn deadband_requires_its_band() {
    let f = Fixture::new();
    f.install_everywhere("deadband", Kind::Ingest, Settings::default());
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert!(err.to_string().contains("\"d\" is required"), "{err}");
}

#[test]
fn unit_convert_converts_by_units_or_scale() {
    let f = Fixture::new();
    f.install_everywhere("unit-convert", Kind::Ingest, settings(&[("from", "degF"), ("to", "degC")]));
    let out = f.registry.ingest(&series(), points(&[32.0, 212.0, -40.0])).unwrap();
    let got: Vec<f64> = out.keep.iter().map(|p| p.value).collect();
    for (g, want) in got.iter().zip([0.0, 100.0, -40.0]) {
        assert!((g - want).abs() < 1e-9, "{got:?}");
    }

    let f = Fixture::new();
    f.install_everywhere("unit-convert", Kind::Ingest, settings(&[("scale", "1000"), ("offset", "1")]));
    let out = f.registry.ingest(&series(), points(&[1.5])).unwrap();
    assert_eq!(out.keep[0].value, 1501.0);

    let f = Fixture::new();
    f.install_everywhere("unit-convert", Kind::Ingest, settings(&[("from", "kWh"), ("to", "bar")]));
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert!(err.to_string().contains("cannot convert kWh (energy) to bar (pressure)"), "{err}");
}

#[test]
fn unbound_series_pass_unchanged() {
    let f = Fixture::new();
    let out = f.registry.ingest(&series(), points(&[f64::NAN])).unwrap();
    assert!(out.policy.is_none());
    assert!(out.keep[0].value.is_nan());
}

/// Summarizes `points` quantum by quantum, as the owner nodes would, then merges.
fn push_down(
    f: &Fixture,
    name: &str,
    points: &[Point],
    range: TimeRange,
    params: &Params,
) -> timeshard_policy::QueryResult {
    let len = QuantumLen::new(1_000_000_000).unwrap();
    let mut partials = Vec::new();
    for (_, part) in quanta(range, len) {
        let raw: Vec<Point> = points.iter().copied().filter(|p| part.contains(p.ts)).collect();
        partials.extend(f.registry.query_map(name, &series(), part, &raw, params).unwrap());
    }
    // The coordinator may receive them in any order.
    partials.reverse();
    f.registry.query_merge(name, partials, params).unwrap()
}

#[test]
fn rms_pushed_down_matches_the_direct_computation() {
    let f = Fixture::new();
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let values: Vec<f64> = (0..300).map(|i| ((i * 37) % 101) as f64 / 7.0 - 5.0).collect();
    let pts = points(&values);
    let range = TimeRange::new(T0, T0 + 5_000_000_000).unwrap();
    let result = push_down(&f, "rms", &pts, range, &Params::new());
    let direct = (values.iter().map(|v| v * v).sum::<f64>() / values.len() as f64).sqrt();
    assert_eq!(result.value("count"), Some(300.0));
    let rms = result.value("rms").unwrap();
    assert!((rms - direct).abs() < 1e-9 * direct, "{rms} vs {direct}");
    assert_eq!(result.policy.to_string(), "rms@1.0.0");

    // A partial is small: two numbers, no points.
    let partials = f.registry.query_map("rms", &series(), range, &pts, &Params::new()).unwrap();
    assert_eq!(partials.len(), 1);
    assert_eq!(partials[0].numbers.len(), 2);
    assert!(partials[0].points.is_empty());
}

#[test]
fn large_quanta_are_summarized_in_pieces() {
    let limits = timeshard_policy::Limits { max_summarize_points: 64, ..test_limits() };
    let f = Fixture::with_limits(limits);
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let pts = points(&vec![2.0; 200]);
    let range = TimeRange::new(T0, T0 + 10_000_000_000).unwrap();
    let partials = f.registry.query_map("rms", &series(), range, &pts, &Params::new()).unwrap();
    assert_eq!(partials.len(), 4);
    let result = f.registry.query_merge("rms", partials, &Params::new()).unwrap();
    assert_eq!(result.value("count"), Some(200.0));
    assert_eq!(result.value("rms"), Some(2.0));
}

#[test]
fn threshold_crossings_are_found_inside_and_between_quanta() {
    let f = Fixture::new();
    f.install_everywhere("threshold-crossings", Kind::Query, Settings::default());
    // 60 points per second: crossings at indices 30 (up) and 60 (down, a quantum boundary)
    // and 119 (up, the last point of a quantum) and 120 (down, the first of the next).
    let mut values = vec![0.0; 180];
    for v in &mut values[30..60] {
        *v = 5.0;
    }
    values[119] = 7.0;
    let pts = points(&values);
    let range = TimeRange::new(T0, T0 + 3_000_000_000).unwrap();
    let params = Params::from([("threshold".to_string(), "1".to_string())]);
    let result = push_down(&f, "threshold-crossings", &pts, range, &params);
    let at: Vec<(i64, u64)> = result.points.iter().map(|p| (p.ts, p.event)).collect();
    assert_eq!(at, [(pts[30].ts, 1), (pts[60].ts, 2), (pts[119].ts, 1), (pts[120].ts, 2)]);
    assert_eq!(result.value("crossings"), Some(4.0));
    assert_eq!(result.value("up"), Some(2.0));

    let err = f.registry.query_map("threshold-crossings", &series(), range, &pts, &Params::new()).unwrap_err();
    assert!(err.to_string().contains("\"threshold\" is required"), "{err}");
}

#[test]
fn queries_run_only_where_bound() {
    let f = Fixture::new();
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let range = TimeRange::new(T0, T0 + 1_000_000_000).unwrap();
    let err = f.registry.query_map("threshold-crossings", &series(), range, &[], &Params::new()).unwrap_err();
    assert!(matches!(err, PolicyError::NotBound { .. }), "{err}");
    // Points outside the range are the caller's bug, refused before the guest runs.
    let outside = points(&[1.0]);
    let early = TimeRange::new(T0 - 10, T0).unwrap();
    assert!(f.registry.query_map("rms", &series(), early, &outside, &Params::new()).is_err());
}

#[test]
fn merge_refuses_overlapping_or_mixed_partials() {
    let f = Fixture::new();
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let range = TimeRange::new(T0, T0 + 1_000_000_000).unwrap();
    let p = f.registry.query_map("rms", &series(), range, &points(&[1.0]), &Params::new()).unwrap();
    let twice = [p.clone(), p.clone()].concat();
    let err = f.registry.query_merge("rms", twice, &Params::new()).unwrap_err();
    assert_eq!(err.kind(), FailureKind::BadPartials, "{err}");
    let mut other = p.clone();
    other[0].policy.version = "9.9.9".into();
    let err = f.registry.query_merge("rms", [p, other].concat(), &Params::new()).unwrap_err();
    assert_eq!(err.kind(), FailureKind::BadPartials, "{err}");
}

#[test]
fn partials_survive_serialization() {
    let f = Fixture::new();
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let range = TimeRange::new(T0, T0 + 1_000_000_000).unwrap();
    let p = f.registry.query_map("rms", &series(), range, &points(&[3.0, 4.0]), &Params::new()).unwrap();
    let json = serde_json::to_string(&p).unwrap();
    let back: Vec<timeshard_policy::Partial> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    let r = f.registry.query_merge("rms", back, &Params::new()).unwrap();
    assert!((r.value("rms").unwrap() - 12.5f64.sqrt()).abs() < 1e-12);
}

#[test]
fn every_example_guest_loads_importing_only_the_host() {
    // Installing runs the import check: anything beyond timeshard:policy/host (a WASI
    // interface pulled in by std, say) would be refused as a forbidden import.
    let f = Fixture::new();
    let guests = [
        ("noop", Kind::Ingest),
        ("pmu-validate", Kind::Ingest),
        ("deadband", Kind::Ingest),
        ("unit-convert", Kind::Ingest),
        ("rms", Kind::Query),
        ("threshold-crossings", Kind::Query),
    ];
    for (guest, kind) in guests {
        let installed = f.registry.install(f.module(guest, "1.0.0", kind, Settings::default()));
        assert!(installed.is_ok(), "{guest}: {}", installed.unwrap_err());
    }
    assert_eq!(f.registry.running().len(), guests.len());
}

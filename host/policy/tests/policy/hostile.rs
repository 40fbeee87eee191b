//! Hostile guests, one test each: each fails with its typed error, and the registry keeps
//! serving good calls afterwards (the failed instance was recycled).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use timeshard_policy::{Binding, Bindings, FailureKind, Kind, Limits, OnFailure, PolicyError, Registry, Settings};
use timeshard_proto::SeriesKey;

use crate::common::*;

/// Binds `guest` as the ingest policy of `pmu.*` and pmu-validate to everything else.
fn hostile_fixture(guest: &str, settings: Settings) -> Fixture {
    hostile_fixture_with(guest, settings, test_limits())
}

fn hostile_fixture_with(guest: &str, settings: Settings, limits: Limits) -> Fixture {
    let f = Fixture::with_limits(limits);
    f.registry.install(f.module(guest, "1.0.0", Kind::Ingest, settings)).unwrap();
    f.registry.install(f.module("pmu-validate", "1.0.0", Kind::Ingest, Settings::default())).unwrap();
    let mut hostile = Binding::default();
    hostile.select.metric_prefix = "pmu.".into();
    hostile.ingest = Some(guest.parse().unwrap());
    let good = Binding { ingest: Some("pmu-validate".parse().unwrap()), ..Binding::default() };
    f.registry.bind(Bindings(vec![hostile, good])).unwrap();
    f
}

fn good_series() -> SeriesKey {
    "grid.freq{site=atl}".parse().unwrap()
}

/// A good call on the same registry still works.
fn still_serving(registry: &Registry) {
    let out = registry.ingest(&good_series(), points(&[1.0, f64::NAN])).unwrap();
    assert_eq!(out.keep.len(), 1);
    assert_eq!(out.rejected.len(), 1);
}

#[test]
fn an_infinite_loop_is_stopped_while_other_calls_complete() {
    // A longer deadline than the default leaves room to watch other calls complete meanwhile.
    let looping = Settings { deadline_ms: Some(300), ..Settings::default() };
    let f = Arc::new(hostile_fixture("hostile-loop", looping));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (f, done, stop) = (f.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                still_serving(&f.registry);
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while done.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = done.load(Ordering::Relaxed);
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    let during = done.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    assert!(matches!(err, PolicyError::Timeout { deadline_ms: 300, .. }), "{err}");
    assert!(err.to_string().contains("deadline of 300 ms"), "{err}");
    assert!(during > 0, "no other call completed while the loop ran");
    still_serving(&f.registry);
    // The same policy can be called again: a fresh instance, stopped again.
    let again = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert_eq!(again.kind(), FailureKind::Timeout);
}

#[test]
fn the_default_deadline_stops_a_loop() {
    let f = hostile_fixture_with("hostile-loop", Settings::default(), Limits::default());
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert!(matches!(err, PolicyError::Timeout { deadline_ms: 10, .. }), "{err}");
    // The node's metrics see the call, its time and its timeout.
    let stats = f.registry.call_stats();
    let hostile = stats.iter().find(|s| s.policy.name == "hostile-loop").expect("stats of the installed policy");
    assert_eq!((hostile.calls, hostile.timeouts, hostile.traps, hostile.failures), (1, 1, 0, 0));
    assert!(hostile.seconds >= 0.010, "{hostile:?}");
}

#[test]
fn a_memory_bomb_is_capped() {
    let f = hostile_fixture("hostile-memory-bomb", Settings { memory_mib: Some(16), ..Settings::default() });
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    assert!(matches!(err, PolicyError::MemoryLimit { limit_bytes, .. } if limit_bytes == 16 << 20), "{err}");
    still_serving(&f.registry);
}

#[test]
fn a_memory_cap_above_the_node_cap_is_refused() {
    let f = Fixture::with_limits(Limits { memory_bytes: 32 << 20, ..test_limits() });
    let m = f.module("noop", "1.0.0", Kind::Ingest, Settings { memory_mib: Some(64), ..Settings::default() });
    let err = f.registry.install(m).unwrap_err();
    assert!(err.to_string().contains("above the node's cap of 32 MiB"), "{err}");
}

#[test]
fn an_oversized_output_is_refused() {
    let f = hostile_fixture("hostile-oversized", Settings::default());
    let err = f.registry.ingest(&series(), points(&[1.0, 2.0, 3.0])).unwrap_err();
    assert!(matches!(err, PolicyError::OutputTooLarge { got: 30, limit: 3, .. }), "{err}");
    still_serving(&f.registry);
}

#[test]
fn a_panic_is_a_trap_with_its_message() {
    let f = hostile_fixture("hostile-panic", Settings::default());
    let err = f.registry.ingest(&series(), points(&[1.0])).unwrap_err();
    let PolicyError::Trap { last_log, .. } = &err else {
        panic!("expected a trap, got {err}");
    };
    let log = last_log.as_deref().unwrap_or_default();
    assert!(log.contains("guest panicked: index out of bounds"), "{err}");
    let stats = f.registry.call_stats();
    let hostile = stats.iter().find(|s| s.policy.name == "hostile-panic").expect("stats of the installed policy");
    assert_eq!((hostile.calls, hostile.traps, hostile.timeouts), (1, 1, 0));
    still_serving(&f.registry);
}

#[test]
fn a_failing_policy_can_pass_batches_through() {
    let f = hostile_fixture("hostile-panic", Settings { on_failure: OnFailure::PassThrough, ..Settings::default() });
    let batch = points(&[1.0, f64::NAN]);
    let out = f.registry.ingest(&series(), batch.clone()).unwrap();
    assert_eq!(out.keep, batch, "passed through unprocessed");
    let failure = out.passed_through.unwrap();
    assert_eq!(failure.kind, FailureKind::Trap);
    assert!(failure.message.contains("hostile-panic@1.0.0"));
}

#[test]
fn a_component_importing_wasi_is_refused_at_load() {
    let f = Fixture::new();
    let err = f.registry.install(f.module("hostile-wasi-fs", "1.0.0", Kind::Ingest, Settings::default())).unwrap_err();
    let PolicyError::ForbiddenImport { import, .. } = &err else {
        panic!("expected a forbidden import, got {err}");
    };
    assert!(import.starts_with("wasi:"), "{err}");
    assert!(err.to_string().contains("timeshard:policy/host"), "{err}");
    assert!(f.registry.running().is_empty());
}

#[test]
fn malformed_bytes_are_refused_at_load() {
    let f = Fixture::new();
    let real = wasm("noop");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("text", b"not a component at all".to_vec()),
        ("truncated", real[..real.len() / 2].to_vec()),
        // A core module (the magic and version of a wasm 1.0 module, nothing else).
        ("core module", b"\0asm\x01\0\0\0".to_vec()),
    ];
    for (what, bytes) in cases {
        // Signed, so that it is the bytes, not the signature, that are refused.
        let m = f.module_from_bytes("bad", "1.0.0", Kind::Ingest, bytes, Settings::default());
        let err = f.registry.install(m).unwrap_err();
        assert!(matches!(err, PolicyError::Malformed { .. }), "{what}: {err}");
        if what == "core module" {
            assert!(err.to_string().contains("not a component"), "{err}");
        }
    }
    assert!(f.registry.running().is_empty());
}

#[test]
fn a_policy_of_the_wrong_world_is_refused() {
    let f = Fixture::new();
    let err = f.registry.install(f.module("rms", "1.0.0", Kind::Ingest, Settings::default())).unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld { .. }), "{err}");
}

#[test]
fn oversized_input_is_refused_before_the_guest_runs() {
    let f = Fixture::with_limits(Limits { max_batch_points: 10, ..test_limits() });
    f.install_everywhere("noop", Kind::Ingest, Settings::default());
    let err = f.registry.ingest(&series(), points(&[0.0; 11])).unwrap_err();
    assert!(matches!(err, PolicyError::InputTooLarge { got: 11, limit: 10, .. }), "{err}");
}

#[test]
fn an_oversized_batch_is_not_passed_through_around_the_policy() {
    // The node's own batch limit is configurable apart from the policy host's: a batch over
    // the host's limit never reaches the policy, and must not be stored as if it had failed.
    let f = Fixture::with_limits(Limits { max_batch_points: 10, ..test_limits() });
    let pass = Settings { on_failure: OnFailure::PassThrough, ..settings(&[("min", "-1"), ("max", "1")]) };
    f.install_everywhere("pmu-validate", Kind::Ingest, pass);
    let Err(err) = f.registry.ingest(&series(), points(&[1e9; 11])) else {
        panic!("eleven out-of-range points were stored without the policy");
    };
    assert!(matches!(err, PolicyError::InputTooLarge { got: 11, limit: 10, .. }), "{err}");
}

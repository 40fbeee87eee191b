//! The pool's address-space reservation comes from configuration, and the Pulley interpreter
//! (what runs policies on armv7) computes what native code computes.

use timeshard_policy::signing::TrustedKeys;
use timeshard_policy::{Backend, Config, FailureKind, Kind, Limits, Registry};

use crate::common::*;

#[test]
fn pulley_and_native_code_keep_the_same_points() {
    let pulley = Fixture::with_limits(Limits { backend: Backend::Pulley, ..test_limits() });
    assert!(pulley.registry.is_pulley());
    let native = Fixture::new();
    assert_eq!(native.registry.is_pulley(), !timeshard_policy::pool::NATIVE_AVAILABLE);
    let batch = points(&[1.0, f64::NAN, 2.0, 150.0, -100.0, 3.5]);
    let mut kept = Vec::new();
    for f in [&pulley, &native] {
        f.install_everywhere("pmu-validate", Kind::Ingest, settings(&[("min", "-100"), ("max", "100")]));
        let out = f.registry.ingest(&series(), batch.clone()).unwrap();
        assert_eq!(out.rejected.len(), 2, "NaN and 150");
        kept.push(out.keep);
    }
    assert_eq!(kept[0], kept[1]);
}

#[test]
fn a_small_reservation_from_the_config_runs_policies() {
    // What an armv7 node has by default: 8 slots of 16 MiB, 128 MiB in all, no guards.
    let config: Config = toml::from_str("memory_mib = 16\nmax_instances = 8\nreservation_mib = 128\n").unwrap();
    let limits = config.limits();
    assert_eq!(limits.reservation_bytes, 128 << 20);
    let f = Fixture::with_limits(Limits { deadline: std::time::Duration::from_secs(10), ..limits });
    f.install_everywhere("deadband", Kind::Ingest, settings(&[("d", "0.5")]));
    let out = f.registry.ingest(&series(), points(&[10.0, 10.2, 11.0])).unwrap();
    assert_eq!(out.keep.len(), 2);
}

#[test]
fn a_reservation_that_cannot_be_made_is_explained() {
    // Too little for the memory cap: refused before anything is mapped.
    let config: Config = toml::from_str("memory_mib = 64\nmax_instances = 8\nreservation_mib = 256\n").unwrap();
    let err = Registry::new(config.limits(), TrustedKeys::default()).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Config, "{err}");
    assert!(err.to_string().contains("reservation_mib = 256"), "{err}");
    // More address space than the process has (4 GiB slots for 65,536 instances: 258 TiB on a
    // 64-bit host, and over 2 GiB on a 32-bit one): the mapping fails, and the error says what
    // to lower.
    let config: Config = toml::from_str("max_instances = 65536\n").unwrap();
    let err = Registry::new(config.limits(), TrustedKeys::default()).unwrap_err().to_string();
    assert!(err.contains("address space") && err.contains("max_instances"), "{err}");
}

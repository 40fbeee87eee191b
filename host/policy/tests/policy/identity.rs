//! What a signature binds (a module's hash *and* its name, version and kind), what the control
//! plane checks of uploaded bytes without an engine (`component::inspect`, which must agree
//! with what a node loads), and the per-policy figures a node reports.

use timeshard_policy::component::{self, ComponentError};
use timeshard_policy::signing::{self, Identity};
use timeshard_policy::{Config, FailureKind, Kind, PolicyError, PolicyRef, Registry, Settings};
use timeshard_proto::TimeRange;

use crate::common::*;

fn identity(name: &str, version: &str, kind: Kind) -> Identity {
    Identity::new(PolicyRef::new(name, version).unwrap(), kind)
}

#[test]
fn a_signed_module_cannot_be_installed_as_another_policy() {
    let f = Fixture::new();
    let noop = wasm("noop");
    let signed = signing::sign(&f.key, &noop, &identity("noop", "1.0.0", Kind::Ingest)).to_text();
    // The same bytes and signature, installed as something else: another name (a signed
    // `noop` replacing `pmu-validate`), a newer version, another kind.
    for (name, version, kind) in
        [("pmu-validate", "1.0.0", Kind::Ingest), ("noop", "1.0.1", Kind::Ingest), ("noop", "1.0.0", Kind::Query)]
    {
        let mut m = f.module_from_bytes(name, version, kind, noop.clone(), Settings::default());
        m.signature = Some(signed.clone());
        let err = f.registry.install(m).unwrap_err();
        assert!(matches!(err, PolicyError::WrongIdentity { .. }), "{name}@{version} {kind}: {err}");
        assert_eq!(err.kind(), FailureKind::Signature);
        let text = err.to_string();
        assert!(text.contains("noop@1.0.0 (ingest policy)"), "{text}");
        assert!(text.contains("timeshard policy sign"), "{text}");
    }
    assert!(f.registry.running().is_empty());
    assert_eq!(f.registry.cached_components(), 0, "refused before compilation");
    // As what it was signed as, it installs.
    let mut m = f.module_from_bytes("noop", "1.0.0", Kind::Ingest, noop, Settings::default());
    m.signature = Some(signed);
    f.registry.install(m).unwrap();
}

/// A directory with `rms.wasm` signed in the old format (bytes only), and its `[policy]`.
fn old_format(allow: bool) -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    let key = signing::generate_keypair().unwrap();
    let path = dir.path().join("rms.wasm");
    let bytes = wasm("rms");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(signing::signature_path(&path), signing::sign_v1(&key, &bytes).to_text()).unwrap();
    let toml = format!(
        "trusted_keys = [{:?}]\nallow_v1_signatures = {allow}\ndeadline_ms = 10000\n\
         [[modules]]\nname = \"rms\"\nversion = \"1.0.0\"\nkind = \"query\"\nwasm = \"rms.wasm\"\n",
        key.public().to_text().trim()
    );
    (dir, toml::from_str(&toml).unwrap())
}

#[test]
fn old_signatures_load_only_where_the_config_allows_them() {
    let (dir, config) = old_format(false);
    let (registry, report) = Registry::from_config(&config, dir.path()).unwrap();
    assert_eq!(report.failed.len(), 1, "{report:?}");
    let err = &report.failed[0].1;
    assert!(matches!(err, PolicyError::LegacySignature { .. }), "{err}");
    assert!(err.to_string().contains("allow_v1_signatures = true"), "{err}");
    assert!(registry.running().is_empty());

    let (dir, config) = old_format(true);
    let (registry, report) = Registry::from_config(&config, dir.path()).unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(registry.running()[0].policy.to_string(), "rms@1.0.0");
}

#[test]
fn inspection_accepts_every_example_guest_as_its_kind() {
    for (guest, kind) in [
        ("noop", Kind::Ingest),
        ("pmu-validate", Kind::Ingest),
        ("deadband", Kind::Ingest),
        ("rms", Kind::Query),
        ("threshold-crossings", Kind::Query),
    ] {
        component::inspect(&wasm(guest), kind).unwrap_or_else(|e| panic!("{guest}: {e}"));
    }
}

#[test]
fn inspection_refuses_what_a_node_refuses() {
    let wasi = component::inspect(&wasm("hostile-wasi-fs"), Kind::Ingest).unwrap_err();
    assert!(matches!(&wasi, ComponentError::ForbiddenImport { import } if import.starts_with("wasi:")), "{wasi}");
    assert!(wasi.to_string().contains("timeshard:policy/host"), "{wasi}");

    let world = component::inspect(&wasm("rms"), Kind::Ingest).unwrap_err();
    assert!(matches!(world, ComponentError::WrongWorld { .. }), "{world}");
    assert!(world.to_string().contains("timeshard:policy/ingest@0.1.0"), "{world}");

    let core = component::inspect(b"\0asm\x01\0\0\0", Kind::Ingest).unwrap_err();
    assert_eq!(core, ComponentError::CoreModule);
    assert!(core.to_string().contains("not a component"), "{core}");

    let real = wasm("noop");
    for bytes in [Vec::new(), b"not wasm at all".to_vec(), real[..real.len() / 2].to_vec()] {
        let err = component::inspect(&bytes, Kind::Ingest).unwrap_err();
        assert!(matches!(err, ComponentError::Invalid(_)), "{err}");
    }

    // And each of these is what the node's engine says too.
    let f = Fixture::new();
    let node = |guest: &str, kind| f.registry.install(f.module(guest, "1.0.0", kind, Settings::default()));
    assert!(matches!(node("hostile-wasi-fs", Kind::Ingest), Err(PolicyError::ForbiddenImport { .. })));
    assert!(matches!(node("rms", Kind::Ingest), Err(PolicyError::WrongWorld { .. })));
}

#[test]
fn calls_report_peak_memory_and_rejected_points() {
    let f = Fixture::new();
    f.install_everywhere("pmu-validate", Kind::Ingest, settings(&[("min", "-1"), ("max", "1")]));
    let out = f.registry.ingest(&series(), points(&[0.5, 2.0, -3.0])).unwrap();
    assert_eq!(out.rejected.len(), 2);
    f.registry.ingest(&series(), points(&[0.0])).unwrap();
    let stats = f.registry.call_stats();
    let s = stats.iter().find(|s| s.policy.name == "pmu-validate").unwrap();
    assert_eq!((s.calls, s.points, s.rejected, s.traps, s.timeouts), (2, 4, 2, 0, 0));
    // At least the one page a component's memory starts with, at most the cap.
    assert!(s.peak_memory_bytes >= 64 * 1024, "{s:?}");
    assert!(s.peak_memory_bytes <= f.registry.limits().memory_bytes, "{s:?}");
}

#[test]
fn a_query_for_another_version_names_both() {
    let f = Fixture::new();
    f.install_everywhere("rms", Kind::Query, Settings::default());
    let range = TimeRange::new(T0, T0 + 1_000_000_000).unwrap();
    let pts = points(&[3.0, 4.0]);
    let same = f.registry.query_map_version("rms", Some("1.0.0"), &series(), range, &pts, &Default::default());
    assert_eq!(same.unwrap()[0].policy.to_string(), "rms@1.0.0");
    let err =
        f.registry.query_map_version("rms", Some("2.0.0"), &series(), range, &pts, &Default::default()).unwrap_err();
    assert!(matches!(err, PolicyError::OtherVersion { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("rms@2.0.0") && text.contains("rms@1.0.0"), "{text}");
    assert!(text.contains("never merges"), "{text}");
}

#[test]
fn counters_survive_a_reapply_of_the_same_module() {
    let f = Fixture::new();
    f.install_everywhere("noop", Kind::Ingest, Settings::default());
    f.registry.ingest(&series(), points(&[1.0])).unwrap();
    let bindings = || {
        let b = timeshard_policy::Binding { ingest: Some("noop".parse().unwrap()), ..Default::default() };
        timeshard_policy::Bindings(vec![b])
    };
    let module = |version: &str| f.module("noop", version, Kind::Ingest, Settings::default());
    let calls = |version: &str| {
        let stats = f.registry.call_stats();
        stats.iter().find(|s| s.policy.version == version).map(|s| s.calls)
    };
    // The control plane sends the same module again with the next generation.
    assert!(f.registry.apply_modules(vec![module("1.0.0")], vec![], bindings()).is_ok());
    assert_eq!(calls("1.0.0"), Some(1));
    // A new version starts from zero; the old one is gone.
    assert!(f.registry.apply_modules(vec![module("1.0.1")], vec![], bindings()).is_ok());
    f.registry.ingest(&series(), points(&[1.0])).unwrap();
    assert_eq!((calls("1.0.0"), calls("1.0.1")), (None, Some(1)));
    // One that cannot be fetched leaves the last good version running.
    let missing = (PolicyRef::new("noop", "1.0.2").unwrap(), PolicyError::Config("not fetched".into()));
    let report = f.registry.apply_modules(vec![], vec![missing], bindings());
    assert_eq!(report.failed.len(), 1);
    assert_eq!(f.registry.ingest(&series(), points(&[1.0])).unwrap().policy.unwrap().version, "1.0.1");
    assert_eq!(calls("1.0.1"), Some(2));
}

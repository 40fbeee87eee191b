//! Installing modules: signatures checked before compilation, hot swaps that keep the last
//! good version, bindings, and configuration from TOML files.

use timeshard_policy::signing::{self, Identity};
use timeshard_policy::{Binding, Bindings, Config, FailureKind, Kind, PolicyError, PolicyRef, Registry, Settings};

use crate::common::*;

#[test]
fn unsigned_modules_are_refused() {
    let f = Fixture::new();
    let mut m = f.module("noop", "1.0.0", Kind::Ingest, Settings::default());
    m.signature = None;
    let err = f.registry.install(m).unwrap_err();
    assert!(matches!(err, PolicyError::Unsigned { .. }), "{err}");
    assert!(err.to_string().contains("timeshard policy sign"), "{err}");
}

#[test]
fn tampered_modules_are_refused_before_compilation() {
    let f = Fixture::new();
    let mut m = f.module("noop", "1.0.0", Kind::Ingest, Settings::default());
    let last = m.wasm.len() - 1;
    m.wasm[last] ^= 1;
    let err = f.registry.install(m).unwrap_err();
    assert!(matches!(err, PolicyError::BadSignature { .. }), "{err}");
    assert!(err.to_string().contains("changed after signing"), "{err}");
    // Refused before compilation: nothing reached the component cache.
    assert_eq!(f.registry.cached_components(), 0);
}

#[test]
fn modules_signed_with_an_untrusted_key_are_refused() {
    let f = Fixture::new();
    let other = signing::generate_keypair().unwrap();
    let mut m = f.module("noop", "1.0.0", Kind::Ingest, Settings::default());
    let identity = Identity::new(m.policy.clone(), m.kind);
    m.signature = Some(signing::sign(&other, &m.wasm, &identity).to_text());
    let err = f.registry.install(m).unwrap_err();
    let PolicyError::Untrusted { key, .. } = &err else {
        panic!("expected untrusted, got {err}");
    };
    assert_eq!(*key, other.public().to_string());
    assert_eq!(f.registry.cached_components(), 0);
}

#[test]
fn garbled_signatures_are_refused() {
    let f = Fixture::new();
    let mut m = f.module("noop", "1.0.0", Kind::Ingest, Settings::default());
    m.signature = Some("timeshard-policy-signature-v1\nkey zz\n".into());
    let err = f.registry.install(m).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Signature, "{err}");
}

#[test]
fn a_new_version_swaps_in_and_a_bad_one_leaves_the_last_good() {
    let f = Fixture::new();
    // v1 converts by x1000, bound by name only: it follows the current version.
    f.install_everywhere("unit-convert", Kind::Ingest, settings(&[("scale", "1000")]));
    let run = || f.registry.ingest(&series(), points(&[2.0])).unwrap();
    assert_eq!(run().keep[0].value, 2000.0);

    // v2 swaps in for the next batch.
    let v2 = f.module("unit-convert", "2.0.0", Kind::Ingest, settings(&[("scale", "10")]));
    f.registry.install(v2).unwrap();
    let out = run();
    assert_eq!(out.keep[0].value, 20.0);
    assert_eq!(out.policy.unwrap().version, "2.0.0");

    // v3 is tampered, v4 is not a component, v5 imports WASI: all refused, v2 keeps running.
    let mut v3 = f.module("unit-convert", "3.0.0", Kind::Ingest, Settings::default());
    v3.wasm.push(0);
    assert!(f.registry.install(v3).is_err());
    let v4 = f.module_from_bytes("unit-convert", "4.0.0", Kind::Ingest, b"junk".to_vec(), Settings::default());
    assert!(f.registry.install(v4).is_err());
    let v5 = f.module_from_bytes("unit-convert", "5.0.0", Kind::Ingest, wasm("hostile-wasi-fs"), Settings::default());
    assert!(f.registry.install(v5).is_err());
    let out = run();
    assert_eq!(out.keep[0].value, 20.0);
    assert_eq!(out.policy.unwrap().version, "2.0.0");

    let running = f.registry.running();
    assert_eq!(running.len(), 2);
    assert!(running.iter().any(|r| r.policy.version == "2.0.0" && r.current));
    assert!(running.iter().any(|r| r.policy.version == "1.0.0" && !r.current));
}

#[test]
fn pinned_bindings_keep_their_version() {
    let f = Fixture::new();
    f.registry.install(f.module("unit-convert", "1.0.0", Kind::Ingest, settings(&[("scale", "2")]))).unwrap();
    f.registry
        .bind(Bindings(vec![Binding { ingest: Some("unit-convert@1.0.0".parse().unwrap()), ..Binding::default() }]))
        .unwrap();
    f.registry.install(f.module("unit-convert", "2.0.0", Kind::Ingest, settings(&[("scale", "3")]))).unwrap();
    let out = f.registry.ingest(&series(), points(&[1.0])).unwrap();
    assert_eq!(out.keep[0].value, 2.0);
}

#[test]
fn bindings_naming_missing_or_mismatched_policies_are_refused() {
    let f = Fixture::new();
    f.install_everywhere("noop", Kind::Ingest, Settings::default());
    let missing = Bindings(vec![Binding { ingest: Some("nope".parse().unwrap()), ..Binding::default() }]);
    let err = f.registry.bind(missing).unwrap_err();
    assert!(matches!(err, PolicyError::NotInstalled { .. }), "{err}");
    let wrong_kind = Bindings(vec![Binding { query: vec!["noop".parse().unwrap()], ..Binding::default() }]);
    assert!(f.registry.bind(wrong_kind).is_err());
    // The old bindings stay.
    assert!(f.registry.ingest_policy(&series()).is_some());
}

#[test]
fn selectors_match_metric_prefix_and_tags_first_binding_wins() {
    let f = Fixture::new();
    f.registry.install(f.module("noop", "1.0.0", Kind::Ingest, Settings::default())).unwrap();
    f.registry.install(f.module("deadband", "1.0.0", Kind::Ingest, settings(&[("d", "1")]))).unwrap();
    f.registry.install(f.module("rms", "1.0.0", Kind::Query, Settings::default())).unwrap();
    let toml = r#"
        [[bindings]]
        select = { metric_prefix = "pmu.", tags = { site = "atl" } }
        ingest = "deadband"
        query = ["rms@1.0.0"]

        [[bindings]]
        ingest = "noop"
    "#;
    let config: Config = toml::from_str(toml).unwrap();
    f.registry.bind(config.bindings).unwrap();
    let policy = |s: &str| f.registry.ingest_policy(&s.parse().unwrap()).map(|p| p.name);
    assert_eq!(policy("pmu.phase{bus=7,site=atl}").as_deref(), Some("deadband"));
    assert_eq!(policy("pmu.phase{bus=7,site=nyc}").as_deref(), Some("noop"));
    assert_eq!(policy("grid.freq{site=atl}").as_deref(), Some("noop"));
    assert_eq!(f.registry.query_policies(&series()).len(), 1);
    assert!(f.registry.query_policies(&"x{site=nyc}".parse().unwrap()).is_empty());
}

#[test]
fn a_node_configures_itself_from_toml_and_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let key = signing::generate_keypair().unwrap();
    let key_path = dir.path().join("policy.key");
    key.write(&key_path).unwrap();
    for (guest, version, kind) in [("pmu-validate", "1.0.0", Kind::Ingest), ("rms", "0.1.0", Kind::Query)] {
        let path = dir.path().join(format!("{guest}.wasm"));
        std::fs::write(&path, wasm(guest)).unwrap();
        signing::sign_file(&key_path, &path, &Identity::new(PolicyRef::new(guest, version).unwrap(), kind), None)
            .unwrap();
    }
    let public = std::fs::read_to_string(dir.path().join("policy.key.pub")).unwrap();
    let toml = format!(
        r#"
        trusted_keys = [{public:?}]
        deadline_ms = 5000

        [[modules]]
        name = "pmu-validate"
        version = "1.0.0"
        kind = "ingest"
        wasm = "pmu-validate.wasm"
        on_failure = "pass-through"
        config = {{ min = "-1", max = "1" }}

        [[modules]]
        name = "rms"
        version = "0.1.0"
        kind = "query"
        wasm = "rms.wasm"

        [[bindings]]
        select = {{ metric_prefix = "pmu." }}
        ingest = "pmu-validate"
        query = ["rms"]
        "#
    );
    let config: Config = toml::from_str(&toml).unwrap();
    let (registry, report) = Registry::from_config(&config, dir.path()).unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(registry.limits().deadline.as_millis(), 5000);
    let out = registry.ingest(&series(), points(&[0.5, 2.0])).unwrap();
    assert_eq!(out.keep.len(), 1);
    assert_eq!(out.rejected.len(), 1);

    // Reload with a module whose file is now unsigned: reported, the old version stays.
    std::fs::write(dir.path().join("pmu-validate-2.wasm"), wasm("noop")).unwrap();
    let mut next = config.clone();
    next.modules[0].version = "2.0.0".into();
    next.modules[0].wasm = "pmu-validate-2.wasm".into();
    let report = registry.apply(&next, dir.path());
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].1.kind(), FailureKind::Signature);
    let out = registry.ingest(&series(), points(&[0.5, 2.0])).unwrap();
    assert_eq!(out.policy.unwrap().version, "1.0.0");
    assert_eq!(out.keep.len(), 1);

    // A node that trusts nobody runs nothing.
    let untrusting = Config { trusted_keys: vec![], ..config };
    let (registry, report) = Registry::from_config(&untrusting, dir.path()).unwrap();
    assert_eq!(report.failed.len(), 2);
    assert!(report.bindings_error.is_some());
    assert!(registry.running().is_empty());
}

#[test]
fn compiled_components_are_cached_by_content() {
    let f = Fixture::new();
    for v in ["1.0.0", "1.0.1", "1.0.2"] {
        f.registry.install(f.module("noop", v, Kind::Ingest, Settings::default())).unwrap();
    }
    assert_eq!(f.registry.cached_components(), 1);
    f.registry.install(f.module("deadband", "1.0.0", Kind::Ingest, Settings::default())).unwrap();
    assert_eq!(f.registry.cached_components(), 2);
}

/// A configuration directory with a signing key, and the `[policy]` section that trusts it.
struct ConfigDir {
    dir: tempfile::TempDir,
    key_path: std::path::PathBuf,
    public: String,
}

impl ConfigDir {
    fn new() -> ConfigDir {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("policy.key");
        signing::generate_keypair().unwrap().write(&key_path).unwrap();
        let public = std::fs::read_to_string(dir.path().join("policy.key.pub")).unwrap();
        ConfigDir { dir, key_path, public }
    }

    /// A configuration: `modules` as (name, version, kind, guest), each a copy of the guest
    /// signed as what it is installed as, then the TOML of bindings.
    fn config(&self, modules: &[(&str, &str, &str, &str)], bindings: &str) -> Config {
        let mut toml = format!("trusted_keys = [{:?}]\ndeadline_ms = 10000\n", self.public);
        for (name, version, kind, guest) in modules {
            let file = format!("{name}-{version}.wasm");
            let path = self.dir.path().join(&file);
            std::fs::write(&path, wasm(guest)).unwrap();
            let identity = Identity::new(PolicyRef::new(name, version).unwrap(), kind.parse().unwrap());
            signing::sign_file(&self.key_path, &path, &identity, None).unwrap();
            toml += &format!("[[modules]]\nname = {name:?}\nversion = {version:?}\nkind = {kind:?}\nwasm = {file:?}\n");
        }
        toml::from_str(&(toml + bindings)).unwrap()
    }
}

#[test]
fn a_module_removed_from_the_configuration_stops_running() {
    let d = ConfigDir::new();
    let bound = "[[bindings]]\ningest = \"noop\"\n";
    let (registry, report) =
        Registry::from_config(&d.config(&[("noop", "1.0.0", "ingest", "noop")], bound), d.dir.path()).unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(registry.ingest(&series(), points(&[1.0])).unwrap().policy.unwrap().name, "noop");

    // The operator removes the module and its binding: the node no longer runs or reports it.
    let report = registry.apply(&d.config(&[], ""), d.dir.path());
    assert!(report.is_ok(), "{report:?}");
    assert!(registry.running().is_empty(), "{:?}", registry.running());

    // So a binding that names it without the configuration installing it is refused.
    let report = registry.apply(&d.config(&[], bound), d.dir.path());
    let err = report.bindings_error.expect("a binding to a module the configuration does not install");
    assert!(matches!(err, PolicyError::NotInstalled { .. }), "{err}");
    assert!(registry.ingest(&series(), points(&[1.0])).unwrap().policy.is_none());
}

#[test]
fn a_configuration_applies_as_a_whole() {
    // `stats` is an ingest policy, then becomes a query policy with new bindings to match. Each
    // module was installed against the old bindings, which bind `stats` as an ingest policy,
    // so the new version was refused and the new configuration could never be applied.
    let d = ConfigDir::new();
    let (registry, report) = Registry::from_config(
        &d.config(&[("stats", "1.0.0", "ingest", "noop")], "[[bindings]]\ningest = \"stats\"\n"),
        d.dir.path(),
    )
    .unwrap();
    assert!(report.is_ok(), "{report:?}");

    let next = d.config(&[("stats", "2.0.0", "query", "rms")], "[[bindings]]\nquery = [\"stats\"]\n");
    let report = registry.apply(&next, d.dir.path());
    assert!(report.is_ok(), "{report:?}");
    assert!(registry.ingest_policy(&series()).is_none());
    let range = timeshard_proto::TimeRange::new(T0, T0 + 1_000_000_000).unwrap();
    let partials = registry.query_map("stats", &series(), range, &points(&[3.0]), &Default::default()).unwrap();
    assert_eq!(partials[0].policy.to_string(), "stats@2.0.0");
}

#[test]
fn refused_bindings_keep_the_old_ones_with_the_modules_they_use() {
    let d = ConfigDir::new();
    let (registry, _) = Registry::from_config(
        &d.config(&[("noop", "1.0.0", "ingest", "noop")], "[[bindings]]\ningest = \"noop\"\n"),
        d.dir.path(),
    )
    .unwrap();
    // A typo in the bindings of a configuration that also drops `noop` and adds `rms`.
    let next = d.config(&[("rms", "1.0.0", "query", "rms")], "[[bindings]]\ningest = \"nop\"\nquery = [\"rms\"]\n");
    let report = registry.apply(&next, d.dir.path());
    assert!(report.bindings_error.is_some(), "{report:?}");
    assert_eq!(report.installed.len(), 1, "{report:?}");
    assert_eq!(registry.ingest(&series(), points(&[1.0])).unwrap().policy.unwrap().name, "noop");
    assert_eq!(registry.running().len(), 2);
}

/// A signature's minimum version revokes the older versions of its name: they stop running
/// when it is installed, are refused afterwards whatever their signature, and stay refused in
/// a new registry over the same floors file (a restart, or old signed files replayed by
/// whoever can push configuration to the node).
#[test]
fn a_minimum_version_revokes_older_versions_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("policy-floors.json");
    let f = Fixture::new();
    f.registry.keep_floors_in(&floors).unwrap();
    let old = || f.module("unit-convert", "1.0.0", Kind::Ingest, settings(&[("scale", "1000")]));
    f.registry.install(old()).unwrap();
    let run = |r: &Registry| r.ingest(&series(), points(&[2.0])).unwrap();
    f.registry
        .bind(Bindings(vec![Binding { ingest: Some("unit-convert".parse().unwrap()), ..Binding::default() }]))
        .unwrap();
    assert_eq!(run(&f.registry).keep[0].value, 2000.0);

    // 1.3.0, signed revoking everything below it.
    let policy = PolicyRef::new("unit-convert", "1.3.0").unwrap();
    let bytes = wasm("unit-convert");
    let sig =
        signing::sign_revoking_below(&f.key, &bytes, &Identity::new(policy.clone(), Kind::Ingest), "1.3.0").unwrap();
    let mut fixed = f.module("unit-convert", "1.3.0", Kind::Ingest, settings(&[("scale", "10")]));
    fixed.signature = Some(sig.to_text());
    f.registry.install(fixed).unwrap();
    assert_eq!(run(&f.registry).keep[0].value, 20.0);
    let running: Vec<String> = f.registry.running().iter().map(|r| r.policy.to_string()).collect();
    assert_eq!(running, ["unit-convert@1.3.0"], "the revoked version stopped running");
    assert_eq!(f.registry.floor("unit-convert"), Some(semver::Version::new(1, 3, 0)));

    // The old version, validly signed, is refused now, and after a restart.
    let err = f.registry.install(old()).unwrap_err();
    assert!(matches!(err, PolicyError::Revoked { .. }), "{err}");
    assert!(err.to_string().contains("below 1.3.0"), "{err}");
    let restarted = Registry::new(test_limits(), signing::TrustedKeys::new([f.key.public()])).unwrap();
    restarted.keep_floors_in(&floors).unwrap();
    let report = restarted.apply_modules(vec![old()], Vec::new(), Bindings::default());
    assert!(report.installed.is_empty(), "{report:?}");
    assert!(matches!(report.failed[0].1, PolicyError::Revoked { .. }), "{report:?}");
    // A later version is fine; a registry that keeps no floors (no file) knows nothing of it.
    f.registry.install(f.module("unit-convert", "1.4.0", Kind::Ingest, Settings::default())).unwrap();
    let forgetful = Registry::new(test_limits(), signing::TrustedKeys::new([f.key.public()])).unwrap();
    forgetful.install(old()).unwrap();
}

/// A binding that pins a version the new module would revoke blocks the install, naming it;
/// nothing changes until the binding is moved.
#[test]
fn a_pinned_binding_blocks_revoking_its_version() {
    let f = Fixture::new();
    f.registry.install(f.module("unit-convert", "1.0.0", Kind::Ingest, Settings::default())).unwrap();
    f.registry
        .bind(Bindings(vec![Binding { ingest: Some("unit-convert@1.0.0".parse().unwrap()), ..Binding::default() }]))
        .unwrap();
    let policy = PolicyRef::new("unit-convert", "2.0.0").unwrap();
    let bytes = wasm("unit-convert");
    let sig = signing::sign_revoking_below(&f.key, &bytes, &Identity::new(policy, Kind::Ingest), "2.0.0").unwrap();
    let mut next = f.module("unit-convert", "2.0.0", Kind::Ingest, Settings::default());
    next.signature = Some(sig.to_text());
    let err = f.registry.install(next).unwrap_err();
    assert!(err.to_string().contains("unit-convert@1.0.0"), "{err}");
    assert_eq!(f.registry.floor("unit-convert"), None);
    assert_eq!(f.registry.running().len(), 1);
}

//! Helpers shared by the integration tests: the built guest components, a signing key, and
//! registries with signed modules installed.

#![allow(dead_code)]

use std::path::PathBuf;

use timeshard_policy::signing::{self, Identity, SecretKey, TrustedKeys};
use timeshard_policy::{Kind, Limits, Module, PolicyRef, Registry, Settings};
use timeshard_proto::{Point, SeriesKey};

/// The guest workspace.
pub fn guest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest")
}

/// The bytes of guest component `name`, built by guest/build.sh.
pub fn wasm(name: &str) -> Vec<u8> {
    let path = timeshard_policy::guest_artifact(&guest_dir(), name)
        .unwrap_or_else(|e| panic!("{e} (the tests need the guests: run guest/build.sh)"));
    std::fs::read(path).unwrap()
}

/// A signing key and a registry that trusts it.
pub struct Fixture {
    pub key: SecretKey,
    pub registry: Registry,
}

impl Fixture {
    /// A fixture whose calls have a generous deadline: the tests share two busy cores, and a
    /// test about what a policy computes must not fail because its thread waited for a CPU.
    /// Tests about deadlines set their own.
    pub fn new() -> Fixture {
        Fixture::with_limits(test_limits())
    }

    pub fn with_limits(limits: Limits) -> Fixture {
        let key = signing::generate_keypair().unwrap();
        let registry = Registry::new(limits, TrustedKeys::new([key.public()])).unwrap();
        Fixture { key, registry }
    }

    /// A module of guest `guest`, signed with the fixture's key.
    pub fn module(&self, guest: &str, version: &str, kind: Kind, settings: Settings) -> Module {
        self.module_from_bytes(guest, version, kind, wasm(guest), settings)
    }

    pub fn module_from_bytes(
        &self,
        name: &str,
        version: &str,
        kind: Kind,
        bytes: Vec<u8>,
        settings: Settings,
    ) -> Module {
        let policy = PolicyRef::new(name, version).unwrap();
        let signature = signing::sign(&self.key, &bytes, &Identity::new(policy.clone(), kind)).to_text();
        Module { policy, kind, wasm: bytes, signature: Some(signature), settings }
    }

    /// Installs guest `guest` and binds it to every series (ingest or query by `kind`).
    pub fn install_everywhere(&self, guest: &str, kind: Kind, settings: Settings) -> PolicyRef {
        let r = self.registry.install(self.module(guest, "1.0.0", kind, settings)).unwrap();
        let mut binding = timeshard_policy::Binding::default();
        match kind {
            Kind::Ingest => binding.ingest = Some(guest.parse().unwrap()),
            Kind::Query => binding.query = vec![guest.parse().unwrap()],
        }
        self.registry.bind(timeshard_policy::Bindings(vec![binding])).unwrap();
        r
    }
}

/// The default limits with a 10 s deadline.
pub fn test_limits() -> Limits {
    Limits { deadline: std::time::Duration::from_secs(10), ..Limits::default() }
}

pub fn settings(config: &[(&str, &str)]) -> Settings {
    Settings { config: config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Settings::default() }
}

pub fn series() -> SeriesKey {
    "pmu.phase{bus=7,site=atl}".parse().unwrap()
}

pub const T0: i64 = 1_700_000_000_000_000_000;

/// Points at 60 Hz from T0 with the given values.
pub fn points(values: &[f64]) -> Vec<Point> {
    values.iter().enumerate().map(|(i, &v)| Point::new(T0 + i as i64 * 1_000_000_000 / 60, v)).collect()
}

//! Policy modules from the control plane on an enrolled node.
//!
//! The desired state names each module (name, version, kind, SHA-256, the fleet key's
//! signature) and how to bind it. The node fetches modules it lacks into
//! `<data_dir>/control/modules/<sha256>.wasm` (checked against the hash, written atomically),
//! and applies them together with its own `[policy]` modules: the registry verifies each
//! signature (by the fleet's policy key, over hash, name, version and kind) before compiling,
//! and swaps the whole set in atomically. A module that cannot be fetched or loaded leaves the
//! version of its name that ran before; the node reports it. A node that cannot reach the
//! control plane runs what its cache holds.
//!
//! The fleet's policy key is pinned the first time the node is told it (at enrollment, or at
//! the first upload of a fleet that had none), in `<data_dir>/control/policy-key`: a control
//! plane that later names another key is not believed, so a compromised service cannot make
//! the nodes trust a key of its own (with offline signing, `serve --policy-public-key`, it
//! holds no key that nodes trust at all).
//!
//! [`bindings`] (which series get which module) is pure; the rest reads and writes the cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use timeshard_control_api::NodeClient;
use timeshard_control_api::api::PolicyLoadError;
use timeshard_control_api::files::write_atomic;
use timeshard_control_api::policy::{Kind, PolicyAssignment, SeriesSelector};
use timeshard_policy::signing::{self, TrustedKeys};
use timeshard_policy::{
    Binding, Bindings, Module, OnFailure, PolicyError, PolicyRef, PolicySpec, Registry, Selector, Settings,
};
use tracing::{info, warn};

/// The cache's directory under the enrollment's (`<data_dir>/control`).
pub const MODULES_DIR: &str = "modules";
/// The pinned policy key's file under the enrollment's directory.
pub const PINNED_KEY_FILE: &str = "policy-key";

/// What the control plane tells the node to run, as last applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlPolicies {
    /// The fleet's policy public key (text).
    pub key: Option<String>,
    pub assignments: Vec<PolicyAssignment>,
}

/// The control plane's policies a node runs, and what did not load (for its reports).
#[derive(Debug, Default)]
pub struct Applied {
    pub control: ControlPolicies,
    /// The `[policy]` section as last re-read (SIGHUP); `None`: the one the node started with.
    pub file: Option<timeshard_policy::Config>,
    pub errors: Vec<PolicyLoadError>,
    /// Some module could not be fetched: try again.
    pub unavailable: bool,
    /// Whether `control` was applied at all since the node started.
    pub synced: bool,
}

/// The module cache of the node whose data directory is `data_dir`.
pub fn cache_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(timeshard_control_api::files::CONTROL_DIR).join(MODULES_DIR)
}

/// The fleet's policy key the node trusts: the one pinned in `control_dir`, else `offered`
/// (the control plane's), which is pinned then. Another key offered later is refused, loudly.
pub fn pinned_key(control_dir: &Path, offered: Option<&str>) -> Option<signing::PublicKey> {
    let path = control_dir.join(PINNED_KEY_FILE);
    let offered = offered.and_then(|text| {
        signing::PublicKey::from_text(text)
            .inspect_err(|e| warn!(error = %e, "the fleet's policy key from the control plane is unreadable"))
            .ok()
    });
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let pinned = signing::PublicKey::from_text(&text)
                .inspect_err(|e| warn!(path = %path.display(), error = %e, "the pinned policy key is unreadable; trusting no fleet key"))
                .ok()?;
            if let Some(other) = offered.filter(|k| *k != pinned) {
                warn!(
                    path = %path.display(),
                    pinned = %pinned,
                    offered = %other,
                    "the control plane names another policy key than the one pinned at enrollment; refusing it \
                     (modules it signed will not load). To trust a new key, remove the pinned key file (path) on the device"
                );
            }
            Some(pinned)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = offered?;
            if let Err(e) = std::fs::create_dir_all(control_dir)
                .map_err(|e| e.to_string())
                .and_then(|()| write_atomic(&path, key.to_text().as_bytes(), false).map_err(|e| e.to_string()))
            {
                warn!(path = %path.display(), error = %e, "cannot pin the fleet's policy key; trusting it for now");
            } else {
                info!(key = %key, "pinned the fleet's policy key");
            }
            Some(key)
        }
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the pinned policy key; trusting no fleet key");
            None
        }
    }
}

/// The cache file of the module whose hash is `sha256`.
pub fn cached(dir: &Path, sha256: &str) -> PathBuf {
    dir.join(format!("{sha256}.wasm"))
}

fn load_error(name: &str, version: &str, error: impl ToString) -> PolicyLoadError {
    PolicyLoadError { name: name.to_string(), version: version.to_string(), error: error.to_string() }
}

/// The bindings of `assignments`: bound modules grouped by series selector, the most specific
/// selector first (the first matching binding decides a series' policies). Two ingest policies
/// on one selector cannot both run: the first by name does, the other is an error.
pub fn bindings(assignments: &[PolicyAssignment]) -> (Bindings, Vec<PolicyLoadError>) {
    let mut groups: BTreeMap<&SeriesSelector, Binding> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut bound: Vec<&PolicyAssignment> = assignments.iter().filter(|a| a.bound).collect();
    bound.sort_by(|a, b| a.name.cmp(&b.name));
    for a in bound {
        let binding = groups.entry(&a.series).or_insert_with(|| Binding {
            select: Selector { metric_prefix: a.series.metric_prefix.clone(), tags: a.series.tags.clone() },
            ..Binding::default()
        });
        let spec = PolicySpec { name: a.name.clone(), version: Some(a.version.clone()) };
        match a.kind {
            Kind::Query => binding.query.push(spec),
            Kind::Ingest => match &binding.ingest {
                None => binding.ingest = Some(spec),
                Some(first) => errors.push(load_error(
                    &a.name,
                    &a.version,
                    format!(
                        "ingest policy {first} is bound to the same series ({}) on this node; only it runs",
                        a.series
                    ),
                )),
            },
        }
    }
    let mut list: Vec<(&SeriesSelector, Binding)> = groups.into_iter().collect();
    list.sort_by(|(a, _), (b, _)| {
        (b.metric_prefix.len(), b.tags.len()).cmp(&(a.metric_prefix.len(), a.tags.len())).then(a.cmp(b))
    });
    (Bindings(list.into_iter().map(|(_, b)| b).collect()), errors)
}

fn settings(a: &PolicyAssignment) -> Settings {
    Settings {
        on_failure: if a.settings.pass_through { OnFailure::PassThrough } else { OnFailure::Reject },
        deadline_ms: a.settings.deadline_ms,
        memory_mib: a.settings.memory_mib,
        config: a.settings.config.clone(),
    }
}

/// Re-applies the node's own `[policy]` section (SIGHUP) on an enrolled node, with the control
/// plane's modules `applied` holds: new versions swap in atomically, and a module that fails to
/// load leaves the last good version running.
pub fn reload(applied: &mut Applied, registry: &Registry, config: &crate::config::NodeConfig) {
    let dir = cache_dir(&config.data_dir);
    let control = applied.control.clone();
    applied.errors = apply(registry, &config.policy, &config.base_dir, &control, &dir, Vec::new());
    // Later changes from the control plane apply with this section.
    applied.file = Some(config.policy.clone());
    info!(running = ?registry.running().iter().map(|r| r.policy.to_string()).collect::<Vec<_>>(), "policies reloaded");
}

/// Installs `control`'s modules from the cache (with the node's own), as a node starts: no
/// network needed. Modules the cache lacks are left to the follower to fetch.
pub fn from_cache(registry: &Registry, config: &crate::config::NodeConfig, control: &ControlPolicies) -> Applied {
    let dir = cache_dir(&config.data_dir);
    let lacking: Vec<PolicyLoadError> = control
        .assignments
        .iter()
        .filter(|a| !cached(&dir, &a.sha256).exists())
        .map(|a| load_error(&a.name, &a.version, "its module is not in the cache yet"))
        .collect();
    let unavailable = !lacking.is_empty();
    let errors = apply(registry, &config.policy, &config.base_dir, control, &dir, lacking);
    Applied { control: control.clone(), file: None, errors, unavailable, synced: true }
}

/// Fetches the modules of `assignments` the cache lacks. Returns those it could not fetch.
pub async fn fetch_missing(client: &NodeClient, dir: &Path, assignments: &[PolicyAssignment]) -> Vec<PolicyLoadError> {
    let mut failed = Vec::new();
    for a in assignments {
        let path = cached(dir, &a.sha256);
        if path.exists() {
            continue;
        }
        let fetched = async {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let bytes = client.fetch_module(&a.sha256).await.map_err(|e| e.to_string())?;
            write_atomic(&path, &bytes, false).map_err(|e| e.to_string())?;
            Ok::<_, String>(bytes.len())
        };
        match fetched.await {
            Ok(size) => info!(policy = %a.label(), size, "fetched a policy module from the control plane"),
            Err(e) => {
                warn!(policy = %a.label(), error = %e, "cannot fetch a policy module; the version running keeps running");
                failed.push(load_error(&a.name, &a.version, format!("cannot fetch its module: {e}")));
            }
        }
    }
    failed
}

/// A control plane module from the cache, checked against its hash.
fn read_cached(dir: &Path, a: &PolicyAssignment) -> Result<Module, PolicyError> {
    let policy = PolicyRef::new(&a.name, &a.version)?;
    let path = cached(dir, &a.sha256);
    let wasm = std::fs::read(&path).map_err(|source| PolicyError::Io { path: path.clone(), source })?;
    if signing::hex(&signing::sha256(&wasm)) != a.sha256 {
        // Damaged on disk: the next attempt fetches it again.
        let _ = std::fs::remove_file(&path);
        return Err(PolicyError::Config(format!("the cached module {} does not match its hash", path.display())));
    }
    Ok(Module { policy, kind: a.kind, wasm, signature: Some(a.signature.clone()), settings: settings(a) })
}

/// Makes `registry` run `control`'s modules (from the cache in `dir`) and those of the node's
/// own `[policy]` section `file` (paths relative to `base_dir`), with the control plane's
/// bindings first. Trusts the file's keys and the fleet's. Returns what did not load (the
/// versions running before keep running) and `unavailable`, the modules not fetched.
pub fn apply(
    registry: &Registry,
    file: &timeshard_policy::Config,
    base_dir: &Path,
    control: &ControlPolicies,
    dir: &Path,
    unavailable: Vec<PolicyLoadError>,
) -> Vec<PolicyLoadError> {
    let mut keys = file.trusted().map(|t| t.keys().to_vec()).unwrap_or_else(|e| {
        warn!(error = %e, "the [policy] section's trusted_keys are unreadable");
        Vec::new()
    });
    let control_dir = dir.parent().unwrap_or(dir);
    keys.extend(pinned_key(control_dir, control.key.as_deref()));
    registry.set_trusted(TrustedKeys::new(keys));

    let (mut modules, mut missing) = (Vec::new(), Vec::new());
    let mut errors = unavailable;
    let not_fetched: Vec<(String, String)> = errors.iter().map(|e| (e.name.clone(), e.version.clone())).collect();
    // An unbound (stable) version first: where several versions of a name load, the last is
    // the current one.
    let mut ordered: Vec<&PolicyAssignment> = control.assignments.iter().collect();
    ordered.sort_by_key(|a| a.bound);
    for a in ordered {
        let Ok(policy) = PolicyRef::new(&a.name, &a.version) else { continue };
        if not_fetched.contains(&(a.name.clone(), a.version.clone())) {
            missing.push((policy, PolicyError::Config("its module is not fetched yet".into())));
            continue;
        }
        match read_cached(dir, a) {
            Ok(module) => modules.push(module),
            Err(e) => missing.push((policy, e)),
        }
    }
    let controlled: Vec<&str> = control.assignments.iter().map(|a| a.name.as_str()).collect();
    for m in &file.modules {
        if controlled.contains(&m.name.as_str()) {
            warn!(policy = %m.name, "the control plane assigns this policy; the [policy] section's module of that name is ignored");
            continue;
        }
        let policy = PolicyRef { name: m.name.clone(), version: m.version.clone() };
        let wasm = base_dir.join(&m.wasm);
        let sig = m.signature.as_ref().map(|s| base_dir.join(s));
        match Module::from_files(policy.clone(), m.kind, &wasm, sig.as_deref(), m.settings.clone()) {
            Ok(module) => modules.push(module),
            Err(e) => missing.push((policy, e)),
        }
    }
    let (mut bound, conflicts) = bindings(&control.assignments);
    errors.extend(conflicts);
    bound.0.extend(file.bindings.0.iter().cloned());
    let report = registry.apply_modules(modules, missing, bound);
    for (policy, e) in report.failed {
        if !errors.iter().any(|x| x.name == policy.name && x.version == policy.version) {
            warn!(%policy, error = %e, "policy not loaded; the version running before keeps running");
            errors.push(load_error(&policy.name, &policy.version, e));
        }
    }
    if let Some(e) = report.bindings_error {
        warn!(error = %e, "policy bindings not applied; the previous ones stay");
        errors.push(load_error("(bindings)", "-", e));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_control_api::policy::PolicySettings;

    #[test]
    fn the_first_policy_key_offered_is_pinned_and_another_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        let (a, b) = (signing::generate_keypair().unwrap().public(), signing::generate_keypair().unwrap().public());
        assert_eq!(pinned_key(&control, None), None, "nothing offered, nothing pinned");
        assert_eq!(pinned_key(&control, Some(&a.to_text())), Some(a));
        assert_eq!(pinned_key(&control, Some(&b.to_text())), Some(a), "another key is refused");
        assert_eq!(pinned_key(&control, None), Some(a), "the pin holds without the control plane");
        assert_eq!(pinned_key(&control, Some("not a key")), Some(a));
        std::fs::remove_file(control.join(PINNED_KEY_FILE)).unwrap();
        assert_eq!(pinned_key(&control, Some(&b.to_text())), Some(b), "removing the pin by hand re-pins");
    }

    fn assignment(name: &str, kind: Kind, prefix: &str, bound: bool) -> PolicyAssignment {
        PolicyAssignment {
            name: name.into(),
            version: "1.0.0".into(),
            kind,
            sha256: "00".repeat(32),
            size: 1,
            signature: String::new(),
            bound,
            series: SeriesSelector { metric_prefix: prefix.into(), ..Default::default() },
            settings: PolicySettings::default(),
        }
    }

    #[test]
    fn bindings_group_by_series_most_specific_first() {
        let (b, errors) = bindings(&[
            assignment("rms", Kind::Query, "pmu.", true),
            assignment("validate", Kind::Ingest, "pmu.", true),
            assignment("all", Kind::Ingest, "", true),
            assignment("phase", Kind::Ingest, "pmu.phase", true),
            assignment("old-rms", Kind::Query, "pmu.", false),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        let got: Vec<(String, Option<String>, Vec<String>)> =
            b.0.iter()
                .map(|b| {
                    let query = b.query.iter().map(|q| q.to_string()).collect();
                    (b.select.metric_prefix.clone(), b.ingest.as_ref().map(|i| i.to_string()), query)
                })
                .collect();
        assert_eq!(
            got,
            [
                ("pmu.phase".into(), Some("phase@1.0.0".into()), vec![]),
                ("pmu.".into(), Some("validate@1.0.0".into()), vec!["rms@1.0.0".into()]),
                ("".into(), Some("all@1.0.0".into()), vec![]),
            ]
        );
    }

    #[test]
    fn two_ingest_policies_on_one_selector_are_an_error() {
        let (b, errors) =
            bindings(&[assignment("b", Kind::Ingest, "pmu.", true), assignment("a", Kind::Ingest, "pmu.", true)]);
        assert_eq!(b.0[0].ingest.as_ref().unwrap().name, "a");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].error.contains("only it runs"), "{errors:?}");
    }
}

//! The policies a node runs and which series they apply to: installing signed modules,
//! bindings from series selectors to policies, atomic swaps, and the calls the node makes.
//!
//! Implementation notes:
//! - The installed policies and the bindings form one immutable [`State`] behind
//!   `RwLock<Arc<State>>`. A call clones the `Arc` and runs without any lock; an install or a
//!   rebinding builds a new state and swaps it in, so every batch sees either the old or the
//!   new state, never a mix, and a call already running finishes on the version it started
//!   with.
//! - Installing verifies the signature, compiles and type-checks before touching the state: a
//!   module that fails any step changes nothing, so the last good version keeps running.
//! - Applying a configuration loads all its modules first, then builds the whole next state
//!   (modules and bindings, checked together) and swaps it in once: no batch sees the new
//!   modules with the old bindings, and a change that needs both (a name that changes kind)
//!   applies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timeshard_proto::{Point, SeriesKey, TimeRange};

use crate::call::{self, Loaded};
use crate::engine::{CallLimits, Limits, Runtime};
use crate::floors::Floors;
use crate::signing::{self, Identity, Signature, SigningError, TrustedKeys};
use crate::stats::{CallCounters, CallStats};
use crate::{Failure, IngestOutcome, Kind, Params, Partial, PolicyError, PolicyRef, PolicySpec, QueryResult};

/// What to do with a batch when its ingest policy fails (trap, timeout, limit, error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Refuse the batch with the failure as the reason (the default: a validating policy
    /// that cannot run must not let unvalidated data in).
    #[default]
    Reject,
    /// Store the batch unprocessed, and say so in the outcome.
    PassThrough,
}

/// A policy's settings in the node configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// What to do with a batch when the ingest policy fails.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Deadline of each call in milliseconds (default: the node's, 10 ms).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Memory cap in MiB (default and maximum: the node's, 64 MiB).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Values passed to an ingest policy with every batch (e.g. `d = "0.5"` for deadband).
    #[serde(default)]
    pub config: Params,
}

/// A policy module to install: its bytes, its detached signature and its settings.
#[derive(Clone, Debug)]
pub struct Module {
    pub policy: PolicyRef,
    pub kind: Kind,
    pub wasm: Vec<u8>,
    /// The text of the `.sig` file; `None` when there is none (refused).
    pub signature: Option<String>,
    pub settings: Settings,
}

impl Module {
    /// Reads `wasm` and its signature, `WASM.sig` unless `signature` names another file. A
    /// missing signature file is not an error here: installing refuses the module as unsigned.
    pub fn from_files(
        policy: PolicyRef,
        kind: Kind,
        wasm: &Path,
        signature: Option<&Path>,
        settings: Settings,
    ) -> Result<Module, PolicyError> {
        let bytes = std::fs::read(wasm).map_err(|source| PolicyError::Io { path: wasm.to_path_buf(), source })?;
        let sig_path = signature.map_or_else(|| signing::signature_path(wasm), Path::to_path_buf);
        let signature = match std::fs::read_to_string(&sig_path) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && signature.is_none() => None,
            Err(source) => {
                return Err(PolicyError::Io { path: sig_path, source });
            }
        };
        Ok(Module { policy, kind, wasm: bytes, signature, settings })
    }
}

/// Which series a binding applies to: all of `tags` present with these values, and the metric
/// starting with `metric_prefix` (empty: every metric).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    #[serde(default)]
    pub metric_prefix: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

impl Selector {
    /// Whether `series` matches.
    pub fn matches(&self, series: &SeriesKey) -> bool {
        series.metric().starts_with(&self.metric_prefix)
            && self.tags.iter().all(|(k, v)| series.tag(k) == Some(v.as_str()))
    }
}

/// One binding: series matching `select` get the `ingest` policy and may run the `query`
/// policies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    #[serde(default)]
    pub select: Selector,
    #[serde(default)]
    pub ingest: Option<PolicySpec>,
    #[serde(default)]
    pub query: Vec<PolicySpec>,
}

/// The bindings of a node, in order: the first binding whose selector matches a series
/// decides its policies (put specific selectors before general ones).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bindings(pub Vec<Binding>);

impl Bindings {
    /// The binding that applies to `series`, if any.
    pub fn for_series(&self, series: &SeriesKey) -> Option<&Binding> {
        self.0.iter().find(|b| b.select.matches(series))
    }
}

/// A policy module in the node configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleConfig {
    pub name: String,
    pub version: String,
    pub kind: Kind,
    /// The component file, relative to the configuration's directory.
    pub wasm: PathBuf,
    /// The detached signature (default: `WASM.sig`).
    #[serde(default)]
    pub signature: Option<PathBuf>,
    #[serde(flatten)]
    pub settings: Settings,
}

/// The `[policy]` section of a node's configuration. In TOML:
///
/// ```toml
/// [policy]
/// trusted_keys = ["timeshard-policy-public-key-v1 3b6a27bc..."]
/// # allow_v1_signatures = true       # accept old signatures (bytes only), with a warning
/// deadline_ms = 10
/// memory_mib = 64
///
/// [[policy.modules]]
/// name = "pmu-validate"
/// version = "1.0.0"
/// kind = "ingest"
/// wasm = "policies/pmu_validate.wasm"   # signature: policies/pmu_validate.wasm.sig
/// on_failure = "reject"                # or "pass-through"
/// config = { min = "-180", max = "180" }
///
/// [[policy.bindings]]
/// select = { metric_prefix = "pmu.", tags = { site = "atl" } }
/// ingest = "pmu-validate"              # the version installed last; or "pmu-validate@1.0.0"
/// query = ["rms", "threshold-crossings@0.1.0"]
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Public keys whose signatures the node accepts.
    #[serde(default)]
    pub trusted_keys: Vec<String>,
    /// Accept signatures of the old format, which cover the module's bytes but not its name,
    /// version and kind (each load logs a warning). Off by default: meant for a migration.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_v1_signatures: bool,
    /// Deadline of each call in milliseconds (default 10).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Memory cap per instance in MiB (default 64).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Instances that may run at once (default 64; 8 on 32-bit hosts).
    #[serde(default)]
    pub max_instances: Option<u32>,
    /// Address space (MiB) the pool reserves for all instances' memories together, split evenly
    /// over `max_instances` (default: 4 GiB and a 32 MiB guard each on 64-bit hosts, which lets
    /// native code skip bounds checks; `max_instances × memory_mib` elsewhere). Must leave each
    /// instance at least `memory_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_mib: Option<u64>,
    /// What runs policies: `auto` (native code where Cranelift compiles for the host, else the
    /// Pulley interpreter), `native` or `pulley`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::Backend>,
    #[serde(default)]
    pub modules: Vec<ModuleConfig>,
    #[serde(default)]
    pub bindings: Bindings,
    /// Where revoked versions are kept across restarts (see [`crate::floors`]): the node sets
    /// it to a file in its data directory; never read from configuration.
    #[serde(skip)]
    pub floors_file: Option<PathBuf>,
}

impl Config {
    /// The engine limits this configuration asks for.
    pub fn limits(&self) -> Limits {
        let mut limits = Limits::default();
        if let Some(ms) = self.deadline_ms {
            limits.deadline = Duration::from_millis(ms);
        }
        if let Some(mib) = self.memory_mib {
            limits.memory_bytes = mib << 20;
        }
        if let Some(n) = self.max_instances {
            limits.max_instances = n;
        }
        if let Some(backend) = self.backend {
            limits.backend = backend;
        }
        limits.reservation_bytes = match self.reservation_mib {
            Some(mib) => mib << 20,
            None => crate::pool::default_reservation(limits.memory_bytes, limits.max_instances, limits.backend),
        };
        limits
    }

    /// The trusted keys.
    pub fn trusted(&self) -> Result<TrustedKeys, PolicyError> {
        TrustedKeys::from_texts(self.trusted_keys.iter().map(String::as_str))
            .map_err(|e| PolicyError::Config(format!("trusted_keys: {e}")))
    }
}

/// What [`Registry::apply`] did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Modules installed (or already installed with the same bytes and settings).
    pub installed: Vec<PolicyRef>,
    /// Modules that failed to load; the versions running before keep running.
    pub failed: Vec<(PolicyRef, PolicyError)>,
    /// Why the new bindings were refused, if they were (the old ones stay).
    pub bindings_error: Option<PolicyError>,
}

impl ApplyReport {
    /// Whether everything applied.
    pub fn is_ok(&self) -> bool {
        self.failed.is_empty() && self.bindings_error.is_none()
    }
}

/// A running policy, as a node reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub policy: PolicyRef,
    pub kind: Kind,
    /// sha256 of the module's bytes, hex.
    pub sha256: String,
    /// The key that signed it, hex.
    pub signed_by: String,
    /// Whether it is the current version of its name (what unpinned bindings use).
    pub current: bool,
}

struct Installed {
    loaded: Loaded,
    kind: Kind,
    sha256: String,
    signed_by: String,
    /// Shared with the entry this one replaces when that was the same version with the same
    /// bytes: re-applying a configuration does not reset what the node reports.
    calls: Arc<CallCounters>,
    /// Its signature's minimum version: installing it revokes its name's versions below.
    min_version: Option<semver::Version>,
}

/// Gives each of `loaded` the counters of the same version with the same bytes in `old`.
fn keep_counters(old: &State, loaded: &mut [Arc<Installed>]) {
    for installed in loaded {
        let Some(before) = old.installed.get(&installed.loaded.id) else { continue };
        if before.sha256 == installed.sha256
            && let Some(fresh) = Arc::get_mut(installed)
        {
            fresh.calls = before.calls.clone();
        }
    }
}

#[derive(Clone, Default)]
struct State {
    installed: BTreeMap<PolicyRef, Arc<Installed>>,
    /// The version unpinned bindings use: the last one installed.
    current: BTreeMap<String, String>,
    bindings: Bindings,
}

impl State {
    fn resolve(&self, spec: &PolicySpec) -> Option<&Arc<Installed>> {
        let version = match &spec.version {
            Some(v) => v,
            None => self.current.get(&spec.name)?,
        };
        self.installed.get(&PolicyRef { name: spec.name.clone(), version: version.clone() })
    }

    /// The floors raised by the minimum versions of what this state installs, and this state
    /// without the versions those floors revoke (and without a revoked current version).
    fn revoking(&mut self, floors: &Floors) -> Option<Floors> {
        let minimums =
            self.installed.iter().filter_map(|(id, i)| i.min_version.as_ref().map(|m| (id.name.as_str(), m)));
        let raised = floors.raised(minimums)?;
        self.installed.retain(|id, _| raised.admit(id).is_ok());
        let installed = &self.installed;
        self.current.retain(|name, version| {
            installed.contains_key(&PolicyRef { name: name.clone(), version: version.clone() })
        });
        Some(raised)
    }

    fn installed_list(&self) -> String {
        if self.installed.is_empty() {
            return "none".into();
        }
        let names: Vec<String> = self.installed.keys().map(|r| r.to_string()).collect();
        names.join(", ")
    }

    /// This state with `installed` added as the current version of its name, if the bindings
    /// still hold (a new version of another kind would break those that use the name).
    fn with(&self, installed: Arc<Installed>) -> Result<State, PolicyError> {
        let mut next = self.clone();
        let id = installed.loaded.id.clone();
        next.current.insert(id.name.clone(), id.version.clone());
        next.installed.insert(id, installed);
        next.check(&next.bindings)?;
        Ok(next)
    }

    /// Checks that every policy the bindings name is installed and of the right kind.
    fn check(&self, bindings: &Bindings) -> Result<(), PolicyError> {
        for b in &bindings.0 {
            let slots = b.ingest.iter().map(|s| (s, Kind::Ingest));
            for (spec, kind) in slots.chain(b.query.iter().map(|s| (s, Kind::Query))) {
                let Some(found) = self.resolve(spec) else {
                    return Err(PolicyError::NotInstalled {
                        policy: spec.to_string(),
                        installed: self.installed_list(),
                    });
                };
                if found.kind != kind {
                    return Err(PolicyError::Config(format!(
                        "{} is bound as a {kind} policy but is a {} policy",
                        found.loaded.id, found.kind
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The policy host of one node: install signed modules, bind them to series, run them.
///
/// All methods take `&self` and are safe to call from many threads; calls into guests are
/// synchronous (run them on a blocking thread).
pub struct Registry {
    runtime: Runtime,
    /// Replaced whole by [`Registry::set_trusted`] (an enrolled node adds its fleet's key).
    trusted: RwLock<TrustedKeys>,
    /// Whether old signatures (bytes only) are accepted, with a warning.
    allow_v1: AtomicBool,
    state: RwLock<Arc<State>>,
    /// Revoked versions, by name. Changed only under `write`.
    floors: Mutex<Floors>,
    /// Serialises installs and rebindings, so two of them never build on the same old state.
    write: Mutex<()>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("runtime", &self.runtime)
            .field("trusted", &self.trusted)
            .field("running", &self.running())
            .finish()
    }
}

impl Registry {
    /// A registry with no policies, trusting `trusted`.
    pub fn new(limits: Limits, trusted: TrustedKeys) -> Result<Registry, PolicyError> {
        Ok(Registry {
            runtime: Runtime::new(limits)?,
            trusted: RwLock::new(trusted),
            allow_v1: AtomicBool::new(false),
            state: RwLock::new(Arc::new(State::default())),
            floors: Mutex::new(Floors::default()),
            write: Mutex::new(()),
        })
    }

    /// Keeps revoked versions in `path` (read now, rewritten whenever a signature raises a
    /// floor), so they stay revoked across restarts. Call before installing anything.
    pub fn keep_floors_in(&self, path: &Path) -> Result<(), PolicyError> {
        *self.floors.lock().unwrap_or_else(|e| e.into_inner()) = Floors::open(path)?;
        Ok(())
    }

    /// The lowest version of `name` that may still be installed, if a signature revoked older
    /// ones.
    pub fn floor(&self, name: &str) -> Option<semver::Version> {
        self.floors.lock().unwrap_or_else(|e| e.into_inner()).of(name).cloned()
    }

    /// Swaps in `next` after revoking what its modules' minimum versions revoke and checking
    /// its bindings against the result; the raised floors are saved first. On an error nothing
    /// changes.
    fn commit(&self, mut next: State) -> Result<(), PolicyError> {
        let mut floors = self.floors.lock().unwrap_or_else(|e| e.into_inner());
        let raised = next.revoking(&floors);
        next.check(&next.bindings)?;
        if let Some(raised) = raised {
            raised.save()?;
            *floors = raised;
        }
        *self.state.write().unwrap() = Arc::new(next);
        Ok(())
    }

    /// A registry set up from the node's `[policy]` configuration, with paths relative to
    /// `base_dir`. Modules that fail to load are in the report, not an error: the node starts
    /// without them.
    pub fn from_config(config: &Config, base_dir: &Path) -> Result<(Registry, ApplyReport), PolicyError> {
        let registry = Registry::new(config.limits(), config.trusted()?)?;
        if let Some(path) = &config.floors_file {
            registry.keep_floors_in(path)?;
        }
        registry.allow_v1.store(config.allow_v1_signatures, Ordering::Relaxed);
        let report = registry.apply(config, base_dir);
        Ok((registry, report))
    }

    /// Whether policies run on the Pulley interpreter rather than as native code.
    pub fn is_pulley(&self) -> bool {
        self.runtime.is_pulley()
    }

    /// The engine limits.
    pub fn limits(&self) -> &Limits {
        &self.runtime.limits
    }

    /// The keys whose signatures this registry accepts.
    pub fn trusted(&self) -> TrustedKeys {
        self.trusted.read().unwrap().clone()
    }

    /// Trusts `keys` from now on (for modules installed next; installed ones stay).
    pub fn set_trusted(&self, keys: TrustedKeys) {
        *self.trusted.write().unwrap() = keys;
    }

    fn snapshot(&self) -> Arc<State> {
        self.state.read().unwrap().clone()
    }

    /// Applies a (new) configuration as a whole, in one swap: afterwards the node runs the
    /// configuration's modules with its bindings, and nothing else. Modules of a name the
    /// configuration no longer lists are removed. A module that fails to load leaves the
    /// versions of its name that ran before (the last good version keeps running, and stays
    /// the current one). Bindings that name a policy the new state does not have (or bind one
    /// as the wrong kind) are refused: the old bindings then stay, with the modules they use,
    /// and the modules that loaded are added as [`Registry::install`] would. Limits and
    /// trusted keys are fixed when the registry is made.
    pub fn apply(&self, config: &Config, base_dir: &Path) -> ApplyReport {
        let (mut modules, mut unavailable) = (Vec::new(), Vec::new());
        for m in &config.modules {
            let unchecked = PolicyRef { name: m.name.clone(), version: m.version.clone() };
            let policy = match PolicyRef::new(&m.name, &m.version) {
                Ok(policy) => policy,
                Err(e) => {
                    unavailable.push((unchecked, e));
                    continue;
                }
            };
            let wasm = base_dir.join(&m.wasm);
            let sig = m.signature.as_ref().map(|s| base_dir.join(s));
            match Module::from_files(policy.clone(), m.kind, &wasm, sig.as_deref(), m.settings.clone()) {
                Ok(module) => modules.push(module),
                Err(e) => unavailable.push((policy, e)),
            }
        }
        self.apply_modules(modules, unavailable, config.bindings.clone())
    }

    /// [`Registry::apply`] with modules in memory (e.g. fetched from the control plane) instead
    /// of files: afterwards the node runs `modules` with `bindings`, and nothing else.
    /// `unavailable` lists modules that could not even be read or fetched: each counts as a
    /// module that failed to load, so the versions of its name that ran before keep running.
    /// Where `modules` holds several versions of a name, the last one that loads becomes the
    /// current one, unless the name had a current version and one of its modules failed: then
    /// the last good version stays current.
    pub fn apply_modules(
        &self,
        modules: Vec<Module>,
        unavailable: Vec<(PolicyRef, PolicyError)>,
        bindings: Bindings,
    ) -> ApplyReport {
        let mut report = ApplyReport::default();
        // Verify and compile outside the write lock: it takes milliseconds to seconds.
        let mut loaded = Vec::new();
        let mut failed_names = BTreeSet::new();
        for m in modules {
            match self.load(&m) {
                Ok(installed) => loaded.push(installed),
                Err(e) => report.failed.push((m.policy, e)),
            }
        }
        report.failed.extend(unavailable);
        failed_names.extend(report.failed.iter().map(|(policy, _)| policy.name.clone()));

        let _write = self.write.lock().unwrap();
        let old = self.snapshot();
        keep_counters(&old, &mut loaded);
        let mut next = State::default();
        for (id, installed) in &old.installed {
            if failed_names.contains(&id.name) {
                next.installed.insert(id.clone(), installed.clone());
            }
        }
        for name in &failed_names {
            if let Some(version) = old.current.get(name) {
                next.current.insert(name.clone(), version.clone());
            }
        }
        for installed in &loaded {
            let id = &installed.loaded.id;
            next.installed.insert(id.clone(), installed.clone());
            if !(failed_names.contains(&id.name) && old.current.contains_key(&id.name)) {
                next.current.insert(id.name.clone(), id.version.clone());
            }
        }
        next.bindings = bindings;
        match self.commit(next) {
            Ok(()) => report.installed = self.kept(&loaded),
            Err(e @ PolicyError::Io { .. }) => {
                // The floors could not be saved: nothing changes, every module counts as failed.
                let reason = e.to_string();
                report.failed.extend(loaded.iter().map(|i| (i.loaded.id.clone(), PolicyError::Config(reason.clone()))));
            }
            Err(e) => {
                report.bindings_error = Some(e);
                let mut next = (*old).clone();
                for installed in loaded {
                    let id = installed.loaded.id.clone();
                    match next.with(installed) {
                        Ok(with) => {
                            next = with;
                            report.installed.push(id);
                        }
                        Err(e) => report.failed.push((id, e)),
                    }
                }
                // A binding that pins a version the new modules revoke keeps the old state.
                if let Err(e) = self.commit(next) {
                    report.failed.extend(report.installed.drain(..).map(|id| (id, PolicyError::Config(e.to_string()))));
                }
            }
        }
        report
    }

    /// Which of `loaded` the registry runs now (a later module's minimum version may have
    /// revoked an earlier one of the same name).
    fn kept(&self, loaded: &[Arc<Installed>]) -> Vec<PolicyRef> {
        let state = self.snapshot();
        loaded.iter().map(|i| i.loaded.id.clone()).filter(|id| state.installed.contains_key(id)).collect()
    }

    /// Verifies, compiles and installs a module, and makes it the current version of its
    /// name, so unpinned bindings use it for the next batch. On any error nothing changes.
    /// The next [`Registry::apply`] removes it unless its configuration lists its name.
    pub fn install(&self, module: Module) -> Result<PolicyRef, PolicyError> {
        let mut installed = [self.load(&module)?];
        let _write = self.write.lock().unwrap();
        let old = self.snapshot();
        keep_counters(&old, &mut installed);
        let [installed] = installed;
        let next = old.with(installed)?;
        self.commit(next)?;
        Ok(module.policy)
    }

    /// Verifies and compiles a module: everything installing it does but changing the state.
    fn load(&self, module: &Module) -> Result<Arc<Installed>, PolicyError> {
        let label = module.policy.to_string();
        let sha256 = signing::sha256(&module.wasm);
        // The signature is checked before anything looks at the bytes.
        let signature = module.signature.as_deref().ok_or_else(|| PolicyError::Unsigned { policy: label.clone() })?;
        let signature = Signature::from_text(signature)
            .map_err(|e| PolicyError::MalformedSignature { policy: label.clone(), reason: e.to_string() })?;
        let installing = Identity::new(module.policy.clone(), module.kind);
        let trusted = self.trusted();
        let allow_v1 = self.allow_v1.load(Ordering::Relaxed);
        let verified =
            signing::verify(&trusted, &module.wasm, &installing, &signature, allow_v1).map_err(|e| match e {
                SigningError::Untrusted { key } => PolicyError::Untrusted { policy: label.clone(), key },
                SigningError::Mismatch { key } => {
                    PolicyError::BadSignature { policy: label.clone(), key, sha256: signing::hex(&sha256) }
                }
                SigningError::WrongIdentity { signed, .. } => {
                    PolicyError::WrongIdentity { policy: format!("{installing}"), signed: signed.to_string() }
                }
                SigningError::Legacy => PolicyError::LegacySignature { policy: label.clone() },
                other => PolicyError::MalformedSignature { policy: label.clone(), reason: other.to_string() },
            })?;
        self.floors.lock().unwrap_or_else(|e| e.into_inner()).admit(&module.policy)?;
        if verified.legacy {
            tracing::warn!(
                policy = %label,
                "accepting an old-format signature (bytes only, no name, version or kind) because \
                 allow_v1_signatures = true; sign the module again with `timeshard policy sign --name --version --kind`"
            );
        }
        let signed_by = verified.key.to_string();

        let limits = self.call_limits(&label, &module.settings)?;
        let config = call::settings_to_wit("policy config values", &module.settings.config, &self.runtime)?;
        let pre = self.runtime.load(&label, module.kind, &module.wasm)?;
        Ok(Arc::new(Installed {
            loaded: Loaded {
                id: module.policy.clone(),
                label: label.into(),
                pre,
                limits,
                config,
                on_failure: module.settings.on_failure,
            },
            kind: module.kind,
            sha256: signing::hex(&sha256),
            signed_by,
            calls: Arc::default(),
            min_version: verified.min_version.clone(),
        }))
    }

    fn call_limits(&self, label: &str, settings: &Settings) -> Result<CallLimits, PolicyError> {
        let node = &self.runtime.limits;
        let memory_bytes = match settings.memory_mib {
            Some(mib) if (mib << 20) > node.memory_bytes => {
                return Err(PolicyError::Config(format!(
                    "{label}: memory_mib = {mib} is above the node's cap of {} MiB",
                    node.memory_bytes >> 20
                )));
            }
            Some(mib) => mib << 20,
            None => node.memory_bytes,
        };
        Ok(CallLimits { deadline: settings.deadline_ms.map_or(node.deadline, Duration::from_millis), memory_bytes })
    }

    /// Replaces the bindings, atomically. Refused (the old ones stay) if they name a policy
    /// that is not installed or bind one as the wrong kind.
    pub fn bind(&self, bindings: Bindings) -> Result<(), PolicyError> {
        let _write = self.write.lock().unwrap();
        let old = self.snapshot();
        old.check(&bindings)?;
        let next = State { installed: old.installed.clone(), current: old.current.clone(), bindings };
        *self.state.write().unwrap() = Arc::new(next);
        Ok(())
    }

    /// The policies installed, for reporting what the node runs.
    pub fn running(&self) -> Vec<Running> {
        let state = self.snapshot();
        state
            .installed
            .iter()
            .map(|(r, i)| Running {
                policy: r.clone(),
                kind: i.kind,
                sha256: i.sha256.clone(),
                signed_by: i.signed_by.clone(),
                current: state.current.get(&r.name) == Some(&r.version),
            })
            .collect()
    }

    /// The calls into each installed policy version since it was installed (for metrics).
    pub fn call_stats(&self) -> Vec<CallStats> {
        let state = self.snapshot();
        state.installed.iter().map(|(r, i)| i.calls.snapshot(r.clone(), i.kind)).collect()
    }

    /// Creates and drops one pooled instance of an installed policy, calling nothing: what the
    /// policy benchmark's `instantiate_us` measures (in `timeshard-testkit`).
    pub fn instantiate_once(&self, policy: &PolicyRef) -> Result<(), PolicyError> {
        let state = self.snapshot();
        let installed = state.installed.get(policy).ok_or_else(|| PolicyError::NotInstalled {
            policy: policy.to_string(),
            installed: state.installed_list(),
        })?;
        let loaded = &installed.loaded;
        self.runtime.run(&loaded.label, loaded.limits, |store| match &loaded.pre {
            crate::engine::Pre::Ingest(pre) => pre.instantiate(store).map(drop),
            crate::engine::Pre::Query(pre) => pre.instantiate(store).map(drop),
        })
    }

    /// Compiled components in the content-hash cache.
    pub fn cached_components(&self) -> usize {
        self.runtime.cached_components()
    }

    /// The ingest policy bound to `series`, if any.
    pub fn ingest_policy(&self, series: &SeriesKey) -> Option<PolicyRef> {
        let state = self.snapshot();
        let spec = state.bindings.for_series(series)?.ingest.as_ref()?;
        state.resolve(spec).map(|i| i.loaded.id.clone())
    }

    /// The query policies bound to `series`.
    pub fn query_policies(&self, series: &SeriesKey) -> Vec<PolicyRef> {
        let state = self.snapshot();
        let Some(binding) = state.bindings.for_series(series) else {
            return Vec::new();
        };
        binding.query.iter().filter_map(|s| state.resolve(s).map(|i| i.loaded.id.clone())).collect()
    }

    /// Runs the ingest policy bound to `series` over a batch (the node calls this on the
    /// receiving node, before replication). With no policy bound, every point is kept.
    ///
    /// If the policy fails, the batch is refused with the error, or, if the policy's
    /// `on_failure` is `pass-through`, kept unprocessed with the failure in
    /// [`IngestOutcome::passed_through`]. A batch over [`Limits::max_batch_points`] is always
    /// refused: the policy did not fail, the writer must split the batch.
    pub fn ingest(&self, series: &SeriesKey, points: Vec<Point>) -> Result<IngestOutcome, PolicyError> {
        let state = self.snapshot();
        let Some(policy) =
            state.bindings.for_series(series).and_then(|b| b.ingest.as_ref()).and_then(|s| state.resolve(s))
        else {
            return Ok(IngestOutcome { keep: points, rejected: Vec::new(), policy: None, passed_through: None });
        };
        match policy.calls.count(|| call::ingest(&self.runtime, &policy.loaded, series, &points)) {
            Ok(outcome) => {
                policy.calls.batch(points.len(), outcome.rejected.len());
                Ok(outcome)
            }
            // Not a failure of the policy: passing it through would let any writer skip the
            // policy by sending one point more than the limit.
            Err(e @ PolicyError::InputTooLarge { .. }) => Err(e),
            Err(e) if policy.loaded.on_failure == OnFailure::PassThrough => {
                tracing::warn!(policy = %policy.loaded.id, series = %series, "passing a batch through unprocessed: {e}");
                Ok(IngestOutcome {
                    keep: points,
                    rejected: Vec::new(),
                    policy: Some(policy.loaded.id.clone()),
                    passed_through: Some(Failure { kind: e.kind(), message: e.to_string() }),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Runs query policy `name` (the version bound to `series`) over the raw points of one
    /// quantum on the node that owns it. `range` is the part of the queried range inside the
    /// quantum; `points` must lie in it. Returns one partial, or several consecutive ones
    /// when the quantum holds more than [`Limits::max_summarize_points`] points; send them
    /// all to the coordinator.
    pub fn query_map(
        &self,
        name: &str,
        series: &SeriesKey,
        range: TimeRange,
        points: &[Point],
        params: &Params,
    ) -> Result<Vec<Partial>, PolicyError> {
        self.query_map_version(name, None, series, range, points, params)
    }

    /// [`Registry::query_map`] running exactly `version` of the policy when one is given: a
    /// query runs one version on every owner. The policy must be bound to `series` (at any
    /// version) and `name@version` installed here; otherwise [`PolicyError::OtherVersion`]
    /// names the version this node runs.
    pub fn query_map_version(
        &self,
        name: &str,
        version: Option<&str>,
        series: &SeriesKey,
        range: TimeRange,
        points: &[Point],
        params: &Params,
    ) -> Result<Vec<Partial>, PolicyError> {
        let state = self.snapshot();
        let not_bound = || PolicyError::NotBound { policy: name.to_string(), series: series.to_string() };
        let spec = state
            .bindings
            .for_series(series)
            .and_then(|b| b.query.iter().find(|s| s.name == name))
            .ok_or_else(not_bound)?;
        let bound = state.resolve(spec);
        let policy = match version {
            None => bound,
            Some(v) => state.installed.get(&PolicyRef { name: name.to_string(), version: v.to_string() }),
        };
        let Some(policy) = policy else {
            return Err(match (version, bound) {
                (Some(wanted), Some(here)) => PolicyError::OtherVersion {
                    name: name.to_string(),
                    wanted: wanted.to_string(),
                    here: here.loaded.id.to_string(),
                },
                _ => PolicyError::NotInstalled { policy: spec.to_string(), installed: state.installed_list() },
            });
        };
        policy.calls.count(|| call::summarize(&self.runtime, &policy.loaded, series, range, points, params))
    }

    /// Merges the partials of query policy `name` on the coordinator, with the exact version
    /// that made them (all partials must come from one version; during a rollout, retry when
    /// the owners agree).
    pub fn query_merge(&self, name: &str, partials: Vec<Partial>, params: &Params) -> Result<QueryResult, PolicyError> {
        let state = self.snapshot();
        let version = match partials.first() {
            Some(p) => p.policy.version.clone(),
            None => state.current.get(name).cloned().ok_or_else(|| PolicyError::NotInstalled {
                policy: name.to_string(),
                installed: state.installed_list(),
            })?,
        };
        if let Some(p) = partials.iter().find(|p| p.policy.name != name || p.policy.version != version) {
            return Err(PolicyError::BadPartials {
                policy: format!("{name}@{version}"),
                reason: format!("a partial was made by {}; all must come from one version", p.policy),
            });
        }
        let id = PolicyRef { name: name.to_string(), version };
        let policy = state
            .installed
            .get(&id)
            .ok_or_else(|| PolicyError::NotInstalled { policy: id.to_string(), installed: state.installed_list() })?;
        policy.calls.count(|| call::merge(&self.runtime, &policy.loaded, partials, params))
    }
}

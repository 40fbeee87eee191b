//! Signed policy modules for tests: guest components built by `guest/build.sh`, copied into a
//! test's directory and signed with a key made there, and the node's `[policy]` section that
//! loads and binds them. One way to write that section, for every test that needs one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use timeshard_policy::{Kind, PolicyRef, signing};

/// The per-call deadline each module gets unless a test says otherwise: a call that takes
/// microseconds in a release build can outlast the default 10 ms in a debug build on a busy
/// machine. Tests about deadlines set their own ([`PolicySection::load`]).
pub const TEST_DEADLINE_MS: u64 = 2000;

/// A node's `[policy]` section under construction, with the key that signs its modules.
#[derive(Debug)]
pub struct PolicySection {
    dir: PathBuf,
    guests: PathBuf,
    key_file: PathBuf,
    public: String,
    settings: String,
    modules: String,
    bindings: String,
}

impl PolicySection {
    /// A section trusting a new signing key, written to `dir/policy.key`; signed copies of the
    /// guests in `guest_dir` (the guest workspace) go to `dir`.
    pub fn new(dir: &Path, guest_dir: &Path) -> Result<PolicySection> {
        let key_file = dir.join("policy.key");
        let key = signing::generate_keypair()?;
        key.write(&key_file)?;
        Ok(PolicySection {
            dir: dir.to_path_buf(),
            guests: guest_dir.to_path_buf(),
            key_file,
            public: key.public().to_text().trim().to_string(),
            settings: String::new(),
            modules: String::new(),
            bindings: String::new(),
        })
    }

    /// The trusted key, as `trusted_keys` lists it.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    /// Copies built guest `guest` into the directory and signs it as `name@1.0.0` of `kind`.
    pub fn sign(&self, guest: &str, name: &str, kind: Kind) -> Result<PathBuf> {
        let built = timeshard_policy::guest_artifact(&self.guests, guest).context("run guest/build.sh first")?;
        let copy = self.dir.join(format!("{name}.wasm"));
        std::fs::copy(&built, &copy).with_context(|| format!("copying {}", built.display()))?;
        let identity = signing::Identity::new(PolicyRef::new(name, "1.0.0")?, kind);
        signing::sign_file(&self.key_file, &copy, &identity, None)?;
        Ok(copy)
    }

    /// Writes `bytes` (a damaged or made-up module) into the directory and signs them as
    /// `name@1.0.0` of `kind`, so a node gets past the signature to the bytes themselves.
    pub fn sign_bytes(&self, bytes: &[u8], name: &str, kind: Kind) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.wasm"));
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        let identity = signing::Identity::new(PolicyRef::new(name, "1.0.0")?, kind);
        signing::sign_file(&self.key_file, &path, &identity, None)?;
        Ok(path)
    }

    /// A top-level setting of the section, e.g. `deadline_ms = 50`.
    pub fn setting(&mut self, line: &str) -> &mut PolicySection {
        writeln!(self.settings, "{line}").expect("writing to a String");
        self
    }

    /// Signs guest `guest` as `name@1.0.0` of `kind` and loads it with `config`, under
    /// [`TEST_DEADLINE_MS`]; returns the signed copy.
    pub fn module(&mut self, guest: &str, name: &str, kind: Kind, config: &[(&str, &str)]) -> Result<PathBuf> {
        let wasm = self.sign(guest, name, kind)?;
        self.load(name, kind, &wasm, config, Some(TEST_DEADLINE_MS));
        Ok(wasm)
    }

    /// Loads the component at `wasm` (signed or not) as `name@1.0.0` of `kind`, with `config`
    /// and its own deadline, if any (else the section's).
    pub fn load(
        &mut self,
        name: &str,
        kind: Kind,
        wasm: &Path,
        config: &[(&str, &str)],
        deadline_ms: Option<u64>,
    ) -> &mut PolicySection {
        let m = &mut self.modules;
        let kind = match kind {
            Kind::Ingest => "ingest",
            Kind::Query => "query",
        };
        write!(m, "\n[[modules]]\nname = {name:?}\nversion = \"1.0.0\"\nkind = \"{kind}\"\nwasm = {wasm:?}\n")
            .expect("writing to a String");
        if !config.is_empty() {
            let pairs: Vec<String> = config.iter().map(|(k, v)| format!("{k} = {v:?}")).collect();
            writeln!(m, "config = {{ {} }}", pairs.join(", ")).expect("writing to a String");
        }
        if let Some(ms) = deadline_ms {
            writeln!(m, "deadline_ms = {ms}").expect("writing to a String");
        }
        self
    }

    /// Binds series whose metric starts with `metric_prefix` to the ingest policy `ingest`
    /// (if any) and the query policies `query`.
    pub fn bind(&mut self, metric_prefix: &str, ingest: Option<&str>, query: &[&str]) -> &mut PolicySection {
        let b = &mut self.bindings;
        write!(b, "\n[[bindings]]\nselect = {{ metric_prefix = {metric_prefix:?} }}\n").expect("writing to a String");
        if let Some(name) = ingest {
            writeln!(b, "ingest = {name:?}").expect("writing to a String");
        }
        if !query.is_empty() {
            writeln!(b, "query = {query:?}").expect("writing to a String");
        }
        self
    }

    /// The section as TOML.
    pub fn to_toml(&self) -> String {
        format!("trusted_keys = [{:?}]\n{}{}{}", self.public, self.settings, self.modules, self.bindings)
    }

    /// The section as the node's configuration reads it.
    pub fn config(&self) -> Result<timeshard_policy::Config> {
        let text = self.to_toml();
        toml::from_str(&text).with_context(|| format!("the [policy] section does not parse:\n{text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut section = PolicySection::new(dir.path(), Path::new("no-guests")).unwrap();
        let wasm = dir.path().join("m.wasm");
        section
            .setting("deadline_ms = 50")
            .load("m", Kind::Ingest, &wasm, &[("min", "-60"), ("max", "60")], None)
            .load("q", Kind::Query, &wasm, &[], Some(TEST_DEADLINE_MS))
            .bind("pmu.", Some("m"), &["q"]);
        let text = section.to_toml();
        let value: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(value["trusted_keys"][0].as_str(), Some(section.public_key()));
        assert_eq!(value["deadline_ms"].as_integer(), Some(50));
        let modules = value["modules"].as_array().unwrap();
        assert_eq!(modules[0]["config"]["min"].as_str(), Some("-60"), "{text}");
        assert!(modules[0].get("deadline_ms").is_none(), "{text}");
        assert_eq!(modules[1]["deadline_ms"].as_integer(), Some(TEST_DEADLINE_MS as i64), "{text}");
        assert_eq!(value["bindings"][0]["query"][0].as_str(), Some("q"), "{text}");
        section.config().unwrap();
    }
}

//! Revoked policy versions. A signature may carry a minimum version (see [`crate::signing`]);
//! once a module signed with one is installed, every version of its name below that minimum is
//! refused, whatever its signature. The floors are kept in a small JSON file (the node's data
//! directory) so that a restart, or a replay of old signed files, cannot bring a revoked
//! version back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use semver::Version;

use crate::{PolicyError, PolicyRef};

/// Largest floors file read: names and versions are short, so this is thousands of names.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Per policy name, the lowest version that may still be installed.
#[derive(Debug, Default)]
pub struct Floors {
    by_name: BTreeMap<String, Version>,
    /// Where they are kept; `None` in memory only (tests, tools).
    file: Option<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PolicyError + '_ {
    move |source| PolicyError::Io { path: path.to_path_buf(), source }
}

impl Floors {
    /// The floors kept in `path` (none yet if it does not exist).
    pub fn open(path: &Path) -> Result<Floors, PolicyError> {
        let by_name = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io(path)(e)),
            Ok(meta) if meta.len() > MAX_FILE_BYTES => {
                return Err(PolicyError::Config(format!(
                    "{}: the revoked policy versions file holds {} bytes, more than {MAX_FILE_BYTES}; it is damaged",
                    path.display(),
                    meta.len()
                )));
            }
            Ok(_) => {
                let text = std::fs::read_to_string(path).map_err(io(path))?;
                serde_json::from_str::<BTreeMap<String, Version>>(&text).map_err(|e| {
                    PolicyError::Config(format!(
                        "{}: the revoked policy versions file is damaged ({e}); restore it from a backup, as \
                         deleting it would let revoked versions run again",
                        path.display()
                    ))
                })?
            }
        };
        Ok(Floors { by_name, file: Some(path.to_path_buf()) })
    }

    /// Whether `policy` may be installed: its name has no floor, or its version is at least the
    /// floor (and so must be a semantic version).
    pub fn admit(&self, policy: &PolicyRef) -> Result<(), PolicyError> {
        let Some(floor) = self.by_name.get(&policy.name) else { return Ok(()) };
        match Version::parse(&policy.version) {
            Ok(v) if v >= *floor => Ok(()),
            _ => Err(PolicyError::Revoked {
                policy: policy.to_string(),
                name: policy.name.clone(),
                floor: floor.to_string(),
            }),
        }
    }

    /// These floors raised by `minimums` (name, minimum version), or `None` if none rises.
    pub fn raised<'a>(&self, minimums: impl IntoIterator<Item = (&'a str, &'a Version)>) -> Option<Floors> {
        let mut next = self.by_name.clone();
        let mut changed = false;
        for (name, min) in minimums {
            if next.get(name).is_none_or(|floor| floor < min) {
                next.insert(name.to_string(), min.clone());
                changed = true;
            }
        }
        changed.then(|| Floors { by_name: next, file: self.file.clone() })
    }

    /// Writes the floors to their file (a temporary file renamed over it, synced).
    pub fn save(&self) -> Result<(), PolicyError> {
        let Some(path) = &self.file else { return Ok(()) };
        let text = serde_json::to_string_pretty(&self.by_name).expect("names and versions serialize");
        let tmp = path.with_extension("tmp");
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(text.as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, path).map_err(io(path))?;
        Ok(())
    }

    /// The floor of `name`, if any.
    pub fn of(&self, name: &str) -> Option<&Version> {
        self.by_name.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, version: &str) -> PolicyRef {
        PolicyRef::new(name, version).unwrap()
    }

    #[test]
    fn floors_refuse_older_and_unordered_versions_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy-floors.json");
        let floors = Floors::open(&path).unwrap();
        floors.admit(&policy("pmu", "0.1.0")).unwrap();
        let min = Version::new(1, 3, 0);
        let raised = floors.raised([("pmu", &min)]).expect("a new floor");
        assert!(raised.raised([("pmu", &Version::new(1, 0, 0))]).is_none(), "floors never go down");
        raised.save().unwrap();
        let again = Floors::open(&path).unwrap();
        for ok in ["1.3.0", "1.10.0", "2.0.0"] {
            again.admit(&policy("pmu", ok)).unwrap();
        }
        for revoked in ["1.2.9", "1.3.0-rc1", "latest"] {
            let err = again.admit(&policy("pmu", revoked)).unwrap_err().to_string();
            assert!(err.contains("revoked") && err.contains("1.3.0"), "{revoked}: {err}");
        }
        again.admit(&policy("other", "0.0.1")).unwrap();
        std::fs::write(&path, "{not json").unwrap();
        assert!(Floors::open(&path).unwrap_err().to_string().contains("damaged"));
    }
}

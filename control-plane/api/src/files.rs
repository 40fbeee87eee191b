//! What an enrolled node keeps on disk, in `<data dir>/control/`:
//!
//! | file | what |
//! | --- | --- |
//! | `ca.pem` | the fleet CA certificate |
//! | `node.pem`, `node.key` | the node's certificate and key (mode 0600) |
//! | `enrollment.json` | control plane address, fleet fingerprint, node id |
//! | `desired.json` | the last desired state the node applied |
//!
//! `ca.pem`, `node.pem` and `node.key` are laid out as `timeshard_sdk::tls::TlsFiles::in_dir(dir,
//! "node")` expects. Every file is replaced atomically (write, fsync, rename, fsync the
//! directory); a first enrollment builds the whole directory aside and renames it into place.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state::DesiredState;

/// Directory under the data directory.
pub const CONTROL_DIR: &str = "control";
pub const CA_FILE: &str = "ca.pem";
pub const CERT_FILE: &str = "node.pem";
pub const KEY_FILE: &str = "node.key";
pub const ENROLLMENT_FILE: &str = "enrollment.json";
pub const DESIRED_FILE: &str = "desired.json";

/// `enrollment.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollmentRecord {
    /// `https://HOST:PORT` of the control plane.
    pub url: String,
    /// Fingerprint of the fleet CA (hex).
    pub fleet: String,
    pub node_id: String,
    pub enrolled_at_ms: i64,
}

/// Reading or writing the files failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct FileError {
    pub path: PathBuf,
    pub reason: String,
}

fn err(path: &Path, e: impl std::fmt::Display) -> FileError {
    FileError { path: path.to_path_buf(), reason: e.to_string() }
}

/// Writes `path` atomically; `private` files get mode 0600.
pub fn write_atomic(path: &Path, contents: &[u8], private: bool) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(|e| err(&tmp, e))?;
    f.write_all(contents).map_err(|e| err(&tmp, e))?;
    f.sync_all().map_err(|e| err(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| err(path, e))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), FileError> {
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| err(dir, e))
}

/// Everything a first enrollment writes.
#[derive(Debug)]
pub struct NewEnrollment<'a> {
    pub record: &'a EnrollmentRecord,
    pub ca_pem: &'a str,
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
    pub desired: &'a DesiredState,
}

/// Creates `<data_dir>/control` with all files, or nothing: it is built in a sibling directory
/// and renamed into place. Refuses when the directory exists.
pub fn write_new(data_dir: &Path, new: &NewEnrollment<'_>) -> Result<PathBuf, FileError> {
    fs::create_dir_all(data_dir).map_err(|e| err(data_dir, e))?;
    let dir = data_dir.join(CONTROL_DIR);
    if dir.exists() {
        return Err(err(&dir, "already exists"));
    }
    let staging = data_dir.join(format!(".{CONTROL_DIR}.new"));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| err(&staging, e))?;
    }
    fs::create_dir(&staging).map_err(|e| err(&staging, e))?;
    let record = serde_json::to_vec_pretty(new.record).map_err(|e| err(&staging, e))?;
    let desired = serde_json::to_vec_pretty(new.desired).map_err(|e| err(&staging, e))?;
    write_atomic(&staging.join(CA_FILE), new.ca_pem.as_bytes(), false)?;
    write_atomic(&staging.join(CERT_FILE), new.cert_pem.as_bytes(), false)?;
    write_atomic(&staging.join(KEY_FILE), new.key_pem.as_bytes(), true)?;
    write_atomic(&staging.join(ENROLLMENT_FILE), &record, false)?;
    write_atomic(&staging.join(DESIRED_FILE), &desired, false)?;
    fs::rename(&staging, &dir).map_err(|e| err(&dir, e))?;
    sync_dir(data_dir)?;
    Ok(dir)
}

/// Reads a text file.
pub fn read(path: &Path) -> Result<String, FileError> {
    fs::read_to_string(path).map_err(|e| err(path, e))
}

/// Reads a JSON file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, FileError> {
    serde_json::from_str(&read(path)?).map_err(|e| err(path, e))
}

//! Why a configuration cannot be used.

use std::path::PathBuf;

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {setting}: {message}")]
    Invalid { setting: String, message: String },
}

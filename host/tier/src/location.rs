//! Where an archive lives: a URL (or a plain path) turned into an [`ObjectStore`].
//!
//! - a path or `file:///path`: a local directory (created if missing), written with fsync so a
//!   committed export survives power loss before the hot copies are dropped;
//! - `memory://`: in memory, for tests (each URL opened is a new, empty store);
//! - `s3://bucket/prefix`: any S3-compatible server, configured from the usual `AWS_*`
//!   environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, and
//!   `AWS_ENDPOINT_URL` for servers other than AWS; an `http://` endpoint allows plain HTTP),
//!   then from explicit options (object_store's S3 keys, as `aws_endpoint`), which win.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::error::Error;

/// A parsed archive location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Memory,
    S3 { bucket: String, prefix: String },
}

impl Location {
    /// Parses `url`: `memory://`, `s3://bucket[/prefix]`, `file:///path`, or a path.
    pub fn parse(url: &str) -> Result<Location, Error> {
        let bad = |reason: &str| Error::BadUrl { url: url.to_string(), reason: reason.to_string() };
        if url.trim().is_empty() {
            return Err(bad("it is empty: give a directory, file:///path, s3://bucket/prefix or memory://"));
        }
        if url == "memory://" || url == "memory:" {
            return Ok(Location::Memory);
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket: write s3://bucket/prefix"));
            }
            return Ok(Location::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad("a file:// URL takes an absolute path, as file:///var/lib/timeshard/archive"));
            }
            return Ok(Location::Local(PathBuf::from(path)));
        }
        if url.contains("://") {
            return Err(bad("unknown scheme: use a directory, file:///path, s3://bucket/prefix or memory://"));
        }
        Ok(Location::Local(PathBuf::from(url)))
    }

    /// The object store of this location. `options` are settings of a remote store
    /// (object_store's configuration keys, e.g. `aws_endpoint`, `aws_access_key_id`,
    /// `aws_allow_http`) over the environment's; `retry_timeout` bounds how long one request
    /// to a remote store is retried before the error reaches the caller (whose own retries back
    /// off further).
    pub fn open(&self, options: &[(String, String)], retry_timeout: Duration) -> Result<Arc<dyn ObjectStore>, Error> {
        match self {
            Location::Memory | Location::Local(_) if !options.is_empty() => {
                Err(Error::BadUrl { url: format!("{self:?}"), reason: "options apply to s3:// archives only".into() })
            }
            Location::Memory => Ok(Arc::new(InMemory::new())),
            Location::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| Error::BadUrl {
                    url: dir.display().to_string(),
                    reason: format!("cannot create the archive directory: {e}"),
                })?;
                let store = LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| Error::BadUrl { url: dir.display().to_string(), reason: e.to_string() })?
                    .with_fsync(true)
                    .with_automatic_cleanup(true);
                Ok(Arc::new(store))
            }
            Location::S3 { bucket, prefix } => {
                let url = format!("s3://{bucket}/{prefix}");
                // reqwest's rustls takes the process's crypto provider; timeshard uses ring.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let retry = RetryConfig {
                    backoff: BackoffConfig::default(),
                    max_retries: 3,
                    retry_timeout: retry_timeout.max(Duration::from_secs(1)),
                };
                let client = ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60));
                // Client options first: setting them later would replace allow-http and the rest.
                let mut builder =
                    AmazonS3Builder::new().with_client_options(client).with_retry(retry).with_bucket_name(bucket);
                let from_env = std::env::vars()
                    .filter(|(k, _)| k.starts_with("AWS_"))
                    .filter_map(|(k, v)| k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>().ok().map(|key| (key, v)));
                let given: Vec<(AmazonS3ConfigKey, String)> = options
                    .iter()
                    .map(|(k, v)| {
                        let key = k.parse::<AmazonS3ConfigKey>().map_err(|e| Error::BadUrl {
                            url: url.clone(),
                            reason: format!("unknown S3 option {k:?}: {e}"),
                        })?;
                        Ok((key, v.clone()))
                    })
                    .collect::<Result<_, Error>>()?;
                for (key, value) in from_env.chain(given) {
                    // A plain-HTTP endpoint (a local server) implies allowing HTTP.
                    if matches!(key, AmazonS3ConfigKey::Endpoint) && value.starts_with("http://") {
                        builder = builder.with_allow_http(true);
                    }
                    builder = builder.with_config(key, value);
                }
                let store = builder.build().map_err(|e| Error::BadUrl {
                    url: url.clone(),
                    reason: format!(
                        "{e}; set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (and AWS_ENDPOINT_URL)"
                    ),
                })?;
                if prefix.is_empty() {
                    Ok(Arc::new(store))
                } else {
                    Ok(Arc::new(PrefixStore::new(store, prefix.as_str())))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(Location::parse("memory://").unwrap(), Location::Memory);
        assert_eq!(Location::parse("/var/a").unwrap(), Location::Local("/var/a".into()));
        assert_eq!(Location::parse("rel/dir").unwrap(), Location::Local("rel/dir".into()));
        assert_eq!(Location::parse("file:///var/a").unwrap(), Location::Local("/var/a".into()));
        assert_eq!(
            Location::parse("s3://bkt/a/b/").unwrap(),
            Location::S3 { bucket: "bkt".into(), prefix: "a/b".into() }
        );
        assert_eq!(Location::parse("s3://bkt").unwrap(), Location::S3 { bucket: "bkt".into(), prefix: String::new() });
        for bad in ["", "s3://", "file://rel", "gs://x/y"] {
            assert!(matches!(Location::parse(bad), Err(Error::BadUrl { .. })), "{bad}");
        }
    }
}

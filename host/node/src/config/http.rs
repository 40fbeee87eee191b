//! The `[http]` section of the node's configuration: where the HTTP side listens, who may use
//! it, and its limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

/// Shortest accepted token: long enough that guessing is hopeless.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The HTTP side of a node (InfluxDB and Prometheus writes, queries, `/metrics`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Serve HTTP at all.
    pub enabled: bool,
    /// TCP address to listen on: loopback by default, at InfluxDB's port, so Telegraf and the
    /// `influx` tools work unchanged. Port 0 picks a free port.
    pub listen: SocketAddr,
    /// Bearer tokens, any of which a request must carry (`Authorization: Bearer <token>`, or
    /// InfluxDB's `Token <token>`, or as the password of basic auth or `?p=`). Required when
    /// `listen` is not a loopback address; with none, a loopback listener needs no token.
    pub tokens: Vec<String>,
    /// Serve HTTPS with the node's fleet certificate (`[tls] cert` and `key`, which name
    /// `node.timeshard`), or with `cert` and `key` below.
    pub tls: bool,
    /// Certificate chain (PEM) for HTTPS instead of the node's; relative to the config file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of `cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// Largest request body, in bytes, compressed or decompressed.
    pub max_body_bytes: usize,
    /// Requests served at once; beyond it requests get 503.
    pub max_concurrent_requests: usize,
    /// Connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// Longest a request may take, from its headers to its answer.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Most raw points one query answers (InfluxQL or `/v1/read`); narrow the range beyond it.
    pub max_query_points: usize,
    /// Most series one InfluxQL statement reads.
    pub max_query_series: usize,
    /// Set for an enrolled node (not from the file): the control plane issues tokens
    /// (`timeshard-control http-token create`), so a listener off loopback needs none configured;
    /// it refuses every request until one is issued.
    #[serde(skip)]
    pub issued_tokens: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            enabled: true,
            listen: "127.0.0.1:8086".parse().expect("literal address"),
            tokens: Vec::new(),
            tls: false,
            cert: None,
            key: None,
            max_body_bytes: 32 * 1024 * 1024,
            max_concurrent_requests: 256,
            max_connections: 1024,
            request_timeout: Duration::from_secs(30),
            max_query_points: 1_000_000,
            max_query_series: 10_000,
            issued_tokens: false,
        }
    }
}

impl HttpConfig {
    /// Checks settings that have no valid default when given badly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |setting: &str, message: String| Err(ConfigError::Invalid { setting: format!("http.{setting}"), message });
        if !self.enabled {
            return Ok(());
        }
        if !self.listen.ip().is_loopback() && self.tokens.is_empty() && !self.issued_tokens {
            return invalid(
                "tokens",
                format!(
                    "http.listen = {} is not a loopback address, so the HTTP side needs bearer tokens: set \
                     [http] tokens = [\"<a long random secret>\"] (e.g. from `openssl rand -hex 32`), or enroll the \
                     node and issue tokens with `timeshard-control http-token create`, or listen on 127.0.0.1, or \
                     set enabled = false",
                    self.listen
                ),
            );
        }
        if let Some(short) =
            self.tokens.iter().find(|t| t.chars().count() < MIN_TOKEN_CHARS || t.contains(char::is_whitespace))
        {
            return invalid(
                "tokens",
                format!(
                    "a token of {} characters: tokens need at least {MIN_TOKEN_CHARS} characters and no spaces",
                    short.chars().count()
                ),
            );
        }
        if self.cert.is_some() != self.key.is_some() {
            return invalid("cert", "set both cert and key, or neither (to use the node's certificate)".into());
        }
        if self.max_body_bytes < 1024 || self.max_concurrent_requests == 0 || self.max_connections == 0 {
            return invalid("max_body_bytes", "limits must be positive (bodies at least 1024 bytes)".into());
        }
        if self.request_timeout.is_zero() || self.max_query_points == 0 || self.max_query_series == 0 {
            return invalid("request_timeout", "the timeout and query limits must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_listener_needs_tokens() {
        let mut c = HttpConfig { listen: "0.0.0.0:8086".parse().unwrap(), ..HttpConfig::default() };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("not a loopback address") && err.contains("tokens"), "{err}");
        c.tokens = vec!["short".into()];
        assert!(c.validate().unwrap_err().to_string().contains("at least 16 characters"));
        c.tokens = vec!["0123456789abcdef0123".into()];
        c.validate().unwrap();
        c.enabled = false;
        c.tokens.clear();
        c.validate().unwrap();
        HttpConfig::default().validate().unwrap();
        let c = HttpConfig { cert: Some("x.pem".into()), ..HttpConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("both cert and key"));
    }
}

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
    /// InfluxDB's `Token <token>`, or as the password of basic auth). With none configured (and
    /// `anonymous` off), the node makes one at its first start in `<data_dir>/http.token`.
    pub tokens: Vec<String>,
    /// Serve requests without a token. Only on a loopback listener, for a machine whose every
    /// local user may use the node (any local process, and any web page the checks below let
    /// through, could then write).
    pub anonymous: bool,
    /// Take a token from the URL (`?p=`, as InfluxDB 1.x clients send it). URLs end up in logs
    /// and histories, so only for legacy clients that cannot send a header.
    pub tokens_in_urls: bool,
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
    /// Bytes of large write bodies the node reads each second, all callers together: a body's
    /// first 256 KiB are read at once, the rest at this pace (TCP holds the senders back), so
    /// a flood of large bodies takes a bounded share of the node's cores. 0: no pace.
    pub max_body_bytes_per_second: u64,
    /// Largest body of a request that is not a write (a query's statement or form, a remote
    /// read), in bytes, refused (413) from its declared length before it is read; never more
    /// than `max_body_bytes`. The default holds the longest statement the parsers take
    /// (256 KiB) percent-encoded, 3 bytes a character.
    pub max_query_body_bytes: usize,
    /// Requests served at once; beyond it requests get 503.
    pub max_concurrent_requests: usize,
    /// Connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// Longest a request may take, from its body read to its answer.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest a client may take to send a request's headers (and the TLS handshake), and
    /// longest a kept-alive connection may sit idle: slow senders are closed after it.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest a client may take to send a request's body; a slower one gets 408 and is closed.
    /// Bodies are read before the request takes one of `max_concurrent_requests`.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Longest a client may take none of an answer (its socket accepts no byte); it is closed
    /// after it, so a client that stops reading holds neither its connection nor the answer.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Requests one connection may carry; the last answer says `Connection: close`.
    pub max_requests_per_connection: usize,
    /// Host names a request's `Host` may name besides IP addresses, `localhost` and
    /// `node.timeshard` (e.g. `["tsdb.plant.example"]`); others get 421, so a web page cannot
    /// reach the node through a name that resolves to it (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Web origins (`scheme://host[:port]`) whose pages may call the node from a browser
    /// (e.g. `["https://grafana.plant.example"]`); a request from any other page (its `Origin`,
    /// `Referer` or `Sec-Fetch-Site` says so) gets 403. Empty: no page may.
    pub allowed_origins: Vec<String>,
    /// Most raw points one InfluxQL query answers or one PromQL query reads (both hold what they
    /// read); narrow the range beyond it. `/v1/read` streams, and takes any range.
    pub max_query_points: usize,
    /// Most series one InfluxQL statement, or one PromQL selector, reads.
    pub max_query_series: usize,
    /// Most windows one InfluxQL aggregate may answer, over all its series (windows × series),
    /// checked before anything is read.
    pub max_query_windows: usize,
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
            anonymous: false,
            tokens_in_urls: false,
            tls: false,
            cert: None,
            key: None,
            max_body_bytes: 32 * 1024 * 1024,
            max_body_bytes_per_second: 256 * 1024 * 1024,
            max_query_body_bytes: 1024 * 1024,
            max_concurrent_requests: 256,
            max_connections: 1024,
            request_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            max_requests_per_connection: 10_000,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_query_points: 1_000_000,
            max_query_series: 10_000,
            max_query_windows: 1_000_000,
            issued_tokens: false,
        }
    }
}

impl HttpConfig {
    /// The largest body a request that is not a write may have.
    pub fn query_body_limit(&self) -> usize {
        self.max_query_body_bytes.min(self.max_body_bytes)
    }

    /// Checks settings that have no valid default when given badly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |setting: &str, message: String| Err(ConfigError::Invalid { setting: format!("http.{setting}"), message });
        if !self.enabled {
            return Ok(());
        }
        if !self.listen.ip().is_loopback() && !self.tls {
            return invalid(
                "tls",
                format!(
                    "http.listen = {} is not a loopback address, so the HTTP side needs TLS (tokens would cross \
                     the network in the clear): set tls = true (the node's fleet certificate, or cert and key), or \
                     listen on 127.0.0.1 behind a TLS proxy on this machine",
                    self.listen
                ),
            );
        }
        if self.anonymous && !self.listen.ip().is_loopback() {
            return invalid(
                "anonymous",
                format!("anonymous = true is for a loopback listener only, not http.listen = {}", self.listen),
            );
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
        if self.max_query_body_bytes < 1024 {
            return invalid(
                "max_query_body_bytes",
                format!("{} bytes: a query's body limit must be at least 1024 bytes", self.max_query_body_bytes),
            );
        }
        if self.request_timeout.is_zero()
            || self.max_query_points == 0
            || self.max_query_series == 0
            || self.max_query_windows == 0
        {
            return invalid("request_timeout", "the timeout and query limits must be positive".into());
        }
        if self.header_timeout.is_zero()
            || self.body_timeout.is_zero()
            || self.write_timeout.is_zero()
            || self.max_requests_per_connection == 0
        {
            return invalid(
                "header_timeout",
                "the header, body and write timeouts and requests per connection must be positive".into(),
            );
        }
        // The pace must let a lone largest body arrive within its timeout, or it always gets 408.
        let slowest = self.max_body_bytes as f64 / self.body_timeout.as_secs_f64();
        if self.max_body_bytes_per_second != 0 && (self.max_body_bytes_per_second as f64) < slowest {
            return invalid(
                "max_body_bytes_per_second",
                format!(
                    "{} bytes a second cannot read a body of max_body_bytes ({}) within body_timeout ({:?}): set at \
                     least {:.0}, or 0 for no pace",
                    self.max_body_bytes_per_second,
                    self.max_body_bytes,
                    self.body_timeout,
                    slowest.ceil()
                ),
            );
        }
        if let Some(bad) = self.allowed_hosts.iter().find(|h| h.is_empty() || h.contains(['/', ':', ' ', '*'])) {
            return invalid(
                "allowed_hosts",
                format!(
                    "{bad:?} is not a host name: give bare names such as \"tsdb.plant.example\" (no scheme, port or wildcard)"
                ),
            );
        }
        if let Some(bad) = self.allowed_origins.iter().find(|o| {
            !(o.starts_with("http://") || o.starts_with("https://"))
                || o.trim_end_matches('/').matches('/').count() != 2
        }) {
            return invalid(
                "allowed_origins",
                format!(
                    "{bad:?} is not a web origin: give scheme://host[:port], such as \"https://grafana.plant.example\" (no path)"
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_listener_needs_tls_and_tokens_and_is_never_anonymous() {
        let mut c = HttpConfig { listen: "0.0.0.0:8086".parse().unwrap(), ..HttpConfig::default() };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("http.tls") && err.contains("needs TLS"), "{err}");
        c.tls = true;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("not a loopback address") && err.contains("tokens"), "{err}");
        c.tokens = vec!["short".into()];
        assert!(c.validate().unwrap_err().to_string().contains("at least 16 characters"));
        c.tokens = vec!["0123456789abcdef0123".into()];
        c.validate().unwrap();
        c.anonymous = true;
        assert!(c.validate().unwrap_err().to_string().contains("loopback listener only"));
        c.anonymous = false;
        c.enabled = false;
        c.tokens.clear();
        c.validate().unwrap();
        HttpConfig::default().validate().unwrap();
        let c = HttpConfig { cert: Some("x.pem".into()), ..HttpConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("both cert and key"));
    }

    #[test]
    fn a_query_body_limit_is_at_least_1_kib_and_at_most_the_body_limit() {
        let err = HttpConfig { max_query_body_bytes: 512, ..HttpConfig::default() }.validate().unwrap_err();
        assert!(err.to_string().contains("max_query_body_bytes"), "{err}");
        let small = HttpConfig { max_body_bytes: 64 << 10, ..HttpConfig::default() };
        assert!(small.validate().is_ok());
        assert_eq!(small.query_body_limit(), 64 << 10);
        assert_eq!(HttpConfig::default().query_body_limit(), 1 << 20);
    }

    #[test]
    fn allowed_hosts_and_origins_must_be_bare_names_and_origins() {
        let with = |hosts: &[&str], origins: &[&str]| HttpConfig {
            allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            allowed_origins: origins.iter().map(|o| o.to_string()).collect(),
            ..HttpConfig::default()
        };
        with(&["tsdb.plant.example"], &["https://grafana.plant.example", "http://127.0.0.1:3000/"]).validate().unwrap();
        for bad in ["http://tsdb.example", "tsdb.example:8086", "*.example", ""] {
            let err = with(&[bad], &[]).validate().unwrap_err().to_string();
            assert!(err.contains("allowed_hosts") && err.contains("not a host name"), "{bad}: {err}");
        }
        for bad in ["grafana.example", "https://grafana.example/d/x", "ftp://x"] {
            let err = with(&[], &[bad]).validate().unwrap_err().to_string();
            assert!(err.contains("allowed_origins") && err.contains("not a web origin"), "{bad}: {err}");
        }
        let slow = HttpConfig { max_body_bytes_per_second: 1 << 20, ..HttpConfig::default() }.validate().unwrap_err();
        assert!(slow.to_string().contains("at least 3355444, or 0"), "{slow}");
        HttpConfig { max_body_bytes_per_second: 0, ..HttpConfig::default() }.validate().expect("no pace");
        let err = HttpConfig { body_timeout: Duration::ZERO, ..HttpConfig::default() }.validate().unwrap_err();
        assert!(err.to_string().contains("timeouts"), "{err}");
        let err = HttpConfig { write_timeout: Duration::ZERO, ..HttpConfig::default() }.validate().unwrap_err();
        assert!(err.to_string().contains("write timeouts"), "{err}");
    }
}

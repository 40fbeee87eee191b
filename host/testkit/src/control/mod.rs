//! A control plane as processes, for the end-to-end tests and the fleet benchmark: a throwaway
//! PostgreSQL server ([`postgres`]), `timeshard-control serve` as a child process ([`process`]),
//! and an operator's API client ([`Admin`]). Only the control plane's API crate is linked: the
//! service itself runs as its own program, so the `timeshard` binary (whose `bench fleet` uses
//! this) does not carry it.

pub mod postgres;
pub mod process;

use anyhow::Context;
use http::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use timeshard_control_api::http::{CALL_TIMEOUT, Endpoint};
use timeshard_control_api::{Token, TokenKind, tls};

/// An operator's API client: an API token (which names the fleet's CA fingerprint, so the
/// connection is pinned to this fleet's control plane) and the service's address.
#[derive(Debug, Clone)]
pub struct Admin {
    endpoint: Endpoint,
    token: String,
}

impl Admin {
    /// A client of the service at `url` (`https://HOST:PORT`) with `api_token`.
    pub fn new(url: &str, api_token: &str) -> anyhow::Result<Admin> {
        let token = Token::parse(api_token, TokenKind::Api).context("the control plane's API token")?;
        let endpoint = Endpoint::new(url, tls::pinned_config(token.fleet)?)?;
        Ok(Admin { endpoint, token: token.to_string() })
    }

    /// `GET path`, the answer decoded.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self.endpoint.get(path, Some(&self.token)).await?)
    }

    /// `method path` with `body` as JSON, the answer decoded.
    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        Ok(self.endpoint.send(method, path, Some(&self.token), body).await?)
    }

    /// `method path` with raw bytes as the body, the answer decoded.
    pub async fn send_bytes<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<T> {
        let answer = self.endpoint.call(method, path, Some(&self.token), Some(body), CALL_TIMEOUT).await?;
        Ok(answer.json()?)
    }
}

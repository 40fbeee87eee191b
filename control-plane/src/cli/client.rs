//! The API client the commands use: an API token (which names the fleet's CA fingerprint, so
//! the connection is pinned to this fleet's control plane) and the service's address.

use anyhow::Context;
use http::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use timeshard_control_api::http::Endpoint;
use timeshard_control_api::{Token, TokenKind, tls};

/// Where the service is and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Address of the control plane.
    #[arg(long, env = "TIMESHARD_CONTROL_URL", value_name = "https://HOST:PORT")]
    pub url: String,
    /// API token (`serve --init` prints the first one; `api-token create` makes more).
    #[arg(long = "api-token", env = "TIMESHARD_CONTROL_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub api_token: String,
}

/// A connected client.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    token: String,
}

impl Client {
    pub fn new(conn: &Connection) -> anyhow::Result<Client> {
        let token = Token::parse(&conn.api_token, TokenKind::Api).context("--api-token / TIMESHARD_CONTROL_TOKEN")?;
        let endpoint = Endpoint::new(&conn.url, tls::pinned_config(token.fleet)?)?;
        Ok(Client { endpoint, token: token.to_string() })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self.endpoint.get(path, Some(&self.token)).await?)
    }

    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        Ok(self.endpoint.send(method, path, Some(&self.token), body).await?)
    }

    /// `method path` with raw bytes as the body; the answer decoded.
    pub async fn send_bytes<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<T> {
        let answer = self
            .endpoint
            .call(method, path, Some(&self.token), Some(body), timeshard_control_api::http::CALL_TIMEOUT)
            .await?;
        Ok(answer.json()?)
    }

    /// `GET path`, the answer's raw bytes.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let answer = self
            .endpoint
            .call(Method::GET, path, Some(&self.token), None, timeshard_control_api::http::CALL_TIMEOUT)
            .await?;
        answer.check()?;
        Ok(answer.body.to_vec())
    }

    /// A request whose answer has no body (204).
    pub async fn call(&self, method: Method, path: &str) -> anyhow::Result<()> {
        let answer = self
            .endpoint
            .call(method, path, Some(&self.token), None, timeshard_control_api::http::CALL_TIMEOUT)
            .await?;
        answer.check()?;
        Ok(())
    }
}

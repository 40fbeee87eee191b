//! A small HTTPS client for the control plane's JSON API: one TLS connection per call (HTTP/1.1),
//! bounded answers, and timeouts on connecting and on the whole call. Small on purpose: it runs
//! on the node, next to everything else, on 512 MB devices.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::api::ErrorBody;
use crate::tls::CONTROL_NAME;

/// Largest answer read, in bytes.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;
/// How long connecting (TCP and TLS) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ordinary call may take in all.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A call to the control plane failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("invalid control plane address {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot connect to the control plane at {addr}: {reason}; is `timeshard-control serve` running there?")]
    Connect { addr: String, reason: String },
    #[error("TLS with the control plane at {addr} failed: {reason}")]
    Tls { addr: String, reason: String },
    #[error("the control plane at {addr} did not answer within {after:?}")]
    Timeout { addr: String, after: Duration },
    #[error("talking to the control plane at {addr} failed: {reason}")]
    Transport { addr: String, reason: String },
    /// The control plane refused the request; `message` says why and what to do.
    #[error("{message} ({status} {code})")]
    Api { status: u16, code: String, message: String },
    #[error("the control plane's answer is not what this version understands: {reason}")]
    Decode { reason: String },
}

impl HttpError {
    /// The stable error code of a refusal (`token_used`, `revoked`, ...), if it is one.
    pub fn code(&self) -> Option<&str> {
        match self {
            HttpError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// What an [`Exchange`] call returns.
pub type ExchangeFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, HttpError>> + Send + 'a>>;

/// The control plane reached some other way than HTTPS over TCP: a simulator's control plane
/// in the same process, which answers each call as the server would (status and JSON body),
/// for the node whose certificate the TLS connection would have presented. Everything above
/// the transport (paths, JSON, errors, timeouts) runs as it does over the network.
pub trait Exchange: Send + Sync {
    /// `method path` with `body`, as [`Endpoint::call`] would send it.
    fn call<'a>(&'a self, method: Method, path: &'a str, body: Option<Vec<u8>>) -> ExchangeFuture<'a>;
}

/// The control plane at one address, with one TLS configuration.
#[derive(Clone)]
pub struct Endpoint {
    authority: String,
    tls: Arc<ClientConfig>,
    /// Calls go here instead of over the network (a simulation).
    exchange: Option<Arc<dyn Exchange>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("authority", &self.authority)
            .field("exchange", &self.exchange.is_some())
            .finish()
    }
}

/// `host:port` of an `https://HOST[:PORT][/]` address (443 when no port is given).
pub fn authority_of(url: &str) -> Result<String, HttpError> {
    let bad = |reason: &str| HttpError::Url { url: url.to_string(), reason: reason.to_string() };
    let rest = url.trim().strip_prefix("https://").ok_or_else(|| {
        bad("the control plane speaks HTTPS only; write it as https://HOST:PORT (e.g. https://10.0.0.5:7443)")
    })?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("expected https://HOST:PORT"));
    }
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` alone has colons but no port.
        Some((host, port)) if host.ends_with(']') || !authority.starts_with('[') => {
            port.parse::<u16>().map_err(|_| bad("the port is not a number"))?;
            true
        }
        _ => false,
    };
    Ok(if has_port { authority.to_string() } else { format!("{authority}:443") })
}

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    /// The body as `T` when the status is a success; the server's error otherwise.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        self.check()?;
        serde_json::from_slice(&self.body).map_err(|e| HttpError::Decode { reason: e.to_string() })
    }

    /// Ok for a success status, the server's error otherwise.
    pub fn check(&self) -> Result<(), HttpError> {
        if self.status.is_success() || self.status == StatusCode::NOT_MODIFIED {
            return Ok(());
        }
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&self.body) {
            Ok(e) => (e.code, e.error),
            Err(_) => ("http".to_string(), String::from_utf8_lossy(&self.body).trim().to_string()),
        };
        Err(HttpError::Api { status: self.status.as_u16(), code, message })
    }
}

impl Endpoint {
    /// The control plane at `url` (`https://HOST:PORT`), reached with `tls`.
    pub fn new(url: &str, tls: Arc<ClientConfig>) -> Result<Endpoint, HttpError> {
        Ok(Endpoint { authority: authority_of(url)?, tls, exchange: None })
    }

    /// This endpoint with its calls made through `exchange` instead of the network.
    pub fn through(self, exchange: Option<Arc<dyn Exchange>>) -> Endpoint {
        Endpoint { exchange, ..self }
    }

    /// Where calls go instead of the network, if anywhere.
    pub fn exchange(&self) -> Option<Arc<dyn Exchange>> {
        self.exchange.clone()
    }

    /// `host:port` it connects to.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `GET path`, decoded.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, bearer: Option<&str>) -> Result<T, HttpError> {
        self.call(Method::GET, path, bearer, None, CALL_TIMEOUT).await?.json()
    }

    /// `method path` with a JSON body, decoded.
    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: &B,
    ) -> Result<T, HttpError> {
        let body = serde_json::to_vec(body).map_err(|e| HttpError::Decode { reason: e.to_string() })?;
        self.call(method, path, bearer, Some(body), CALL_TIMEOUT).await?.json()
    }

    /// One request on a fresh connection, within `timeout`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let call = async {
            match &self.exchange {
                Some(exchange) => exchange.call(method, path, body).await,
                None => self.call_inner(method, path, bearer, body).await,
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| HttpError::Timeout { addr: self.authority.clone(), after: timeout })?
    }

    async fn call_inner(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, HttpError> {
        let addr = self.authority.clone();
        let transport = |e: &dyn std::fmt::Display| HttpError::Transport { addr: addr.clone(), reason: e.to_string() };
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| HttpError::Timeout { addr: addr.clone(), after: CONNECT_TIMEOUT })?
            .map_err(|e| HttpError::Connect { addr: addr.clone(), reason: e.to_string() })?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(CONTROL_NAME).expect("constant DNS name");
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, TlsConnector::from(self.tls.clone()).connect(name, tcp))
            .await
            .map_err(|_| HttpError::Timeout { addr: addr.clone(), after: CONNECT_TIMEOUT })?
            .map_err(|e| HttpError::Tls { addr: addr.clone(), reason: tls_reason(&e) })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| transport(&e))?;
        let driver = tokio::spawn(conn);
        let mut request = Request::builder().method(method).uri(path).header(HOST, &self.authority);
        if let Some(token) = bearer {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| transport(&e))?;
        let result = async {
            let response = sender.send_request(request).await.map_err(|e| transport(&e))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| transport(&e))?
                .to_bytes();
            Ok(Answer { status, body })
        }
        .await;
        driver.abort();
        result
    }
}

/// The innermost reason of a TLS failure (rustls wraps ours in io errors).
fn tls_reason(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::General(message)) => message.clone(),
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(authority_of("https://cp.example:7443").unwrap(), "cp.example:7443");
        assert_eq!(authority_of("https://cp.example/").unwrap(), "cp.example:443");
        assert_eq!(authority_of("https://[::1]:7443/v1").unwrap(), "[::1]:7443");
        assert_eq!(authority_of("https://[::1]").unwrap(), "[::1]:443");
        assert!(authority_of("http://cp:80").unwrap_err().to_string().contains("HTTPS only"));
        assert!(authority_of("https://cp:x").is_err());
    }
}

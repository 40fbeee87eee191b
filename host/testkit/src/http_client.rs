//! A minimal HTTP/1.1 client over one kept-alive connection (hyper), plain or HTTPS, for the
//! end-to-end tests and the HTTP benchmark: send a request, get its status, headers and whole
//! body.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls::pki_types::ServerName;
use timeshard_sdk::tls::NODE_NAME;

/// One connection to a node's HTTP side.
#[derive(Debug)]
pub struct HttpClient {
    addr: SocketAddr,
    token: Option<String>,
    sender: SendRequest<Full<Bytes>>,
}

/// An answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| format!("the body is not JSON: {}", self.text()))
    }

    /// The points of a `/v1/read` answer in JSON (columns, in chunks), one `{"ts", "value",
    /// "event"}` object each, checked against the answer's own `count`.
    pub fn read_points(&self) -> Result<Vec<serde_json::Value>> {
        let doc = self.json()?;
        let column = |chunk: &serde_json::Value, name: &str| -> Result<Vec<serde_json::Value>> {
            chunk[name].as_array().cloned().with_context(|| format!("a chunk without {name}: {}", self.text()))
        };
        let mut points = Vec::new();
        for chunk in doc["chunks"].as_array().with_context(|| format!("no chunks: {}", self.text()))? {
            let (ts, value, event) = (column(chunk, "ts")?, column(chunk, "value")?, column(chunk, "event")?);
            anyhow::ensure!(ts.len() == value.len() && ts.len() == event.len(), "uneven columns: {chunk}");
            for ((ts, value), event) in ts.into_iter().zip(value).zip(event) {
                points.push(serde_json::json!({"ts": ts, "value": value, "event": event}));
            }
        }
        anyhow::ensure!(doc["count"] == points.len(), "count {} against {} points", doc["count"], points.len());
        Ok(points)
    }
}

impl HttpClient {
    /// Connects to `addr`; requests carry `Authorization: Bearer <token>` when a token is given.
    pub async fn connect(addr: SocketAddr, token: Option<&str>) -> Result<HttpClient> {
        let tcp = tcp(addr).await?;
        HttpClient::over(addr, tcp, token).await
    }

    /// Connects over HTTPS to a node serving its fleet certificate, trusting `roots` (the fleet
    /// CA) and checking that the certificate names a node (`node.timeshard`).
    pub async fn connect_tls(addr: SocketAddr, roots: Arc<RootCertStore>, token: Option<&str>) -> Result<HttpClient> {
        let mut config = rustls::ClientConfig::builder_with_provider(timeshard_sdk::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tls = connector
            .connect(ServerName::try_from(NODE_NAME)?, tcp(addr).await?)
            .await
            .with_context(|| format!("TLS handshake with {addr} failed"))?;
        HttpClient::over(addr, tls, token).await
    }

    async fn over<IO>(addr: SocketAddr, io: IO, token: Option<&str>) -> Result<HttpClient>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(HttpClient { addr, token: token.map(str::to_string), sender })
    }

    /// Sends a request with extra headers.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer> {
        let mut req = Request::builder().method(method).uri(path).header("host", self.addr.to_string());
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.sender.ready().await.context("the connection closed")?;
        let resp = self.sender.send_request(req.body(Full::new(body.into()))?).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Answer> {
        self.send(Method::GET, path, &[], Bytes::new()).await
    }

    /// `POST path` with `body`.
    pub async fn post(&mut self, path: &str, body: impl Into<Bytes>) -> Result<Answer> {
        self.send(Method::POST, path, &[], body).await
    }

    /// Sends a request until the node answers anything but 503 Service Unavailable (its memory
    /// budget or another limit), as Telegraf and Prometheus retry: each 503 is followed by
    /// [`OVERLOADED_PAUSE`] and a new connection (a body refused before it was read leaves the
    /// connection closed; plain HTTP only). Returns the answer and how many 503s came first.
    pub async fn send_until_taken(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<(Answer, u64)> {
        let body = body.into();
        let mut refused = 0;
        loop {
            let answer = self.send(method.clone(), path, headers, body.clone()).await?;
            if answer.status != StatusCode::SERVICE_UNAVAILABLE {
                return Ok((answer, refused));
            }
            refused += 1;
            tokio::time::sleep(OVERLOADED_PAUSE).await;
            *self = HttpClient::connect(self.addr, self.token.as_deref()).await?;
        }
    }
}

/// Pause before a request a node refused as overloaded (503) is sent again.
pub const OVERLOADED_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

async fn tcp(addr: SocketAddr) -> Result<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("cannot connect to {addr}"))?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// Percent-encodes a query parameter value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Sends one request by hand on a fresh connection, as an attacker holding the cluster's token
/// would (a request without one is refused before its body is read): `head` is the request
/// line and headers without the final blank line; `Content-Length`, `Connection: close` and
/// the token are added, then the body whole. Returns what the node sent before it closed, and
/// whether it closed within `wait` (if not, what arrived so far). The node may answer, and
/// close, before the whole body is sent: that is an answer too.
pub async fn raw_request(
    addr: SocketAddr,
    head: &str,
    body: &[u8],
    wait: std::time::Duration,
) -> Result<(Vec<u8>, bool)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{head}\r\n{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        crate::cluster::HTTP_AUTHORIZATION,
        body.len()
    );
    tcp.write_all(request.as_bytes()).await?;
    let _ = tcp.write_all(body).await;
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(wait, tcp.read_to_end(&mut answer)).await.is_ok();
    Ok((answer, closed))
}

//! The node's HTTP side (axum), beside QUIC: the interfaces edge tools already speak.
//!
//! - Writes, through the same coordinator, quorum and ingest policies as the SDK: InfluxDB line
//!   protocol at `/write` (v1) and `/api/v2/write` (v2), Prometheus remote write at
//!   `/api/v1/write` ([`write`](mod@write)).
//! - Queries: raw ranges streamed in JSON columns or CSV at `/v1/read` ([`read`](mod@read)), a
//!   JSON API under `/v1/` (windows, latest, series, policy queries; [`api`]), the InfluxQL subset at `/query` ([`influxql`]), and Prometheus' query API
//!   (`/api/v1/query`, `query_range`, `series`, `labels`, `label/<name>/values`, `metadata`)
//!   and remote read (`/api/v1/read`) ([`promql`]).
//! - Operations: `/metrics` in Prometheus' text format ([`metrics`]), `/ping` and `/health`.
//!
//! Configured by `[http]` ([`HttpConfig`]): loopback by default; requests from web pages and
//! through foreign host names refused first ([`sites`]); bearer tokens ([`auth`]) required off
//! loopback and checked on every path but `/ping` and `/health`; optional TLS with the node's
//! fleet certificate. Bounded like the QUIC side: connections, requests per connection,
//! requests in progress, body size (compressed and decompressed) and the memory bodies take
//! ([`body`]), header, body, request and write timeouts ([`stall`]); large bodies are decoded off the async
//! threads, a core's worth fewer at once than the machine has ([`bulk`]). Errors map to
//! statuses in one place ([`error`]).

pub mod api;
pub mod auth;
pub mod body;
pub mod bulk;
pub mod error;
pub mod influxql;
pub mod metrics;
pub mod pace;
pub mod promql;
pub mod read;
pub mod sites;
pub mod stall;
pub mod write;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

pub use crate::config::HttpConfig;
pub use auth::Tokens;
pub use body::Body;
use error::ApiError;
use sites::Sites;
use stall::WriteTimeout;

use crate::audit::Door;
use crate::node::Node;

/// How long a request waits for a slot before it is refused as overloaded.
const SLOT_WAIT: Duration = Duration::from_secs(1);
/// Paths anyone may call: liveness checks.
const OPEN_PATHS: [&str; 2] = ["/ping", "/health"];

/// Paths whose bodies are writes, taken up to `[http] max_body_bytes`; every other body is a
/// query's, taken up to `max_query_body_bytes`.
const WRITE_PATHS: [&str; 3] = ["/write", "/api/v2/write", "/api/v1/write"];
/// Write paths whose bodies are line protocol: read through the over-long line guard unless
/// they are compressed (those are guarded once inflated).
const LINE_PROTOCOL_PATHS: [&str; 2] = ["/write", "/api/v2/write"];

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    pub node: Arc<Node>,
    pub tokens: Arc<Tokens>,
    /// `[http]` as the node started: fixed while it runs (a changed `[http]` needs a restart).
    http: Arc<HttpConfig>,
    sites: Arc<Sites>,
    slots: Arc<Semaphore>,
    /// Large bodies' decoding, a few at a time off the async threads.
    bulk: bulk::Bulk,
    /// The pace of large write bodies (`None`: `max_body_bytes_per_second = 0`).
    pace: Arc<Option<pace::Pace>>,
}

impl AppState {
    pub fn config(&self) -> &HttpConfig {
        &self.http
    }
}

/// The HTTP side could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpStartError {
    #[error("cannot listen for HTTP on {addr}: {source} (set [http] listen to a free address, or enabled = false)")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot set up HTTPS: {0}")]
    Tls(String),
}

/// The routes.
pub fn router(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    Router::new()
        .route("/ping", get(ping).head(ping))
        .route("/health", get(health))
        .route("/write", post(write::influx_v1))
        .route("/api/v2/write", post(write::influx_v2))
        .route("/api/v1/write", post(write::prometheus))
        .route("/query", get(influxql::query).post(influxql::query))
        .route("/api/v1/query", get(promql::query).post(promql::query))
        .route("/api/v1/query_range", get(promql::query_range).post(promql::query_range))
        .route("/api/v1/series", get(promql::series).post(promql::series))
        .route("/api/v1/labels", get(promql::labels).post(promql::labels))
        .route("/api/v1/label/{name}/values", get(promql::label_values))
        .route("/api/v1/metadata", get(promql::metadata))
        .route("/api/v1/read", post(promql::remote_read))
        .route("/metrics", get(metrics::scrape))
        .route("/v1/read", get(read::read))
        .route("/v1/windows", get(api::windows))
        .route("/v1/latest", get(api::latest))
        .route("/v1/series", get(api::series))
        .route("/v1/query", get(api::policy_query))
        .fallback(|| async { ApiError::NotFound("no such path; see the README's HTTP section".into()) })
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The address a request came from (set per connection), for the audit of failed tokens.
#[derive(Clone, Copy, Debug)]
struct Remote(SocketAddr);

/// Refuses web pages and foreign host names, checks the token, reads the body within its
/// budget and time, then bounds requests in progress and their time, and counts answers.
async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let metrics = s.node.metrics().clone();
    let _in_flight = metrics.http_request_started();
    // InfluxDB 2.x clients read errors in 2.x's shape.
    let v2 = req.uri().path().starts_with("/api/v2/");
    let response = async {
        s.sites.check(req.method(), req.headers())?;
        if !OPEN_PATHS.contains(&req.uri().path())
            && let Err(e) = s.tokens.check(req.headers(), req.uri().query())
        {
            if let Some(remote) = req.extensions().get::<Remote>() {
                metrics.audit().failed(Door::Http, remote.0, &format!("{} {}: {e}", req.method(), req.uri().path()));
            }
            return Err(e);
        }
        // The body is read before the request takes a slot: slow senders hold only their
        // connection, and what bodies take is charged to the memory budget first.
        // Only writes carry large bodies; a query's is refused at its declared length first.
        let (config, ledger) = (s.config(), s.node.coordinator().budget().map(|l| &**l));
        let write = WRITE_PATHS.contains(&req.uri().path());
        let limit = if write { config.max_body_bytes } else { config.query_body_limit() };
        let pace = if write { (*s.pace).as_ref() } else { None };
        let lines = LINE_PROTOCOL_PATHS.contains(&req.uri().path())
            && matches!(write::Encoding::of(req.headers()), Ok(write::Encoding::Identity));
        let (req, _charge) =
            body::buffer(req, limit, config.body_timeout, ledger, pace, lines).await.map_err(|e| match e {
                ApiError::TooLarge { limit } if !write => ApiError::QueryTooLarge { limit },
                e => e,
            })?;
        let permit = tokio::time::timeout(SLOT_WAIT, s.slots.clone().acquire_owned()).await;
        let Ok(Ok(_permit)) = permit else {
            return Err(ApiError::Overloaded(s.config().max_concurrent_requests));
        };
        let timeout = s.config().request_timeout;
        tokio::time::timeout(timeout, next.run(req)).await.map_err(|_| ApiError::Timeout(timeout))
    }
    .await
    .unwrap_or_else(|e| if v2 { error::V2(e).into_response() } else { e.into_response() });
    metrics.record_http_status(response.status().as_u16());
    response
}

async fn ping() -> Response {
    (StatusCode::NO_CONTENT, [("X-Influxdb-Version", "timeshard-".to_string() + env!("CARGO_PKG_VERSION"))])
        .into_response()
}

async fn health() -> Response {
    axum::Json(serde_json::json!({"name": "timeshard", "message": "ready for queries and writes", "status": "pass",
        "version": env!("CARGO_PKG_VERSION")}))
    .into_response()
}

fn tls_acceptor(node: &Node) -> Result<Option<TlsAcceptor>, HttpStartError> {
    let config = node.config();
    let http = &config.http;
    if !http.tls {
        return Ok(None);
    }
    let (cert, key) = match (&http.cert, &http.key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => (config.tls.cert.clone(), config.tls.key.clone()),
    };
    let read = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        HttpStartError::Tls(format!("cannot read {what} {}: {e}", path.display()))
    };
    use rustls_pki_types::pem::PemObject;
    let chain = CertificateDer::pem_file_iter(&cert)
        .map_err(|e| read("the certificate", &cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read("the certificate", &cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| read("the key", &key, &e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(timeshard_sdk::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| HttpStartError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| HttpStartError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}

/// Binds the HTTP listener (before the node starts, so a taken address fails the start) and
/// returns it with the address it got.
pub async fn bind(config: &HttpConfig) -> Result<(TcpListener, SocketAddr), HttpStartError> {
    let addr = config.listen;
    let listener = TcpListener::bind(addr).await.map_err(|source| HttpStartError::Listen { addr, source })?;
    let local = listener.local_addr().map_err(|source| HttpStartError::Listen { addr, source })?;
    Ok((listener, local))
}

/// Serves HTTP on `listener` until the node shuts down; connections run on the node's task
/// tracker, so shutdown waits for requests in flight.
pub fn spawn(node: Arc<Node>, listener: TcpListener, tokens: Arc<Tokens>) -> Result<(), HttpStartError> {
    let acceptor = tls_acceptor(&node)?;
    let http = Arc::new(node.config().http.clone());
    let state = AppState {
        node: node.clone(),
        tokens,
        slots: Arc::new(Semaphore::new(http.max_concurrent_requests)),
        sites: Arc::new(Sites::new(&http)),
        bulk: bulk::Bulk::for_this_machine(),
        pace: Arc::new(pace::Pace::new(http.max_body_bytes_per_second, http.max_body_bytes, std::time::Instant::now())),
        http: http.clone(),
    };
    let app = router(state);
    let connections = Arc::new(Semaphore::new(http.max_connections));
    let tasks = node.tasks().clone();
    let shutdown = node.shutdown_signal().clone();
    info!(addr = %listener.local_addr().map_or_else(|_| http.listen.to_string(), |a| a.to_string()),
        tls = acceptor.is_some(), tokens = !http.tokens.is_empty(), "HTTP listening");
    tasks.clone().spawn(async move {
        loop {
            let permit = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                p = connections.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            };
            let (tcp, remote) = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset before accept: not fatal.
                        warn!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (app, acceptor, shutdown, http) = (app.clone(), acceptor.clone(), shutdown.clone(), http.clone());
            // A client that stops reading its answer is closed after the write timeout.
            let node = node.clone();
            let tcp = WriteTimeout::new(tcp, http.write_timeout, move || {
                node.metrics().record_abandoned_answer(Door::Http);
                debug!(%remote, "closed a connection whose client took none of its answer in time");
            });
            tasks.spawn(async move {
                let _permit = permit;
                connection(app, &http, acceptor, tcp, remote, shutdown).await;
            });
        }
    });
    Ok(())
}

async fn connection(
    app: Router,
    http: &HttpConfig,
    acceptor: Option<TlsAcceptor>,
    tcp: WriteTimeout<TcpStream>,
    remote: SocketAddr,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // After `max_requests_per_connection` answers the connection closes (the last answer says
    // so), so one client cannot keep a connection and its share of the node forever.
    let inner = TowerToHyperService::new(app);
    let (served, max) = (Arc::new(AtomicUsize::new(0)), http.max_requests_per_connection);
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        use hyper::service::Service as _;
        let last = served.fetch_add(1, Ordering::Relaxed) + 1 >= max;
        let mut req = req;
        req.extensions_mut().insert(Remote(remote));
        let answer = inner.call(req);
        async move {
            let mut response = answer.await?;
            if last {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    // The header timeout also bounds how long a kept-alive connection may sit idle: hyper
    // starts it when it waits for the next request's first byte.
    let header_timeout = http.header_timeout;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
    match acceptor {
        None => serve(builder.serve_connection(TokioIo::new(tcp), service), shutdown, remote).await,
        Some(acceptor) => match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => serve(builder.serve_connection(TokioIo::new(tls), service), shutdown, remote).await,
            Ok(Err(e)) => debug!(%remote, error = %e, "TLS handshake failed"),
            Err(_) => debug!(%remote, "TLS handshake timed out"),
        },
    }
}

/// Runs a connection; on shutdown, lets the request in progress finish and closes.
async fn serve<C>(conn: C, shutdown: tokio_util::sync::CancellationToken, remote: SocketAddr)
where
    C: GracefulConnection,
{
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        biased;
        r = conn.as_mut() => if let Err(e) = r { debug!(%remote, error = %e, "HTTP connection ended with an error") },
        _ = shutdown.cancelled() => {
            conn.as_mut().shutdown_gracefully();
            if let Err(e) = conn.await {
                debug!(%remote, error = %e, "HTTP connection ended with an error");
            }
        }
    }
}

/// A hyper connection that can be told to finish its request and close.
trait GracefulConnection: std::future::Future<Output = Result<(), hyper::Error>> {
    fn shutdown_gracefully(self: std::pin::Pin<&mut Self>);
}

impl<I, S> GracefulConnection for hyper::server::conn::http1::Connection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: hyper::body::Body + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shutdown_gracefully(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

//! The HTTPS API: routes, limits, and the TLS accept loop.
//!
//! TLS 1.3 with a server certificate the fleet CA issues to the service itself (SAN
//! `control.timeshard`, reissued daily, sent with the CA so devices can pin it). Client
//! certificates are optional and, when given, verified against the fleet CA: node endpoints
//! need one, people and scripts use API tokens instead.
//!
//! Everything is bounded: connections ([`Limits::max_connections`]), requests in progress
//! ([`Limits::max_requests`], each with [`REQUEST_TIMEOUT`]), requests without credentials
//! (enrollment, health) apart in their own small pool ([`Limits::max_open_requests`]), so that
//! anyone who can reach the port cannot starve operators and nodes; watchers
//! ([`Limits::max_watchers`]), bodies ([`MAX_BODY_BYTES`], read within
//! [`Limits::body_timeout`] before a request takes a slot), the TLS handshake and the request
//! header ([`HANDSHAKE_TIMEOUT`]), and a connection's life ([`MAX_CONNECTION_AGE`]).

pub mod extract;
pub mod handlers;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use timeshard_control_api::api::paths;
use timeshard_control_api::policy::MAX_MODULE_BYTES;
use timeshard_sdk::tls::{EXPIRED_CERT_GRACE, GraceClientVerifier};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::error::Error;
use crate::fleet::Fleet;
use extract::PeerNode;

/// Largest request body, but for uploads of policy modules (up to
/// [`timeshard_control_api::policy::MAX_MODULE_BYTES`]).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest an ordinary request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the TLS handshake, and reading a request header, may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this long, whatever it does.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(600);
/// Lifetime of the service's own certificate; it is reissued daily.
const SERVER_CERT_LIFETIME: Duration = Duration::from_secs(7 * 86_400);
const SERVER_CERT_RENEWAL: Duration = Duration::from_secs(86_400);

/// How much the server takes on at once.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    /// Requests with credentials (an API token, a node certificate) in progress at once.
    pub max_requests: usize,
    /// Requests without credentials (enrollment, health) in progress at once.
    pub max_open_requests: usize,
    pub max_watchers: usize,
    /// Longest a client may take to send a request's body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16_384,
            max_requests: 256,
            max_open_requests: 32,
            max_watchers: 15_000,
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// What handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    pub fleet: Arc<Fleet>,
    requests: Arc<Semaphore>,
    open_requests: Arc<Semaphore>,
    watchers: Arc<Semaphore>,
    body_timeout: Duration,
}

/// The routes.
pub fn router(fleet: Arc<Fleet>, limits: &Limits) -> Router {
    use handlers as h;
    let state = AppState {
        fleet,
        requests: Arc::new(Semaphore::new(limits.max_requests)),
        open_requests: Arc::new(Semaphore::new(limits.max_open_requests)),
        watchers: Arc::new(Semaphore::new(limits.max_watchers)),
        body_timeout: limits.body_timeout,
    };
    Router::new()
        .route(paths::HEALTH, get(h::health))
        .route(paths::FLEET, get(h::fleet))
        .route(paths::ENROLL, post(h::enroll))
        .route(paths::RENEW, post(h::renew))
        .route(paths::WATCH, get(h::watch))
        .route(paths::REPORT, post(h::report))
        .route(paths::ENROLLMENT_TOKENS, post(h::create_enrollment_token).get(h::list_enrollment_tokens))
        .route(paths::API_TOKENS, post(h::create_api_token).get(h::list_api_tokens))
        .route(&format!("{}/{{id}}", paths::API_TOKENS), delete(h::revoke_api_token))
        .route(paths::HTTP_TOKENS, post(h::create_http_token).get(h::list_http_tokens))
        .route(&format!("{}/{{id}}", paths::HTTP_TOKENS), delete(h::revoke_http_token))
        .route(paths::CLASSES, get(h::list_classes).put(h::put_classes))
        .route(&format!("{}/{{name}}", paths::CLASSES), delete(h::remove_class))
        .route(paths::NODE_CONFIGS, get(h::list_node_configs))
        .route(&format!("{}/{{name}}", paths::NODE_CONFIGS), put(h::put_node_config).delete(h::remove_node_config))
        .route(paths::DEVICES, get(h::list_devices))
        .route(&format!("{}/{{node_id}}/revoke", paths::DEVICES), post(h::revoke_device))
        .route(&format!("{}/{{node_id}}/location", paths::DEVICES), put(h::set_device_location))
        .route(paths::AUDIT, get(h::audit))
        .route(
            paths::POLICIES,
            post(h::upload_policy).layer(DefaultBodyLimit::max(MAX_MODULE_BYTES + 1)).get(h::list_policies),
        )
        .route(&format!("{}/{{name}}", paths::POLICIES), get(h::show_policy))
        .route(&format!("{}/{{name}}/{{version}}/module", paths::POLICIES), get(h::policy_module))
        .route(&format!("{}/{{sha256}}", paths::MODULES), get(h::node_module))
        .route(paths::ROLLOUTS, post(h::start_rollout))
        .route(&format!("{}/{{policy}}", paths::ROLLOUTS), get(h::rollout_status))
        .route(&format!("{}/{{policy}}/{{action}}", paths::ROLLOUTS), post(h::rollout_action))
        .fallback(|| async { Error::NotFound { what: "this path".into() } })
        .layer(middleware::from_fn_with_state(state.clone(), limit))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Bounds requests in progress (with a timeout) and watchers (separately: they wait long).
/// A body is read, within its limit and [`Limits::body_timeout`], before the request takes a
/// slot; requests that present no credentials take theirs from a pool of their own.
async fn limit(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if req.uri().path() == paths::WATCH {
        let Ok(_permit) = s.watchers.clone().try_acquire_owned() else {
            return Error::Overloaded("too many watchers").into_response();
        };
        return next.run(req).await;
    }
    let credentials =
        req.headers().contains_key(axum::http::header::AUTHORIZATION) || req.extensions().get::<PeerNode>().is_some();
    let req = match read_body(req, s.body_timeout).await {
        Ok(req) => req,
        Err(e) => return e.into_response(),
    };
    let (pool, busy) = if credentials {
        (&s.requests, "too many requests in progress")
    } else {
        (&s.open_requests, "too many requests without credentials (enrollments) in progress")
    };
    let permit = tokio::time::timeout(Duration::from_secs(5), pool.clone().acquire_owned()).await;
    let Ok(Ok(_permit)) = permit else {
        return Error::Overloaded(busy).into_response();
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(response) => response,
        Err(_) => Error::Timeout(REQUEST_TIMEOUT).into_response(),
    }
}

/// The request with its body read into memory, within the route's limit and `timeout`. A body
/// that declares more than the limit is handed on unread, for the route to refuse.
async fn read_body(req: Request, timeout: Duration) -> Result<Request, Error> {
    use http_body_util::BodyExt;
    let limit = if req.uri().path() == paths::POLICIES { MAX_MODULE_BYTES + 1 } else { MAX_BODY_BYTES };
    let declared = axum::body::HttpBody::size_hint(req.body()).exact();
    if declared == Some(0) || declared.is_some_and(|n| n > limit as u64) {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(timeout, http_body_util::Limited::new(body, limit).collect())
        .await
        .map_err(|_| Error::BodyTimeout(timeout))?;
    let body = match read {
        Ok(collected) => axum::body::Body::from(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Error::TooLarge(format!("the limit is {limit} bytes")));
        }
        Err(e) => return Err(Error::BadRequest(format!("cannot read the request body: {e}"))),
    };
    Ok(Request::from_parts(parts, body))
}

/// Serves the current certificate; a task replaces it before it expires.
#[derive(Debug)]
struct ServerCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn server_cert(fleet: &Fleet) -> Result<CertifiedKey, Error> {
    let (cert, key) = fleet.ca.sign_server(crate::time::now_ms(), SERVER_CERT_LIFETIME)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = timeshard_control_api::tls::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| Error::Internal(format!("server key: {e}")))?;
    Ok(CertifiedKey::new(vec![cert, fleet.ca.cert_der().clone()], signing))
}

/// The TLS configuration, and a task that renews the server certificate.
pub fn tls_config(fleet: &Arc<Fleet>) -> Result<Arc<ServerConfig>, Error> {
    let provider = timeshard_control_api::tls::provider();
    let mut roots = RootCertStore::empty();
    roots.add(fleet.ca.cert_der().clone()).map_err(|e| Error::Internal(format!("fleet CA: {e}")))?;
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Internal(format!("client verifier: {e}")))?;
    // A device back after the control plane was away longer than its certificate's life renews
    // with the expired one, within the grace its peers give it too.
    let clients = Arc::new(GraceClientVerifier { inner, grace: EXPIRED_CERT_GRACE });
    let resolver = Arc::new(ServerCert(RwLock::new(Arc::new(server_cert(fleet)?))));
    let renewer = (resolver.clone(), fleet.clone());
    tokio::spawn(async move {
        let (resolver, fleet) = renewer;
        loop {
            tokio::time::sleep(SERVER_CERT_RENEWAL).await;
            match server_cert(&fleet) {
                Ok(cert) => *resolver.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(cert),
                Err(e) => tracing::error!(error = %e, "cannot renew the server certificate"),
            }
        }
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Internal(e.to_string()))?
        .with_client_cert_verifier(clients)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts connections on `listener` until the process ends.
pub async fn serve(fleet: Arc<Fleet>, listener: TcpListener, limits: Limits) -> Result<(), Error> {
    let acceptor = TlsAcceptor::from(tls_config(&fleet)?);
    let app = router(fleet, &limits);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = connections.clone().acquire_owned().await.map_err(|e| Error::Internal(e.to_string()))?;
        let (tcp, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, or a connection reset before accept: not fatal.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            connection(acceptor, app, tcp, addr).await;
        });
    }
}

async fn connection(acceptor: TlsAcceptor, app: Router, tcp: tokio::net::TcpStream, addr: SocketAddr) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let peer = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| PeerNode::of_certificate(c));
    let service = app.map_request(move |mut req: axum::http::Request<Incoming>| {
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
    if let Ok(Err(e)) = tokio::time::timeout(MAX_CONNECTION_AGE, conn).await {
        tracing::debug!(%addr, error = %e, "connection ended with an error");
    }
}

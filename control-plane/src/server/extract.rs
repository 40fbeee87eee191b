//! Request extractors: the API caller (bearer token), the node (its certificate from the TLS
//! handshake), and JSON bodies and queries whose rejections become [`Error`]s.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::AppState;
use crate::error::Error;
use crate::fleet::tokens::Caller;

/// The node at the other end of the connection, from the certificate it presented (already
/// verified against the fleet CA by the TLS handshake). Put into each request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerNode {
    pub node_id: String,
}

impl PeerNode {
    /// The node a verified client certificate names, if it is a node certificate.
    pub fn of_certificate(der: &[u8]) -> Option<PeerNode> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let is_node = cert.subject_alternative_name().ok().flatten().is_some_and(|san| {
            san.value.general_names.iter().any(|n| {
                matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if *d == timeshard_control_api::tls::NODE_NAME)
            })
        });
        is_node.then(|| PeerNode { node_id: timeshard_proto::Id::of_public_key(cert.public_key().raw).to_hex() })
    }
}

impl FromRequestParts<AppState> for PeerNode {
    type Rejection = Error;
    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<PeerNode, Error> {
        parts.extensions.get::<PeerNode>().cloned().ok_or(Error::NodeCertificateRequired)
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Error> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| Error::Unauthorized("no API token".into()))?;
        let text = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| Error::Unauthorized("the Authorization header must be `Bearer <API token>`".into()))?;
        state.fleet.authenticate(text.trim()).await
    }
}

/// A JSON body; malformed and oversize bodies are refused with a clear [`Error`].
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Body<T> {
    type Rejection = Error;
    async fn from_request(req: Request, state: &AppState) -> Result<Body<T>, Error> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Error::TooLarge(format!("the limit is {} bytes", super::MAX_BODY_BYTES)))
            }
            Err(rejection) => Err(Error::BadRequest(rejection.body_text())),
        }
    }
}

/// A query string; malformed ones are refused with a clear [`Error`].
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for Query<T> {
    type Rejection = Error;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Query<T>, Error> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Query(v))
            .map_err(|rejection| Error::BadRequest(rejection.body_text()))
    }
}

/// A module's bytes as an upload's body, up to [`timeshard_control_api::policy::MAX_MODULE_BYTES`]
/// (a larger one is refused with [`Error::ModuleTooLarge`]).
#[derive(Debug)]
pub struct ModuleBody(pub axum::body::Bytes);

impl FromRequest<AppState> for ModuleBody {
    type Rejection = Error;
    async fn from_request(req: Request, state: &AppState) -> Result<ModuleBody, Error> {
        use timeshard_control_api::policy::MAX_MODULE_BYTES;
        // The route reads up to one byte more than a module may have, so a module just over
        // the limit is read whole and refused with its size.
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(ModuleBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Error::ModuleTooLarge { size: MAX_MODULE_BYTES + 1, limit: MAX_MODULE_BYTES })
            }
            Err(rejection) => Err(Error::BadRequest(rejection.body_text())),
        }
    }
}

//! Request bodies: charged to the node's memory budget at their declared length before a byte
//! is read, read within `[http] max_body_bytes` and `body_timeout`, and only then handed to a
//! handler, so a slow or large body holds neither a request slot nor unaccounted memory.

use std::time::Duration;

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};

use super::AppState;
use super::error::ApiError;
use crate::budget::{Admitted, Ledger, recent_resident_bytes};

/// The bytes a request's body will take at most: its declared length, or `limit` when it is
/// sent in chunks; `None` when it has none. A declared length over `limit` is refused.
pub fn declared(req: &Request, limit: usize) -> Result<Option<u64>, ApiError> {
    let hint = axum::body::HttpBody::size_hint(req.body());
    match hint.exact() {
        Some(0) => Ok(None),
        Some(n) if n > limit as u64 => Err(ApiError::TooLarge { limit }),
        Some(n) => Ok(Some(n)),
        None => Ok(Some(limit as u64)),
    }
}

/// Reads `req`'s whole body after charging it to `ledger`; returns the request with its body
/// in memory and the charge, which the caller holds until the answer is made.
pub async fn buffer<'a>(
    req: Request,
    limit: usize,
    timeout: Duration,
    ledger: Option<&'a Ledger>,
) -> Result<(Request, Option<Admitted<'a>>), ApiError> {
    let Some(bytes) = declared(&req, limit)? else { return Ok((req, None)) };
    let charge = match ledger {
        Some(l) => Some(l.admit_body(bytes, recent_resident_bytes()).map_err(|e| ApiError::Node(e.into()))?),
        None => None,
    };
    let (parts, body) = req.into_parts();
    let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect())
        .await
        .map_err(|_| ApiError::BodyTimeout(timeout))?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadRequest(format!("cannot read the request body: {e}"))
            }
        })?;
    Ok((Request::from_parts(parts, axum::body::Body::from(collected.to_bytes())), charge))
}

/// A request body within the limit; an oversize one is refused with [`ApiError::TooLarge`].
#[derive(Debug)]
pub struct Body(pub Bytes);

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &AppState) -> Result<Body, ApiError> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(Body(b)),
            Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::TooLarge { limit: state.config().max_body_bytes })
            }
            Err(r) => Err(ApiError::BadRequest(format!("cannot read the request body: {}", r.body_text()))),
        }
    }
}

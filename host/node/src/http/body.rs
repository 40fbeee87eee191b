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
    // A declared length is read into a buffer of that size; a chunked body's grows from 64 KiB.
    let exact = axum::body::HttpBody::size_hint(req.body()).exact().is_some();
    let capacity = if exact { bytes as usize } else { 64 << 10 };
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(timeout, read_into(Limited::new(body, limit), capacity))
        .await
        .map_err(|_| ApiError::BodyTimeout(timeout))?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadRequest(format!("cannot read the request body: {e}"))
            }
        })?;
    Ok((Request::from_parts(parts, axum::body::Body::from(read)), charge))
}

/// Reads a body into one buffer, copied once (collecting chunks and joining them takes twice).
async fn read_into(mut body: Limited<axum::body::Body>, capacity: usize) -> Result<Bytes, axum::BoxError> {
    let mut buf = bytes::BytesMut::with_capacity(capacity);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
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

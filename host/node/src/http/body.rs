//! Request bodies: charged to the node's memory budget at their declared length before a byte
//! is read, read within `[http] max_body_bytes` and `body_timeout`, and only then handed to a
//! handler, so a slow or large body holds neither a request slot nor unaccounted memory. A
//! line-protocol body's over-long lines are left out as they arrive ([`LongLines`]).

use std::time::Duration;

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use timeshard_formats::long_lines::{LongLines, MAX_LINE_BYTES};

use super::AppState;
use super::error::ApiError;
use super::pace::{PACED_STEP, Pace, UNPACED_BYTES};
use crate::budget::{Admitted, BudgetExceeded, Ledger, recent_resident_bytes};

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

/// What a line-protocol body left out: its lines over [`MAX_LINE_BYTES`], which the write
/// handler refuses with the lines the parser refuses. A request extension.
#[derive(Clone, Debug)]
pub struct LeftOut(pub std::sync::Arc<std::sync::Mutex<Option<LongLines>>>);

impl LeftOut {
    /// The lines left out, once (`None` for a body read whole).
    pub fn take(&self) -> Option<LongLines> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Reads `req`'s whole body after charging it to `ledger`; returns the request with its body
/// in memory and the charge, which the caller holds until the answer is made. With
/// `line_protocol`, lines over [`MAX_LINE_BYTES`] are left out as they arrive and named in a
/// [`LeftOut`] extension. Past its first [`UNPACED_BYTES`] the body is read at `pace`.
pub async fn buffer<'a>(
    req: Request,
    limit: usize,
    timeout: Duration,
    ledger: Option<&'a Ledger>,
    pace: Option<&Pace>,
    line_protocol: bool,
) -> Result<(Request, Option<Admitted<'a>>), ApiError> {
    let Some(bytes) = declared(&req, limit)? else { return Ok((req, None)) };
    let charge = match ledger {
        Some(l) => Some(admit(l, bytes).await.map_err(|e| ApiError::Node(e.into()))?),
        None => None,
    };
    // A declared length is read into a buffer of that size; a chunked body's grows from 64 KiB.
    let exact = axum::body::HttpBody::size_hint(req.body()).exact().is_some();
    let capacity = if exact { bytes as usize } else { 64 << 10 };
    let (mut parts, body) = req.into_parts();
    let mut lines = line_protocol.then(|| LongLines::new(MAX_LINE_BYTES));
    let read = tokio::time::timeout(timeout, read_into(Limited::new(body, limit), capacity, lines.as_mut(), pace))
        .await
        .map_err(|_| ApiError::BodyTimeout(timeout))?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadRequest(format!("cannot read the request body: {e}"))
            }
        })?;
    if let Some(lines) = lines {
        parts.extensions.insert(LeftOut(std::sync::Arc::new(std::sync::Mutex::new(Some(lines)))));
    }
    Ok((Request::from_parts(parts, axum::body::Body::from(read)), charge))
}

/// How long a body waits for room in the bodies' share of the memory budget before it is
/// refused. Refused at once, a flood of bodies comes straight back on new connections, and
/// those cost the node more than bodies that wait unread (the kernel holds what was sent).
const BODY_WAIT: Duration = Duration::from_secs(1);
/// How often a waiting body asks again.
const BODY_RETRY: Duration = Duration::from_millis(20);

/// Charges a body of `bytes` to `ledger`, waiting up to [`BODY_WAIT`] while the bodies' share is
/// full; a body that the process's resident memory cannot take is refused at once.
async fn admit(ledger: &Ledger, bytes: u64) -> Result<Admitted<'_>, BudgetExceeded> {
    wait_for_room(
        || ledger.try_admit_body(bytes, recent_resident_bytes()),
        || ledger.admit_body(bytes, recent_resident_bytes()),
    )
    .await
}

/// Asks `try_admit` (which does not count a refusal) until it admits, for up to [`BODY_WAIT`]
/// while it says the bodies' share is full; then, or on any other refusal, asks `admit`.
pub async fn wait_for_room<T>(
    try_admit: impl Fn() -> Result<T, BudgetExceeded>,
    admit: impl FnOnce() -> Result<T, BudgetExceeded>,
) -> Result<T, BudgetExceeded> {
    let started = tokio::time::Instant::now();
    loop {
        match try_admit() {
            Err(BudgetExceeded::Bodies { .. }) if started.elapsed() < BODY_WAIT => tokio::time::sleep(BODY_RETRY).await,
            Err(_) => return admit(),
            admitted => return admitted,
        }
    }
}

/// Reads a body into one buffer, copied once (collecting chunks and joining them takes twice),
/// through `lines` when given, at `pace` past its first [`UNPACED_BYTES`].
async fn read_into(
    mut body: Limited<axum::body::Body>,
    capacity: usize,
    mut lines: Option<&mut LongLines>,
    pace: Option<&Pace>,
) -> Result<Bytes, axum::BoxError> {
    let mut buf = Vec::with_capacity(capacity);
    let (mut read, mut unpaid) = (0, 0);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            read += data.len();
            unpaid += read.saturating_sub(UNPACED_BYTES).min(data.len());
            if let Some(pace) = pace
                && unpaid >= PACED_STEP
            {
                let wait = pace.charge(std::mem::take(&mut unpaid), std::time::Instant::now());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            match lines.as_deref_mut() {
                Some(lines) => lines.copy(&data, &mut buf),
                None => buf.extend_from_slice(&data),
            }
        }
    }
    Ok(Bytes::from(buf))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::budget::Shares;

    #[tokio::test(start_paused = true)]
    async fn a_body_waits_for_room_in_its_share_and_is_refused_once_after_the_wait() {
        // Queues (and bodies) get 2 MiB of 8.
        let ledger = Arc::new(Ledger::new(Shares::of(8 << 20)));
        let held = ledger.admit_body_owned(2 << 20, 0).expect("room for the first body");
        let giving_back = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        let started = tokio::time::Instant::now();
        let admitted = admit(&ledger, 1 << 20).await.expect("admitted once the first body is done");
        assert!(started.elapsed() >= Duration::from_millis(300), "it waited for room: {:?}", started.elapsed());
        giving_back.await.unwrap();
        assert_eq!(ledger.refused(), 0, "asking again is not a refusal");
        // A share that stays full: refused after the wait, and counted once.
        let _full = ledger.admit_body(1 << 20, 0).expect("the rest of the share");
        let started = tokio::time::Instant::now();
        let err = admit(&ledger, 1 << 20).await.expect_err("no room within the wait");
        assert!(matches!(err, BudgetExceeded::Bodies { .. }), "{err}");
        assert!(started.elapsed() >= BODY_WAIT, "{:?}", started.elapsed());
        assert_eq!(ledger.refused(), 1);
        drop(admitted);
        // A body the resident memory cannot take is refused at once.
        let started = tokio::time::Instant::now();
        let far_over = wait_for_room(|| ledger.try_admit_body(1, 100 << 20), || ledger.admit_body(1, 100 << 20)).await;
        assert!(matches!(far_over, Err(BudgetExceeded::Resident { .. })));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}

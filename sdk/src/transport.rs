//! One request, one bidirectional QUIC stream: framing and the request/response exchange.
//! Shared by the SDK and the node (which is a client of its peers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use timeshard_proto::wire::{self, ErrorReply, FrameError, HEADER_BYTES, Request, Response};

/// Application error code used when a stream is stopped or reset for breaking a limit.
pub const STOP_LIMIT: u32 = 1;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream failed while sending: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("stream failed while receiving: {0}")]
    Read(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the peer closed the stream before answering")]
    NoAnswer,
    /// The peer answered with an error.
    #[error("{0}")]
    Remote(ErrorReply),
}

/// Application bytes (frames, headers included) a party sent and received.
#[derive(Debug, Default)]
pub struct Traffic {
    sent: AtomicU64,
    received: AtomicU64,
}

impl Traffic {
    /// Counts `n` bytes sent.
    pub fn sent(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes received.
    pub fn received(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// (sent, received) so far.
    pub fn totals(&self) -> (u64, u64) {
        (self.sent.load(Ordering::Relaxed), self.received.load(Ordering::Relaxed))
    }
}

/// Writes one frame and finishes the stream; returns the bytes written.
pub async fn write_frame<T: serde::Serialize>(send: &mut SendStream, msg: &T, limit: u32) -> Result<usize, CallError> {
    let frame = wire::encode(msg, limit)?;
    send.write_all(&frame).await?;
    // The peer may already have stopped reading (e.g. it refused the frame as too large);
    // finishing a stopped stream is not an error worth reporting.
    let _ = send.finish();
    Ok(frame.len())
}

/// Writes one frame of a streamed answer, leaving the stream open for more; returns the bytes
/// written.
pub async fn write_frame_open<T: serde::Serialize>(
    send: &mut SendStream,
    msg: &T,
    limit: u32,
) -> Result<usize, CallError> {
    let frame = wire::encode(msg, limit)?;
    send.write_all(&frame).await?;
    Ok(frame.len())
}

/// Reads one frame, refusing bodies above `limit` before reading them.
pub async fn read_frame_bytes(recv: &mut RecvStream, limit: u32) -> Result<Vec<u8>, CallError> {
    let mut header = [0u8; HEADER_BYTES];
    recv.read_exact(&mut header).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(0) => CallError::NoAnswer,
        other => CallError::Read(other.to_string()),
    })?;
    let len = wire::body_len(header, limit)?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await.map_err(|e| CallError::Read(e.to_string()))?;
    Ok(body)
}

/// Sends `req` on a new stream of `conn` and waits at most `timeout` for the response.
/// An [`Response::Error`] comes back as [`CallError::Remote`].
pub async fn call(conn: &Connection, req: &Request, limit: u32, timeout: Duration) -> Result<Response, CallError> {
    call_counted(conn, req, limit, timeout, None).await
}

/// [`call`], counting the bytes of both frames in `traffic`.
pub async fn call_counted(
    conn: &Connection,
    req: &Request,
    limit: u32,
    timeout: Duration,
    traffic: Option<&Traffic>,
) -> Result<Response, CallError> {
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        let sent = write_frame(&mut send, req, limit).await?;
        let body = read_frame_bytes(&mut recv, limit).await?;
        if let Some(t) = traffic {
            t.sent(sent);
            t.received(HEADER_BYTES + body.len());
        }
        match wire::decode::<Response>(&body)? {
            Response::Error(e) => Err(CallError::Remote(e)),
            other => Ok(other),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Err(CallError::Timeout(timeout)),
        Ok(Err(e @ CallError::Remote(_))) => Err(e),
        // A stream error caused by the connection closing says less than the close reason.
        Ok(Err(e)) => Err(conn.close_reason().map(CallError::Connection).unwrap_or(e)),
        Ok(ok) => ok,
    }
}

/// The frames of a streamed answer, read one at a time: a slow reader holds the sender back
/// through QUIC flow control, so nothing piles up beyond the stream's window.
#[derive(Debug)]
pub struct FrameStream {
    conn: Connection,
    // Kept open: finishing or dropping it early is fine, but the peer may still be reading.
    _send: SendStream,
    recv: RecvStream,
    limit: u32,
    timeout: Duration,
    traffic: Option<std::sync::Arc<Traffic>>,
}

impl FrameStream {
    /// The next frame, waiting at most the stream's timeout for it; `None` once the peer
    /// finished the stream. An [`Response::Error`] frame comes back as [`CallError::Remote`].
    pub async fn next(&mut self) -> Result<Option<Response>, CallError> {
        let body = match tokio::time::timeout(self.timeout, read_frame_bytes(&mut self.recv, self.limit)).await {
            Err(_) => return Err(CallError::Timeout(self.timeout)),
            Ok(Err(CallError::NoAnswer)) => return Ok(None),
            Ok(Err(e)) => return Err(self.conn.close_reason().map(CallError::Connection).unwrap_or(e)),
            Ok(Ok(body)) => body,
        };
        if let Some(t) = &self.traffic {
            t.received(HEADER_BYTES + body.len());
        }
        match wire::decode::<Response>(&body)? {
            Response::Error(e) => Err(CallError::Remote(e)),
            other => Ok(Some(other)),
        }
    }
}

/// Sends `req` on a new stream of `conn` and returns its answer frames as they come, each
/// awaited at most `timeout`.
pub async fn open_stream(
    conn: &Connection,
    req: &Request,
    limit: u32,
    timeout: Duration,
    traffic: Option<std::sync::Arc<Traffic>>,
) -> Result<FrameStream, CallError> {
    let opened = async {
        let (mut send, recv) = conn.open_bi().await?;
        let sent = write_frame(&mut send, req, limit).await?;
        Ok::<_, CallError>((send, recv, sent))
    };
    let (send, recv, sent) = match tokio::time::timeout(timeout, opened).await {
        Err(_) => return Err(CallError::Timeout(timeout)),
        Ok(Err(e)) => return Err(conn.close_reason().map(CallError::Connection).unwrap_or(e)),
        Ok(Ok(s)) => s,
    };
    if let Some(t) = &traffic {
        t.sent(sent);
    }
    Ok(FrameStream { conn: conn.clone(), _send: send, recv, limit, timeout, traffic })
}

//! One request, one bidirectional QUIC stream: framing and the request/response exchange.
//! Shared by the SDK and the node (which is a client of its peers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use timeshard_proto::wire::{self, ErrorReply, FrameError, HEADER_BYTES, Request, Response};
use tokio::io::{AsyncRead, AsyncReadExt};

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
    /// The reader's memory budget would not take the frame's next bytes.
    #[error("{0}")]
    Budget(ErrorReply),
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

/// Bytes a frame's buffer starts with (or the whole body, if smaller); it doubles from there
/// as bytes arrive, so a sender that declares a large body and sends little costs little.
pub const FIRST_READ_BYTES: usize = 64 * 1024;

/// Reads one frame, refusing bodies above `limit` before reading them.
pub async fn read_frame_bytes(recv: &mut RecvStream, limit: u32) -> Result<Vec<u8>, CallError> {
    read_frame(recv, limit, |_| Ok(())).await
}

/// Reads one frame from `recv`, refusing bodies above `limit` before reading them. The body's
/// buffer grows with what arrives, never to more than twice the bytes received (or
/// [`FIRST_READ_BYTES`]), and `charge` is asked for each growth before it is allocated: its
/// error ends the read as [`CallError::Budget`]. The caller gives the charged bytes back when it
/// drops the body (or the read fails).
pub async fn read_frame<R, F>(recv: &mut R, limit: u32, mut charge: F) -> Result<Vec<u8>, CallError>
where
    R: AsyncRead + Unpin,
    F: FnMut(usize) -> Result<(), ErrorReply>,
{
    let mut header = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < HEADER_BYTES {
        match recv.read(&mut header[got..]).await.map_err(|e| CallError::Read(e.to_string()))? {
            0 if got == 0 => return Err(CallError::NoAnswer),
            0 => return Err(CallError::Read(format!("the stream ended {got} bytes into a frame header"))),
            n => got += n,
        }
    }
    let len = wire::body_len(header, limit)?;
    let mut body = Vec::new();
    let mut filled = 0;
    while filled < len {
        if filled == body.len() {
            let grown = len.min(body.len().saturating_mul(2).max(FIRST_READ_BYTES));
            charge(grown - body.len()).map_err(CallError::Budget)?;
            body.resize(grown, 0);
        }
        match recv.read(&mut body[filled..]).await.map_err(|e| CallError::Read(e.to_string()))? {
            0 => {
                return Err(CallError::Read(format!(
                    "the stream ended {filled} bytes into a frame that declared {len} bytes"
                )));
            }
            n => filled += n,
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A charge that adds what it is asked to `total`.
    fn counting(total: &Arc<AtomicUsize>) -> impl FnMut(usize) -> Result<(), ErrorReply> + use<> {
        let total = total.clone();
        move |n| {
            total.fetch_add(n, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_large_declared_frame_costs_what_arrives_not_what_it_declares() {
        let (mut peer, mut recv) = tokio::io::duplex(1 << 20);
        let charged = Arc::new(AtomicUsize::new(0));
        // 16 MiB declared, ten bytes sent, the stream left open.
        peer.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
        peer.write_all(&[7; 10]).await.unwrap();
        let reading = tokio::spawn({
            let charge = counting(&charged);
            async move { read_frame(&mut recv, 16 << 20, charge).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!reading.is_finished());
        assert_eq!(charged.load(Ordering::SeqCst), FIRST_READ_BYTES, "only the first buffer is charged");
        drop(peer);
        let err = reading.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("10 bytes into a frame that declared 16777216 bytes"), "{err}");
    }

    #[tokio::test]
    async fn an_over_limit_declaration_is_refused_before_anything_is_charged() {
        let charged = Arc::new(AtomicUsize::new(0));
        let mut bytes: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = read_frame(&mut bytes, 16 << 20, counting(&charged)).await.unwrap_err();
        assert!(matches!(err, CallError::Frame(FrameError::TooLarge { len: 0xffff_ffff, limit: 16_777_216 })), "{err}");
        assert!(err.to_string().contains("exceeds the limit of 16777216 bytes"), "{err}");
        assert_eq!(charged.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_whole_frame_is_read_and_charged_at_its_size() {
        let charged = Arc::new(AtomicUsize::new(0));
        let body: Vec<u8> = (0..1_000_003u32).map(|i| i as u8).collect();
        let frame = [&(body.len() as u32).to_be_bytes()[..], &body].concat();
        let got = read_frame(&mut &frame[..], 16 << 20, counting(&charged)).await.unwrap();
        assert_eq!(got, body);
        assert_eq!(charged.load(Ordering::SeqCst), body.len(), "growth stops at the declared size");
        // An empty stream is no answer; a cut header is a read error.
        assert!(matches!(read_frame(&mut &[][..], 64, counting(&charged)).await, Err(CallError::NoAnswer)));
        assert!(matches!(read_frame(&mut &[0, 0][..], 64, counting(&charged)).await, Err(CallError::Read(_))));
    }

    #[tokio::test]
    async fn a_refused_charge_ends_the_read_with_the_budget_error() {
        let frame = [&(200_000u32).to_be_bytes()[..], &[1; 200_000]].concat();
        let mut asked = Vec::new();
        let err = read_frame(&mut &frame[..], 1 << 20, |n| {
            asked.push(n);
            if asked.len() > 1 {
                Err(ErrorReply::new(wire::ErrorCode::Overloaded, "memory budget exceeded"))
            } else {
                Ok(())
            }
        })
        .await
        .unwrap_err();
        assert!(matches!(&err, CallError::Budget(e) if e.code == wire::ErrorCode::Overloaded), "{err}");
        assert_eq!(asked, [FIRST_READ_BYTES, FIRST_READ_BYTES]);
    }
}

//! A connection's write timeout (`[http] write_timeout`): hyper waits on a socket whose client
//! stops reading its answer for as long as the client likes, holding the connection's place
//! among `max_connections` and the answer's memory. [`WriteTimeout`] fails a write that has made
//! no progress for the timeout, which ends the connection; reads pass through untouched (the
//! header and body timeouts bound them).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `S` with a timeout on writes that make no progress; `on_stall` is called once when one
/// times out.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Armed when a write first waits, disarmed when one makes progress.
    stalled: Option<Pin<Box<Sleep>>>,
    on_stall: Option<Box<dyn FnOnce() + Send>>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for WriteTimeout<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTimeout")
            .field("inner", &self.inner)
            .field("timeout", &self.timeout)
            .field("stalled", &self.stalled.is_some())
            .finish()
    }
}

impl<S> WriteTimeout<S> {
    pub fn new(inner: S, timeout: Duration, on_stall: impl FnOnce() + Send + 'static) -> WriteTimeout<S> {
        WriteTimeout { inner, timeout, stalled: None, on_stall: Some(Box::new(on_stall)) }
    }

    /// What a write that waited returns: still waiting, or an error once the timeout passed.
    fn waited<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let sleep = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                if let Some(f) = self.on_stall.take() {
                    f();
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took none of the answer for {timeout:?} ([http] write_timeout)"),
                )))
            }
        }
    }

    fn progressed<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.waited(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progressed(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progressed(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.progressed(r, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progressed(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_reads_fails_after_the_timeout_and_is_counted_once() {
        let (near, _far) = tokio::io::duplex(1024);
        let stalls = Arc::new(AtomicU32::new(0));
        let counted = stalls.clone();
        let mut w = WriteTimeout::new(near, Duration::from_secs(5), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let started = tokio::time::Instant::now();
        let e = w.write_all(&[7; 4096]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("write_timeout"), "{e}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(w.write_all(&[7; 4096]).await.is_err());
        assert_eq!(stalls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_taking_bytes_is_not_cut_off() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut w = WriteTimeout::new(near, Duration::from_secs(5), || panic!("not a stall"));
        // Takes 1 KiB every 3 s: 30 s for the whole answer, never 5 s without progress.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0; 1024];
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                match far.read(&mut buf).await.unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        w.write_all(&[9; 10 * 1024]).await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), vec![9; 10 * 1024]);
    }
}

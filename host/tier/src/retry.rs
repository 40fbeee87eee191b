//! Retrying object-store work with exponential backoff, and the export's byte-rate limit.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng as _;
use tokio::time::Instant;

use crate::error::Error;

/// How often and how patiently failed object-store work is retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Wait before the second attempt; doubled before each further one.
    pub first_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 6, first_backoff: Duration::from_millis(200), max_backoff: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based), with up to 25 % jitter so nodes that
    /// failed together do not retry together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let base = self.first_backoff.saturating_mul(1 << attempt.saturating_sub(1).min(20)).min(self.max_backoff);
        base + base.mul_f64(timeshard_clock::rng().random_range(0.0..0.25))
    }
}

/// Runs `op` until it succeeds, fails with an error that is not transient, or has used the
/// policy's attempts; transient failures are logged and waited out.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut op: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && attempt < policy.attempts.max(1) => {
                let wait = policy.backoff(attempt);
                tracing::warn!(attempt, wait_ms = wait.as_millis() as u64, error = %e, "{what} failed; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Limits the bytes per second an export uploads: each upload waits until the bytes before it
/// have had their share of time.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_s: Option<u64>,
    next: Mutex<Option<Instant>>,
}

impl RateLimit {
    /// No limit when `bytes_per_s` is `None` or 0.
    pub fn new(bytes_per_s: Option<u64>) -> RateLimit {
        RateLimit { bytes_per_s: bytes_per_s.filter(|&b| b > 0), next: Mutex::new(None) }
    }

    /// Waits until `bytes` more may be sent: until the end of their slot at the rate, after
    /// the slots already taken. Waiting for the end (not the start) holds the rate over any
    /// number of sends, the first included: an export of one part cannot pass the cap.
    pub async fn acquire(&self, bytes: usize) {
        let Some(rate) = self.bytes_per_s else { return };
        let end = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let start = next.filter(|n| *n > now).unwrap_or(now);
            let end = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
            *next = Some(end);
            end
        };
        tokio::time::sleep_until(end).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn flaky() -> Error {
        Error::Store {
            op: "write",
            path: "x".into(),
            source: object_store::Error::Generic { store: "test", source: "unreachable".into() },
        }
    }

    #[tokio::test]
    async fn transient_failures_are_retried_up_to_the_attempts() {
        let policy =
            RetryPolicy { attempts: 3, first_backoff: Duration::from_millis(1), max_backoff: Duration::from_millis(2) };
        let calls = AtomicU32::new(0);
        let ok = retry(&policy, "op", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 { Err(flaky()) } else { Ok(7) }
        })
        .await;
        assert_eq!(ok.unwrap(), 7);
        calls.store(0, Ordering::SeqCst);
        let failed: Result<(), Error> = retry(&policy, "op", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(flaky())
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Corrupt data is not retried.
        calls.store(0, Ordering::SeqCst);
        let corrupt: Result<(), Error> = retry(&policy, "op", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Error::corrupt("f", "bad"))
        })
        .await;
        assert!(corrupt.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p =
            RetryPolicy { attempts: 9, first_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(1) };
        let b1 = p.backoff(1);
        assert!(b1 >= Duration::from_millis(100) && b1 <= Duration::from_millis(125));
        assert!(p.backoff(2) >= Duration::from_millis(200));
        assert!(p.backoff(8) <= Duration::from_millis(1250));
    }

    #[tokio::test]
    async fn the_rate_limit_spaces_uploads() {
        let limit = RateLimit::new(Some(1_000_000));
        let t = Instant::now();
        limit.acquire(50_000).await;
        // The first send waits for its own slot too: one part cannot pass the cap.
        assert!(t.elapsed() >= Duration::from_millis(48), "{:?}", t.elapsed());
        for _ in 0..2 {
            limit.acquire(50_000).await;
        }
        // 150 KB at 1 MB/s: 150 ms.
        assert!(t.elapsed() >= Duration::from_millis(145), "{:?}", t.elapsed());
        let free = RateLimit::new(None);
        let t = Instant::now();
        free.acquire(1 << 30).await;
        assert!(t.elapsed() < Duration::from_millis(50));
    }
}

//! The pace at which the node reads large write bodies: one token bucket of
//! `[http] max_body_bytes_per_second` for all callers, holding at most one largest body. A
//! body reads its first [`UNPACED_BYTES`] at once and then waits for the bucket; the sender's
//! TCP window closes while it waits. Sans I/O: [`Pace::charge`] says how long to wait.
//!
//! Without it a flood of 32 MiB bodies kept both cores busy taking bytes in (2.5 GB a second
//! from one local sender), and a small read waited behind them: its p99 went from 0.9 to 6 ms.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes of each body read before the pace applies: small writes never wait.
pub const UNPACED_BYTES: usize = 256 << 10;
/// Bytes past those charged at a time (what is left under it at the body's end is not).
pub const PACED_STEP: usize = 64 << 10;

/// A token bucket of bytes.
#[derive(Debug)]
pub struct Pace {
    per_second: f64,
    burst: f64,
    /// When the bucket was last charged, and the bytes it held then (negative: owed).
    bucket: Mutex<(Instant, f64)>,
}

impl Pace {
    /// `per_second` bytes a second, up to `burst` bytes at once; `None` for 0 (no pace).
    pub fn new(per_second: u64, burst: usize, now: Instant) -> Option<Pace> {
        (per_second > 0).then(|| Pace {
            per_second: per_second as f64,
            burst: burst as f64,
            bucket: Mutex::new((now, burst as f64)),
        })
    }

    /// Takes `bytes` from the bucket at `now`; returns how long the reader waits before it
    /// reads on (zero while the bucket holds them). Callers that wait are served in turn: each
    /// charge owes after the ones before it.
    pub fn charge(&self, bytes: usize, now: Instant) -> Duration {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (last, held) = *bucket;
        let refilled = (held + now.saturating_duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        let left = refilled - bytes as f64;
        *bucket = (now.max(last), left);
        if left >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-left / self.per_second) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_reads_its_burst_at_once_and_then_owes_at_its_pace() {
        let t0 = Instant::now();
        let pace = Pace::new(1_000_000, 2_000_000, t0).expect("a pace");
        assert_eq!(pace.charge(1_500_000, t0), Duration::ZERO);
        assert_eq!(pace.charge(500_000, t0), Duration::ZERO);
        // Empty: the next 250 KB wait a quarter of a second, and the next caller's after them.
        assert_eq!(pace.charge(250_000, t0), Duration::from_millis(250));
        assert_eq!(pace.charge(250_000, t0), Duration::from_millis(500));
        // A second later the debt is paid and half a second's bytes are back.
        assert_eq!(pace.charge(500_000, t0 + Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(pace.charge(1, t0 + Duration::from_secs(1)), Duration::from_nanos(1_000));
    }

    #[test]
    fn an_idle_bucket_holds_no_more_than_its_burst_and_zero_is_no_pace() {
        let t0 = Instant::now();
        let pace = Pace::new(1_000, 10_000, t0).expect("a pace");
        assert_eq!(pace.charge(10_000, t0 + Duration::from_secs(3600)), Duration::ZERO);
        assert_eq!(pace.charge(1_000, t0 + Duration::from_secs(3600)), Duration::from_secs(1));
        assert!(Pace::new(0, 10_000, t0).is_none());
    }
}

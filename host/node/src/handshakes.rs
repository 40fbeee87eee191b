//! Handshakes per source address (`[limits] handshakes_per_sec_per_address` and
//! `handshake_burst_per_address`): a token bucket per remote address, asked before the node
//! does any cryptographic work for a new QUIC connection. A mutual-TLS handshake costs the node
//! about half a millisecond of CPU before the per-certificate cap ([`crate::admission`]) can see
//! whose it is; this bounds what one address can make it spend.
//!
//! Unproven addresses may be spoofed. Before one costs a handshake or the tokens of the address
//! it claims, it is asked to prove it with a QUIC Retry (stateless, one round trip more) once
//! that address has used half its burst, or once handshakes from unproven addresses in all
//! have used the node-wide bucket. A spoofed flood then cannot drain a real client's or peer's
//! bucket below half, and cannot make the node spend more than that bucket's rate on
//! handshakes with addresses it never hears back from; nobody legitimate is refused by it, at
//! worst asked for one more round trip.
//!
//! Implementation notes: the map of buckets is bounded ([`MAX_TRACKED`]): when full, buckets
//! that have filled up again are dropped (they are the same as none), and failing that the one
//! least recently used. IPv6 addresses are counted by their /64, which one host usually holds
//! whole. No I/O and no clock: the caller passes `now`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Addresses whose buckets are remembered at once (about 40 bytes each).
pub const MAX_TRACKED: usize = 4096;

/// Handshakes one address may start: `per_sec` on average, `burst` at once. `per_sec == 0`
/// turns the limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeRate {
    pub per_sec: u32,
    pub burst: u32,
}

/// What to do with a new connection, before any crypto.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on with the handshake.
    Accept,
    /// Ask the client to prove its address first (`Incoming::retry`).
    Retry,
    /// Refuse it at once (`Incoming::refuse`): its address is over its rate.
    Refuse,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: HandshakeRate, now: Instant) -> Bucket {
        Bucket { tokens: f64::from(rate.burst), at: now }
    }

    fn refill(&mut self, rate: HandshakeRate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(rate.per_sec)).min(f64::from(rate.burst));
        self.at = now;
    }

    fn is_full(&self, rate: HandshakeRate, now: Instant) -> bool {
        let mut b = *self;
        b.refill(rate, now);
        b.tokens >= f64::from(rate.burst)
    }

    fn take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The buckets of the addresses that started handshakes lately.
#[derive(Debug)]
pub struct HandshakeLimiter {
    rate: HandshakeRate,
    by_address: HashMap<IpAddr, Bucket>,
    /// Handshakes with addresses not proven, from all of them together.
    unproven: Bucket,
    max_tracked: usize,
}

impl HandshakeLimiter {
    pub fn new(rate: HandshakeRate, now: Instant) -> HandshakeLimiter {
        HandshakeLimiter::bounded(rate, MAX_TRACKED, now)
    }

    /// A limiter remembering at most `max_tracked` addresses.
    pub fn bounded(rate: HandshakeRate, max_tracked: usize, now: Instant) -> HandshakeLimiter {
        HandshakeLimiter { rate, by_address: HashMap::new(), unproven: Bucket::full(rate, now), max_tracked }
    }

    /// Applies a new rate; buckets keep their tokens, up to the new burst.
    pub fn set_rate(&mut self, rate: HandshakeRate) {
        self.rate = rate;
        for b in self.by_address.values_mut().chain([&mut self.unproven]) {
            b.tokens = b.tokens.min(f64::from(rate.burst));
        }
    }

    /// Addresses remembered now.
    pub fn tracked(&self) -> usize {
        self.by_address.len()
    }

    /// What to do with a handshake from `ip`: `validated` when it answered a Retry (or
    /// otherwise proved its address), `may_retry` when a Retry may still be sent.
    pub fn check(&mut self, ip: IpAddr, validated: bool, may_retry: bool, now: Instant) -> Verdict {
        let rate = self.rate;
        if rate.per_sec == 0 {
            return Verdict::Accept;
        }
        let key = key_of(ip);
        if !validated && may_retry {
            let tokens = self.by_address.get_mut(&key).map_or(f64::from(rate.burst), |b| {
                b.refill(rate, now);
                b.tokens
            });
            self.unproven.refill(rate, now);
            // Accepted only while half the burst stays for the address's proven handshakes.
            if tokens - 1.0 < f64::from(rate.burst) / 2.0 || !self.unproven.take() {
                return Verdict::Retry;
            }
        }
        let bucket = match self.by_address.get_mut(&key) {
            Some(b) => {
                b.refill(rate, now);
                b
            }
            None => {
                self.make_room(now);
                self.by_address.entry(key).or_insert(Bucket::full(rate, now))
            }
        };
        if bucket.take() { Verdict::Accept } else { Verdict::Refuse }
    }

    /// Frees a place for one more address when the map is full.
    fn make_room(&mut self, now: Instant) {
        if self.by_address.len() < self.max_tracked {
            return;
        }
        let rate = self.rate;
        self.by_address.retain(|_, b| !b.is_full(rate, now));
        if self.by_address.len() >= self.max_tracked
            && let Some(oldest) = self.by_address.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k)
        {
            self.by_address.remove(&oldest);
        }
    }
}

/// The address a bucket is kept for: IPv4 as it is (an IPv4-mapped IPv6 address too), IPv6 by
/// its /64 (one host or site is given a whole /64 and may send from any address in it).
fn key_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    use super::*;

    const RATE: HandshakeRate = HandshakeRate { per_sec: 10, burst: 20 };

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    /// Proven handshakes from `ip` until one is refused; how many were accepted.
    fn drain(l: &mut HandshakeLimiter, ip: IpAddr, now: Instant) -> usize {
        (0..).take_while(|_| l.check(ip, true, false, now) == Verdict::Accept).count()
    }

    #[test]
    fn an_address_gets_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(RATE, t0);
        assert_eq!(drain(&mut l, v4(1), t0), 20);
        assert_eq!(l.check(v4(1), true, false, t0), Verdict::Refuse);
        // A tenth of a second gives one more; a second gives ten.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(drain(&mut l, v4(1), t1), 1);
        assert_eq!(drain(&mut l, v4(1), t1 + Duration::from_secs(1)), 10);
        // Never more than the burst, however long it rested.
        assert_eq!(drain(&mut l, v4(1), t1 + Duration::from_secs(3600)), 20);
        // Another address has its own bucket.
        assert_eq!(drain(&mut l, v4(2), t1), 20);
    }

    #[test]
    fn a_rate_of_zero_accepts_everything() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(HandshakeRate { per_sec: 0, burst: 0 }, t0);
        assert!((0..10_000).all(|_| l.check(v4(1), false, true, t0) == Verdict::Accept));
        assert_eq!(l.tracked(), 0);
    }

    #[test]
    fn unproven_addresses_are_asked_to_prove_it_past_half_their_burst() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(RATE, t0);
        let unproven: Vec<Verdict> = (0..12).map(|_| l.check(v4(1), false, true, t0)).collect();
        assert_eq!(unproven.iter().filter(|v| **v == Verdict::Accept).count(), 10, "{unproven:?}");
        assert!(unproven[10..].iter().all(|v| *v == Verdict::Retry), "{unproven:?}");
        // A spoofer claiming v4(1) cannot drain it further: the real client, proving its
        // address, still gets the other half.
        for _ in 0..1000 {
            assert_eq!(l.check(v4(1), false, true, t0), Verdict::Retry);
        }
        assert_eq!(drain(&mut l, v4(1), t0), 10);
        // Where a Retry is not allowed, an unproven handshake is counted like a proven one.
        assert_eq!(l.check(v4(1), false, false, t0), Verdict::Refuse);
    }

    #[test]
    fn unproven_handshakes_from_many_addresses_share_one_bucket() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(RATE, t0);
        // A spoofed flood from a new address each time: the node-wide bucket of unproven
        // handshakes accepts its burst, then asks every new address to prove itself.
        let verdicts: Vec<Verdict> = (0..=255u8).map(|i| l.check(v4(i), false, true, t0)).collect();
        assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Accept).count(), 20);
        assert!(verdicts[20..].iter().all(|v| *v == Verdict::Retry));
        assert_eq!(l.tracked(), 20, "addresses asked to retry are not remembered");
        // A proven address is still served.
        assert_eq!(l.check(v4(200), true, false, t0), Verdict::Accept);
    }

    #[test]
    fn the_map_stays_bounded_under_many_addresses() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::bounded(RATE, 64, t0);
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            let now = t0 + Duration::from_micros(u64::from(i));
            assert_eq!(l.check(ip, true, false, now), Verdict::Accept);
            assert!(l.tracked() <= 64, "{} addresses remembered", l.tracked());
        }
        // The least recently used went first: the newest address still has its bucket.
        let last = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 9_999));
        assert_eq!(drain(&mut l, last, t0 + Duration::from_micros(9_999)), 19);
    }

    #[test]
    fn buckets_that_filled_up_again_are_dropped_first() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::bounded(RATE, 4, t0);
        // An address still draining, and three that rest long enough to fill up.
        assert_eq!(drain(&mut l, v4(1), t0), 20);
        for i in 2..=4 {
            l.check(v4(i), true, false, t0);
        }
        let later = t0 + Duration::from_millis(500);
        assert_eq!(l.check(v4(5), true, false, later), Verdict::Accept);
        // v4(1) was used earliest but is not full: it keeps its (empty-ish) bucket.
        assert_eq!(drain(&mut l, v4(1), later), 5);
        assert!(l.tracked() <= 4);
    }

    #[test]
    fn ipv6_addresses_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(RATE, t0);
        let host = |low: u64| IpAddr::V6(Ipv6Addr::from((0x2001_0db8_0000_0001u128 << 64) | u128::from(low)));
        assert_eq!(drain(&mut l, host(1), t0), 20);
        assert_eq!(l.check(host(0xdead_beef), true, false, t0), Verdict::Refuse, "same /64");
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 9).to_ipv6_mapped());
        assert_eq!(drain(&mut l, mapped, t0), 20);
        assert_eq!(l.check(v4(9), true, false, t0), Verdict::Refuse, "the same IPv4 address");
    }

    #[test]
    fn a_lower_rate_caps_the_tokens_kept() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(RATE, t0);
        l.check(v4(1), true, false, t0);
        l.set_rate(HandshakeRate { per_sec: 1, burst: 3 });
        assert_eq!(drain(&mut l, v4(1), t0), 3);
    }
}

//! The seams a simulator takes over in every timeshard crate that would otherwise ask the
//! operating system: the wall clock ([`now_ns`]), randomness ([`rng`]) and blocking work
//! ([`spawn_blocking`]). Sans-IO crates (`timeshard-proto`) use none of them: their callers
//! pass `now` and a generator, usually from here.
//!
//! Monotonic time is tokio's (`tokio::time::Instant`, sleeps, timeouts): a runtime whose clock
//! is paused runs it virtually, so it needs no seam of its own; node code never reads
//! `std::time::Instant`, which no runtime controls.
//!
//! Outside a simulation every function here is the plain one (one thread-local read more).
//! Inside one ([`sim::enter`]), the simulator owns them for the host it is running on this
//! thread: its clock (virtual time, skewed or jumped as the simulator decides), its seeded
//! generator, and blocking work run as a task of its own runtime, so a whole fleet runs on one
//! thread and a seed replays it exactly.

pub mod sim;

use std::time::{SystemTime, UNIX_EPOCH};

pub use sim::Rng;

/// Nanoseconds since the Unix epoch, now (the simulated host's clock under simulation). A
/// clock before 1970 reads as 0; one past the year 2262 (where i64 nanoseconds end) as
/// `i64::MAX`.
pub fn now_ns() -> i64 {
    if let Some(ns) = sim::wall_ns() {
        return ns;
    }
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// Monotonic time as a `std::time::Instant`, for sans-IO state machines that take `now`: the
/// runtime's clock (`tokio::time::Instant`), which a simulation runs virtually.
pub fn instant() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A random generator: the thread's (seeded from the OS) outside a simulation, one seeded
/// from the simulated host's stream inside one. Cheap; take a new one where it is needed.
pub fn rng() -> Rng {
    sim::rng().unwrap_or_else(|| Rng::Thread(rand::rng()))
}

/// Runs blocking work (store, hint files, policies) off the async tasks: on tokio's blocking
/// pool, or under simulation as a task of the host's own runtime, so it runs on the
/// simulator's thread at a point the seed decides.
pub fn spawn_blocking<F, R>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if sim::active() { tokio::spawn(async move { f() }) } else { tokio::task::spawn_blocking(f) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_after_2024_and_moves_forward() {
        let a = now_ns();
        assert!(a > 1_704_067_200_000_000_000, "{a} is before 2024: the clock reads nonsense");
        let b = now_ns();
        assert!(b >= a);
    }
}

//! The one source of wall-clock time for every timeshard crate that reads it (the node, the cold
//! tier, the command line, the testkit). Sans-IO crates (`timeshard-proto`) never read a clock:
//! their callers pass `now`, usually from here.
//!
//! Keeping every read of the wall clock behind this crate is what lets a simulator, or a test,
//! run the real code on a clock of its own.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch, now. A clock before 1970 reads as 0; one past the year 2262
/// (where i64 nanoseconds end) as `i64::MAX`.
pub fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
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

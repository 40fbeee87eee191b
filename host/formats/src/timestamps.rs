//! Times as people type them: nanoseconds since the epoch, RFC 3339, `now`, or `now-DURATION`.
//! Sans-IO: the caller passes "now".

use std::time::UNIX_EPOCH;

/// Why a time could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("bad duration in {0:?} (e.g. now-15m, now-2h30m)")]
    BadDuration(String),
    #[error(
        "cannot read time {0:?}: use nanoseconds since the epoch, RFC 3339 (2023-11-14T22:13:20Z), now, or now-15m"
    )]
    Unreadable(String),
    #[error("time {0:?} is before 1970")]
    BeforeEpoch(String),
    #[error("time {0:?} is past what nanoseconds since the epoch hold (the year 2262)")]
    OutOfRange(String),
}

/// Reads `s` (trimmed) as nanoseconds since the epoch; `now_ns` is what `now` means.
pub fn parse_timestamp(s: &str, now_ns: i64) -> Result<i64, TimeError> {
    let s = s.trim();
    if let Ok(ns) = s.parse::<i64>() {
        return Ok(ns);
    }
    if s == "now" {
        return Ok(now_ns);
    }
    if let Some(ago) = s.strip_prefix("now-") {
        let d = humantime::parse_duration(ago).map_err(|_| TimeError::BadDuration(s.to_string()))?;
        let d = i64::try_from(d.as_nanos()).map_err(|_| TimeError::OutOfRange(s.to_string()))?;
        return now_ns.checked_sub(d).ok_or_else(|| TimeError::OutOfRange(s.to_string()));
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|_| TimeError::Unreadable(s.to_string()))?;
    let d = t.duration_since(UNIX_EPOCH).map_err(|_| TimeError::BeforeEpoch(s.to_string()))?;
    i64::try_from(d.as_nanos()).map_err(|_| TimeError::OutOfRange(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000_000_000;

    #[test]
    fn every_form_reads() {
        assert_eq!(parse_timestamp(" 5 ", NOW), Ok(5));
        assert_eq!(parse_timestamp("now", NOW), Ok(NOW));
        assert_eq!(parse_timestamp("now-1s", NOW), Ok(NOW - 1_000_000_000));
        assert_eq!(parse_timestamp("2023-11-14T22:13:20Z", NOW), Ok(NOW));
        assert_eq!(parse_timestamp("2023-11-14 22:13:20", NOW), Ok(NOW));
    }

    #[test]
    fn what_does_not_fit_is_an_error_not_an_overflow() {
        assert!(matches!(parse_timestamp("yesterday", NOW), Err(TimeError::Unreadable(_))));
        assert!(matches!(parse_timestamp("now-soon", NOW), Err(TimeError::BadDuration(_))));
        assert!(matches!(parse_timestamp("now-500years", NOW), Err(TimeError::OutOfRange(_))));
        assert!(matches!(parse_timestamp("now-1s", i64::MIN), Err(TimeError::OutOfRange(_))));
        assert!(matches!(parse_timestamp("9999-01-01T00:00:00Z", NOW), Err(TimeError::OutOfRange(_))));
    }
}

//! Times as the command line reads and prints them.

use std::time::UNIX_EPOCH;

use anyhow::{Context, Result, anyhow};
use clap::ValueEnum;
use timeshard_clock::now_ns;
use timeshard_proto::Timestamp;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum TimeFormat {
    /// Nanoseconds since the Unix epoch.
    Ns,
    /// RFC 3339 with nanoseconds.
    Rfc3339,
}

/// Parses a time: nanoseconds, RFC 3339, `now`, or `now-DURATION`.
pub(crate) fn parse_time(s: &str) -> Result<Timestamp> {
    let s = s.trim();
    if let Ok(ns) = s.parse::<i64>() {
        return Ok(ns);
    }
    if s == "now" {
        return Ok(now_ns());
    }
    if let Some(ago) = s.strip_prefix("now-") {
        let d = humantime::parse_duration(ago).with_context(|| format!("bad duration in {s:?}"))?;
        return Ok(now_ns() - i64::try_from(d.as_nanos())?);
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|_| {
        anyhow!(
            "cannot read time {s:?}: use nanoseconds since the epoch, RFC 3339 (2023-11-14T22:13:20Z), now, or now-15m"
        )
    })?;
    let d = t.duration_since(UNIX_EPOCH).map_err(|_| anyhow!("time {s:?} is before 1970"))?;
    Ok(i64::try_from(d.as_nanos())?)
}

/// Prints a timestamp as `f` says.
pub(crate) fn format_time(ts: Timestamp, f: TimeFormat) -> String {
    match f {
        TimeFormat::Ns => ts.to_string(),
        TimeFormat::Rfc3339 => {
            let t = UNIX_EPOCH + std::time::Duration::from_nanos(ts.max(0) as u64);
            humantime::format_rfc3339_nanos(t).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_accepted_form() {
        assert_eq!(parse_time("1700000000000000000").unwrap(), 1_700_000_000_000_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000_000_000_000);
        let ago = parse_time("now-1h").unwrap();
        assert!(parse_time("now").unwrap() - ago >= 3_600_000_000_000);
        assert!(parse_time("yesterday").is_err());
    }
}

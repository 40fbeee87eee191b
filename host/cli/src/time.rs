//! Times as the command line reads and prints them.

use std::time::UNIX_EPOCH;

use anyhow::Result;
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
    Ok(timeshard_formats::timestamps::parse_timestamp(s, now_ns())?)
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

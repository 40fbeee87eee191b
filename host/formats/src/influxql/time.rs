//! Times as InfluxQL writes them: RFC 3339 strings (parsed and printed, nanoseconds trimmed as
//! InfluxDB prints them), duration literals (`1h30m`, `1700000000000ms`), and the `epoch`
//! units of answers.

/// Nanoseconds of a duration unit, as InfluxQL spells it.
pub fn unit_ns(unit: &str) -> Option<i64> {
    Some(match unit {
        "ns" => 1,
        "u" | "µ" | "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        "w" => 604_800_000_000_000,
        _ => return None,
    })
}

/// Parses a duration literal: one or more `<digits><unit>` (`10s`, `1h30m`).
pub fn parse_duration(s: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = unit_ns(&rest[..unit_len])?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn num(s: &str, len: usize) -> Option<i64> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

/// Parses a time as the node's JSON API takes it, at `now_ns`: nanoseconds since the epoch,
/// RFC 3339, `now`, or `now-<duration>` / `now+<duration>` (`now-15m`). `None` when it is none
/// of these or lands outside the `i64` nanoseconds (`now+106751d` and beyond).
pub fn parse_api_time(s: &str, now_ns: i64) -> Option<i64> {
    let s = s.trim();
    if let Ok(ns) = s.parse::<i64>() {
        return Some(ns);
    }
    if s == "now" {
        return Some(now_ns);
    }
    if let Some(ago) = s.strip_prefix("now-") {
        return now_ns.checked_sub(parse_duration(ago)?);
    }
    if let Some(ahead) = s.strip_prefix("now+") {
        return now_ns.checked_add(parse_duration(ahead)?);
    }
    parse_rfc3339(s)
}

/// Parses `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` or the same with a space
/// instead of `T` (and no zone: UTC), into nanoseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = match s.find(['T', 't', ' ']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut parts = date.split('-');
    let (y, m, d) = (num(parts.next()?, 4)?, num(parts.next()?, 2)?, num(parts.next()?, 2)?);
    if parts.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // In i128: years past 2262 (or before 1677) do not fit i64 nanoseconds.
    let ns = i128::from(days_from_civil(y, m, d)) * 86_400_000_000_000;
    let Some(time) = time else { return i64::try_from(ns).ok() };
    let (clock, offset_s) = if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, 0)
    } else if let Some(i) = time.rfind(['+', '-']).filter(|&i| i >= 8) {
        let sign = if time.as_bytes()[i] == b'-' { -1 } else { 1 };
        let (oh, om) = time[i + 1..].split_once(':')?;
        (&time[..i], sign * (num(oh, 2)? * 3600 + num(om, 2)? * 60))
    } else {
        (time, 0)
    };
    let (hms, frac) = match clock.split_once('.') {
        Some((hms, f)) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            (hms, f.parse::<i64>().ok()? * 10_i64.pow(9 - f.len() as u32))
        }
        Some(_) => return None,
        None => (clock, 0),
    };
    let mut hms = hms.split(':');
    let (h, mi, sec) = (num(hms.next()?, 2)?, num(hms.next()?, 2)?, num(hms.next()?, 2)?);
    if hms.next().is_some() || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    i64::try_from(ns + i128::from((h * 3600 + mi * 60 + sec - offset_s) * 1_000_000_000 + frac)).ok()
}

/// RFC 3339 in UTC with the fraction of a second trimmed of trailing zeros, as InfluxDB prints
/// times (`2023-11-14T22:13:20Z`, `2023-11-14T22:13:20.0166Z`).
pub fn format_rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let mut out = format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    if frac != 0 {
        let digits = format!("{frac:09}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// How an answer prints times: RFC 3339 strings, or integers in a unit (`epoch=ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epoch {
    Rfc3339,
    Unit(i64),
}

impl Epoch {
    /// The `epoch` parameter: absent is RFC 3339; `ns`, `n`, `u`, `µ`, `ms`, `s`, `m`, `h`.
    pub fn parse(s: Option<&str>) -> Result<Epoch, String> {
        match s {
            None | Some("") => Ok(Epoch::Rfc3339),
            Some("n") => Ok(Epoch::Unit(1)),
            Some(u) => unit_ns(u)
                .filter(|_| !matches!(u, "d" | "w" | "us"))
                .map(Epoch::Unit)
                .ok_or_else(|| format!("unknown epoch {u:?}: use ns, u, ms, s, m or h")),
        }
    }

    /// A time as the answer prints it.
    pub fn json(self, ns: i64) -> serde_json::Value {
        match self {
            Epoch::Rfc3339 => serde_json::Value::String(format_rfc3339(ns)),
            Epoch::Unit(u) => serde_json::Value::from(ns.div_euclid(u)),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    #[test]
    fn rfc3339_past_the_range_of_i64_nanoseconds_is_none_not_an_overflow() {
        use super::parse_rfc3339;
        // Found by the prometheus_api fuzz target: the year 4046 overflowed the multiplication.
        assert_eq!(parse_rfc3339("4046-11-14T24:20.5Z"), None);
        assert_eq!(parse_rfc3339("4046-11-14T23:20:00Z"), None);
        assert_eq!(parse_rfc3339("9999-12-31"), None);
        assert_eq!(parse_rfc3339("0001-01-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2262-04-11T23:47:16.854775807Z"), Some(i64::MAX));
        assert_eq!(parse_rfc3339("2262-04-11T23:47:16.854775808Z"), None);
        assert_eq!(parse_rfc3339("1677-09-21T00:12:43.145224192Z"), Some(i64::MIN));
    }

    #[test]
    fn api_times_are_checked_at_the_edges_of_i64() {
        use super::parse_api_time;
        let now = 1_700_000_000_000_000_000;
        assert_eq!(parse_api_time(" now ", now), Some(now));
        assert_eq!(parse_api_time("now-15m", now), Some(now - 900_000_000_000));
        assert_eq!(parse_api_time("now+1s", now), Some(now + 1_000_000_000));
        assert_eq!(parse_api_time("-5", now), Some(-5));
        assert_eq!(parse_api_time("1970-01-01T00:00:01Z", now), Some(1_000_000_000));
        // These overflowed (a panic in a debug build, a wrapped time in a release one).
        assert_eq!(parse_api_time("now+9223372036854775807ns", now), None);
        assert_eq!(parse_api_time("now-9223372036854775807ns", -now), None);
        assert_eq!(parse_api_time("now+", now), None);
        assert_eq!(parse_api_time("yesterday", now), None);
    }

    use super::*;

    #[test]
    fn times_parse_and_print_as_influxdb_does() {
        let t = 1_700_000_000_000_000_000;
        assert_eq!(format_rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(format_rfc3339(t + 16_600_000), "2023-11-14T22:13:20.0166Z");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(t));
        assert_eq!(parse_rfc3339("2023-11-14 22:13:20"), Some(t));
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20.5+01:00"), Some(t + 500_000_000));
        assert_eq!(parse_rfc3339("2023-11-14T21:13:20-01:00"), Some(t));
        assert_eq!(parse_rfc3339("2023-11-14"), Some(t - 80_000_000_000_000));
        assert_eq!(parse_rfc3339("2023-13-01"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_duration("1h30m"), Some(5_400_000_000_000));
        assert_eq!(parse_duration("1700000000000ms"), Some(t));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5x"), None);
        assert_eq!(Epoch::parse(Some("ms")).unwrap().json(t + 5), serde_json::json!(1_700_000_000_000i64));
        assert!(Epoch::parse(Some("fortnight")).is_err());
    }

    proptest! {
        #[test]
        fn printed_times_parse_back(ns in 0i64..7_258_118_400_000_000_000) {
            prop_assert_eq!(parse_rfc3339(&format_rfc3339(ns)), Some(ns));
        }
    }
}

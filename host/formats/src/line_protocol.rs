//! InfluxDB line protocol, sans I/O: a request body in, a validated write batch and the lines
//! that could not be stored out (InfluxDB's partial writes).
//!
//! `measurement[,tag=value...] field=value[,field=value...] [timestamp]`, one point per line,
//! with the whole syntax: `\` escapes of `,`, `=` and space in names, several fields per line,
//! floats, integers (`1i`), unsigned integers (`1u`), booleans (`t`, `true`, `F`, ...), quoted
//! strings (which may hold newlines), comments (`#`), timestamps at any [`Precision`] or none
//! (the caller's `now`). Numbers are stored as `f64` (integers beyond 2^53 lose precision;
//! booleans are 1 and 0). String fields are refused, the line's other fields kept. A line that
//! does not parse, or whose series key or timestamp is invalid, is refused whole; every other
//! line is stored. Names map to series keys as [`crate::names`] says.
//!
//! Implementation notes: a batch of live data repeats a few series many times, so the series
//! key of each (series text, field) pair is built once per body and looked up by its raw bytes
//! after that; lines are cut at `\n` unless a quoted string is open.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use timeshard_proto::point::SeriesPoints;
use timeshard_proto::time::check_timestamp;
use timeshard_proto::{Point, SeriesKey};

use crate::names;

/// Lines reported one by one in an answer; the rest are counted.
pub const MAX_REPORTED_ERRORS: usize = 100;
/// Bytes of a refused line quoted in its error.
const QUOTED_BYTES: usize = 80;
/// Fields a line holds before their names are looked up in a map rather than one by one.
const INDEX_FIELDS_FROM: usize = 16;

/// The unit of a body's timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Ns,
    Us,
    Ms,
    S,
    M,
    H,
}

/// A `precision` parameter no InfluxDB version knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision {0:?}: use ns, us, ms or s (or n, u, m, h as InfluxDB 1.x spells them)")]
pub struct UnknownPrecision(pub String);

impl Precision {
    /// Reads InfluxDB's spellings of a precision, v1 (`n`, `u`, `ms`, `s`, `m`, `h`) and v2
    /// (`ns`, `us`, `ms`, `s`).
    pub fn parse(s: &str) -> Result<Precision, UnknownPrecision> {
        Ok(match s {
            "n" | "ns" => Precision::Ns,
            "u" | "us" | "µ" | "µs" => Precision::Us,
            "ms" => Precision::Ms,
            "s" => Precision::S,
            "m" => Precision::M,
            "h" => Precision::H,
            other => return Err(UnknownPrecision(other.chars().take(16).collect())),
        })
    }

    /// Nanoseconds in one unit.
    pub fn ns(self) -> i64 {
        match self {
            Precision::Ns => 1,
            Precision::Us => 1_000,
            Precision::Ms => 1_000_000,
            Precision::S => 1_000_000_000,
            Precision::M => 60_000_000_000,
            Precision::H => 3_600_000_000_000,
        }
    }
}

/// A line that was not stored (whole or in part), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number in the body; 0 for a refusal that is not of one line (a point an
    /// ingest policy refused).
    pub line: usize,
    pub message: String,
}

/// What a body holds.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    /// The points to store, by series.
    pub batch: Vec<SeriesPoints>,
    /// Points in `batch`.
    pub points: usize,
    /// Lines refused whole or in part, the first [`MAX_REPORTED_ERRORS`] of them.
    pub errors: Vec<LineError>,
    /// Every line refused whole or in part.
    pub failed_lines: usize,
}

impl Parsed {
    fn fail(&mut self, line: usize, text: &[u8], reason: &str) {
        self.failed_lines += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            let quoted = String::from_utf8_lossy(&text[..text.len().min(QUOTED_BYTES)]);
            let more = if text.len() > QUOTED_BYTES { "..." } else { "" };
            self.errors.push(LineError { line, message: format!("unable to parse '{quoted}{more}': {reason}") });
        }
    }

    /// The partial-write message InfluxDB clients show: the first refused lines and how many
    /// lines were dropped.
    pub fn partial_write_message(&self) -> String {
        partial_write_message(&self.errors, self.failed_lines)
    }
}

/// InfluxDB's partial-write message for `failed` refused lines, the first of them in `errors`.
pub fn partial_write_message(errors: &[LineError], failed: usize) -> String {
    let mut out = String::from("partial write: ");
    for (i, e) in errors.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        if e.line > 0 {
            out.push_str(&format!("line {}: ", e.line));
        }
        out.push_str(&e.message);
    }
    if failed > errors.len() {
        out.push_str(&format!("; and {} more", failed - errors.len()));
    }
    out.push_str(&format!(" dropped={failed}"));
    out
}

/// FxHash: raw series text is short and comes from one trusted body at a time, so a fast
/// non-keyed hash is enough (the map lives for one request).
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
/// (series text, field name) as sent -> index in the batch, or why that series is refused.
type Slots<'a> = FxMap<(&'a [u8], &'a [u8]), Result<usize, String>>;

/// One field of a line: its raw (escaped) name and value.
enum FieldValue {
    Number(f64),
    Str,
}

/// Parses a whole body. `now_ns` stamps lines without a timestamp.
pub fn parse(body: &[u8], precision: Precision, now_ns: i64) -> Parsed {
    let mut out = Parsed::default();
    let mut slots = Slots::default();
    let mut by_key: HashMap<SeriesKey, usize> = HashMap::new();
    let mut fields: Vec<(&[u8], FieldValue)> = Vec::new();
    let mut start = 0;
    let mut next_line = 1;
    while start < body.len() {
        let line_no = next_line;
        next_line += 1;
        // A comment ends at the first newline, whatever it holds: skipped without a look at it.
        let lead = body[start..].iter().position(|&b| b != b' ' && b != b'\t').map_or(body.len(), |i| start + i);
        if body.get(lead) == Some(&b'#') {
            start = memchr::memchr(b'\n', &body[lead..]).map_or(body.len(), |i| lead + i) + 1;
            continue;
        }
        let (end, quoted) = line_end(body, start);
        let segment = &body[start..end];
        // Numbers are of physical lines, so count the newlines inside quoted strings too.
        if quoted {
            next_line += memchr::memchr_iter(b'\n', segment).count();
        }
        let line = trim_line(segment);
        start = end + 1;
        if line.is_empty() {
            continue;
        }
        fields.clear();
        let (series, ts) = match split_line(line, &mut fields) {
            Ok(parts) => parts,
            Err(reason) => {
                out.fail(line_no, line, reason);
                continue;
            }
        };
        let ts = match ts {
            None => now_ns,
            Some(raw) => match raw.checked_mul(precision.ns()) {
                Some(ts) => ts,
                None => {
                    out.fail(line_no, line, "timestamp out of range");
                    continue;
                }
            },
        };
        if let Err(e) = check_timestamp(ts) {
            out.fail(line_no, line, &e.to_string());
            continue;
        }
        let mut strings = Vec::new();
        let mut refused = None;
        for (name, value) in &fields {
            let value = match value {
                FieldValue::Number(v) => *v,
                FieldValue::Str => {
                    strings.push(String::from_utf8_lossy(&unescape(name, b",= ")).into_owned());
                    continue;
                }
            };
            let slot = slots.entry((series, name)).or_insert_with(|| {
                let key = series_key(series, name)?;
                let next = out.batch.len();
                let i = *by_key.entry(key.clone()).or_insert(next);
                if i == next {
                    out.batch.push(SeriesPoints { series: key, points: Vec::new() });
                }
                Ok(i)
            });
            match slot {
                Ok(i) => {
                    out.batch[*i].points.push(Point::new(ts, value));
                    out.points += 1;
                }
                Err(reason) => refused = Some(reason.clone()),
            }
        }
        if let Some(reason) = refused {
            out.fail(line_no, line, &reason);
        } else if !strings.is_empty() {
            let reason = format!(
                "field {} is a string; timeshard stores numbers (float, integer, unsigned, boolean), so string fields \
                 are refused{}",
                strings.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", "),
                if strings.len() < fields.len() { " (the line's other fields were stored)" } else { "" }
            );
            out.fail(line_no, line, &reason);
        }
    }
    out
}

/// Where the line starting at `start` ends (the index of its `\n`, or the body's end), and
/// whether it may run past a newline (it holds a `"`).
fn line_end(body: &[u8], start: usize) -> (usize, bool) {
    let rest = &body[start..];
    let plain_end = memchr::memchr(b'\n', rest).map_or(body.len(), |i| start + i);
    if memchr::memchr(b'"', &body[start..plain_end]).is_none() {
        return (plain_end, false);
    }
    (quoted_line_end(body, start), true)
}

/// [`line_end`] of a line holding a `"`: a quoted string value may hold newlines.
fn quoted_line_end(body: &[u8], start: usize) -> usize {
    // A quoted string value may hold newlines: scan with quotes in mind.
    let (mut i, mut in_fields, mut quoted) = (start, false, false);
    while i < body.len() {
        let b = body[i];
        if b == b'\\' {
            i += 2;
            continue;
        }
        if quoted {
            quoted = b != b'"';
        } else {
            match b {
                b'\n' => return i,
                b' ' => in_fields = true,
                b'"' if in_fields && body[i - 1] == b'=' => quoted = true,
                _ => {}
            }
        }
        i += 1;
    }
    body.len()
}

fn trim_line(mut line: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = line {
        line = rest;
    }
    while let [rest @ .., b'\r' | b' ' | b'\t'] = line {
        line = rest;
    }
    line
}

/// Index of the first byte of `s` in `stops` that no `\` escapes, from `from`.
fn find_unescaped(s: &[u8], from: usize, stops: &[u8]) -> usize {
    let mut i = from;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b if stops.contains(&b) => return i,
            _ => i += 1,
        }
    }
    s.len()
}

fn skip_spaces(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && s[i] == b' ' {
        i += 1;
    }
    i
}

/// Splits a line into its series text (measurement and tags as sent), its fields and its
/// timestamp (in the body's unit).
fn split_line<'a>(
    line: &'a [u8],
    fields: &mut Vec<(&'a [u8], FieldValue)>,
) -> Result<(&'a [u8], Option<i64>), &'static str> {
    // Where each field name is in `fields`, once a line has more than a few: looking each new
    // name up among the ones before was quadratic, and one line of 40,000 fields took 1.5 s
    // (found by review; a 20 MB body of one such line would have held a decoding thread for
    // an hour).
    let mut index: Option<FxMap<&'a [u8], usize>> = None;
    let series_end = find_unescaped(line, 0, b" ");
    let series = &line[..series_end];
    if series.is_empty() || series[0] == b',' {
        return Err("missing measurement");
    }
    let mut i = skip_spaces(line, series_end);
    if i >= line.len() {
        return Err("missing fields");
    }
    loop {
        let eq = find_unescaped(line, i, b"=, ");
        if eq >= line.len() || line[eq] != b'=' {
            return Err("invalid field format: expected name=value");
        }
        let name = &line[i..eq];
        if name.is_empty() {
            return Err("missing field name");
        }
        let (value, next) = field_value(line, eq + 1)?;
        let seen = match &index {
            Some(index) => index.get(name).copied(),
            None => fields.iter().position(|(n, _)| *n == name),
        };
        match seen {
            // As InfluxDB: the last value of a repeated field wins.
            Some(j) => fields[j].1 = value,
            None => {
                fields.push((name, value));
                match &mut index {
                    Some(index) => {
                        index.insert(name, fields.len() - 1);
                    }
                    None if fields.len() > INDEX_FIELDS_FROM => {
                        index = Some(fields.iter().enumerate().map(|(j, (n, _))| (*n, j)).collect());
                    }
                    None => {}
                }
            }
        }
        match line.get(next) {
            Some(b',') => i = next + 1,
            Some(b' ') => {
                let ts = &line[skip_spaces(line, next)..];
                if ts.is_empty() {
                    return Ok((series, None));
                }
                return parse_int(ts).map(|t| (series, Some(t))).ok_or("bad timestamp");
            }
            None => return Ok((series, None)),
            Some(_) => return Err("invalid field format"),
        }
    }
}

/// Reads the value starting at `i`; returns it and the index just after it.
fn field_value(line: &[u8], i: usize) -> Result<(FieldValue, usize), &'static str> {
    if line.get(i) == Some(&b'"') {
        let mut j = i + 1;
        while j < line.len() {
            match line[j] {
                b'\\' => j += 2,
                b'"' => return Ok((FieldValue::Str, j + 1)),
                _ => j += 1,
            }
        }
        return Err("unterminated string field value");
    }
    let end = line[i..].iter().position(|&b| b == b',' || b == b' ').map_or(line.len(), |p| i + p);
    let raw = &line[i..end];
    let value = match raw {
        [] => return Err("missing field value"),
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => 1.0,
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => 0.0,
        [digits @ .., b'i'] => parse_int(digits).ok_or("invalid integer field value")? as f64,
        [digits @ .., b'u'] => parse_uint(digits).ok_or("invalid unsigned integer field value")? as f64,
        _ => parse_float(raw).ok_or("invalid field value: not a number, integer, boolean or string")?,
    };
    Ok((FieldValue::Number(value), end))
}

fn parse_uint(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

fn parse_int(s: &[u8]) -> Option<i64> {
    match s {
        [b'-', digits @ ..] => {
            let n = parse_uint(digits)?;
            if n == 1 << 63 { Some(i64::MIN) } else { i64::try_from(n).ok().map(|n| -n) }
        }
        digits => i64::try_from(parse_uint(digits)?).ok(),
    }
}

/// A decimal float (`-1.5`, `.5`, `3e-2`); no `inf` or `NaN`, which line protocol forbids.
fn parse_float(s: &[u8]) -> Option<f64> {
    let digits = s.iter().filter(|b| b.is_ascii_digit()).count();
    let valid = s.iter().all(|&b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
    if digits == 0 || !valid {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// `s` with `\` before any of `special` removed (other backslashes are kept, as InfluxDB does).
fn unescape(s: &[u8], special: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && i + 1 < s.len() && special.contains(&s[i + 1]) {
            out.push(s[i + 1]);
            i += 2;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The series key of series text `series` (measurement and tags as sent) and field `field`.
fn series_key(series: &[u8], field: &[u8]) -> Result<SeriesKey, String> {
    // Every unescaped byte of the measurement, tags and field (but the field `value`, which
    // is left out) ends up in the key, and an escape takes two bytes for one: names this long
    // cannot make a key within the limit, so they are refused before anything is copied.
    let longest = 2 * timeshard_proto::series::MAX_SERIES_KEY_BYTES + 2;
    if series.len() > longest || field.len() > longest {
        return Err(format!(
            "the measurement, tags and field name take {} bytes; a series key is at most {} bytes",
            series.len() + field.len(),
            timeshard_proto::series::MAX_SERIES_KEY_BYTES
        ));
    }
    let utf8 = |b: Vec<u8>| String::from_utf8(b).map_err(|_| "names must be UTF-8".to_string());
    let m_end = find_unescaped(series, 0, b",");
    let measurement = utf8(unescape(&series[..m_end], b", "))?;
    let mut tags = Vec::new();
    let mut i = m_end;
    while i < series.len() {
        let eq = find_unescaped(series, i + 1, b"=,");
        if eq >= series.len() || series[eq] != b'=' {
            return Err("missing tag value".into());
        }
        let end = find_unescaped(series, eq + 1, b",");
        let (key, value) = (&series[i + 1..eq], &series[eq + 1..end]);
        if key.is_empty() {
            return Err("missing tag key".into());
        }
        if value.is_empty() {
            return Err("missing tag value".into());
        }
        tags.push((utf8(unescape(key, b",= "))?, utf8(unescape(value, b",= "))?));
        i = end;
    }
    let field = utf8(unescape(field, b",= "))?;
    names::line_protocol_key(&measurement, &field, tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const NOW: i64 = 1_700_000_000_000_000_000;

    fn points_of(p: &Parsed, key: &str) -> Vec<Point> {
        p.batch.iter().find(|s| s.series.as_str() == key).map(|s| s.points.clone()).unwrap_or_default()
    }

    #[test]
    fn names_too_long_for_a_key_are_refused_without_quoting_them_whole() {
        let long_tag = format!("m,site={} value=1 1\n", "a".repeat(1 << 20));
        let long_field = format!("m,site=atl value=1,{}=2 1\n", "f".repeat(1 << 20));
        for body in [long_tag, long_field] {
            let p = parse(body.as_bytes(), Precision::S, NOW);
            assert_eq!(p.failed_lines, 1);
            let message = &p.errors[0].message;
            assert!(
                message.contains("at most 512 bytes") && message.len() < 1024,
                "{}",
                &message[..200.min(message.len())]
            );
        }
        // Escapes count once: a key of 512 bytes written with escapes is still accepted.
        let escaped = format!("m,k={} x=1 1\n", "\\ ".repeat(100));
        assert_eq!(parse(escaped.as_bytes(), Precision::S, NOW).failed_lines, 0);
    }

    #[test]
    fn every_value_type_and_several_fields_per_line() {
        let body = b"cpu,host=a,region=us\\ west usage=1.5,n=-3i,u=7u,ok=t,bad=F 1700000000\n\
                     # a comment\n\n\
                     pmu.phase,site=atl,bus=7 value=49.98 1700000000\r\n";
        let p = parse(body, Precision::S, NOW);
        assert_eq!(p.errors, vec![]);
        assert_eq!(p.points, 6);
        let ts = 1_700_000_000 * 1_000_000_000;
        assert_eq!(points_of(&p, "cpu.usage{host=a,region=us%20west}"), vec![Point::new(ts, 1.5)]);
        assert_eq!(points_of(&p, "cpu.n{host=a,region=us%20west}"), vec![Point::new(ts, -3.0)]);
        assert_eq!(points_of(&p, "cpu.u{host=a,region=us%20west}"), vec![Point::new(ts, 7.0)]);
        assert_eq!(points_of(&p, "cpu.ok{host=a,region=us%20west}"), vec![Point::new(ts, 1.0)]);
        assert_eq!(points_of(&p, "cpu.bad{host=a,region=us%20west}"), vec![Point::new(ts, 0.0)]);
        assert_eq!(points_of(&p, "pmu.phase{bus=7,site=atl}"), vec![Point::new(ts, 49.98)]);
    }

    #[test]
    fn a_comment_ends_at_its_newline_even_when_it_holds_a_quote() {
        // A comment's `a="b` once opened a quoted string that took the next lines with it.
        let body = b"  # note: a=\"b c\nm value=1 1\n# x y=\"\nm value=2 2\nbad line\n";
        let p = parse(body, Precision::S, NOW);
        assert_eq!(p.points, 2, "{:?}", p.errors);
        assert_eq!(points_of(&p, "m"), vec![Point::new(1_000_000_000, 1.0), Point::new(2_000_000_000, 2.0)]);
        assert_eq!(p.errors.iter().map(|e| e.line).collect::<Vec<_>>(), [5], "lines are still counted");
    }

    #[test]
    fn escapes_in_every_kind_of_name() {
        let body = br"my\ meas\,x,tag\=k=v\,1\ 2 fi\ eld\=z=1 5";
        let p = parse(body, Precision::Ns, NOW);
        assert_eq!(p.errors, vec![]);
        let key = &p.batch[0].series;
        assert_eq!(names::measurement_and_field(key.metric()), ("my meas,x".into(), "fi eld=z".into()));
        assert_eq!(names::decoded_tags(key), vec![("tag=k".into(), "v,1 2".into())]);
        assert_eq!(p.batch[0].points, vec![Point::new(5, 1.0)]);
    }

    #[test]
    fn missing_timestamps_take_now_and_precisions_scale() {
        let p = parse(b"m v=1\nm v=2 3", Precision::Ms, NOW);
        assert_eq!(p.batch[0].points, vec![Point::new(NOW, 1.0), Point::new(3_000_000, 2.0)]);
        for (s, ns) in [("n", 1), ("ns", 1), ("u", 1_000), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000)] {
            assert_eq!(Precision::parse(s).unwrap().ns(), ns);
        }
        assert_eq!(Precision::parse("h").unwrap().ns(), 3_600_000_000_000);
        assert!(Precision::parse("fortnight").unwrap_err().to_string().contains("use ns, us, ms or s"));
    }

    #[test]
    fn bad_lines_are_reported_and_good_ones_kept() {
        let body = b"good v=1 1\n\
                     nofields\n\
                     bad v=abc 1\n\
                     bad v=1 12x\n\
                     ,t=1 v=1\n\
                     m,t v=1\n\
                     m v=nan\n\
                     m v=9223372036854775808i\n\
                     m v=1 -5\n\
                     _timeshard.x v=1\n\
                     good v=2 2";
        let p = parse(body, Precision::Ns, NOW);
        assert_eq!(p.batch.len(), 1);
        assert_eq!(p.batch[0].points, vec![Point::new(1, 1.0), Point::new(2, 2.0)]);
        assert_eq!(p.failed_lines, 9);
        let lines: Vec<usize> = p.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, (2..=10).collect::<Vec<_>>());
        assert!(p.errors[0].message.contains("missing fields"), "{:?}", p.errors[0]);
        assert!(p.errors[2].message.contains("bad timestamp"), "{:?}", p.errors[2]);
        assert!(p.errors[4].message.contains("missing tag value"), "{:?}", p.errors[4]);
        assert!(p.errors[7].message.contains("out of range"), "{:?}", p.errors[7]);
        assert!(p.errors[8].message.contains("reserved"), "{:?}", p.errors[8]);
        let msg = p.partial_write_message();
        assert!(
            msg.starts_with("partial write: line 2: unable to parse 'nofields'") && msg.ends_with("dropped=9"),
            "{msg}"
        );
    }

    #[test]
    fn string_fields_are_refused_and_the_rest_of_the_line_kept() {
        let body = b"m,h=a s=\"a \\\"quoted\\\" string,\nwith a newline\",v=3 10\nm s=\"only\" 11\nm v=4 12";
        let p = parse(body, Precision::Ns, NOW);
        assert_eq!(points_of(&p, "m.v{h=a}"), vec![Point::new(10, 3.0)]);
        assert_eq!(points_of(&p, "m.v"), vec![Point::new(12, 4.0)]);
        assert_eq!(p.failed_lines, 2);
        assert_eq!((p.errors[0].line, p.errors[1].line), (1, 3));
        assert!(
            p.errors[0].message.contains("field \"s\" is a string") && p.errors[0].message.contains("other fields")
        );
        assert!(!p.errors[1].message.contains("other fields"));
        assert!(parse(b"m s=\"open", Precision::Ns, NOW).errors[0].message.contains("unterminated"));
    }

    #[test]
    fn repeated_fields_keep_the_last_value_and_series_merge_across_spellings() {
        let p = parse(b"m,a=1,b=2 v=1,v=2 1\nm,b=2,a=1 v=3 2", Precision::Ns, NOW);
        assert_eq!(p.batch.len(), 1);
        assert_eq!(p.batch[0].points, vec![Point::new(1, 2.0), Point::new(2, 3.0)]);
    }

    /// Found by review: repeated fields were found by a search of the ones before, so one line
    /// of n fields took n² steps (40,000 fields: 1.5 s in a release build). This line's 50,000
    /// names, each sent twice, keep their first place and their last value.
    #[test]
    fn a_line_of_many_fields_keeps_each_names_first_place_and_last_value() {
        let n = 50_000;
        let first = (0..n).map(|i| format!("f{i}=1"));
        let again = (0..n).rev().map(|i| format!("f{i}={}", i + 2));
        let line = format!("m {} 7", first.chain(again).collect::<Vec<_>>().join(","));
        let p = parse(line.as_bytes(), Precision::Ns, NOW);
        assert_eq!((p.batch.len(), p.points, p.failed_lines), (n, n, 0));
        for (i, s) in p.batch.iter().enumerate() {
            assert_eq!(s.series.to_string(), format!("m.f{i}"));
            assert_eq!(s.points, vec![Point::new(7, (i + 2) as f64)]);
        }
    }

    #[test]
    fn errors_past_the_reported_ones_are_counted() {
        let body: Vec<u8> = (0..MAX_REPORTED_ERRORS + 5).flat_map(|_| b"x\n".iter().copied()).collect();
        let p = parse(&body, Precision::Ns, NOW);
        assert_eq!((p.errors.len(), p.failed_lines), (MAX_REPORTED_ERRORS, MAX_REPORTED_ERRORS + 5));
        assert!(p.partial_write_message().contains("and 5 more dropped=105"));
    }

    proptest! {
        /// Whatever the bytes, parsing neither panics nor loses count: every stored point came
        /// from a line, and no line is both stored whole and reported.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            let p = parse(&body, Precision::Ns, NOW);
            prop_assert!(p.points <= body.len());
            prop_assert!(p.errors.len() <= p.failed_lines);
        }

        /// Well-formed lines written by a client round-trip exactly.
        #[test]
        fn written_lines_read_back(
            rows in proptest::collection::vec(
                ("[a-z][a-z ,=]{0,8}", "[a-z ,=]{1,6}", "[a-z0-9 ,=]{1,6}", -1.0e9f64..1.0e9, 0i64..4_000_000_000_000_000_000),
                1..20,
            ),
        ) {
            let esc = |s: &str, special: &str| s.chars().map(|c| if special.contains(c) { format!("\\{c}") } else { c.to_string() }).collect::<String>();
            let mut body = String::new();
            for (m, k, v, value, ts) in &rows {
                body.push_str(&format!("{},{}={} f={value:?} {ts}\n", esc(m, ", "), esc(k, ",= "), esc(v, ",= ")));
            }
            let p = parse(body.as_bytes(), Precision::Ns, NOW);
            prop_assert_eq!(p.failed_lines, 0, "{:?}", p.errors);
            prop_assert_eq!(p.points, rows.len());
            for (m, k, v, value, ts) in &rows {
                let key = names::line_protocol_key(m, "f", [(k.as_str(), v.as_str())]).unwrap();
                prop_assert!(points_of(&p, key.as_str()).contains(&Point::new(*ts, *value)));
            }
        }
    }
}

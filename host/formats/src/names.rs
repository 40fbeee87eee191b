//! How the names of other tools map to series keys, and back.
//!
//! A series key allows letters, digits and `. _ - / : %` in its metric, tag names and tag
//! values. Every other byte of a name (UTF-8) is percent-encoded as `%XX`, and so is `%`
//! itself, so the mapping is reversible: `le="+Inf"` is stored as `le=%2BInf`, a tag value
//! `edge 7` as `edge%207`.
//!
//! - InfluxDB line protocol: measurement `m`, field `f` and tags map to the metric `m.f` with
//!   the tags, except the field `value`, which maps to the bare metric `m`. A `.` in a field
//!   name is encoded (`%2E`), so the field is always what follows the metric's last `.`:
//!   `cpu,host=a usage_idle=3` is `cpu.usage_idle{host=a}`, `pmu.phase,bus=7 value=1` is
//!   `pmu.phase{bus=7}` (the key the SDK writes).
//! - Prometheus: the metric name (`__name__`) is the metric, the other labels are tags; empty
//!   label values are absent labels, as in Prometheus.
//! - InfluxQL reads the other way: `SELECT f FROM m` reads the metric `m.f` (or `m` for
//!   `value`), and `SHOW MEASUREMENTS` reports a metric's part before its last `.` (or all of
//!   it when it has no `.`), so `pmu.phase` is measurement `pmu`, field `phase`.

use std::borrow::Cow;

use timeshard_proto::SeriesKey;
use timeshard_proto::key::RESERVED_METRIC_PREFIX;
use timeshard_proto::series::SeriesKeyError;

/// The field name that maps to the bare measurement.
pub const VALUE_FIELD: &str = "value";

/// A name that cannot become part of a series key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(transparent)]
    Key(#[from] SeriesKeyError),
    #[error("metric {0:?} is reserved: names starting with {RESERVED_METRIC_PREFIX} are timeshard's own")]
    Reserved(String),
    #[error("the series has no metric name (Prometheus label __name__)")]
    NoName,
}

fn plain(b: u8, keep_dot: bool) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'/' | b':') || (keep_dot && b == b'.')
}

fn encode(s: &str, keep_dot: bool) -> Cow<'_, str> {
    if s.bytes().all(|b| plain(b, keep_dot)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if plain(b, keep_dot) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
        }
    }
    Cow::Owned(out)
}

/// A measurement, metric, tag name or tag value as stored in a series key (`.` kept).
pub fn encode_name(s: &str) -> Cow<'_, str> {
    encode(s, true)
}

/// A field name as stored after the metric's last `.` (`.` encoded).
pub fn encode_field(s: &str) -> Cow<'_, str> {
    encode(s, false)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// The original name of a stored one: `%XX` decoded. A `%` not followed by two hex digits, or
/// bytes that are not UTF-8, are kept as they are.
pub fn decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(s),
    }
}

/// The metric of InfluxDB measurement `measurement` and field `field`.
pub fn metric_of(measurement: &str, field: &str) -> String {
    let m = encode_name(measurement);
    if field == VALUE_FIELD {
        return m.into_owned();
    }
    let f = encode_field(field);
    let mut out = String::with_capacity(m.len() + 1 + f.len());
    out.push_str(&m);
    out.push('.');
    out.push_str(&f);
    out
}

/// The (measurement, field) a metric reads as in InfluxQL, decoded.
pub fn measurement_and_field(metric: &str) -> (String, String) {
    match metric.rsplit_once('.') {
        Some((m, f)) if !m.is_empty() && !f.is_empty() => (decode(m).into_owned(), decode(f).into_owned()),
        _ => (decode(metric).into_owned(), VALUE_FIELD.to_string()),
    }
}

/// Whether `metric` belongs to InfluxDB measurement `measurement` (any field).
pub fn metric_in_measurement(metric: &str, encoded_measurement: &str) -> bool {
    metric == encoded_measurement
        || metric
            .strip_prefix(encoded_measurement)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|field| !field.is_empty() && !field.contains('.'))
}

/// The field `metric` holds within the (encoded) measurement it belongs to, decoded.
pub fn field_in(metric: &str, encoded_measurement: &str) -> Option<String> {
    if metric == encoded_measurement {
        return Some(VALUE_FIELD.to_string());
    }
    let field = metric.strip_prefix(encoded_measurement)?.strip_prefix('.')?;
    (!field.is_empty() && !field.contains('.')).then(|| decode(field).into_owned())
}

fn checked(key: SeriesKey) -> Result<SeriesKey, NameError> {
    if key.metric().starts_with(RESERVED_METRIC_PREFIX) {
        return Err(NameError::Reserved(key.metric().to_string()));
    }
    Ok(key)
}

/// The series key of a line-protocol measurement, field and tags (raw names, not encoded).
pub fn line_protocol_key<'a>(
    measurement: &str,
    field: &str,
    tags: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<SeriesKey, NameError> {
    let metric = metric_of(measurement, field);
    let tags: Vec<(Cow<'a, str>, Cow<'a, str>)> =
        tags.into_iter().map(|(k, v)| (encode_name(k), encode_name(v))).collect();
    checked(SeriesKey::new(&metric, tags.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))?)
}

/// The series key of a Prometheus label set (with `__name__`).
pub fn prometheus_key<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<SeriesKey, NameError> {
    let mut name = None;
    let mut tags = Vec::new();
    for (k, v) in labels {
        if k == "__name__" {
            name = Some(encode_name(v));
        } else if !v.is_empty() {
            tags.push((encode_name(k), encode_name(v)));
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or(NameError::NoName)?;
    checked(SeriesKey::new(&name, tags.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))?)
}

/// The tags of a series key, decoded.
pub fn decoded_tags(key: &SeriesKey) -> Vec<(String, String)> {
    key.tags().map(|(k, v)| (decode(k).into_owned(), decode(v).into_owned())).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn line_protocol_names_map_as_documented() {
        let k = line_protocol_key("cpu", "usage_idle", [("host", "a")]).unwrap();
        assert_eq!(k.as_str(), "cpu.usage_idle{host=a}");
        let k = line_protocol_key("pmu.phase", "value", [("site", "atl"), ("bus", "7")]).unwrap();
        assert_eq!(k.as_str(), "pmu.phase{bus=7,site=atl}");
        let k = line_protocol_key("my meas", "a.b", [("h", "edge 7"), ("p", "50%")]).unwrap();
        assert_eq!(k.as_str(), "my%20meas.a%2Eb{h=edge%207,p=50%25}");
        assert_eq!(measurement_and_field(k.metric()), ("my meas".to_string(), "a.b".to_string()));
        assert_eq!(decoded_tags(&k), vec![("h".into(), "edge 7".into()), ("p".into(), "50%".into())]);
        assert_eq!(measurement_and_field("up"), ("up".to_string(), "value".to_string()));
        assert!(matches!(line_protocol_key("_timeshard.x", "v", []), Err(NameError::Reserved(_))));
        assert!(metric_in_measurement("cpu.idle", "cpu"));
        assert!(metric_in_measurement("cpu", "cpu"));
        assert!(!metric_in_measurement("cpu.idle.x", "cpu"));
        assert!(!metric_in_measurement("cpux", "cpu"));
        assert_eq!(field_in("pmu.phase", "pmu.phase").as_deref(), Some("value"));
        assert_eq!(field_in("pmu.phase.a%2Eb", "pmu.phase").as_deref(), Some("a.b"));
        assert_eq!(field_in("pmu.phase", "pmu").as_deref(), Some("phase"));
        assert_eq!(field_in("pmu.phasex", "pmu.phase"), None);
    }

    #[test]
    fn prometheus_labels_map_to_tags() {
        let k =
            prometheus_key([("__name__", "http_requests_total"), ("le", "+Inf"), ("job", "node"), ("e", "")]).unwrap();
        assert_eq!(k.as_str(), "http_requests_total{job=node,le=%2BInf}");
        assert_eq!(prometheus_key([("job", "x")]), Err(NameError::NoName));
    }

    #[test]
    fn stray_percent_signs_are_kept() {
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("a%zz"), "a%zz");
        assert_eq!(decode("%41"), "A");
    }

    proptest! {
        #[test]
        fn encoding_round_trips_and_makes_valid_names(s in "\\PC{1,40}") {
            let name = encode_name(&s);
            prop_assert_eq!(decode(&name), s.as_str());
            let field = encode_field(&s);
            prop_assert!(!field.contains('.'));
            prop_assert_eq!(decode(&field), s.as_str());
            let key = SeriesKey::new(&name, [("t", name.as_ref())]);
            prop_assert!(key.is_ok() || matches!(key, Err(SeriesKeyError::TooLong { .. })), "{:?}", key);
        }
    }
}

//! Series keys: a metric plus sorted tags, in one canonical string such as
//! `pmu.phase{bus=7,site=atl}`.
//!
//! The canonical form is what gets hashed into time-factored keys, so two spellings of the same
//! series (tags in another order, `{}` for no tags) always map to the same key.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest accepted canonical series key, in bytes.
pub const MAX_SERIES_KEY_BYTES: usize = 512;
/// Most tags on one series.
pub const MAX_TAGS: usize = 32;

/// A series key that is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeriesKeyError {
    #[error("series key is empty: write it as metric{{tag=value,...}}, e.g. pmu.phase{{bus=7,site=atl}}")]
    Empty,
    #[error("series key {key:?} is {len} bytes long; the limit is {MAX_SERIES_KEY_BYTES}")]
    TooLong { key: String, len: usize },
    #[error("invalid {what} {name:?} in series key {key:?}: use letters, digits and . _ - / : % only")]
    BadName { key: String, what: &'static str, name: String },
    #[error("malformed tags in series key {key:?}: expected {{name=value,...}} after the metric")]
    BadTags { key: String },
    #[error("tag {tag:?} appears twice in series key {key:?}")]
    DuplicateTag { key: String, tag: String },
    #[error("series key {key:?} has {count} tags; the limit is {MAX_TAGS}")]
    TooManyTags { key: String, count: usize },
}

/// A validated series key in canonical form (tags sorted by name, no `{}` when there are none).
/// Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SeriesKey(Arc<str>);

// `%` lets names from other tools (InfluxDB, Prometheus) carry any character, percent-encoded.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':' | b'%'))
}

impl SeriesKey {
    /// Builds the canonical key of `metric` with `tags`.
    pub fn new<'a>(
        metric: &str,
        tags: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<SeriesKey, SeriesKeyError> {
        let mut map = BTreeMap::new();
        let key_for_errors = || {
            let mut s = metric.to_string();
            s.push_str("{...}");
            s
        };
        for (k, v) in tags {
            if map.insert(k, v).is_some() {
                return Err(SeriesKeyError::DuplicateTag { key: key_for_errors(), tag: k.to_string() });
            }
        }
        Self::from_parts(metric, &map, &key_for_errors())
    }

    fn from_parts(metric: &str, tags: &BTreeMap<&str, &str>, original: &str) -> Result<SeriesKey, SeriesKeyError> {
        if metric.is_empty() && tags.is_empty() {
            return Err(SeriesKeyError::Empty);
        }
        let bad =
            |what, name: &str| SeriesKeyError::BadName { key: original.to_string(), what, name: name.to_string() };
        if !valid_name(metric) {
            return Err(bad("metric", metric));
        }
        if tags.len() > MAX_TAGS {
            return Err(SeriesKeyError::TooManyTags { key: original.to_string(), count: tags.len() });
        }
        let mut s = String::from(metric);
        if !tags.is_empty() {
            s.push('{');
            for (i, (k, v)) in tags.iter().enumerate() {
                if !valid_name(k) {
                    return Err(bad("tag name", k));
                }
                if !valid_name(v) {
                    return Err(bad("tag value", v));
                }
                if i > 0 {
                    s.push(',');
                }
                s.push_str(k);
                s.push('=');
                s.push_str(v);
            }
            s.push('}');
        }
        if s.len() > MAX_SERIES_KEY_BYTES {
            return Err(SeriesKeyError::TooLong { len: s.len(), key: s });
        }
        Ok(SeriesKey(s.into()))
    }

    /// The canonical string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The metric name (before `{`).
    pub fn metric(&self) -> &str {
        self.0.split('{').next().unwrap_or("")
    }

    /// The tags, sorted by name.
    pub fn tags(&self) -> impl Iterator<Item = (&str, &str)> {
        let inner = self.0.find('{').map(|i| &self.0[i + 1..self.0.len() - 1]).unwrap_or("");
        inner.split(',').filter(|s| !s.is_empty()).filter_map(|kv| kv.split_once('='))
    }

    /// The value of tag `name`, if present.
    pub fn tag(&self, name: &str) -> Option<&str> {
        self.tags().find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

impl FromStr for SeriesKey {
    type Err = SeriesKeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SeriesKeyError::Empty);
        }
        if s.len() > MAX_SERIES_KEY_BYTES * 2 {
            // Cut on a character boundary: the key is anyone's text.
            return Err(SeriesKeyError::TooLong {
                key: s[..s.floor_char_boundary(64)].to_string() + "...",
                len: s.len(),
            });
        }
        let (metric, tags) = match s.find('{') {
            None => (s, ""),
            Some(i) => {
                if !s.ends_with('}') {
                    return Err(SeriesKeyError::BadTags { key: s.to_string() });
                }
                (&s[..i], &s[i + 1..s.len() - 1])
            }
        };
        let mut map = BTreeMap::new();
        for kv in tags.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(SeriesKeyError::BadTags { key: s.to_string() });
            };
            if map.insert(k.trim(), v.trim()).is_some() {
                return Err(SeriesKeyError::DuplicateTag { key: s.to_string(), tag: k.to_string() });
            }
        }
        SeriesKey::from_parts(metric, &map, s)
    }
}

impl TryFrom<String> for SeriesKey {
    type Error = SeriesKeyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        // Strings off the wire must already be canonical; re-canonicalising would let two
        // spellings of one series reach a replica.
        let key: SeriesKey = s.parse()?;
        if key.as_str() != s {
            return Err(SeriesKeyError::BadTags { key: s });
        }
        Ok(key)
    }
}

impl From<SeriesKey> for String {
    fn from(k: SeriesKey) -> String {
        k.0.to_string()
    }
}

impl fmt::Display for SeriesKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SeriesKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonical_form_sorts_tags() {
        let a: SeriesKey = "pmu.phase{site=atl, bus=7}".parse().unwrap();
        let b = SeriesKey::new("pmu.phase", [("bus", "7"), ("site", "atl")]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "pmu.phase{bus=7,site=atl}");
        assert_eq!(a.metric(), "pmu.phase");
        assert_eq!(a.tag("site"), Some("atl"));
        assert_eq!(a.tags().count(), 2);
        let plain: SeriesKey = "cpu{}".parse().unwrap();
        assert_eq!(plain.as_str(), "cpu");
        assert_eq!(plain.tags().count(), 0);
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert_eq!("".parse::<SeriesKey>(), Err(SeriesKeyError::Empty));
        assert!(matches!("a b".parse::<SeriesKey>(), Err(SeriesKeyError::BadName { .. })));
        assert!(matches!("m{a=1".parse::<SeriesKey>(), Err(SeriesKeyError::BadTags { .. })));
        assert!(matches!("m{a}".parse::<SeriesKey>(), Err(SeriesKeyError::BadTags { .. })));
        assert!(matches!("m{a=1,a=2}".parse::<SeriesKey>(), Err(SeriesKeyError::DuplicateTag { .. })));
        assert!(matches!("m{a=}".parse::<SeriesKey>(), Err(SeriesKeyError::BadName { .. })));
        assert!(matches!("x".repeat(600).parse::<SeriesKey>(), Err(SeriesKeyError::TooLong { .. })));
        // Its message cuts a long key on a character boundary (it used to panic mid-character).
        let wide = format!("m{}", "é".repeat(600));
        assert!(matches!(wide.parse::<SeriesKey>(), Err(SeriesKeyError::TooLong { len: 1201, .. })));
        // Non-canonical strings off the wire are refused.
        assert!(SeriesKey::try_from("m{b=1,a=2}".to_string()).is_err());
        assert!(SeriesKey::try_from("m{a=2,b=1}".to_string()).is_ok());
    }

    proptest! {
        #[test]
        fn parse_of_display_round_trips(
            metric in "[a-z][a-z0-9._]{0,20}",
            tags in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{1,8}", 0..6),
        ) {
            let key = SeriesKey::new(&metric, tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
            let again: SeriesKey = key.as_str().parse().unwrap();
            prop_assert_eq!(&again, &key);
            prop_assert_eq!(again.tags().count(), tags.len());
        }
    }
}

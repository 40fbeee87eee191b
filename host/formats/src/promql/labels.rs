//! Prometheus label sets, and how they map to timeshard's series keys and back.
//!
//! A label set's `__name__` is the series key's metric and its other labels are the tags; names
//! and values are percent-encoded as [`crate::names`] says, so `le="+Inf"` is the tag `le=%2BInf`
//! and every label set that a key can hold round-trips. Empty label values are absent labels,
//! as in Prometheus.

use std::fmt;

use timeshard_proto::SeriesKey;

use crate::names::{self, NameError};

/// The label holding the metric name.
pub const METRIC_NAME: &str = "__name__";

/// A label set, sorted by name, without empty values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    pub fn new() -> Labels {
        Labels(Vec::new())
    }

    /// A label set from pairs in any order; empty values are dropped, a repeated name keeps its
    /// last value.
    pub fn from_pairs<N: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (N, V)>) -> Labels {
        let mut v: Vec<(String, String)> =
            pairs.into_iter().map(|(n, v)| (n.into(), v.into())).filter(|(_, v)| !v.is_empty()).collect();
        v.reverse();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
        Labels(v)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok().map(|i| self.0[i].1.as_str())
    }

    /// The value of `name`, or "" when absent (how Prometheus' matchers see it).
    pub fn value(&self, name: &str) -> &str {
        self.get(name).unwrap_or("")
    }

    pub fn name(&self) -> Option<&str> {
        self.get(METRIC_NAME)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `name` to `value`; an empty value removes it.
    pub fn set(&mut self, name: &str, value: &str) {
        match self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) if value.is_empty() => {
                self.0.remove(i);
            }
            Ok(i) => self.0[i].1 = value.to_string(),
            Err(_) if value.is_empty() => {}
            Err(i) => self.0.insert(i, (name.to_string(), value.to_string())),
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.set(name, "");
    }

    pub fn without_name(&self) -> Labels {
        let mut l = self.clone();
        l.remove(METRIC_NAME);
        l
    }

    /// Only the labels named in `names`.
    pub fn keep(&self, names: &[String]) -> Labels {
        Labels(self.0.iter().filter(|(n, _)| names.iter().any(|k| k == n)).cloned().collect())
    }

    /// All labels but those named in `names`.
    pub fn drop(&self, names: &[String]) -> Labels {
        Labels(self.0.iter().filter(|(n, _)| !names.iter().any(|k| k == n)).cloned().collect())
    }

    /// The labels of a series key: `__name__` is the decoded metric, the tags decoded.
    pub fn from_key(key: &SeriesKey) -> Labels {
        let mut v = Vec::with_capacity(key.tags().count() + 1);
        v.push((METRIC_NAME.to_string(), names::decode(key.metric()).into_owned()));
        v.extend(names::decoded_tags(key));
        Labels::from_pairs(v)
    }

    /// The series key of this label set (it must have a `__name__`).
    pub fn to_key(&self) -> Result<SeriesKey, NameError> {
        names::prometheus_key(self.iter())
    }
}

impl fmt::Display for Labels {
    /// Prometheus' notation: `name{a="b", c="d"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.name() {
            f.write_str(n)?;
        }
        f.write_str("{")?;
        let mut first = true;
        for (n, v) in self.iter().filter(|(n, _)| *n != METRIC_NAME) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n}={v:?}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn keys_map_to_labels_and_back() {
        let l = Labels::from_pairs([("__name__", "http_requests_total"), ("le", "+Inf"), ("job", "node"), ("e", "")]);
        let key = l.to_key().unwrap();
        assert_eq!(key.as_str(), "http_requests_total{job=node,le=%2BInf}");
        assert_eq!(Labels::from_key(&key), l);
        assert_eq!(l.to_string(), r#"http_requests_total{job="node", le="+Inf"}"#);
        let influx = crate::names::line_protocol_key("cpu", "usage idle", [("host", "edge 7")]).unwrap();
        let l = Labels::from_key(&influx);
        assert_eq!(l.name(), Some("cpu.usage idle"));
        assert_eq!(l.get("host"), Some("edge 7"));
        assert_eq!(l.to_key().unwrap(), influx);
    }

    #[test]
    fn set_keeps_order_and_drops_empty() {
        let mut l = Labels::from_pairs([("b", "2"), ("a", "1")]);
        l.set("c", "3");
        l.set("a", "");
        l.set("0", "z");
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![("0", "z"), ("b", "2"), ("c", "3")]);
        assert_eq!(Labels::from_pairs([("a", "1"), ("a", "2")]).get("a"), Some("2"));
    }

    proptest! {
        #[test]
        fn label_sets_round_trip_through_series_keys(
            name in "[a-zA-Z_:][a-zA-Z0-9_:. -]{0,20}",
            tags in proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "\\PC{1,16}", 0..5),
        ) {
            let l = Labels::from_pairs(tags.into_iter().chain([(METRIC_NAME.to_string(), name)]));
            if let Ok(key) = l.to_key() {
                prop_assert_eq!(Labels::from_key(&key), l);
            }
        }
    }
}

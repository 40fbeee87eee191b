//! Which devices something applies to: a [`Selector`] of labels and a geohash prefix, and the
//! label syntax (`k=v,k2=v2`). A leaf: node configurations, HTTP tokens, policy bindings and
//! rollouts all select devices by it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::geo::{Location, is_geohash_prefix};

/// Which devices a node configuration applies to: all of `labels` and, when set, a geohash
/// prefix of the device's location. An empty selector matches every device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geohash: Option<String>,
}

impl Selector {
    /// Whether a device with `labels` at `location` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>, location: Option<&Location>) -> bool {
        let labels_match = self.labels.iter().all(|(k, v)| labels.get(k) == Some(v));
        let place_match = match &self.geohash {
            None => true,
            Some(prefix) => location.is_some_and(|l| l.geohash.starts_with(prefix.as_str())),
        };
        labels_match && place_match
    }

    /// Checks labels and geohash.
    pub fn validate(&self) -> Result<(), String> {
        validate_labels(&self.labels)?;
        if let Some(g) = &self.geohash
            && !is_geohash_prefix(g)
        {
            return Err(format!(
                "geohash prefix {g:?} must be 1 to 9 geohash characters (0-9 and b-z without a, i, l, o)"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if let Some(g) = &self.geohash {
            parts.push(format!("geohash={g}*"));
        }
        if parts.is_empty() { f.write_str("every device") } else { f.write_str(&parts.join(",")) }
    }
}

/// Parses `k=v,k2=v2` (the CLI's label syntax).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| format!("label {part:?} must be written key=value"))?;
        if labels.insert(k.trim().to_string(), v.trim().to_string()).is_some() {
            return Err(format!("label {k:?} is given twice"));
        }
    }
    validate_labels(&labels)?;
    Ok(labels)
}

/// Label keys and values: 1 to 63 letters, digits, `-`, `_`, `.`; at most 32 labels.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > 32 {
        return Err("at most 32 labels".into());
    }
    let ok = |s: &str| {
        !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    for (k, v) in labels {
        if !ok(k) || !ok(v) {
            return Err(format!("label {k}={v}: keys and values must be 1 to 63 letters, digits, '-', '_' or '.'"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> BTreeMap<String, String> {
        parse_labels(text).unwrap()
    }

    #[test]
    fn selectors_match_labels_and_geohash_prefix() {
        let atl: Location = "33.75,-84.39".parse().unwrap();
        let sel = Selector { labels: labels("site=atl"), geohash: Some("dn5".into()) };
        assert!(sel.matches(&labels("site=atl,rack=3"), Some(&atl)));
        assert!(!sel.matches(&labels("site=atl"), None));
        assert!(!sel.matches(&labels("site=sfo"), Some(&atl)));
        assert!(Selector::default().matches(&BTreeMap::new(), None));
        assert!(Selector { geohash: Some("dna".into()), ..Default::default() }.validate().is_err());
        assert!(parse_labels("site").unwrap_err().contains("key=value"));
        assert!(parse_labels("a=1,a=2").unwrap_err().contains("twice"));
    }
}

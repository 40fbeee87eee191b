//! Label matchers (`=`, `!=`, `=~`, `!~`), shared by PromQL selectors, the series and label
//! endpoints, and remote read.
//!
//! Regular expressions are anchored as Prometheus anchors them (`^(?:re)$`) and compiled by the
//! `regex` crate (linear time, like Go's RE2) under a compiled-size limit, so a hostile pattern
//! is an error, never a blow-up.

use std::fmt;

use regex::{Regex, RegexBuilder};

use super::labels::{Labels, METRIC_NAME};

/// The comparison a matcher makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

impl MatchOp {
    pub fn symbol(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        }
    }
}

/// A regular expression that does not compile, or compiles too large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid regular expression {pattern:?}: {reason}")]
pub struct RegexError {
    pub pattern: String,
    pub reason: String,
}

/// Compiles `pattern` anchored at both ends, within `size_limit` bytes of compiled program.
pub fn anchored_regex(pattern: &str, size_limit: usize) -> Result<Regex, RegexError> {
    RegexBuilder::new(&format!("^(?:{pattern})$")).size_limit(size_limit).dfa_size_limit(size_limit).build().map_err(
        |e| RegexError {
            pattern: pattern.to_string(),
            reason: match e {
                regex::Error::CompiledTooBig(n) => format!("it compiles to more than the limit of {n} bytes"),
                other => other.to_string().lines().last().unwrap_or("syntax error").trim().to_string(),
            },
        },
    )
}

/// One label matcher.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<Regex>,
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Matcher) -> bool {
        self.name == other.name && self.op == other.op && self.value == other.value
    }
}

impl Matcher {
    /// A matcher; a regular expression is compiled within `regex_size_limit` bytes.
    pub fn new(name: &str, op: MatchOp, value: &str, regex_size_limit: usize) -> Result<Matcher, RegexError> {
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => Some(anchored_regex(value, regex_size_limit)?),
            MatchOp::Equal | MatchOp::NotEqual => None,
        };
        Ok(Matcher { name: name.to_string(), op, value: value.to_string(), regex })
    }

    /// `__name__="name"`.
    pub fn metric(name: &str) -> Matcher {
        Matcher { name: METRIC_NAME.to_string(), op: MatchOp::Equal, value: name.to_string(), regex: None }
    }

    /// Whether a label value (empty when the label is absent) matches.
    pub fn matches(&self, value: &str) -> bool {
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => value == self.value,
            (MatchOp::NotEqual, _) => value != self.value,
            (MatchOp::Regex, Some(r)) => r.is_match(value),
            (MatchOp::NotRegex, Some(r)) => !r.is_match(value),
            (_, None) => false,
        }
    }

    /// The exact values this matcher can accept, when it names them (`=` or an alternation of
    /// literals such as `=~"a|b"`): lets a source look them up instead of scanning.
    pub fn set_values(&self) -> Option<Vec<String>> {
        match self.op {
            MatchOp::Equal => Some(vec![self.value.clone()]),
            MatchOp::Regex => {
                let literal =
                    |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':' | '/'));
                let parts: Vec<&str> = self.value.split('|').collect();
                parts.iter().all(|p| literal(p)).then(|| parts.iter().map(|p| p.to_string()).collect())
            }
            _ => None,
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{:?}", self.name, self.op.symbol(), self.value)
    }
}

/// Whether a label set satisfies every matcher.
pub fn matches_all(matchers: &[Matcher], labels: &Labels) -> bool {
    matchers.iter().all(|m| m.matches(labels.value(&m.name)))
}

/// The metric name the matchers require, if one `__name__=` matcher fixes it.
pub fn metric_name(matchers: &[Matcher]) -> Option<&str> {
    matchers.iter().find(|m| m.name == METRIC_NAME && m.op == MatchOp::Equal).map(|m| m.value.as_str())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LIMIT: usize = 1 << 20;

    #[test]
    fn regexes_are_anchored_like_prometheus() {
        let m = Matcher::new("job", MatchOp::Regex, "api|web", LIMIT).unwrap();
        assert!(m.matches("api"));
        assert!(m.matches("web"));
        assert!(!m.matches("api2"), "anchored at the end");
        assert!(!m.matches("xweb"), "anchored at the start");
        let m = Matcher::new("job", MatchOp::NotRegex, "a.*", LIMIT).unwrap();
        assert!(!m.matches("abc"));
        assert!(m.matches("ba"));
        assert!(m.matches(""), "an absent label is the empty value");
        assert!(Matcher::new("x", MatchOp::Regex, "", LIMIT).unwrap().matches(""));
        let l = Labels::from_pairs([("__name__", "up"), ("job", "api")]);
        let ms = [Matcher::metric("up"), Matcher::new("job", MatchOp::NotEqual, "web", LIMIT).unwrap()];
        assert!(matches_all(&ms, &l));
        assert_eq!(metric_name(&ms), Some("up"));
        assert_eq!(
            Matcher::new("x", MatchOp::Regex, "a|b-c", LIMIT).unwrap().set_values(),
            Some(vec!["a".to_string(), "b-c".to_string()])
        );
        assert_eq!(Matcher::new("x", MatchOp::Regex, "a.*", LIMIT).unwrap().set_values(), None);
    }

    #[test]
    fn bad_and_huge_regexes_are_errors() {
        let e = Matcher::new("x", MatchOp::Regex, "(", LIMIT).unwrap_err();
        assert!(e.to_string().contains("invalid regular expression \"(\""), "{e}");
        let e = Matcher::new("x", MatchOp::Regex, "(a{1000}){1000}", LIMIT).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
    }

    proptest! {
        #[test]
        fn equality_and_its_regex_agree(v in "[a-z0-9_]{0,8}", probe in "[a-z0-9_]{0,8}") {
            let eq = Matcher::new("l", MatchOp::Equal, &v, LIMIT).unwrap();
            let re = Matcher::new("l", MatchOp::Regex, &v, LIMIT).unwrap();
            let ne = Matcher::new("l", MatchOp::NotRegex, &v, LIMIT).unwrap();
            prop_assert_eq!(eq.matches(&probe), re.matches(&probe));
            prop_assert_eq!(re.matches(&probe), !ne.matches(&probe));
        }
    }
}

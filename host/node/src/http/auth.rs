//! Who may use the HTTP side: bearer tokens from the configuration, plus tokens issued from
//! elsewhere (the control plane) through [`Tokens::set_issued`]. Clients present one as
//! `Authorization: Bearer <token>`, as InfluxDB 2.x's `Token <token>`, or as the password of
//! basic auth or the `p` query parameter (InfluxDB 1.x clients and Telegraf).

use std::sync::RwLock;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

use super::error::ApiError;

/// The tokens a node accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    configured: Vec<String>,
    issued: RwLock<Vec<String>>,
}

/// Compares without stopping at the first difference, so timing does not reveal a prefix.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        acc = acc << 6 | u32::from(value(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The token a request carries, if any.
fn presented(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(h) = headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok()) {
        let (scheme, rest) = h.trim().split_once(' ').unwrap_or((h, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token") {
            return Some(rest.to_string());
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded = String::from_utf8(base64_decode(rest)?).ok()?;
            return decoded.split_once(':').map(|(_, password)| password.to_string());
        }
        return None;
    }
    let query = query?;
    query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == "p").map(|(_, v)| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Tokens {
    pub fn new(configured: Vec<String>) -> Tokens {
        Tokens { configured, issued: RwLock::new(Vec::new()) }
    }

    /// Replaces the tokens issued from elsewhere (the control plane's hook); the configured
    /// ones stay.
    pub fn set_issued(&self, tokens: Vec<String>) {
        *self.issued.write().unwrap_or_else(|e| e.into_inner()) = tokens;
    }

    /// Whether requests need a token at all.
    pub fn required(&self) -> bool {
        !self.configured.is_empty() || !self.issued.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Checks a request's credentials.
    pub fn check(&self, headers: &HeaderMap, query: Option<&str>) -> Result<(), ApiError> {
        if !self.required() {
            return Ok(());
        }
        let Some(token) = presented(headers, query) else {
            return Err(ApiError::Unauthorized(
                "this node needs a token: send `Authorization: Bearer <token>` (or `Token <token>`, or the token as \
                 the password) with one of the tokens in its [http] tokens"
                    .into(),
            ));
        };
        let issued = self.issued.read().unwrap_or_else(|e| e.into_inner());
        if self.configured.iter().chain(issued.iter()).any(|t| same(t.as_bytes(), token.as_bytes())) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized("the token is not one this node accepts; check [http] tokens".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn every_way_of_presenting_a_token() {
        let t = Tokens::new(vec!["0123456789abcdef".into()]);
        assert!(t.check(&headers("Bearer 0123456789abcdef"), None).is_ok());
        assert!(t.check(&headers("Token 0123456789abcdef"), None).is_ok());
        // user:0123456789abcdef
        assert!(t.check(&headers("Basic dXNlcjowMTIzNDU2Nzg5YWJjZGVm"), None).is_ok());
        assert!(t.check(&HeaderMap::new(), Some("db=x&p=0123456789abcdef")).is_ok());
        let wrong = t.check(&headers("Bearer 0123456789abcdeX"), None).unwrap_err();
        assert!(wrong.to_string().contains("not one this node accepts"), "{wrong}");
        let none = t.check(&HeaderMap::new(), Some("db=x")).unwrap_err();
        assert!(none.to_string().contains("needs a token"), "{none}");
    }

    #[test]
    fn issued_tokens_are_accepted_beside_configured_ones() {
        let t = Tokens::default();
        assert!(!t.required());
        assert!(t.check(&HeaderMap::new(), None).is_ok());
        t.set_issued(vec!["issued-by-the-control-plane".into()]);
        assert!(t.required());
        assert!(t.check(&headers("Bearer issued-by-the-control-plane"), None).is_ok());
        assert!(t.check(&HeaderMap::new(), None).is_err());
    }
}

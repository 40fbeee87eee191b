//! Who may use the HTTP side: bearer tokens from the configuration, plus tokens the control
//! plane issues (`timeshard-control http-token create`), which arrive with the desired state as
//! an id and the SHA-256 of the secret ([`Tokens::set_issued`]). Clients present one as
//! `Authorization: Bearer <token>`, as InfluxDB 2.x's `Token <token>`, or as the password of
//! basic auth; in the `p` query parameter (old InfluxDB 1.x clients) only where
//! `[http] tokens_in_urls` allows it, since URLs end up in logs.

use std::sync::RwLock;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use timeshard_control_api::{HttpTokenGrant, Token, TokenKind};

use super::error::ApiError;

/// The tokens a node accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    /// Refuse requests without a token even while no token exists.
    always: bool,
    /// Take a token from the URL's `p` parameter.
    in_urls: bool,
    configured: Vec<String>,
    issued: RwLock<Vec<HttpTokenGrant>>,
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

/// Where a request's token came from.
enum Presented {
    Header(String),
    Url(String),
}

/// The token a request carries, if any.
fn presented(headers: &HeaderMap, query: Option<&str>) -> Option<Presented> {
    header_token(headers).map(Presented::Header).or_else(|| {
        let query = query?;
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "p")
            .map(|(_, v)| Presented::Url(percent_decode(v)))
    })
}

fn header_token(headers: &HeaderMap) -> Option<String> {
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
    None
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
    /// `always`: a token is needed even while none is configured or issued (an enrolled node
    /// before the control plane issues one); `in_urls`: a token may come in the URL.
    pub fn new(configured: Vec<String>, always: bool, in_urls: bool) -> Tokens {
        Tokens { always, in_urls, configured, issued: RwLock::new(Vec::new()) }
    }

    /// Replaces the tokens the control plane issued (each applied desired state); the
    /// configured ones stay.
    pub fn set_issued(&self, tokens: Vec<HttpTokenGrant>) {
        *self.issued.write().unwrap_or_else(|e| e.into_inner()) = tokens;
    }

    /// Whether requests need a token at all.
    pub fn required(&self) -> bool {
        self.always || !self.configured.is_empty() || !self.issued.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Checks a request's credentials.
    pub fn check(&self, headers: &HeaderMap, query: Option<&str>) -> Result<(), ApiError> {
        if !self.required() {
            return Ok(());
        }
        let token = match presented(headers, query) {
            Some(Presented::Header(token)) => token,
            Some(Presented::Url(token)) if self.in_urls => token,
            Some(Presented::Url(_)) => {
                return Err(ApiError::Unauthorized(
                    "a token in the URL (?p=) is refused: URLs end up in logs and histories. Send it as \
                     `Authorization: Bearer <token>` (or as the password of basic auth), or set [http] \
                     tokens_in_urls = true for a legacy client that cannot"
                        .into(),
                ));
            }
            None => {
                return Err(ApiError::Unauthorized(
                    "this node needs a token: send `Authorization: Bearer <token>` (or `Token <token>`, or the token \
                     as the password) with one of the tokens in its [http] tokens (made in <data_dir>/http.token when \
                     none is configured) or one the control plane issued"
                        .into(),
                ));
            }
        };
        if self.configured.iter().any(|t| same(t.as_bytes(), token.as_bytes())) {
            return Ok(());
        }
        if let Ok(presented) = Token::parse(&token, TokenKind::Http) {
            let issued = self.issued.read().unwrap_or_else(|e| e.into_inner());
            let hash = presented.secret_hash();
            if let Some(grant) =
                issued.iter().find(|g| g.id == presented.id && same(g.secret_hash.as_bytes(), hash.as_bytes()))
            {
                return match grant.expires_at_ms {
                    Some(at) if at <= now_ms() => Err(ApiError::Unauthorized(format!(
                        "HTTP token {} ({}) has expired; create another with `timeshard-control http-token create`",
                        grant.id, grant.name
                    ))),
                    _ => Ok(()),
                };
            }
        }
        Err(ApiError::Unauthorized(
            "the token is not one this node accepts; check [http] tokens, or `timeshard-control http-token list` \
             for the tokens the control plane issued (a revoked one stops working once the node applies the change)"
                .into(),
        ))
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
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
        let t = Tokens::new(vec!["0123456789abcdef".into()], true, true);
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
    fn tokens_in_urls_are_refused_unless_allowed() {
        let t = Tokens::new(vec!["0123456789abcdef".into()], true, false);
        let e = t.check(&HeaderMap::new(), Some("db=x&p=0123456789abcdef")).unwrap_err();
        assert!(e.to_string().contains("tokens_in_urls"), "{e}");
        // A header wins over the URL.
        assert!(t.check(&headers("Bearer 0123456789abcdef"), Some("p=whatever")).is_ok());
    }

    #[test]
    fn issued_tokens_are_checked_by_hash_and_expiry() {
        let fleet = timeshard_control_api::Fingerprint([7; 32]);
        let token = Token::generate(TokenKind::Http, fleet);
        let grant = |expires_at_ms| HttpTokenGrant {
            id: token.id.clone(),
            name: "telegraf".into(),
            secret_hash: token.secret_hash(),
            expires_at_ms,
        };
        let t = Tokens::new(vec!["configured".into()], true, false);
        let bearer = format!("Bearer {token}");
        assert!(t.check(&headers(&bearer), None).is_err());
        t.set_issued(vec![grant(None)]);
        assert!(t.check(&headers(&bearer), None).is_ok());
        assert!(t.check(&headers("Bearer configured"), None).is_ok());
        // Same id, another secret: refused.
        let mut forged = Token::generate(TokenKind::Http, fleet);
        forged.id = token.id.clone();
        assert!(t.check(&headers(&format!("Bearer {forged}")), None).is_err());
        // An API token of the control plane is not an HTTP token.
        let api = Token::generate(TokenKind::Api, fleet);
        assert!(t.check(&headers(&format!("Bearer {api}")), None).is_err());
        t.set_issued(vec![grant(Some(now_ms() - 1))]);
        let expired = t.check(&headers(&bearer), None).unwrap_err();
        assert!(expired.to_string().contains("expired"), "{expired}");
        t.set_issued(vec![grant(Some(now_ms() + 60_000))]);
        assert!(t.check(&headers(&bearer), None).is_ok());
        // Revoked: the next desired state no longer lists it.
        t.set_issued(vec![]);
        assert!(t.check(&headers(&bearer), None).is_err());
    }

    #[test]
    fn issued_tokens_alone_make_tokens_required() {
        let t = Tokens::default();
        assert!(!t.required());
        assert!(t.check(&HeaderMap::new(), None).is_ok());
        let token = Token::generate(TokenKind::Http, timeshard_control_api::Fingerprint([1; 32]));
        t.set_issued(vec![HttpTokenGrant {
            id: token.id.clone(),
            name: "n".into(),
            secret_hash: token.secret_hash(),
            expires_at_ms: None,
        }]);
        assert!(t.required());
        assert!(t.check(&HeaderMap::new(), None).is_err());
        // Off loopback with nothing issued yet: every request is refused.
        let off_loopback = Tokens::new(vec![], true, false);
        assert!(off_loopback.check(&HeaderMap::new(), None).is_err());
        assert!(off_loopback.check(&headers("Bearer anything-at-all-here"), None).is_err());
    }
}

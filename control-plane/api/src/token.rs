//! Bearer secrets: one-time enrollment tokens for devices and API tokens for people and scripts.
//!
//! Both carry the fleet's CA fingerprint (SHA-256 of the CA certificate's SubjectPublicKeyInfo,
//! as kubeadm's discovery hash), so whoever holds a token can check that the server it talks to
//! is this fleet's control plane before sending the secret:
//!
//! ```text
//! tsc1.<64 hex: CA fingerprint>.<16 hex: token id>.<64 hex: secret>   enrollment token
//! tsa1.<64 hex: CA fingerprint>.<16 hex: token id>.<64 hex: secret>   API token
//! tsh1.<64 hex: CA fingerprint>.<16 hex: token id>.<64 hex: secret>   HTTP token (nodes' HTTP side)
//! ```
//!
//! The control plane stores only the id and [`Token::secret_hash`]; nodes receive the id and
//! hash of HTTP tokens in their desired state, never the secret.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// SHA-256 of a CA certificate's SubjectPublicKeyInfo (DER): names a fleet.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of the CA certificate `der`.
    pub fn of_certificate(der: &[u8]) -> Result<Fingerprint, TokenError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| TokenError::Malformed { reason: format!("the CA certificate does not parse: {e}") })?;
        Ok(Fingerprint::of_spki(cert.public_key().raw))
    }

    /// The fingerprint of a SubjectPublicKeyInfo (DER).
    pub fn of_spki(spki_der: &[u8]) -> Fingerprint {
        Fingerprint(sha256(spki_der))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = TokenError;
    fn from_str(s: &str) -> Result<Fingerprint, TokenError> {
        let bytes = unhex(s).filter(|b| b.len() == 32).ok_or_else(|| TokenError::Malformed {
            reason: format!("fleet fingerprint {s:?} is not 64 hexadecimal digits"),
        })?;
        let mut out = [0u8; 32];
        out.copy_from_slice(&bytes);
        Ok(Fingerprint(out))
    }
}

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// One-time: lets one device enroll (`tsc1`).
    Enrollment,
    /// Lets a person or script use the API with a role (`tsa1`).
    Api,
    /// Lets a client use the HTTP side of the nodes it is issued for (`tsh1`).
    Http,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Enrollment => "tsc1",
            TokenKind::Api => "tsa1",
            TokenKind::Http => "tsh1",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            TokenKind::Enrollment => "an enrollment token (tsc1...)",
            TokenKind::Api => "an API token (tsa1...)",
            TokenKind::Http => "an HTTP token (tsh1...)",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            TokenKind::Enrollment => "create one with `timeshard-control token create`",
            TokenKind::Api => {
                "the first one is printed by `timeshard-control serve --init`; more come from `timeshard-control api-token create`"
            }
            TokenKind::Http => "create one with `timeshard-control http-token create`",
        }
    }
}

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A token as text could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the `<prefix>.<fingerprint>.<id>.<secret>` shape.
    #[error("not a valid timeshard token: {reason}")]
    Malformed { reason: String },
    /// A well-formed token of the other kind.
    #[error("this is {found}, but {expected} is needed here; {hint}")]
    WrongKind { expected: TokenKind, found: TokenKind, hint: &'static str },
}

const ID_HEX: usize = 16;
const SECRET_HEX: usize = 64;

/// A parsed token. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    /// The fleet whose control plane accepts it.
    pub fleet: Fingerprint,
    /// Public id (16 hex digits): names the token in lists and the audit log.
    pub id: String,
    secret: String,
}

impl Token {
    /// A fresh random token for `fleet`.
    pub fn generate(kind: TokenKind, fleet: Fingerprint) -> Token {
        Token { kind, fleet, id: random_hex(ID_HEX / 2), secret: random_hex(SECRET_HEX / 2) }
    }

    /// Parses `text`, which must be a token of `kind`.
    pub fn parse(text: &str, kind: TokenKind) -> Result<Token, TokenError> {
        let text = text.trim();
        let parts: Vec<&str> = text.split('.').collect();
        let found = match parts.first() {
            Some(&"tsc1") => TokenKind::Enrollment,
            Some(&"tsa1") => TokenKind::Api,
            Some(&"tsh1") => TokenKind::Http,
            _ => {
                return Err(TokenError::Malformed {
                    reason: format!("expected {} ({}); {}", kind.describe(), shape(kind), kind.hint()),
                });
            }
        };
        if found != kind {
            return Err(TokenError::WrongKind { expected: kind, found, hint: kind.hint() });
        }
        let [_, fleet, id, secret] = parts[..] else {
            return Err(TokenError::Malformed {
                reason: format!("expected four parts separated by dots: {}", shape(kind)),
            });
        };
        let fleet: Fingerprint = fleet.parse()?;
        if id.len() != ID_HEX || unhex(id).is_none() {
            return Err(TokenError::Malformed { reason: format!("token id {id:?} is not {ID_HEX} hex digits") });
        }
        if secret.len() != SECRET_HEX || unhex(secret).is_none() {
            return Err(TokenError::Malformed {
                reason: format!("the secret part is not {SECRET_HEX} hex digits (was the token cut short?)"),
            });
        }
        Ok(Token { kind, fleet, id: id.to_ascii_lowercase(), secret: secret.to_ascii_lowercase() })
    }

    /// What the control plane stores instead of the secret: SHA-256 of it, hex.
    pub fn secret_hash(&self) -> String {
        hex(&sha256(self.secret.as_bytes()))
    }
}

fn shape(kind: TokenKind) -> String {
    format!("{}.<64 hex>.<16 hex>.<64 hex>", kind.prefix())
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}.{}", self.kind.prefix(), self.fleet, self.id, self.secret)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token").field("kind", &self.kind).field("fleet", &self.fleet).field("id", &self.id).finish()
    }
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = Sha256::digest(data);
    let mut out = [0u8; 32];
    out.copy_from_slice(&d);
    out
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Bytes of hex text, or `None` when it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

/// `bytes` random bytes from the OS, as hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the operating system's random number generator failed");
    hex(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> Fingerprint {
        Fingerprint(sha256(b"ca"))
    }

    #[test]
    fn tokens_round_trip_and_hide_their_secret() {
        let t = Token::generate(TokenKind::Enrollment, fleet());
        let text = t.to_string();
        assert!(text.starts_with("tsc1."));
        assert_eq!(Token::parse(&text, TokenKind::Enrollment).unwrap(), t);
        assert!(!format!("{t:?}").contains(&t.secret));
        assert_eq!(t.secret_hash().len(), 64);
        assert_ne!(Token::generate(TokenKind::Enrollment, fleet()).secret_hash(), t.secret_hash());
    }

    #[test]
    fn bad_tokens_are_explained() {
        let api = Token::generate(TokenKind::Api, fleet()).to_string();
        let err = Token::parse(&api, TokenKind::Enrollment).unwrap_err();
        assert!(matches!(err, TokenError::WrongKind { .. }), "{err}");
        assert!(err.to_string().contains("token create"), "{err}");
        let enroll = Token::generate(TokenKind::Enrollment, fleet()).to_string();
        let cut = &enroll[..enroll.len() - 3];
        assert!(Token::parse(cut, TokenKind::Enrollment).unwrap_err().to_string().contains("cut short"));
        assert!(Token::parse("hello", TokenKind::Enrollment).unwrap_err().to_string().contains("tsc1.<64 hex>"));
        let bad_fleet = enroll.replacen(&fleet().to_string()[..4], "zzzz", 1);
        assert!(Token::parse(&bad_fleet, TokenKind::Enrollment).unwrap_err().to_string().contains("fingerprint"));
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 0xab, 0xff])).unwrap(), vec![0, 1, 0xab, 0xff]);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}

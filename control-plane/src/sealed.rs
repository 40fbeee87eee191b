//! Keys at rest: the fleet CA's private key and the policy signing key are stored sealed
//! (AES-256-GCM, ring) under a key-encryption key the operator holds apart from the database
//! (a file, or an environment variable). A dump of the database alone mints no certificate and
//! signs no module. Each sealed value is bound to what it is (the associated data), so one
//! cannot be swapped for the other.
//!
//! The key-encryption key is 32 random bytes, written as 64 hex digits.

use std::fmt;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use crate::error::{Error, Result};

/// What a sealed value starts with.
const PREFIX: &str = "sealed-v1:";

/// The key-encryption key.
pub struct Kek(LessSafeKey);

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Kek(..)")
    }
}

/// Whether `stored` is a sealed value (rather than a key stored in the clear by an older
/// version, which is sealed on the next start).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

impl Kek {
    /// A new random key, as 64 hex digits.
    pub fn generate_hex() -> Result<String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|e| Error::Internal(format!("no randomness for the key-encryption key: {e}")))?;
        Ok(timeshard_control_api::token::hex(&key))
    }

    /// The key written as 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Kek> {
        let bytes = timeshard_control_api::token::unhex(text.trim())
            .filter(|b| b.len() == 32)
            .ok_or_else(|| Error::BadRequest("a key-encryption key is 64 hex digits (32 bytes)".into()))?;
        let key =
            UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| Error::Internal("AES-256-GCM refused the key".into()))?;
        Ok(Kek(LessSafeKey::new(key)))
    }

    /// `plaintext` sealed as `what` (e.g. "fleet CA key").
    pub fn seal(&self, plaintext: &str, what: &str) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| Error::Internal(format!("no randomness for a nonce: {e}")))?;
        let mut data = plaintext.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(what.as_bytes()), &mut data)
            .map_err(|_| Error::Internal(format!("cannot seal the {what}")))?;
        let mut out = nonce.to_vec();
        out.extend(data);
        Ok(format!("{PREFIX}{}", timeshard_control_api::token::hex(&out)))
    }

    /// The plaintext of `stored`, sealed as `what`.
    pub fn open(&self, stored: &str, what: &str) -> Result<String> {
        let wrong = || {
            Error::Internal(format!(
                "the key-encryption key does not open the stored {what}: start with the key this fleet's keys \
                 were sealed with (--key-encryption-key-file or TIMESHARD_CONTROL_KEK)"
            ))
        };
        let hex = stored.strip_prefix(PREFIX).ok_or_else(wrong)?;
        let bytes = timeshard_control_api::token::unhex(hex).filter(|b| b.len() > NONCE_LEN).ok_or_else(wrong)?;
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| wrong())?;
        let mut data = sealed.to_vec();
        let plain = self.0.open_in_place(nonce, Aad::from(what.as_bytes()), &mut data).map_err(|_| wrong())?;
        String::from_utf8(plain.to_vec()).map_err(|_| wrong())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_key_opens_only_with_its_kek_and_as_what_it_was_sealed() {
        let kek = Kek::from_hex(&Kek::generate_hex().unwrap()).unwrap();
        let sealed = kek.seal("-----BEGIN PRIVATE KEY-----", "fleet CA key").unwrap();
        assert!(is_sealed(&sealed) && !sealed.contains("PRIVATE KEY"));
        assert_eq!(kek.open(&sealed, "fleet CA key").unwrap(), "-----BEGIN PRIVATE KEY-----");
        assert!(kek.open(&sealed, "policy key").is_err(), "bound to what it is");
        let other = Kek::from_hex(&Kek::generate_hex().unwrap()).unwrap();
        let e = other.open(&sealed, "fleet CA key").unwrap_err().to_string();
        assert!(e.contains("does not open"), "{e}");
        assert!(Kek::from_hex("abcd").is_err());
        assert!(!is_sealed("-----BEGIN PRIVATE KEY-----"));
    }
}

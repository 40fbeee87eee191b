//! 160-bit identifiers and the XOR metric (Kademlia).
//!
//! Node ids and data keys share one id space. A node id is the SHA-1 of the node's public key
//! (see [`Id::of_public_key`]); data keys are time-factored (the `key` module).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

/// Number of bytes in an [`Id`].
pub const ID_BYTES: usize = 20;
/// Number of bits in an [`Id`]; also the number of k-buckets in a routing table.
pub const ID_BITS: usize = ID_BYTES * 8;

/// A 160-bit identifier of a node or a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Id(pub [u8; ID_BYTES]);

/// The XOR of two ids, compared as an unsigned big-endian number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Distance(pub [u8; ID_BYTES]);

impl Id {
    /// The id of the all-zero bit string.
    pub const ZERO: Id = Id([0; ID_BYTES]);

    /// SHA-1 of `bytes`: the whole 160 bits.
    pub fn sha1(bytes: &[u8]) -> Id {
        Id(Sha1::digest(bytes).into())
    }

    /// The id of a node: SHA-1 of its public key (DER `SubjectPublicKeyInfo`). Binding the id
    /// to the key means a node cannot choose where in the id space it sits.
    pub fn of_public_key(spki_der: &[u8]) -> Id {
        Id::sha1(spki_der)
    }

    /// XOR distance to `other`.
    pub fn distance(&self, other: &Id) -> Distance {
        let mut d = [0u8; ID_BYTES];
        for (i, b) in d.iter_mut().enumerate() {
            *b = self.0[i] ^ other.0[i];
        }
        Distance(d)
    }

    /// A uniformly random id.
    pub fn random<R: rand::Rng + ?Sized>(rng: &mut R) -> Id {
        let mut b = [0u8; ID_BYTES];
        rng.fill(&mut b[..]);
        Id(b)
    }

    /// A random id whose distance to `self` falls in bucket `bucket` (it shares exactly
    /// `ID_BITS - 1 - bucket` leading bits with `self`). Used to refresh a bucket.
    pub fn random_in_bucket<R: rand::Rng + ?Sized>(&self, bucket: usize, rng: &mut R) -> Id {
        assert!(bucket < ID_BITS, "bucket {bucket} out of range");
        let mut d = Id::random(rng).0;
        // The highest set bit of the distance is bit `bucket` (counting from the least
        // significant bit), so clear everything above it and set it.
        let top = ID_BITS - 1 - bucket; // index of that bit from the most significant end
        for (bit, byte) in (0..top).map(|i| (i % 8, i / 8)) {
            d[byte] &= !(0x80 >> bit);
        }
        d[top / 8] |= 0x80 >> (top % 8);
        let mut out = [0u8; ID_BYTES];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.0[i] ^ d[i];
        }
        Id(out)
    }

    /// Lowercase hex, 40 characters.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 hex digits, for logs.
    pub fn short(&self) -> String {
        self.to_hex()[..8].to_string()
    }
}

impl Distance {
    /// The index of the k-bucket this distance falls in: the position of its highest set bit
    /// (0 = the ids differ only in the last bit, 159 = they differ in the first). `None` for
    /// distance zero (the same id).
    pub fn bucket_index(&self) -> Option<usize> {
        let zeros = self.leading_zeros();
        (zeros < ID_BITS).then(|| ID_BITS - 1 - zeros)
    }

    /// Number of leading zero bits: the length of the common prefix of the two ids.
    pub fn leading_zeros(&self) -> usize {
        let mut n = 0;
        for b in self.0 {
            if b == 0 {
                n += 8;
            } else {
                n += b.leading_zeros() as usize;
                break;
            }
        }
        n
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({})", self.short())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// An id that is not 40 hex digits.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid id {input:?}: expected 40 hexadecimal digits")]
pub struct ParseIdError {
    input: String,
}

impl FromStr for Id {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseIdError { input: s.to_string() };
        if s.len() != ID_BYTES * 2 || !s.is_ascii() {
            return Err(err());
        }
        let mut out = [0u8; ID_BYTES];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(Id(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_id() -> impl Strategy<Value = Id> {
        any::<[u8; ID_BYTES]>().prop_map(Id)
    }

    #[test]
    fn sha1_matches_known_vector() {
        assert_eq!(Id::sha1(b"abc").to_hex(), "a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[test]
    fn parse_rejects_bad_hex() {
        assert!("zz".parse::<Id>().is_err());
        assert!("g".repeat(40).parse::<Id>().is_err());
        let id = Id::sha1(b"x");
        assert_eq!(id.to_hex().parse::<Id>().unwrap(), id);
    }

    proptest! {
        #[test]
        fn xor_is_a_metric(a in arb_id(), b in arb_id()) {
            prop_assert_eq!(a.distance(&b), b.distance(&a));
            prop_assert_eq!(a.distance(&a), Distance([0; ID_BYTES]));
            prop_assert_eq!(a.distance(&b) == Distance([0; ID_BYTES]), a == b);
        }

        #[test]
        fn random_in_bucket_lands_in_that_bucket(a in arb_id(), bucket in 0usize..ID_BITS, seed in any::<u64>()) {
            use rand::SeedableRng;
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let b = a.random_in_bucket(bucket, &mut rng);
            prop_assert_eq!(a.distance(&b).bucket_index(), Some(bucket));
        }
    }
}

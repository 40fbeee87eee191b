//! Sizes in bytes as configuration writes them: [`ByteSize`], shared by a node's config file
//! and the classes the control plane distributes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A size in bytes, written in TOML as a number of bytes or a string with a unit: `"256MB"`,
/// `"256 MiB"`, `"1GB"` (`KB`/`MB`/`GB` are powers of 1000, `KiB`/`MiB`/`GiB` of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, unit) = s.split_at(split);
        let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size like \"256MB\""))?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" | "k" => 1_000,
            "mb" | "m" => 1_000_000,
            "gb" | "g" => 1_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            other => return Err(format!("unknown unit {other:?} in {s:?}: use B, KB, MB, GB, KiB, MiB or GiB")),
        };
        n.checked_mul(scale).map(ByteSize).ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
            write!(f, "{}MiB", b >> 20)
        } else if b >= 1_000_000 && b.is_multiple_of(1_000_000) {
            write!(f, "{}MB", b / 1_000_000)
        } else {
            write!(f, "{b}B")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(ByteSize(b)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

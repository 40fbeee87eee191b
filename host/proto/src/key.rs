//! Time-factored keys (seed paper, section III).
//!
//! `id = H80(quantum id) ++ H80(series key)` (quanta-first, QFI) or
//! `H80(series key) ++ H80(quantum id)` (key-first, KFI), where H80 is the first 80 bits of
//! SHA-1. The quantum id is the quantum's start in nanoseconds, hashed as 8 big-endian bytes;
//! the series key is hashed as its canonical UTF-8 string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

use crate::id::{ID_BYTES, Id};
use crate::series::SeriesKey;
use crate::time::{MAX_QUANTUM_NS, Quantum, QuantumLen};

/// Which half of the id the time quantum occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// Quanta-first: a series' history spreads over the whole network.
    #[default]
    Qfi,
    /// Key-first: a series' history stays on the same few nodes.
    Kfi,
}

impl fmt::Display for KeyFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyFormat::Qfi => "qfi",
            KeyFormat::Kfi => "kfi",
        })
    }
}

/// A key format name other than `qfi` or `kfi`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown key format {0:?}: use qfi (quanta-first) or kfi (key-first)")]
pub struct ParseKeyFormatError(String);

impl FromStr for KeyFormat {
    type Err = ParseKeyFormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "qfi" => Ok(KeyFormat::Qfi),
            "kfi" => Ok(KeyFormat::Kfi),
            _ => Err(ParseKeyFormatError(s.to_string())),
        }
    }
}

const HALF: usize = ID_BYTES / 2;

/// The first 80 bits of SHA-1 of `bytes`.
pub fn h80(bytes: &[u8]) -> [u8; HALF] {
    let digest = Sha1::digest(bytes);
    let mut out = [0u8; HALF];
    out.copy_from_slice(&digest[..HALF]);
    out
}

/// H80 of a quantum's identifier.
pub fn quantum_hash(q: &Quantum) -> [u8; HALF] {
    h80(&q.start.to_be_bytes())
}

/// H80 of a series key.
pub fn series_hash(series: &SeriesKey) -> [u8; HALF] {
    h80(series.as_str().as_bytes())
}

/// The DHT id under which the points of `series` in quantum `q` are stored.
pub fn block_id(format: KeyFormat, series: &SeriesKey, q: &Quantum) -> Id {
    block_id_from_hashes(format, &series_hash(series), q)
}

/// [`block_id`] with the series hash computed once by the caller (a range read hashes the
/// series once and every quantum once).
pub fn block_id_from_hashes(format: KeyFormat, series_hash: &[u8; HALF], q: &Quantum) -> Id {
    let qh = quantum_hash(q);
    let (a, b) = match format {
        KeyFormat::Qfi => (&qh, series_hash),
        KeyFormat::Kfi => (series_hash, &qh),
    };
    let mut id = [0u8; ID_BYTES];
    id[..HALF].copy_from_slice(a);
    id[HALF..].copy_from_slice(b);
    Id(id)
}

/// Metrics starting with this are timeshard's own bookkeeping; clients may not write or read
/// them.
pub const RESERVED_METRIC_PREFIX: &str = "_timeshard.";

/// The internal series that indexes where `series` holds data: one point per span of quanta
/// holding data, at the span's start (the node decides the span). It lives with the series'
/// registration (at [`series_meta_id`]), so a read of a long range asks it first and then
/// touches only the spans that hold data.
pub fn quantum_index_series(series: &SeriesKey) -> SeriesKey {
    format!("{QUANTUM_INDEX_METRIC}{{of={}}}", Id::sha1(series.as_str().as_bytes()).to_hex())
        .parse()
        .expect("a valid key")
}

/// The metric of every quantum index series.
const QUANTUM_INDEX_METRIC: &str = "_timeshard.quanta";

/// The series hash ([`series_hash`]) of the series that `index` indexes, if `index` is a
/// quantum index series: its `of` tag is the SHA-1 of the base series, whose first 80 bits are
/// the series hash. So the index's placement follows from its key alone.
pub fn indexed_series_hash(index: &SeriesKey) -> Option<[u8; HALF]> {
    if index.metric() != QUANTUM_INDEX_METRIC {
        return None;
    }
    let hex = index.tag("of")?;
    let digits = hex.get(..2 * HALF)?;
    let mut out = [0u8; HALF];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The quantum of the index series' blocks: the longest allowed, so a year of index points
/// sits in one or two blocks.
pub fn index_quantum() -> QuantumLen {
    QuantumLen::new(MAX_QUANTUM_NS).expect("the longest quantum is valid")
}

/// The id of a series' metadata record (its registration in the series dictionary): key-first,
/// with a fixed second half, so it never collides with a block id of a real quantum.
pub fn series_meta_id(series: &SeriesKey) -> Id {
    series_meta_id_from_hash(&series_hash(series))
}

/// [`series_meta_id`] from the series hash.
pub fn series_meta_id_from_hash(series_hash: &[u8; HALF]) -> Id {
    let mut id = [0u8; ID_BYTES];
    id[..HALF].copy_from_slice(series_hash);
    id[HALF..].copy_from_slice(&h80(b"timeshard/series-meta"));
    Id(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{NANOS_PER_SEC, QuantumLen};

    #[test]
    fn formats_swap_halves() {
        let s: SeriesKey = "pmu.phase{bus=1,site=atl}".parse().unwrap();
        let q = QuantumLen::DEFAULT.quantum_of(1_700_000_003 * NANOS_PER_SEC);
        let qfi = block_id(KeyFormat::Qfi, &s, &q);
        let kfi = block_id(KeyFormat::Kfi, &s, &q);
        assert_eq!(qfi.0[..10], kfi.0[10..]);
        assert_eq!(qfi.0[10..], kfi.0[..10]);
        assert_eq!(qfi.0[..10], quantum_hash(&q));
        assert_eq!(kfi.0[..10], series_hash(&s));
    }

    #[test]
    fn kfi_keeps_a_series_prefix_across_quanta() {
        let s: SeriesKey = "m".parse().unwrap();
        let len = QuantumLen::DEFAULT;
        let a = block_id(KeyFormat::Kfi, &s, &len.quantum_of(0));
        let b = block_id(KeyFormat::Kfi, &s, &len.quantum_of(10 * NANOS_PER_SEC));
        assert_eq!(a.0[..10], b.0[..10]);
        assert_ne!(a, b);
    }

    #[test]
    fn an_index_series_names_the_hash_of_its_base_series() {
        let s: SeriesKey = "pmu.phase{bus=1,site=atl}".parse().unwrap();
        let index = quantum_index_series(&s);
        assert!(index.metric().starts_with(RESERVED_METRIC_PREFIX));
        assert_eq!(indexed_series_hash(&index), Some(series_hash(&s)));
        assert_eq!(series_meta_id_from_hash(&series_hash(&s)), series_meta_id(&s));
        assert_eq!(indexed_series_hash(&s), None);
        assert_eq!(indexed_series_hash(&"_timeshard.quanta{of=zz}".parse().unwrap()), None);
    }

    #[test]
    fn format_names_parse() {
        assert_eq!("QFI".parse::<KeyFormat>().unwrap(), KeyFormat::Qfi);
        assert_eq!("kfi".parse::<KeyFormat>().unwrap(), KeyFormat::Kfi);
        assert!("xfi".parse::<KeyFormat>().is_err());
    }
}

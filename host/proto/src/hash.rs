//! Stable 64-bit hashes: the same on every node and build, so replicas can compare what they
//! hash (digests of points, digest trees, placement ranks) without shipping the data.

/// SplitMix64's finalizer: a cheap, well-mixed 64-bit hash step.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of `bytes` (FNV-1a, then mixed).
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_across_builds() {
        // Digests travel between nodes of different builds: these values must never change.
        assert_eq!(mix(1), 0x5692_161D_100B_05E5);
        assert_eq!(hash_bytes(b"timeshard"), 0x851A_8A82_494A_1839);
        assert_eq!(hash_bytes(b""), mix(0xCBF2_9CE4_8422_2325));
    }
}

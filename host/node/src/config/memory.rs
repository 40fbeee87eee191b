//! `[memory]`: the one memory budget the node keeps within, as a size with a unit. How the
//! budget is split and enforced is the node's `budget` module.

use serde::{Deserialize, Serialize};

pub use timeshard_proto::size::ByteSize;

/// The `[memory]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Everything the node may hold in memory (default 256 MiB: half of a 512 MB device).
    pub budget: ByteSize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig { budget: ByteSize(256 << 20) }
    }
}

/// Least budget accepted: the process itself (code, runtime, TLS) takes about 10 MB.
pub const MIN_BUDGET: u64 = 4 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!("256MB".parse::<ByteSize>().unwrap(), ByteSize(256_000_000));
        assert_eq!("256 MiB".parse::<ByteSize>().unwrap(), ByteSize(256 << 20));
        assert_eq!("1GiB".parse::<ByteSize>().unwrap(), ByteSize(1 << 30));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert!("12 parsecs".parse::<ByteSize>().unwrap_err().contains("unit"));
        assert!("MB".parse::<ByteSize>().is_err());
        let cfg: MemoryConfig = toml::from_str("budget = 1048576").unwrap();
        assert_eq!(cfg.budget, ByteSize(1 << 20));
        let text = toml::to_string(&MemoryConfig::default()).unwrap();
        assert_eq!(toml::from_str::<MemoryConfig>(&text).unwrap(), MemoryConfig::default());
        assert!(text.contains("256MiB"), "{text}");
    }
}

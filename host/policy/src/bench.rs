//! The policy benchmark (placeholder while the host is written).

//! Compressed request bodies, decompressed within a size limit so a small body cannot expand
//! into gigabytes (gzip from Telegraf and the InfluxDB clients, snappy from Prometheus).

use std::io::Read;

/// A body that could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    #[error("the body is not valid gzip: {0}")]
    Gzip(String),
    #[error("the body is not valid snappy (block format): {0}")]
    Snappy(String),
    #[error("the body decompresses to more than {limit} bytes; send smaller batches")]
    TooLarge { limit: usize },
}

/// Decompresses a gzip body (one or several members) of at most `limit` bytes decompressed.
pub fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    let decoder = flate2::read::MultiGzDecoder::new(body);
    decoder.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| DecompressError::Gzip(e.to_string()))?;
    if out.len() > limit {
        return Err(DecompressError::TooLarge { limit });
    }
    Ok(out)
}

/// Decompresses a snappy block (Prometheus remote write) of at most `limit` bytes
/// decompressed; the length it declares is checked before anything is allocated.
pub fn unsnappy(body: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    if snappy_len(body)? > limit {
        return Err(DecompressError::TooLarge { limit });
    }
    snap::raw::Decoder::new().decompress_vec(body).map_err(|e| DecompressError::Snappy(e.to_string()))
}

/// The decompressed length a snappy block declares, read from its header without decompressing.
pub fn snappy_len(body: &[u8]) -> Result<usize, DecompressError> {
    snap::raw::decompress_len(body).map_err(|e| DecompressError::Snappy(e.to_string()))
}

/// Compresses with snappy (block format), as Prometheus sends remote-write bodies.
pub fn snappy(body: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(body).expect("snappy compresses any input that fits in memory")
}

/// Compresses with gzip.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body).expect("writing to a Vec cannot fail");
    encoder.finish().expect("writing to a Vec cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_limits() {
        let data = b"m v=1 1\n".repeat(1000);
        assert_eq!(gunzip(&gzip(&data), data.len()).unwrap(), data);
        assert_eq!(gunzip(&gzip(&data), data.len() - 1), Err(DecompressError::TooLarge { limit: data.len() - 1 }));
        assert_eq!(unsnappy(&snappy(&data), data.len()).unwrap(), data);
        assert_eq!(unsnappy(&snappy(&data), 10), Err(DecompressError::TooLarge { limit: 10 }));
        // Two gzip members, as some clients concatenate.
        let two = [gzip(b"a v=1 1\n"), gzip(b"b v=2 2\n")].concat();
        assert_eq!(gunzip(&two, 100).unwrap(), b"a v=1 1\nb v=2 2\n");
    }

    #[test]
    fn garbage_is_refused_with_the_format_named() {
        assert!(matches!(gunzip(b"not gzip at all", 100), Err(DecompressError::Gzip(_))));
        let mut truncated = gzip(&b"x".repeat(100));
        truncated.truncate(truncated.len() / 2);
        assert!(matches!(gunzip(&truncated, 1000), Err(DecompressError::Gzip(_))));
        assert!(matches!(unsnappy(b"\xff\xff\xff\xff\xff\xff", 100), Err(DecompressError::Snappy(_))));
        let err = unsnappy(b"\x05abc", 100).unwrap_err();
        assert!(err.to_string().contains("not valid snappy"), "{err}");
    }
}

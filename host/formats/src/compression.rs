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
    /// The caller's `admit` refused more output (its memory budget).
    #[error("decompressing the body would take more than the {decompressed} bytes allowed so far")]
    Refused { decompressed: usize },
}

/// Output is admitted, and grown, this much at a time by [`gunzip_within`].
pub const GUNZIP_STEP: usize = 1 << 20;

/// [`gunzip`], asking `admit(bytes)` before the output grows by each step of up to
/// [`GUNZIP_STEP`] bytes, so a caller can charge what decompression takes before it is
/// allocated; stops with [`DecompressError::Refused`] when `admit` says no.
pub fn gunzip_within(
    body: &[u8],
    limit: usize,
    mut admit: impl FnMut(usize) -> bool,
) -> Result<Vec<u8>, DecompressError> {
    let mut decoder = flate2::read::MultiGzDecoder::new(body).take(limit as u64 + 1);
    // Reserved whole and never regrown (a regrown buffer is copied, twice the memory for a
    // moment); its pages take memory only as they are written, step by admitted step.
    let mut out: Vec<u8> = Vec::with_capacity(limit.saturating_add(1));
    loop {
        let step = GUNZIP_STEP.min(limit + 1 - out.len());
        if !admit(step) {
            return Err(DecompressError::Refused { decompressed: out.len() });
        }
        let before = out.len();
        (&mut decoder).take(step as u64).read_to_end(&mut out).map_err(|e| DecompressError::Gzip(e.to_string()))?;
        if out.len() > limit {
            return Err(DecompressError::TooLarge { limit });
        }
        if out.len() - before < step {
            return Ok(out);
        }
    }
}

/// The decompressed length a gzip body's trailer declares (`ISIZE`: its last member's size
/// modulo 2^32), read without decompressing; `None` when the body is too short or not gzip.
/// A hint, never trusted as a bound: a member's true size is `ISIZE` plus a multiple of 2^32
/// and earlier members add to it, so the body holds at least that much, perhaps more. A
/// caller may refuse a body declaring more than its limit, and charge the declared size
/// before decompressing; what grows past it is charged by [`gunzip_within`]'s steps.
pub fn gzip_declared_len(body: &[u8]) -> Option<usize> {
    // A member is a 10-byte header, the deflate data and an 8-byte trailer (CRC-32, ISIZE).
    if body.len() < 18 || body[..2] != [0x1f, 0x8b] {
        return None;
    }
    let trailer: [u8; 4] = body[body.len() - 4..].try_into().ok()?;
    usize::try_from(u32::from_le_bytes(trailer)).ok()
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
    fn gunzip_asks_before_each_step_and_stops_when_refused() {
        let data = vec![b'x'; 3 * GUNZIP_STEP + 10];
        let mut asked = Vec::new();
        let out = gunzip_within(&gzip(&data), 4 * GUNZIP_STEP, |n| {
            asked.push(n);
            true
        })
        .unwrap();
        assert_eq!(out, data);
        assert_eq!(asked, vec![GUNZIP_STEP; 4]);
        let mut granted = 0;
        let refused = gunzip_within(&gzip(&data), 8 * GUNZIP_STEP, |n| {
            granted += n;
            granted <= 2 * GUNZIP_STEP
        });
        assert_eq!(refused, Err(DecompressError::Refused { decompressed: 2 * GUNZIP_STEP }));
        assert_eq!(
            gunzip_within(&gzip(&data), GUNZIP_STEP + 5, |_| true),
            Err(DecompressError::TooLarge { limit: GUNZIP_STEP + 5 })
        );
        assert_eq!(gunzip_within(&gzip(b""), 10, |_| true), Ok(Vec::new()));
    }

    #[test]
    fn a_gzip_trailer_declares_the_last_members_size() {
        let data = b"m v=1 1\n".repeat(1000);
        assert_eq!(gzip_declared_len(&gzip(&data)), Some(data.len()));
        assert_eq!(gzip_declared_len(&gzip(b"")), Some(0));
        // Two members: the last one's size, a lower bound of the whole.
        let two = [gzip(&data), gzip(b"b v=2 2\n")].concat();
        assert_eq!(gzip_declared_len(&two), Some(8));
        assert_eq!(gzip_declared_len(b"not gzip at all, but long enough"), None);
        assert_eq!(gzip_declared_len(&gzip(&data)[..17]), None);
    }

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

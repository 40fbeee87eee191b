//! Framing: a frame is a 4-byte big-endian length followed by that many bytes of
//! postcard-encoded message. Frames above the configured limit are refused before their body is
//! read.

use serde::{Serialize, de::DeserializeOwned};

/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 4;

/// Framing failures.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The announced or encoded length exceeds the limit.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: u64, limit: u32 },
    /// The bytes do not decode as the expected message.
    #[error("malformed message: {0}")]
    Malformed(#[from] postcard::Error),
}

/// Encodes `msg` as one frame (header and body).
pub fn encode<T: Serialize>(msg: &T, limit: u32) -> Result<Vec<u8>, FrameError> {
    let mut out = postcard::to_extend(msg, vec![0u8; HEADER_BYTES])?;
    let body = out.len() - HEADER_BYTES;
    if body > limit as usize {
        return Err(FrameError::TooLarge { len: body as u64, limit });
    }
    out[..HEADER_BYTES].copy_from_slice(&(body as u32).to_be_bytes());
    Ok(out)
}

/// Reads the body length from a frame header, refusing lengths above `limit`.
pub fn body_len(header: [u8; HEADER_BYTES], limit: u32) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len > limit {
        return Err(FrameError::TooLarge { len: u64::from(len), limit });
    }
    Ok(len as usize)
}

/// Decodes a frame body. Trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(body)?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::point::{Point, WriteSeries};
    use crate::wire::{Request, Response};

    fn series() -> String {
        "pmu.phase{bus=1,site=atl}".into()
    }

    #[test]
    fn frames_round_trip() {
        let req = Request::Write {
            batch: vec![WriteSeries { series: series(), points: vec![Point::new(1, 2.5), Point::new(3, -1.0)] }],
        };
        let frame = encode(&req, 1024).unwrap();
        let len = body_len(frame[..4].try_into().unwrap(), 1024).unwrap();
        assert_eq!(len, frame.len() - 4);
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), req);
    }

    #[test]
    fn oversize_frames_are_refused_both_ways() {
        let req =
            Request::Write { batch: vec![WriteSeries { series: series(), points: vec![Point::new(1, 0.0); 100] }] };
        assert!(matches!(encode(&req, 64), Err(FrameError::TooLarge { .. })));
        assert!(matches!(body_len(1000u32.to_be_bytes(), 999), Err(FrameError::TooLarge { len: 1000, limit: 999 })));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Response>(&bytes);
        }
    }
}

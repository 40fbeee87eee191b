//! Framing: a frame is a 4-byte big-endian length followed by that many bytes of
//! postcard-encoded message. Frames above the configured limit are refused before their body is
//! read.

use serde::{Serialize, de::DeserializeOwned};

/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 4;

/// Bytes of the frame carrying `msg`, header included: what a message costs on the wire (repair
/// counts its comparisons with it).
pub fn frame_bytes<T: Serialize>(msg: &T) -> u64 {
    (HEADER_BYTES + postcard::experimental::serialized_size(msg).unwrap_or(0)) as u64
}

/// Framing failures.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The announced or encoded length exceeds the limit.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: u64, limit: u32 },
    /// The message nests envelopes deeper than [`super::nesting::MAX_NESTING`] allows.
    #[error(
        "malformed message: a located request carries another located request; wrap a request at most {limit} time"
    )]
    TooDeep { limit: u32 },
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

/// Decodes a frame body. Trailing bytes are an error, and so is nesting deeper than
/// [`super::nesting::MAX_NESTING`] (refused before the nested bytes are read).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    super::nesting::take_refused();
    let (msg, rest) = postcard::take_from_bytes(body).map_err(|e| {
        if super::nesting::take_refused() {
            FrameError::TooDeep { limit: super::nesting::MAX_NESTING }
        } else {
            FrameError::Malformed(e)
        }
    })?;
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

    /// postcard's bytes of `depth` located envelopes around a status request, built by hand (a
    /// value this deep could not even be dropped without recursing).
    fn nested_located(depth: usize) -> Vec<u8> {
        let at = crate::geo::GeoPoint::new(33.75, -84.39).unwrap();
        let one = encode(&Request::Located { at, request: Box::new(Request::Status) }, u32::MAX).unwrap();
        let status = postcard::to_stdvec(&Request::Status).unwrap();
        // The envelope's own bytes: the Located tag and the location, before the inner request.
        let envelope = &one[HEADER_BYTES..one.len() - status.len()];
        let mut bytes = envelope.repeat(depth);
        bytes.extend_from_slice(&status);
        bytes
    }

    #[test]
    fn nested_located_envelopes_are_refused_before_recursing() {
        // One envelope decodes; a second inside it is refused, however deep the stack goes.
        assert!(matches!(decode::<Request>(&nested_located(1)), Ok(Request::Located { .. })));
        // A small stack: without the bound, postcard's recursion overflows it long before
        // 100,000 levels (and aborts the test binary).
        let worker = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                let mut out = Vec::new();
                for depth in [2, 3, 100_000] {
                    out.push(decode::<Request>(&nested_located(depth)).map(|_| ()));
                }
                out
            })
            .unwrap();
        for result in worker.join().expect("decoding must not overflow the stack") {
            let err = result.unwrap_err();
            assert!(matches!(err, FrameError::TooDeep { limit: 1 }), "{err:?}");
            assert!(err.to_string().contains("located request carries another"), "{err}");
        }
        // Neither the mark nor the depth leaks into the next decode on the same thread.
        assert!(matches!(decode::<Request>(&nested_located(2)), Err(FrameError::TooDeep { .. })));
        assert!(matches!(decode::<Request>(&[0xff]), Err(FrameError::Malformed(_))));
        assert!(decode::<Request>(&nested_located(1)).is_ok());
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

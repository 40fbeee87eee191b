//! The record framing every store file uses, and byte-level helpers (pure, no I/O).
//!
//! A frame is `magic[4] | len u32 | crc32c u32 | kind u8 | body[len - 1]`, little-endian, where
//! `len` counts `kind` and `body` and the CRC (Castagnoli) covers them. The magic differs per
//! file type, so a scan can find the next frame after damaged bytes ("resync") instead of
//! giving up on the rest of the file. See FORMAT.md.

/// Bytes before a frame's kind byte.
pub const HEADER: usize = 12;
/// Largest frame payload (kind + body) accepted; bounds what one bad length field can make a
/// reader allocate.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Appends one frame to `out`.
pub fn put(out: &mut Vec<u8>, magic: [u8; 4], kind: u8, body: &[u8]) {
    let len = body.len() + 1;
    debug_assert!(len <= MAX_PAYLOAD, "frames are bounded by the encoders");
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, body);
    out.extend_from_slice(&magic);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// Appends a frame whose body is built by `f` directly in `out` (no intermediate buffer).
pub fn put_with(out: &mut Vec<u8>, magic: [u8; 4], kind: u8, f: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&magic);
    out.extend_from_slice(&[0; 8]);
    out.push(kind);
    f(out);
    let len = out.len() - at - HEADER;
    let crc = crc32c::crc32c(&out[at + HEADER..]);
    out[at + 4..at + 8].copy_from_slice(&(len as u32).to_le_bytes());
    out[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
}

/// One frame found by [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found<'a> {
    /// Offset of the frame's magic in the scanned bytes.
    pub offset: usize,
    /// Total bytes of the frame.
    pub len: usize,
    pub kind: u8,
    pub body: &'a [u8],
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan<'a> {
    pub frames: Vec<Found<'a>>,
    /// Bytes up to the end of the last good frame: where appending may continue.
    pub valid_len: usize,
    /// Damaged stretches `(offset, bytes)` that were followed by good frames (real corruption,
    /// as opposed to a torn tail).
    pub skipped: Vec<(usize, usize)>,
}

/// Parses the frame at `at`, if a whole, intact one starts there.
pub fn parse_at(bytes: &[u8], magic: [u8; 4], at: usize) -> Option<Found<'_>> {
    let head = bytes.get(at..at + HEADER)?;
    if head[..4] != magic {
        return None;
    }
    let len = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let crc = u32::from_le_bytes(head[8..12].try_into().ok()?);
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    (crc32c::crc32c(payload) == crc).then_some(Found {
        offset: at,
        len: HEADER + len,
        kind: payload[0],
        body: &payload[1..],
    })
}

/// All intact frames of `bytes`. After damage, scanning resumes at the next intact frame; the
/// damage is reported in `skipped` unless nothing intact follows it (a torn tail).
pub fn scan(bytes: &[u8], magic: [u8; 4]) -> Scan<'_> {
    let mut out = Scan::default();
    let mut at = 0;
    while at < bytes.len() {
        if let Some(f) = parse_at(bytes, magic, at) {
            at += f.len;
            out.valid_len = at;
            out.frames.push(f);
            continue;
        }
        // Damaged or torn: look for the next intact frame.
        let mut probe = at + 1;
        let next = loop {
            match find(&bytes[probe.min(bytes.len())..], &magic) {
                None => break None,
                Some(i) => {
                    let cand = probe + i;
                    if parse_at(bytes, magic, cand).is_some() {
                        break Some(cand);
                    }
                    probe = cand + 1;
                }
            }
        };
        match next {
            Some(n) => {
                out.skipped.push((at, n - at));
                at = n;
            }
            None => break,
        }
    }
    out
}

fn find(hay: &[u8], needle: &[u8; 4]) -> Option<usize> {
    hay.windows(4).position(|w| w == needle)
}

/// Appends `v` as a LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Zigzag-maps a signed number so small magnitudes make short varints.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A cursor over a frame body that fails cleanly on truncated or malformed input.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// A body that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let s = self.bytes.get(self.at..self.at.saturating_add(n)).ok_or_else(|| {
            Malformed(format!("truncated: needed {n} bytes at offset {} of {}", self.at, self.bytes.len()))
        })?;
        self.at += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn i64(&mut self) -> Result<i64, Malformed> {
        Ok(self.u64()? as i64)
    }

    pub fn f64(&mut self) -> Result<f64, Malformed> {
        Ok(f64::from_bits(self.u64()?))
    }

    pub fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed(format!("varint longer than 10 bytes at offset {}", self.at)))
    }

    /// A varint-length-prefixed byte string.
    pub fn bytes_varint(&mut self) -> Result<&'a [u8], Malformed> {
        let n = usize::try_from(self.varint()?).map_err(|_| Malformed("length over usize".into()))?;
        self.take(n)
    }

    pub fn is_empty(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const M: [u8; 4] = *b"\xA7TST";

    #[test]
    fn torn_tail_is_not_corruption_but_a_damaged_middle_is() {
        let mut f = Vec::new();
        put(&mut f, M, 1, b"one");
        put(&mut f, M, 2, b"two");
        let two_end = f.len();
        put(&mut f, M, 3, b"three");
        // Torn tail: the third frame is cut.
        let s = scan(&f[..f.len() - 2], M);
        assert_eq!(s.frames.len(), 2);
        assert_eq!(s.valid_len, two_end);
        assert!(s.skipped.is_empty());
        // Damaged middle: the second frame's body flipped; the third is still found.
        let mut bad = f.clone();
        bad[two_end - 1] ^= 0xff;
        let s = scan(&bad, M);
        assert_eq!(s.frames.iter().map(|f| f.kind).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(s.skipped.len(), 1);
    }

    proptest! {
        #[test]
        fn varints_round_trip(v in any::<u64>(), s in any::<i64>()) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            put_varint(&mut b, zigzag(s));
            let mut r = Reader::new(&b);
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert_eq!(unzigzag(r.varint().unwrap()), s);
            prop_assert!(r.is_empty());
        }

        /// Any cut of a frame sequence yields exactly the whole frames before the cut.
        #[test]
        fn any_cut_keeps_the_whole_frames(bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8), cut in any::<prop::sample::Index>()) {
            let mut f = Vec::new();
            let mut ends = Vec::new();
            for (i, b) in bodies.iter().enumerate() {
                put_with(&mut f, M, i as u8, |o| o.extend_from_slice(b));
                ends.push(f.len());
            }
            let cut = cut.index(f.len() + 1);
            let s = scan(&f[..cut], M);
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            prop_assert_eq!(s.frames.len(), whole);
            for (i, fr) in s.frames.iter().enumerate() {
                prop_assert_eq!(fr.body, &bodies[i][..]);
            }
        }
    }
}

//! Prometheus' XOR chunk encoding (Gorilla's, with millisecond timestamps), as remote read's
//! `STREAMED_XOR_CHUNKS` responses carry it, written from its description.
//!
//! Layout: a 2-byte big-endian sample count, then a bit stream (most significant bit first,
//! the last byte zero-padded). The first sample is a zigzag varint timestamp and the 64 bits
//! of its value; the second a uvarint time delta and its value XORed with the first. Later
//! timestamps are delta-of-deltas: `0` for none, else `10`, `110`, `1110` with 14, 17 or 20 bits,
//! or `1111` with 64. A value is `0` when equal to the previous one, else `1` then either `0`
//! and the XOR's meaningful bits within the previous leading/trailing zero window, or `1`, 5
//! bits of leading zeros (at most 31), 6 bits of meaningful-bit count (0 meaning 64) and
//! those bits. The bit stream is written as Prometheus' `bstream` writes it, so our chunks are
//! Prometheus' byte for byte (the PromQL oracle checks it on chunks Prometheus streams).

use crate::promql::source::Sample;

/// Samples Prometheus puts in one chunk.
pub const SAMPLES_PER_CHUNK: usize = 120;

/// A chunk that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("the XOR chunk is {0} bytes, shorter than its 2-byte header")]
    NoHeader(usize),
    #[error("the XOR chunk declares {declared} samples, more than the limit of {limit}")]
    TooManySamples { declared: usize, limit: usize },
    #[error("the XOR chunk ends after {decoded} of its {declared} samples")]
    Truncated { decoded: usize, declared: usize },
    #[error("the XOR chunk has a malformed varint at sample {0}")]
    Varint(usize),
}

/// A bit stream written as Prometheus' `bstream` writes it, so chunks come out byte for byte
/// the same: whole bytes (`byte`) always leave a fresh trailing byte behind them, which is why
/// a chunk can end in a zero byte.
#[derive(Debug, Default)]
struct BitWriter {
    buf: Vec<u8>,
    /// Free bits in the last byte (0: the next write starts a new byte).
    free: u8,
}

impl BitWriter {
    fn bit(&mut self, one: bool) {
        if self.free == 0 {
            self.buf.push(0);
            self.free = 8;
        }
        self.free -= 1;
        if one {
            let last = self.buf.len() - 1;
            self.buf[last] |= 1 << self.free;
        }
    }

    fn byte(&mut self, b: u8) {
        if self.free == 0 {
            self.buf.push(0);
            self.free = 8;
        }
        let last = self.buf.len() - 1;
        self.buf[last] |= b >> (8 - self.free);
        self.buf.push((u16::from(b) << self.free) as u8);
    }

    /// The low `n` bits of `v`, most significant first: whole bytes, then single bits.
    fn bits(&mut self, v: u64, n: u32) {
        let mut n = n;
        while n >= 8 {
            self.byte((v >> (n - 8)) as u8);
            n -= 8;
        }
        for i in (0..n).rev() {
            self.bit(v >> i & 1 == 1);
        }
    }
}

struct BitReader<'a> {
    data: &'a [u8],
    /// Next bit to read.
    pos: usize,
}

impl BitReader<'_> {
    fn bit(&mut self) -> Option<bool> {
        let byte = *self.data.get(self.pos / 8)?;
        let b = byte >> (7 - self.pos % 8) & 1 == 1;
        self.pos += 1;
        Some(b)
    }

    fn bits(&mut self, n: u32) -> Option<u64> {
        if self.pos + n as usize > self.data.len() * 8 {
            return None;
        }
        let mut v = 0u64;
        for _ in 0..n {
            v = v << 1 | u64::from(self.bit()?);
        }
        Some(v)
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.bits(8)?;
            if shift == 63 && b > 1 {
                return None; // overflows 64 bits
            }
            v |= (b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }
}

fn write_uvarint(w: &mut BitWriter, mut v: u64) {
    while v >= 0x80 {
        w.byte(v as u8 | 0x80);
        v >>= 7;
    }
    w.byte(v as u8);
}

/// Whether `x` fits the `n`-bit delta-of-delta bucket: Prometheus' range is
/// `-(2^(n-1) - 1) ..= 2^(n-1)`.
fn fits(x: i64, n: u32) -> bool {
    -((1i64 << (n - 1)) - 1) <= x && x <= 1i64 << (n - 1)
}

/// Encodes samples into one XOR chunk (at most 65,535 samples).
#[derive(Debug)]
pub struct XorEncoder {
    w: BitWriter,
    num: u16,
    t: i64,
    v: f64,
    t_delta: u64,
    leading: u8,
    trailing: u8,
}

impl Default for XorEncoder {
    fn default() -> Self {
        XorEncoder {
            w: BitWriter { buf: vec![0, 0], free: 0 },
            num: 0,
            t: 0,
            v: 0.0,
            t_delta: 0,
            leading: 0xff,
            trailing: 0,
        }
    }
}

impl XorEncoder {
    pub fn new() -> XorEncoder {
        XorEncoder::default()
    }

    pub fn len(&self) -> usize {
        usize::from(self.num)
    }

    pub fn is_empty(&self) -> bool {
        self.num == 0
    }

    /// Appends a sample (timestamps should increase); `false` when the chunk is full.
    pub fn append(&mut self, t: i64, v: f64) -> bool {
        if self.num == u16::MAX {
            return false;
        }
        match self.num {
            0 => {
                write_uvarint(&mut self.w, ((t << 1) ^ (t >> 63)) as u64);
                self.w.bits(v.to_bits(), 64);
            }
            1 => {
                self.t_delta = t.wrapping_sub(self.t) as u64;
                write_uvarint(&mut self.w, self.t_delta);
                self.write_value(v);
            }
            _ => {
                let t_delta = t.wrapping_sub(self.t) as u64;
                let dod = t_delta.wrapping_sub(self.t_delta) as i64;
                match dod {
                    0 => self.w.bit(false),
                    d if fits(d, 14) => {
                        self.w.bits(0b10, 2);
                        self.w.bits(d as u64, 14);
                    }
                    d if fits(d, 17) => {
                        self.w.bits(0b110, 3);
                        self.w.bits(d as u64, 17);
                    }
                    d if fits(d, 20) => {
                        self.w.bits(0b1110, 4);
                        self.w.bits(d as u64, 20);
                    }
                    d => {
                        self.w.bits(0b1111, 4);
                        self.w.bits(d as u64, 64);
                    }
                }
                self.t_delta = t_delta;
                self.write_value(v);
            }
        }
        self.t = t;
        self.v = v;
        self.num += 1;
        true
    }

    fn write_value(&mut self, v: f64) {
        let delta = v.to_bits() ^ self.v.to_bits();
        if delta == 0 {
            self.w.bit(false);
            return;
        }
        self.w.bit(true);
        let leading = (delta.leading_zeros() as u8).min(31);
        let trailing = delta.trailing_zeros() as u8;
        if self.leading != 0xff && leading >= self.leading && trailing >= self.trailing {
            self.w.bit(false);
            self.w.bits(delta >> self.trailing, u32::from(64 - self.leading - self.trailing));
            return;
        }
        self.leading = leading;
        self.trailing = trailing;
        self.w.bit(true);
        self.w.bits(u64::from(leading), 5);
        let sig = 64 - leading - trailing;
        // 64 meaningful bits do not fit 6 bits; 0 stands for them (0 never occurs otherwise).
        self.w.bits(u64::from(sig), 6);
        self.w.bits(delta >> trailing, u32::from(sig));
    }

    /// The chunk's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.w.buf[..2].copy_from_slice(&self.num.to_be_bytes());
        self.w.buf
    }
}

/// Encodes `samples` into one chunk.
pub fn encode_xor(samples: &[Sample]) -> Vec<u8> {
    let mut e = XorEncoder::new();
    for s in samples {
        e.append(s.t, s.v);
    }
    e.finish()
}

/// Decodes an XOR chunk of at most `max_samples` samples.
pub fn decode_xor(data: &[u8], max_samples: usize) -> Result<Vec<Sample>, ChunkError> {
    if data.len() < 2 {
        return Err(ChunkError::NoHeader(data.len()));
    }
    let declared = usize::from(u16::from_be_bytes([data[0], data[1]]));
    if declared > max_samples {
        return Err(ChunkError::TooManySamples { declared, limit: max_samples });
    }
    let mut r = BitReader { data: &data[2..], pos: 0 };
    let mut out = Vec::with_capacity(declared.min(data.len() * 8));
    let truncated = |decoded| ChunkError::Truncated { decoded, declared };
    let (mut t, mut v, mut t_delta, mut leading, mut trailing) = (0i64, 0f64, 0u64, 0u8, 0u8);
    for i in 0..declared {
        match i {
            0 => {
                let z = r.uvarint().ok_or(ChunkError::Varint(i))?;
                t = (z >> 1) as i64 ^ -((z & 1) as i64);
                v = f64::from_bits(r.bits(64).ok_or_else(|| truncated(i))?);
            }
            _ => {
                if i == 1 {
                    t_delta = r.uvarint().ok_or(ChunkError::Varint(i))?;
                } else {
                    let mut prefix = 0u8;
                    for _ in 0..4 {
                        let b = r.bit().ok_or_else(|| truncated(i))?;
                        prefix = prefix << 1 | u8::from(b);
                        if !b {
                            break;
                        }
                    }
                    let dod = match prefix {
                        0b0 => 0i64,
                        0b1111 => r.bits(64).ok_or_else(|| truncated(i))? as i64,
                        p => {
                            let n = match p {
                                0b10 => 14,
                                0b110 => 17,
                                _ => 20,
                            };
                            let mut bits = r.bits(n).ok_or_else(|| truncated(i))?;
                            if bits > 1 << (n - 1) {
                                bits = bits.wrapping_sub(1 << n);
                            }
                            bits as i64
                        }
                    };
                    t_delta = (t_delta as i64).wrapping_add(dod) as u64;
                }
                t = t.wrapping_add(t_delta as i64);
                if r.bit().ok_or_else(|| truncated(i))? {
                    if r.bit().ok_or_else(|| truncated(i))? {
                        leading = r.bits(5).ok_or_else(|| truncated(i))? as u8;
                        let mut sig = r.bits(6).ok_or_else(|| truncated(i))? as u8;
                        if sig == 0 {
                            sig = 64;
                        }
                        // A hostile chunk may claim more bits than 64 minus the leading zeros.
                        trailing = 64u8.saturating_sub(leading).saturating_sub(sig);
                    }
                    let n = 64 - u32::from(leading) - u32::from(trailing);
                    let bits = r.bits(n).ok_or_else(|| truncated(i))?;
                    v = f64::from_bits(v.to_bits() ^ bits.checked_shl(u32::from(trailing)).unwrap_or(0));
                }
            }
        }
        out.push(Sample { t, v });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn whole_bytes_leave_a_trailing_byte_as_prometheus_bstream_does() {
        // Found by the oracle: 2 of 276 chunks streamed by Prometheus ended in a zero byte that
        // ours lacked. A 64-bit value written at a byte boundary is the simplest such chunk.
        let bytes = encode_xor(&[Sample { t: 0, v: 1.0 }]);
        assert_eq!(bytes, [0x00, 0x01, 0x00, 0x3F, 0xF0, 0, 0, 0, 0, 0, 0, 0x00]);
        assert_eq!(decode_xor(&bytes, 1).unwrap(), [Sample { t: 0, v: 1.0 }]);
    }

    #[test]
    fn encodes_the_bytes_the_format_prescribes() {
        // Worked by hand from the layout: header 3; zigzag varint 1000 (D0 0F) and the bits of
        // 1.0; uvarint delta 1000 (E8 07); then `0` (same value), `0` (same delta), and 2.0
        // against 1.0: `1 1`, leading 1 (00001), 11 meaningful bits (001011), eleven 1s.
        let s = [Sample { t: 1000, v: 1.0 }, Sample { t: 2000, v: 1.0 }, Sample { t: 3000, v: 2.0 }];
        let bytes = encode_xor(&s);
        assert_eq!(bytes, [0x00, 0x03, 0xD0, 0x0F, 0x3F, 0xF0, 0, 0, 0, 0, 0, 0, 0xE8, 0x07, 0x30, 0x97, 0xFF, 0xC0]);
        assert_eq!(decode_xor(&bytes, 120).unwrap(), s);
    }

    #[test]
    fn hostile_chunks_are_errors() {
        assert_eq!(decode_xor(&[1], 120), Err(ChunkError::NoHeader(1)));
        assert_eq!(decode_xor(&[0xff, 0xff], 120), Err(ChunkError::TooManySamples { declared: 65535, limit: 120 }));
        assert!(matches!(decode_xor(&[0, 5, 0x02], 120), Err(ChunkError::Truncated { decoded: 0, declared: 5 })));
        assert_eq!(
            decode_xor(&[0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], 120),
            Err(ChunkError::Varint(0))
        );
        let full = encode_xor(&[Sample { t: 0, v: 1.0 }, Sample { t: 15, v: 2.5 }, Sample { t: 31, v: -7.0 }]);
        for cut in 2..full.len() {
            assert!(decode_xor(&full[..cut], 120).is_err(), "cut at {cut}");
        }
    }

    proptest! {
        #[test]
        fn chunks_round_trip(
            start in -1i64 << 50..1i64 << 50,
            steps in proptest::collection::vec((0i64..=2_000_000, any::<u64>(), 0u8..4), 0..200),
        ) {
            let mut t = start;
            let mut prev = 0.0f64;
            let samples: Vec<Sample> = steps.iter().map(|&(dt, bits, kind)| {
                t += dt;
                // Repeated values, small changes, arbitrary bit patterns (NaNs included).
                let v = match kind { 0 => prev, 1 => prev + 1.0, 2 => (bits % 1000) as f64 / 8.0, _ => f64::from_bits(bits) };
                prev = v;
                Sample { t, v }
            }).collect();
            let decoded = decode_xor(&encode_xor(&samples), 65_535).unwrap();
            prop_assert_eq!(decoded.len(), samples.len());
            for (a, b) in decoded.iter().zip(&samples) {
                prop_assert_eq!(a.t, b.t);
                prop_assert_eq!(a.v.to_bits(), b.v.to_bits());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_xor(&data, 120);
        }
    }
}

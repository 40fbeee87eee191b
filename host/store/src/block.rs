//! Sealed blocks: the compressed, checksummed, summarised points of one (series, quantum), as
//! pure encode/decode functions.
//!
//! A block is one frame (see FORMAT.md) whose body holds a fixed header (series id, quantum,
//! count, codec, [`Summary`]) and three columns: timestamps, event ids (omitted when all are 0)
//! and values. Columns are compressed with [`Codec::Pco`] (the default) or [`Codec::Xor`]
//! (Gorilla-style delta-of-delta timestamps and XOR values); every reader decodes both.

use serde_bytes::ByteBuf;
use timeshard_proto::packed::PackedColumns;
use timeshard_proto::{Point, Quantum, QuantumLen};

use crate::agg::Summary;
use crate::frame::{self, Malformed, Reader};

/// Magic of block frames in block segment files.
pub const MAGIC: [u8; 4] = *b"\xA7BLK";
/// Frame kind of a version-1 block.
pub const KIND_BLOCK_V1: u8 = 1;
/// Most points in one block. With the worst case of either codec (about 30 bytes per point on
/// random data) a block stays below the 64 MiB frame limit; the engine also checks the encoded
/// size. A quantum that would hold more must use a shorter quantum length.
pub const MAX_POINTS: usize = 1 << 21;

/// Column compression of a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Codec {
    /// pco (pcodec): the smallest on decimal-rounded floats and regular timestamps.
    #[default]
    Pco,
    /// Gorilla-style XOR floats and delta-of-delta timestamps.
    Xor,
}

impl Codec {
    fn id(self) -> u8 {
        match self {
            Codec::Pco => 1,
            Codec::Xor => 2,
        }
    }

    fn from_id(id: u8) -> Result<Codec, Malformed> {
        match id {
            1 => Ok(Codec::Pco),
            2 => Ok(Codec::Xor),
            _ => Err(Malformed(format!("unknown codec id {id}"))),
        }
    }
}

const FLAG_NO_EVENTS: u8 = 1;

/// What a block says about itself, readable without decoding its columns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Header {
    pub series: u32,
    pub quantum: Quantum,
    pub codec: Codec,
    pub summary: Summary,
}

/// Encodes sorted, deduplicated, non-empty `points` of one block as a frame appended to `out`.
pub fn encode(out: &mut Vec<u8>, series: u32, quantum: Quantum, points: &[Point], codec: Codec) -> Summary {
    assert!(!points.is_empty() && points.len() <= MAX_POINTS, "the engine seals only non-empty, size-capped blocks");
    let summary = Summary::of(points).expect("non-empty");
    let no_events = points.iter().all(|p| p.event == 0);
    frame::put_with(out, MAGIC, KIND_BLOCK_V1, |o| {
        o.push(codec.id());
        o.push(if no_events { FLAG_NO_EVENTS } else { 0 });
        frame::put_varint(o, u64::from(series));
        o.extend_from_slice(&quantum.start.to_le_bytes());
        frame::put_varint(o, quantum.len.ns() as u64);
        put_summary(o, &summary, quantum.start);
        let ts: Vec<i64> = points.iter().map(|p| p.ts).collect();
        let vals: Vec<f64> = points.iter().map(|p| p.value).collect();
        let evs: Vec<u64> = if no_events { Vec::new() } else { points.iter().map(|p| p.event).collect() };
        match codec {
            Codec::Pco => {
                put_col(o, &pco_i64(&ts));
                if !no_events {
                    put_col(o, &pco_u64(&evs));
                }
                put_col(o, &pco_f64(&vals));
            }
            Codec::Xor => {
                put_col(o, &xor::encode_ts(&ts));
                if !no_events {
                    let mut e = Vec::new();
                    for v in &evs {
                        frame::put_varint(&mut e, *v);
                    }
                    put_col(o, &e);
                }
                put_col(o, &xor::encode_values(&vals));
            }
        }
    });
    summary
}

/// Summary layout shared with the index (compact: a block costs its metadata once per
/// quantum): count varint, min, max, sum as f64 bits, then first and last points as zigzag
/// varint offset from `base` (the quantum start), varint event, f64 bits, then the digest as
/// 8 bytes little-endian.
pub(crate) fn put_summary(o: &mut Vec<u8>, s: &Summary, base: i64) {
    frame::put_varint(o, s.count);
    for v in [s.min, s.max, s.sum] {
        o.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    for p in [s.first, s.last] {
        frame::put_varint(o, frame::zigzag(p.ts.wrapping_sub(base)));
        frame::put_varint(o, p.event);
        o.extend_from_slice(&p.value.to_bits().to_le_bytes());
    }
    o.extend_from_slice(&s.digest.to_le_bytes());
}

pub(crate) fn get_summary(r: &mut Reader<'_>, base: i64) -> Result<Summary, Malformed> {
    let count = r.varint()?;
    let (min, max, sum) = (r.f64()?, r.f64()?, r.f64()?);
    let mut pt = || -> Result<Point, Malformed> {
        Ok(Point { ts: base.wrapping_add(frame::unzigzag(r.varint()?)), event: r.varint()?, value: r.f64()? })
    };
    let first = pt()?;
    let last = pt()?;
    let digest = r.u64()?;
    Ok(Summary { count, min, max, sum, first, last, digest })
}

fn put_col(o: &mut Vec<u8>, col: &[u8]) {
    frame::put_varint(o, col.len() as u64);
    o.extend_from_slice(col);
}

fn pco_config() -> pco::ChunkConfig {
    // Level 4 compresses these columns as small as the default level 8 and encodes 1.4-1.7x
    // faster (the bench's codec comparison; see FORMAT.md).
    pco::ChunkConfig::default().with_compression_level(4)
}

fn pco_i64(v: &[i64]) -> Vec<u8> {
    pco::standalone::simple_compress(v, &pco_config()).expect("pco accepts any i64 slice")
}
fn pco_u64(v: &[u64]) -> Vec<u8> {
    pco::standalone::simple_compress(v, &pco_config()).expect("pco accepts any u64 slice")
}
fn pco_f64(v: &[f64]) -> Vec<u8> {
    pco::standalone::simple_compress(v, &pco_config()).expect("pco accepts any f64 slice")
}

fn pco_decode<T: pco::data_types::Number>(b: &[u8], n: usize, what: &str) -> Result<Vec<T>, Malformed> {
    let v: Vec<T> = pco::standalone::simple_decompress(b).map_err(|e| Malformed(format!("{what} column: {e}")))?;
    if v.len() != n {
        return Err(Malformed(format!("{what} column holds {} numbers, the header says {n}", v.len())));
    }
    Ok(v)
}

fn parse_header(body: &[u8]) -> Result<(Header, u8, Reader<'_>), Malformed> {
    let mut r = Reader::new(body);
    let codec = Codec::from_id(r.u8()?)?;
    let flags = r.u8()?;
    let series = u32::try_from(r.varint()?).map_err(|_| Malformed("series id over 32 bits".into()))?;
    let start = r.i64()?;
    let len = i64::try_from(r.varint()?).map_err(|_| Malformed("quantum length over 63 bits".into()))?;
    let len = QuantumLen::new(len).map_err(|e| Malformed(e.to_string()))?;
    let quantum =
        Quantum::at(start, len).ok_or_else(|| Malformed(format!("quantum start {start} is not aligned to {len:?}")))?;
    let summary = get_summary(&mut r, start)?;
    if summary.count == 0 || summary.count > MAX_POINTS as u64 {
        return Err(Malformed(format!("block claims {} points", summary.count)));
    }
    Ok((Header { series, quantum, codec, summary }, flags, r))
}

fn unframe(bytes: &[u8]) -> Result<&[u8], Malformed> {
    let f = frame::parse_at(bytes, MAGIC, 0).ok_or_else(|| Malformed("bad magic, length or checksum".into()))?;
    if f.len != bytes.len() {
        return Err(Malformed(format!("frame is {} bytes but {} were stored for it", f.len, bytes.len())));
    }
    if f.kind != KIND_BLOCK_V1 {
        return Err(Malformed(format!("unknown block kind {}", f.kind)));
    }
    Ok(f.body)
}

/// The header of the block frame `bytes` (checksum verified).
pub fn decode_header(bytes: &[u8]) -> Result<Header, Malformed> {
    Ok(parse_header(unframe(bytes)?)?.0)
}

/// The header and points of the block frame `bytes` (checksum verified, points checked against
/// the header).
pub fn decode(bytes: &[u8]) -> Result<(Header, Vec<Point>), Malformed> {
    let mut points = Vec::new();
    let h = decode_into(bytes, &mut points)?;
    Ok((h, points))
}

/// Like [`decode`], appending the points to `out` (which is left as it was on error). Saves
/// a copy on the scan path.
pub fn decode_into(bytes: &[u8], out: &mut Vec<Point>) -> Result<Header, Malformed> {
    let (h, flags, mut r) = parse_header(unframe(bytes)?)?;
    let n = h.summary.count as usize;
    let ts_col = r.bytes_varint()?;
    let ev_col = if flags & FLAG_NO_EVENTS == 0 { Some(r.bytes_varint()?) } else { None };
    let val_col = r.bytes_varint()?;
    let (ts, evs, vals) = match h.codec {
        Codec::Pco => (
            pco_decode::<i64>(ts_col, n, "timestamp")?,
            ev_col.map(|c| pco_decode::<u64>(c, n, "event")).transpose()?,
            pco_decode::<f64>(val_col, n, "value")?,
        ),
        Codec::Xor => (
            xor::decode_ts(ts_col, n)?,
            ev_col
                .map(|c| {
                    let mut r = Reader::new(c);
                    (0..n).map(|_| r.varint()).collect::<Result<Vec<u64>, _>>()
                })
                .transpose()?,
            xor::decode_values(val_col, n)?,
        ),
    };
    let base = out.len();
    out.reserve(n);
    match evs {
        Some(evs) => {
            out.extend(ts.iter().zip(&evs).zip(&vals).map(|((&ts, &event), &value)| Point { ts, value, event }))
        }
        None => out.extend(ts.iter().zip(&vals).map(|(&ts, &value)| Point { ts, value, event: 0 })),
    }
    // A block whose columns disagree with its summary is as corrupt as a bad checksum.
    let (first, last) = (out[base], out[base + n - 1]);
    if first != h.summary.first
        || last != h.summary.last
        || !h.quantum.contains(first.ts)
        || !h.quantum.contains(last.ts)
    {
        out.truncate(base);
        return Err(Malformed("decoded points disagree with the block's summary or quantum".into()));
    }
    Ok(h)
}

/// The header and pco columns of the block frame `bytes` (checksum verified), as stored:
/// `None` for a block of another codec.
pub fn packed_columns(bytes: &[u8]) -> Result<Option<(Header, PackedColumns)>, Malformed> {
    let (h, flags, mut r) = parse_header(unframe(bytes)?)?;
    if h.codec != Codec::Pco {
        return Ok(None);
    }
    let timestamps = r.bytes_varint()?.to_vec();
    let events = if flags & FLAG_NO_EVENTS == 0 { Some(ByteBuf::from(r.bytes_varint()?.to_vec())) } else { None };
    let values = r.bytes_varint()?.to_vec();
    Ok(Some((h, PackedColumns { timestamps, events, values })))
}

/// Gorilla-style columns (Pelkonen et al., VLDB 2015), adapted to nanosecond timestamps: the
/// column codec behind [`Codec::Xor`]. Public so the store benchmark (in `timeshard-testkit`)
/// can compare it with pco column by column, outside any block.
pub mod xor {
    use super::Malformed;

    #[derive(Default)]
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }

    impl Bits {
        fn put(&mut self, v: u64, bits: u32) {
            debug_assert!(bits <= 64);
            for i in (0..bits).rev() {
                self.acc = (self.acc << 1) | ((v >> i) & 1);
                self.n += 1;
                if self.n == 8 {
                    self.out.push(self.acc as u8);
                    self.acc = 0;
                    self.n = 0;
                }
            }
        }

        fn finish(mut self) -> Vec<u8> {
            if self.n > 0 {
                self.out.push((self.acc << (8 - self.n)) as u8);
            }
            self.out
        }
    }

    struct BitReader<'a> {
        b: &'a [u8],
        pos: usize,
    }

    impl BitReader<'_> {
        fn get(&mut self, bits: u32) -> Result<u64, Malformed> {
            if self.pos + bits as usize > self.b.len() * 8 {
                return Err(Malformed("XOR column is truncated".into()));
            }
            let mut v = 0u64;
            for _ in 0..bits {
                let byte = self.b[self.pos / 8];
                v = (v << 1) | u64::from((byte >> (7 - self.pos % 8)) & 1);
                self.pos += 1;
            }
            Ok(v)
        }
    }

    fn sext(v: u64, bits: u32) -> i64 {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }

    /// Timestamps as deltas of deltas (the first one whole).
    pub fn encode_ts(ts: &[i64]) -> Vec<u8> {
        let mut w = Bits::default();
        let mut prev = 0i64;
        let mut prev_delta = 0i64;
        for (i, &t) in ts.iter().enumerate() {
            if i == 0 {
                w.put(t as u64, 64);
            } else {
                let delta = t.wrapping_sub(prev);
                let dod = delta.wrapping_sub(prev_delta);
                match dod {
                    0 => w.put(0, 1),
                    -64..=63 => {
                        w.put(0b10, 2);
                        w.put(dod as u64 & 0x7f, 7)
                    }
                    -256..=255 => {
                        w.put(0b110, 3);
                        w.put(dod as u64 & 0x1ff, 9)
                    }
                    -2048..=2047 => {
                        w.put(0b1110, 4);
                        w.put(dod as u64 & 0xfff, 12)
                    }
                    _ => {
                        w.put(0b1111, 4);
                        w.put(dod as u64, 64)
                    }
                }
                prev_delta = delta;
            }
            prev = t;
        }
        w.finish()
    }

    /// The `n` timestamps of a column made by [`encode_ts`].
    pub fn decode_ts(b: &[u8], n: usize) -> Result<Vec<i64>, Malformed> {
        let mut r = BitReader { b, pos: 0 };
        let mut out = Vec::with_capacity(n);
        let mut prev = 0i64;
        let mut prev_delta = 0i64;
        for i in 0..n {
            let t = if i == 0 {
                r.get(64)? as i64
            } else {
                let dod = if r.get(1)? == 0 {
                    0
                } else if r.get(1)? == 0 {
                    sext(r.get(7)?, 7)
                } else if r.get(1)? == 0 {
                    sext(r.get(9)?, 9)
                } else if r.get(1)? == 0 {
                    sext(r.get(12)?, 12)
                } else {
                    r.get(64)? as i64
                };
                let delta = prev_delta.wrapping_add(dod);
                prev_delta = delta;
                prev.wrapping_add(delta)
            };
            out.push(t);
            prev = t;
        }
        Ok(out)
    }

    /// Values XORed with their predecessor, leading and trailing zeros elided.
    pub fn encode_values(vals: &[f64]) -> Vec<u8> {
        let mut w = Bits::default();
        let mut prev = 0u64;
        let (mut lead, mut trail) = (u32::MAX, 0u32);
        for (i, v) in vals.iter().enumerate() {
            let bits = v.to_bits();
            if i == 0 {
                w.put(bits, 64);
            } else {
                let x = bits ^ prev;
                if x == 0 {
                    w.put(0, 1);
                } else {
                    let l = x.leading_zeros().min(31);
                    let t = x.trailing_zeros();
                    if lead != u32::MAX && l >= lead && t >= trail {
                        w.put(0b10, 2);
                        w.put(x >> trail, 64 - lead - trail);
                    } else {
                        let sig = 64 - l - t;
                        w.put(0b11, 2);
                        w.put(u64::from(l), 5);
                        // 64 significant bits are stored as 0 (it cannot otherwise occur).
                        w.put(u64::from(sig & 63), 6);
                        w.put(x >> t, sig);
                        lead = l;
                        trail = t;
                    }
                }
            }
            prev = bits;
        }
        w.finish()
    }

    /// The `n` values of a column made by [`encode_values`].
    pub fn decode_values(b: &[u8], n: usize) -> Result<Vec<f64>, Malformed> {
        let mut r = BitReader { b, pos: 0 };
        let mut out = Vec::with_capacity(n);
        let mut prev = 0u64;
        let (mut lead, mut trail) = (0u32, 0u32);
        for i in 0..n {
            let bits = if i == 0 {
                r.get(64)?
            } else if r.get(1)? == 0 {
                prev
            } else if r.get(1)? == 0 {
                let sig = 64 - lead - trail;
                prev ^ (r.get(sig)? << trail)
            } else {
                lead = r.get(5)? as u32;
                let mut sig = r.get(6)? as u32;
                if sig == 0 {
                    sig = 64;
                }
                if lead + sig > 64 {
                    return Err(Malformed("XOR column has an impossible bit window".into()));
                }
                trail = 64 - lead - sig;
                prev ^ (r.get(sig)? << trail)
            };
            out.push(f64::from_bits(bits));
            prev = bits;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_points() -> impl Strategy<Value = Vec<Point>> {
        let value = prop_oneof![
            any::<f64>(),
            (-1000i32..1000).prop_map(|v| f64::from(v) / 1000.0),
            Just(f64::NAN),
            Just(-0.0),
            any::<u64>().prop_map(f64::from_bits),
        ];
        proptest::collection::vec((0i64..10_000, prop_oneof![Just(0u64), any::<u64>()], value), 1..300).prop_map(|v| {
            let mut pts: Vec<Point> =
                v.into_iter().map(|(ts, event, value)| Point { ts: 1_000_000 + ts * 997, event, value }).collect();
            timeshard_proto::point::sort_dedup(&mut pts);
            pts
        })
    }

    proptest! {
        /// Both codecs return exactly the stored points, bit for bit (NaN payloads, -0.0), and
        /// the header carries the summary of those points.
        #[test]
        fn blocks_round_trip(points in arb_points(), xor in any::<bool>()) {
            let codec = if xor { Codec::Xor } else { Codec::Pco };
            let q = Quantum::at(0, QuantumLen::new(100_000_000_000).unwrap()).unwrap();
            let mut out = Vec::new();
            let s = encode(&mut out, 7, q, &points, codec);
            let (h, got) = decode(&out).unwrap();
            prop_assert_eq!(h.series, 7);
            prop_assert_eq!(h.quantum, q);
            prop_assert_eq!(h.summary, s);
            prop_assert_eq!(Some(s), Summary::of(&points));
            prop_assert_eq!(got.len(), points.len());
            for (a, b) in got.iter().zip(&points) {
                prop_assert_eq!(a.key(), b.key());
            }
            prop_assert_eq!(decode_header(&out).unwrap(), h);
        }

        /// A flipped byte anywhere is caught, never decoded into wrong points.
        #[test]
        fn any_flipped_byte_is_detected(points in arb_points(), at in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let q = Quantum::at(0, QuantumLen::new(100_000_000_000).unwrap()).unwrap();
            let mut out = Vec::new();
            encode(&mut out, 1, q, &points, Codec::Pco);
            let i = at.index(out.len());
            out[i] ^= flip;
            prop_assert!(decode(&out).is_err());
        }
    }
}

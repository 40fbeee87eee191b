//! A sealed block's columns as its store compressed them (pco), sent on as they are.
//!
//! A long read spends most of its time moving points: re-encoding each point for the wire costs
//! about 18 bytes and two serialisations per hop, where the store's pco columns hold the same
//! points in about 2.5 bytes. An owner node sends the columns of a block the read covers whole
//! ([`PackedColumns`]); the coordinator forwards them with the count and digest the replicas
//! agreed on ([`PackedPart`]); the client decodes them and checks them against that count and
//! digest, the part's range and identity order ([`PackedPart::decode_into`]), so what reaches
//! the caller is what the replicas agreed on, end to end.

use serde::{Deserialize, Serialize};

use crate::point::{ColumnBatch, PartEnd, Point, PointKey};
use crate::time::TimeRange;

/// Most points one packed block may claim: a store's largest block. Bounds what a receiver
/// allocates before it decodes.
pub const MAX_PACKED_POINTS: u64 = 1 << 21;

/// The three pco-compressed columns of a sealed block (pco's standalone format).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedColumns {
    /// Nanoseconds since the epoch, as `i64`.
    #[serde(with = "serde_bytes")]
    pub timestamps: Vec<u8>,
    /// Event ids as `u64`; `None` when every event id is 0.
    pub events: Option<serde_bytes::ByteBuf>,
    /// Values as `f64`.
    #[serde(with = "serde_bytes")]
    pub values: Vec<u8>,
}

impl PackedColumns {
    /// Compresses sorted `points` (tests and tools; stores keep the columns they sealed).
    pub fn of(points: &[Point]) -> PackedColumns {
        let config = pco::ChunkConfig::default();
        let ts: Vec<i64> = points.iter().map(|p| p.ts).collect();
        let values: Vec<f64> = points.iter().map(|p| p.value).collect();
        let events = points.iter().any(|p| p.event != 0).then(|| {
            let evs: Vec<u64> = points.iter().map(|p| p.event).collect();
            serde_bytes::ByteBuf::from(pco::standalone::simple_compress(&evs, &config).expect("pco takes any u64"))
        });
        PackedColumns {
            timestamps: pco::standalone::simple_compress(&ts, &config).expect("pco takes any i64"),
            events,
            values: pco::standalone::simple_compress(&values, &config).expect("pco takes any f64"),
        }
    }

    /// Compressed bytes the columns hold.
    pub fn bytes(&self) -> usize {
        self.timestamps.len() + self.events.as_ref().map_or(0, |e| e.len()) + self.values.len()
    }
}

/// A part of a streamed read whose points travel packed: the columns, the count and digest the
/// replicas agreed on, and the range the points lie in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackedPart {
    pub range: TimeRange,
    pub end: PartEnd,
    pub columns: PackedColumns,
}

/// Why packed columns were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("packed block: {0}")]
pub struct PackedError(pub String);

/// Decodes pco column `src` into the `n` slots at the end of `col` (grown by `n`).
fn decode_column<T: pco::data_types::Number + Default>(
    src: &[u8],
    n: usize,
    col: &mut Vec<T>,
    what: &str,
) -> Result<(), PackedError> {
    let base = col.len();
    col.resize(base + n, T::default());
    let progress = pco::standalone::simple_decompress_into(src, &mut col[base..])
        .map_err(|e| PackedError(format!("{what} column: {e}")))?;
    if progress.n_processed != n || !progress.finished {
        return Err(PackedError(format!("{what} column does not hold the {n} numbers its part claims")));
    }
    Ok(())
}

impl PackedPart {
    /// Points the part claims.
    pub fn count(&self) -> u64 {
        self.end.count
    }

    /// Appends the part's points to `out`, checked: exactly the claimed count, inside the
    /// range, strictly ascending in identity order, with the claimed digest, and after `after`
    /// when given. On error `out` is left as it was.
    pub fn decode_into(&self, out: &mut ColumnBatch) -> Result<(), PackedError> {
        let n = self.end.count;
        if n == 0 || n > MAX_PACKED_POINTS {
            return Err(PackedError(format!("claims {n} points (1 to {MAX_PACKED_POINTS})")));
        }
        let n = n as usize;
        let base = out.len();
        let decoded = self.decode_columns(n, out).and_then(|()| self.check(out, base));
        if decoded.is_err() {
            out.timestamps.truncate(base);
            out.values.truncate(base);
            out.events.truncate(base);
        }
        decoded
    }

    /// The part's points (checked as [`PackedPart::decode_into`]).
    pub fn points(&self) -> Result<Vec<Point>, PackedError> {
        let mut columns = ColumnBatch::default();
        self.decode_into(&mut columns)?;
        Ok(columns.points().collect())
    }

    fn decode_columns(&self, n: usize, out: &mut ColumnBatch) -> Result<(), PackedError> {
        decode_column(&self.columns.timestamps, n, &mut out.timestamps, "timestamp")?;
        decode_column(&self.columns.values, n, &mut out.values, "value")?;
        match &self.columns.events {
            Some(events) => decode_column(events, n, &mut out.events, "event"),
            None => {
                out.events.resize(out.events.len() + n, 0);
                Ok(())
            }
        }
    }

    /// Checks the points from `base` on against the part's range, order, count and digest.
    fn check(&self, out: &ColumnBatch, base: usize) -> Result<(), PackedError> {
        let ts = &out.timestamps[base..];
        let (vals, evs) = (&out.values[base..], &out.events[base..]);
        let (first, last) = (ts[0], ts[ts.len() - 1]);
        if !self.range.contains(first) || !self.range.contains(last) {
            return Err(PackedError(format!("points from {first} to {last} lie outside {:?}", self.range)));
        }
        let key = |i: usize| PointKey { ts: ts[i], event: evs[i], value_bits: vals[i].to_bits() };
        let mut digest = 0u64;
        let mut prev: Option<PointKey> = None;
        for i in 0..ts.len() {
            let k = key(i);
            if prev.is_some_and(|p| p >= k) {
                return Err(PackedError("points are not in strictly ascending identity order".into()));
            }
            prev = Some(k);
            digest = digest.wrapping_add(Point { ts: ts[i], value: vals[i], event: evs[i] }.identity_hash());
        }
        if digest != self.end.digest {
            return Err(PackedError("points do not have the digest the replicas agreed on".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points() -> Vec<Point> {
        (0..1_000i64).map(|i| Point { ts: 1_000 + i * 16_666_667, value: (i % 37) as f64 * 0.25, event: 0 }).collect()
    }

    fn part(points: &[Point]) -> PackedPart {
        PackedPart {
            range: TimeRange::new(0, 100 * 1_000_000_000).unwrap(),
            end: PartEnd::of(points),
            columns: PackedColumns::of(points),
        }
    }

    #[test]
    fn packed_parts_decode_to_their_points() {
        let pts = points();
        let p = part(&pts);
        assert!(p.columns.bytes() < pts.len() * 4, "{} bytes for {} points", p.columns.bytes(), pts.len());
        assert_eq!(p.points().unwrap(), pts);
        // With event ids, appended after points already in the batch.
        let mut evs = pts.clone();
        evs.iter_mut().enumerate().for_each(|(i, p)| p.event = (i % 3) as u64);
        let mut out = ColumnBatch::from_points(&[Point::new(1, 1.0)]);
        part(&evs).decode_into(&mut out).unwrap();
        assert_eq!(out.points().skip(1).collect::<Vec<_>>(), evs);
        // Through the wire encoding.
        let bytes = postcard::to_allocvec(&p).unwrap();
        assert_eq!(postcard::from_bytes::<PackedPart>(&bytes).unwrap(), p);
    }

    #[test]
    fn packed_parts_that_break_their_claims_are_refused_and_leave_the_batch_as_it_was() {
        let pts = points();
        let good = part(&pts);
        let mut before = ColumnBatch::from_points(&[Point::new(1, 1.0)]);
        let kept = before.clone();
        let mut refuse = |p: PackedPart, why: &str| {
            let e = p.decode_into(&mut before).unwrap_err();
            assert!(e.0.contains(why), "{e} should say {why}");
            assert_eq!(before, kept);
        };
        refuse(PackedPart { end: PartEnd { digest: good.end.digest ^ 1, ..good.end }, ..good.clone() }, "digest");
        refuse(PackedPart { end: PartEnd { count: 999, ..good.end }, ..good.clone() }, "numbers");
        refuse(PackedPart { end: PartEnd { count: 1_001, ..good.end }, ..good.clone() }, "numbers");
        refuse(PackedPart { end: PartEnd { count: MAX_PACKED_POINTS + 1, ..good.end }, ..good.clone() }, "claims");
        refuse(PackedPart { end: PartEnd { count: 0, ..good.end }, ..good.clone() }, "claims");
        refuse(PackedPart { range: TimeRange::new(0, 1_000).unwrap(), ..good.clone() }, "outside");
        let mut shuffled = pts.clone();
        shuffled.swap(3, 4);
        refuse(PackedPart { columns: PackedColumns::of(&shuffled), ..good.clone() }, "ascending");
        let mut garbage = good.clone();
        garbage.columns.values = vec![7; 12];
        refuse(garbage, "value column");
    }
}

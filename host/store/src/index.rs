//! The index log `index.log`: the durable catalogue of the series dictionary, of where each
//! sealed block lives with its summary, of retention watermarks, and of the log checkpoint.
//! Pure encode/decode of its edits plus replay into an [`Image`].
//!
//! Only maintenance appends to it, after the data an edit points at is durable. When it grows
//! well past its live content it is rewritten as a snapshot (atomically replaced).

use std::collections::HashMap;

use timeshard_proto::QuantumLen;

use crate::agg::Summary;
use crate::block::{get_summary, put_summary};
use crate::frame::{self, Malformed, Reader};

/// Magic of index frames.
pub const MAGIC: [u8; 4] = *b"\xA7IDX";
/// The index file.
pub const PATH: &str = "index.log";

const KIND_HEADER: u8 = 1;
const KIND_SERIES: u8 = 2;
const KIND_PUT: u8 = 3;
const KIND_EXPIRE: u8 = 4;
const KIND_CHECKPOINT: u8 = 5;

/// Where a sealed block lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Loc {
    pub seg: u32,
    pub offset: u64,
    pub len: u32,
    pub summary: Summary,
}

/// One edit of the index.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    Header {
        version: u32,
    },
    /// Dictionary entry (latest wins). `quantum_ns` is 0 while the series has no data.
    Series {
        id: u32,
        registered: bool,
        quantum_ns: i64,
        key: String,
    },
    /// The block (series, quantum start) is now at `loc` (latest wins).
    Put {
        id: u32,
        start: i64,
        loc: Loc,
    },
    /// Every block of `id` ending at or before `before` is gone, and points there are dropped.
    Expire {
        id: u32,
        before: i64,
    },
    /// Log segments before `first_live_wal` are no longer needed.
    Checkpoint {
        first_live_wal: u64,
    },
}

/// Appends one edit.
pub fn put(out: &mut Vec<u8>, e: &Edit) {
    match e {
        Edit::Header { version } => frame::put(out, MAGIC, KIND_HEADER, &version.to_le_bytes()),
        Edit::Series { id, registered, quantum_ns, key } => frame::put_with(out, MAGIC, KIND_SERIES, |o| {
            o.extend_from_slice(&id.to_le_bytes());
            o.push(u8::from(*registered));
            o.extend_from_slice(&quantum_ns.to_le_bytes());
            o.extend_from_slice(&(key.len() as u16).to_le_bytes());
            o.extend_from_slice(key.as_bytes());
        }),
        Edit::Put { id, start, loc } => frame::put_with(out, MAGIC, KIND_PUT, |o| {
            frame::put_varint(o, u64::from(*id));
            o.extend_from_slice(&start.to_le_bytes());
            frame::put_varint(o, u64::from(loc.seg));
            frame::put_varint(o, loc.offset);
            frame::put_varint(o, u64::from(loc.len));
            put_summary(o, &loc.summary, *start);
        }),
        Edit::Expire { id, before } => frame::put_with(out, MAGIC, KIND_EXPIRE, |o| {
            o.extend_from_slice(&id.to_le_bytes());
            o.extend_from_slice(&before.to_le_bytes());
        }),
        Edit::Checkpoint { first_live_wal } => frame::put(out, MAGIC, KIND_CHECKPOINT, &first_live_wal.to_le_bytes()),
    }
}

/// Decodes one frame.
pub fn decode(kind: u8, body: &[u8]) -> Result<Edit, Malformed> {
    let mut r = Reader::new(body);
    let e = match kind {
        KIND_HEADER => Edit::Header { version: r.u32()? },
        KIND_SERIES => {
            let id = r.u32()?;
            let registered = r.u8()? != 0;
            let quantum_ns = r.i64()?;
            let n = r.u16()? as usize;
            let key =
                std::str::from_utf8(r.take(n)?).map_err(|_| Malformed("series key is not UTF-8".into()))?.to_string();
            Edit::Series { id, registered, quantum_ns, key }
        }
        KIND_PUT => {
            let u32v = |r: &mut Reader<'_>, what: &str| {
                u32::try_from(r.varint()?).map_err(|_| Malformed(format!("{what} over 32 bits")))
            };
            let id = u32v(&mut r, "series id")?;
            let start = r.i64()?;
            let seg = u32v(&mut r, "segment")?;
            let offset = r.varint()?;
            let len = u32v(&mut r, "block length")?;
            let summary = get_summary(&mut r, start)?;
            Edit::Put { id, start, loc: Loc { seg, offset, len, summary } }
        }
        KIND_EXPIRE => Edit::Expire { id: r.u32()?, before: r.i64()? },
        KIND_CHECKPOINT => Edit::Checkpoint { first_live_wal: r.u64()? },
        k => return Err(Malformed(format!("unknown index edit kind {k}"))),
    };
    if !r.is_empty() {
        return Err(Malformed("trailing bytes after the edit".into()));
    }
    Ok(e)
}

/// A dictionary entry of the image.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeriesImage {
    pub key: String,
    pub registered: bool,
    pub quantum_ns: i64,
    pub expired_before: i64,
}

/// The state the edits describe.
#[derive(Clone, Debug, Default)]
pub struct Image {
    pub version: u32,
    pub series: HashMap<u32, SeriesImage>,
    pub blocks: HashMap<(u32, i64), Loc>,
    pub first_live_wal: u64,
    /// Problems met while replaying (kept going past them).
    pub problems: Vec<String>,
}

impl Image {
    /// Applies edits in order.
    pub fn apply(&mut self, e: Edit) {
        match e {
            Edit::Header { version } => self.version = self.version.max(version),
            Edit::Series { id, registered, quantum_ns, key } => {
                let s = self.series.entry(id).or_default();
                if !s.key.is_empty() && s.key != key {
                    self.problems
                        .push(format!("index names series id {id} both {:?} and {key:?}; keeping the first", s.key));
                    return;
                }
                s.key = key;
                s.registered |= registered;
                if quantum_ns != 0 {
                    s.quantum_ns = quantum_ns;
                }
            }
            Edit::Put { id, start, loc } => {
                self.blocks.insert((id, start), loc);
            }
            Edit::Expire { id, before } => {
                let s = self.series.entry(id).or_default();
                s.expired_before = s.expired_before.max(before);
            }
            Edit::Checkpoint { first_live_wal } => self.first_live_wal = self.first_live_wal.max(first_live_wal),
        }
    }

    /// Drops blocks behind retention watermarks or of unknown series.
    pub fn finish(&mut self) {
        let series = &self.series;
        let mut orphans = 0;
        self.blocks.retain(|(id, start), _| match series.get(id) {
            Some(s) => {
                let len = QuantumLen::new(s.quantum_ns).map(|l| l.ns()).unwrap_or(0);
                len > 0 && start.saturating_add(len) > s.expired_before
            }
            None => {
                orphans += 1;
                false
            }
        });
        if orphans > 0 {
            self.problems.push(format!(
                "{orphans} indexed blocks belong to series missing from the dictionary and were ignored"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_proto::Point;

    #[test]
    fn edits_round_trip_and_replay() {
        let summary = Summary::of(&[Point::new(5, 1.0)]).unwrap();
        let loc = Loc { seg: 2, offset: 99, len: 40, summary };
        let edits = vec![
            Edit::Header { version: 1 },
            Edit::Series { id: 0, registered: true, quantum_ns: 1_000_000, key: "m{a=1}".into() },
            Edit::Put { id: 0, start: 0, loc },
            Edit::Put { id: 0, start: 1_000_000, loc },
            Edit::Expire { id: 0, before: 1_000_000 },
            Edit::Checkpoint { first_live_wal: 7 },
        ];
        let mut out = Vec::new();
        for e in &edits {
            put(&mut out, e);
        }
        let s = frame::scan(&out, MAGIC);
        let got: Vec<Edit> = s.frames.iter().map(|f| decode(f.kind, f.body).unwrap()).collect();
        assert_eq!(got, edits);
        let mut img = Image::default();
        for e in got {
            img.apply(e);
        }
        img.finish();
        assert_eq!(img.first_live_wal, 7);
        assert_eq!(img.blocks.len(), 1, "the expired block is gone");
        assert!(img.blocks.contains_key(&(0, 1_000_000)));
    }
}

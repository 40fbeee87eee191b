//! The index log `index.log`: the durable catalogue of the series dictionary, of where the
//! frames of each sealed block live with their summaries, of retention watermarks, dropped
//! blocks, and of the log checkpoint. Pure encode/decode of its edits plus replay into an
//! [`Image`].
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
/// Format 2: a block's frames change (checkpoint fragments and their merges).
const KIND_FRAMES: u8 = 6;
/// Format 2: a block was dropped (the store's conditional drop).
const KIND_DROP: u8 = 7;

/// The oldest format that reads an edit: edits of kind 6 and 7 need format 2.
pub fn format_of(e: &Edit) -> u32 {
    match e {
        Edit::Frames { .. } | Edit::Drop { .. } => 2,
        _ => 1,
    }
}

/// Where one frame of a sealed block lives, with the summary of that frame's points.
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
    /// The block (series, quantum start) is now the one frame at `loc` (latest wins).
    Put {
        id: u32,
        start: i64,
        loc: Loc,
    },
    /// The block's frames become its first `keep` frames followed by `locs` (oldest first).
    Frames {
        id: u32,
        start: i64,
        keep: u32,
        locs: Vec<Loc>,
    },
    /// The block is gone, and points of it in log segments before `wal_seq` are dropped on
    /// replay.
    Drop {
        id: u32,
        start: i64,
        wal_seq: u64,
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
            put_loc(o, loc, *start);
        }),
        Edit::Frames { id, start, keep, locs } => frame::put_with(out, MAGIC, KIND_FRAMES, |o| {
            frame::put_varint(o, u64::from(*id));
            o.extend_from_slice(&start.to_le_bytes());
            frame::put_varint(o, u64::from(*keep));
            frame::put_varint(o, locs.len() as u64);
            for loc in locs {
                put_loc(o, loc, *start);
            }
        }),
        Edit::Drop { id, start, wal_seq } => frame::put_with(out, MAGIC, KIND_DROP, |o| {
            frame::put_varint(o, u64::from(*id));
            o.extend_from_slice(&start.to_le_bytes());
            o.extend_from_slice(&wal_seq.to_le_bytes());
        }),
        Edit::Expire { id, before } => frame::put_with(out, MAGIC, KIND_EXPIRE, |o| {
            o.extend_from_slice(&id.to_le_bytes());
            o.extend_from_slice(&before.to_le_bytes());
        }),
        Edit::Checkpoint { first_live_wal } => frame::put(out, MAGIC, KIND_CHECKPOINT, &first_live_wal.to_le_bytes()),
    }
}

fn put_loc(o: &mut Vec<u8>, loc: &Loc, base: i64) {
    frame::put_varint(o, u64::from(loc.seg));
    frame::put_varint(o, loc.offset);
    frame::put_varint(o, u64::from(loc.len));
    put_summary(o, &loc.summary, base);
}

fn get_u32(r: &mut Reader<'_>, what: &str) -> Result<u32, Malformed> {
    u32::try_from(r.varint()?).map_err(|_| Malformed(format!("{what} over 32 bits")))
}

fn get_loc(r: &mut Reader<'_>, base: i64) -> Result<Loc, Malformed> {
    let seg = get_u32(r, "segment")?;
    let offset = r.varint()?;
    let len = get_u32(r, "block length")?;
    let summary = get_summary(r, base)?;
    Ok(Loc { seg, offset, len, summary })
}

/// Most frames one edit lists (a block holds far fewer; this only bounds a damaged count).
const MAX_FRAMES_PER_EDIT: u64 = 1 << 20;

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
            let id = get_u32(&mut r, "series id")?;
            let start = r.i64()?;
            Edit::Put { id, start, loc: get_loc(&mut r, start)? }
        }
        KIND_FRAMES => {
            let id = get_u32(&mut r, "series id")?;
            let start = r.i64()?;
            let keep = get_u32(&mut r, "kept frames")?;
            let n = r.varint()?;
            if n > MAX_FRAMES_PER_EDIT {
                return Err(Malformed(format!("edit claims {n} frames")));
            }
            let locs = (0..n).map(|_| get_loc(&mut r, start)).collect::<Result<Vec<Loc>, _>>()?;
            Edit::Frames { id, start, keep, locs }
        }
        KIND_DROP => {
            let id = get_u32(&mut r, "series id")?;
            Edit::Drop { id, start: r.i64()?, wal_seq: r.u64()? }
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
    /// The frames of each block, oldest first.
    pub blocks: HashMap<(u32, i64), Vec<Loc>>,
    /// Dropped blocks: their points in log segments before the value are not replayed.
    pub dropped: HashMap<(u32, i64), u64>,
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
                self.blocks.insert((id, start), vec![loc]);
            }
            Edit::Frames { id, start, keep, locs } => {
                let frames = self.blocks.entry((id, start)).or_default();
                if keep as usize > frames.len() {
                    self.problems.push(format!(
                        "index: series id {id} quantum {start} keeps {keep} frames but {} are known (an \
                         earlier edit was lost); keeping those",
                        frames.len()
                    ));
                }
                frames.truncate(keep as usize);
                frames.extend(locs);
                if frames.is_empty() {
                    self.blocks.remove(&(id, start));
                }
            }
            Edit::Drop { id, start, wal_seq } => {
                self.blocks.remove(&(id, start));
                let d = self.dropped.entry((id, start)).or_default();
                *d = (*d).max(wal_seq);
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
            Edit::Put { id: 0, start: 2_000_000, loc },
            Edit::Frames { id: 0, start: 2_000_000, keep: 1, locs: vec![loc, loc] },
            Edit::Frames { id: 0, start: 2_000_000, keep: 2, locs: vec![loc] },
            Edit::Frames { id: 0, start: 3_000_000, keep: 0, locs: vec![loc, loc] },
            Edit::Drop { id: 0, start: 3_000_000, wal_seq: 9 },
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
        assert_eq!(img.blocks.len(), 2, "the expired and the dropped block are gone");
        assert_eq!(img.blocks[&(0, 1_000_000)].len(), 1);
        assert_eq!(img.blocks[&(0, 2_000_000)].len(), 3, "the frames edits keep a prefix and add");
        assert_eq!(img.dropped[&(0, 3_000_000)], 9);
    }
}

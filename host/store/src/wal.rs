//! The write-ahead log: its record format (pure functions) and the group-commit writer.
//!
//! The log is a sequence of segment files `wal/<seq>.wal`, each a sequence of frames (see
//! FORMAT.md): a header, series definitions, and point records. A segment defines every
//! series id it uses before using it, so each segment can be replayed on its own and deleted on
//! its own once its points are sealed.
//!
//! Group commit: writers queue their records; whoever finds no flush in progress becomes the
//! leader, takes everything queued, appends it with one write and one fsync, and wakes the
//! others. Concurrent writers therefore share one fsync. After a failed append the leader cuts
//! the torn bytes off and the next group starts a fresh segment, so a failure never leaves
//! damage between acknowledged records.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey};

use crate::backend::{Backend, io_error};
use crate::frame::{self, Malformed, Reader};
use crate::{FsyncPolicy, StoreError};

/// Magic of WAL frames.
pub const MAGIC: [u8; 4] = *b"\xA7WAL";
/// Version written in each segment header.
pub const VERSION: u32 = 1;
/// Most points in one point record; larger blocks are split over several records.
pub const MAX_RECORD_POINTS: usize = 1 << 16;
/// Queued bytes above which new writers wait for the current flush (bounds memory).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

const KIND_HEADER: u8 = 1;
const KIND_SERIES: u8 = 2;
const KIND_POINTS: u8 = 3;

/// A decoded log record.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// First record of a segment.
    Header { version: u32, seq: u64 },
    /// Series `id` is `key`; `registered` when it was registered (not only written).
    Series { id: u32, registered: bool, key: String },
    /// Points of series `id` in `quantum`.
    Points { id: u32, quantum: Quantum, points: Vec<Point> },
}

/// Appends a segment header.
pub fn put_header(out: &mut Vec<u8>, seq: u64) {
    frame::put_with(out, MAGIC, KIND_HEADER, |o| {
        o.extend_from_slice(&VERSION.to_le_bytes());
        o.extend_from_slice(&seq.to_le_bytes());
    });
}

/// Appends a series definition.
pub fn put_series(out: &mut Vec<u8>, id: u32, registered: bool, key: &SeriesKey) {
    frame::put_with(out, MAGIC, KIND_SERIES, |o| {
        o.extend_from_slice(&id.to_le_bytes());
        o.push(u8::from(registered));
        let k = key.as_str().as_bytes();
        o.extend_from_slice(&(k.len() as u16).to_le_bytes());
        o.extend_from_slice(k);
    });
}

/// Appends the points of one block, split into records of at most [`MAX_RECORD_POINTS`].
/// Timestamps are zigzag varint deltas (the first from the quantum start), events varints,
/// values raw f64 bits: cheap to encode on the ingest path, about 11 bytes per regular point.
pub fn put_points(out: &mut Vec<u8>, id: u32, quantum: Quantum, points: &[Point]) {
    for chunk in points.chunks(MAX_RECORD_POINTS) {
        frame::put_with(out, MAGIC, KIND_POINTS, |o| {
            o.extend_from_slice(&id.to_le_bytes());
            o.extend_from_slice(&quantum.start.to_le_bytes());
            o.extend_from_slice(&quantum.len.ns().to_le_bytes());
            o.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            let mut prev = quantum.start;
            for p in chunk {
                frame::put_varint(o, frame::zigzag(p.ts.wrapping_sub(prev)));
                frame::put_varint(o, p.event);
                o.extend_from_slice(&p.value.to_bits().to_le_bytes());
                prev = p.ts;
            }
        });
    }
}

/// Decodes one frame's kind and body.
pub fn decode(kind: u8, body: &[u8]) -> Result<Record, Malformed> {
    let mut r = Reader::new(body);
    let rec = match kind {
        KIND_HEADER => Record::Header { version: r.u32()?, seq: r.u64()? },
        KIND_SERIES => {
            let id = r.u32()?;
            let registered = r.u8()? != 0;
            let n = r.u16()? as usize;
            let key =
                std::str::from_utf8(r.take(n)?).map_err(|_| Malformed("series key is not UTF-8".into()))?.to_string();
            Record::Series { id, registered, key }
        }
        KIND_POINTS => {
            let id = r.u32()?;
            let start = r.i64()?;
            let len = QuantumLen::new(r.i64()?).map_err(|e| Malformed(e.to_string()))?;
            let quantum =
                Quantum::at(start, len).ok_or_else(|| Malformed(format!("unaligned quantum start {start}")))?;
            let n = r.u32()? as usize;
            if n > MAX_RECORD_POINTS {
                return Err(Malformed(format!("record claims {n} points")));
            }
            let mut points = Vec::with_capacity(n);
            let mut prev = start;
            for _ in 0..n {
                let ts = prev.wrapping_add(frame::unzigzag(r.varint()?));
                let event = r.varint()?;
                let value = r.f64()?;
                if !quantum.contains(ts) {
                    return Err(Malformed(format!("point at {ts} outside its quantum")));
                }
                points.push(Point { ts, value, event });
                prev = ts;
            }
            Record::Points { id, quantum, points }
        }
        k => return Err(Malformed(format!("unknown record kind {k}"))),
    };
    if !r.is_empty() {
        return Err(Malformed("trailing bytes after the record".into()));
    }
    Ok(rec)
}

/// Path of segment `seq`.
pub fn segment_path(seq: u64) -> String {
    format!("wal/{seq:020}.wal")
}

/// The sequence number of a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    name.strip_suffix(".wal")?.parse().ok()
}

/// A series definition a queued write needs in its segment.
#[derive(Debug, Clone)]
pub(crate) struct Def {
    pub id: u32,
    pub registered: bool,
    pub key: SeriesKey,
}

// An append failure, kept so every writer of the group gets the same error.
#[derive(Debug, Clone)]
struct Failure {
    context: String,
    kind: std::io::ErrorKind,
    msg: String,
}

type GroupResult = Arc<OnceLock<Result<u64, Failure>>>;

#[derive(Debug)]
struct Shared {
    queued: Vec<u8>,
    queued_defs: Vec<Def>,
    queued_writers: usize,
    group: GroupResult,
    leading: bool,
    // The segment a flush in progress writes to.
    inflight: Option<u64>,
    // Owned by the leader: the segment being appended to.
    seq: u64,
    seq_len: u64,
    defined: HashMap<u32, bool>,
    start_new: bool,
    /// Live segments and their sizes in bytes.
    segments: BTreeMap<u64, u64>,
    // Durable but not yet applied writes, per segment: checkpoints keep those segments.
    unapplied: BTreeMap<u64, usize>,
}

/// The group-commit log writer.
#[derive(Debug)]
pub(crate) struct Wal {
    backend: Arc<dyn Backend>,
    fsync: FsyncPolicy,
    /// A flush that leaves the segment this large makes the next one start a new segment, so
    /// segments stay near this size however far maintenance lags behind.
    segment_bytes: u64,
    shared: Mutex<Shared>,
    cond: Condvar,
}

impl Wal {
    /// A writer that starts a new segment after `last_seq`, and a new one whenever a segment
    /// reaches `segment_bytes`; `segments` are the live ones with their sizes.
    pub fn new(
        backend: Arc<dyn Backend>,
        fsync: FsyncPolicy,
        segment_bytes: u64,
        last_seq: u64,
        segments: BTreeMap<u64, u64>,
    ) -> Wal {
        Wal {
            backend,
            fsync,
            segment_bytes,
            shared: Mutex::new(Shared {
                queued: Vec::new(),
                queued_defs: Vec::new(),
                queued_writers: 0,
                group: GroupResult::default(),
                leading: false,
                inflight: None,
                seq: last_seq,
                seq_len: 0,
                defined: HashMap::new(),
                start_new: true,
                segments,
                unapplied: BTreeMap::new(),
            }),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `data` (point records) after the definitions in `defs`, returning once durable
    /// per the fsync policy, with the segment it landed in. The caller must call
    /// [`Wal::applied`] with that segment once it applied the write to memory.
    pub fn commit(&self, defs: Vec<Def>, data: &[u8]) -> Result<u64, StoreError> {
        let mut g = self.lock();
        while g.queued.len() > MAX_QUEUED_BYTES {
            g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.queued.extend_from_slice(data);
        g.queued_defs.extend(defs);
        g.queued_writers += 1;
        let mine = g.group.clone();
        loop {
            if let Some(r) = mine.get() {
                return r.clone().map_err(|f| io_error(f.context, std::io::Error::new(f.kind, f.msg)));
            }
            if !g.leading {
                g = self.lead(g);
                continue;
            }
            g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn lead<'a>(&'a self, mut g: MutexGuard<'a, Shared>) -> MutexGuard<'a, Shared> {
        g.leading = true;
        let data = std::mem::take(&mut g.queued);
        let defs = std::mem::take(&mut g.queued_defs);
        let writers = std::mem::replace(&mut g.queued_writers, 0);
        let group = std::mem::take(&mut g.group);
        let mut out = Vec::with_capacity(data.len() + 256);
        if g.start_new {
            g.seq += 1;
            g.seq_len = 0;
            g.defined.clear();
            g.start_new = false;
        }
        let new_segment = g.seq_len == 0;
        if new_segment {
            put_header(&mut out, g.seq);
        }
        let mut defined = std::mem::take(&mut g.defined);
        for d in &defs {
            let have = defined.get(&d.id).copied();
            if have.is_none() || (d.registered && have == Some(false)) {
                put_series(&mut out, d.id, d.registered, &d.key);
                defined.insert(d.id, d.registered || have == Some(true));
            }
        }
        out.extend_from_slice(&data);
        let (seq, at) = (g.seq, g.seq_len);
        let path = segment_path(seq);
        g.inflight = Some(seq);
        drop(g);

        // The I/O, with no lock held: writers keep queueing meanwhile.
        let mut result = self.backend.append(&path, &out).map(|_| ());
        if result.is_ok() && self.fsync == FsyncPolicy::Durable {
            result = self.backend.sync(&path);
        }
        if result.is_err() {
            // Best effort: cut the torn tail. Either way the next group starts a new segment.
            let _ = self.backend.truncate(&path, at);
        }

        let mut g = self.lock();
        match result {
            Ok(()) => {
                g.seq_len += out.len() as u64;
                if g.seq_len >= self.segment_bytes {
                    g.start_new = true;
                }
                g.defined = defined;
                *g.segments.entry(seq).or_default() += out.len() as u64;
                *g.unapplied.entry(seq).or_default() += writers;
                let _ = group.set(Ok(seq));
            }
            Err(e) => {
                g.start_new = true;
                if new_segment && at == 0 {
                    // Nothing of this segment was acknowledged; it may not even exist.
                    let _ = self.backend.remove(&path);
                } else {
                    g.segments.entry(seq).or_insert(at);
                }
                let _ = group.set(Err(Failure {
                    context: format!(
                        "appending {} bytes to the write-ahead log {path}; the write was not stored",
                        out.len()
                    ),
                    kind: e.kind(),
                    msg: e.to_string(),
                }));
            }
        }
        g.leading = false;
        g.inflight = None;
        self.cond.notify_all();
        g
    }

    /// A write that landed in segment `seq` is now applied to memory.
    pub fn applied(&self, seq: u64) {
        let mut g = self.lock();
        if let Some(n) = g.unapplied.get_mut(&seq) {
            *n -= 1;
            if *n == 0 {
                g.unapplied.remove(&seq);
            }
        }
    }

    /// The oldest segment a checkpoint must keep: one holding writes not yet applied to
    /// memory, one being flushed, or the one the next flush appends to.
    pub fn first_pinned(&self) -> u64 {
        let g = self.lock();
        let next = if g.start_new { g.seq + 1 } else { g.seq };
        [g.unapplied.keys().next().copied(), g.inflight, Some(next)].into_iter().flatten().min().unwrap_or(next)
    }

    /// Live segment numbers.
    pub fn segments(&self) -> Vec<u64> {
        self.lock().segments.keys().copied().collect()
    }

    /// Bytes in live segments.
    pub fn bytes(&self) -> u64 {
        self.lock().segments.values().sum()
    }

    /// When the log holds more than `max_bytes`: the segment from which on the newest segments
    /// hold at most half of it (never past the newest), so that checkpointing the points
    /// logged before it brings the log back under the bound.
    pub fn cut_for(&self, max_bytes: u64) -> Option<u64> {
        let g = self.lock();
        if g.segments.values().sum::<u64>() <= max_bytes {
            return None;
        }
        let newest = *g.segments.keys().next_back()?;
        let mut newer = 0u64;
        for (&seq, &bytes) in g.segments.iter().rev() {
            newer += bytes;
            if newer > max_bytes / 2 {
                return Some((seq + 1).min(newest));
            }
        }
        Some(newest)
    }

    /// Makes the next flush start a new segment and returns its number: every write logged
    /// from now on lands in it or later.
    pub fn rotate_boundary(&self) -> u64 {
        let mut g = self.lock();
        g.start_new = true;
        g.seq + 1
    }

    /// Bytes in the current segment.
    pub fn current_len(&self) -> u64 {
        self.lock().seq_len
    }

    /// The next flush starts a new segment (so the current one can be checkpointed away).
    /// Returns whether that changed anything.
    pub fn rotate(&self) -> bool {
        let mut g = self.lock();
        let changed = !g.start_new && g.seq_len > 0;
        g.start_new = true;
        changed
    }

    /// Deletes the segments before `first_live` that nothing pins.
    pub fn remove_before(&self, first_live: u64) -> Result<u64, StoreError> {
        let doomed: Vec<u64> = {
            let limit = first_live.min(self.first_pinned());
            let g = self.lock();
            g.segments.range(..limit).map(|(&s, _)| s).collect()
        };
        let mut removed = 0;
        for seq in doomed {
            let path = segment_path(seq);
            self.backend.remove(&path).map_err(|e| io_error(format!("removing checkpointed log segment {path}"), e))?;
            self.lock().segments.remove(&seq);
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Records decode to what was encoded, including unsorted points and many events at
        /// one timestamp.
        #[test]
        fn records_round_trip(pts in proptest::collection::vec((0i64..1_000_000, any::<u64>(), any::<u64>()), 0..200)) {
            let q = Quantum::at(5_000_000, QuantumLen::new(1_000_000).unwrap()).unwrap();
            let points: Vec<Point> = pts.iter().map(|&(t, e, v)| Point { ts: q.start + t, event: e, value: f64::from_bits(v) }).collect();
            let key: SeriesKey = "m{a=1}".parse().unwrap();
            let mut out = Vec::new();
            put_header(&mut out, 9);
            put_series(&mut out, 3, true, &key);
            put_points(&mut out, 3, q, &points);
            let s = frame::scan(&out, MAGIC);
            prop_assert!(s.skipped.is_empty());
            let recs: Vec<Record> = s.frames.iter().map(|f| decode(f.kind, f.body).unwrap()).collect();
            prop_assert_eq!(&recs[0], &Record::Header { version: VERSION, seq: 9 });
            prop_assert_eq!(&recs[1], &Record::Series { id: 3, registered: true, key: key.to_string() });
            let mut got = Vec::new();
            for r in &recs[2..] {
                match r {
                    Record::Points { id: 3, quantum, points } if *quantum == q => got.extend(points.iter().map(|p| p.key())),
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            prop_assert_eq!(got, points.iter().map(|p| p.key()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn concurrent_writers_share_fsyncs_and_all_land() {
        let b = crate::faulty_disk::FaultyDisk::new();
        b.set_sync_delay(std::time::Duration::from_millis(2));
        let wal = Arc::new(Wal::new(Arc::new(b.clone()), FsyncPolicy::Durable, u64::MAX, 0, BTreeMap::new()));
        let q = Quantum::at(0, QuantumLen::new(1_000_000).unwrap()).unwrap();
        let key: SeriesKey = "m".parse().unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let wal = wal.clone();
                let key = key.clone();
                s.spawn(move || {
                    for i in 0..50u64 {
                        let mut data = Vec::new();
                        put_points(&mut data, 0, q, &[Point { ts: (i % 1000) as i64, value: 0.0, event: t }]);
                        let seq = wal.commit(vec![Def { id: 0, registered: false, key: key.clone() }], &data).unwrap();
                        wal.applied(seq);
                    }
                });
            }
        });
        let bytes = b.read_all(&segment_path(1)).unwrap();
        let s = frame::scan(&bytes, MAGIC);
        let recs: Vec<Record> = s.frames.iter().map(|f| decode(f.kind, f.body).unwrap()).collect();
        let points = recs.iter().filter(|r| matches!(r, Record::Points { .. })).count();
        let defs = recs.iter().filter(|r| matches!(r, Record::Series { .. })).count();
        assert_eq!(points, 200);
        // 200 commits; while one fsync runs the other writers queue and share the next.
        assert!(b.syncs() < 150, "{} fsyncs for 200 commits", b.syncs());
        assert_eq!(defs, 1, "a segment defines each series once");
        assert_eq!(wal.first_pinned(), 1);
        assert!(wal.rotate());
        assert_eq!(wal.first_pinned(), 2);
        assert_eq!(wal.remove_before(2).unwrap(), 1);
    }
}

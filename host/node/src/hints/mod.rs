//! Hinted handoff: writes a replica missed (it was down, overloaded, timed out, or failed),
//! kept durably by the coordinator and replayed once the view says the replica is up again
//! ([`replay`]).
//!
//! Hints live in `<data_dir>/hints/`, in append-only segment files per target node named
//! `<target id>-<sequence>.hint`. Each hint is one frame, `magic "TSH1" | len u32 | crc32c u32 |
//! body` (little-endian; the CRC covers the body, a postcard [`Hint`]), so a torn tail or a
//! damaged frame is skipped and counted, and the rest still replays. Appends are synced in
//! batches ([`Hints::sync`], called by a background task). A segment is replayed whole and
//! deleted once every hint in it was stored; new hints meanwhile go to a new segment.
//!
//! Bounds: hints older than `max_age` are dropped (at replay, and whole segments by
//! [`Hints::expire`]); a hint that would take the total over `max_bytes` is dropped at once.
//! Every dropped hint is counted: anti-entropy repairs what it held.

pub mod replay;

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use timeshard_proto::wire::BlockPoints;
use timeshard_proto::{Id, SeriesKey};
use tracing::warn;

use crate::config::HintsConfig;

const MAGIC: [u8; 4] = *b"TSH1";
const HEADER: usize = 12;
/// A segment takes no more hints past this size, so a replay reads a bounded file.
const SEGMENT_MAX_BYTES: u64 = 8 << 20;
/// Largest frame body read back; bounds what a damaged length field can make replay allocate.
const MAX_BODY: usize = 64 << 20;

/// What a replica missed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HintPayload {
    /// Points of blocks, as a `Store` request carries them.
    Blocks(Vec<BlockPoints>),
    /// Registrations in the series dictionary, as a `RegisterSeries` request carries them.
    Registrations(Vec<SeriesKey>),
}

impl HintPayload {
    /// Points it carries (registrations count as none).
    pub fn points(&self) -> usize {
        match self {
            HintPayload::Blocks(b) => b.iter().map(|b| b.points.len()).sum(),
            HintPayload::Registrations(_) => 0,
        }
    }
}

/// One hint as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hint {
    /// When the write was missed, in nanoseconds since the Unix epoch.
    pub created_ns: i64,
    pub payload: HintPayload,
}

/// The hint store could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum HintError {
    #[error("hint file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode a hint: {0}")]
    Encode(#[from] postcard::Error),
}

/// One segment file of one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Segment {
    pub target: Id,
    pub seq: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct SegmentInfo {
    bytes: u64,
    hints: u64,
    newest_ns: i64,
}

#[derive(Debug)]
struct Open {
    seq: u64,
    file: File,
    dirty: bool,
}

#[derive(Debug, Default)]
struct State {
    segments: BTreeMap<Segment, SegmentInfo>,
    /// The segment each target appends to.
    open: HashMap<Id, Open>,
    next_seq: u64,
    bytes: u64,
    hints: u64,
}

/// The hints this node holds for other nodes.
#[derive(Debug)]
pub struct Hints {
    dir: PathBuf,
    cfg: HintsConfig,
    state: Mutex<State>,
    replayed: AtomicU64,
    dropped: AtomicU64,
}

/// The frames of a segment's bytes: the intact ones, and how many damaged stretches were
/// skipped (a torn tail counts as one).
fn parse_frames(bytes: &[u8]) -> (Vec<&[u8]>, u64) {
    let mut frames = Vec::new();
    let mut damaged = 0;
    let mut at = 0;
    let mut in_garbage = false;
    while at + HEADER <= bytes.len() {
        if let Some(body) = frame_at(bytes, at) {
            frames.push(body);
            at += HEADER + body.len();
            in_garbage = false;
            continue;
        }
        // A damaged frame counts once, and so does a stretch of bytes that starts none.
        if bytes[at..].starts_with(&MAGIC) || !in_garbage {
            damaged += 1;
        }
        in_garbage = true;
        // Resynchronise on the next magic.
        at += 1;
        match bytes[at..].windows(4).position(|w| w == MAGIC) {
            Some(p) => at += p,
            None => return (frames, damaged),
        }
    }
    if at < bytes.len() && (bytes[at..].starts_with(&MAGIC) || !in_garbage) {
        damaged += 1;
    }
    (frames, damaged)
}

fn frame_at(bytes: &[u8], at: usize) -> Option<&[u8]> {
    let head = bytes.get(at..at + HEADER)?;
    if head[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[8..12].try_into().ok()?);
    if len > MAX_BODY {
        return None;
    }
    let body = bytes.get(at + HEADER..at + HEADER + len)?;
    (crc32c::crc32c(body) == crc).then_some(body)
}

fn encode_frame(hint: &Hint) -> Result<Vec<u8>, postcard::Error> {
    let mut out = postcard::to_extend(hint, vec![0u8; HEADER])?;
    let len = (out.len() - HEADER) as u32;
    let crc = crc32c::crc32c(&out[HEADER..]);
    out[..4].copy_from_slice(&MAGIC);
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

fn segment_name(s: &Segment) -> String {
    format!("{}-{:016x}.hint", s.target.to_hex(), s.seq)
}

fn parse_name(name: &str) -> Option<Segment> {
    let stem = name.strip_suffix(".hint")?;
    let (target, seq) = stem.split_once('-')?;
    Some(Segment { target: target.parse().ok()?, seq: u64::from_str_radix(seq, 16).ok()? })
}

impl Hints {
    /// Opens (creating it if needed) the hint directory `dir` and indexes the hints in it.
    /// Damaged frames are counted as dropped; files holding no intact hint are removed.
    pub fn open(dir: &Path, cfg: HintsConfig) -> Result<Hints, HintError> {
        let io = |source| HintError::Io { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let hints =
            Hints { dir: dir.to_path_buf(), cfg, state: Mutex::default(), replayed: 0.into(), dropped: 0.into() };
        let mut state = State::default();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some(segment) = name.to_str().and_then(parse_name) else { continue };
            let (records, damaged) = hints.read(&segment)?;
            hints.dropped.fetch_add(damaged, Ordering::Relaxed);
            let bytes = entry.metadata().map_err(io)?.len();
            if records.is_empty() {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let info = SegmentInfo {
                bytes,
                hints: records.len() as u64,
                newest_ns: records.iter().map(|h| h.created_ns).max().unwrap_or(0),
            };
            state.bytes += bytes;
            state.hints += info.hints;
            state.next_seq = state.next_seq.max(segment.seq + 1);
            state.segments.insert(segment, info);
        }
        *hints.state.lock().expect("hints lock") = state;
        Ok(hints)
    }

    fn path(&self, s: &Segment) -> PathBuf {
        self.dir.join(segment_name(s))
    }

    /// Keeps `payload` for `target`, missed at `now_ns`. Returns false if it was dropped
    /// because the hints would exceed `max_bytes`. The hint is durable after the next
    /// [`Hints::sync`]. A hint that cannot be kept (the error) is counted as dropped too, so
    /// no lost hint goes unseen.
    pub fn add(&self, target: Id, payload: HintPayload, now_ns: i64) -> Result<bool, HintError> {
        let kept = self.keep(target, payload, now_ns);
        if kept.is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        kept
    }

    fn keep(&self, target: Id, payload: HintPayload, now_ns: i64) -> Result<bool, HintError> {
        let frame = encode_frame(&Hint { created_ns: now_ns, payload })?;
        let len = frame.len() as u64;
        let mut state = self.state.lock().expect("hints lock");
        if state.bytes + len > self.cfg.max_bytes {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let full = state.open.get(&target).is_some_and(|o| {
            state.segments.get(&Segment { target, seq: o.seq }).is_some_and(|i| i.bytes + len > SEGMENT_MAX_BYTES)
        });
        if full {
            self.close_open(&mut state, &target)?;
        }
        if !state.open.contains_key(&target) {
            let segment = Segment { target, seq: state.next_seq };
            state.next_seq += 1;
            let path = self.path(&segment);
            let file = OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)
                .map_err(|source| HintError::Io { path, source })?;
            state.open.insert(target, Open { seq: segment.seq, file, dirty: false });
            state.segments.insert(segment, SegmentInfo::default());
        }
        let open = state.open.get_mut(&target).expect("just opened");
        let segment = Segment { target, seq: open.seq };
        if let Err(source) = open.file.write_all(&frame) {
            // A partial frame is skipped as damage at replay; start a new segment after it.
            let path = self.path(&segment);
            let _ = self.close_open(&mut state, &target);
            return Err(HintError::Io { path, source });
        }
        open.dirty = true;
        let info = state.segments.entry(segment).or_default();
        info.bytes += len;
        info.hints += 1;
        info.newest_ns = info.newest_ns.max(now_ns);
        state.bytes += len;
        state.hints += 1;
        Ok(true)
    }

    /// Stops appending to `target`'s open segment (syncing it first).
    fn close_open(&self, state: &mut State, target: &Id) -> Result<(), HintError> {
        if let Some(open) = state.open.remove(target)
            && open.dirty
        {
            let path = self.path(&Segment { target: *target, seq: open.seq });
            open.file.sync_data().map_err(|source| HintError::Io { path, source })?;
        }
        Ok(())
    }

    /// Makes every hint added so far durable.
    pub fn sync(&self) -> Result<(), HintError> {
        let mut state = self.state.lock().expect("hints lock");
        let dirty: Vec<(Id, u64)> = state.open.iter().filter(|(_, o)| o.dirty).map(|(t, o)| (*t, o.seq)).collect();
        for (target, seq) in dirty {
            let open = state.open.get_mut(&target).expect("listed above");
            open.file.sync_data().map_err(|source| HintError::Io {
                path: self.dir.join(segment_name(&Segment { target, seq })),
                source,
            })?;
            open.dirty = false;
        }
        Ok(())
    }

    /// Targets that have hints waiting.
    pub fn targets(&self) -> Vec<Id> {
        let state = self.state.lock().expect("hints lock");
        let mut targets: Vec<Id> = state.segments.keys().map(|s| s.target).collect();
        targets.dedup();
        targets
    }

    /// The segments of `target` to replay, oldest first. Its open segment is closed, so hints
    /// added from now on go to a new one.
    pub fn take(&self, target: &Id) -> Result<Vec<Segment>, HintError> {
        let mut state = self.state.lock().expect("hints lock");
        self.close_open(&mut state, target)?;
        let from = Segment { target: *target, seq: 0 };
        let to = Segment { target: *target, seq: u64::MAX };
        Ok(state.segments.range(from..=to).map(|(s, _)| *s).collect())
    }

    /// The intact hints of `segment` in the order written, and how many damaged stretches
    /// were skipped.
    pub fn read(&self, segment: &Segment) -> Result<(Vec<Hint>, u64), HintError> {
        let path = self.path(segment);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(source) => return Err(HintError::Io { path, source }),
        };
        let (frames, mut damaged) = parse_frames(&bytes);
        let mut hints = Vec::with_capacity(frames.len());
        for body in frames {
            match postcard::from_bytes::<Hint>(body) {
                Ok(h) => hints.push(h),
                Err(e) => {
                    warn!(file = %path.display(), error = %e, "hint does not decode; dropped");
                    damaged += 1;
                }
            }
        }
        Ok((hints, damaged))
    }

    /// Whether a hint created at `created_ns` is too old to replay at `now_ns`.
    pub fn expired(&self, created_ns: i64, now_ns: i64) -> bool {
        let max_age = i64::try_from(self.cfg.max_age.as_nanos()).unwrap_or(i64::MAX);
        now_ns.saturating_sub(created_ns) > max_age
    }

    /// Removes `segment` after a replay: `replayed` of its hints were stored by the target,
    /// `dropped` were skipped (too old, damaged).
    pub fn finish(&self, segment: &Segment, replayed: u64, dropped: u64) -> Result<(), HintError> {
        self.replayed.fetch_add(replayed, Ordering::Relaxed);
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        self.remove(segment)
    }

    fn remove(&self, segment: &Segment) -> Result<(), HintError> {
        let mut state = self.state.lock().expect("hints lock");
        if state.open.get(&segment.target).is_some_and(|o| o.seq == segment.seq) {
            state.open.remove(&segment.target);
        }
        if let Some(info) = state.segments.remove(segment) {
            state.bytes -= info.bytes;
            state.hints -= info.hints;
        }
        let path = self.path(segment);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(HintError::Io { path, source }),
        }
    }

    /// Drops every segment whose newest hint is older than `max_age` at `now_ns`, counting
    /// its hints as dropped. Returns how many hints were dropped.
    pub fn expire(&self, now_ns: i64) -> Result<u64, HintError> {
        let old: Vec<(Segment, u64)> = {
            let state = self.state.lock().expect("hints lock");
            state
                .segments
                .iter()
                .filter(|(_, i)| i.hints > 0 && self.expired(i.newest_ns, now_ns))
                .map(|(s, i)| (*s, i.hints))
                .collect()
        };
        let mut dropped = 0;
        for (segment, hints) in old {
            self.remove(&segment)?;
            self.dropped.fetch_add(hints, Ordering::Relaxed);
            dropped += hints;
        }
        Ok(dropped)
    }

    /// Hints waiting and their bytes.
    pub fn pending(&self) -> (u64, u64) {
        let state = self.state.lock().expect("hints lock");
        (state.hints, state.bytes)
    }

    /// Hints delivered since the node started.
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Hints dropped since the node started.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use timeshard_proto::{Point, QuantumLen};

    use super::*;

    const NOW: i64 = 1_700_000_000_000_000_000;

    fn cfg() -> HintsConfig {
        HintsConfig { max_bytes: 1 << 20, max_age: Duration::from_secs(3_600), ..HintsConfig::default() }
    }

    fn blocks(n: usize) -> HintPayload {
        let series: SeriesKey = "pmu.a".parse().unwrap();
        let quantum = QuantumLen::DEFAULT.quantum_of(NOW);
        let points = (0..n as i64).map(|i| Point::new(NOW + i, i as f64)).collect();
        HintPayload::Blocks(vec![BlockPoints { series, quantum, points }])
    }

    fn target(i: u8) -> Id {
        Id::sha1(&[i])
    }

    fn replay_all(hints: &Hints, t: &Id) -> Vec<Hint> {
        let mut out = Vec::new();
        for s in hints.take(t).unwrap() {
            let (h, damaged) = hints.read(&s).unwrap();
            out.extend(h.clone());
            hints.finish(&s, h.len() as u64, damaged).unwrap();
        }
        out
    }

    #[test]
    fn hints_survive_a_restart_and_are_deleted_once_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Hints::open(dir.path(), cfg()).unwrap();
        assert!(hints.add(target(1), blocks(10), NOW).unwrap());
        assert!(hints.add(target(1), HintPayload::Registrations(vec!["pmu.a".parse().unwrap()]), NOW).unwrap());
        assert!(hints.add(target(2), blocks(3), NOW).unwrap());
        hints.sync().unwrap();
        let (count, bytes) = hints.pending();
        assert_eq!(count, 3);
        drop(hints);

        let hints = Hints::open(dir.path(), cfg()).unwrap();
        assert_eq!(hints.pending(), (count, bytes));
        assert_eq!(hints.targets(), {
            let mut t = vec![target(1), target(2)];
            t.sort();
            t
        });
        // New hints after a restart go to a new segment, after the old ones.
        assert!(hints.add(target(1), blocks(1), NOW + 1).unwrap());
        let replayed = replay_all(&hints, &target(1));
        assert_eq!(replayed.len(), 3);
        assert_eq!(replayed[0].payload, blocks(10));
        assert_eq!(replayed[2].payload, blocks(1));
        assert_eq!(hints.pending().0, 1);
        assert_eq!(hints.replayed(), 3);
        replay_all(&hints, &target(2));
        assert_eq!(hints.pending(), (0, 0));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "replayed segments are deleted");
    }

    #[test]
    fn hints_beyond_the_byte_bound_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Hints::open(dir.path(), HintsConfig { max_bytes: 4_000, ..cfg() }).unwrap();
        let mut kept = 0;
        for _ in 0..20 {
            kept += usize::from(hints.add(target(1), blocks(20), NOW).unwrap());
        }
        assert!(kept > 0 && kept < 20, "kept {kept}");
        assert_eq!(hints.dropped(), 20 - kept as u64);
        assert!(hints.pending().1 <= 4_000);
    }

    #[test]
    fn a_hint_that_cannot_be_written_is_counted_as_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hints");
        std::fs::create_dir(&path).unwrap();
        let hints = Hints::open(&path, cfg()).unwrap();
        std::fs::remove_dir(&path).unwrap();
        assert!(hints.add(target(1), blocks(1), NOW).is_err());
        assert_eq!(hints.dropped(), 1, "a lost hint is seen in the dropped count");
    }

    #[test]
    fn old_hints_expire() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Hints::open(dir.path(), cfg()).unwrap();
        hints.add(target(1), blocks(5), NOW).unwrap();
        hints.take(&target(1)).unwrap();
        hints.add(target(1), blocks(5), NOW + 2_000 * 1_000_000_000).unwrap();
        let later = NOW + 3_601 * 1_000_000_000;
        assert!(hints.expired(NOW, later));
        assert!(!hints.expired(NOW + 2_000 * 1_000_000_000, later));
        assert_eq!(hints.expire(later).unwrap(), 1, "only the segment whose newest hint is too old");
        assert_eq!(hints.pending().0, 1);
        assert_eq!(hints.dropped(), 1);
    }

    #[test]
    fn a_damaged_frame_is_skipped_and_the_rest_replays() {
        let dir = tempfile::tempdir().unwrap();
        let hints = Hints::open(dir.path(), cfg()).unwrap();
        for i in 0..3 {
            hints.add(target(1), blocks(4 + i), NOW).unwrap();
        }
        hints.sync().unwrap();
        drop(hints);
        let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&file).unwrap();
        let frame = bytes.len() / 3;
        // Damage the middle frame's body, and tear the tail of the last one.
        bytes[frame + HEADER + 5] ^= 0xff;
        bytes.truncate(bytes.len() - 3);
        bytes.extend_from_slice(b"xyz");
        std::fs::write(&file, &bytes).unwrap();
        let hints = Hints::open(dir.path(), cfg()).unwrap();
        assert_eq!(hints.pending().0, 1);
        assert_eq!(hints.dropped(), 2, "the damaged frame and the torn tail");
        let replayed = replay_all(&hints, &target(1));
        assert_eq!(replayed.len(), 1);
        assert_eq!(replayed[0].payload, blocks(4));
    }

    #[test]
    fn frames_resynchronise_after_garbage() {
        let hint = Hint { created_ns: NOW, payload: blocks(2) };
        let frame = encode_frame(&hint).unwrap();
        let mut bytes = b"garbage".to_vec();
        bytes.extend_from_slice(&frame);
        bytes.extend_from_slice(&frame);
        let (frames, damaged) = parse_frames(&bytes);
        assert_eq!((frames.len(), damaged), (2, 1));
        assert_eq!(postcard::from_bytes::<Hint>(frames[1]).unwrap(), hint);
        assert_eq!(parse_frames(&frame[..frame.len() - 1]), (Vec::new(), 1));
    }
}

//! Opening a [`DiskStore`]'s directory and keeping its log short: the format check, loading the
//! index (finding sealed frames a damaged index lost), dropping orphaned segments, replaying the
//! log; and checkpoints, which cut the log once its points are sealed and listed in the index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;

use timeshard_proto::{Quantum, QuantumLen, SeriesKey};

use super::format_file::{self, Declared};
use super::write::{apply_points, ensure_series};
use super::{
    BASE_FORMAT, Block, DictEntry, DiskConfig, DiskStore, FORMAT_VERSION, Frames, Maint, SegStat, Series, State,
    parse_seg_name, seg_path,
};
use crate::backend::{Backend, io_error};
use crate::block;
use crate::frame;
use crate::index::{self, Edit, Image, Loc};
use crate::wal::{self, Def, Record};
use crate::{MaintenanceReport, StoreError};

/// What opening found on disk: the state to start from and where the log stands.
pub(super) struct Recovered {
    pub(super) state: State,
    pub(super) maint: Maint,
    /// Damage worked around while opening (the store's first health entries).
    pub(super) problems: Vec<String>,
    /// The newest log segment (or the one before the first live one when none is left).
    pub(super) last_wal_seq: u64,
    /// The log segments replayed with their sizes, which stay until a checkpoint removes them.
    pub(super) wal_segments: BTreeMap<u64, u64>,
}

/// Reads the directory behind `backend`: checks the format, loads the index (dictionary,
/// sealed blocks, watermarks, checkpoint), drops segments nothing points at and replays the
/// log. Repairs what it can (torn tails, orphans) and reports the rest as problems. Blocks of
/// several frames are due for merging as `config` says.
pub(super) fn recover(backend: &dyn Backend, config: &DiskConfig) -> Result<Recovered, StoreError> {
    let mut problems = Vec::new();
    let format = check_format(backend, &mut problems)?;
    let (mut img, mut maint) = load_index(backend, format, &mut problems)?;
    let mut st = State::default();
    load_dictionary(&img, &mut st, &mut problems);
    list_segments(backend, &mut st)?;
    let overlapping = if maint.rewrite_index {
        recover_lost_frames(backend, &st.segs, &mut img, &mut problems)
    } else {
        BTreeSet::new()
    };
    load_blocks(&img, &overlapping, config, &mut st, &mut problems);
    st.drops = img.dropped.iter().filter(|&(_, &seq)| seq > img.first_live_wal).map(|(&k, &v)| (k, v)).collect();
    drop_orphans(backend, &img, &mut st)?;
    maint.seg = st.segs.keys().next_back().map_or(1, |s| s + 1);
    let (last_seq, wal_segs) = replay_log(backend, &img, &mut st, &mut problems)?;

    for p in &problems {
        tracing::warn!(problem = %p, "store opened with a problem");
    }
    Ok(Recovered { state: st, maint, problems, last_wal_seq: last_seq, wal_segments: wal_segs })
}

/// The index: dictionary, sealed blocks, watermarks, checkpoint. Skips damaged edits (and then
/// asks for the index to be rewritten), cuts a torn tail, and creates the index when there is
/// none.
fn load_index(backend: &dyn Backend, format: u32, problems: &mut Vec<String>) -> Result<(Image, Maint), StoreError> {
    let mut img = Image::default();
    let mut maint = Maint { format, ..Maint::default() };
    match backend.read_all(index::PATH) {
        Ok(bytes) => {
            let scan = frame::scan(&bytes, index::MAGIC);
            maint.rewrite_index = !scan.skipped.is_empty();
            for (at, n) in &scan.skipped {
                problems.push(format!(
                    "{}: {n} damaged bytes at offset {at} skipped; the edits after them were read",
                    index::PATH
                ));
            }
            for f in &scan.frames {
                match index::decode(f.kind, f.body) {
                    Ok(e) => img.apply(e),
                    Err(e) => {
                        maint.rewrite_index = true;
                        problems.push(format!(
                            "{}: edit at offset {} does not decode ({e}); skipped",
                            index::PATH,
                            f.offset
                        ))
                    }
                }
            }
            if img.version > FORMAT_VERSION {
                return Err(StoreError::UnsupportedFormat {
                    path: index::PATH.into(),
                    found: img.version,
                    supported: FORMAT_VERSION,
                });
            }
            if scan.valid_len < bytes.len() {
                backend
                    .truncate(index::PATH, scan.valid_len as u64)
                    .map_err(|e| io_error(format!("cutting the torn tail of {}", index::PATH), e))?;
            }
            maint.index_len = scan.valid_len as u64;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut out = Vec::new();
            index::put(&mut out, &Edit::Header { version: maint.format });
            backend
                .append(index::PATH, &out)
                .and_then(|_| backend.sync(index::PATH))
                .map_err(|e| io_error(format!("creating {}", index::PATH), e))?;
            maint.index_len = out.len() as u64;
        }
        Err(e) => return Err(io_error(format!("reading {}", index::PATH), e)),
    }
    img.finish();
    problems.append(&mut img.problems);
    maint.first_live_wal = img.first_live_wal;

    Ok((img, maint))
}

/// The series of the index's dictionary, into `st`.
fn load_dictionary(img: &Image, st: &mut State, problems: &mut Vec<String>) {
    for (id, s) in &img.series {
        let key: SeriesKey = match s.key.parse() {
            Ok(k) => k,
            Err(e) => {
                problems.push(format!("index: series id {id} has a bad key: {e}"));
                continue;
            }
        };
        let quantum = QuantumLen::new(s.quantum_ns).ok();
        st.ids.insert(key.clone(), *id);
        st.series.insert(
            *id,
            Series {
                key,
                registered: s.registered,
                quantum,
                indexed: Some(DictEntry { registered: s.registered, quantum_ns: s.quantum_ns }),
                expired_before: s.expired_before,
                blocks: BTreeMap::new(),
            },
        );
        st.next_id = st.next_id.max(id + 1);
    }
}

/// The block segments on disk, with their sizes, into `st` (nothing live yet).
fn list_segments(backend: &dyn Backend, st: &mut State) -> Result<(), StoreError> {
    let seg_names = backend.list("blocks").map_err(|e| io_error("listing blocks/".into(), e))?;
    for name in &seg_names {
        if let Some(seg) = parse_seg_name(name) {
            let bytes = backend.len(&seg_path(seg)).map_err(|e| io_error(format!("reading {}", seg_path(seg)), e))?;
            st.segs.insert(seg, SegStat { bytes, live: 0 });
        }
    }
    Ok(())
}

/// The sealed blocks of the index, into their series in `st`, with the bytes they keep live
/// in each segment; `overlapping` blocks (frames found again after damage) are flagged.
fn load_blocks(
    img: &Image,
    overlapping: &BTreeSet<(u32, i64)>,
    config: &DiskConfig,
    st: &mut State,
    problems: &mut Vec<String>,
) {
    for (&(id, start), locs) in &img.blocks {
        let Some(s) = st.series.get_mut(&id) else {
            continue;
        };
        for loc in locs {
            match st.segs.get_mut(&loc.seg) {
                Some(seg) if loc.offset + u64::from(loc.len) <= seg.bytes => seg.live += u64::from(loc.len),
                _ => problems.push(format!(
                    "index: the block of {} at quantum {start} points past the end of {}; reading it \
                     will fail until it is re-replicated",
                    s.key,
                    seg_path(loc.seg)
                )),
            }
        }
        let mut b = Block {
            frames: Frames::from_vec(locs.clone()),
            overlap: overlapping.contains(&(id, start)),
            open_min_seg: u64::MAX,
            ..Block::default()
        };
        let ends_at = start.saturating_add(s.quantum.map_or(0, QuantumLen::ns)).saturating_add(config.seal_grace_ns);
        State::schedule_merge(&mut st.merge_due, (id, start), &mut b, ends_at, config.max_block_points);
        s.blocks.insert(start, b);
        st.blocks += 1;
        st.frames += locs.len();
    }
}

/// Segments nothing points at hold only data that is also in the log (a seal that crashed
/// before its index edit): drops them.
fn drop_orphans(backend: &dyn Backend, img: &Image, st: &mut State) -> Result<(), StoreError> {
    let referenced: BTreeSet<u32> = img.blocks.values().flatten().map(|l| l.seg).collect();
    let orphans: Vec<u32> = st.segs.keys().filter(|k| !referenced.contains(k)).copied().collect();
    for seg in orphans {
        backend.remove(&seg_path(seg)).map_err(|e| io_error(format!("removing unused {}", seg_path(seg)), e))?;
        st.segs.remove(&seg);
    }
    Ok(())
}

/// Replays the log into `st`, removing segments a checkpoint already covered. New segments
/// are numbered past every drop's boundary (a drop names the segment writes after it go to,
/// which may never have been created). Returns the newest segment number and the segments
/// replayed with their sizes.
fn replay_log(
    backend: &dyn Backend,
    img: &Image,
    st: &mut State,
    problems: &mut Vec<String>,
) -> Result<(u64, BTreeMap<u64, u64>), StoreError> {
    let mut wal_segs = BTreeMap::new();
    let newest_drop = st.drops.values().max().copied().unwrap_or(0);
    let mut last_seq = img.first_live_wal.max(newest_drop).saturating_sub(1);
    let names = backend.list("wal").map_err(|e| io_error("listing wal/".into(), e))?;
    for name in names {
        let Some(seq) = wal::parse_segment_name(&name) else {
            continue;
        };
        let path = wal::segment_path(seq);
        last_seq = last_seq.max(seq);
        if seq < img.first_live_wal {
            // Checkpointed before a crash interrupted its removal.
            backend.remove(&path).map_err(|e| io_error(format!("removing checkpointed {path}"), e))?;
            continue;
        }
        let bytes = backend.read_all(&path).map_err(|e| io_error(format!("reading log segment {path}"), e))?;
        wal_segs.insert(seq, bytes.len() as u64);
        replay_segment(st, seq, &path, &bytes, problems)?;
    }

    Ok((last_seq, wal_segs))
}

impl DiskStore {
    /// Logs again, in the current log segment, the open points of blocks that sealing left
    /// open and that hold older segments: otherwise one block that can never be sealed would
    /// keep every log segment since its first late point, and the log would grow without bound.
    /// Only blocks two segments behind are carried, so stuck points are logged again about once
    /// per segment rotation (carrying into the segment just rotated away from would rotate, and
    /// carry, at every step when the stuck points alone fill a segment).
    fn carry_stuck_forward(&self) -> Result<(), StoreError> {
        let pinned = self.wal.first_pinned();
        let todo: Vec<(u32, i64)> = {
            let st = self.read_state();
            st.dirty
                .iter()
                .filter(|(id, start)| {
                    let b = &st.series[id].blocks[start];
                    b.stuck && b.open_min_seg.saturating_add(1) < pinned
                })
                .copied()
                .collect()
        };
        for (id, start) in todo {
            let snap = {
                let mut st = self.write_state();
                let s = st.series.get_mut(&id).expect("dirty blocks exist");
                let (key, len) = (s.key.clone(), s.quantum.expect("a series with blocks has a quantum"));
                let b = s.blocks.get_mut(&start).expect("dirty blocks exist");
                b.snap_min_seg = Some(u64::MAX);
                (key, len, b.open.clone())
            };
            let (key, len, open) = snap;
            let q = Quantum::at(start, len).expect("block starts are aligned");
            let mut data = Vec::with_capacity(open.len() * 12 + 32);
            wal::put_points(&mut data, id, q, &open);
            let r = self.wal.commit(vec![Def { id, registered: false, key }], &data);
            let mut st = self.write_state();
            if let Some(b) = st.series.get_mut(&id).and_then(|s| s.blocks.get_mut(&start)) {
                let since = b.snap_min_seg.take().unwrap_or(u64::MAX);
                if let Ok(seq) = r {
                    // The snapshot is now in `seq`; points added meanwhile are in `since`.
                    b.open_min_seg = seq.min(since);
                }
            }
            drop(st);
            self.wal.applied(r?);
        }
        Ok(())
    }

    pub(super) fn checkpoint_step(&self, m: &mut Maint, report: &mut MaintenanceReport) -> Result<(), StoreError> {
        self.carry_stuck_forward()?;
        // The log's pins first, then the blocks': a write applied in between is seen by one.
        let pinned = self.wal.first_pinned();
        let (open_min, idle) = {
            let st = self.read_state();
            let open_min =
                st.dirty.iter().map(|(id, start)| st.series[id].blocks[start].open_min_seg).min().unwrap_or(u64::MAX);
            (open_min, st.dirty.is_empty())
        };
        let series_edits = self.unindexed_series(None);
        let first_live = pinned.min(open_min);
        let segs = self.wal.segments();
        if segs.first().is_some_and(|&s| s < first_live) {
            let mut edits = series_edits;
            edits.push(Edit::Checkpoint { first_live_wal: first_live });
            self.index_append(m, &edits)?;
            m.first_live_wal = first_live;
            self.mark_indexed(&edits);
            // Drops only filter the replay of segments that are now gone.
            self.write_state().drops.retain(|_, &mut before| before > first_live);
            report.wal_segments_removed += self.wal.remove_before(first_live)?;
        }
        // Rotate a big segment, or an idle one, so a later step can remove it.
        if (self.wal.current_len() > self.config.wal_segment_bytes || idle) && self.wal.rotate() {
            report.more = true;
        }
        Ok(())
    }
}

/// After damage in the index, finds the sealed frames whose edits were lost: block frames
/// name their series and quantum and carry their summary, so every block segment is scanned
/// and each frame of a (series, quantum) the index does not list is listed again. (Without
/// this a lost frame is hidden at once and deleted by the next compaction of its segment.)
/// Frames found this way may be older versions of the block, holding points its other frames
/// hold too; points are never taken out of a block (retention watermarks still apply), so
/// taking them is harmless: the block is flagged, its frames are merged at the next step, and
/// reads meanwhile take the union. Returns the flagged blocks.
fn recover_lost_frames(
    backend: &dyn Backend,
    segs: &BTreeMap<u32, SegStat>,
    img: &mut Image,
    problems: &mut Vec<String>,
) -> BTreeSet<(u32, i64)> {
    let mut found: BTreeMap<(u32, i64), Vec<(i64, Loc)>> = BTreeMap::new();
    for &seg in segs.keys() {
        let path = seg_path(seg);
        let bytes = match backend.read_all(&path) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("{path}: not read to look for blocks the damaged index lost: {e}"));
                continue;
            }
        };
        for f in frame::scan(&bytes, block::MAGIC).frames {
            let Ok(h) = block::decode_header(&bytes[f.offset..f.offset + f.len]) else {
                continue;
            };
            let (Ok(offset), Ok(len)) = (u64::try_from(f.offset), u32::try_from(f.len)) else {
                continue;
            };
            found
                .entry((h.series, h.quantum.start))
                .or_default()
                .push((h.quantum.len.ns(), Loc { seg, offset, len, summary: h.summary }));
        }
    }
    let mut recovered = 0;
    let mut overlapping = BTreeSet::new();
    for ((id, start), frames) in found {
        let Some(s) = img.series.get(&id) else {
            continue;
        };
        let listed = img.blocks.entry((id, start)).or_default();
        let before = listed.len();
        for (len, loc) in frames {
            if len != s.quantum_ns || start.saturating_add(len) <= s.expired_before {
                continue;
            }
            if !listed.iter().any(|l| l.seg == loc.seg && l.offset == loc.offset) {
                listed.push(loc);
                recovered += 1;
            }
        }
        if listed.is_empty() {
            img.blocks.remove(&(id, start));
        } else if listed.len() > 1 && listed.len() > before {
            overlapping.insert((id, start));
        }
    }
    if recovered > 0 {
        problems.push(format!(
            "{}: {recovered} sealed frames the index did not list (its edits were damaged, or they are older \
             versions) were found again in their segments",
            index::PATH
        ));
    }
    overlapping
}

/// Checks `FORMAT` (creating it for a new directory) and returns the version it declares. A
/// damaged `FORMAT` in a directory with data is rewritten, like a missing one: the index and
/// log headers still carry the version and are checked as they are read.
fn check_format(backend: &dyn Backend, problems: &mut Vec<String>) -> Result<u32, StoreError> {
    let path = format_file::PATH;
    let has_data = || -> Result<bool, StoreError> {
        let existing = backend.list("wal").map_err(|e| io_error("listing wal/".into(), e))?;
        Ok(!existing.is_empty() || backend.len(index::PATH).is_ok())
    };
    let (version, rewrite) = match backend.read_all(path) {
        Ok(bytes) => match format_file::parse(&bytes) {
            Declared::Version { version, .. } if version > FORMAT_VERSION => {
                return Err(StoreError::UnsupportedFormat {
                    path: path.into(),
                    found: version,
                    supported: FORMAT_VERSION,
                });
            }
            // A file from before the checksum gets one.
            Declared::Version { version, checked } => (version, !checked),
            Declared::Damaged(why) if has_data()? => {
                problems.push(format!("{path} is damaged: {why}; assumed format {FORMAT_VERSION} and rewrote it"));
                (FORMAT_VERSION, true)
            }
            Declared::Damaged(why) => {
                return Err(StoreError::Corrupt(format!(
                    "{path}: {why}, and there is no log or index beside it; this does not look like a \
                     timeshard data directory"
                )));
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A new directory starts at the base format; one with data but no FORMAT may hold
            // anything this build wrote.
            if has_data()? {
                problems
                    .push(format!("{path} was missing in a data directory with data; assumed format {FORMAT_VERSION}"));
                (FORMAT_VERSION, true)
            } else {
                (BASE_FORMAT, true)
            }
        }
        Err(e) => return Err(io_error(format!("reading {path}"), e)),
    };
    if rewrite {
        backend
            .write_atomic(path, format_file::body(version).as_bytes())
            .map_err(|e| io_error(format!("writing {path}"), e))?;
    }
    Ok(version)
}

fn replay_segment(
    st: &mut State,
    seq: u64,
    path: &str,
    bytes: &[u8],
    problems: &mut Vec<String>,
) -> Result<(), StoreError> {
    let scan = frame::scan(bytes, wal::MAGIC);
    for (at, n) in &scan.skipped {
        problems
            .push(format!("{path}: {n} damaged bytes at offset {at} skipped; the records after them were replayed"));
    }
    // Ids of this segment's definitions, which may differ from ours if the dictionary lost an
    // entry; map them through the key.
    let mut local: HashMap<u32, u32> = HashMap::new();
    for f in &scan.frames {
        let rec = match wal::decode(f.kind, f.body) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{path}: record at offset {} does not decode ({e}); skipped", f.offset));
                continue;
            }
        };
        match rec {
            Record::Header { version, .. } if version > wal::VERSION => {
                return Err(StoreError::UnsupportedFormat {
                    path: path.into(),
                    found: version,
                    supported: wal::VERSION,
                });
            }
            Record::Header { .. } => {}
            Record::Series { id, registered, key } => match key.parse::<SeriesKey>() {
                Ok(k) => {
                    let ours = match st.series.get(&id) {
                        Some(s) if s.key == k => id,
                        None if !st.ids.contains_key(&k) => {
                            st.ids.insert(k.clone(), id);
                            st.unindexed.insert(id);
                            st.series.insert(
                                id,
                                Series {
                                    key: k.clone(),
                                    registered: false,
                                    quantum: None,
                                    indexed: None,
                                    expired_before: 0,
                                    blocks: BTreeMap::new(),
                                },
                            );
                            st.next_id = st.next_id.max(id + 1);
                            id
                        }
                        _ => ensure_series(st, &k),
                    };
                    if registered && let Some(s) = st.series.get_mut(&ours) {
                        s.registered = true;
                        st.unindexed.insert(ours);
                    }
                    local.insert(id, ours);
                }
                Err(e) => problems.push(format!("{path}: series id {id} has a bad key: {e}")),
            },
            Record::Points { id, quantum, mut points } => {
                let Some(&ours) = local.get(&id) else {
                    problems.push(format!(
                        "{path}: {} points of series id {id}, which the segment never defined; skipped",
                        points.len()
                    ));
                    continue;
                };
                let s = st.series.get_mut(&ours).expect("mapped ids exist");
                match s.quantum {
                    Some(l) if l != quantum.len => {
                        problems.push(format!(
                            "{path}: points of {} in quanta of {} ns, but the series uses {} ns; skipped",
                            s.key,
                            quantum.len.ns(),
                            l.ns()
                        ));
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        s.quantum = Some(quantum.len);
                        st.unindexed.insert(ours);
                    }
                }
                if st.drops.get(&(ours, quantum.start)).is_some_and(|&before| seq < before) {
                    // The block was dropped after these points were logged.
                    continue;
                }
                timeshard_proto::point::sort_dedup(&mut points);
                apply_points(st, ours, quantum, &points, seq, None, 0);
            }
        }
    }
    Ok(())
}

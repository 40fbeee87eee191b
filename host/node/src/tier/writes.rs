//! Durable write times of the hot blocks of classes aged by write time (`age_by = "write"`):
//! the hot window and retention of such a block count from its last write, and the store keeps
//! write times in memory only (after a restart it reports the restart instead).
//!
//! # Implementation notes
//!
//! - A record says "block (series, quantum) was last written no later than `written`". It is
//!   appended and synced to `<data_dir>/tier/writes.log` **before** the write reaches the store,
//!   so a crash can only lose a record of a write that was never acknowledged; the block then
//!   ages from the record before it, or from the store's time when it has none (the restart:
//!   later, never earlier).
//! - To sync rarely, a record is dated a granule ahead (a hundredth of the class's shortest
//!   window, at most an hour): writes to the block within the granule need no new record. A
//!   block ages at most a granule late, never early.
//! - The log is JSON lines; a torn last line (a crash mid-append) is ignored. When it holds
//!   more than twice the live records, the next [`WriteTimes::retain`] rewrites it (to a
//!   temporary file, synced, renamed).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use timeshard_proto::{SeriesKey, Timestamp};

/// Name of the log in the tier's state directory.
pub const FILE: &str = "writes.log";

/// A block: series and quantum start.
pub type BlockKey = (SeriesKey, Timestamp);

#[derive(Serialize, Deserialize)]
struct Record {
    series: SeriesKey,
    quantum_start: Timestamp,
    written: Timestamp,
}

#[derive(Debug)]
struct State {
    times: HashMap<BlockKey, Timestamp>,
    log: File,
    /// Records in the log, live or superseded.
    lines: usize,
}

/// The write-time log (see the module docs).
#[derive(Debug)]
pub struct WriteTimes {
    path: PathBuf,
    state: Mutex<State>,
}

fn open_log(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl WriteTimes {
    /// Opens (or creates) the log at `path` and reads its records.
    pub fn open(path: &Path) -> std::io::Result<WriteTimes> {
        let mut times = HashMap::new();
        let mut lines = 0;
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut good = 0;
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            // A torn last line: the write it was for was never acknowledged.
            let Some(body) = line.strip_suffix(b"\n") else { break };
            let Ok(r) = serde_json::from_slice::<Record>(body) else { break };
            let t = times.entry((r.series, r.quantum_start)).or_insert(r.written);
            *t = (*t).max(r.written);
            lines += 1;
            good += line.len();
        }
        let log = open_log(path)?;
        if good < bytes.len() {
            // Appends go after the last whole record, not after the torn one.
            log.set_len(good as u64)?;
            log.sync_all()?;
        }
        Ok(WriteTimes { path: path.to_path_buf(), state: Mutex::new(State { times, log, lines }) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recorded write time of a block (no later than a granule after its last write).
    pub fn get(&self, series: &SeriesKey, quantum_start: Timestamp) -> Option<Timestamp> {
        self.state().times.get(&(series.clone(), quantum_start)).copied()
    }

    /// Records that `blocks` are written at `now`, each dated `granule` ahead, durably; blocks
    /// whose record already reaches `now` are left alone (no I/O when all are).
    pub fn note(&self, blocks: &[(&SeriesKey, Timestamp, i64)], now: Timestamp) -> std::io::Result<()> {
        let mut state = self.state();
        let mut out = Vec::new();
        let mut changed = Vec::new();
        for &(series, quantum_start, granule) in blocks {
            if state.times.get(&(series.clone(), quantum_start)).is_some_and(|&t| t >= now) {
                continue;
            }
            let written = now.saturating_add(granule.max(0));
            let r = Record { series: series.clone(), quantum_start, written };
            serde_json::to_writer(&mut out, &r).map_err(std::io::Error::other)?;
            out.push(b'\n');
            changed.push(((series.clone(), quantum_start), written));
        }
        if changed.is_empty() {
            return Ok(());
        }
        state.log.write_all(&out)?;
        state.log.sync_data()?;
        state.lines += changed.len();
        for (k, t) in changed {
            let e = state.times.entry(k).or_insert(t);
            *e = (*e).max(t);
        }
        Ok(())
    }

    /// Forgets the records of blocks not in `live` (dropped or expired) dated before `since`
    /// (the start of the walk that found `live`), and rewrites the log when it has grown to
    /// more than twice the live records.
    pub fn retain(&self, live: &HashSet<BlockKey>, since: Timestamp) -> std::io::Result<()> {
        let mut state = self.state();
        state.times.retain(|k, t| *t >= since || live.contains(k));
        if state.lines <= 2 * state.times.len() + 1024 {
            return Ok(());
        }
        let tmp = self.path.with_extension("tmp");
        {
            let mut f = std::io::BufWriter::new(File::create(&tmp)?);
            for ((series, quantum_start), &written) in &state.times {
                let r = Record { series: series.clone(), quantum_start: *quantum_start, written };
                serde_json::to_writer(&mut f, &r).map_err(std::io::Error::other)?;
                f.write_all(b"\n")?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        state.log = open_log(&self.path)?;
        state.lines = state.times.len();
        Ok(())
    }

    /// Blocks with a record.
    pub fn len(&self) -> usize {
        self.state().times.len()
    }

    /// Whether no block has a record.
    pub fn is_empty(&self) -> bool {
        self.state().times.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> SeriesKey {
        s.parse().unwrap()
    }

    #[test]
    fn records_survive_reopening_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let (a, b) = (key("d.t{id=1}"), key("d.t{id=2}"));
        let w = WriteTimes::open(&path).unwrap();
        w.note(&[(&a, 0, 10), (&b, 60, 10)], 1_000).unwrap();
        // Within the granule: nothing new is needed.
        w.note(&[(&a, 0, 10)], 1_005).unwrap();
        w.note(&[(&a, 0, 10)], 2_000).unwrap();
        assert_eq!((w.get(&a, 0), w.get(&b, 60), w.get(&a, 60)), (Some(2_010), Some(1_010), None));
        drop(w);
        // A crash mid-append leaves half a line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"series\":\"d.t{id=1}\",\"quantum_st").unwrap();
        let w = WriteTimes::open(&path).unwrap();
        assert_eq!((w.get(&a, 0), w.get(&b, 60)), (Some(2_010), Some(1_010)));
        // Appends start after the last whole record.
        w.note(&[(&b, 60, 10)], 3_000).unwrap();
        let w = WriteTimes::open(&path).unwrap();
        assert_eq!((w.get(&a, 0), w.get(&b, 60)), (Some(2_010), Some(3_010)));
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 4);
    }

    #[test]
    fn forgotten_blocks_leave_the_rewritten_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let w = WriteTimes::open(&path).unwrap();
        let keys: Vec<SeriesKey> = (0..3000).map(|i| key(&format!("d.t{{id={i}}}"))).collect();
        let blocks: Vec<_> = keys.iter().map(|k| (k, 0, 0)).collect();
        w.note(&blocks, 5).unwrap();
        let live: HashSet<BlockKey> = keys[..10].iter().map(|k| (k.clone(), 0)).collect();
        w.retain(&live, 6).unwrap();
        assert_eq!(w.len(), 10);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 10, "rewritten");
        w.note(&[(&keys[0], 0, 0)], 9).unwrap();
        let again = WriteTimes::open(&path).unwrap();
        assert_eq!((again.len(), again.get(&keys[0], 0), again.get(&keys[20], 0)), (10, Some(9), None));
    }
}

//! A faulty disk for the store's tests and the fleet simulator: [`FaultyDisk`], an in-memory
//! [`Backend`] that models what a power cut keeps and fails on demand (disk full, permission
//! denied, a dying process, failed fsyncs, misdirected writes, flipped bytes).
//!
//! The model: appended bytes are volatile until `sync`; a file's existence is volatile until its
//! first `sync` (or `write_atomic`); `write_atomic` is durable when it returns; a removal may or
//! may not survive a crash. [`FaultyDisk::crash`] returns the image a restart would find: synced
//! bytes, plus any prefix of the unsynced tail, sometimes with its last bytes garbled (a torn
//! sector).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use crate::backend::Backend;

/// How failing operations fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// ENOSPC.
    DiskFull,
    /// EACCES.
    PermissionDenied,
    /// The process is gone: nothing more reaches the disk.
    Crashed,
}

impl FailKind {
    fn error(self) -> io::Error {
        match self {
            FailKind::DiskFull => io::Error::new(io::ErrorKind::StorageFull, "no space left on device (simulated)"),
            FailKind::PermissionDenied => {
                io::Error::new(io::ErrorKind::PermissionDenied, "permission denied (simulated)")
            }
            FailKind::Crashed => io::Error::other("the process crashed (simulated)"),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct DiskFile {
    data: Vec<u8>,
    synced: usize,
    durable: bool,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, DiskFile>,
    // Synced contents of removed files: a crash may bring them back.
    ghosts: Vec<(String, Vec<u8>)>,
    // Bytes appends may still write before `budget_fail` strikes.
    budget: Option<(u64, FailKind)>,
    write_fail: Option<FailKind>,
    read_fail: Option<FailKind>,
    bytes_appended: u64,
    // Mutating operations (append, sync, truncate, write_atomic, remove) that may still
    // succeed before every write fails with the kind.
    op_budget: Option<(u64, FailKind)>,
    ops: u64,
    syncs: u64,
    sync_delay: std::time::Duration,
    // Syncs that fail (EIO) before they work again; what they should have synced stays volatile.
    failing_syncs: u64,
    // Appends that land in another file (or nowhere) while reporting success.
    misdirected: u64,
}

/// A disk in memory that crashes and fails when a test asks. Clones share one disk.
#[derive(Debug, Clone, Default)]
pub struct FaultyDisk {
    state: Arc<Mutex<State>>,
}

/// SplitMix64: a tiny deterministic generator for crash images.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl FaultyDisk {
    /// An empty disk.
    pub fn new() -> FaultyDisk {
        FaultyDisk::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After `bytes` more appended bytes, appends tear (write a prefix) and every write fails
    /// with `kind` (until [`FaultyDisk::heal`]).
    pub fn fail_writes_after(&self, bytes: u64, kind: FailKind) {
        self.lock().budget = Some((bytes, kind));
    }

    /// After `ops` more mutating operations (appends, syncs, truncations, atomic replaces,
    /// removals) every write fails with `kind` (until [`FaultyDisk::heal`]): with
    /// [`FaultyDisk::ops`] a test can stop the process before each operation in turn.
    pub fn fail_writes_after_ops(&self, ops: u64, kind: FailKind) {
        self.lock().op_budget = Some((ops, kind));
    }

    /// Mutating operations attempted so far (see [`FaultyDisk::fail_writes_after_ops`]).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Every write fails with `kind` from now on.
    pub fn fail_writes(&self, kind: FailKind) {
        self.lock().write_fail = Some(kind);
    }

    /// Every read fails with `kind` from now on.
    pub fn fail_reads(&self, kind: FailKind) {
        self.lock().read_fail = Some(kind);
    }

    /// Writes and reads work again (space freed, permissions fixed).
    pub fn heal(&self) {
        let mut s = self.lock();
        s.budget = None;
        s.op_budget = None;
        s.write_fail = None;
        s.read_fail = None;
    }

    /// Flips bits of the byte at `offset` of `path` (in both the live and the synced image).
    pub fn corrupt(&self, path: &str, offset: usize, xor: u8) {
        if let Some(f) = self.lock().files.get_mut(path)
            && let Some(b) = f.data.get_mut(offset)
        {
            *b ^= xor;
        }
    }

    /// The next `n` syncs fail with an I/O error, syncing nothing.
    pub fn fail_syncs(&self, n: u64) {
        self.lock().failing_syncs = n;
    }

    /// The next `n` appends are misdirected: they report success, but their bytes land at the
    /// end of another file (the next one by name; nowhere when there is none).
    pub fn misdirect_appends(&self, n: u64) {
        self.lock().misdirected = n;
    }

    /// Makes every `sync` take `d` (like a real disk), so concurrent writers overlap.
    pub fn set_sync_delay(&self, d: std::time::Duration) {
        self.lock().sync_delay = d;
    }

    /// Number of successful syncs so far.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Total bytes ever appended (to pick crash points).
    pub fn bytes_appended(&self) -> u64 {
        self.lock().bytes_appended
    }

    /// Files and their lengths.
    pub fn files(&self) -> Vec<(String, usize)> {
        self.lock().files.iter().map(|(k, f)| (k.clone(), f.data.len())).collect()
    }

    /// The disk a restart after a power cut finds, chosen by `seed`.
    pub fn crash(&self, seed: u64) -> FaultyDisk {
        let mut rng = SplitMix64(seed);
        let s = self.lock();
        let mut files = BTreeMap::new();
        for (name, f) in &s.files {
            if !f.durable && f.synced == 0 && rng.below(2) == 0 {
                continue;
            }
            let unsynced = f.data.len() - f.synced;
            let keep = f.synced + rng.below(unsynced as u64 + 1) as usize;
            let mut data = f.data[..keep].to_vec();
            if keep > f.synced && rng.below(4) == 0 {
                let torn = (keep - f.synced).min(1 + rng.below(8) as usize);
                let n = data.len();
                for b in &mut data[n - torn..] {
                    *b = rng.next_u64() as u8;
                }
            }
            files.insert(name.clone(), DiskFile { synced: data.len(), data, durable: true });
        }
        for (name, data) in &s.ghosts {
            if !files.contains_key(name) && rng.below(2) == 0 {
                files.insert(name.clone(), DiskFile { synced: data.len(), data: data.clone(), durable: true });
            }
        }
        FaultyDisk { state: Arc::new(Mutex::new(State { files, ..State::default() })) }
    }
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such file (simulated)"))
}

impl State {
    fn check_write(&mut self) -> io::Result<()> {
        self.ops += 1;
        if let Some((left, k)) = &mut self.op_budget {
            if *left == 0 {
                return Err(k.error());
            }
            *left -= 1;
        }
        match (self.write_fail, self.budget) {
            (Some(k), _) | (None, Some((0, k))) => Err(k.error()),
            _ => Ok(()),
        }
    }
    fn check_read(&self) -> io::Result<()> {
        self.read_fail.map_or(Ok(()), |k| Err(k.error()))
    }
}

impl Backend for FaultyDisk {
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let s = self.lock();
        s.check_read()?;
        let prefix = format!("{dir}/");
        Ok(s.files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.contains('/'))
            .map(str::to_string)
            .collect())
    }

    fn len(&self, path: &str) -> io::Result<u64> {
        let s = self.lock();
        s.check_read()?;
        s.files.get(path).map(|f| f.data.len() as u64).ok_or_else(|| not_found(path))
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let s = self.lock();
        s.check_read()?;
        let f = s.files.get(path).ok_or_else(|| not_found(path))?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        f.data
            .get(start..start.saturating_add(len))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, format!("{path}: read past the end")))
    }

    fn append(&self, path: &str, data: &[u8]) -> io::Result<u64> {
        let mut s = self.lock();
        s.check_write()?;
        let (n, fail) = match s.budget {
            Some((left, k)) if (left as usize) < data.len() => (left as usize, Some(k)),
            _ => (data.len(), None),
        };
        if let Some((left, _)) = &mut s.budget {
            *left -= n as u64;
        }
        s.bytes_appended += n as u64;
        if s.misdirected > 0 && fail.is_none() {
            s.misdirected -= 1;
            let at = s.files.get(path).map_or(0, |f| f.data.len() as u64);
            let elsewhere = s
                .files
                .range::<str, _>((std::ops::Bound::Excluded(path), std::ops::Bound::Unbounded))
                .next()
                .map(|(k, _)| k.clone());
            if let Some(other) = elsewhere.and_then(|k| s.files.get_mut(&k)) {
                other.data.extend_from_slice(&data[..n]);
            }
            s.files.entry(path.to_string()).or_default();
            return Ok(at);
        }
        let f = s.files.entry(path.to_string()).or_default();
        let at = f.data.len() as u64;
        f.data.extend_from_slice(&data[..n]);
        match fail {
            Some(k) => Err(k.error()),
            None => Ok(at),
        }
    }

    fn sync(&self, path: &str) -> io::Result<()> {
        let delay = self.lock().sync_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut s = self.lock();
        s.check_write()?;
        if s.failing_syncs > 0 {
            s.failing_syncs -= 1;
            return Err(io::Error::other("fsync failed: input/output error (simulated)"));
        }
        s.syncs += 1;
        let f = s.files.get_mut(path).ok_or_else(|| not_found(path))?;
        f.synced = f.data.len();
        f.durable = true;
        Ok(())
    }

    fn truncate(&self, path: &str, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        s.check_write()?;
        let f = s.files.get_mut(path).ok_or_else(|| not_found(path))?;
        let len = len as usize;
        f.data.truncate(len);
        f.synced = f.synced.min(len);
        Ok(())
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        s.check_write()?;
        if let Some((left, k)) = &mut s.budget {
            if (*left as usize) < data.len() {
                // The temporary file is what tore; the old file stays.
                let k = *k;
                *left = 0;
                return Err(k.error());
            }
            *left -= data.len() as u64;
        }
        s.files.insert(path.to_string(), DiskFile { data: data.to_vec(), synced: data.len(), durable: true });
        Ok(())
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        let mut s = self.lock();
        s.check_write()?;
        if let Some(f) = s.files.remove(path)
            && f.durable
        {
            let synced = f.data[..f.synced].to_vec();
            s.ghosts.push((path.to_string(), synced));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_synced_bytes_and_a_prefix_of_the_rest() {
        let b = FaultyDisk::new();
        b.append("a", b"synced").unwrap();
        b.sync("a").unwrap();
        b.append("a", b"volatile").unwrap();
        for seed in 0..50 {
            let c = b.crash(seed);
            let data = c.read_all("a").unwrap();
            assert!(data.len() >= 6 && data.len() <= 14);
            assert_eq!(&data[..6], b"synced");
        }
    }

    #[test]
    fn budget_tears_then_fails() {
        let b = FaultyDisk::new();
        b.fail_writes_after(3, FailKind::DiskFull);
        let e = b.append("a", b"hello").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(b.read_all("a").unwrap(), b"hel");
        assert!(b.append("a", b"x").is_err());
        b.heal();
        b.append("a", b"x").unwrap();
    }

    #[test]
    fn failed_syncs_keep_bytes_volatile_and_misdirected_appends_land_elsewhere() {
        let d = FaultyDisk::new();
        d.append("a", b"one").unwrap();
        d.fail_syncs(1);
        assert!(d.sync("a").is_err());
        assert_eq!(d.syncs(), 0);
        // Nothing was synced: some power cut loses the file.
        assert!((0..16).any(|seed| d.crash(seed).files().is_empty()));
        d.sync("a").unwrap();
        d.append("b", b"x").unwrap();
        d.misdirect_appends(1);
        // Reported at the end of "a", written at the end of "b".
        assert_eq!(d.append("a", b"two").unwrap(), 3);
        assert_eq!(d.read_all("a").unwrap(), b"one");
        assert_eq!(d.read_all("b").unwrap(), b"xtwo");
        assert_eq!(d.append("a", b"three").unwrap(), 3);
        assert_eq!(d.read_all("a").unwrap(), b"onethree");
    }
}

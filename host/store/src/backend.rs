//! The storage backend: every byte the disk store reads or writes goes through [`Backend`]
//! (the idea of redb's `StorageBackend`), so tests can swap the real files ([`FileBackend`]) for
//! a crash-injecting, failure-injecting memory image (`FaultyDisk`, in the `faulty_disk` module).
//!
//! Paths are relative, `/`-separated names such as `wal/00000000000000000001.wal`. The engine
//! only ever appends to files, replaces small files atomically, and removes files.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::StoreError;

/// File access of the disk store. Implementations must be safe to call from many threads; the
/// engine never appends to one file from two threads at once.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Names (not paths) of the files in directory `dir`; empty if it does not exist.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    /// Length of a file in bytes.
    fn len(&self, path: &str) -> io::Result<u64>;
    /// Exactly `len` bytes at `offset`.
    fn read_at(&self, path: &str, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Appends `data`, creating the file (and its directory) if needed; returns the offset it
    /// was written at. On error, any prefix of `data` may have been written.
    fn append(&self, path: &str, data: &[u8]) -> io::Result<u64>;
    /// Makes everything appended to `path` durable, including the file's directory entry.
    fn sync(&self, path: &str) -> io::Result<()>;
    /// Cuts the file to `len` bytes (used to drop a torn tail before appending again).
    fn truncate(&self, path: &str, len: u64) -> io::Result<()>;
    /// Replaces the whole file with `data`, atomically and durably.
    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()>;
    /// Removes a file; removing a missing file succeeds.
    fn remove(&self, path: &str) -> io::Result<()>;

    /// The whole file.
    fn read_all(&self, path: &str) -> io::Result<Vec<u8>> {
        let n = self.len(path)?;
        let n = usize::try_from(n).map_err(|_| io::Error::other("file too large for memory"))?;
        self.read_at(path, 0, n)
    }
}

/// Maps an I/O failure to the store error a caller can act on.
pub(crate) fn io_error(context: String, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            StoreError::Full(format!("{context}: {e}; free disk space (or shorten retention) and retry"))
        }
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => StoreError::PermissionDenied(format!(
            "{context}: {e}; give the node's user read and write access to its data directory"
        )),
        _ => StoreError::Io { context, source: e },
    }
}

/// Real files under one directory, which it locks for its lifetime so two processes never
/// share a data directory.
#[derive(Debug)]
pub struct FileBackend {
    root: PathBuf,
    // Open handles, so reads and appends do not reopen files. A removed file's handle is
    // dropped from here; readers still holding it read the unlinked file, which is harmless.
    // Bounded: past MAX_OPEN_FILES the least recently used idle handles are closed.
    files: Mutex<HashMap<String, Arc<Handle>>>,
    tick: AtomicU64,
    _lock: File,
}

/// Most file handles kept open between operations. A store has one file per 64 MiB of
/// blocks; a descriptor for each would run into the open-file limit (1024 by default).
const MAX_OPEN_FILES: usize = 128;

#[derive(Debug)]
struct Handle {
    file: File,
    state: Mutex<HandleState>,
    // When the handle was last used (a tick of `FileBackend::tick`).
    used: AtomicU64,
}

#[derive(Debug)]
struct HandleState {
    // The append position.
    end: u64,
    // The directory entry still needs an fsync.
    dir_unsynced: bool,
    // The last append failed: `end` is before the torn bytes, so the next append overwrites them.
    torn: bool,
    // Appended since the last sync: the sync uses this descriptor, which sees any write-back
    // error of those appends.
    unsynced: bool,
}

impl FileBackend {
    /// Opens (creating) `root` and locks it.
    pub fn open(root: &Path) -> Result<FileBackend, StoreError> {
        let ctx = |what: &str| format!("{what} data directory {}", root.display());
        create_dirs_durably(root).map_err(|e| io_error(ctx("creating"), e))?;
        let lock_path = root.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_error(ctx("locking"), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Unavailable(format!(
                    "data directory {} is in use by another process; give every node its own \
                     data directory",
                    root.display()
                )));
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_error(ctx("locking"), e)),
        }
        Ok(FileBackend {
            root: root.to_path_buf(),
            files: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            _lock: lock,
        })
    }

    /// The directory this backend owns.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, p: &str) -> io::Result<PathBuf> {
        if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad store path {p:?}")));
        }
        Ok(self.root.join(p))
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Handle>>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handle(&self, p: &str, create: bool) -> io::Result<Arc<Handle>> {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = self.handles().get(p) {
            h.used.store(tick, Ordering::Relaxed);
            return Ok(h.clone());
        }
        let path = self.path(p)?;
        let existed = path.exists();
        if create && let Some(dir) = path.parent() {
            create_dirs_durably(dir)?;
        }
        let file = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&path)?;
        let len = file.metadata()?.len();
        let h = Arc::new(Handle {
            file,
            state: Mutex::new(HandleState { end: len, dir_unsynced: !existed, torn: false, unsynced: false }),
            used: AtomicU64::new(tick),
        });
        let mut files = self.handles();
        let h = files.entry(p.to_string()).or_insert(h).clone();
        if files.len() > MAX_OPEN_FILES {
            evict_idle(&mut files);
        }
        Ok(h)
    }

    fn sync_dir_of(&self, p: &str) -> io::Result<()> {
        let path = self.path(p)?;
        sync_dir(path.parent().unwrap_or(&self.root))
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    #[cfg(test)]
    SYNCED_DIRS.with(|d| d.borrow_mut().push(dir.to_path_buf()));
    File::open(dir)?.sync_all()
}

#[cfg(test)]
thread_local! {
    // Directories fsynced by this thread, for tests.
    static SYNCED_DIRS: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Creates `dir` and its missing parents, then fsyncs the parent of each directory it created:
/// a new directory (like `wal/` on the first write) is only durable once the directory holding
/// its entry is synced, and a file synced inside a directory that vanishes is lost all the same.
fn create_dirs_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.as_os_str().is_empty() && !d.exists() {
        missing.push(d);
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Closes the least recently used handles down to half the cap. Only idle ones: not held by
/// any operation, and with nothing a reopen would lose (unsynced appends, a pending directory
/// fsync, the position before torn bytes).
fn evict_idle(files: &mut HashMap<String, Arc<Handle>>) {
    let mut idle: Vec<(u64, String)> = files
        .iter()
        .filter(|(_, h)| {
            Arc::strong_count(h) == 1 && h.state.try_lock().is_ok_and(|st| !st.dir_unsynced && !st.torn && !st.unsynced)
        })
        .map(|(k, h)| (h.used.load(Ordering::Relaxed), k.clone()))
        .collect();
    idle.sort_unstable();
    let excess = files.len().saturating_sub(MAX_OPEN_FILES / 2);
    for (_, k) in idle.into_iter().take(excess) {
        files.remove(&k);
    }
}

impl Backend for FileBackend {
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let rd = match fs::read_dir(self.path(dir)?) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry?;
            if entry.file_type()?.is_file()
                && let Some(n) = entry.file_name().to_str()
            {
                names.push(n.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn len(&self, path: &str) -> io::Result<u64> {
        if let Some(h) = self.handles().get(path) {
            return Ok(h.state.lock().unwrap_or_else(|e| e.into_inner()).end);
        }
        Ok(fs::metadata(self.path(path)?)?.len())
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let h = self.handle(path, false)?;
        let mut buf = vec![0; len];
        h.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn append(&self, path: &str, data: &[u8]) -> io::Result<u64> {
        let h = self.handle(path, true)?;
        let mut st = h.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = st.end;
        // Positional writes at our own append offset: after a failed append the next one
        // overwrites the torn bytes instead of leaving them between good records.
        st.torn = true;
        st.unsynced = true;
        h.file.write_all_at(data, at)?;
        st.end = at + data.len() as u64;
        st.torn = false;
        Ok(at)
    }

    fn sync(&self, path: &str) -> io::Result<()> {
        let h = self.handle(path, false)?;
        h.file.sync_data()?;
        h.state.lock().unwrap_or_else(|e| e.into_inner()).unsynced = false;
        let new = std::mem::replace(&mut h.state.lock().unwrap_or_else(|e| e.into_inner()).dir_unsynced, false);
        if new && let Err(e) = self.sync_dir_of(path) {
            h.state.lock().unwrap_or_else(|e| e.into_inner()).dir_unsynced = true;
            return Err(e);
        }
        Ok(())
    }

    fn truncate(&self, path: &str, len: u64) -> io::Result<()> {
        let h = self.handle(path, false)?;
        let mut st = h.state.lock().unwrap_or_else(|e| e.into_inner());
        h.file.set_len(len)?;
        st.end = len;
        st.torn = false;
        Ok(())
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let dst = self.path(path)?;
        let tmp = self.path(&format!("{path}.tmp"))?;
        if let Some(dir) = dst.parent() {
            create_dirs_durably(dir)?;
        }
        {
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, data)?;
            f.sync_all()?;
        }
        self.handles().remove(path);
        fs::rename(&tmp, &dst)?;
        self.sync_dir_of(path)
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        self.handles().remove(path);
        match fs::remove_file(self.path(path)?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_append_read_replace_and_lock() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open(dir.path()).unwrap();
        assert!(matches!(FileBackend::open(dir.path()), Err(StoreError::Unavailable(_))));
        assert_eq!(b.append("wal/1.wal", b"hello").unwrap(), 0);
        assert_eq!(b.append("wal/1.wal", b" world").unwrap(), 5);
        b.sync("wal/1.wal").unwrap();
        assert_eq!(b.read_all("wal/1.wal").unwrap(), b"hello world");
        assert_eq!(b.read_at("wal/1.wal", 6, 5).unwrap(), b"world");
        b.truncate("wal/1.wal", 5).unwrap();
        b.append("wal/1.wal", b"!").unwrap();
        assert_eq!(b.read_all("wal/1.wal").unwrap(), b"hello!");
        b.write_atomic("FORMAT", b"v1").unwrap();
        b.write_atomic("FORMAT", b"v2").unwrap();
        assert_eq!(b.read_all("FORMAT").unwrap(), b"v2");
        assert_eq!(b.list("wal").unwrap(), vec!["1.wal"]);
        assert!(b.list("nothing").unwrap().is_empty());
        b.remove("wal/1.wal").unwrap();
        b.remove("wal/1.wal").unwrap();
        assert!(b.list("wal").unwrap().is_empty());
        assert!(b.read_all("../escape").is_err());
    }
}

#[cfg(test)]
mod dir_tests {
    use super::*;

    /// The first write creates `wal/` (and the first open the data directory): those new
    /// entries are only durable once their parent directories are synced.
    #[test]
    fn new_directories_are_synced_into_their_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("node");
        SYNCED_DIRS.with(|d| d.borrow_mut().clear());
        let b = FileBackend::open(&root).unwrap();
        b.append("wal/1.wal", b"x").unwrap();
        b.sync("wal/1.wal").unwrap();
        let synced = SYNCED_DIRS.with(|d| d.borrow().clone());
        assert!(synced.contains(&tmp.path().to_path_buf()), "the entry of the data directory: {synced:?}");
        assert!(synced.contains(&root), "the entry of wal/: {synced:?}");
        assert!(synced.contains(&root.join("wal")), "the entry of the segment: {synced:?}");
    }
}

#[cfg(test)]
mod fd_tests {
    use super::*;

    fn open_fds() -> usize {
        fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
    }

    /// A node with years of blocks has thousands of segment files; keeping a descriptor for
    /// each one it ever touched runs into the open-file limit (1024 by default under systemd),
    /// after which no new log segment can be created and every write fails.
    #[test]
    fn open_file_handles_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open(dir.path()).unwrap();
        fs::create_dir_all(dir.path().join("blocks")).unwrap();
        for i in 0..1500 {
            fs::write(dir.path().join(format!("blocks/{i:010}.seg")), b"block").unwrap();
        }
        let before = open_fds();
        for i in 0..1500 {
            assert_eq!(b.read_at(&format!("blocks/{i:010}.seg"), 0, 5).unwrap(), b"block");
        }
        let held = open_fds().saturating_sub(before);
        assert!(held < 400, "the backend holds {held} open files");
        // Appends after an eviction continue at the end.
        b.append("blocks/0000000000.seg", b"!").unwrap();
        b.sync("blocks/0000000000.seg").unwrap();
        assert_eq!(b.read_all("blocks/0000000000.seg").unwrap(), b"block!");
        assert_eq!(b.len("blocks/0000000000.seg").unwrap(), 6);
    }
}

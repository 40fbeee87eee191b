//! An object store that fails on demand, for tests: it wraps a real store, numbers every
//! operation (each put, part, completion, get, list, delete, copy), and fails the ones its
//! [`Fault`] names. `FailFrom(n)` is a crash or an outage from operation `n` on; `CrashAfter(n)`
//! a crash right after operation `n` took effect but before its caller heard so; `FailOnly` are
//! transient errors the caller's retries should ride out.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result, UploadPart,
};

/// Which operations fail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// None.
    #[default]
    None,
    /// Operation `n` (0-based) and every later one.
    FailFrom(u64),
    /// Operation `n` takes effect but reports failure, and every later one fails.
    CrashAfter(u64),
    /// Exactly these operations.
    FailOnly(BTreeSet<u64>),
}

/// What becomes of one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Proceed,
    /// Performed, then reported as failed.
    FailAfter,
}

#[derive(Debug, Default)]
struct Shared {
    ops: AtomicU64,
    fault: Mutex<Fault>,
    /// `<operation> <path>` of every operation, in order.
    log: Mutex<Vec<String>>,
}

impl Shared {
    /// Numbers one operation; an error if it is to fail before taking effect.
    fn step(&self, what: &str, path: Option<&Path>) -> Result<Outcome> {
        let n = {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            log.push(format!("{what} {}", path.map(ToString::to_string).unwrap_or_default()));
            self.ops.fetch_add(1, Ordering::SeqCst)
        };
        let (fail, outcome) = match &*self.fault.lock().unwrap_or_else(|e| e.into_inner()) {
            Fault::None => (false, Outcome::Proceed),
            Fault::FailFrom(from) => (n >= *from, Outcome::Proceed),
            Fault::CrashAfter(at) if n == *at => (false, Outcome::FailAfter),
            Fault::CrashAfter(at) => (n > *at, Outcome::Proceed),
            Fault::FailOnly(set) => (set.contains(&n), Outcome::Proceed),
        };
        if fail {
            return Err(injected(n, what, path));
        }
        Ok(outcome)
    }

    /// `result`, or the injected failure of operation `n` if it was to fail after taking effect.
    fn after<T>(&self, outcome: Outcome, what: &str, path: &Path, result: Result<T>) -> Result<T> {
        match outcome {
            Outcome::FailAfter => {
                result?;
                Err(injected(self.ops.load(Ordering::SeqCst) - 1, what, Some(path)))
            }
            Outcome::Proceed => result,
        }
    }
}

fn injected(n: u64, what: &str, path: Option<&Path>) -> object_store::Error {
    let path = path.map(ToString::to_string).unwrap_or_default();
    object_store::Error::Generic {
        store: "faulty",
        source: format!("injected failure of operation {n} ({what} {path})").into(),
    }
}

/// A store that fails operations as told.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
}

impl FaultyStore {
    /// Wraps `inner`, failing nothing yet.
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore { inner, shared: Arc::default() }
    }

    /// Sets which operations fail, counting from the operations done so far.
    pub fn set_fault(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// Operations numbered so far.
    pub fn ops(&self) -> u64 {
        self.shared.ops.load(Ordering::SeqCst)
    }

    /// `<operation> <path>` of every operation so far, in order (operation `n` is entry `n`).
    pub fn log(&self) -> Vec<String> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let outcome = self.shared.step("put", Some(location))?;
        let result = self.inner.put_opts(location, payload, opts).await;
        self.shared.after(outcome, "put", location, result)
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        let outcome = self.shared.step("put_multipart", Some(location))?;
        let inner = self.inner.put_multipart_opts(location, opts).await;
        let inner = self.shared.after(outcome, "put_multipart", location, inner)?;
        Ok(Box::new(FaultyUpload { inner, shared: Arc::clone(&self.shared), path: location.clone() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let outcome = self.shared.step("get", Some(location))?;
        let result = self.inner.get_opts(location, options).await;
        self.shared.after(outcome, "get", location, result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let outcome = self.shared.step("get_ranges", Some(location))?;
        let result = self.inner.get_ranges(location, ranges).await;
        self.shared.after(outcome, "get_ranges", location, result)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        match self.shared.step("delete", None) {
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            Ok(Outcome::Proceed) => self.inner.delete_stream(locations),
            // Deletes, then reports each as failed.
            Ok(Outcome::FailAfter) => self
                .inner
                .delete_stream(locations)
                .map(|r| r.and_then(|p| Err(injected(u64::MAX, "delete", Some(&p)))))
                .boxed(),
        }
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        match self.shared.step("list", prefix) {
            Ok(Outcome::Proceed) => self.inner.list(prefix),
            Ok(Outcome::FailAfter) => {
                let e = injected(self.ops() - 1, "list", prefix);
                futures::stream::once(async move { Err(e) }).boxed()
            }
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let outcome = self.shared.step("list", prefix)?;
        let result = self.inner.list_with_delimiter(prefix).await;
        self.shared.after(outcome, "list", &prefix.cloned().unwrap_or_default(), result)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let outcome = self.shared.step("copy", Some(to))?;
        let result = self.inner.copy_opts(from, to, options).await;
        self.shared.after(outcome, "copy", to, result)
    }
}

#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    shared: Arc<Shared>,
    path: Path,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.shared.step("put_part", Some(&self.path)) {
            Ok(Outcome::Proceed) => self.inner.put_part(data),
            Ok(Outcome::FailAfter) => {
                let (part, e) = (self.inner.put_part(data), injected(u64::MAX, "put_part", Some(&self.path)));
                Box::pin(async move {
                    part.await?;
                    Err(e)
                })
            }
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let outcome = self.shared.step("complete", Some(&self.path))?;
        let result = self.inner.complete().await;
        self.shared.after(outcome, "complete", &self.path, result)
    }

    async fn abort(&mut self) -> Result<()> {
        let outcome = self.shared.step("abort", Some(&self.path))?;
        let result = self.inner.abort().await;
        self.shared.after(outcome, "abort", &self.path, result)
    }
}

//! An object store that fails on demand, for tests: it wraps a real store, numbers every
//! operation (each put, part, completion, get, list, delete, copy), and fails the ones its
//! [`Fault`] names. `FailFrom(n)` is a crash or an outage from operation `n` on; `FailOnly`
//! are transient errors the caller's retries should ride out.

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
    /// Exactly these operations.
    FailOnly(BTreeSet<u64>),
}

#[derive(Debug, Default)]
struct Shared {
    ops: AtomicU64,
    fault: Mutex<Fault>,
}

impl Shared {
    /// Numbers one operation; an error if it is to fail.
    fn step(&self, what: &str, path: Option<&Path>) -> Result<()> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        let fail = match &*self.fault.lock().unwrap_or_else(|e| e.into_inner()) {
            Fault::None => false,
            Fault::FailFrom(from) => n >= *from,
            Fault::FailOnly(set) => set.contains(&n),
        };
        if fail {
            let path = path.map(ToString::to_string).unwrap_or_default();
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: format!("injected failure of operation {n} ({what} {path})").into(),
            });
        }
        Ok(())
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
        self.shared.step("put", Some(location))?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.shared.step("put_multipart", Some(location))?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload { inner, shared: Arc::clone(&self.shared), path: location.clone() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.shared.step("get", Some(location))?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.shared.step("get_ranges", Some(location))?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        if let Err(e) = self.shared.step("delete", None) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if let Err(e) = self.shared.step("list", prefix) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.shared.step("list", prefix)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.shared.step("copy", Some(to))?;
        self.inner.copy_opts(from, to, options).await
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
            Ok(()) => self.inner.put_part(data),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    async fn complete(&mut self) -> Result<PutResult> {
        self.shared.step("complete", Some(&self.path))?;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        self.shared.step("abort", Some(&self.path))?;
        self.inner.abort().await
    }
}

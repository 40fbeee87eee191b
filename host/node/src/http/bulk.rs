//! Bulk work (decompressing and parsing large request bodies, evaluating PromQL) run off the
//! async threads, a few at a time: a flood of large bodies waits for one of [`Bulk`]'s permits
//! instead of taking every core, so the async threads keep a core for small requests
//! (reads, pings) however many bodies arrive.
//!
//! The work runs on threads of [`Bulk`]'s own, one per permit, at a lower scheduling priority
//! than the async threads (Linux: nice [`BULK_NICE`]). On a machine with few cores the async
//! threads then still get a core at once when a small request arrives, even while bulk work
//! and other processes keep every core busy; on an idle machine the priority changes nothing.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, oneshot};

use super::error::ApiError;

/// Bodies up to this size are decoded inline on the async thread (cheaper than a hand-off);
/// larger ones, and all compressed ones, on a bulk thread under a [`Bulk`] permit.
pub const INLINE_BYTES: usize = 256 * 1024;

/// How much lower the bulk threads' priority is than the rest of the node's (Linux nice).
pub const BULK_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// Permits for bulk work, and the threads that run it; cloned handles share them. The threads
/// stop once every handle is dropped.
#[derive(Clone, Debug)]
pub struct Bulk {
    permits: Arc<Semaphore>,
    size: usize,
    jobs: mpsc::Sender<Job>,
}

/// Lowers the calling bulk thread's priority by [`BULK_NICE`].
fn lower_bulk_thread_priority() {
    if let Err(e) = crate::priority::lower_this_threads_priority(BULK_NICE) {
        tracing::debug!(error = %e, "cannot lower the bulk thread's priority");
    }
}

/// Starts `n` bulk threads taking jobs from one queue.
fn start_threads(n: usize) -> mpsc::Sender<Job> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let queue = Arc::new(Mutex::new(queue));
    for i in 0..n {
        let queue = queue.clone();
        let started = std::thread::Builder::new().name(format!("http-bulk-{i}")).spawn(move || {
            lower_bulk_thread_priority();
            loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(job) = next else { return };
                // A job that panics answers its request with an error (its result's sender is
                // dropped); the thread stays for the next.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
            }
        });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start a bulk thread");
        }
    }
    jobs
}

impl Bulk {
    /// `permits` bulk tasks at once (at least one), each on a thread of its own.
    pub fn new(permits: usize) -> Bulk {
        let size = permits.max(1);
        Bulk { permits: Arc::new(Semaphore::new(size)), size, jobs: start_threads(size) }
    }

    /// One fewer than the machine's cores (at least one): a core is always left for the
    /// async threads' small requests.
    pub fn for_this_machine() -> Bulk {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Bulk::new(cores.saturating_sub(1))
    }

    /// How many bulk tasks run at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bulk tasks running now.
    pub fn running(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    /// Runs `work` of `len` bytes inline when small, otherwise on a bulk thread once a permit
    /// is free; the wait is bounded by the caller's request timeout (dropping the future gives
    /// its place up before the work starts).
    pub async fn run<T: Send + 'static>(
        &self,
        len: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        if len <= INLINE_BYTES {
            return Ok(work());
        }
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::Internal("the bulk decoding permits are closed".into()))?;
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let result = work();
            // Given back before the answer, so whoever has the answer finds the permit free.
            drop(permit);
            let _ = done.send(result);
        });
        self.jobs.send(job).map_err(|_| ApiError::Internal("no bulk thread is running".into()))?;
        result.await.map_err(|_| ApiError::Internal("the decoding task failed".into()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_its_permits_of_bulk_work_run_at_once() {
        let bulk = Bulk::new(2);
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (bulk, running, most) = (bulk.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    bulk.run(INLINE_BYTES + 1, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(30));
                        running.fetch_sub(1, Ordering::SeqCst);
                        i
                    })
                    .await
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap().unwrap());
        }
        assert_eq!(done, (0..8).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 2, "two permits, eight tasks");
        assert_eq!(bulk.running(), 0);
    }

    #[tokio::test]
    async fn small_work_runs_inline_without_a_permit() {
        let bulk = Bulk::new(1);
        let _held = bulk.permits.clone().acquire_owned().await.unwrap();
        // Would wait forever for the one permit if it asked for it.
        let got = tokio::time::timeout(Duration::from_secs(1), bulk.run(INLINE_BYTES, || 7)).await;
        assert_eq!(got.unwrap().unwrap(), 7);
    }

    #[tokio::test]
    async fn a_job_that_panics_is_an_error_and_its_thread_takes_the_next() {
        let bulk = Bulk::new(1);
        let failed = bulk.run(INLINE_BYTES + 1, || -> u32 { panic!("a decoder bug") }).await;
        assert!(matches!(failed, Err(ApiError::Internal(_))), "{failed:?}");
        // The one permit came back from the panic, and the one thread is still there.
        assert_eq!(bulk.run(INLINE_BYTES + 1, || 7).await.unwrap(), 7);
        assert_eq!(bulk.running(), 0, "a permit is given back before its answer");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn bulk_work_runs_at_a_lower_priority_than_the_async_threads() {
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let here = nice();
        let there = Bulk::new(1).run(INLINE_BYTES + 1, nice).await.unwrap();
        assert_eq!(there, (here + BULK_NICE).min(19), "the async thread's nice is {here}");
    }

    #[test]
    fn a_core_is_left_for_the_async_threads() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(Bulk::for_this_machine().size(), cores.saturating_sub(1).max(1));
    }
}

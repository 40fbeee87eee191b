//! Bulk work (decompressing and parsing large request bodies, evaluating PromQL) run off the
//! async threads, a few at a time: a flood of large bodies waits for one of [`Bulk`]'s permits
//! instead of taking every core, so the async threads keep a core for small requests
//! (reads, pings) however many bodies arrive.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::error::ApiError;

/// Bodies up to this size are decoded inline on the async thread (cheaper than a hand-off);
/// larger ones, and all compressed ones, on a blocking thread under a [`Bulk`] permit.
pub const INLINE_BYTES: usize = 256 * 1024;

/// Permits for bulk work; cloned handles share them.
#[derive(Clone, Debug)]
pub struct Bulk {
    permits: Arc<Semaphore>,
    size: usize,
}

impl Bulk {
    /// `permits` bulk tasks at once (at least one).
    pub fn new(permits: usize) -> Bulk {
        let size = permits.max(1);
        Bulk { permits: Arc::new(Semaphore::new(size)), size }
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

    /// Runs `work` of `len` bytes inline when small, otherwise on a blocking thread once a
    /// permit is free; the wait is bounded by the caller's request timeout (dropping the
    /// future gives its place up before the work starts).
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
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::Internal(format!("decoding task failed: {e}")))
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

    #[test]
    fn a_core_is_left_for_the_async_threads() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(Bulk::for_this_machine().size(), cores.saturating_sub(1).max(1));
    }
}

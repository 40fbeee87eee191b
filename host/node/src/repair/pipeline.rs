//! Storing what a pull session fetches while its next page is on the way. The session's
//! fetches hand pages to a bounded queue ([`PAGES_QUEUED`]); the storer takes whatever has
//! queued up (up to [`STORE_BATCH_POINTS`]) and stores it with one durable write, so a slow
//! disk makes batches larger (fewer syncs) instead of stalling the network. Memory stays
//! bounded by the queue, one batch and the page being fetched.

use std::sync::Arc;

use timeshard_proto::wire::BlockPoints;
use timeshard_store::Store;
use tokio::sync::mpsc;

/// The storer could not store a page: the store's error, or its task's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreFailed(pub String);

/// Fetched pages waiting to be stored.
pub const PAGES_QUEUED: usize = 3;
/// Points one durable write stores at most (the disk store refuses writes above 2^20 points).
pub const STORE_BATCH_POINTS: usize = 400_000;

/// A page of fetched blocks on its way to the store.
pub type Page = Vec<BlockPoints>;

fn points(page: &[BlockPoints]) -> usize {
    page.iter().map(|b| b.points.len()).sum()
}

/// A bounded queue of fetched pages and its receiving end for [`store_pages`].
pub fn queue() -> (mpsc::Sender<Page>, mpsc::Receiver<Page>) {
    mpsc::channel(PAGES_QUEUED)
}

/// Stores the pages of `pages` until every sender is gone, batching what has queued up into
/// durable writes of at most `max_points` points (a single larger page is stored alone).
/// Returns the points stored; they are durable once it returns.
pub async fn store_pages(
    store: Arc<dyn Store>,
    mut pages: mpsc::Receiver<Page>,
    max_points: usize,
) -> Result<u64, StoreFailed> {
    let mut stored = 0u64;
    let mut held: Option<Page> = None;
    loop {
        let mut batch = match held.take() {
            Some(page) => page,
            None => match pages.recv().await {
                Some(page) => page,
                None => return Ok(stored),
            },
        };
        let mut n = points(&batch);
        while n < max_points {
            let Ok(page) = pages.try_recv() else { break };
            let m = points(&page);
            if n + m > max_points {
                held = Some(page);
                break;
            }
            n += m;
            batch.extend(page);
        }
        if n == 0 {
            continue;
        }
        let store = store.clone();
        timeshard_clock::spawn_blocking(move || store.write(&batch))
            .await
            .map_err(|e| StoreFailed(e.to_string()))?
            .map_err(|e| StoreFailed(e.to_string()))?;
        stored += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use timeshard_proto::{Point, QuantumLen, SeriesKey, TimeRange};
    use timeshard_store::{MemStore, ReadPage};

    use super::*;

    fn page(series: &SeriesKey, from: i64, n: i64) -> Page {
        let len = QuantumLen::DEFAULT;
        vec![BlockPoints {
            series: series.clone(),
            quantum: len.quantum_of(from),
            points: (from..from + n).map(|t| Point::new(t, t as f64)).collect(),
        }]
    }

    #[tokio::test]
    async fn queued_pages_are_stored_in_bounded_batches() {
        let store = Arc::new(MemStore::new(1 << 20));
        let series: SeriesKey = "m".parse().unwrap();
        let (tx, rx) = queue();
        let storer = tokio::spawn(store_pages(store.clone(), rx, 25));
        for k in 0..10 {
            tx.send(page(&series, k * 10, 10)).await.unwrap();
        }
        drop(tx);
        assert_eq!(storer.await.unwrap().unwrap(), 100);
        let range = TimeRange::new(0, 1_000).unwrap();
        let ReadPage { points, .. } = store.read(&series, range, None, 1_000).unwrap();
        assert_eq!(points.len(), 100);
        assert!(points.iter().enumerate().all(|(i, p)| p.ts == i as i64));
    }

    #[tokio::test]
    async fn a_failing_store_stops_the_storer_and_its_senders() {
        // A store with room for 5 points refuses a page of 10.
        let store = Arc::new(MemStore::new(5));
        let series: SeriesKey = "m".parse().unwrap();
        let (tx, rx) = queue();
        let storer = tokio::spawn(store_pages(store, rx, 1_000));
        tx.send(page(&series, 0, 10)).await.unwrap();
        assert!(matches!(storer.await.unwrap(), Err(StoreFailed(_))));
        assert!(tx.send(page(&series, 0, 1)).await.is_err(), "nothing is left to store pages");
    }
}

//! Export under failures, injected between every object-store operation: a crash (every
//! operation from the n-th on fails) followed by a re-run on a fresh handle leaves no duplicate
//! and no gap, even to a reader of all points files; a single failed operation is retried away;
//! an unreachable store fails the export and leaves the hot data as it was.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_store::{MemStore, Store};
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::read::{ParquetFile, Span};
use timeshard_tier::schema::points as col;
use timeshard_tier::{Archive, Config};

use crate::support::*;

/// Two series over midnight (two partitions), cut into several files of several row groups,
/// uploaded in many parts: every kind of operation occurs.
fn setup() -> (Arc<MemStore>, timeshard_proto::SeriesClass, Data, Config) {
    let class = class("c", 10);
    let start = T0 - T0.rem_euclid(DAY) + DAY - 600 * SEC;
    let data: Vec<_> =
        (1..=2u64).map(|i| (series(&format!("m{{id={i}}}")), signal_points(i, start, 5, 6_000))).collect();
    let hot = hot_store(class.quantum, &data);
    let mut config = quick_config("n1");
    config.export.row_group_rows = 1_500;
    config.export.max_file_rows = 3_000;
    config.export.part_bytes = 4 * 1024;
    config.retry.attempts = 2;
    (hot, class, data, config)
}

/// Every row of every points file in `store`, committed or not: what a foreign engine reading
/// `node=*/points/**/*.parquet` sees.
async fn all_rows(store: &dyn ObjectStore) -> Vec<(String, Point)> {
    let metas: Vec<_> = store.list(None).try_collect().await.unwrap();
    let mut out = Vec::new();
    for m in metas.into_iter().filter(|m| {
        matches!(timeshard_tier::FileId::parse(&m.location), Some((_, timeshard_tier::layout::Kind::Points)))
    }) {
        let file = ParquetFile::open(store, &m.location).await.unwrap();
        for rg in 0..file.meta.num_row_groups() {
            let span = Span { rg, start: 0, end: file.meta.row_group(rg).num_rows() as usize };
            let cols = [col::SERIES_KEY, col::TIMESTAMP, col::VALUE, col::EVENT_ID];
            let pages = file.fetch(store, &span, &cols).await.unwrap();
            let keys = file.decode::<ByteArrayType>(&pages, &span, col::SERIES_KEY).unwrap();
            let ts = file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP).unwrap();
            let v = file.decode::<DoubleType>(&pages, &span, col::VALUE).unwrap();
            let e = file.decode::<Int64Type>(&pages, &span, col::EVENT_ID).unwrap();
            for i in 0..span.end {
                let key = String::from_utf8(keys[i].data().to_vec()).unwrap();
                out.push((key, Point { ts: ts[i], value: v[i], event: e[i] as u64 }));
            }
        }
    }
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

fn expected_rows(data: &[(SeriesKey, Vec<Point>)]) -> Vec<(String, Point)> {
    let mut out: Vec<_> = data.iter().flat_map(|(s, ps)| ps.iter().map(move |p| (s.to_string(), *p))).collect();
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

/// After a completed export: every block is confirmed, reads equal the hot data, and the
/// points files hold each point exactly once with no uncommitted file left.
async fn assert_complete(
    store: Arc<dyn ObjectStore>,
    hot: &Arc<MemStore>,
    class: &timeshard_proto::SeriesClass,
    data: &[(SeriesKey, Vec<Point>)],
    context: &str,
) {
    let reader = Archive::with_store(Arc::clone(&store), quick_config("reader")).unwrap();
    let blocks = hot_blocks(&**hot);
    let asked: Vec<_> =
        blocks.iter().map(|(s, q)| (s.clone(), *q, hot.block_info(s, q.start).unwrap().unwrap().digest)).collect();
    assert!(reader.confirmed(class, &asked).await.unwrap().iter().all(|&c| c), "{context}: all confirmed");
    let range = TimeRange::new(T0 - 2 * DAY, T0 + 3 * DAY).unwrap();
    for (s, points) in data {
        assert_eq!(&read_all(&reader, class, s, range, 4_000).await, points, "{context}: reads of {s}");
    }
    assert!(all_rows(&*store).await == expected_rows(data), "{context}: each point once in the points files");
    let status = reader.status().await.unwrap();
    assert!(status.uncommitted.is_empty() && status.dangling.is_empty(), "{context}: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_operation_then_a_rerun_leaves_no_duplicate_and_no_gap() {
    let (hot, class, data, config) = setup();
    let blocks = hot_blocks(&*hot);
    // A clean run, to count its operations.
    let counted = FaultyStore::new(Arc::new(InMemory::new()));
    let clean = Archive::with_store(Arc::new(counted.clone()), config.clone()).unwrap();
    let report = clean.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    assert!(report.files.len() >= 4, "several files per day: {:?}", report.files);
    let total = counted.ops();
    assert!(total > 30, "{total} operations");
    assert_complete(Arc::clone(counted.inner()), &hot, &class, &data, "clean run").await;

    let crashes = (0..total).flat_map(|n| [Fault::FailFrom(n), Fault::CrashAfter(n)]);
    for crash in crashes {
        let crash_at = format!("{crash:?}");
        let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = FaultyStore::new(Arc::clone(&base));
        faulty.set_fault(crash);
        let dying = Archive::with_store(Arc::new(faulty), config.clone()).unwrap();
        let crashed = dying.export(hot.clone(), &class, blocks.clone()).await;
        assert!(crashed.is_err(), "{crash_at} of {total} operations, yet the export succeeded");
        // The node restarts: a new handle on the same archive exports the same blocks.
        let restarted = Archive::with_store(Arc::clone(&base), config.clone()).unwrap();
        let rerun = restarted.export(hot.clone(), &class, blocks.clone()).await.unwrap();
        assert_eq!(rerun.confirmed.len(), blocks.len(), "crash at {crash_at}");
        assert_complete(base, &hot, &class, &data, &crash_at).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_failed_operation_is_retried_away() {
    let (hot, class, data, config) = setup();
    let blocks = hot_blocks(&*hot);
    let counted = FaultyStore::new(Arc::new(InMemory::new()));
    Archive::with_store(Arc::new(counted.clone()), config.clone())
        .unwrap()
        .export(hot.clone(), &class, blocks.clone())
        .await
        .unwrap();
    let total = counted.ops();
    for fail_at in 0..total {
        let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = FaultyStore::new(Arc::clone(&base));
        faulty.set_fault(Fault::FailOnly(BTreeSet::from([fail_at])));
        let archive = Archive::with_store(Arc::new(faulty), config.clone()).unwrap();
        let report = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
        assert_eq!(report.confirmed.len(), blocks.len());
        assert_complete(base, &hot, &class, &data, &format!("failure of operation {fail_at}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_fails_the_export_and_leaves_hot_data_alone() {
    let (hot, class, data, config) = setup();
    let blocks = hot_blocks(&*hot);
    let before: Vec<_> = blocks.iter().map(|(s, q)| hot.block_info(s, q.start).unwrap()).collect();
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    faulty.set_fault(Fault::FailFrom(0));
    let archive = Archive::with_store(Arc::new(faulty.clone()), config.clone()).unwrap();
    let err = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap_err();
    assert!(matches!(err, timeshard_tier::Error::Store { .. }), "{err}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("injected failure"), "{err}");
    // Retried as configured: the listing was tried `attempts` times.
    assert_eq!(faulty.ops(), u64::from(config.retry.attempts));
    let after: Vec<_> = blocks.iter().map(|(s, q)| hot.block_info(s, q.start).unwrap()).collect();
    assert_eq!(before, after, "hot blocks untouched");
    let range = TimeRange::new(T0 - 2 * DAY, T0 + 3 * DAY).unwrap();
    assert_eq!(hot_read_all(&*hot, &data[0].0, range), data[0].1);
    // The failure is kept for `timeshard archive status` (read once the store is back).
    faulty.set_fault(Fault::None);
    let status = archive.status().await.unwrap();
    let last = status.last_export.unwrap();
    assert!(last.error.is_some_and(|e| e.contains("injected failure")));
    assert_eq!(last.files, 0);
    // Once the store is back, the same export completes.
    archive.export(hot.clone(), &class, blocks).await.unwrap();
    assert_complete(Arc::clone(faulty.inner()), &hot, &class, &data, "after the outage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_keep_the_last_listing_while_the_store_is_unreachable() {
    let (hot, class, data, mut config) = setup();
    config.cache.listing_ttl = std::time::Duration::ZERO;
    let blocks = hot_blocks(&*hot);
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let archive = Archive::with_store(Arc::new(faulty.clone()), config).unwrap();
    assert_eq!(archive.horizon(&class), None, "never listed");
    archive.export(hot.clone(), &class, blocks).await.unwrap();
    let range = TimeRange::new(T0 - 2 * DAY, T0 + 3 * DAY).unwrap();
    assert_eq!(read_all(&archive, &class, &data[0].0, range, 4_000).await, data[0].1);
    // Every point of the class lies before the horizon: the day after the last partition,
    // plus a quantum.
    let horizon = archive.horizon(&class).unwrap();
    let last = data.iter().flat_map(|(_, p)| p).map(|p| p.ts).max().unwrap();
    assert!(horizon.cold_until > last, "{horizon:?}");
    assert!(horizon.cold_until <= last - last.rem_euclid(DAY) + DAY + class.quantum.ns());
    // The listing a read starts with fails (the TTL is zero: every read lists): the last
    // listing serves. A relisting reports its failure and keeps the listing too.
    let failing = faulty.ops();
    faulty.set_fault(Fault::FailOnly(BTreeSet::from([failing])));
    assert_eq!(read_all(&archive, &class, &data[0].0, range, 4_000).await, data[0].1);
    assert!(faulty.log()[failing as usize].starts_with("list"), "{:?}", faulty.log()[failing as usize]);
    faulty.set_fault(Fault::FailOnly(BTreeSet::from([faulty.ops()])));
    assert!(archive.relist(&class).await.is_err());
    assert_eq!(archive.horizon(&class).map(|h| h.cold_until), Some(horizon.cold_until));
    // A handle that never listed cannot tell what the archive holds, and says so.
    faulty.set_fault(Fault::FailFrom(faulty.ops()));
    let fresh = Archive::with_store(Arc::new(faulty.clone()), quick_config("other")).unwrap();
    assert!(fresh.read(&class, &data[0].0, range, None, 10).await.is_err());
}

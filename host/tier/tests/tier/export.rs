//! Export and read back through an in-memory object store: every point and every aggregate
//! equals the hot store's, repeats write nothing, late data merges, caps split files.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, TimeRange};
use timeshard_store::Store;
use timeshard_tier::layout::Kind;
use timeshard_tier::{Archive, FileId};

use crate::support::*;

fn memory() -> Arc<dyn ObjectStore> {
    Arc::new(InMemory::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_day_reads_back_point_for_point() {
    let class = class("pmu", 10);
    let (a, b) = (series("pmu.phase{bus=1}"), series("pmu.phase{bus=2}"));
    // Two hours of 60 Hz on two series, starting an hour before midnight: two days.
    let start = T0 - T0.rem_euclid(DAY) + DAY - 3600 * SEC;
    let data =
        vec![(a.clone(), signal_points(1, start, 60, 432_000)), (b.clone(), signal_points(2, start, 60, 432_000))];
    let hot = hot_store(class.quantum, &data);
    let blocks = hot_blocks(&*hot);
    let archive = Archive::with_store(memory(), quick_config("n1")).unwrap();

    let report = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    assert_eq!(report.confirmed.len(), blocks.len());
    assert!(report.confirmed.iter().all(|c| !c.already));
    assert_eq!(report.rows, 864_000);
    assert_eq!(report.files.len(), 2, "one file per class-day: {:?}", report.files);
    // Each confirmation carries the hot block's digest.
    for c in &report.confirmed {
        assert_eq!(Some(c.digest), hot.block_info(&c.series, c.quantum.start).unwrap().map(|i| i.digest));
    }

    let range = TimeRange::new(start - DAY, start + 2 * DAY).unwrap();
    let hours = TimeRange::new(start - 600 * SEC, start + 3 * 3600 * SEC).unwrap();
    for (s, points) in &data {
        for limit in [1_000, 65_536, 1_000_000] {
            assert_eq!(&read_all(&archive, &class, s, range, limit).await, points, "{s} in pages of {limit}");
        }
        // A range cut inside quanta and across midnight.
        let cut = TimeRange::new(start + 1_234 * SEC + 5, start + 5_000 * SEC + 7).unwrap();
        assert_eq!(read_all(&archive, &class, s, cut, 10_000).await, hot_read_all(&*hot, s, cut));
        for width in [60 * SEC, 3600 * SEC, DAY] {
            assert_same_aggregates(&archive, &*hot, &class, s, range, width).await;
        }
        for width in [SEC, 7 * SEC, 10 * SEC, 60 * SEC, 3600 * SEC] {
            assert_same_aggregates(&archive, &*hot, &class, s, hours, width).await;
            assert_same_aggregates(&archive, &*hot, &class, s, cut, width).await;
        }
    }
    let asked: Vec<_> = report.confirmed.iter().map(|c| (c.series.clone(), c.quantum, c.digest)).collect();
    assert!(archive.confirmed(&class, &asked).await.unwrap().iter().all(|&c| c));
    let (s0, q0, d0) = &asked[0];
    assert!(!archive.contains(&class, s0, *q0, d0.wrapping_add(1)).await.unwrap(), "another digest is not covered");

    // A second export, even from a new handle, writes nothing and confirms everything.
    let again = Archive::with_store(Arc::clone(archive.store()), quick_config("n1")).unwrap();
    let report2 = again.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    assert!(report2.files.is_empty() && report2.rows == 0);
    assert_eq!(report2.confirmed.len(), blocks.len());
    assert!(report2.confirmed.iter().all(|c| c.already));
    let status = again.status().await.unwrap();
    assert_eq!(status.classes.len(), 1);
    assert_eq!((status.classes[0].exports, status.classes[0].days), (2, 2));
    assert!(status.uncommitted.is_empty() && status.dangling.is_empty());
    assert_eq!(status.last_export.unwrap().error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_data_is_exported_as_a_diff_and_merges() {
    let class = class("c", 10);
    let s = series("m{id=1}");
    let points = signal_points(1, T0, 10, 6_000); // 10 minutes at 10 Hz
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    let archive = Archive::with_store(memory(), quick_config("n1")).unwrap();
    let first = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert_eq!(first.files.len(), 1);

    // Late points: some into exported blocks (one repeating a point already stored, another
    // at the same timestamp with an event id), and a block of its own.
    let late = vec![
        Point { ts: T0 + 5 * SEC + 1, value: 1.5, event: 0 },
        points[100],
        Point { ts: points[200].ts, value: points[200].value, event: 7 },
        Point { ts: T0 + 3_000 * SEC, value: -2.0, event: 0 },
    ];
    hot.write(&to_blocks(&s, class.quantum, &late)).unwrap();
    let blocks = hot_blocks(&*hot);
    let second = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    assert_eq!(second.files.len(), 1);
    assert_eq!(second.rows, 3, "only the points the archive lacked are written");
    assert_eq!(second.confirmed.iter().filter(|c| !c.already).count(), 3);

    let mut want = points.clone();
    want.extend(&late);
    timeshard_proto::point::sort_dedup(&mut want);
    let range = TimeRange::new(T0 - 3600 * SEC, T0 + 3600 * SEC).unwrap();
    assert_eq!(read_all(&archive, &class, &s, range, 777).await, want);
    for width in [SEC, 10 * SEC, 60 * SEC, 3600 * SEC] {
        assert_same_aggregates(&archive, &*hot, &class, &s, range, width).await;
    }

    // The hot copies are dropped; a point arriving later for a dropped block is exported
    // against the archive, and both the hot block (one point) and the archive's union are
    // covered.
    for c in &second.confirmed {
        assert!(hot.drop_block(&c.series, c.quantum.start, c.digest).unwrap());
    }
    let later = Point { ts: T0 + 15 * SEC + 3, value: 4.25, event: 0 };
    hot.write(&to_blocks(&s, class.quantum, &[later])).unwrap();
    let third = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert_eq!((third.rows, third.confirmed.len()), (1, 1));
    let q = class.quantum.quantum_of(later.ts);
    let digest = hot.block_info(&s, q.start).unwrap().unwrap().digest;
    assert!(archive.contains(&class, &s, q, digest).await.unwrap());
    want.push(later);
    timeshard_proto::point::sort_dedup(&mut want);
    assert_eq!(read_all(&archive, &class, &s, range, 100_000).await, want);
    let windows = archive.aggregate(&class, &s, range, Grid::epoch(10 * SEC)).await.unwrap();
    assert_eq!(windows.iter().map(|w| w.count).sum::<u64>(), want.len() as u64);
    let w = windows.iter().find(|w| w.start == q.start).unwrap();
    assert_eq!(w.digest, timeshard_proto::point::set_digest(want.iter().filter(|p| q.contains(p.ts))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_split_files_and_row_groups_and_keep_rows_sorted() {
    let class = class("c", 60);
    let data: Vec<_> = (0..5u64).map(|i| (series(&format!("m{{id={i}}}")), signal_points(i, T0, 10, 3_000))).collect();
    let hot = hot_store(class.quantum, &data);
    let mut config = quick_config("n1");
    config.export.row_group_rows = 1_000;
    config.export.max_file_rows = 4_000;
    config.export.part_bytes = 8 * 1024; // many parts per file
    let store = memory();
    let archive = Archive::with_store(Arc::clone(&store), config).unwrap();
    let report = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert_eq!(report.rows, 15_000);
    let seqs: Vec<u64> = report.files.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, (1..=report.files.len() as u64).collect::<Vec<_>>());
    let mut total = 0;
    for (i, id) in report.files.iter().enumerate() {
        let file = timeshard_tier::read::ParquetFile::open(&*store, &id.path(Kind::Points)).await.unwrap();
        // Files close at the first block boundary at or after 4,000 rows (blocks: up to 600).
        if i + 1 < report.files.len() {
            assert!((4_000..4_600).contains(&file.rows()), "{id}: {} rows", file.rows());
        }
        assert_eq!(file.meta.num_row_groups() as u64, file.rows().div_ceil(1_000));
        total += file.rows();
    }
    assert_eq!(total, 15_000);
    let range = TimeRange::new(T0, T0 + DAY).unwrap();
    for (s, points) in &data {
        assert_eq!(&read_all(&archive, &class, s, range, 2_500).await, points);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_fails_its_queries_by_name_and_spares_the_others() {
    let class = class("c", 10);
    let (a, b) = (series("m{id=1}"), series("m{id=2}"));
    let hot_a = hot_store(class.quantum, &[(a.clone(), signal_points(1, T0, 10, 3_000))]);
    let hot_b = hot_store(class.quantum, &[(b.clone(), signal_points(2, T0, 10, 3_000))]);
    let store = memory();
    // Two nodes export one series each into the same partition.
    let na = Archive::with_store(Arc::clone(&store), quick_config("na")).unwrap();
    let nb = Archive::with_store(Arc::clone(&store), quick_config("nb")).unwrap();
    let ra = na.export(hot_a.clone(), &class, hot_blocks(&*hot_a)).await.unwrap();
    nb.export(hot_b.clone(), &class, hot_blocks(&*hot_b)).await.unwrap();

    // Truncate node a's points file.
    let path = ra.files[0].path(Kind::Points);
    let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
    store.put(&path, bytes.slice(..bytes.len() / 2).into()).await.unwrap();

    let reader = Archive::with_store(Arc::clone(&store), quick_config("r")).unwrap();
    let range = TimeRange::new(T0, T0 + DAY).unwrap();
    let err = reader.read(&class, &a, range, None, 100).await.unwrap_err();
    assert!(matches!(err, timeshard_tier::Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(path.as_ref()), "the error names the file: {err}");
    // Whole-quantum aggregates of the damaged series still come from its manifest ...
    let windows = reader.aggregate(&class, &a, range, Grid::epoch(60 * SEC)).await.unwrap();
    assert_eq!(windows.iter().map(|w| w.count).sum::<u64>(), 3_000);
    // ... and the other series is served in full.
    assert_eq!(read_all(&reader, &class, &b, range, 1_000).await, hot_read_all(&*hot_b, &b, range));

    // A corrupt manifest: queries of its partition name it.
    let mpath = ra.files[0].path(Kind::Manifest);
    store.put(&mpath, bytes::Bytes::from_static(b"not parquet").into()).await.unwrap();
    let fresh = Archive::with_store(Arc::clone(&store), quick_config("r2")).unwrap();
    let err = fresh.read(&class, &b, range, None, 100).await.unwrap_err();
    assert!(err.to_string().contains(mpath.as_ref()), "{err}");
    let other_day = TimeRange::new(T0 + 2 * DAY, T0 + 3 * DAY).unwrap();
    assert!(fresh.read(&class, &b, other_day, None, 100).await.unwrap().points.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_checked() {
    let store = memory();
    assert!(Archive::with_store(Arc::clone(&store), quick_config("bad/node")).is_err());
    let archive = Archive::with_store(store, quick_config("n")).unwrap();
    let hot = hot_store(class("c", 10).quantum, &[]);
    let err = archive.export(hot, &class("no spaces", 10), Vec::new()).await.unwrap_err();
    assert!(err.to_string().contains("no spaces"), "{err}");
    let id = FileId { class: "c".into(), day: timeshard_tier::Day(1), node: "n".into(), seq: 3, legacy: false };
    assert_eq!(id.to_string(), "node=n/class=c/day=1970-01-02/n-0000000003");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_points_file_is_an_error_never_other_values() {
    // zstd pages carry no checksum: a flipped byte used to decode to other values, silently.
    let class = class("c", 10);
    let a = series("m{id=1}");
    let hot = hot_store(class.quantum, &[(a.clone(), signal_points(1, T0, 10, 3_000))]);
    let store = memory();
    let node = Archive::with_store(Arc::clone(&store), quick_config("na")).unwrap();
    let report = node.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    let path = report.files[0].path(Kind::Points);
    let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
    let range = TimeRange::new(T0, T0 + DAY).unwrap();
    let want = hot_read_all(&*hot, &a, range);
    let (mut exact, mut refused) = (0, 0);
    // Every 61st byte of the file (the column chunks, their page headers and the footer).
    for at in (0..bytes.len()).step_by(61) {
        let mut damaged = bytes.to_vec();
        damaged[at] ^= 0x5a;
        store.put(&path, damaged.into()).await.unwrap();
        let reader = Archive::with_store(Arc::clone(&store), quick_config("r")).unwrap();
        let mut got = Vec::new();
        let mut after = None;
        let outcome = loop {
            match reader.read(&class, &a, range, after, 1_000).await {
                Ok(page) => {
                    after = page.points.last().map(|p| p.key());
                    got.extend(page.points);
                    if !page.more {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        match outcome {
            Ok(()) => {
                assert_eq!(got.len(), want.len(), "byte {at} of {}: a read without an error", bytes.len());
                assert!(got == want, "byte {at} of {}: a read without an error gives other points", bytes.len());
                exact += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains(path.as_ref()), "byte {at}: the error names the file: {e}");
                refused += 1;
            }
        }
    }
    println!("{} bytes flipped one at a time: {exact} reads exact, {refused} refused naming the file", exact + refused);
    assert!(refused > 0);
}

/// A damaged hot block (a flipped byte in its sealed frame) is left out of the export, named in
/// the report, and kept hot; every other block is exported and reads back, so one bad block
/// does not hold back the queue behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_hot_block_is_left_out_and_the_rest_is_exported() {
    use timeshard_store::DiskStore;
    use timeshard_store::faulty_disk::FaultyDisk;
    let class = class("pmu", 10);
    let disk = FaultyDisk::new();
    let hot = Arc::new(DiskStore::open_with_backend(Arc::new(disk.clone()), Default::default()).unwrap());
    let data: Vec<_> =
        (1..=3).map(|bus| (series(&format!("pmu.phase{{bus={bus}}}")), signal_points(bus, T0, 60, 3_000))).collect();
    for (s, points) in &data {
        hot.write(&to_blocks(s, class.quantum, points)).unwrap();
    }
    while hot.maintain(T0 + DAY).unwrap().more {}
    // Flip a byte in the middle of the block segment: it lands in one block's frame.
    let (segment, len) = disk.files().into_iter().find(|(f, _)| f.starts_with("blocks/")).expect("a block segment");
    disk.corrupt(&segment, len / 2, 0xff);
    let blocks = hot_blocks(&*hot);
    let damaged: Vec<_> =
        blocks.iter().filter(|(s, q)| hot.read_block(s, q.start, None, 1 << 20).is_err()).cloned().collect();
    assert_eq!(damaged.len(), 1, "one damaged block: {damaged:?}");

    let archive = Archive::with_store(memory(), quick_config("n1")).unwrap();
    let report = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    let unreadable: Vec<_> = report.unreadable.iter().map(|(s, q, _)| (s.clone(), *q)).collect();
    assert_eq!(unreadable, damaged, "the damaged block is named");
    assert!(!report.unreadable[0].2.is_empty(), "and why");
    assert_eq!(report.confirmed.len(), blocks.len() - 1, "every other block is exported");
    assert!(report.confirmed.iter().all(|c| (c.series.clone(), c.quantum) != damaged[0]));
    let range = TimeRange::new(T0 - DAY, T0 + DAY).unwrap();
    for (s, _) in &data {
        let want: Vec<Point> = hot_read_all_blocks(&*hot, s, &blocks, &damaged);
        assert_eq!(read_all(&archive, &class, s, range, 10_000).await, want, "{s}");
    }
}

/// The points of `series`'s blocks among `blocks`, less the `damaged` ones.
fn hot_read_all_blocks(
    hot: &dyn Store,
    series: &timeshard_proto::SeriesKey,
    blocks: &[(timeshard_proto::SeriesKey, timeshard_proto::Quantum)],
    damaged: &[(timeshard_proto::SeriesKey, timeshard_proto::Quantum)],
) -> Vec<Point> {
    let mut out = Vec::new();
    for b in blocks.iter().filter(|b| b.0 == *series && !damaged.contains(b)) {
        out.extend(hot.read_block(&b.0, b.1.start, None, 1 << 20).unwrap().points);
    }
    out
}

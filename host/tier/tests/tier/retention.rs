//! Retention of the archive: points past it are hidden from reads and aggregates at once, files
//! wholly past it are removed manifest first, and a failure between the two deletions leaves
//! only an uncommitted file that the cleanup removes.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use timeshard_clock::now_ns;
use timeshard_proto::{AgeBy, Point, TimeRange};
use timeshard_store::Store;
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::{Archive, Retention};

use crate::support::*;

async fn objects(store: &dyn ObjectStore) -> Vec<String> {
    use futures::TryStreamExt;
    let mut names: Vec<String> = store.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_points_vanish_and_their_files_go_manifest_first() {
    let class = class("c", 10);
    let s = series("m{id=1}");
    // Three days from a midnight, a point every ten minutes, 5 s into its quantum.
    let day0 = T0 - T0.rem_euclid(DAY);
    let points: Vec<Point> = (0..3 * 144).map(|i| Point::new(day0 + i * 600 * SEC + 5 * SEC, i as f64)).collect();
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let archive = Archive::with_store(Arc::new(faulty.clone()), quick_config("n1")).unwrap();
    let report = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert_eq!(report.files.len(), 3);
    let everything = TimeRange::new(day0, day0 + 3 * DAY).unwrap();
    assert_eq!(read_all(&archive, &class, &s, everything, 1000).await, points);

    // Keep what ends after the middle of the second day: the first day and a half vanish from
    // reads and aggregates at once.
    let cut = day0 + DAY + DAY / 2;
    let retention = Retention { keep_ns: now_ns() - cut, age_by: AgeBy::Event };
    archive.set_retention(&class.name, Some(retention));
    let kept: Vec<Point> = points.iter().filter(|p| p.ts >= cut).copied().collect();
    assert_eq!(read_all(&archive, &class, &s, everything, 1000).await, kept);
    assert_eq!(read_all(&archive, &class, &s, everything, 7).await, kept, "in small pages");
    let reference = hot_store(class.quantum, &[(s.clone(), kept.clone())]);
    for width in [3600 * SEC, DAY] {
        assert_same_aggregates(&archive, &*reference, &class, &s, everything, width).await;
    }
    let before = objects(archive.store().as_ref()).await;
    assert_eq!(before.len(), 6, "nothing removed by hiding: {before:?}");

    // The first day's files go, manifest first: the points delete fails here (as a crash
    // would stop it), leaving an uncommitted points file and nothing a reader follows. (Two
    // listings, this node's folder and the legacy layout's, then the manifest's delete.)
    faulty.set_fault(Fault::FailFrom(faulty.ops() + 3));
    assert!(archive.expire(&class, retention, now_ns()).await.is_err());
    faulty.set_fault(Fault::None);
    let status = archive.status().await.unwrap();
    assert_eq!(status.classes[0].exports, 2, "the first day's manifest is gone");
    assert_eq!(status.uncommitted.len(), 1, "{status:?}");
    assert!(status.uncommitted[0].contains(&timeshard_tier::Day::of(day0).to_string()));
    assert!(status.dangling.is_empty());
    assert_eq!(read_all(&archive, &class, &s, everything, 1000).await, kept);
    // Another handle (another node) reads the same.
    let other = Archive::with_store(Arc::clone(faulty.inner()), quick_config("n2")).unwrap();
    other.set_retention(&class.name, Some(retention));
    assert_eq!(read_all(&other, &class, &s, everything, 1000).await, kept);
    // A repeat removes nothing more (the second day is not wholly past retention), and the
    // cleanup takes the leftover.
    assert!(archive.expire(&class, retention, now_ns()).await.unwrap().removed.is_empty());
    assert_eq!(archive.cleanup(Duration::ZERO).await.unwrap().removed.len(), 1);
    let after = objects(archive.store().as_ref()).await;
    assert_eq!(after.len(), 4, "{after:?}");
    assert!(after.iter().all(|o| !o.contains(&timeshard_tier::Day::of(day0).to_string())));
    assert_eq!(read_all(&archive, &class, &s, everything, 1000).await, kept);

    // Without retention, what is left reads whole again: hiding never deleted anything.
    archive.set_retention(&class.name, None);
    let left: Vec<Point> = points.iter().filter(|p| p.ts >= day0 + DAY).copied().collect();
    assert_eq!(read_all(&archive, &class, &s, everything, 1000).await, left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_write_time_ages_each_export_from_its_writes() {
    let class = class("c", 10);
    let s = series("m{id=1}");
    let day0 = T0 - T0.rem_euclid(DAY);
    // Two exports of old points: the first written long ago, the second just now (late data
    // for the same day and a block of it).
    let first: Vec<Point> = (0..10).map(|i| Point::new(day0 + i * 60 * SEC, i as f64)).collect();
    let hot = hot_store(class.quantum, &[(s.clone(), first.clone())]);
    let archive = Archive::with_store(Arc::new(InMemory::new()), quick_config("n1")).unwrap();
    archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    let second = vec![Point::new(day0 + 5 * SEC, 99.0), Point::new(day0 + 3600 * SEC, 7.0)];
    hot.maintain(now_ns()).unwrap();
    hot.write(&to_blocks(&s, class.quantum, &second)).unwrap();
    let late: Vec<_> = hot_blocks(&*hot).into_iter().filter(|(_, q)| second.iter().any(|p| q.contains(p.ts))).collect();
    archive.export(hot.clone(), &class, late).await.unwrap();
    let range = TimeRange::new(day0, day0 + DAY).unwrap();
    let mut all = [first.clone(), second.clone()].concat();
    all.sort();
    assert_eq!(read_all(&archive, &class, &s, range, 1000).await, all);

    // Kept ten minutes by write time: the first export's points go, the late part stays.
    let retention = Retention { keep_ns: 600 * SEC, age_by: AgeBy::Write };
    archive.set_retention(&class.name, Some(retention));
    assert_eq!(read_all(&archive, &class, &s, range, 1000).await, second);
    let reference = hot_store(class.quantum, &[(s.clone(), second.clone())]);
    assert_same_aggregates(&archive, &*reference, &class, &s, range, 3600 * SEC).await;
    let removed = archive.expire(&class, retention, now_ns()).await.unwrap().removed;
    assert_eq!(removed.len(), 1, "only the first export: {removed:?}");
    assert_eq!(objects(archive.store().as_ref()).await.len(), 2);
    assert_eq!(read_all(&archive, &class, &s, range, 1000).await, second);
}

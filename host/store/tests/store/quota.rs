//! Quotas by class: a class that allows eviction keeps its newest data within its quota and
//! counts what it dropped, durably; a class that refuses is only measured, never evicted.

use timeshard_proto::{Point, SeriesKey};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{DiskConfig, QuotaRule, Store};

use crate::common::*;

const MS: i64 = 1_000_000;

/// 50 points in each of `quanta` 1 ms quanta, with values that do not compress away.
fn fill(store: &dyn Store, k: &SeriesKey, quanta: i64) -> Vec<Point> {
    let pts: Vec<Point> =
        (0..quanta * 50).map(|i| Point::new(i * (MS / 50), ((i * 7919) % 10007) as f64 * 0.37)).collect();
    for chunk in pts.chunks(5_000) {
        store.write(&blocks(k, qlen(), chunk)).unwrap();
    }
    pts
}

fn rules() -> Vec<QuotaRule> {
    vec![
        QuotaRule { metric_prefix: "".into(), max_bytes: None, evict_oldest: false },
        QuotaRule { metric_prefix: "a.".into(), max_bytes: Some(20_000), evict_oldest: true },
        QuotaRule { metric_prefix: "b.".into(), max_bytes: Some(20_000), evict_oldest: false },
    ]
}

#[test]
fn an_evicting_class_keeps_its_newest_points_within_its_quota_and_counts_the_rest() {
    let disk = FaultyDisk::new();
    let store = open(&disk, DiskConfig { quotas: rules(), ..small_config() });
    let (a, b, other): (SeriesKey, SeriesKey, SeriesKey) =
        ("a.x".parse().unwrap(), "b.x".parse().unwrap(), "c.x".parse().unwrap());
    let written = fill(&store, &a, 400);
    fill(&store, &b, 400);
    fill(&store, &other, 400);
    let now = 1_000 * MS;
    settle(&store, now);
    // Measured again after everything is sealed.
    settle(&store, now + 2_000 * MS);
    let uses = store.quota_use();
    let (ua, ub, uc) = (&uses[1], &uses[2], &uses[0]);
    assert!(ua.bytes <= 20_000 && !ua.full(), "the evicting class is within its quota: {ua:?}");
    assert!(ub.bytes > 20_000 && ub.full(), "the refusing class is only measured: {ub:?}");
    assert!(uc.bytes > 20_000 && uc.max_bytes.is_none(), "{uc:?}");
    assert_eq!((ub.evicted_blocks, uc.evicted_blocks), (0, 0));
    let kept = read_all(&store, &a, 10_000);
    assert!(!kept.is_empty() && kept.len() < written.len());
    assert_eq!(kept[..], written[written.len() - kept.len()..], "the newest points stay, in one piece");
    assert_eq!(ua.evicted_points as usize, written.len() - kept.len(), "every dropped point is counted");
    assert_eq!(ua.evicted_blocks as usize, (written.len() - kept.len()) / 50);
    assert_eq!(read_all(&store, &b, 10_000).len(), 20_000, "the refusing class lost nothing");
    assert_eq!(read_all(&store, &other, 10_000).len(), 20_000);

    // The eviction is durable, and points below it are not stored again.
    drop(store);
    let store = open(&disk.crash(7), DiskConfig { quotas: rules(), ..small_config() });
    store.write(&blocks(&a, qlen(), &written[..50])).unwrap();
    settle(&store, now + 4_000 * MS);
    assert_eq!(read_all(&store, &a, 10_000), kept);
}

#[test]
fn quotas_can_be_changed_while_open() {
    let store = open(&FaultyDisk::new(), small_config());
    let a: SeriesKey = "a.x".parse().unwrap();
    fill(&store, &a, 100);
    settle(&store, 1_000 * MS);
    assert!(store.quota_use().is_empty(), "no rules, nothing measured");
    store.set_quotas(rules());
    settle(&store, 2_000 * MS);
    let uses = store.quota_use();
    assert!(uses[1].evicted_blocks > 0 && uses[1].bytes <= 20_000, "{uses:?}");
    assert_eq!(read_all(&store, &a, 10_000).len() as u64 + uses[1].evicted_points, 5_000);
}

/// Found by a flaky e2e run: points written between a maintenance step's seal and its measure
/// are open, counted at 24 bytes each, several times what they take sealed. Counted so, 800
/// open points in a class of 20,000 bytes made eviction take every block of the history.
#[test]
fn open_points_do_not_make_eviction_take_the_whole_history() {
    let store = open(&FaultyDisk::new(), DiskConfig { quotas: rules(), ..small_config() });
    let (history, live): (SeriesKey, SeriesKey) = ("a.history".parse().unwrap(), "a.live".parse().unwrap());
    let written = fill(&store, &history, 400);
    settle(&store, 1_000 * MS);
    settle(&store, 3_000 * MS);
    let before = read_all(&store, &history, 10_000);
    assert!(!before.is_empty() && before.len() < written.len(), "the history was evicted down to the quota");
    // 800 points in a quantum that has not ended: open, and never themselves evicted.
    let now = 5_000 * MS;
    let open: Vec<Point> = (0..800).map(|i| Point::new(now + i * 1_000, ((i * 7919) % 10007) as f64 * 0.37)).collect();
    store.write(&blocks(&live, qlen(), &open)).unwrap();
    store.maintain(now + MS / 2).unwrap();
    let kept = read_all(&store, &history, 10_000);
    assert!(!kept.is_empty(), "eviction took the whole history for 800 open points");
    assert_eq!(kept[..], written[written.len() - kept.len()..]);
    assert_eq!(read_all(&store, &live, 10_000), open);
    // Sealed, the class comes within its quota.
    settle(&store, now + 2_000 * MS);
    settle(&store, now + 4_000 * MS);
    assert!(store.quota_use()[1].bytes <= 20_000, "{:?}", store.quota_use()[1]);
}

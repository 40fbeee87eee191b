//! Retention by class: the rule with the longest matching prefix decides, rules that keep
//! forever included, so a keep-forever class under a shorter prefix with a retention, and the
//! quantum index of a keep-forever class under a catch-all retention, are never expired.

use timeshard_proto::{Point, SeriesKey};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{DiskConfig, RetentionRule, Store};

use crate::common::*;

const DAY: i64 = 86_400 * 1_000_000_000;

/// 100 points, one per quantum (1 ms), at the start of time.
fn fill(store: &dyn Store, k: &SeriesKey) {
    let pts: Vec<Point> = (0..100).map(|i| Point::new(i * 1_000_000, 1.0)).collect();
    store.write(&blocks(k, qlen(), &pts)).unwrap();
}

#[test]
fn a_keep_forever_class_under_a_shorter_prefix_with_retention_keeps_its_points() {
    // Class `pmu.` keeps 90 days; class `pmu.phase` sets no retention (keeps forever).
    let rules = vec![RetentionRule::new("pmu.", 90 * DAY), RetentionRule::forever("pmu.phase")];
    let disk = FaultyDisk::new();
    let store = open(&disk, DiskConfig { retention: rules.clone(), ..small_config() });
    let phase: SeriesKey = "pmu.phase.a{site=atl}".parse().unwrap();
    let freq: SeriesKey = "pmu.freq{site=atl}".parse().unwrap();
    for k in [&phase, &freq] {
        fill(&store, k);
    }
    settle(&store, 100 * DAY);
    assert_eq!(read_all(&store, &freq, 1000).len(), 0, "the 90-day class expired");
    assert_eq!(read_all(&store, &phase, 1000).len(), 100, "the keep-forever class under it did not");
    drop(store);
    let store = open(&disk.crash(1), DiskConfig { retention: rules, ..small_config() });
    settle(&store, 1000 * DAY);
    assert_eq!(read_all(&store, &phase, 1000).len(), 100);
}

#[test]
fn a_catch_all_retention_leaves_the_quantum_index_of_keep_forever_classes() {
    // What a node emits for a catch-all class that keeps 30 days and a class `pmu.` that keeps
    // forever: one rule per class, and timeshard's own series kept as long as the longest-lived
    // class (forever).
    let rules = vec![
        RetentionRule::new("", 30 * DAY),
        RetentionRule::forever("pmu."),
        RetentionRule::forever(timeshard_proto::key::RESERVED_METRIC_PREFIX),
    ];
    let store = open(&FaultyDisk::new(), small_config());
    store.set_retention(rules);
    let pmu: SeriesKey = "pmu.freq{site=atl}".parse().unwrap();
    let index = timeshard_proto::key::quantum_index_series(&pmu);
    let other: SeriesKey = "weather.temp".parse().unwrap();
    for k in [&pmu, &index, &other] {
        fill(&store, k);
    }
    settle(&store, 40 * DAY);
    assert_eq!(read_all(&store, &other, 1000).len(), 0, "the catch-all class expired");
    assert_eq!(read_all(&store, &pmu, 1000).len(), 100);
    assert_eq!(read_all(&store, &index, 1000).len(), 100, "the quantum index stays with its data");
}

#[test]
fn only_rules_that_keep_forever_expire_nothing() {
    let store = open(&FaultyDisk::new(), small_config());
    store.set_retention(vec![RetentionRule::forever(""), RetentionRule::forever("x.")]);
    let k: SeriesKey = "x.y".parse().unwrap();
    fill(&store, &k);
    let mut expired = 0;
    for _ in 0..10 {
        let r = store.maintain(i64::MAX / 2).unwrap();
        expired += r.expired_blocks;
        if !r.more {
            break;
        }
    }
    assert_eq!(expired, 0);
    assert_eq!(read_all(&store, &k, 1000).len(), 100);
}

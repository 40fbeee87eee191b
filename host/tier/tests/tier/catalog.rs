//! The catalog's block lists while a day's exports accumulate: each export round of each node
//! adds a manifest to the day, and a lookup after it decodes that manifest alone, with the
//! same answer as a catalog that decodes the whole day.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use timeshard_proto::TimeRange;
use timeshard_tier::Archive;
use timeshard_tier::faulty::FaultyStore;

use crate::support::*;

/// Requests for manifest files so far.
fn manifest_requests(store: &FaultyStore) -> usize {
    store.log().iter().filter(|op| op.contains("manifests/")).count()
}

#[tokio::test]
async fn a_lookup_after_a_new_export_decodes_only_the_new_manifest() {
    let class = class("c", 10);
    let start = T0 - T0.rem_euclid(DAY) + 3_600 * SEC;
    let s = series("m{id=1}");
    let data = vec![(s.clone(), signal_points(1, start, 5, 3_000))];
    let hot = hot_store(class.quantum, &data);
    let blocks = hot_blocks(&*hot);
    assert_eq!(blocks.len(), 60);
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let counted = FaultyStore::new(Arc::clone(&base));
    let archive = Archive::with_store(Arc::new(counted.clone()), quick_config("n1")).unwrap();
    let range = TimeRange::new(start, start + 600 * SEC).unwrap();
    let mut per_lookup = Vec::new();
    for (round, chunk) in blocks.chunks(10).enumerate() {
        archive.export(hot.clone(), &class, chunk.to_vec()).await.unwrap();
        let before = manifest_requests(&counted);
        let got = archive.blocks(&class, &s, range).await.unwrap();
        per_lookup.push(manifest_requests(&counted) - before);
        assert_eq!(got.len(), 10 * (round + 1), "round {round}");
        let fresh = Archive::with_store(Arc::clone(&base), quick_config("n1")).unwrap();
        assert_eq!(got, fresh.blocks(&class, &s, range).await.unwrap(), "round {round}: a fresh catalog differs");
    }
    // The first lookup reads its one manifest; each later one the new manifest only, not the
    // day's growing list again.
    assert!(per_lookup.iter().all(|&n| n > 0 && n == per_lookup[0]), "manifest requests per lookup: {per_lookup:?}");
}

//! Replays every committed input of every fuzz target on stable: the seed corpora
//! (`fuzz/corpus/<target>/`), every crash a fuzzer ever found (`fuzz/regressions/<target>/`),
//! and the seeds the project's encoders make now. A target that panics on any of them fails.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<_> = entries
        .map(|e| e.expect("a directory entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| (e.path().display().to_string(), std::fs::read(e.path()).expect("readable")))
        .collect();
    out.sort();
    out
}

#[test]
fn every_target_has_a_driver_and_a_seed_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in timeshard_fuzz::TARGETS {
        assert!(root.join("fuzz_targets").join(format!("{name}.rs")).is_file(), "fuzz_targets/{name}.rs is missing");
        assert!(!inputs(&root.join("corpus").join(name)).is_empty(), "corpus/{name}/ holds no seed");
    }
}

#[test]
fn committed_corpora_and_regressions_replay_without_a_crash() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for (name, target) in timeshard_fuzz::TARGETS {
        for dir in ["corpus", "regressions"] {
            for (path, bytes) in inputs(&root.join(dir).join(name)) {
                eprintln!("{path}");
                target(&bytes);
                replayed += 1;
            }
        }
    }
    assert!(replayed >= timeshard_fuzz::TARGETS.len());
}

#[test]
fn the_encoders_seeds_replay_without_a_crash() {
    for (name, seed, bytes) in timeshard_fuzz::seeds::seeds() {
        let (_, target) = timeshard_fuzz::TARGETS.iter().find(|(n, _)| *n == name).expect("a known target");
        eprintln!("{name}/{seed}");
        target(&bytes);
    }
}

/// The committed signed entry (made by another process) still verifies: the fuzz fleet's keys
/// derive from a fixed seed, so mutations of it reach the signature and incarnation checks
/// instead of all failing at the certificate chain.
#[cfg(feature = "node")]
#[test]
fn the_committed_signed_gossip_entry_verifies() {
    let bytes =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/gossip_entry/signed")).expect("the seed");
    let entry: timeshard_proto::membership::GossipEntry = postcard::from_bytes(&bytes).expect("it decodes");
    let now = 1_700_000_000_000_000_000;
    assert_eq!(timeshard_fuzz::fleet::fleet().checker.check(&entry, now), Ok(()));
    let other =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/gossip_entry/other-ca")).expect("the seed");
    let entry: timeshard_proto::membership::GossipEntry = postcard::from_bytes(&other).expect("it decodes");
    assert!(timeshard_fuzz::fleet::fleet().checker.check(&entry, now).is_err());
}

/// The committed sealed manifest opens as verified in the folder of the fleet node that sealed
/// it, so mutations of it reach the seal and row-group checks; in another node's folder it is
/// refused.
#[cfg(feature = "node")]
#[test]
fn the_committed_sealed_manifest_verifies() {
    use object_store::ObjectStoreExt as _;
    use timeshard_tier::layout::Kind;
    let bytes =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/tier_manifest/sealed")).expect("the seed");
    let keys = &timeshard_fuzz::fleet::fleet().archive;
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(async {
        let store = object_store::memory::InMemory::new();
        let id = timeshard_fuzz::fleet::sealed_file_id();
        let other = timeshard_tier::FileId { node: keys.node(), ..id.clone() };
        for at in [&id, &other] {
            store.put(&at.path(Kind::Manifest), bytes.clone().into()).await.expect("stored");
        }
        let manifest = timeshard_tier::manifest::Manifest::open(&store, &id, Some(keys)).await.expect("it verifies");
        assert!(manifest.verified);
        assert_eq!(manifest.entries(&store, None).await.expect("its rows hash right").len(), 1);
        let refused = timeshard_tier::manifest::Manifest::open(&store, &other, Some(keys)).await.unwrap_err();
        assert!(matches!(refused, timeshard_tier::Error::Refused { .. }), "{refused}");
    });
}

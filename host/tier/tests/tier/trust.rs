//! Trust in the archive (issue 25, "The archive"): each node writes and deletes only in its own
//! folder, its manifests are sealed with its TLS key and checked on read, a manifest whose seal
//! fails is refused (named, counted, its blocks not read) while everything else stays readable,
//! two owners exporting one block never count a point twice, and an archive from before folders
//! is still read.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use timeshard_clock::now_ns;
use timeshard_proto::{AgeBy, Point, TimeRange};
use timeshard_sdk::tls::{Identity, NODE_NAME};
use timeshard_tier::layout::Kind;
use timeshard_tier::manifest::{Header, Manifest};
use timeshard_tier::seal::Keys;
use timeshard_tier::write::encode_manifest;
use timeshard_tier::{Archive, Config, FileId, Retention};

use crate::support::*;

/// A fleet CA issuing node certificates.
struct Fleet {
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
}

impl Fleet {
    fn new() -> Fleet {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap().der().clone();
        Fleet { issuer: Issuer::new(params, key), ca }
    }

    fn keys(&self) -> Arc<Keys> {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![NODE_NAME.to_string()]).unwrap().signed_by(&key, &self.issuer).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let identity = Identity {
            roots: Arc::new(roots),
            cas: vec![self.ca.clone()],
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        };
        Arc::new(Keys::of(&identity).unwrap())
    }
}

/// Two nodes of one fleet sharing one in-memory archive: the start of most tests here.
struct TwoNodes {
    fleet: Fleet,
    store: Arc<dyn ObjectStore>,
    ka: Arc<Keys>,
    kb: Arc<Keys>,
    a: Archive,
    b: Archive,
}

fn two_nodes() -> TwoNodes {
    let fleet = Fleet::new();
    let (ka, kb) = (fleet.keys(), fleet.keys());
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (a, b) = (node(&store, &ka), node(&store, &kb));
    TwoNodes { fleet, store, ka, kb, a, b }
}

/// A handle of the node whose keys are `keys` on `store`.
fn node(store: &Arc<dyn ObjectStore>, keys: &Arc<Keys>) -> Archive {
    let mut config = quick_config(&keys.node());
    config.keys = Some(Arc::clone(keys));
    Archive::with_store(Arc::clone(store), config).unwrap()
}

async fn names(store: &dyn ObjectStore) -> Vec<String> {
    let mut names: Vec<String> = store.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    names.sort();
    names
}

/// One day of a point a minute for `s`, from the midnight before `T0`.
fn day_of_points(offset: f64) -> Vec<Point> {
    let day0 = T0 - T0.rem_euclid(DAY);
    (0..1440).map(|i| Point::new(day0 + i * 60 * SEC + SEC, i as f64 + offset)).collect()
}

fn whole_day() -> TimeRange {
    let day0 = T0 - T0.rem_euclid(DAY);
    TimeRange::new(day0, day0 + DAY).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_writes_in_its_folder_and_reads_every_folder() {
    let TwoNodes { store, ka, kb, a, b, .. } = two_nodes();
    let class = class("c", 600);
    let (sa, sb) = (series("m{id=a}"), series("m{id=b}"));
    let (pa, pb) = (day_of_points(0.0), day_of_points(0.5));
    let hot_a = hot_store(class.quantum, &[(sa.clone(), pa.clone())]);
    let hot_b = hot_store(class.quantum, &[(sb.clone(), pb.clone())]);
    a.export(hot_a.clone(), &class, hot_blocks(&*hot_a)).await.unwrap();
    b.export(hot_b.clone(), &class, hot_blocks(&*hot_b)).await.unwrap();
    for name in names(&*store).await {
        let (id, _) = FileId::parse(&Path::from(name.as_str())).unwrap();
        assert!(name.starts_with(&format!("node={}/", id.node)), "{name} is in its writer's folder");
        assert!(!id.legacy && (id.node == ka.node() || id.node == kb.node()));
    }
    // Each node reads both folders, every seal checks.
    for reader in [&a, &b] {
        assert_eq!(read_all(reader, &class, &sa, whole_day(), 500).await, pa);
        assert_eq!(read_all(reader, &class, &sb, whole_day(), 500).await, pb);
        assert_eq!(reader.refused().0, 0);
    }
    let status = a.status().await.unwrap();
    assert_eq!((status.classes[0].exports, status.legacy_exports, status.refused_manifests), (2, 0, 0));
}

/// Copies every object of `from`'s folder into `to`'s folder, renamed as `to`'s: what a node
/// with write access to another's folder (or the bucket) could plant there.
async fn plant_as(store: &dyn ObjectStore, from: &str, to: &str) -> Vec<FileId> {
    let mut planted = Vec::new();
    for name in names(store).await {
        let Some((id, kind)) = FileId::parse(&Path::from(name.as_str())) else { continue };
        if id.node != from {
            continue;
        }
        let bytes = store.get(&Path::from(name.as_str())).await.unwrap().bytes().await.unwrap();
        let forged = FileId { node: to.to_string(), seq: id.seq + 100, ..id };
        store.put(&forged.path(kind), PutPayload::from(bytes)).await.unwrap();
        if kind == Kind::Manifest {
            planted.push(forged);
        }
    }
    planted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_whose_seal_fails_are_refused_and_the_rest_stays_readable() {
    let TwoNodes { fleet, store, ka, kb, a, b } = two_nodes();
    let class = class("c", 600);
    let (sa, sb) = (series("m{id=a}"), series("m{id=b}"));
    let (pa, pb) = (day_of_points(0.0), day_of_points(0.5));
    let hot_a = hot_store(class.quantum, &[(sa.clone(), pa.clone())]);
    a.export(hot_a.clone(), &class, hot_blocks(&*hot_a)).await.unwrap();

    // 1. A's manifest planted in B's folder (sealed by A, not B): refused, named, counted.
    let planted = plant_as(&*store, &ka.node(), &kb.node()).await;
    assert_eq!(planted.len(), 1);
    assert_eq!(read_all(&b, &class, &sa, whole_day(), 500).await, pa, "A's own copy reads, once");
    let (count, why) = b.refused();
    assert_eq!(count, 1);
    assert!(why[0].0.contains(&format!("node={}/manifests", kb.node())), "{why:?}");
    assert!(why[0].1.contains(&format!("sealed by node {}", ka.node())), "{why:?}");

    // 2. A manifest changed after sealing: the header (its points file size) ...
    let own: Vec<FileId> = names(&*store)
        .await
        .iter()
        .filter_map(|n| FileId::parse(&Path::from(n.as_str())))
        .filter(|(id, k)| *k == Kind::Manifest && id.node == ka.node())
        .map(|(id, _)| id)
        .collect();
    let path = own[0].path(Kind::Manifest);
    let good = store.get(&path).await.unwrap().bytes().await.unwrap();
    let key = b"\"points_rows\":";
    let at = good.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let mut tampered = good.to_vec();
    tampered[at] = if tampered[at] == b'1' { b'2' } else { b'1' };
    store.put(&path, PutPayload::from(tampered)).await.unwrap();
    let c = node(&store, &fleet.keys());
    assert_eq!(read_all(&c, &class, &sa, whole_day(), 500).await, Vec::<Point>::new(), "its blocks are not read");
    let (count, why) = c.refused();
    assert!(
        count >= 1 && why.iter().any(|(f, r)| *f == path.to_string() && r.contains("changed after sealing")),
        "{why:?}"
    );
    // ... or a byte of its rows.
    let mut rows = good.to_vec();
    rows[10] ^= 0x01;
    store.put(&path, PutPayload::from(rows)).await.unwrap();
    // That is damage to a sealed file: the reads that need it fail naming it, never answer
    // without its blocks.
    let d = node(&store, &fleet.keys());
    let read = d.read(&class, &sa, whole_day(), None, 500).await.unwrap_err().to_string();
    assert!(read.contains(path.as_ref()) && read.contains("row group 0 does not hash"), "{read}");
    store.put(&path, PutPayload::from(good)).await.unwrap();

    // 3. A node of another fleet writing in its own folder: refused as not of the fleet.
    let stranger = Fleet::new().keys();
    let s = node(&store, &stranger);
    let hot_b = hot_store(class.quantum, &[(sb.clone(), pb.clone())]);
    s.export(hot_b.clone(), &class, hot_blocks(&*hot_b)).await.unwrap();
    let e = node(&store, &fleet.keys());
    assert!(read_all(&e, &class, &sb, whole_day(), 500).await.is_empty());
    assert!(e.refused().1.iter().any(|(_, r)| r.contains("fleet CA")), "{:?}", e.refused());
    // Everything else stays readable, by every node.
    assert_eq!(read_all(&e, &class, &sa, whole_day(), 500).await, pa);

    // 4. An unsealed manifest in a node's folder (a handle without keys wrote it).
    let unsealed_store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let keyless = Archive::with_store(Arc::clone(&unsealed_store), quick_config(&kb.node())).unwrap();
    keyless.export(hot_b.clone(), &class, hot_blocks(&*hot_b)).await.unwrap();
    let f = node(&unsealed_store, &fleet.keys());
    assert!(read_all(&f, &class, &sb, whole_day(), 500).await.is_empty());
    assert!(f.refused().1.iter().any(|(_, r)| r.contains("no seal")), "{:?}", f.refused());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_manifest_claiming_another_node_is_refused() {
    let fleet = Fleet::new();
    let (rogue, victim) = (fleet.keys(), fleet.keys());
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let class = class("c", 600);
    let s = series("m{id=1}");
    let points = day_of_points(0.0);
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    node(&store, &rogue).export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    let genuine = names(&*store)
        .await
        .iter()
        .filter_map(|n| FileId::parse(&Path::from(n.as_str())))
        .find(|(_, k)| *k == Kind::Manifest)
        .unwrap()
        .0;
    let manifest = Manifest::open(&*store, &genuine, None).await.unwrap();
    let entries = manifest.entries(&*store, None).await.unwrap();
    // The rogue seals, with its own key, manifests that say they are the victim's: one in its
    // own folder, one in the victim's (a bucket that lets it write there).
    for folder in [rogue.node(), victim.node()] {
        let id = FileId { node: folder, seq: 7, ..genuine.clone() };
        let header = Header { node: victim.node(), seq: 7, ..manifest.header.clone() };
        let bytes = encode_manifest(&header, &entries, Some(&rogue)).unwrap();
        store.put(&id.path(Kind::Manifest), PutPayload::from(bytes)).await.unwrap();
    }
    let reader = node(&store, &fleet.keys());
    assert_eq!(read_all(&reader, &class, &s, whole_day(), 500).await, points, "the genuine export reads, once");
    let (count, why) = reader.refused();
    assert_eq!(count, 2, "{why:?}");
    assert!(why.iter().any(|(_, r)| r.contains("does not match the object name")), "{why:?}");
    assert!(why.iter().any(|(_, r)| r.contains(&format!("sealed by node {}", rogue.node()))), "{why:?}");
    let status = reader.status().await.unwrap();
    assert_eq!(status.refused_manifests, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_exporting_one_block_never_count_a_point_twice() {
    let TwoNodes { fleet, store, a, b, .. } = two_nodes();
    let class = class("c", 600);
    let s = series("m{id=1}");
    let points = day_of_points(0.0);
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    // Both export at once, each before seeing the other's manifest (a takeover race).
    let (ra, rb) = tokio::join!(
        a.export(hot.clone(), &class, hot_blocks(&*hot)),
        b.export(hot.clone(), &class, hot_blocks(&*hot))
    );
    let files = ra.unwrap().files.len() + rb.unwrap().files.len();
    assert!(files >= 1);
    let c = node(&store, &fleet.keys());
    assert_eq!(read_all(&c, &class, &s, whole_day(), 97).await, points);
    let reference = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    assert_same_aggregates(&c, &*reference, &class, &s, whole_day(), 3600 * SEC).await;
    assert_same_aggregates(&c, &*reference, &class, &s, whole_day(), DAY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_only_the_nodes_own_files() {
    let TwoNodes { store, kb, a, b, .. } = two_nodes();
    let class = class("c", 600);
    let (sa, sb) = (series("m{id=a}"), series("m{id=b}"));
    let hot_a = hot_store(class.quantum, &[(sa.clone(), day_of_points(0.0))]);
    let hot_b = hot_store(class.quantum, &[(sb.clone(), day_of_points(0.5))]);
    a.export(hot_a.clone(), &class, hot_blocks(&*hot_a)).await.unwrap();
    b.export(hot_b.clone(), &class, hot_blocks(&*hot_b)).await.unwrap();
    // Everything is past a retention of a second: A removes its files only.
    let retention = Retention { keep_ns: SEC, age_by: AgeBy::Event };
    let report = a.expire(&class, retention, now_ns()).await.unwrap();
    assert_eq!(report.removed.len(), 1, "{report:?}");
    let left = names(&*store).await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|n| n.starts_with(&format!("node={}/", kb.node()))), "{left:?}");
    // B's files (a node that left, say) stay readable until B or an operator removes them.
    assert_eq!(read_all(&a, &class, &sb, whole_day(), 500).await, day_of_points(0.5));
    // Cleanup leaves other nodes' uncommitted files alone too.
    let stray = FileId { class: "c".into(), day: timeshard_tier::Day::of(T0), node: kb.node(), seq: 99, legacy: false };
    store.put(&stray.path(Kind::Points), PutPayload::from(vec![0u8; 8])).await.unwrap();
    assert!(a.cleanup(std::time::Duration::ZERO).await.unwrap().removed.is_empty());
    assert_eq!(b.cleanup(std::time::Duration::ZERO).await.unwrap().removed.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_archive_is_read_unverified_unless_turned_off() {
    let fleet = Fleet::new();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let class = class("c", 600);
    let s = series("m{id=1}");
    let points = day_of_points(0.0);
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    // An export as builds before folders wrote it: moved to the top, unsealed.
    let scratch: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    Archive::with_store(Arc::clone(&scratch), quick_config("old1"))
        .unwrap()
        .export(hot.clone(), &class, hot_blocks(&*hot))
        .await
        .unwrap();
    for name in names(&*scratch).await {
        let (id, kind) = FileId::parse(&Path::from(name.as_str())).unwrap();
        let old = FileId { legacy: true, ..id.clone() };
        let bytes = match kind {
            Kind::Points => scratch.get(&Path::from(name.as_str())).await.unwrap().bytes().await.unwrap(),
            Kind::Manifest => {
                let m = Manifest::open(&*scratch, &id, None).await.unwrap();
                let entries = m.entries(&*scratch, None).await.unwrap();
                let points_file = old.path(Kind::Points).to_string();
                encode_manifest(&Header { points_file, ..m.header.clone() }, &entries, None).unwrap()
            }
        };
        store.put(&old.path(kind), PutPayload::from(bytes)).await.unwrap();
    }
    let reader = node(&store, &fleet.keys());
    assert_eq!(read_all(&reader, &class, &s, whole_day(), 500).await, points);
    let status = reader.status().await.unwrap();
    assert_eq!((status.legacy_exports, status.refused_manifests), (1, 0));
    // A new export of the same blocks by a node goes to its folder, diffed against the legacy
    // part: nothing is written twice.
    let report = reader.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
    assert!(report.files.is_empty() && report.confirmed.iter().all(|c| c.already));
    // Turned off: the legacy layout is not read.
    let keys = fleet.keys();
    let mut config: Config = quick_config(&keys.node());
    config.keys = Some(keys);
    config.read_legacy = false;
    let strict = Archive::with_store(Arc::clone(&store), config).unwrap();
    assert!(read_all(&strict, &class, &s, whole_day(), 500).await.is_empty());
}

/// The bug this guards against: the top of the archive, listed before a node's first export,
/// lacked the node's new folder for a listing TTL, so a second export of the same day within
/// it took export number 1 again and overwrote the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_export_within_the_listing_ttl_never_reuses_a_number() {
    let keys = Fleet::new().keys();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut config = quick_config(&keys.node());
    config.keys = Some(Arc::clone(&keys));
    config.cache.listing_ttl = std::time::Duration::from_secs(3600);
    let a = Archive::with_store(Arc::clone(&store), config).unwrap();
    let class = class("c", 600);
    let s = series("m{id=1}");
    let points = day_of_points(0.0);
    let hot = hot_store(class.quantum, &[(s.clone(), points.clone())]);
    // A read lists the top (empty) first; then two exports of halves of one day.
    assert!(read_all(&a, &class, &s, whole_day(), 500).await.is_empty());
    let blocks = hot_blocks(&*hot);
    let (first, second) = blocks.split_at(blocks.len() / 2);
    let r1 = a.export(hot.clone(), &class, first.to_vec()).await.unwrap();
    let r2 = a.export(hot.clone(), &class, second.to_vec()).await.unwrap();
    assert_eq!((r1.files[0].seq, r2.files[0].seq), (1, 2));
    let fresh = node(&store, &keys);
    assert_eq!(read_all(&fresh, &class, &s, whole_day(), 500).await, points);
}

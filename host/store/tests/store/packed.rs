//! Sealed blocks read as their compressed columns ([`Store::read_packed`]): only a block held
//! as one sealed pco frame, no larger than asked, with nothing open, comes packed, with its
//! frame's count and digest, and its columns decode to exactly the points a read returns; any
//! other block (open, late points on top of a frame, another codec, too large, not held) is
//! read as points. A damaged frame is an error that names the block, not a wrong answer.

use timeshard_proto::packed::PackedPart;
use timeshard_proto::point::PartEnd;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{Codec, DiskConfig, Store, StoreError};

use crate::common::*;

fn series() -> SeriesKey {
    "packed.m{dev=1}".parse().unwrap()
}

/// Points in quanta 0..4 (1 ms quanta), several events at some timestamps.
fn points() -> Vec<Point> {
    let mut pts: Vec<Point> = (0..400i64).map(|i| Point::new(i * 10_000, (i % 17) as f64 * 0.5)).collect();
    pts.extend((0..400i64).step_by(9).map(|i| Point { ts: i * 10_000, value: 1.0, event: 3 }));
    pts.sort_unstable();
    pts
}

fn quantum_points(pts: &[Point], start: i64) -> Vec<Point> {
    pts.iter().filter(|p| qlen().quantum_of(p.ts).start == start).copied().collect()
}

/// The points of a packed block, decoded and checked against its count and digest.
fn unpacked(store: &dyn Store, start: i64) -> Option<Vec<Point>> {
    let b = store.read_packed(&series(), start, 10_000).unwrap()?;
    let info = store.block_info(&series(), start).unwrap().expect("a packed block is held");
    assert_eq!((b.count, b.digest), (info.count, info.digest), "the frame's count and digest are the block's");
    let part = PackedPart {
        range: TimeRange::new(start, start + qlen().ns()).unwrap(),
        end: PartEnd { count: b.count, digest: b.digest },
        columns: b.columns,
    };
    Some(part.points().expect("packed columns decode to what they claim"))
}

#[test]
fn only_whole_sealed_pco_blocks_come_packed_and_they_hold_the_blocks_points() {
    let disk = FaultyDisk::new();
    let store = open(&disk, small_config());
    let pts = points();
    store.write(&blocks(&series(), qlen(), &pts)).unwrap();
    // Open: nothing packed.
    assert_eq!(store.read_packed(&series(), 0, 10_000).unwrap(), None);
    settle(&store, 1_000_000_000);
    for q in 0..4 {
        let start = q * qlen().ns();
        assert_eq!(unpacked(&store, start), Some(quantum_points(&pts, start)), "quantum {q}");
    }
    // Not held, and an unknown series.
    assert_eq!(store.read_packed(&series(), 40 * qlen().ns(), 10_000).unwrap(), None);
    assert_eq!(store.read_packed(&"packed.other{dev=2}".parse().unwrap(), 0, 10_000).unwrap(), None);
    // A block larger than the caller's page comes as points.
    let first = quantum_points(&pts, 0).len() as u64;
    assert_eq!(store.read_packed(&series(), 0, first - 1).unwrap(), None);
    assert!(store.read_packed(&series(), 0, first).unwrap().is_some());
    // A late point on top of the sealed frame: points until maintenance seals it in.
    store.write(&blocks(&series(), qlen(), &[Point::new(5, -1.0)])).unwrap();
    assert_eq!(store.read_packed(&series(), 0, 10_000).unwrap(), None);
    settle(&store, 2_000_000_000);
    let mut with_late = quantum_points(&pts, 0);
    with_late.insert(0, Point::new(5, -1.0));
    with_late.sort_unstable();
    assert_eq!(unpacked(&store, 0), Some(with_late));
    assert!(store.stats().blocks_sent_packed >= 5);
}

#[test]
fn blocks_of_another_codec_come_as_points() {
    let disk = FaultyDisk::new();
    let store = open(&disk, DiskConfig { codec: Codec::Xor, ..small_config() });
    store.write(&blocks(&series(), qlen(), &points())).unwrap();
    settle(&store, 1_000_000_000);
    assert!(store.block_info(&series(), 0).unwrap().is_some());
    assert_eq!(store.read_packed(&series(), 0, 10_000).unwrap(), None);
}

#[test]
fn a_damaged_frame_is_an_error_naming_the_block() {
    let disk = FaultyDisk::new();
    let store = open(&disk, DiskConfig { block_segment_bytes: 1 << 20, ..small_config() });
    let pts = points();
    store.write(&blocks(&series(), qlen(), &pts)).unwrap();
    settle(&store, 1_000_000_000);
    // Flip a byte inside the first frame of the first segment.
    let (seg, _) = disk.files().into_iter().find(|(n, _)| n.starts_with("blocks/")).unwrap();
    disk.corrupt(&seg, 40, 0x5a);
    let mut damaged = 0;
    for q in 0..4 {
        let start = q * qlen().ns();
        match store.read_packed(&series(), start, 10_000) {
            Err(StoreError::Corrupt(why)) => {
                assert!(why.contains("packed.m") && why.contains("damaged"), "{why}");
                damaged += 1;
            }
            Ok(Some(_)) => assert_eq!(unpacked(&store, start), Some(quantum_points(&pts, start))),
            other => panic!("quantum {q} read as {other:?}"),
        }
    }
    assert_eq!(damaged, 1, "exactly the damaged block fails");
}

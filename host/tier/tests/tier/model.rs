//! Property tests: points files round-trip any points bit for bit, and whatever the history of
//! exports and late data, the archive's reads and window aggregates equal a naive reference
//! computed from the points themselves.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
use proptest::prelude::*;
use timeshard_proto::point::{set_digest, sort_dedup};
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, QuantumLen, SeriesClass, TimeRange};
use timeshard_store::{MemStore, Store, WindowAggregate};
use timeshard_tier::Archive;
use timeshard_tier::read::ParquetFile;
use timeshard_tier::schema::points as col;
use timeshard_tier::write::PointsWriter;

use crate::support::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn arb_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-50_000i64..50_000).prop_map(|v| v as f64 / 1000.0),
        any::<f64>(),
        Just(f64::NAN),
        Just(-0.0),
        Just(f64::INFINITY),
    ]
}

fn arb_point() -> impl Strategy<Value = Point> {
    (0i64..7_258_118_400_000_000_000, arb_value(), prop_oneof![Just(0u64), any::<u64>()])
        .prop_map(|(ts, value, event)| Point { ts, value, event })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Any points of any series, in row groups and pages of any size, read back bit for bit.
    #[test]
    fn points_files_round_trip(
        series in proptest::collection::btree_map("[a-z]{1,6}\\{k=[0-9]{1,3}\\}", proptest::collection::vec(arb_point(), 0..300), 1..4),
        row_group in 1usize..500,
    ) {
        let mut w = PointsWriter::new(row_group);
        let mut bytes = Vec::new();
        let mut want = Vec::new();
        for (key, points) in &series {
            let key: timeshard_proto::SeriesKey = key.parse().unwrap();
            let mut points = points.clone();
            sort_dedup(&mut points);
            let i = w.begin_series(&key);
            w.push(i, &points).unwrap();
            bytes.extend_from_slice(&w.take_output());
            want.extend(points.into_iter().map(|p| (key.to_string(), p)));
        }
        w.finish().unwrap();
        bytes.extend_from_slice(&w.take_output());
        runtime().block_on(async {
            let store = InMemory::new();
            let path = "f.parquet".into();
            store.put(&path, bytes::Bytes::from(bytes).into()).await.unwrap();
            let file = ParquetFile::open(&store, &path).await.unwrap();
            prop_assert_eq!(file.rows(), want.len() as u64);
            let mut got = Vec::new();
            for span in file.spans(0..file.rows()) {
                let cols = [col::SERIES_KEY, col::SERIES_ID, col::TIMESTAMP, col::VALUE, col::EVENT_ID];
                let pages = file.fetch(&store, &span, &cols).await.unwrap();
                let keys = file.decode::<ByteArrayType>(&pages, &span, col::SERIES_KEY).unwrap();
                let ids = file.decode::<Int64Type>(&pages, &span, col::SERIES_ID).unwrap();
                let ts = file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP).unwrap();
                let v = file.decode::<DoubleType>(&pages, &span, col::VALUE).unwrap();
                let e = file.decode::<Int64Type>(&pages, &span, col::EVENT_ID).unwrap();
                for i in 0..span.end - span.start {
                    let key = String::from_utf8(keys[i].data().to_vec()).unwrap();
                    let parsed: timeshard_proto::SeriesKey = key.parse().unwrap();
                    prop_assert_eq!(ids[i] as u64, timeshard_tier::schema::series_id(&parsed));
                    got.push((key, Point { ts: ts[i], value: v[i], event: e[i] as u64 }));
                }
            }
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                prop_assert_eq!(&g.0, &w.0);
                prop_assert_eq!((g.1.ts, g.1.value.to_bits(), g.1.event), (w.1.ts, w.1.value.to_bits(), w.1.event));
            }
            // Any sub-range of rows decodes on its own (pages skipped by the offset index).
            if file.rows() > 2 {
                let (a, b) = (file.rows() / 3, 2 * file.rows() / 3);
                let mut part = Vec::new();
                for span in file.spans(a..b) {
                    let pages = file.fetch(&store, &span, &[col::TIMESTAMP]).await.unwrap();
                    part.extend(file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP).unwrap());
                }
                let expect: Vec<i64> = want[a as usize..b as usize].iter().map(|w| w.1.ts).collect();
                prop_assert_eq!(part, expect);
            }
            Ok(())
        })?;
    }
}

/// Window aggregates computed straight from points: the reference.
fn naive(points: &[Point], range: &TimeRange, width: i64) -> Vec<WindowAggregate> {
    let mut sorted: Vec<Point> = points.iter().filter(|p| range.contains(p.ts)).copied().collect();
    sort_dedup(&mut sorted);
    let mut out: Vec<WindowAggregate> = Vec::new();
    for chunk in sorted.chunk_by(|a, b| a.ts.div_euclid(width) == b.ts.div_euclid(width)) {
        let w = chunk[0].ts.div_euclid(width);
        out.push(WindowAggregate {
            start: (w * width).max(range.start()),
            end: ((w + 1) * width).min(range.end()),
            count: chunk.len() as u64,
            min: chunk.iter().map(|p| p.value).fold(f64::NAN, f64::min),
            max: chunk.iter().map(|p| p.value).fold(f64::NAN, f64::max),
            sum: chunk.iter().map(|p| p.value).sum(),
            first: chunk[0].value,
            first_ts: chunk[0].ts,
            last: chunk[chunk.len() - 1].value,
            last_ts: chunk[chunk.len() - 1].ts,
            digest: set_digest(chunk),
        });
    }
    out
}

fn class_of(quantum_ms: i64) -> SeriesClass {
    let mut c = class("c", 1);
    c.quantum = QuantumLen::new(quantum_ms * 1_000_000).unwrap();
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Points exported in several rounds (late data between them, hot copies dropped or not),
    /// read in pages of any size and aggregated in any windows over any range, give exactly
    /// the reference's answers.
    #[test]
    fn reads_and_aggregates_equal_the_reference(
        rounds in proptest::collection::vec(
            (proptest::collection::vec((0i64..4 * 3600 * 1000, -1000i64..1000, 0u64..3), 1..150), any::<bool>()),
            1..4,
        ),
        quantum_ms in prop_oneof![Just(10_000i64), Just(60_000), Just(3_600_000), 1_000i64..900_000],
        (start_ms, len_ms) in (0i64..4 * 3600 * 1000, 1i64..5 * 3600 * 1000),
        width_ms in prop_oneof![Just(60_000i64), Just(3_600_000), 1_000i64..2 * 3600 * 1000],
        limit in 1usize..200,
    ) {
        let class = class_of(quantum_ms);
        let s = series("m{id=1}");
        // Start two hours before midnight: the data spans two partitions.
        let day0 = T0 - T0.rem_euclid(DAY) + DAY - 2 * 3600 * SEC;
        let hot = Arc::new(MemStore::new(u64::MAX));
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let archive = Archive::with_store(store, quick_config("n1")).unwrap();
        let mut all = Vec::new();
        runtime().block_on(async {
            for (points, drop_hot) in &rounds {
                let points: Vec<Point> = points
                    .iter()
                    .map(|&(t, v, e)| Point { ts: day0 + t * 1_000_000, value: v as f64 / 8.0, event: e })
                    .collect();
                all.extend(&points);
                let mut sorted = points.clone();
                sort_dedup(&mut sorted);
                hot.write(&to_blocks(&s, class.quantum, &sorted)).unwrap();
                let report = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap();
                if *drop_hot {
                    for c in &report.confirmed {
                        prop_assert!(hot.drop_block(&c.series, c.quantum.start, c.digest).unwrap());
                    }
                }
            }
            sort_dedup(&mut all);
            let range = TimeRange::new(day0 + start_ms * 1_000_000, day0 + (start_ms + len_ms) * 1_000_000).unwrap();
            let want: Vec<Point> = all.iter().filter(|p| range.contains(p.ts)).copied().collect();
            prop_assert_eq!(read_all(&archive, &class, &s, range, limit).await, want);
            let width = width_ms * 1_000_000;
            let got = archive.aggregate(&class, &s, range, Grid::epoch(width)).await.unwrap();
            let reference = naive(&all, &range, width);
            prop_assert_eq!(got.len(), reference.len());
            for (g, r) in got.iter().zip(&reference) {
                prop_assert_eq!((g.start, g.end, g.count, g.first_ts, g.last_ts, g.digest), (r.start, r.end, r.count, r.first_ts, r.last_ts, r.digest));
                prop_assert_eq!((g.min, g.max, g.first, g.last), (r.min, r.max, r.first, r.last));
                prop_assert!((g.sum - r.sum).abs() < 1e-6, "{} vs {}", g.sum, r.sum);
            }
            Ok(())
        })?;
    }
}

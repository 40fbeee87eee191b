//! End to end on a local directory: an export interrupted by a crash, re-run after a restart,
//! then DuckDB (a foreign engine, from PyPI) reads the points files directly and its counts,
//! sums and min/max per series and day equal the archive's, with no duplicate row.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use object_store::ObjectStore;
use timeshard_proto::window::Grid;
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_store::WindowAggregate;
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::{Archive, Location};

use crate::archive_support::*;

/// DuckDB over `*/points/**/*.parquet` (every node's folder): per series and UTC day, count, sum, min, max; then the
/// number of duplicate rows. One JSON object per line.
const DUCKDB_SCRIPT: &str = r#"
import json, sys
try:
    import duckdb
except ImportError:
    sys.exit("duckdb is not installed: run `pip install duckdb` (scripts/test does)")
root = sys.argv[1]
# A slow query would print a progress bar into the JSON on standard output.
duckdb.execute("SET enable_progress_bar = false")
files = f"{root}/*/points/**/*.parquet"
rows = duckdb.sql(f"""
    SELECT class, series_key, strftime(timezone('UTC', "timestamp"), '%Y-%m-%d') AS day,
           count(*) AS count, sum(value) AS sum, min(value) AS min, max(value) AS max,
           min(epoch_ns("timestamp")) AS first_ns, max(epoch_ns("timestamp")) AS last_ns
    FROM read_parquet('{files}', hive_partitioning = true)
    GROUP BY ALL ORDER BY ALL""").fetchall()
for r in rows:
    print(json.dumps({"class": r[0], "series": r[1], "day": r[2], "count": r[3], "sum": r[4], "min": r[5],
                      "max": r[6], "first_ns": r[7], "last_ns": r[8]}))
dups = duckdb.sql(f"""
    SELECT count(*) - count(DISTINCT (series_key, "timestamp", value, event_id))
    FROM read_parquet('{files}')""").fetchall()[0][0]
print(json.dumps({"duplicates": dups}))
"#;

fn duckdb(root: &std::path::Path) -> (Vec<serde_json::Value>, i64) {
    let out = Command::new(std::env::var("TIMESHARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(DUCKDB_SCRIPT)
        .arg(root)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install Python 3 and `pip install duckdb` (scripts/test does)")
        });
    assert!(
        out.status.success(),
        "DuckDB failed: {}\nInstall it with `pip install duckdb` (scripts/test does).",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("DuckDB printed {l:?}: {e}")))
        .collect();
    let (last, groups) = lines.split_last().unwrap();
    (groups.to_vec(), last["duplicates"].as_i64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_reads_what_the_archive_serves() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    // Two classes, two series each, over midnight: 60 Hz with 10 s quanta, 1 Hz with 1 h quanta.
    let start = T0 - T0.rem_euclid(DAY) + DAY - 3 * 3600 * SEC;
    let pmu = class("pmu", 10);
    let meter = class("meter", 3600);
    let pmu_data: Vec<(SeriesKey, Vec<Point>)> = (1..=2u64)
        .map(|b| (series(&format!("pmu.phase{{bus={b}}}")), signal_points(b, start, 60, 6 * 3600 * 60)))
        .collect();
    let meter_data: Vec<(SeriesKey, Vec<Point>)> = (1..=2u64)
        .map(|m| {
            let mut total = 0.0;
            let points = (0..2 * 86_400u64)
                .map(|i| {
                    total += ((i * 7 + m) % 11) as f64;
                    Point::new(start + i as i64 * SEC, total)
                })
                .collect();
            (series(&format!("meter.energy{{id={m}}}")), points)
        })
        .collect();
    let hot_pmu = hot_store(pmu.quantum, &pmu_data);
    let hot_meter = hot_store(meter.quantum, &meter_data);

    // Where an export writes its first manifest (operations are numbered the same every run).
    let rehearsal = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    let ghost =
        Archive::with_store(Arc::new(rehearsal.clone()) as Arc<dyn ObjectStore>, quick_config("node-a")).unwrap();
    ghost.export(hot_pmu.clone(), &pmu, hot_blocks(&*hot_pmu)).await.unwrap();
    let commit = rehearsal.log().iter().position(|op| op.starts_with("put ") && op.contains("/manifests/")).unwrap();

    // The exporting node is killed after its first points file landed, before the manifest.
    let local = Location::parse(root.to_str().unwrap()).unwrap().open(&[], std::time::Duration::from_secs(5)).unwrap();
    let faulty = FaultyStore::new(Arc::clone(&local));
    faulty.set_fault(Fault::FailFrom(commit as u64));
    let dying = Archive::with_store(Arc::new(faulty) as Arc<dyn ObjectStore>, quick_config("node-a")).unwrap();
    assert!(dying.export(hot_pmu.clone(), &pmu, hot_blocks(&*hot_pmu)).await.is_err());
    // After the restart the same node exports everything, rewriting that file.
    let archive = Archive::open(root.to_str().unwrap(), quick_config("node-a")).unwrap();
    let status = archive.status().await.unwrap();
    assert_eq!(status.uncommitted.len(), 1, "{status:?}");
    assert!(status.classes.is_empty(), "nothing committed yet: {status:?}");
    let rp = archive.export(hot_pmu.clone(), &pmu, hot_blocks(&*hot_pmu)).await.unwrap();
    let rm = archive.export(hot_meter.clone(), &meter, hot_blocks(&*hot_meter)).await.unwrap();
    assert_eq!(rp.confirmed.len(), hot_blocks(&*hot_pmu).len());
    assert_eq!(rm.confirmed.len(), hot_blocks(&*hot_meter).len());
    let cleaned = archive.cleanup(std::time::Duration::ZERO).await.unwrap();
    let status = archive.status().await.unwrap();
    assert!(status.uncommitted.is_empty(), "{status:?} after {cleaned:?}");
    assert_eq!(status.classes.iter().map(|c| c.class.as_str()).collect::<Vec<_>>(), ["meter", "pmu"]);

    // The archive's own answers, per class, series and UTC day.
    let mut ours: BTreeMap<(String, String, String), WindowAggregate> = BTreeMap::new();
    let range = TimeRange::new(start - DAY, start + 3 * DAY).unwrap();
    for (class, data, hot) in [(&pmu, &pmu_data, &hot_pmu), (&meter, &meter_data, &hot_meter)] {
        for (s, points) in data {
            assert_eq!(&read_all(&archive, class, s, range, 100_000).await, points);
            for w in archive.aggregate(class, s, range, Grid::epoch(DAY)).await.unwrap() {
                let day = timeshard_tier::Day::of(w.start).to_string();
                ours.insert((class.name.clone(), s.to_string(), day), w);
            }
            assert_same_aggregates(&archive, &**hot, class, s, range, 3600 * SEC).await;
        }
    }

    let (groups, duplicates) = duckdb(&root);
    assert_eq!(duplicates, 0, "DuckDB sees no duplicate row");
    assert_eq!(groups.len(), ours.len(), "series-days: DuckDB {groups:?}");
    for g in &groups {
        let key = (
            g["class"].as_str().unwrap().to_string(),
            g["series"].as_str().unwrap().to_string(),
            g["day"].as_str().unwrap().to_string(),
        );
        let WindowAggregate { count, sum, min, max, first_ts: first, last_ts: last, .. } = ours[&key];
        assert_eq!(g["count"].as_u64().unwrap(), count, "{key:?}");
        let dsum = g["sum"].as_f64().unwrap();
        assert!((dsum - sum).abs() <= 1e-9 * sum.abs().max(1.0), "{key:?}: {dsum} vs {sum}");
        assert_eq!((g["min"].as_f64().unwrap(), g["max"].as_f64().unwrap()), (min, max), "{key:?}");
        assert_eq!((g["first_ns"].as_i64().unwrap(), g["last_ns"].as_i64().unwrap()), (first, last), "{key:?}");
    }
}

//! `timeshard import` and `timeshard export` against a cluster: a CSV file goes in, the same
//! points come out as CSV and as Parquet, each command ending with its summary.

use std::process::Command;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::datasets::{T0, pmu_point};

use crate::NODE;

fn run(args: &[&str]) -> (String, String) {
    let out = Command::new(NODE).args(args).output().expect("the binary runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "timeshard {args:?} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_file_goes_in_and_comes_out_as_csv_and_parquet() -> anyhow::Result<()> {
    let (options, dir) = ClusterOptions::for_tests(3, NODE);
    let cluster = LocalCluster::start_converged(options).await?;
    let node = cluster.addr(0).to_string();
    let pki = cluster.pki_dir().display().to_string();
    let conn = ["--node", node.as_str(), "--pki", pki.as_str()];

    // 3 series of 4,000 points, interleaved as a logger would write them, one with events.
    let mut csv = String::from("series,ts,value,event\n");
    let mut rows = Vec::new();
    for i in 0..4_000u64 {
        for bus in 1..=3u32 {
            let p = pmu_point(bus, i);
            let series = format!("pmu.phase{{bus={bus},site=csv}}");
            let event = if bus == 3 { i % 2 } else { 0 };
            csv.push_str(&format!("\"{series}\",{},{},{event}\n", p.ts, p.value));
            rows.push((series, p.ts, p.value, event));
        }
    }
    let file = dir.path().join("in.csv");
    std::fs::write(&file, &csv)?;
    let (out, _) = run(&[&["import"], &conn[..], &[file.to_str().unwrap(), "--batch", "1000"]].concat());
    assert!(out.contains("imported 12000 points of 12000 read (0 refused by ingest policies) into 3 series"), "{out}");

    // Out again as CSV: the same rows, sorted by series then time.
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.3.cmp(&b.3)));
    let end = (T0 + 3_600_000_000_000).to_string();
    let range = ["--start", "2023-11-14T22:13:20Z", "--end", end.as_str()];
    let csv_out = dir.path().join("out.csv");
    let (_, err) = run(&[
        &["export"],
        &conn[..],
        &range[..],
        &["--metric", "pmu.", "--tag", "site=csv", "--out", csv_out.to_str().unwrap()],
    ]
    .concat());
    assert!(err.contains("exported 12000 points of 3 series"), "{err}");
    let mut reader = csv::Reader::from_path(&csv_out)?;
    let got: Vec<(String, i64, f64, u64)> = reader.deserialize().collect::<Result<_, _>>()?;
    assert_eq!(got, rows);

    // And as Parquet, one named series.
    let pq = dir.path().join("out.parquet");
    let (_, err) = run(&[
        &["export"],
        &conn[..],
        &range[..],
        &["--series", "pmu.phase{bus=3,site=csv}", "--format", "parquet", "--out", pq.to_str().unwrap()],
    ]
    .concat());
    assert!(err.contains("exported 4000 points of 1 series") && err.contains("Parquet"), "{err}");
    let reader = SerializedFileReader::new(std::fs::File::open(&pq)?)?;
    let want: Vec<_> = rows.iter().filter(|r| r.0 == "pmu.phase{bus=3,site=csv}").collect();
    let mut n = 0;
    for (row, w) in reader.get_row_iter(None)?.zip(&want) {
        let row = row?;
        assert_eq!(
            (row.get_string(0)?.as_str(), row.get_long(1)?, row.get_double(2)?, row.get_ulong(3)?),
            (w.0.as_str(), w.1, w.2, w.3)
        );
        n += 1;
    }
    assert_eq!(n, 4_000);

    // Without series there is nothing to do, and the message says so.
    let out = Command::new(NODE).args([&["export"], &conn[..], &range[..]].concat()).output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no series to export"));
    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

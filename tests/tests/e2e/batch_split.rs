//! A write of more series than a node takes in one request is split by the client. `timeshard
//! put` of a CSV of 10,001 series with one point each (under the limit of points per write,
//! over the limit of series) used to go out as one request, which the node refused: "batch holds
//! 10001 series; the limit is 10000: split it into smaller batches (BatchTooLarge)".

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use timeshard_proto::wire::{Limits, SeriesFilter};
use timeshard_proto::{Point, SeriesKey};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE as BIN;
const TS: i64 = 1_700_000_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_more_series_than_one_write_takes_is_split() -> anyhow::Result<()> {
    let (mut options, _dir) = ClusterOptions::for_tests(3, BIN);
    // Registering 10,001 series is the slow part of this write: a debug build on a loaded
    // machine needs more than the tests' usual 2 s per replica request.
    options.dht.request_timeout = std::time::Duration::from_secs(15);
    let cluster = LocalCluster::start_converged(options).await?;
    let n = Limits::default().max_batch_series + 1;
    let mut csv = String::from("series,ts,value\n");
    for i in 0..n {
        writeln!(csv, "split.test{{id={i}}},{TS},{i}")?;
    }

    let node = cluster.addr(0).to_string();
    let pki = cluster.pki_dir().display().to_string();
    let mut child = Command::new(BIN)
        .args(["put", "--node", &node, "--pki", &pki])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(csv.as_bytes())?;
    let out = child.wait_with_output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("wrote {n} points")), "{err}");

    // Every series is there, the first and the last with their point.
    let client = cluster.client(0).await?;
    let filter = SeriesFilter { metric_prefix: "split.".into(), tags: Vec::new() };
    let (listed, more) = client.list_series(filter, n + 1).await?;
    assert_eq!((listed.len(), more), (n as usize, false));
    for i in [0, n - 1] {
        let series: SeriesKey = format!("split.test{{id={i}}}").parse()?;
        assert_eq!(client.latest(&series).await?, Some(Point::new(TS, f64::from(i))));
    }
    client.close().await;
    Ok(())
}

//! Writes a minute of 10 Hz readings and reads them back.
//!
//! Against the demo cluster (`timeshard demo --serve` prints the two variables):
//!
//! ```text
//! TIMESHARD_NODE=127.0.0.1:<port> TIMESHARD_PKI=<pki dir> cargo run -p timeshard-sdk --example quickstart
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use timeshard_sdk::tls::TlsFiles;
use timeshard_sdk::{Client, Point, SeriesKey, TimeRange};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let node = std::env::var("TIMESHARD_NODE").unwrap_or_else(|_| "127.0.0.1:7400".into()).parse()?;
    let pki = std::env::var("TIMESHARD_PKI").unwrap_or_else(|_| "timeshard-pki".into());
    let client = Client::connect(node, &TlsFiles::in_dir(pki.as_ref(), "client")).await?;

    let series: SeriesKey = "example.temperature{room=lab,sensor=3}".parse()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as i64;
    let start = now - 60_000_000_000;
    let points: Vec<Point> =
        (0..600).map(|i| Point::new(start + i * 100_000_000, 21.0 + (i as f64 / 100.0).sin())).collect();

    // Acknowledged once every block (series, 10 s quantum) is on W replicas.
    let ack = client.write(&series, &points).await?;
    println!("wrote {} points in {} blocks", ack.points, ack.blocks);

    // A range read fans out to one request per quantum, in parallel, trimmed exactly.
    let last_ten_seconds = TimeRange::new(now - 10_000_000_000, now)?;
    let read = client.read(&series, last_ten_seconds).await?;
    println!("read {} points from the last 10 s; the first: {:?}", read.len(), read.first());

    // Errors are typed: the node says what was wrong.
    match client.read(&"no.such.series".parse()?, last_ten_seconds).await {
        Err(e) => println!("as expected: {e} (code {:?})", e.code()),
        Ok(p) => println!("unexpectedly found {} points", p.len()),
    }
    client.close().await;
    Ok(())
}

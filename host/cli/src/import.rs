//! `timeshard import FILE.csv`: points from a CSV file written through one node in batches,
//! several in flight, with a progress bar over the file and a summary at the end.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressStyle};
use timeshard_proto::SeriesKey;

use crate::conn::ConnArgs;
use timeshard_formats::csv_points::{CsvPoints, group};

#[derive(Debug, Args)]
#[command(long_about = "\
Writes the points of a CSV file through any node, in batches (several in flight), each
acknowledged by its write quorum. Rows are `series,ts,value[,event]` (what `timeshard export
--format csv` writes), or `ts,value[,event]` with --series. A header line is skipped. Times are
nanoseconds since the Unix epoch or RFC 3339. Writes are idempotent: an interrupted import can
simply be run again.

  timeshard import pmu.csv
  timeshard import bus7.csv --series 'pmu.phase{bus=7,site=atl}'")]
pub(crate) struct ImportArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The CSV file.
    file: PathBuf,
    /// The series of every row (then rows are ts,value[,event]).
    #[arg(long)]
    series: Option<String>,
    /// Points per write.
    #[arg(long, default_value_t = 5_000)]
    batch: usize,
    /// Writes in flight at once.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
}

pub(crate) async fn run(args: ImportArgs) -> Result<()> {
    let series: Option<SeriesKey> = args.series.as_deref().map(str::parse).transpose()?;
    let file = std::fs::File::open(&args.file).with_context(|| format!("cannot open {}", args.file.display()))?;
    let size = file.metadata()?.len();
    let client = args.conn.connect().await?;
    let started = Instant::now();
    let bar = ProgressBar::new(size).with_style(
        ProgressStyle::with_template("{spinner} {bytes}/{total_bytes} [{wide_bar}] {msg} ({eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut reader = CsvPoints::new(bar.wrap_read(file), series, timeshard_clock::now_ns());
    let (mut sent, mut stored, mut rejected) = (0u64, 0u64, 0u64);
    let mut distinct = std::collections::HashSet::new();
    let mut rows = Vec::with_capacity(args.batch);
    let mut in_flight = FuturesUnordered::new();
    loop {
        let next = reader.next_point()?;
        let more = next.is_some();
        if let Some((key, p)) = next {
            if distinct.len() < 1_000_000 {
                distinct.insert(key.clone());
            }
            rows.push((key, p));
        }
        if rows.len() >= args.batch || (!more && !rows.is_empty()) {
            sent += rows.len() as u64;
            in_flight.push(client.write_batch(group(std::mem::take(&mut rows))));
        }
        while in_flight.len() >= args.in_flight.max(1) || (!more && !in_flight.is_empty()) {
            let ack = in_flight.next().await.expect("a write in flight").context("a write failed")?;
            stored += ack.points;
            rejected += ack.rejected;
            bar.set_message(format!("{stored} points written"));
        }
        if !more {
            break;
        }
    }
    bar.finish_and_clear();
    drop(in_flight);
    client.close().await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "imported {stored} points of {sent} read ({rejected} refused by ingest policies) into {} series from {} in \
         {secs:.1} s ({:.0} points/s)",
        distinct.len(),
        args.file.display(),
        sent as f64 / secs.max(1e-9)
    );
    Ok(())
}

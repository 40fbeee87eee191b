//! `timeshard import FILE.csv`: points from a CSV file written through one node in batches,
//! several in flight, with a progress bar over the file and a summary at the end.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressStyle};
use timeshard_proto::{Point, SeriesKey};
use timeshard_sdk::SeriesPoints;

use crate::conn::ConnArgs;
use crate::time::parse_time;

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

/// Groups rows into a write batch, one entry per series.
fn batch_of(rows: Vec<(SeriesKey, Point)>) -> Vec<SeriesPoints> {
    let mut out: Vec<SeriesPoints> = Vec::new();
    for (series, p) in rows {
        match out.iter_mut().rev().find(|s| s.series == series) {
            Some(s) => s.points.push(p),
            None => out.push(SeriesPoints { series, points: vec![p] }),
        }
    }
    out
}

/// One CSV row as (series, point); `None` for a header.
fn row(fields: &[&str], series: Option<&SeriesKey>, line: u64) -> Result<Option<(SeriesKey, Point)>> {
    let (key, rest) = match series {
        Some(s) => (s.clone(), fields),
        None => {
            let Some((first, rest)) = fields.split_first() else { bail!("CSV line {line} is empty") };
            if line == 1 && *first == "series" {
                return Ok(None);
            }
            (first.parse().with_context(|| format!("CSV line {line}: bad series key {first:?}"))?, rest)
        }
    };
    if line == 1 && rest.first().is_some_and(|f| *f == "ts" || *f == "time") {
        return Ok(None);
    }
    if rest.len() < 2 || rest.len() > 3 {
        bail!(
            "CSV line {line} has {} fields; expected {}ts,value[,event]",
            fields.len(),
            if series.is_some() { "" } else { "series," }
        );
    }
    let ts = parse_time(rest[0]).with_context(|| format!("CSV line {line}"))?;
    let value: f64 = rest[1].parse().with_context(|| format!("CSV line {line}: bad value {:?}", rest[1]))?;
    let event = match rest.get(2) {
        Some(e) => e.parse().with_context(|| format!("CSV line {line}: bad event id {e:?}"))?,
        None => 0,
    };
    Ok(Some((key, Point { ts, value, event })))
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
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bar.wrap_read(file));
    let (mut sent, mut stored, mut rejected) = (0u64, 0u64, 0u64);
    let mut distinct = std::collections::HashSet::new();
    let mut rows = Vec::with_capacity(args.batch);
    let mut in_flight = FuturesUnordered::new();
    let mut record = csv::StringRecord::new();
    let mut line = 0u64;
    loop {
        let more = reader.read_record(&mut record).with_context(|| format!("CSV line {} is malformed", line + 1))?;
        if more {
            line += 1;
            let fields: Vec<&str> = record.iter().collect();
            if let Some((key, p)) = row(&fields, series.as_ref(), line)? {
                if distinct.len() < 1_000_000 {
                    distinct.insert(key.clone());
                }
                rows.push((key, p));
            }
        }
        if rows.len() >= args.batch || (!more && !rows.is_empty()) {
            sent += rows.len() as u64;
            in_flight.push(client.write_batch(batch_of(std::mem::take(&mut rows))));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_in_both_shapes_and_headers() {
        let key: SeriesKey = "m{a=1}".parse().unwrap();
        assert_eq!(row(&["series", "ts", "value"], None, 1).unwrap(), None);
        assert_eq!(row(&["ts", "value"], Some(&key), 1).unwrap(), None);
        let (k, p) = row(&["m{a=1}", "5", "1.5", "2"], None, 2).unwrap().unwrap();
        assert_eq!((k, p), (key.clone(), Point { ts: 5, value: 1.5, event: 2 }));
        let (_, p) = row(&["2023-11-14T22:13:20Z", "3"], Some(&key), 7).unwrap().unwrap();
        assert_eq!(p.ts, 1_700_000_000_000_000_000);
        assert!(row(&["m", "5"], None, 3).unwrap_err().to_string().contains("CSV line 3 has 2 fields"));
        assert!(format!("{:#}", row(&["m", "x", "1"], None, 4).unwrap_err()).contains("CSV line 4"));
        let b = batch_of(vec![
            (key.clone(), Point::new(1, 1.0)),
            ("n".parse().unwrap(), Point::new(1, 2.0)),
            (key, Point::new(2, 3.0)),
        ]);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].points.len(), 2);
    }
}

//! `timeshard get`: a time range of one series, raw or in windows, as CSV or JSON.

use std::io::{BufWriter, Write};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use timeshard_proto::{SeriesKey, TimeRange};

use crate::conn::ConnArgs;
use crate::rows::Rows;
use crate::time::{TimeFormat, format_time, parse_time};

#[derive(Debug, Args)]
#[command(long_about = "\
Reads [START, END) of one series (the end is exclusive), trimmed exactly, sorted by time.
With --window, prints one row per window instead (aligned to the epoch, trimmed to the range):
count, min, max, mean, sum, first and last; whole quanta inside a window are answered from
block summaries without reading their points.

Times are nanoseconds since the Unix epoch, RFC 3339 (2023-11-14T22:13:20Z), `now`, or
`now-DURATION` (now-15m).
  timeshard get 'pmu.phase{bus=7,site=atl}' --start 2023-11-14T22:13:20Z --end 2023-11-14T22:16:20Z
  timeshard get 'pmu.phase{bus=7,site=atl}' --start now-1d --end now --window 1m")]
pub(crate) struct GetArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The series, e.g. 'pmu.phase{bus=7,site=atl}'.
    series: String,
    /// First instant of the range.
    #[arg(long)]
    start: String,
    /// First instant after the range.
    #[arg(long)]
    end: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
    /// How timestamps are printed.
    #[arg(long, value_enum, default_value = "ns")]
    time: TimeFormat,
    /// Aggregate in windows of this width (e.g. 10s, 1m, 1h) instead of printing raw points.
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Csv,
    Json,
}

pub(crate) async fn run(args: GetArgs) -> Result<()> {
    let series: SeriesKey = args.series.parse()?;
    let range = TimeRange::new(parse_time(&args.start)?, parse_time(&args.end)?)?;
    let client = args.conn.connect().await?;
    if let Some(width) = args.window {
        let width_ns = i64::try_from(width.as_nanos()).context("window too wide")?;
        let windows = client.aggregate(&series, range, width_ns).await?;
        print_windows(&series, &windows, args.format, args.time)?;
        client.close().await;
        return Ok(());
    }
    // Batches are written as they arrive: the range is never held whole.
    let stdout = std::io::stdout();
    let json = matches!(args.format, Format::Json);
    let mut rows = Rows::start(stdout.lock(), json, args.time, series.as_str())?;
    let mut batches = std::pin::pin!(client.read_stream(&series, range));
    while let Some(batch) = batches.next().await {
        rows.batch(&batch?)?;
    }
    rows.finish()?;
    client.close().await;
    Ok(())
}

fn print_windows(
    series: &SeriesKey,
    windows: &[timeshard_sdk::WindowStats],
    format: Format,
    time: TimeFormat,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match format {
        Format::Csv => {
            writeln!(out, "start,end,count,min,max,mean,sum,first,last")?;
            for w in windows {
                writeln!(
                    out,
                    "{},{},{},{},{},{},{},{},{}",
                    format_time(w.start, time),
                    format_time(w.end, time),
                    w.count,
                    w.min,
                    w.max,
                    w.mean(),
                    w.sum,
                    w.first,
                    w.last
                )?;
            }
        }
        Format::Json => {
            let num = |v: f64| if v.is_finite() { serde_json::json!(v) } else { serde_json::json!(v.to_string()) };
            let rows: Vec<serde_json::Value> = windows
                .iter()
                .map(|w| {
                    serde_json::json!({"start": format_time(w.start, time), "end": format_time(w.end, time),
                        "count": w.count, "min": num(w.min), "max": num(w.max), "mean": num(w.mean()),
                        "sum": num(w.sum), "first": num(w.first), "last": num(w.last)})
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"series": series.as_str(), "windows": rows}))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

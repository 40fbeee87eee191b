//! `timeshard get`: a time range of one series, raw or in windows, as CSV or JSON.

use std::io::{BufWriter, Write};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use timeshard_proto::{SeriesKey, TimeRange};

use crate::conn::{ConnArgs, LocationArg};
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
  timeshard get 'pmu.phase{bus=7,site=atl}' --start now-1d --end now --window 1m
  timeshard get 'pmu.phase{bus=7,site=atl}' --latest
  timeshard get 'traffic.speed{geohash=dn5bpsb}' --latest --location 33.75,-84.39")]
pub(crate) struct GetArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(flatten)]
    location: LocationArg,
    /// The series, e.g. 'pmu.phase{bus=7,site=atl}' (not with --near).
    #[arg(required_unless_present = "near")]
    series: Option<String>,
    /// With --near: the metric prefix of the series to read (e.g. traffic.).
    #[arg(long, requires = "near", default_value = "")]
    metric: String,
    /// A geographic read: every series of --metric whose location (geohash= or lat=/lon= tags)
    /// lies within --radius of LAT,LON.
    #[arg(long, requires = "radius", conflicts_with_all = ["series", "latest", "window"])]
    near: Option<String>,
    /// With --near: the radius (e.g. 5km, 500m).
    #[arg(long, requires = "near")]
    radius: Option<String>,
    /// First instant of the range.
    #[arg(long, required_unless_present = "latest")]
    start: Option<String>,
    /// First instant after the range.
    #[arg(long, required_unless_present = "latest")]
    end: Option<String>,
    /// Print only the newest point of the series (no range needed).
    #[arg(long, conflicts_with_all = ["start", "end", "window"])]
    latest: bool,
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
    if let Some(near) = &args.near {
        return run_near(&args, near).await;
    }
    let series: SeriesKey = args.series.as_deref().context("name the series, or use --near")?.parse()?;
    if args.latest {
        let client = args.location.apply(args.conn.connect().await?)?;
        let latest = client.latest(&series).await?;
        client.close().await;
        return print_points(&series, latest.as_slice(), args.format, args.time);
    }
    let (Some(start), Some(end)) = (&args.start, &args.end) else {
        anyhow::bail!("give --start and --end, or --latest");
    };
    let range = TimeRange::new(parse_time(start)?, parse_time(end)?)?;
    let client = args.location.apply(args.conn.connect().await?)?;
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

/// `--near`: the points of every series of `--metric` within `--radius` of a location.
async fn run_near(args: &GetArgs, near: &str) -> Result<()> {
    let center: timeshard_proto::geo::GeoPoint = near.parse().context("--near")?;
    let radius = timeshard_proto::geo::parse_distance_m(args.radius.as_deref().unwrap_or_default())
        .context("--radius must be positive and at most 20,000 km")?;
    let (Some(start), Some(end)) = (&args.start, &args.end) else {
        anyhow::bail!("a geographic read needs --start and --end");
    };
    let range = TimeRange::new(parse_time(start)?, parse_time(end)?)?;
    let client = args.location.apply(args.conn.connect().await?)?;
    let found = client.read_near(&args.metric, center, radius, range).await;
    client.close().await;
    let found = found?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match args.format {
        Format::Csv => {
            writeln!(out, "series,ts,value,event")?;
            for (series, points) in &found {
                for p in points {
                    writeln!(out, "\"{}\",{},{},{}", series, format_time(p.ts, args.time), p.value, p.event)?;
                }
            }
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = found
                .iter()
                .map(|(s, points)| {
                    let points: Vec<serde_json::Value> = points.iter().map(|p| json_point(p, args.time)).collect();
                    serde_json::json!({"series": s.as_str(), "points": points})
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"series": rows}))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// One point as a JSON object.
fn json_point(p: &timeshard_proto::Point, time: TimeFormat) -> serde_json::Value {
    let ts = match time {
        TimeFormat::Ns => serde_json::json!(p.ts),
        TimeFormat::Rfc3339 => serde_json::json!(format_time(p.ts, time)),
    };
    // JSON has no NaN or infinity: those values are written as strings.
    let value = if p.value.is_finite() { serde_json::json!(p.value) } else { serde_json::json!(p.value.to_string()) };
    serde_json::json!({"ts": ts, "value": value, "event": p.event})
}

/// Prints raw points as CSV or JSON.
fn print_points(series: &SeriesKey, points: &[timeshard_proto::Point], format: Format, time: TimeFormat) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match format {
        Format::Csv => {
            writeln!(out, "ts,value,event")?;
            for p in points {
                writeln!(out, "{},{},{}", format_time(p.ts, time), p.value, p.event)?;
            }
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = points.iter().map(|p| json_point(p, time)).collect();
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({"series": series.as_str(), "points": rows}))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
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

//! `timeshard put`: points as arguments or CSV on standard input, written through one node.

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use timeshard_proto::point::SeriesPoints;
use timeshard_proto::{Point, SeriesKey};

use crate::conn::{ConnArgs, LocationArg};
use crate::time::parse_time;
use timeshard_formats::csv_points::CsvPoints;

#[derive(Debug, Args)]
#[command(long_about = "\
Writes points through any node, which places them on their replicas and returns once the write
quorum acknowledged them. Writing the same point twice stores it once, so a failed put can
simply be repeated.

Points as arguments, with the series first:
  timeshard put 'pmu.phase{bus=7,site=atl}' 1700000000000000000=49.98 1700000000016666666=50.01

TS is nanoseconds since the Unix epoch, an RFC 3339 time (2023-11-14T22:13:20Z) or `now`.
Append #N to a point for event id N (several events at one timestamp): 1700000000000000000=3#2.

Without points, CSV is read from standard input: `ts,value[,event]` when the series is given,
otherwise `series,ts,value[,event]` (quote series keys: they contain commas). A header line is
skipped.
  printf '%s\\n' 1700000000000000000,49.98 | timeshard put 'pmu.phase{bus=7,site=atl}'")]
pub(crate) struct PutArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(flatten)]
    location: LocationArg,
    /// The series, e.g. 'pmu.phase{bus=7,site=atl}'.
    series: Option<String>,
    /// Points as TS=VALUE or TS=VALUE#EVENT.
    points: Vec<String>,
}

/// Parses `TS=VALUE` or `TS=VALUE#EVENT`.
fn parse_point_arg(s: &str) -> Result<Point> {
    let (ts, rest) = s.split_once('=').ok_or_else(|| anyhow!("point {s:?} is not TS=VALUE"))?;
    let (value, event) = match rest.split_once('#') {
        Some((v, e)) => (v, e.parse::<u64>().with_context(|| format!("bad event id in {s:?}"))?),
        None => (rest, 0),
    };
    let value: f64 = value.trim().parse().with_context(|| format!("bad value in point {s:?}"))?;
    Ok(Point { ts: parse_time(ts)?, value, event })
}

pub(crate) async fn run(args: PutArgs) -> Result<()> {
    let series: Option<SeriesKey> = args.series.as_deref().map(str::parse).transpose()?;
    let batch = if args.points.is_empty() {
        CsvPoints::new(std::io::stdin().lock(), series, timeshard_clock::now_ns()).read_all()?
    } else {
        let series = series.ok_or_else(|| anyhow!("give the series before the points"))?;
        let points = args.points.iter().map(|p| parse_point_arg(p)).collect::<Result<Vec<_>>>()?;
        vec![SeriesPoints { series, points }]
    };
    let total: usize = batch.iter().map(|s| s.points.len()).sum();
    if total == 0 {
        bail!("no points to write: give TS=VALUE arguments or CSV on standard input");
    }
    let client = args.location.apply(args.conn.connect().await?)?;
    let ack = client.write_batch(batch).await?;
    eprintln!("wrote {} points in {} blocks through {}", ack.points, ack.blocks, client.addr());
    if ack.rejected > 0 {
        eprintln!("{} points were refused by an ingest policy:", ack.rejected);
        for r in ack.rejections.iter().take(20) {
            eprintln!("  {} {}={}: {}", r.series, r.point.ts, r.point.value, r.reason);
        }
    }
    client.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_arguments_parse() {
        let p = parse_point_arg("5=1.5#3").unwrap();
        assert_eq!((p.ts, p.value, p.event), (5, 1.5, 3));
        assert!(parse_point_arg("5").is_err());
        assert!(parse_point_arg("5=x").is_err());
    }
}

//! `timeshard put`: points as arguments or CSV on standard input, written through one node.

use std::io::Read;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use timeshard_proto::{Point, SeriesKey};
use timeshard_sdk::SeriesPoints;

use crate::conn::{ConnArgs, LocationArg};
use crate::time::parse_time;

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

/// Reads CSV points from `input`. With `series`, rows are `ts,value[,event]`; without, they
/// are `series,ts,value[,event]`.
fn read_csv(input: impl Read, series: Option<&SeriesKey>) -> Result<Vec<SeriesPoints>> {
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(input);
    let mut out: Vec<SeriesPoints> = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 1;
        let record = record.with_context(|| format!("CSV line {line} is malformed"))?;
        let fields: Vec<&str> = record.iter().collect();
        let (key, rest) = match series {
            Some(s) => (s.clone(), &fields[..]),
            None => {
                let Some((first, rest)) = fields.split_first() else { continue };
                if line == 1 && *first == "series" {
                    continue;
                }
                let key: SeriesKey = first.parse().with_context(|| format!("CSV line {line}: bad series key"))?;
                (key, rest)
            }
        };
        if line == 1 && rest.first().is_some_and(|f| *f == "ts" || *f == "time") {
            continue;
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
            Some(e) if !e.is_empty() => e.parse().with_context(|| format!("CSV line {line}: bad event id {e:?}"))?,
            _ => 0,
        };
        let point = Point { ts, value, event };
        match out.last_mut() {
            Some(last) if last.series == key => last.points.push(point),
            _ => out.push(SeriesPoints { series: key, points: vec![point] }),
        }
    }
    Ok(out)
}

pub(crate) async fn run(args: PutArgs) -> Result<()> {
    let series: Option<SeriesKey> = args.series.as_deref().map(str::parse).transpose()?;
    let batch = if args.points.is_empty() {
        read_csv(std::io::stdin().lock(), series.as_ref())?
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

    #[test]
    fn csv_reads_both_layouts_and_reports_bad_lines() {
        let s: SeriesKey = "m".parse().unwrap();
        let got = read_csv("ts,value\n1,2.5\n2,3.5,7\n".as_bytes(), Some(&s)).unwrap();
        assert_eq!(got[0].points.len(), 2);
        assert_eq!(got[0].points[1].event, 7);
        let got = read_csv("series,ts,value\n\"a{x=1,y=2}\",1,2\nb,2,3\n".as_bytes(), None).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].series.as_str(), "a{x=1,y=2}");
        let err = read_csv("1,2\n3,oops\n".as_bytes(), Some(&s)).unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}

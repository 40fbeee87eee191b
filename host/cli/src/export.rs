//! `timeshard export`: a time range of some series to CSV or Parquet, read page by page, with
//! a progress bar over the series and the range and a summary at the end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use timeshard_proto::{Point, SeriesKey, TimeRange};

use crate::conn::ConnArgs;
use crate::time::parse_time;

/// Points per Parquet row group.
const ROW_GROUP: usize = 1_000_000;

/// The Parquet schema: one row per point, with its series.
pub(crate) const PARQUET_SCHEMA: &str = "message point {
    REQUIRED BYTE_ARRAY series (UTF8);
    REQUIRED INT64 ts (TIMESTAMP(NANOS, true));
    REQUIRED DOUBLE value;
    REQUIRED INT64 event (INTEGER(64, false));
}";

#[derive(Debug, Args)]
#[command(long_about = "\
Reads [START, END) of some series and writes every point, as CSV (`series,ts,value,event`, what
`timeshard import` reads) or Parquet (columns series, ts as nanosecond UTC timestamps, value,
event; snappy pages). Name series with --series (repeat), or select them with --metric and
--tag as `timeshard series` does.

  timeshard export --series 'pmu.phase{bus=7,site=atl}' --start now-1d --end now --out day.csv
  timeshard export --metric pmu. --tag site=atl --start 2023-11-14T00:00:00Z --end now \\
      --format parquet --out atl.parquet")]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// A series to export; repeat for several.
    #[arg(long = "series")]
    series: Vec<String>,
    /// Also every series whose metric starts with this.
    #[arg(long)]
    metric: Option<String>,
    /// With --metric: only series with this tag, NAME=VALUE; repeat for several.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// First instant of the range (ns, RFC 3339, now, now-15m).
    #[arg(long)]
    start: String,
    /// First instant after the range.
    #[arg(long)]
    end: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
    /// Output file (CSV goes to standard output without it; Parquet needs it).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum Format {
    Csv,
    Parquet,
}

/// Where points go.
enum Sink {
    Csv(csv::Writer<Box<dyn Write>>),
    Parquet { writer: SerializedFileWriter<std::fs::File>, rows: Vec<(Arc<str>, Point)> },
}

impl Sink {
    fn open(format: Format, out: Option<&Path>) -> Result<Sink> {
        Ok(match format {
            Format::Csv => {
                let w: Box<dyn Write> = match out {
                    Some(p) => Box::new(std::io::BufWriter::new(
                        std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
                    )),
                    None => Box::new(std::io::BufWriter::new(std::io::stdout())),
                };
                let mut csv = csv::Writer::from_writer(w);
                csv.write_record(["series", "ts", "value", "event"])?;
                Sink::Csv(csv)
            }
            Format::Parquet => {
                let path = out.ok_or_else(|| anyhow!("--format parquet needs --out FILE"))?;
                let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
                let schema = Arc::new(parse_message_type(PARQUET_SCHEMA)?);
                let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
                Sink::Parquet { writer: SerializedFileWriter::new(file, schema, props)?, rows: Vec::new() }
            }
        })
    }

    fn push(&mut self, series: &Arc<str>, points: &[Point]) -> Result<()> {
        match self {
            Sink::Csv(w) => {
                for p in points {
                    w.write_record([series.as_ref(), &p.ts.to_string(), &p.value.to_string(), &p.event.to_string()])?;
                }
            }
            Sink::Parquet { writer, rows } => {
                rows.extend(points.iter().map(|p| (series.clone(), *p)));
                if rows.len() >= ROW_GROUP {
                    flush_row_group(writer, rows)?;
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Sink::Csv(mut w) => w.flush()?,
            Sink::Parquet { mut writer, mut rows } => {
                flush_row_group(&mut writer, &mut rows)?;
                writer.close()?;
            }
        }
        Ok(())
    }
}

fn flush_row_group(writer: &mut SerializedFileWriter<std::fs::File>, rows: &mut Vec<(Arc<str>, Point)>) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut group = writer.next_row_group()?;
    let mut column = 0;
    while let Some(mut col) = group.next_column()? {
        match column {
            0 => {
                let v: Vec<ByteArray> = rows.iter().map(|(s, _)| ByteArray::from(s.as_bytes().to_vec())).collect();
                col.typed::<ByteArrayType>().write_batch(&v, None, None)?;
            }
            1 => col
                .typed::<Int64Type>()
                .write_batch(&rows.iter().map(|(_, p)| p.ts).collect::<Vec<_>>(), None, None)
                .map(drop)?,
            2 => col
                .typed::<DoubleType>()
                .write_batch(&rows.iter().map(|(_, p)| p.value).collect::<Vec<_>>(), None, None)
                .map(drop)?,
            // Unsigned 64-bit in a signed column, as Parquet stores UINT64.
            3 => col
                .typed::<Int64Type>()
                .write_batch(&rows.iter().map(|(_, p)| p.event as i64).collect::<Vec<_>>(), None, None)
                .map(drop)?,
            _ => bail!("the Parquet schema has more columns than the exporter writes"),
        }
        col.close()?;
        column += 1;
    }
    group.close()?;
    rows.clear();
    Ok(())
}

pub(crate) async fn run(args: ExportArgs) -> Result<()> {
    let range = TimeRange::new(parse_time(&args.start)?, parse_time(&args.end)?)?;
    let client = args.conn.connect().await?;
    let mut series: Vec<SeriesKey> = args.series.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    if let Some(metric) = &args.metric {
        let tags = args
            .tags
            .iter()
            .map(|t| t.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| anyhow!("tags are NAME=VALUE"))?;
        let filter = timeshard_sdk::SeriesFilter { metric_prefix: metric.clone(), tags };
        let (listed, more) = client.list_series(filter, 100_000).await?;
        if more {
            bail!("more than 100,000 series match --metric and --tag; narrow them");
        }
        series.extend(listed);
    } else if !args.tags.is_empty() {
        bail!("--tag selects series together with --metric");
    }
    series.sort();
    series.dedup();
    if series.is_empty() {
        bail!("no series to export: name them with --series, or select them with --metric");
    }
    let started = Instant::now();
    let mut sink = Sink::open(args.format, args.out.as_deref())?;
    // Progress: each series is the range's length; a page moves it to its last point.
    let span = range.len_ns() as u64;
    let bar = ProgressBar::new(span.saturating_mul(series.len() as u64)).with_style(
        ProgressStyle::with_template("{spinner} series {msg} [{wide_bar}] {percent}% ({eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut total = 0u64;
    for (i, key) in series.iter().enumerate() {
        bar.set_message(format!("{}/{} {key}", i + 1, series.len()));
        let name: Arc<str> = key.as_str().into();
        let mut after = None;
        loop {
            let (points, next) = client.read_page(key, range, after).await.with_context(|| format!("reading {key}"))?;
            total += points.len() as u64;
            sink.push(&name, &points)?;
            let done = points.last().map_or(span, |p| (p.ts - range.start()) as u64);
            bar.set_position(i as u64 * span + done.min(span));
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        bar.set_position((i as u64 + 1) * span);
    }
    sink.finish()?;
    bar.finish_and_clear();
    client.close().await;
    let secs = started.elapsed().as_secs_f64();
    let to = args.out.as_ref().map_or_else(|| "standard output".to_string(), |p| p.display().to_string());
    eprintln!(
        "exported {total} points of {} series to {to} ({:?}) in {secs:.1} s ({:.0} points/s)",
        series.len(),
        args.format,
        total as f64 / secs.max(1e-9)
    );
    Ok(())
}

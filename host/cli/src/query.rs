//! `timeshard query`: a query policy run over a time range where the data lives.

use anyhow::{Result, anyhow};
use clap::Args;
use timeshard_proto::{SeriesKey, TimeRange};

use crate::conn::ConnArgs;
use crate::get::Format;
use crate::time::parse_time;

#[derive(Debug, Args)]
#[command(long_about = "\
Runs a query policy over [START, END) of one series. The nodes that own each quantum run the
policy over their raw points and send back only a small partial result; the node you talk to
merges them. The policy must be installed and bound to the series on every node ([policy] in
the node configuration).

  timeshard query 'pmu.phase{bus=7,site=atl}' --policy rms --start 2023-11-14T22:13:20Z --end now
  timeshard query 'pmu.phase{bus=7,site=atl}' --policy threshold-crossings --param threshold=49.5 \\
      --start 2023-11-14T22:13:20Z --end now")]
pub(crate) struct QueryArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The series.
    series: String,
    /// The query policy, by name (the version bound on the nodes runs).
    #[arg(long)]
    policy: String,
    /// First instant of the range.
    #[arg(long)]
    start: String,
    /// First instant after the range.
    #[arg(long)]
    end: String,
    /// A parameter for the policy, NAME=VALUE; repeat for several.
    #[arg(long = "param")]
    params: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
}

pub(crate) async fn run(args: QueryArgs) -> Result<()> {
    let series: SeriesKey = args.series.parse()?;
    let range = TimeRange::new(parse_time(&args.start)?, parse_time(&args.end)?)?;
    let params: Vec<(&str, &str)> = args
        .params
        .iter()
        .map(|p| p.split_once('=').ok_or_else(|| anyhow!("parameter {p:?} is not NAME=VALUE")))
        .collect::<Result<_>>()?;
    let client = args.conn.connect().await?;
    let out = client.query(&series, range, &args.policy, &params).await?;
    match args.format {
        Format::Csv => {
            println!("# {}@{} over {series}", out.policy, out.version);
            for (name, value) in &out.values {
                println!("{name},{value}");
            }
            if !out.points.is_empty() {
                println!("ts,value,event");
                for p in &out.points {
                    println!("{},{},{}", p.ts, p.value, p.event);
                }
            }
        }
        Format::Json => {
            let values: serde_json::Map<String, serde_json::Value> =
                out.values.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect();
            let points: Vec<serde_json::Value> = out
                .points
                .iter()
                .map(|p| serde_json::json!({"ts": p.ts, "value": p.value, "event": p.event}))
                .collect();
            let doc = serde_json::json!({"policy": out.policy, "version": out.version, "series": series.as_str(),
                "values": values, "points": points});
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    client.close().await;
    Ok(())
}

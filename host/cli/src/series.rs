//! `timeshard series`: the series of the cluster, by metric prefix and tags.

use anyhow::{Result, anyhow};
use clap::Args;

use crate::conn::ConnArgs;

#[derive(Debug, Args)]
pub(crate) struct SeriesArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Only series whose metric starts with this.
    #[arg(long, default_value = "")]
    metric: String,
    /// Only series with this tag, NAME=VALUE; repeat for several.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Most series to print.
    #[arg(long, default_value_t = 10_000)]
    limit: u32,
}

pub(crate) async fn run(args: SeriesArgs) -> Result<()> {
    let tags = args
        .tags
        .iter()
        .map(|t| t.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| anyhow!("tags are NAME=VALUE"))?;
    let client = args.conn.connect().await?;
    let (series, more) =
        client.list_series(timeshard_sdk::SeriesFilter { metric_prefix: args.metric, tags }, args.limit).await?;
    for s in &series {
        println!("{s}");
    }
    if more {
        eprintln!("(more than {} series; raise --limit or narrow the filter)", args.limit);
    }
    client.close().await;
    Ok(())
}

//! A look at an archive before the node's `timeshard archive` command exists:
//!
//! ```sh
//! cargo run -p timeshard-tier --example archive -- status /var/lib/timeshard/archive
//! cargo run -p timeshard-tier --example archive -- cleanup s3://bucket/prefix 86400
//! ```
//!
//! `status` prints what the archive holds as JSON; `cleanup` removes points files no manifest
//! commits that are older than the grace age in seconds.

use std::time::Duration;

use anyhow::{Context, bail};
use timeshard_tier::{Archive, Config};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, url) = match args.as_slice() {
        [command, url, ..] => (command.as_str(), url.as_str()),
        _ => bail!("usage: archive status URL | archive cleanup URL GRACE_SECONDS"),
    };
    let archive = Archive::open(url, Config::for_node("inspector")).with_context(|| format!("opening {url}"))?;
    match command {
        "status" => println!("{}", serde_json::to_string_pretty(&archive.status().await?)?),
        "cleanup" => {
            let grace: u64 = args.get(2).context("cleanup needs a grace age in seconds")?.parse()?;
            println!("{}", serde_json::to_string_pretty(&archive.cleanup(Duration::from_secs(grace)).await?)?);
        }
        other => bail!("unknown command {other:?}: use status or cleanup"),
    }
    Ok(())
}

//! `timeshard-control bench`.

/// `bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {}

pub async fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}

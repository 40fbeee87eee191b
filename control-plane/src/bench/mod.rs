//! `timeshard-control bench`, and what it shares with the tests: a throwaway PostgreSQL
//! ([`postgres`]) and `serve` as a child process ([`process`]).

pub mod postgres;
pub mod process;

/// `bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {}

pub async fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}

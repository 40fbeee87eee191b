//! The `timeshard-control` command line: `serve` runs the service; the other commands talk to a
//! running service over its API with an API token.

pub mod admin;
pub mod client;
pub mod http_token;
pub mod policy;
pub mod serve;

use clap::{Parser, Subcommand};

const ABOUT: &str =
    "The timeshard control plane: enrolls devices, hands out their configuration and policies, keeps an audit log";

const LONG_ABOUT: &str = "\
The timeshard control plane: a fleet CA that enrolls devices with one-time tokens, the fleet's
desired state (series classes, per-site node configurations, revocations) that nodes watch and
apply without restarting, policy modules it signs and rolls out in stages (canary, waves,
automatic abort), and an audit log of every change. State lives in SQLite in the data
directory, or in PostgreSQL with --database (several `serve` instances can share one).";

const EXAMPLES: &str = "\
Examples:
  # Start the service the first time; it prints an admin token and the variables to export.
  timeshard-control serve --init --listen 0.0.0.0:7443 --data-dir /var/lib/timeshard-control
  export TIMESHARD_CONTROL_URL=https://cp.example:7443 TIMESHARD_CONTROL_TOKEN=tsa1...

  # A one-time token for a device in Atlanta, valid for an hour.
  timeshard-control token create --labels site=atl --location 33.75,-84.39 --expires 1h
  # On the device:
  timeshard node --enroll https://cp.example:7443 --token tsc1... --data-dir /var/lib/timeshard

  # Desired state: classes for every node, settings per site.
  timeshard-control class set pmu --prefix pmu. --quantum 10s --rf 3 --w 2 --r 2 --retention 30d
  timeshard-control node-config set atl --select site=atl --bootstrap 10.0.0.5:7400
  # Context of interest: data placed near where it is, by the nodes' locations.
  timeshard-control class set traffic --prefix traffic. \\
      --coi n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5
  timeshard-control device set-location 3f2a... 33.75,-84.39
  timeshard-control devices
  timeshard-control device revoke 3f2a...
  timeshard-control audit

  # Policy modules, signed by the control plane and rolled out in stages.
  timeshard-control policy upload --name pmu-validate --version 1.3.0 --kind ingest pmu_validate.wasm
  timeshard-control rollout start pmu-validate@1.3.0 --select site=atl --canary 1 --waves 25%,100% --abort-above 5%
  timeshard-control rollout status pmu-validate
  timeshard-control rollout promote pmu-validate";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "timeshard-control", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the control plane service (HTTPS API and fleet CA).
    Serve(serve::ServeArgs),
    /// Enrollment tokens: one-time secrets that let one device enroll.
    #[command(subcommand)]
    Token(admin::TokenCommand),
    /// API tokens for people and scripts, with roles admin, operator or viewer.
    #[command(subcommand, name = "api-token")]
    ApiToken(admin::ApiTokenCommand),
    /// Tokens for the nodes' HTTP side (InfluxDB, Prometheus, queries), per selector.
    #[command(subcommand, name = "http-token")]
    HttpToken(http_token::HttpTokenCommand),
    /// Series classes every node uses: key format, quantum, replication, retention.
    #[command(subcommand)]
    Class(admin::ClassCommand),
    /// Node settings per selector (labels and/or geohash prefix): bootstrap peers, limits.
    #[command(subcommand, name = "node-config")]
    NodeConfig(admin::NodeConfigCommand),
    /// List enrolled devices with what they report.
    Devices(admin::DevicesArgs),
    /// Act on one device.
    #[command(subcommand)]
    Device(admin::DeviceCommand),
    /// Policy modules: upload (checked and signed with the fleet's key), list, show, download.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Staged rollouts of policy versions: start, status, promote, pause, resume, rollback.
    #[command(subcommand)]
    Rollout(policy::RolloutCommand),
    /// The audit log: who changed what, when, before and after.
    Audit(admin::AuditArgs),
    /// The fleet: CA fingerprint, generation and digest.
    Fleet(admin::FleetArgs),
}

/// Runs the command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Token(c) => admin::token(c).await,
        Command::ApiToken(c) => admin::api_token(c).await,
        Command::HttpToken(c) => http_token::run(c).await,
        Command::Class(c) => admin::class(c).await,
        Command::NodeConfig(c) => admin::node_config(c).await,
        Command::Devices(a) => admin::devices(a).await,
        Command::Device(c) => admin::device(c).await,
        Command::Policy(c) => policy::policy(c).await,
        Command::Rollout(c) => policy::rollout(c).await,
        Command::Audit(a) => admin::audit(a).await,
        Command::Fleet(a) => admin::fleet(a).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_parses_a_rollout() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "timeshard-control",
            "rollout",
            "start",
            "pmu-validate@1.3.0",
            "--select",
            "site=atl",
            "--canary",
            "1",
            "--waves",
            "25%,100%",
            "--abort-above",
            "5%",
            "--url",
            "https://cp:1",
            "--api-token",
            "t",
        ])
        .unwrap();
        let Command::Rollout(policy::RolloutCommand::Start { waves, abort_above, canary, .. }) = cli.command else {
            panic!("not a rollout start");
        };
        assert_eq!((waves.as_str(), abort_above, canary), ("25%,100%", 5.0, 1));
    }
}

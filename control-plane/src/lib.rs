//! The timeshard control plane: the fleet CA and enrollment, desired state (series classes,
//! per-selector node configurations, revocations) with generations and an audit log, served as
//! an HTTPS API over SQLite or PostgreSQL; plus its command line. (Its fleet benchmark is
//! `timeshard bench fleet`, in the testkit: no harness lives in this library.)
//!
//! - [`db`]: the sqlx pool (SQLite or PostgreSQL, same SQL), migrations, write transactions.
//! - [`ca`]: the fleet CA (rcgen); its key is stored in the database and used only here.
//! - [`fleet`]: the operations, each one transaction with its audit record.
//! - [`server`]: axum routes over rustls, limits, the TLS accept loop.
//! - [`cli`]: `timeshard-control` subcommands.
//!
//! What is shared with devices (API types, tokens, the agent a node runs) is in
//! `timeshard-control-api`. Node-side enforcement of desired state is the node's business.

pub mod ca;
pub mod cli;
pub mod db;
pub mod error;
pub mod fleet;
pub mod sealed;
pub mod server;
pub mod time;

pub use error::Error;

/// The `timeshard-control` program: parses the command line, logs to standard error
/// (`TIMESHARD_LOG`, default `warn`) and runs the command. Other binaries may call it (the
/// end-to-end tests build it under another name).
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journald keeps plain `key=value` fields.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIMESHARD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

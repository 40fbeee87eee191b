//! The timeshard control plane: the fleet CA and enrollment, desired state (series classes,
//! per-selector node configurations, revocations) with generations and an audit log, served as
//! an HTTPS API over SQLite or PostgreSQL; plus its command line and its fleet benchmark.
//!
//! - [`db`]: the sqlx pool (SQLite or PostgreSQL, same SQL), migrations, write transactions.
//! - [`ca`]: the fleet CA (rcgen); its key is stored in the database and used only here.
//! - [`fleet`]: the operations, each one transaction with its audit record.
//! - [`server`]: axum routes over rustls, limits, the TLS accept loop.
//! - [`cli`]: `timeshard-control` subcommands; [`bench`]: `timeshard-control bench`.
//!
//! What is shared with devices (API types, tokens, the agent a node runs) is in
//! `timeshard-control-api`. Node-side enforcement of desired state is the node's business.

pub mod bench;
pub mod ca;
pub mod cli;
pub mod db;
pub mod error;
pub mod fleet;
pub mod server;
pub mod time;

pub use error::Error;

//! `timeshard pki`: a development CA and the certificates it issues.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use timeshard_node::pki::{self, Role};

#[derive(Debug, Subcommand)]
pub(crate) enum PkiCommand {
    /// Create a development CA (ca.pem, ca.key) in DIR.
    Init {
        /// Directory for the CA.
        dir: PathBuf,
        /// How long the CA is valid (e.g. `5y`, `90d`).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5y")]
        valid_for: std::time::Duration,
    },
    /// Issue a certificate signed by the CA in DIR, as <name>.pem and <name>.key.
    Issue {
        /// Directory holding the CA.
        dir: PathBuf,
        /// Name of the files (and the certificate's common name).
        #[arg(long)]
        name: String,
        /// What the certificate is for.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// How long the certificate is valid (e.g. `365d`, `7d`); nothing renews it.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "365d")]
        valid_for: std::time::Duration,
    },
}

pub(crate) fn run(cmd: PkiCommand) -> Result<()> {
    match cmd {
        PkiCommand::Init { dir, valid_for } => {
            let until = pki::init_valid_for(&dir, valid_for)?;
            println!("created a development CA in {}, valid until {until}", dir.display());
        }
        PkiCommand::Issue { dir, name, role, valid_for } => {
            let (files, until) = pki::issue_valid_for(&dir, &name, role.into(), valid_for)?;
            println!("issued {} and {}, valid until {until}", files.cert.display(), files.key.display());
        }
    }
    Ok(())
}

/// What a certificate is for (`timeshard_node::pki::Role` on the command line).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum RoleArg {
    /// A node: serves peers and clients, and is a client of its peers.
    Node,
    /// A client: may write and read, never act as a peer.
    Client,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Role {
        match role {
            RoleArg::Node => Role::Node,
            RoleArg::Client => Role::Client,
        }
    }
}

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
    },
}

pub(crate) fn run(cmd: PkiCommand) -> Result<()> {
    match cmd {
        PkiCommand::Init { dir } => {
            pki::init(&dir)?;
            println!("created a development CA in {}", dir.display());
        }
        PkiCommand::Issue { dir, name, role } => {
            let files = pki::issue(&dir, &name, role.into())?;
            println!("issued {} and {}", files.cert.display(), files.key.display());
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

//! `timeshard pki`: a development CA and the certificates it issues.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
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
        role: Role,
    },
}

pub(crate) fn run(cmd: PkiCommand) -> Result<()> {
    match cmd {
        PkiCommand::Init { dir } => {
            pki::init(&dir)?;
            println!("created a development CA in {}", dir.display());
        }
        PkiCommand::Issue { dir, name, role } => {
            let files = pki::issue(&dir, &name, role)?;
            println!("issued {} and {}", files.cert.display(), files.key.display());
        }
    }
    Ok(())
}

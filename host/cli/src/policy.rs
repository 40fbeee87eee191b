//! `timeshard policy`: signing keys and signatures for policy modules.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Create an ed25519 signing key; prints the public key line for the nodes' trusted_keys.
    Keygen {
        /// Where to write the secret key (created with mode 0600; never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a policy component; writes MODULE.sig next to it.
    Sign {
        /// The secret key file from `timeshard policy keygen`.
        #[arg(long)]
        key: PathBuf,
        /// The component (.wasm) to sign.
        module: PathBuf,
    },
}

pub(crate) fn run(cmd: PolicyCommand) -> Result<()> {
    use timeshard_policy::signing;
    match cmd {
        PolicyCommand::Keygen { out } => {
            if out.exists() {
                bail!("{} exists; a signing key is never overwritten", out.display());
            }
            let key = signing::generate_keypair()?;
            key.write(&out)?;
            println!("wrote the secret key to {}; keep it off the nodes", out.display());
            println!("add this line to trusted_keys in the nodes' [policy] section:");
            println!("{}", key.public().to_text());
        }
        PolicyCommand::Sign { key, module } => {
            let sig = signing::sign_file(&key, &module)?;
            println!("signed {} -> {}", module.display(), sig.display());
        }
    }
    Ok(())
}

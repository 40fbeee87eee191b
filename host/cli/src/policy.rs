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
    /// Sign a policy component as one name, version and kind; writes MODULE.wasm.sig next to it.
    ///
    /// The signature covers the module's hash and what it is installed as: nodes refuse it
    /// under another name, version or kind. Example:
    ///   timeshard policy sign --key policy.key --name pmu-validate --version 1.3.0 --kind ingest pmu_validate.wasm
    Sign {
        /// The secret key file from `timeshard policy keygen`.
        #[arg(long)]
        key: PathBuf,
        /// The policy's name, as nodes install it (`[[policy.modules]] name`).
        #[arg(long)]
        name: String,
        /// The exact version (`[[policy.modules]] version`).
        #[arg(long)]
        version: String,
        /// ingest or query.
        #[arg(long)]
        kind: timeshard_policy::Kind,
        /// Revoke the versions of this name below this one (a semantic version, at most
        /// --version): nodes that install this module refuse them from then on, even signed.
        #[arg(long, value_name = "VERSION")]
        min_version: Option<String>,
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
        PolicyCommand::Sign { key, name, version, kind, min_version, module } => {
            let identity = signing::Identity::new(timeshard_policy::PolicyRef::new(&name, &version)?, kind);
            let sig = signing::sign_file(&key, &module, &identity, min_version.as_deref())?;
            println!("signed {} as {identity} -> {}", module.display(), sig.display());
            if let Some(min) = min_version {
                println!("nodes that install it refuse {name} below {min} from then on");
            }
        }
    }
    Ok(())
}

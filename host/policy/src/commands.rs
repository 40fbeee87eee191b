//! The operator's signing commands, shared by `timeshard policy` and `timeshard-control policy`:
//! make a signing key, sign a module. Both run on an operator's machine and talk to nothing;
//! with the control plane signing offline (`serve --policy-public-key`), they are the only
//! place a policy signature is made.

use std::path::PathBuf;

use crate::signing::{self, SigningError};
use crate::{Kind, PolicyError, PolicyRef};

/// `keygen` and `sign`.
#[derive(Debug, clap::Subcommand)]
pub enum SigningCommand {
    /// Create an ed25519 signing key. Prints its public key line (for the nodes' trusted_keys,
    /// or `timeshard-control serve --policy-public-key`) alone on standard output.
    Keygen {
        /// Where to write the secret key (created with mode 0600; never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a policy component as one name, version and kind; writes MODULE.wasm.sig next to it.
    ///
    /// The signature covers the module's hash and what it is installed as: nodes refuse it
    /// under another name, version or kind. Example:
    ///   policy sign --key policy.key --name pmu-validate --version 1.3.0 --kind ingest pmu_validate.wasm
    Sign {
        /// The secret key file from `policy keygen`.
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
        kind: Kind,
        /// Revoke the versions of this name below this one (a semantic version, at most
        /// --version): nodes that install this module refuse them from then on, even signed.
        #[arg(long, value_name = "VERSION")]
        min_version: Option<String>,
        /// The component (.wasm) to sign.
        module: PathBuf,
    },
}

/// A signing command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0} exists; a signing key is never overwritten")]
    KeyExists(PathBuf),
    #[error(transparent)]
    Signing(#[from] SigningError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// Runs `cmd`: what it made goes to standard output, what to do with it to standard error.
pub fn run(cmd: SigningCommand) -> Result<(), CommandError> {
    match cmd {
        SigningCommand::Keygen { out } => {
            if out.exists() {
                return Err(CommandError::KeyExists(out));
            }
            let key = signing::generate_keypair()?;
            key.write(&out)?;
            eprintln!(
                "wrote the secret key to {}; keep it off the nodes and the control plane. Its public key line \
                 (below) goes into the nodes' [policy] trusted_keys, or to `timeshard-control serve \
                 --policy-public-key FILE`:",
                out.display()
            );
            println!("{}", key.public().to_text());
        }
        SigningCommand::Sign { key, name, version, kind, min_version, module } => {
            let identity = signing::Identity::new(PolicyRef::new(&name, &version)?, kind);
            let sig = signing::sign_file(&key, &module, &identity, min_version.as_deref())?;
            println!("signed {} as {identity} -> {}", module.display(), sig.display());
            if let Some(min) = min_version {
                println!("nodes that install it refuse {name} below {min} from then on");
            }
        }
    }
    Ok(())
}

//! `timeshard policy`: signing keys and signatures for policy modules (the commands live in
//! `timeshard-policy`, shared with `timeshard-control policy`).

pub(crate) use timeshard_policy::commands::SigningCommand as PolicyCommand;

pub(crate) fn run(cmd: PolicyCommand) -> anyhow::Result<()> {
    Ok(timeshard_policy::commands::run(cmd)?)
}

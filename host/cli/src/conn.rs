//! Which node a client command talks to, and with which certificate.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use timeshard_sdk::Client;
use timeshard_sdk::tls::TlsFiles;

/// Which node to talk to, and with which certificate.
#[derive(Debug, Args)]
pub(crate) struct ConnArgs {
    /// Address of any node of the cluster.
    #[arg(long, env = "TIMESHARD_NODE", default_value = "127.0.0.1:7400")]
    node: SocketAddr,
    /// Directory with ca.pem and the client certificate (as `timeshard pki` writes it).
    #[arg(long, env = "TIMESHARD_PKI", default_value = "timeshard-pki")]
    pki: PathBuf,
    /// Name of the client certificate in the PKI directory (<name>.pem, <name>.key).
    #[arg(long, default_value = "client")]
    cert_name: String,
}

impl ConnArgs {
    pub(crate) async fn connect(&self) -> Result<Client> {
        let tls = TlsFiles::in_dir(&self.pki, &self.cert_name);
        Client::connect(self.node, &tls).await.with_context(|| format!("cannot reach the node at {}", self.node))
    }
}

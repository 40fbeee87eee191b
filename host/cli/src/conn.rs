//! Which node a client command talks to, and with which certificate.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use timeshard_proto::geo::GeoPoint;
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

/// `--location LAT,LON`: where the client is, for context-of-interest classes.
#[derive(Debug, Args)]
pub(crate) struct LocationArg {
    /// Where this client is, LAT,LON in degrees (e.g. 33.75,-84.39): within a series' coi_size
    /// it reads by quorum over the in-CoI replicas, farther away from the fastest replica.
    /// Without it the node's own location decides.
    #[arg(long, value_name = "LAT,LON", allow_hyphen_values = true, value_parser = parse_location)]
    location: Option<GeoPoint>,
}

fn parse_location(s: &str) -> Result<GeoPoint, String> {
    s.parse::<GeoPoint>().map_err(|e| e.to_string())
}

impl LocationArg {
    /// `client`, declaring the location if one was given.
    pub(crate) fn apply(&self, client: Client) -> Result<Client> {
        match self.location {
            Some(at) => Ok(client.with_location(at.lat, at.lon)?),
            None => Ok(client),
        }
    }
}

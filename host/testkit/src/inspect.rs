//! Looking at replicas one by one, as a peer does: what points one node holds of a block, and
//! whether it holds a series' registration. Tests use it to check that the owners of every
//! block converge, beyond what a coordinated read (which merges replicas) can show.
//!
//! The inspector holds a node certificate of its own (`inspector` in the cluster's PKI), since
//! replica requests are for nodes only. It serves nothing: nodes that try to call it back fail
//! and forget it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use quinn::{Connection, Endpoint};
use timeshard_node::pki::{self, Role};
use timeshard_proto::repair::ListedBlock;
use timeshard_proto::wire::{Limits, Request, Response};
use timeshard_proto::{Point, Quantum, SeriesKey};
use timeshard_sdk::tls::{self, Identity, NODE_NAME, TlsFiles};
use timeshard_sdk::transport;

use crate::cluster::LocalCluster;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A peer-certificate client of a cluster's nodes.
#[derive(Debug)]
pub struct Inspector {
    endpoint: Endpoint,
    conns: HashMap<SocketAddr, Connection>,
    limits: Limits,
    /// The node's own certificate, per address of a node of the cluster.
    as_itself: HashMap<SocketAddr, quinn::ClientConfig>,
}

impl Inspector {
    /// An inspector of `cluster`: it asks each node as that node itself (its own
    /// certificate), since a node lists its blocks in full only to itself; other addresses
    /// with a node certificate of its CA (`inspector`).
    pub async fn new(cluster: &LocalCluster) -> Result<Inspector> {
        let dir = cluster.pki_dir();
        let files = if dir.join("inspector.pem").exists() {
            TlsFiles::in_dir(&dir, "inspector")
        } else {
            pki::issue(&dir, "inspector", Role::Node)?
        };
        let mut inspector = Inspector::with_identity(&files)?;
        for i in 0..cluster.len() {
            let own = Identity::load(&cluster.node_tls(i))?;
            inspector.as_itself.insert(cluster.addr(i), tls::client_config(&own)?);
        }
        Ok(inspector)
    }

    /// An inspector with the node certificate in `files`. For nodes enrolled with a control
    /// plane (which issues node certificates only to enrolled nodes), node `i`'s own
    /// ([`LocalCluster::client_tls_of`]): node `i` answers it as itself, so inspect node `i`
    /// only with it (other nodes would take it for node `i` speaking from another address).
    pub fn with_identity(files: &TlsFiles) -> Result<Inspector> {
        let identity = Identity::load(files)?;
        let mut endpoint = Endpoint::client("127.0.0.1:0".parse().expect("literal"))?;
        endpoint.set_default_client_config(tls::client_config(&identity)?);
        Ok(Inspector { endpoint, conns: HashMap::new(), limits: Limits::default(), as_itself: HashMap::new() })
    }

    async fn call(&mut self, addr: SocketAddr, req: &Request) -> Result<Response> {
        let conn = match self.conns.get(&addr).filter(|c| c.close_reason().is_none()) {
            Some(c) => c.clone(),
            None => {
                let connecting = match self.as_itself.get(&addr) {
                    Some(config) => self.endpoint.connect_with(config.clone(), addr, NODE_NAME)?,
                    None => self.endpoint.connect(addr, NODE_NAME)?,
                };
                let c = tokio::time::timeout(TIMEOUT, connecting)
                    .await
                    .with_context(|| format!("no handshake with {addr}"))??;
                self.conns.insert(addr, c.clone());
                c
            }
        };
        Ok(transport::call(&conn, req, self.limits.max_message_bytes, TIMEOUT).await?)
    }

    /// Every point the node at `addr` holds of `series` in `quantum`.
    pub async fn block(&mut self, addr: SocketAddr, series: &SeriesKey, quantum: Quantum) -> Result<Vec<Point>> {
        let mut points = Vec::new();
        let mut after = None;
        loop {
            let req = Request::Fetch {
                series: series.clone(),
                quantum,
                range: quantum.range(),
                after,
                limit: self.limits.max_page_points,
                in_coi: None,
            };
            match self.call(addr, &req).await? {
                Response::Points { points: page, more, .. } => {
                    after = page.last().map(Point::key).or(after);
                    points.extend(page);
                    if !more {
                        return Ok(points);
                    }
                }
                other => bail!("unexpected answer to a fetch from {addr}: {other:?}"),
            }
        }
    }

    /// Every block the node at `addr` holds, with its point count and digest.
    pub async fn blocks(&mut self, addr: SocketAddr) -> Result<Vec<ListedBlock>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            match self.call(addr, &Request::ListBlocks { after, limit: 10_000 }).await? {
                Response::BlockList { blocks, next } => {
                    out.extend(blocks);
                    match next {
                        Some(n) => after = Some(n),
                        None => return Ok(out),
                    }
                }
                other => bail!("unexpected answer to list_blocks from {addr}: {other:?}"),
            }
        }
    }

    /// Whether the node at `addr` holds the registration of `series`.
    pub async fn has_series(&mut self, addr: SocketAddr, series: &SeriesKey) -> Result<bool> {
        match self.call(addr, &Request::HasSeries { series: series.clone() }).await? {
            Response::SeriesKnown { known } => Ok(known),
            other => bail!("unexpected answer to has_series from {addr}: {other:?}"),
        }
    }

    /// Closes every connection.
    pub async fn close(self) {
        self.endpoint.close(0u32.into(), b"bye");
        self.endpoint.wait_idle().await;
    }
}

//! What a node runs on that a simulator replaces: the UDP socket under its QUIC endpoint, the
//! disk under its store and the object store under its archive. A node started the ordinary
//! way ([`Seams::default`]) binds a real socket on `listen`, opens its store in
//! `<data_dir>/store` and its archive at `[tier] url`; the rest of the node does not know the
//! difference. Its control plane's seam is in the agent it is started with. Time, randomness and blocking work are `timeshard_clock`'s seams.

use std::sync::Arc;

use quinn::{AsyncUdpSocket, Endpoint, EndpointConfig, TokioRuntime};
use timeshard_sdk::tls::Identity;
use timeshard_store::backend::Backend;
use timeshard_tier::object_store::ObjectStore;

use crate::config::NodeConfig;
use crate::net::{BindError, server_config};

/// The replaceable ground a node stands on; all `None` is the real one.
#[derive(Clone, Default)]
pub struct Seams {
    /// The socket the QUIC endpoint sends and receives on, instead of binding `listen`.
    pub socket: Option<Arc<dyn AsyncUdpSocket>>,
    /// The endpoint's settings with the socket (a simulator seeds its generator, so
    /// connection ids and packet numbers replay).
    pub endpoint: Option<EndpointConfig>,
    /// The disk the store's engine runs on, instead of `<data_dir>/store`.
    pub disk: Option<Arc<dyn Backend>>,
    /// The object store the archive is on, instead of the one `[tier] url` names (which must
    /// still be set: it says the node has an archive).
    pub archive: Option<Arc<dyn ObjectStore>>,
}

impl std::fmt::Debug for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seams")
            .field("socket", &self.socket.as_ref().map(|s| s.local_addr().ok()))
            .field("disk", &self.disk.is_some())
            .field("archive", &self.archive.is_some())
            .finish()
    }
}

impl Seams {
    /// The QUIC endpoint on the replacement socket, serving with `identity`; `None` when the
    /// node binds a real one.
    pub fn endpoint(&self, cfg: &NodeConfig, identity: &Identity) -> Result<Option<Endpoint>, BindError> {
        let Some(socket) = self.socket.clone() else { return Ok(None) };
        let server = server_config(cfg, identity)?;
        let config = self.endpoint.clone().unwrap_or_default();
        let endpoint = Endpoint::new_with_abstract_socket(config, Some(server), socket, Arc::new(TokioRuntime))
            .map_err(|source| BindError::Listen { addr: cfg.listen, source })?;
        Ok(Some(endpoint))
    }
}

//! The configuration in force while the node runs, shared by the node and the tasks that read
//! settings which may change under them (the bootstrap peers, say).

use std::sync::{Arc, RwLock};

use super::NodeConfig;

/// The configuration in force: replaced whole by a reconfiguration, so a reader takes one
/// snapshot ([`Live::get`]) and uses it throughout. Clones share it.
#[derive(Clone, Debug)]
pub struct Live(Arc<RwLock<Arc<NodeConfig>>>);

impl Live {
    pub fn new(config: NodeConfig) -> Live {
        Live(Arc::new(RwLock::new(Arc::new(config))))
    }

    /// The configuration in force now.
    pub fn get(&self) -> Arc<NodeConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `config` in force for every holder.
    pub fn set(&self, config: NodeConfig) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }
}

//! Helpers shared by the end-to-end tests in `tests/`.

use std::path::PathBuf;
use std::time::Duration;

use timeshard_node::config::DhtConfig;
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

/// Options for a test cluster of `nodes` processes of `binary` in a fresh temporary directory.
/// Timeouts are shortened so failures are detected within seconds.
pub fn cluster_options(nodes: usize, binary: &str) -> (ClusterOptions, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("timeshard-e2e-").tempdir().expect("temp dir");
    let mut options = ClusterOptions::new(nodes, dir.path(), PathBuf::from(binary));
    options.dht = DhtConfig {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(3),
        ..DhtConfig::default()
    };
    (options, dir)
}

/// Starts the cluster and waits until every node knows the others.
pub async fn start(options: ClusterOptions) -> anyhow::Result<LocalCluster> {
    let cluster = LocalCluster::start(options).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    Ok(cluster)
}

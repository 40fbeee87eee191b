//! The floor under a benchmark's figures, measured in the same run (BENCHMARKS.md): an fsync of
//! a small append in the benchmark's data directory, and a QUIC request/response round trip on
//! loopback with timeshard's mutual TLS. Durable latencies are read against it, because
//! machines of one kind differ severalfold in fsync time.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use timeshard_node::RunningNode;
use timeshard_node::config::{NodeConfig, StoreEngine, TlsConfig};
use timeshard_sdk::Client;
use timeshard_sdk::tls::TlsFiles;

use crate::stats::{Latencies, round3};

/// Appends timed for the fsync floor.
pub const FSYNC_SAMPLES: usize = 300;
/// Requests timed for the round-trip floor.
pub const RTT_SAMPLES: usize = 300;
/// Untimed requests first, so the connection and the node's caches are warm.
const RTT_WARMUP: usize = 10;
/// Bytes per append: about one small log record.
const APPEND_BYTES: usize = 64;

/// The `floor` object of every benchmark document.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    pub fsync_p50_ms: f64,
    pub fsync_p99_ms: f64,
    pub quic_rtt_p50_ms: f64,
    pub quic_rtt_p99_ms: f64,
    /// How the figures were taken (extra keys).
    pub fsync_samples: usize,
    pub fsync_append_bytes: usize,
    pub quic_rtt_samples: usize,
    pub quic_rtt_request: &'static str,
}

impl Floor {
    /// Measures the fsync floor in `dir` and the round-trip floor with `client`, which is
    /// connected to a node on loopback.
    pub async fn measure(dir: &Path, client: &Client) -> Result<Floor> {
        let fsync = fsync_in(dir).await?;
        let rtt = round_trips(client, RTT_SAMPLES).await.context("timing QUIC round trips")?;
        Ok(Floor::from_samples(&fsync, &rtt))
    }

    /// [`Floor::measure`] for a benchmark without a cluster: the round trips go to a node
    /// started in this process for the purpose (development PKI in a temporary directory,
    /// memory store), over the same QUIC and TLS stack as every node.
    pub async fn measure_with_own_node(dir: &Path) -> Result<Floor> {
        let fsync = fsync_in(dir).await?;
        let scratch = tempfile::Builder::new().prefix("timeshard-floor-").tempdir()?;
        let pki = timeshard_node::pki::dev_pki(&scratch.path().join("pki"), 1)?;
        let files = TlsFiles::in_dir(&pki, "node-0");
        let mut config =
            NodeConfig { listen: "127.0.0.1:0".parse().expect("literal address"), ..NodeConfig::default() };
        config.tls = TlsConfig { ca: files.ca, cert: files.cert, key: files.key };
        config.store.engine = StoreEngine::Memory;
        config.http.listen = "127.0.0.1:0".parse().expect("literal address");
        config.resolve_paths(scratch.path());
        let node = RunningNode::start(config).await.context("starting a node for the round-trip floor")?;
        let rtt = match Client::connect(node.addr(), &TlsFiles::in_dir(&pki, "client")).await {
            Ok(client) => {
                let rtt = round_trips(&client, RTT_SAMPLES).await;
                client.close().await;
                rtt
            }
            Err(e) => Err(e),
        };
        node.shutdown().await;
        Ok(Floor::from_samples(&fsync, &rtt.context("timing QUIC round trips")?))
    }

    fn from_samples(fsync: &Latencies, rtt: &Latencies) -> Floor {
        Floor {
            fsync_p50_ms: round3(fsync.percentile_ms(50.0)),
            fsync_p99_ms: round3(fsync.percentile_ms(99.0)),
            quic_rtt_p50_ms: round3(rtt.percentile_ms(50.0)),
            quic_rtt_p99_ms: round3(rtt.percentile_ms(99.0)),
            fsync_samples: fsync.len(),
            fsync_append_bytes: APPEND_BYTES,
            quic_rtt_samples: rtt.len(),
            quic_rtt_request: "status",
        }
    }

    /// One line for the human summary.
    pub fn summary(&self) -> String {
        format!(
            "floor: fsync of a {}-byte append p50 {:.3} ms, p99 {:.3} ms; QUIC round trip on loopback p50 {:.3} ms, \
             p99 {:.3} ms",
            self.fsync_append_bytes, self.fsync_p50_ms, self.fsync_p99_ms, self.quic_rtt_p50_ms, self.quic_rtt_p99_ms
        )
    }
}

async fn fsync_in(dir: &Path) -> Result<Latencies> {
    let dir = dir.to_path_buf();
    let fsync = tokio::task::spawn_blocking(move || {
        fsync_latencies(&dir, FSYNC_SAMPLES).with_context(|| format!("timing fsync in {}", dir.display()))
    });
    fsync.await?
}

/// Latencies of `samples` appends of 64 bytes to a new file in `dir`, each followed by
/// `fdatasync`, as the store's write-ahead log commits. The file is removed afterwards.
pub fn fsync_latencies(dir: &Path, samples: usize) -> std::io::Result<Latencies> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("floor-fsync-{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
    let record = [0x5a_u8; APPEND_BYTES];
    let mut lat = Latencies::default();
    let mut timed = || -> std::io::Result<()> {
        for _ in 0..samples {
            let t = Instant::now();
            file.write_all(&record)?;
            file.sync_data()?;
            lat.push(t.elapsed());
        }
        Ok(())
    };
    let result = timed();
    let _ = std::fs::remove_file(&path);
    result.map(|()| lat)
}

/// Latencies of `samples` status requests from `client`, each a request and its response on a
/// new QUIC stream of an open connection.
pub async fn round_trips(client: &Client, samples: usize) -> Result<Latencies, timeshard_sdk::Error> {
    for _ in 0..RTT_WARMUP {
        client.status().await?;
    }
    let mut lat = Latencies::default();
    for _ in 0..samples {
        let t = Instant::now();
        client.status().await?;
        lat.push(t.elapsed());
    }
    Ok(lat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_is_timed_per_append_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let lat = fsync_latencies(dir.path(), 5).unwrap();
        assert_eq!(lat.len(), 5);
        assert!(lat.percentile_ms(99.0) > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_floor_has_the_documented_keys() {
        let dir = tempfile::tempdir().unwrap();
        let floor = Floor::measure_with_own_node(dir.path()).await.unwrap();
        let json = serde_json::to_value(&floor).unwrap();
        for key in ["fsync_p50_ms", "fsync_p99_ms", "quic_rtt_p50_ms", "quic_rtt_p99_ms"] {
            assert!(json[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {json}");
        }
        // A round trip through QUIC and TLS takes microseconds at least (fsync on tmpfs may not).
        assert!(floor.quic_rtt_p50_ms > 0.0, "{json}");
        assert!(floor.fsync_p50_ms <= floor.fsync_p99_ms && floor.quic_rtt_p50_ms <= floor.quic_rtt_p99_ms);
        assert_eq!((floor.fsync_samples, floor.quic_rtt_samples), (FSYNC_SAMPLES, RTT_SAMPLES));
    }
}

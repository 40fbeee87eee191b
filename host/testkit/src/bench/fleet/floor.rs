//! What the machine allows at best: an fsync in the data directory's file system, and a
//! loopback HTTPS call on a fresh connection (TCP and TLS handshakes included, as every agent
//! call makes one).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use timeshard_control_api::http::{CALL_TIMEOUT, Endpoint};
use timeshard_control_api::token::{Token, TokenKind};

use super::percentile_ms;
use crate::control::process::{ServeProcess, Storage};

const SAMPLES: usize = 200;

/// Measures both floors.
pub async fn measure(exe: &Path, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let mut fsync = fsync_ms(dir)?;
    let mut https = https_ms(exe, dir).await?;
    Ok(json!({
        "fsync_p50_ms": percentile_ms(&mut fsync, 50.0),
        "fsync_p99_ms": percentile_ms(&mut fsync, 99.0),
        "https_rtt_p50_ms": percentile_ms(&mut https, 50.0),
        "https_rtt_p99_ms": percentile_ms(&mut https, 99.0),
    }))
}

fn fsync_ms(dir: &Path) -> anyhow::Result<Vec<f64>> {
    let mut f = tempfile::tempfile_in(dir)?;
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        f.write_all(&block)?;
        let start = Instant::now();
        f.sync_data()?;
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(samples)
}

async fn https_ms(exe: &Path, dir: &Path) -> anyhow::Result<Vec<f64>> {
    let storage = Storage::Sqlite(dir.join("floor"));
    let mut service = ServeProcess::start(exe, &storage, true, &[]).await?;
    let token = Token::parse(service.admin_token.as_deref().unwrap_or_default(), TokenKind::Api)?;
    let endpoint = Endpoint::new(&service.url, timeshard_control_api::tls::pinned_config(token.fleet)?)?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        endpoint
            .call(http::Method::GET, timeshard_control_api::api::paths::HEALTH, None, None, CALL_TIMEOUT)
            .await?
            .check()?;
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    service.stop().await?;
    Ok(samples)
}

//! Hostile clients of the control plane: anyone who can reach its port may start enrollments
//! whose bodies never finish; they hold neither the operators' and nodes' request slots nor,
//! past the body timeout, their connections.

use std::time::{Duration, Instant};

use anyhow::Context;
use rustls::pki_types::ServerName;
use timeshard_control_api::api::paths;
use timeshard_control_api::tls::{CONTROL_NAME, pinned_config};
use timeshard_control_api::token::{Token, TokenKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::TestFleet;

/// An enrollment that sends its headers, then its body one byte every `pace`, until the
/// control plane closes the connection; returns how long that took and the answer's first line.
async fn slow_enrollment(fleet_url: String, token: String, pace: Duration) -> anyhow::Result<(Duration, String)> {
    let started = Instant::now();
    let pin = Token::parse(&token, TokenKind::Api)?.fleet;
    let addr = fleet_url.trim_start_matches("https://").trim_end_matches('/').to_string();
    let tcp = TcpStream::connect(&addr).await?;
    let connector = tokio_rustls::TlsConnector::from(pinned_config(pin)?);
    let tls = connector.connect(ServerName::try_from(CONTROL_NAME)?, tcp).await.context("TLS")?;
    let (mut rd, mut wr) = tokio::io::split(tls);
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {CONTROL_NAME}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{",
        paths::ENROLL
    );
    wr.write_all(head.as_bytes()).await?;
    wr.flush().await?;
    let writer = tokio::spawn(async move {
        for _ in 1..1000 {
            tokio::time::sleep(pace).await;
            if wr.write_all(b" ").await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
    writer.abort();
    anyhow::ensure!(read.is_ok(), "a slow enrollment was still open after 60 s");
    let text = String::from_utf8_lossy(&answer);
    Ok((started.elapsed(), text.lines().next().unwrap_or_default().to_string()))
}

/// 200 enrollments whose bodies trickle in, against 8 request slots: operators revoke a device
/// and list devices, and a real device enrolls, all promptly; the slow ones get 408 after the
/// body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_enrollment_bodies_do_not_starve_operators() {
    const SLOW: usize = 200;
    let timeout = Duration::from_secs(4);
    let fleet =
        TestFleet::sqlite_with(&["--max-requests", "8", "--max-open-requests", "4", "--body-timeout", "4s"]).await;
    let victim = fleet.enroll(0, "victim", "site=atl").await;

    let slow: Vec<_> = (0..SLOW)
        .map(|_| {
            tokio::spawn(slow_enrollment(
                fleet.url(0).to_string(),
                fleet.admin_token.clone(),
                Duration::from_millis(200),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // An operator's calls and a device's enrollment meanwhile.
    let started = Instant::now();
    let (ok, out, err) = fleet.cli(&["device", "revoke", victim.node_id(), "--reason", "stolen"]).await;
    assert!(ok, "device revoke during the attack: {out}{err}");
    let revoke = started.elapsed();
    let devices: Vec<serde_json::Value> = fleet.admin.get(paths::DEVICES).await.unwrap();
    assert!(devices.iter().any(|d| d["node_id"] == victim.node_id() && !d["revoked_at_ms"].is_null()), "{devices:?}");
    let started = Instant::now();
    let newcomer = fleet.enroll(0, "newcomer", "site=bos").await;
    let enroll = started.elapsed();
    assert!(!newcomer.node_id().is_empty());
    assert!(revoke < Duration::from_secs(4), "device revoke took {revoke:?} during the attack");
    assert!(enroll < Duration::from_secs(4), "an enrollment took {enroll:?} during the attack");

    let mut latest = Duration::ZERO;
    for task in slow {
        let (after, status) = task.await.unwrap().unwrap();
        assert!(status.contains(" 408 "), "a slow enrollment got {status:?}");
        assert!(after >= timeout - Duration::from_millis(100), "closed after {after:?}, before the timeout");
        latest = latest.max(after);
    }
    assert!(latest < timeout * 3, "a slow enrollment was closed only after {latest:?}");
    println!(
        "{SLOW} slow enrollments against 8 slots: device revoke took {revoke:?} (CLI process included), an \
         enrollment {enroll:?}; the slow ones got 408, the last after {latest:?}"
    );
}

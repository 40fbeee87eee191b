//! HTTP tokens issued by the control plane, on enrolled node processes: a token reaches the
//! nodes its selector picks within the propagation bound and is accepted there (and only there);
//! a node with any token refuses requests without one; revoking it reaches them the same way;
//! a node restarted while the control plane is down keeps enforcing what it applied last.

use std::time::{Duration, Instant};

use timeshard_proto::{SeriesKey, TimeRange};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::fleet::{Backend, ControlPlane};
use timeshard_testkit::http_client::HttpClient;

use crate::{CONTROL, NODE};

/// The control plane's propagation bound plus applying it (README), as in tests/fleet.rs.
const CHANGE_BOUND: Duration = Duration::from_secs(10);

/// The HTTP status of a one-line write through node `i` with `token` (none: no header).
async fn write_status(cluster: &LocalCluster, i: usize, token: Option<&str>, line: &str) -> anyhow::Result<u16> {
    let mut c = HttpClient::connect(cluster.http_addr(i).expect("HTTP is on"), token).await?;
    Ok(c.post("/write?db=fleet&precision=s", line.to_string()).await?.status.as_u16())
}

/// Waits until node `i` answers a write with `token` with `status`; returns how long it took.
async fn until_status(
    cluster: &LocalCluster,
    i: usize,
    token: Option<&str>,
    status: u16,
    what: &str,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let line = format!("probe,site=e2e value=1 {}", 1_700_000_000 + start.elapsed().as_millis() as i64 % 1000);
        if write_status(cluster, i, token, &line).await? == status {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(start.elapsed() < CHANGE_BOUND, "{what}: not within {CHANGE_BOUND:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create(control: &ControlPlane, args: &[&str]) -> anyhow::Result<(String, String)> {
    let mut all = vec!["http-token", "create"];
    all.extend_from_slice(args);
    let token = control.cli(&all).await?.trim().to_string();
    anyhow::ensure!(token.starts_with("tsh1."), "not an HTTP token: {token}");
    let id = token.split('.').nth(2).unwrap_or_default().to_string();
    Ok((token, id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_plane_issues_and_revokes_http_tokens() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("timeshard-http-tokens-").tempdir()?;
    let mut control = ControlPlane::start(CONTROL, Backend::Sqlite, dir.path()).await?;
    // W + R > RF: every acknowledged write is read back through either node.
    control.cli(&["class", "set", "all", "--prefix", "", "--rf", "2", "--w", "2", "--r", "1"]).await?;
    let (mut options, _) = ClusterOptions::for_tests(2, NODE);
    options.dir = dir.path().join("nodes");
    // Anonymous on loopback (no token of its own): it takes requests without one until the
    // control plane issues one.
    options.http.tokens.clear();
    options.http.anonymous = true;
    let labels = ["site=atl".to_string(), "site=sfo".to_string()];
    let mut cluster = control.enroll_cluster_labelled(options, &labels).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;

    // Loopback and no token anywhere yet: both nodes take writes without one.
    assert_eq!(write_status(&cluster, 0, None, "m,site=e2e value=1 1700000000").await?, 204);
    assert_eq!(write_status(&cluster, 1, None, "m,site=e2e value=2 1700000001").await?, 204);

    // A token for Atlanta's nodes only.
    let (atl, atl_id) = create(&control, &["--name", "grafana-atl", "--select", "site=atl"]).await?;
    // Until node 0 applies it, it takes writes without a token: wait for the refusal.
    let took = until_status(&cluster, 0, None, 401, "node 0 requires a token once one is issued to it").await?;
    println!("an issued HTTP token is enforced after {took:?}");
    assert_eq!(write_status(&cluster, 0, Some(&atl), "m,site=e2e value=3 1700000002").await?, 204);
    assert_eq!(write_status(&cluster, 0, Some("tsh1.bogus"), "m,site=e2e value=30 1700000002").await?, 401);
    // Not selected: node 1 neither needs nor knows it.
    assert_eq!(write_status(&cluster, 1, None, "m,site=e2e value=4 1700000003").await?, 204);

    // A fleet-wide token: node 1 now requires one, and refuses Atlanta's.
    let (all, _) = create(&control, &["--name", "telegraf", "--expires", "1h"]).await?;
    until_status(&cluster, 1, None, 401, "node 1 requires a token once one is issued to it").await?;
    assert_eq!(write_status(&cluster, 1, Some(&all), "m,site=e2e value=5 1700000004").await?, 204);
    assert_eq!(write_status(&cluster, 1, Some(&atl), "m,site=e2e value=6 1700000005").await?, 401);
    assert_eq!(write_status(&cluster, 0, Some(&all), "m,site=e2e value=7 1700000006").await?, 204);
    let listed = control.cli(&["http-token", "list"]).await?;
    assert!(listed.contains("grafana-atl") && listed.contains("site=atl") && listed.contains("telegraf"), "{listed}");
    assert!(!listed.contains(atl.split('.').nth(3).unwrap()), "a secret is never listed: {listed}");

    // Revoked: node 0 refuses it within the bound; the other token still works.
    control.cli(&["http-token", "revoke", &atl_id]).await?;
    until_status(&cluster, 0, Some(&atl), 401, "node 0 refuses the revoked token").await?;
    assert_eq!(write_status(&cluster, 0, Some(&all), "m,site=e2e value=8 1700000007").await?, 204);
    let again = control.cli(&["http-token", "revoke", &atl_id]).await.unwrap_err().to_string();
    assert!(again.contains("unrevoked HTTP token"), "{again}");

    // The control plane goes away and node 0 is killed and restarted: it starts from the
    // state it applied last, so it still requires a token and accepts the fleet-wide one.
    control.stop().await?;
    cluster.kill(0).await?;
    cluster.restart(0).await?;
    cluster.wait_converged(Duration::from_secs(60)).await?;
    assert_eq!(write_status(&cluster, 0, None, "m,site=e2e value=9 1700000008").await?, 401);
    assert_eq!(write_status(&cluster, 0, Some(&atl), "m,site=e2e value=9 1700000008").await?, 401);
    assert_eq!(write_status(&cluster, 0, Some(&all), "m,site=e2e value=9 1700000008").await?, 204);

    // Every accepted write is stored; the refused ones are not.
    let client = cluster.client(1).await?;
    // A field named `value` is the measurement itself (README, line protocol).
    let series: SeriesKey = "m{site=e2e}".parse()?;
    let range = TimeRange::new(1_700_000_000_000_000_000, 1_700_000_010_000_000_000)?;
    let values: Vec<f64> = client.read(&series, range).await?.iter().map(|p| p.value).collect();
    assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 8.0, 9.0]);
    client.close().await;
    cluster.shutdown().await?;
    Ok(())
}

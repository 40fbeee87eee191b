//! The control plane suite on SQLite: one `serve` process with its data directory.

use super::{TestFleet, locations, policies, scenarios};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_and_propagation() {
    scenarios::enrollment_and_propagation(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_node_catches_up() {
    scenarios::offline_node_catches_up(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_misuse() {
    scenarios::token_misuse(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation() {
    scenarios::revocation(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal() {
    scenarios::renewal(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input() {
    scenarios::bad_input(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_configs_and_audit() {
    scenarios::node_configs_and_audit(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_state() {
    scenarios::restart_keeps_state(&mut TestFleet::sqlite().await).await;
}

/// SQLite has one writer: a second `serve` on the same data directory refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_serve_per_data_directory() {
    let fleet = TestFleet::sqlite().await;
    let out = tokio::process::Command::new(super::EXE)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(fleet.work.path().join("control-data"))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another `timeshard-control serve`") && err.contains("--database postgres"), "{err}");
    // The first one still serves.
    assert_eq!(fleet.fleet_info().await.generation, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_uploads() {
    policies::uploads(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_rollouts() {
    policies::rollouts(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tokens() {
    scenarios::http_tokens(&TestFleet::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coi_and_locations() {
    locations::coi_and_locations(&TestFleet::sqlite().await).await;
}

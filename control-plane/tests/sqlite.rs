//! The control plane suite on SQLite: one `serve` process with its data directory.

mod common;

use common::{TestFleet, scenarios};

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

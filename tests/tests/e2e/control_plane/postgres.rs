//! The control plane suite on a real PostgreSQL server (a throwaway one, started as the
//! `postgres` user) with two `serve` instances sharing it; fails when PostgreSQL is not installed.

use super::{TestFleet, locations, policies, scenarios};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_and_propagation() {
    scenarios::enrollment_and_propagation(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_node_catches_up() {
    scenarios::offline_node_catches_up(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_misuse() {
    scenarios::token_misuse(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation() {
    scenarios::revocation(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal() {
    scenarios::renewal(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input() {
    scenarios::bad_input(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_configs_and_audit() {
    scenarios::node_configs_and_audit(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_state() {
    scenarios::restart_keeps_state(&mut TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_uploads() {
    policies::uploads(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_rollouts() {
    policies::rollouts(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tokens() {
    scenarios::http_tokens(&TestFleet::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coi_and_locations() {
    locations::coi_and_locations(&TestFleet::postgres().await).await;
}

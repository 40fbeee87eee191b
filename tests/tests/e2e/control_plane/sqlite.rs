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

/// Keys at rest: the database holds the fleet CA's key sealed, so a copy of the database
/// without the key-encryption key cannot sign (the service refuses to start with another
/// key); and the service refuses a data directory or a key file other users may read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_dump_without_the_key_encryption_key_mints_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let mut fleet = TestFleet::sqlite().await;
    let dir = fleet.work.path().join("control-data");
    for s in &mut fleet.services {
        s.stop().await.unwrap();
    }
    let db = std::fs::read(dir.join("control.db")).unwrap();
    let wal = std::fs::read(dir.join("control.db-wal")).unwrap_or_default();
    let text = String::from_utf8_lossy(&db) + String::from_utf8_lossy(&wal);
    assert!(text.contains("sealed-v1:"), "the CA key is stored sealed");
    assert!(!text.contains("PRIVATE KEY"), "no private key in the clear in the database");

    // The database copied elsewhere, without the key file: a new key is made, which opens nothing.
    let dump = fleet.work.path().join("dump");
    std::fs::create_dir(&dump).unwrap();
    std::fs::set_permissions(&dump, std::fs::Permissions::from_mode(0o700)).unwrap();
    for f in ["control.db", "control.db-wal", "control.db-shm"] {
        if dir.join(f).exists() {
            std::fs::copy(dir.join(f), dump.join(f)).unwrap();
        }
    }
    let serve = |data: &std::path::Path| {
        let mut cmd = tokio::process::Command::new(super::EXE);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data).env_remove("TIMESHARD_CONTROL_KEK");
        cmd
    };
    let out = serve(&dump).output().await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not open the stored fleet CA key"), "{err}");

    // Files other users may read are refused.
    let key = dir.join("key-encryption-key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = serve(&dir).output().await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("open to other users") && err.contains("chmod go-rwx"), "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = serve(&dir).output().await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("open to other users"));
}

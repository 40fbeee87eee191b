//! `guest/build.sh` puts the components where the host tests and the benchmark look for them,
//! whatever directory it runs from and whatever the environment says about cargo's target
//! directory. (Up to date, as the other tests need it to be, it builds nothing.)

use std::path::PathBuf;
use std::process::Command;

#[test]
fn build_sh_builds_into_guest_target_from_anywhere() {
    let guest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(guest.join("build.sh"))
        .current_dir(elsewhere.path())
        // A developer's or CI's shared target directory must not send the guests elsewhere.
        .env("CARGO_TARGET_DIR", elsewhere.path().join("target"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "guest/build.sh failed: {stderr}");
    assert!(!elsewhere.path().join("target").exists(), "guest/build.sh built into CARGO_TARGET_DIR: {stderr}");
    timeshard_policy::guest_artifact(&guest, "noop").unwrap();
}

//! The harness's tests in its spawned mode (ADR 0075): the cases of
//! `cases/harness.rs`, each on a `wasmkeep dev --test-routes` process of
//! its own: this build's binary (`WASMKEEP_BIN` overrides it), which
//! `cargo test --workspace` builds beside this test.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use wasmkeep_test::spawned::TestNode;

fn wasmkeep() -> PathBuf {
    if let Some(bin) = std::env::var_os("WASMKEEP_BIN") {
        return bin.into();
    }
    // target/<profile>/deps/harness_spawned-<hash> -> target/<profile>/wasmkeep
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("wasmkeep");
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace (cargo test --workspace --no-run)",
        bin.display()
    );
    bin
}

async fn start() -> TestNode {
    TestNode::start_binary(&wasmkeep()).await.unwrap()
}

include!("cases/harness.rs");

/// A binary that is not there is a clear error.
#[tokio::test]
async fn a_missing_binary_says_so() {
    let err = TestNode::start_binary(std::path::Path::new("/nonexistent/wasmkeep"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/wasmkeep"), "{err}");
}

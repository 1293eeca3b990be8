//! The harness's tests in its in-process mode (ADR 0073): the cases of
//! `cases/harness.rs`, each on a node of its own in this process.

#![allow(clippy::unwrap_used)]

use wasmkeep_test::in_process::TestNode;

async fn start() -> TestNode {
    TestNode::start().await.unwrap()
}

include!("cases/harness.rs");

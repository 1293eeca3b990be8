//! The node against a real S3 server (SeaweedFS, started by wasmkeep-testkit).
//! `WASMKEEP_S3_TESTS=skip` skips it loudly where `weed` is not installed.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, free_port};
use wasmkeep_testkit::{SeaweedFs, s3_tests_skipped};

#[test]
fn counter_survives_restart_and_kill_on_s3() {
    if s3_tests_skipped("counter_survives_restart_and_kill_on_s3") {
        return;
    }
    let s3 = SeaweedFs::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bucket = s3.bucket_url(&format!("node-test-{}", free_port()));
    let env = s3.env();
    let start =
        || Server::start_with_env(dir.path(), &["dev", "--bucket", &bucket], free_port(), &env);
    let count = |server: &Server| {
        server
            .req("GET", "/demo/counter/s3/value")
            .text()
            .trim()
            .parse::<u64>()
            .unwrap()
    };

    let server = start();
    for expected in 1..=20u64 {
        assert_eq!(
            server.req("POST", "/demo/counter/s3/increment").text(),
            expected.to_string()
        );
    }
    assert!(server.stop(), "graceful shutdown exits 0");
    let server = start();
    assert_eq!(
        count(&server),
        20,
        "a restart keeps every acknowledged increment"
    );
    for _ in 0..5 {
        assert_eq!(server.req("POST", "/demo/counter/s3/increment").status, 200);
    }
    server.kill();
    let server = start();
    assert_eq!(
        count(&server),
        25,
        "kill -9 keeps every acknowledged increment"
    );
}

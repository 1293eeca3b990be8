//! The counter written in JavaScript (examples/counter-js, componentize-js)
//! runs on a real node like the Rust one: any language with component
//! tooling can write actors. Building it needs npm and about a minute, so
//! `scripts/build-guests --js` is optional locally; CI builds it and sets
//! WASMKEEP_REQUIRE_JS=1, which makes a missing component a failure.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::path::PathBuf;

use common::{Server, folder_bucket};

fn counter_js() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm/counter-js.wasm");
    if path.exists() {
        return Some(path);
    }
    if std::env::var("WASMKEEP_REQUIRE_JS").as_deref() == Ok("1") {
        panic!(
            "{} is missing: run scripts/build-guests --js",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED: {} is not built (scripts/build-guests --js builds it)",
        path.display()
    );
    None
}

#[test]
fn javascript_counter_counts_durably_across_a_restart() {
    let Some(js) = counter_js() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let class = format!("counterjs={}", js.display());
    let args = ["dev", "--bucket", bucket.as_str(), class.as_str()];

    let server = Server::start(dir.path(), &args);
    for expected in 1..=3 {
        let r = server.req("POST", "/demo/counterjs/alice/increment");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text().trim(), expected.to_string());
    }
    assert!(server.stop(), "graceful stop");

    let server = Server::start(dir.path(), &args);
    let r = server.req("GET", "/demo/counterjs/alice/value");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text().trim(), "3");
}

/// `fetch()` in a JavaScript actor is wasi:http underneath: held to its
/// class's allow-list like any guest (ADR 0066).
#[test]
fn javascript_fetch_reaches_only_what_the_class_allows() {
    let Some(js) = counter_js() else { return };
    let dir = tempfile::tempdir().unwrap();
    let up = upstream::Upstream::start(dir.path());
    let bucket = folder_bucket(dir.path());
    let deploy = |allow: &[&str]| {
        let mut command = std::process::Command::new(common::BIN);
        command
            .args(["deploy", "counterjs", js.to_str().unwrap()])
            .args(["--bucket", &bucket, "--app", "default"])
            .args(["--data-dir", common::data_dir().to_str().unwrap()]);
        for entry in allow {
            command.args(["--allow-outbound", entry]);
        }
        common::ok(&command.output().unwrap());
    };
    deploy(&[]);
    let class = format!("counterjs={}", js.display());
    let server = Server::start(
        dir.path(),
        &[
            "dev",
            "--bucket",
            bucket.as_str(),
            class.as_str(),
            "--heartbeat",
            "250ms",
        ],
    );
    let hello = format!(
        "/demo/counterjs/j/fetch?url=http%3A%2F%2F127.0.0.1%3A{}%2Fhello",
        up.port
    );
    let denied = server.req("GET", &hello);
    assert_eq!(denied.status, 502, "{}", denied.text());
    assert_eq!(up.hits(), 0);

    deploy(&[&format!("127.0.0.1:{}", up.port)]);
    server.wait_until("the allow-list reaches the node", |s| {
        s.req("GET", &hello).status == 200
    });
    assert_eq!(server.req("GET", &hello).text(), upstream::HELLO);
    assert!(up.hits() >= 1);
}

//! `wasmkeep dev --test-routes` (ADR 0073, ADR 0075): each route's answer
//! and refusal over HTTP on a real `wasmkeep dev` process with a memory
//! bucket; the flag is refused off loopback and does not exist on
//! `serve`; without it the routes answer 404.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Resp, Server, request};

fn test_node(dir: &std::path::Path) -> Server {
    Server::start(
        dir,
        &[
            "dev",
            "--test-routes",
            "--bucket",
            "memory://",
            "--console",
            "off",
        ],
    )
}

fn post(server: &Server, path: &str, body: &[u8]) -> Resp {
    request(&server.addr, "POST", path, &[], body)
}

fn json(resp: &Resp) -> serde_json::Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|_| panic!("not JSON: {}", resp.text()))
}

/// Deploys a guest through the route.
fn deploy(server: &Server, class: &str, guest: &str) {
    let resp = post(
        server,
        &format!("/_wasmkeep/test/classes/{class}"),
        &common::guest_bytes(guest),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(json(&resp)["class"], class);
}

#[test]
fn a_test_node_starts_empty_and_deploys_through_its_route() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_node(dir.path());
    assert_eq!(server.req("GET", "/demo/counter/a/value").status, 404);
    deploy(&server, "counter", "counter");
    // Served at once, not at the next heartbeat.
    let resp = server.req("POST", "/demo/counter/a/increment");
    assert_eq!((resp.status, resp.text()), (200, "1".into()));
    // A component that is none: refused, the class unchanged.
    let resp = post(&server, "/_wasmkeep/test/classes/counter", b"not wasm");
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(resp.json_code(), "component_refused");
    assert_eq!(server.req("GET", "/demo/counter/a/value").text(), "1");
    let resp = post(&server, "/_wasmkeep/test/classes/Bad%20Name", b"");
    assert_eq!(resp.json_code(), "invalid_name");
    server.stop();
}

#[test]
fn alarm_runs_a_set_alarm_and_is_409_when_none_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_node(dir.path());
    deploy(&server, "counter", "counter");
    let alarm = "/_wasmkeep/test/actors/demo/counter/a/alarm";
    let resp = post(&server, alarm, b"");
    assert_eq!((resp.status, resp.json_code()), (409, "conflict".into()));
    assert!(resp.text().contains("no alarm set"), "{}", resp.text());

    // An hour ahead: only the route makes it run now.
    assert_eq!(
        server
            .req("POST", "/demo/counter/a/alarm?in_ms=3600000")
            .status,
        200
    );
    let resp = post(&server, alarm, b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(json(&resp)["ran"], true);
    assert_eq!(server.req("GET", "/demo/counter/a/alarms").text(), "1");
    // Spent.
    assert_eq!(post(&server, alarm, b"").status, 409);
    // Only POST.
    let resp = request(&server.addr, "GET", alarm, &[], b"");
    assert_eq!(resp.status, 405);
    server.stop();
}

#[test]
fn hibernate_leaves_memory_and_is_409_while_a_socket_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_node(dir.path());
    deploy(&server, "counter", "counter");
    let resident = "/_wasmkeep/test/actors/demo/counter/h/resident";
    let hibernate = "/_wasmkeep/test/actors/demo/counter/h/hibernate";
    assert_eq!(json(&server.req("GET", resident))["resident"], false);
    server.req("POST", "/demo/counter/h/increment");
    assert_eq!(json(&server.req("GET", resident))["resident"], true);
    let resp = post(&server, hibernate, b"");
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert_eq!(json(&server.req("GET", resident))["resident"], false);
    assert_eq!(server.req("GET", "/demo/counter/h/value").text(), "1");

    let (mut socket, _) =
        tokio_tungstenite::tungstenite::connect(format!("ws://{}/demo/counter/h/ws", server.addr))
            .unwrap();
    socket
        .send(tokio_tungstenite::tungstenite::Message::text("inc"))
        .unwrap();
    assert_eq!(socket.read().unwrap().into_text().unwrap().as_str(), "2");
    let resp = post(&server, hibernate, b"");
    assert_eq!((resp.status, resp.json_code()), (409, "conflict".into()));
    assert!(resp.text().contains("open socket"), "{}", resp.text());
    assert_eq!(json(&server.req("GET", resident))["resident"], true);
    socket.close(None).unwrap();
    while socket.read().is_ok() {}
    assert_eq!(post(&server, hibernate, b"").status, 204);
    server.stop();
}

#[test]
fn sql_reads_the_bucket_and_writes_only_with_write_1() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_node(dir.path());
    deploy(&server, "counter", "counter");
    let sql = "/_wasmkeep/test/actors/demo/counter/s/sql";
    // Nothing in the bucket yet.
    let resp = post(&server, sql, b"SELECT 1");
    assert_eq!((resp.status, resp.json_code()), (404, "not_found".into()));
    server.req("POST", "/demo/counter/s/increment");
    let resp = post(&server, sql, b"SELECT n FROM counter");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        json(&resp),
        serde_json::json!({ "columns": ["n"], "rows": [[1]] })
    );
    // A write without write=1: refused, nothing written.
    let resp = post(&server, sql, b"UPDATE counter SET n = 7");
    assert_eq!((resp.status, resp.json_code()), (400, "bad_request".into()));
    assert!(resp.text().contains("read-only"), "{}", resp.text());
    assert_eq!(server.req("GET", "/demo/counter/s/value").text(), "1");
    // With it: one event of the actor, its changes counted.
    let resp = post(
        &server,
        &format!("{sql}?write=1"),
        b"UPDATE counter SET n = 7 RETURNING n",
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        json(&resp),
        serde_json::json!({ "columns": ["n"], "rows": [[7]], "changes": 1 })
    );
    assert_eq!(server.req("GET", "/demo/counter/s/value").text(), "7");
    // A bad statement: 400 with SQLite's message, nothing written.
    for path in [sql.to_owned(), format!("{sql}?write=1")] {
        let resp = post(&server, &path, b"UPDATE nowhere SET x = 1");
        assert_eq!(resp.status, 400, "{path}: {}", resp.text());
        assert!(resp.text().contains("no such table"), "{}", resp.text());
    }
    let resp = post(&server, &format!("{sql}?write=yes"), b"SELECT 1");
    assert_eq!(resp.status, 400);
    assert_eq!(server.req("GET", "/demo/counter/s/value").text(), "7");
    server.stop();
}

#[test]
fn advance_moves_the_clock_and_runs_exactly_the_due_alarms() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_node(dir.path());
    deploy(&server, "counter", "counter");
    let now_ms = || {
        json(&server.req("GET", "/_wasmkeep/test/clock"))["now_ms"]
            .as_i64()
            .unwrap()
    };
    server.req("POST", "/demo/counter/soon/alarm?in_ms=60000");
    server.req("POST", "/demo/counter/later/alarm?in_ms=7200000");
    // The hibernated one is found as the sweep finds it.
    assert_eq!(
        post(
            &server,
            "/_wasmkeep/test/actors/demo/counter/later/hibernate",
            b""
        )
        .status,
        204
    );
    let before = now_ms();
    let resp = post(&server, "/_wasmkeep/test/clock/advance?ms=61000", b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    let answer = json(&resp);
    assert_eq!(answer["ran"], serde_json::json!(["demo/counter/soon"]));
    assert!(answer["now_ms"].as_i64().unwrap() >= before + 61_000);
    assert_eq!(server.req("GET", "/demo/counter/soon/alarms").text(), "1");
    assert_eq!(server.req("GET", "/demo/counter/later/alarms").text(), "0");

    let resp = post(&server, "/_wasmkeep/test/clock/advance?ms=7200000", b"");
    assert_eq!(
        json(&resp)["ran"],
        serde_json::json!(["demo/counter/later"])
    );
    let resp = post(&server, "/_wasmkeep/test/clock/advance?ms=0", b"");
    assert_eq!(json(&resp)["ran"], serde_json::json!([]));
    // Bad input: refused, the clock unmoved.
    let before = now_ms();
    for bad in ["", "?ms=-5", "?ms=soon", "?ms=99999999999999999999"] {
        let resp = post(&server, &format!("/_wasmkeep/test/clock/advance{bad}"), b"");
        assert_eq!(resp.status, 400, "{bad}: {}", resp.text());
    }
    assert!(now_ms() < before + 60_000);
    server.stop();
}

#[test]
fn test_routes_exist_only_on_a_loopback_dev_that_asked_for_them() {
    let dir = tempfile::tempdir().unwrap();
    // A dev node without the flag: 404.
    let counter = format!("counter={}", common::guest("counter").display());
    let server = Server::start(
        dir.path(),
        &["dev", "--bucket", "memory://", "--console", "off", &counter],
    );
    let resp = server.req("POST", "/_wasmkeep/test/clock/advance?ms=1000");
    assert_eq!((resp.status, resp.json_code()), (404, "no_route".into()));
    server.stop();

    let refused = std::process::Command::new(common::BIN)
        .args(["dev", "--test-routes", "--bucket", "memory://"])
        .args(["--listen", "0.0.0.0:0", "--console", "off"])
        .output()
        .unwrap();
    let stderr = common::failed(&refused);
    assert!(stderr.contains("only on a loopback address"), "{stderr}");

    let serve = std::process::Command::new(common::BIN)
        .args(["serve", "--test-routes", "--bucket", "memory://"])
        .output()
        .unwrap();
    let stderr = common::failed(&serve);
    assert!(stderr.contains("--test-routes"), "{stderr}");
}

//! The web console (ADR 0067): its API on a real node, and its pages in
//! headless Chromium driven through chromedriver.

mod browser;

use super::common::{Resp, Server, folder_bucket, request};
use super::dev;

fn json(r: &Resp) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("not JSON: {}", r.text()))
}

fn get(server: &Server, path: &str, token: Option<&str>) -> Resp {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("authorization", b)])
        .unwrap_or_default();
    request(&server.addr, "GET", path, &headers, b"")
}

/// A token file for `--console-token-file`.
fn token_file(dir: &std::path::Path, token: &str) -> String {
    let path = dir.join("console-token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.display().to_string()
}

#[test]
fn the_console_api_shows_actors_tables_rows_and_read_only_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    for name in ["a1", "a2", "a3", "a4", "a5"] {
        assert_eq!(
            server
                .req("POST", &format!("/demo/counter/{name}/increment"))
                .status,
            200
        );
    }
    server.req("POST", "/demo/counter/a3/increment");

    // The page and its assets: embedded, and nothing may load from elsewhere.
    let page = get(&server, "/_wasmkeep/console", None);
    assert_eq!(page.status, 200);
    assert!(page.text().contains("/_wasmkeep/console/console.js"));
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    for asset in ["console.js", "console.css"] {
        let r = get(&server, &format!("/_wasmkeep/console/{asset}"), None);
        assert_eq!(r.status, 200, "{asset}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }

    // Actors by prefix, paged two at a time: every actor once, in order.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let r = get(
            &server,
            &format!(
                "/_wasmkeep/console/api/actors?prefix=demo%2Fcounter%2Fa&limit=2&after={after}"
            ),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let body = json(&r);
        for row in body["actors"].as_array().unwrap() {
            seen.push(row["actor"].as_str().unwrap().to_owned());
        }
        match body["next"].as_str() {
            Some(next) => after = next.replace('/', "%2F"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["a1", "a2", "a3", "a4", "a5"].map(|n| format!("demo/counter/{n}"))
    );
    let none = json(&get(
        &server,
        "/_wasmkeep/console/api/actors?prefix=nobody%2F",
        None,
    ));
    assert_eq!(none["actors"], serde_json::json!([]));

    // One actor: its tables with their rows, a page of rows, a statement.
    let detail = json(&get(
        &server,
        "/_wasmkeep/console/api/actor?id=demo/counter/a3",
        None,
    ));
    assert_eq!(detail["actor"]["actor"], "demo/counter/a3");
    assert_eq!(detail["resident_here"], true);
    assert_eq!(detail["sockets"], 0);
    let tables = detail["tables"].as_array().unwrap();
    assert!(
        tables
            .iter()
            .any(|t| t["name"] == "counter" && t["rows"] == 1),
        "{tables:?}"
    );
    assert!(
        tables
            .iter()
            .all(|t| !t["name"].as_str().unwrap().starts_with("_wasmkeep")),
        "the store's own tables are not shown: {tables:?}"
    );
    let rows = json(&get(
        &server,
        "/_wasmkeep/console/api/rows?id=demo/counter/a3&table=counter",
        None,
    ));
    assert_eq!(rows["columns"], serde_json::json!(["id", "n"]));
    assert_eq!(rows["rows"], serde_json::json!([[1, 2]]));
    assert_eq!(rows["next_offset"], serde_json::Value::Null);
    let sql = json(&get(
        &server,
        "/_wasmkeep/console/api/sql?id=demo/counter/a3&q=SELECT%20n%20FROM%20counter",
        None,
    ));
    assert_eq!(sql, serde_json::json!({"columns": ["n"], "rows": [[2]]}));

    // Bad input: a clear error, and nothing changes.
    for (path, status, says) in [
        (
            "/_wasmkeep/console/api/sql?id=demo/counter/a3&q=UPDATE%20counter%20SET%20n%20%3D%2099",
            400,
            "read-only",
        ),
        (
            "/_wasmkeep/console/api/sql?id=demo/counter/a3&q=SELEKT%201",
            400,
            "syntax error",
        ),
        (
            "/_wasmkeep/console/api/sql?id=demo/counter/a3",
            400,
            "give the statement",
        ),
        (
            "/_wasmkeep/console/api/actor?id=demo/counter/nobody",
            404,
            "nothing in the bucket",
        ),
        (
            "/_wasmkeep/console/api/actor?id=not-an-actor",
            400,
            "not-an-actor",
        ),
        ("/_wasmkeep/console/api/actor", 400, "name the actor"),
        (
            "/_wasmkeep/console/api/rows?id=demo/counter/a3&table=nope",
            404,
            "has no table",
        ),
        (
            "/_wasmkeep/console/api/rows?id=demo/counter/a3&table=counter&offset=-1",
            400,
            "offset",
        ),
        ("/_wasmkeep/console/api/actors?limit=0", 400, "limit"),
        ("/_wasmkeep/console/api/unknown", 404, "no route"),
        ("/_wasmkeep/console/other.js", 404, "no route"),
    ] {
        let r = get(&server, path, None);
        assert_eq!(r.status, status, "{path}: {}", r.text());
        assert!(r.text().contains(says), "{path}: {}", r.text());
    }
    // A page elsewhere whose name was rebound to 127.0.0.1 names its own host.
    let rebound = {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
        stream
            .write_all(
                b"GET /_wasmkeep/console/api/actors HTTP/1.1\r\nhost: evil.example:8787\r\n\
                  connection: close\r\n\r\n",
            )
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(rebound.starts_with("HTTP/1.1 400"), "{rebound}");
    assert!(!rebound.contains("demo/counter/a1"), "{rebound}");
    let post = request(
        &server.addr,
        "POST",
        "/_wasmkeep/console/api/sql?id=demo/counter/a3&q=SELECT%201",
        &[],
        b"",
    );
    assert_eq!(post.status, 405);
    assert_eq!(server.req("GET", "/demo/counter/a3/value").text(), "2");

    // An import waiting for a node that serves its class is in progress.
    let key = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let bucket = wasmkeep_bucket::open(&folder_bucket(dir.path()))
            .await
            .unwrap();
        let keys = wasmkeep_types::Keys::new(&wasmkeep_types::AppName::new("default").unwrap());
        let actor = wasmkeep_types::ActorId::parse("demo/elsewhere/x").unwrap();
        let key = keys.import_key(&actor, "00aa").unwrap();
        bucket
            .put(
                &key,
                bytes::Bytes::from_static(b"wasmkeep-import 1 empty\n"),
            )
            .await
            .unwrap();
        key
    });
    let operations = json(&get(&server, "/_wasmkeep/console/api/operations", None));
    assert_eq!(
        operations["imports"],
        serde_json::json!([{"actor": "demo/elsewhere/x", "key": key, "bytes": 24}]),
        "{operations}"
    );
}

#[test]
fn the_console_api_asks_for_the_operator_token_and_can_be_off() {
    let dir = tempfile::tempdir().unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    let file = token_file(dir.path(), token);
    let server = dev(dir.path(), &["--console-token-file", &file]);
    server.req("POST", "/demo/counter/t1/increment");
    // The page carries no data: served to anyone.
    assert_eq!(get(&server, "/_wasmkeep/console/", None).status, 200);
    for wrong in [None, Some("0123456789abcdef0123456789abcdee"), Some("")] {
        let r = get(&server, "/_wasmkeep/console/api/actors", wrong);
        assert_eq!(r.status, 401, "{wrong:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert!(!r.text().contains("t1"), "no data without the token");
    }
    let r = get(&server, "/_wasmkeep/console/api/actors", Some(token));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json(&r)["actors"][0]["actor"], "demo/counter/t1");
    assert_eq!(
        json(&get(&server, "/_wasmkeep/console/api/session", Some(token)))["token"],
        true
    );
    assert!(server.stop());

    let server = dev(dir.path(), &["--console", "off"]);
    for path in ["/_wasmkeep/console", "/_wasmkeep/console/api/actors"] {
        assert_eq!(get(&server, path, None).status, 404, "{path}");
    }
    assert!(server.stop());

    // A serve node has no console unless it is given a token.
    let bucket = folder_bucket(dir.path());
    let server = Server::start(
        dir.path(),
        &["serve", "--bucket", &bucket, "--node-id", "s1"],
    );
    assert_eq!(
        get(&server, "/_wasmkeep/console/api/actors", None).status,
        404
    );
    assert!(server.stop());

    // A bad token file stops the node at start with a clear error.
    std::fs::write(dir.path().join("short"), "abc\n").unwrap();
    let out = std::process::Command::new(super::common::BIN)
        .args(["dev", "--bucket", &bucket, "--listen", "127.0.0.1:0"])
        .args([
            "--console-token-file",
            dir.path().join("short").to_str().unwrap(),
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("16 to 256 visible ASCII characters"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

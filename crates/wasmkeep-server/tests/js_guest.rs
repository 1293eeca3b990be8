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

use common::{Server, folder_bucket, request};

fn counter_js() -> Option<PathBuf> {
    js_guest("counter-js")
}

/// A TypeScript example's component, or `None` (skipped) where the
/// JavaScript guests are not built and not required.
fn js_guest(name: &str) -> Option<PathBuf> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/wasm/{name}.wasm"));
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

/// What one chat room actor says over a scripted session: two sockets join,
/// talk, one posts over HTTP, the history in both formats, the members, a
/// refused name and a refused message, a leave.
async fn chat_session(addr: &str, class: &str) -> Vec<String> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let room = format!("/demo/{class}/lobby");
    let mut said = Vec::new();
    let open = || async {
        tokio_tungstenite::connect_async(format!("ws://{addr}{room}/ws"))
            .await
            .unwrap()
            .0
    };
    async fn next<S>(ws: &mut S) -> String
    where
        S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
    {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => text.to_string(),
            other => panic!("expected a text message, got {other:?}"),
        }
    }
    let mut ann = open().await;
    ann.send(Message::text("join ann")).await.unwrap();
    said.push(format!("ann hears {}", next(&mut ann).await));
    let mut bob = open().await;
    bob.send(Message::text("join bob")).await.unwrap();
    said.push(format!("ann hears {}", next(&mut ann).await));
    said.push(format!("bob hears {}", next(&mut bob).await));
    bob.send(Message::text("hello\r\n")).await.unwrap();
    said.push(format!("ann hears {}", next(&mut ann).await));
    said.push(format!("bob hears {}", next(&mut bob).await));
    // Refused: only the sender hears why.
    bob.send(Message::text("join a:b")).await.unwrap();
    said.push(format!("bob hears {}", next(&mut bob).await));
    bob.send(Message::text("two\nlines")).await.unwrap();
    said.push(format!("bob hears {}", next(&mut bob).await));
    let addr_owned = addr.to_owned();
    let room_owned = room.clone();
    let http = move |method: &'static str, path: String, body: &'static [u8]| {
        let addr = addr_owned.clone();
        let room = room_owned.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let r = request(&addr, method, &format!("{room}{path}"), &[], body);
                format!("{method} {path}: {} {}", r.status, r.text())
            })
            .await
            .unwrap()
        }
    };
    said.push(http("POST", "/post?user=carol".into(), b"from http").await);
    said.push(format!("ann hears {}", next(&mut ann).await));
    said.push(format!("bob hears {}", next(&mut bob).await));
    said.push(http("POST", "/post?user=".into(), b"x").await);
    said.push(http("POST", "/post?user=dan".into(), b"").await);
    said.push(http("GET", "/history?limit=2".into(), b"").await);
    let json = http("GET", "/history?format=json".into(), b"").await;
    // The times differ between runs; the rest must not.
    let json: String = json
        .lines()
        .map(|line| {
            let mut line = line.to_owned();
            if let Some(at) = line.find("\"at_ms\":") {
                let end = line[at..].find(',').map_or(line.len(), |e| at + e);
                line.replace_range(at..end, "\"at_ms\":T");
            }
            line + "\n"
        })
        .collect();
    said.push(json);
    said.push(
        http("GET", "/history?limit=x".into(), b"")
            .await
            .split(':')
            .take(2)
            .collect(),
    );
    said.push(http("GET", "/members".into(), b"").await);
    bob.close(None).await.unwrap();
    said.push(format!("ann hears {}", next(&mut ann).await));
    said
}

/// The chat room in TypeScript (examples/chat-js) behaves as the Rust one
/// (examples/chat): the same session gives the same answers, word for word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_chat_says_what_the_rust_chat_says() {
    let Some(js) = js_guest("chat-js") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rust = format!("chat={}", common::guest("chat").display());
    let ts = format!("chatjs={}", js.display());
    let d = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || {
        let bucket = folder_bucket(&d);
        Server::start(&d, &["dev", "--bucket", &bucket, &rust, &ts])
    })
    .await
    .unwrap();
    let from_rust = chat_session(&server.addr, "chat").await;
    let from_ts = chat_session(&server.addr, "chatjs").await;
    // The session says what the contract says (checked on the Rust one;
    // the TypeScript one must then say the same).
    let expected_start = [
        "ann hears ann joined",
        "ann hears bob joined",
        "bob hears bob joined",
        "ann hears bob: hello",
        "bob hears bob: hello",
    ];
    assert_eq!(&from_rust[..5], &expected_start, "{from_rust:#?}");
    assert!(
        from_rust[5].starts_with("bob hears error: bad request"),
        "{from_rust:#?}"
    );
    assert!(
        from_rust
            .iter()
            .any(|l| l == "GET /members: 200 ann\nbob\n"),
        "{from_rust:#?}"
    );
    assert_eq!(
        from_rust.last().map(String::as_str),
        Some("ann hears bob left")
    );
    for (i, (r, t)) in from_rust.iter().zip(&from_ts).enumerate() {
        assert_eq!(
            r, t,
            "line {i} differs: Rust {from_rust:#?}\nTypeScript {from_ts:#?}"
        );
    }
    assert_eq!(from_rust.len(), from_ts.len());
}

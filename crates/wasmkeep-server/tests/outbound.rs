//! Actors' outbound HTTP (issue 54, ADR 0066), end to end: the real
//! `wasmkeep` binary runs the `proxy` example, whose class is deployed
//! with an allow-list, against an HTTP and an HTTPS upstream on loopback.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use common::{Server, folder_bucket, guest};
use upstream::{HELLO, Upstream, encode};

/// The SDK's texts for the proxy's 502 answers (`wasmkeep_sdk::outbound`).
const DENIED: &str = "outbound request denied: the class's allow-list does not list this host";
const PROHIBITED: &str = "outbound request denied: the host resolves to a private or loopback address that the allow-list does not list";
const TIMED_OUT: &str = "outbound request timed out";
const TOO_LARGE: &str = "the response body is larger than the node allows (65536 bytes)";

fn fetch(server: &Server, name: &str, url: &str) -> common::Resp {
    server.req("GET", &format!("/t/proxy/{name}/fetch?url={}", encode(url)))
}

/// `wasmkeep deploy proxy` into the node's folder with these entries.
fn deploy_allowing(dir: &std::path::Path, entries: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(common::BIN);
    command
        .args(["deploy", "proxy", guest("proxy").to_str().unwrap()])
        .args(["--bucket", &folder_bucket(dir), "--app", "default"])
        .args(["--data-dir", common::data_dir().to_str().unwrap()]);
    for entry in entries {
        command.args(["--allow-outbound", entry]);
    }
    command.output().unwrap()
}

fn class_list(dir: &std::path::Path) -> String {
    common::ok(
        &std::process::Command::new(common::BIN)
            .args(["class", "list", "--bucket", &folder_bucket(dir)])
            .output()
            .unwrap(),
    )
}

#[test]
fn outbound_http_reaches_only_what_the_class_allows() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(dir.path());
    let proxy = format!("proxy={}", guest("proxy").display());
    let ca = up.ca_file.to_str().unwrap().to_owned();
    let bucket = folder_bucket(dir.path());
    let server = Server::start(
        dir.path(),
        &[
            "dev",
            "--bucket",
            &bucket,
            &proxy,
            "--heartbeat",
            "250ms",
            "--outbound-ca",
            &ca,
            "--max-outbound-body-bytes",
            "65536",
            "--event-time-max",
            "3s",
        ],
    );
    let hello = format!("http://127.0.0.1:{}/hello", up.port);

    // Deployed without an allow-list: nothing is allowed, nothing is sent.
    let denied = fetch(&server, "a", &hello);
    assert_eq!((denied.status, denied.text()), (502, DENIED.to_owned()));
    assert_eq!(up.hits(), 0);
    assert!(class_list(dir.path()).contains("(nothing)"));

    // `localhost` is listed, but it resolves to a loopback address that is
    // not: no SSRF through a name.
    let by_name = format!("localhost:{}", up.port);
    common::ok(&deploy_allowing(dir.path(), &[&by_name]));
    let through_name = format!("http://localhost:{}/hello", up.port);
    server.wait_until("the first allow-list reaches the node", |s| {
        fetch(s, "a", &through_name).text() != DENIED
    });
    let prohibited = fetch(&server, "a", &through_name);
    assert_eq!(
        (prohibited.status, prohibited.text()),
        (502, PROHIBITED.to_owned())
    );
    assert_eq!(up.hits(), 0);

    let https_port = format!("127.0.0.1:{}", up.tls_port);
    let plain_port = format!("127.0.0.1:{}", up.port);
    let deployed = deploy_allowing(dir.path(), &[&plain_port, &https_port, &by_name]);
    common::ok(&deployed);
    let listed = class_list(dir.path());
    assert!(
        listed.contains(&format!("{plain_port} {https_port} {by_name}")),
        "{listed}"
    );
    server.wait_until("the allow-list reaches the node", |s| {
        fetch(s, "a", &hello).status == 200
    });
    let answered = fetch(&server, "a", &hello);
    assert_eq!((answered.status, answered.text()), (200, HELLO.to_owned()));
    let last = server.req("GET", "/t/proxy/a/last");
    assert_eq!(last.text(), format!("200 {hello}"));

    // HTTPS, verified against the node's extra CA.
    let secure = fetch(
        &server,
        "a",
        &format!("https://127.0.0.1:{}/hello", up.tls_port),
    );
    assert_eq!((secure.status, secure.text()), (200, HELLO.to_owned()));

    // A request body goes upstream.
    let echo = encode(&format!("http://127.0.0.1:{}/echo", up.port));
    let echoed = common::request(
        &server.addr,
        "POST",
        &format!("/t/proxy/a/post?url={echo}"),
        &[],
        b"a body for upstream",
    );
    assert_eq!(
        (echoed.status, echoed.text()),
        (200, "a body for upstream".to_owned())
    );

    // Refusals reach nothing upstream and leave the last status as it was.
    let hits = up.hits();
    let other_port = common::free_port();
    let by_port = fetch(
        &server,
        "a",
        &format!("http://127.0.0.1:{other_port}/hello"),
    );
    assert_eq!((by_port.status, by_port.text()), (502, DENIED.to_owned()));
    let by_host = fetch(&server, "a", &format!("http://127.0.0.2:{}/hello", up.port));
    assert_eq!((by_host.status, by_host.text()), (502, DENIED.to_owned()));
    assert_eq!(up.hits(), hits);
    assert_eq!(
        server.req("GET", "/t/proxy/a/last").text(),
        format!("200 http://127.0.0.1:{}/echo", up.port)
    );
    // Once its address is listed too, the name reaches it.
    let named = fetch(&server, "a", &through_name);
    assert_eq!((named.status, named.text()), (200, HELLO.to_owned()));

    // A body past --max-outbound-body-bytes.
    let big = fetch(&server, "a", &format!("http://127.0.0.1:{}/big", up.port));
    assert_eq!((big.status, big.text()), (502, TOO_LARGE.to_owned()));
    let chunked = fetch(
        &server,
        "a",
        &format!("http://127.0.0.1:{}/big-chunked", up.port),
    );
    assert_eq!(chunked.status, 502, "{}", chunked.text());
    assert!(
        chunked
            .text()
            .contains("body size exceeds limit: 65536 bytes"),
        "{}",
        chunked.text()
    );

    // An upstream slower than the event's time: the request ends in time
    // for the actor to answer.
    let slow = fetch(&server, "b", &format!("http://127.0.0.1:{}/slow", up.port));
    assert_eq!(slow.status, 502, "{}", slow.text());
    assert!(slow.text().starts_with(TIMED_OUT), "{}", slow.text());
    up.release();

    let metrics = server.req("GET", "/_wasmkeep/metrics").text();
    let outcome = |o: &str| {
        common::metric_labelled(
            &metrics,
            "wasmkeep_outbound_requests_total",
            &[("tenant", "t"), ("class", "proxy"), ("outcome", o)],
        )
        .unwrap_or(0.0)
    };
    assert!(outcome("2xx") >= 5.0, "{metrics}");
    assert!(outcome("denied") >= 4.0, "{metrics}");
    assert!(outcome("failed") >= 1.0, "{metrics}");

    // Deploying again without entries takes the allow-list away.
    common::ok(&deploy_allowing(dir.path(), &[]));
    server.wait_until("the empty allow-list reaches the node", |s| {
        fetch(s, "a", &hello).status == 502
    });
    assert_eq!(fetch(&server, "c", &hello).text(), DENIED);
}

#[test]
fn a_malformed_allow_list_entry_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = format!("proxy={}", guest("proxy").display());
    let bucket = folder_bucket(dir.path());
    let server = Server::start(dir.path(), &["dev", "--bucket", &bucket, &proxy]);
    let before = class_list(dir.path());
    for bad in [
        "https://example.com",
        "example.com/path",
        "::1",
        "*.",
        "a:0",
    ] {
        let refused = deploy_allowing(dir.path(), &[bad]);
        let stderr = common::failed(&refused);
        assert!(
            stderr.contains("outbound allow-list entry"),
            "{bad}: {stderr}"
        );
    }
    assert_eq!(class_list(dir.path()), before);
    drop(server);
}

/// `--max-outbound-per-node`: a request past it fails at once, clearly;
/// the place comes back when the request in flight ends.
#[test]
fn requests_past_the_nodes_limit_in_flight_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(dir.path());
    common::ok(&deploy_allowing(
        dir.path(),
        &[&format!("127.0.0.1:{}", up.port)],
    ));
    let proxy = format!("proxy={}", guest("proxy").display());
    let bucket = folder_bucket(dir.path());
    let server = Server::start(
        dir.path(),
        &[
            "dev",
            "--bucket",
            &bucket,
            &proxy,
            "--max-outbound-per-node",
            "1",
        ],
    );
    let hello = format!("http://127.0.0.1:{}/hello", up.port);
    assert_eq!(fetch(&server, "a", &hello).status, 200);
    // One actor's request holds the node's one place...
    let addr = server.addr.clone();
    let slow = format!("http://127.0.0.1:{}/slow", up.port);
    let holder = std::thread::spawn(move || {
        common::request(
            &addr,
            "GET",
            &format!("/t/proxy/holder/fetch?url={}", encode(&slow)),
            &[],
            b"",
        )
    });
    while up.slow_waiting() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // ... so another actor's fails at once.
    let refused = fetch(&server, "b", &hello);
    assert_eq!(refused.status, 502, "{}", refused.text());
    assert!(
        refused.text().contains("ConnectionLimitReached"),
        "{}",
        refused.text()
    );
    up.release();
    let held = holder.join().unwrap();
    assert_eq!((held.status, held.text()), (200, "slow answer".to_owned()));
    // The place is back.
    assert_eq!(fetch(&server, "b", &hello).status, 200);
}

//! End-to-end tests of one node: the real `wasmkeep` binary, a folder bucket,
//! the example and test guests (built by scripts/build-guests).

#![allow(clippy::unwrap_used)]

mod common;
#[path = "console/mod.rs"]
mod console;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Server, count, folder_bucket, guest, request, try_request};

fn dev(dir: &std::path::Path, extra: &[&str]) -> Server {
    let bucket = folder_bucket(dir);
    let mut args = vec!["dev", "--bucket", bucket.as_str()];
    args.extend_from_slice(extra);
    Server::start(dir, &args)
}

/// Runs `clients` threads, each incrementing until `stop` returns true or
/// `per_client` increments were acknowledged; returns (acked, attempted).
fn hammer(addr: &str, actor: &str, clients: usize, per_client: u64) -> (u64, u64) {
    let acked = Arc::new(AtomicU64::new(0));
    let attempted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (addr, path) = (addr.to_owned(), format!("/demo/counter/{actor}/increment"));
            let (acked, attempted) = (Arc::clone(&acked), Arc::clone(&attempted));
            std::thread::spawn(move || {
                for _ in 0..per_client {
                    attempted.fetch_add(1, Ordering::SeqCst);
                    match try_request(&addr, "POST", &path, &[], b"") {
                        Ok(r) if r.status == 200 => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (
        acked.load(Ordering::SeqCst),
        attempted.load(Ordering::SeqCst),
    )
}

#[test]
fn counter_survives_restart_and_kill_with_concurrent_clients() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    let (acked, attempted) = hammer(&server.addr, "alice", 64, 5);
    assert_eq!(acked, attempted, "no failures expected on a healthy node");
    assert_eq!(count(&server, "alice"), acked);
    assert!(server.stop(), "graceful shutdown exits 0");

    let server = dev(dir.path(), &[]);
    assert_eq!(
        count(&server, "alice"),
        acked,
        "a restart keeps every acknowledged increment"
    );
    // kill -9 while 64 clients increment.
    let addr = server.addr.clone();
    let load = std::thread::spawn(move || hammer(&addr, "alice", 64, 1_000));
    server.wait_until("some increments", |s| count(s, "alice") > acked + 50);
    server.kill();
    let (acked_2, attempted_2) = load.join().unwrap();
    let server = dev(dir.path(), &[]);
    let after = count(&server, "alice");
    let in_flight = attempted_2 - acked_2;
    assert!(
        after >= acked + acked_2,
        "lost acknowledged increments: {after} < {}",
        acked + acked_2
    );
    assert!(
        after <= acked + acked_2 + in_flight,
        "more increments than attempted: {after}"
    );
}

/// The folder's write-ahead journal and its pad files (`.wal/j.*`,
/// `.wal/p.*`) left in the bucket folder under `dir`.
fn journal_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir.join("bucket").join(".wal"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("j.") || name.starts_with("p."))
        .collect()
}

#[test]
fn a_clean_stop_checkpoints_and_removes_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=3 {
        let server = dev(dir.path(), &[]);
        let r = server.req("POST", "/demo/counter/tidy/increment");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text().trim(), round.to_string());
        assert!(
            !journal_files(dir.path()).is_empty(),
            "a running node journals its writes"
        );
        assert!(server.stop(), "graceful shutdown exits 0");
        // The committer's last checkpoint ran before the process exited:
        // everything is durable in place and nothing is left to recover.
        assert_eq!(
            journal_files(dir.path()),
            Vec::<String>::new(),
            "round {round}: a clean stop leaves no journal"
        );
    }
}

#[test]
fn events_of_one_actor_never_overlap() {
    // Each increment reads and writes the count in one event: if two events
    // of the actor overlapped, two clients would see the same count.
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let addr = server.addr.clone();
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                for _ in 0..8 {
                    let r = request(&addr, "POST", "/demo/counter/serial/increment", &[], b"");
                    assert_eq!(r.status, 200);
                    seen.lock().push(r.text().trim().parse::<u64>().unwrap());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut seen = seen.lock().clone();
    seen.sort_unstable();
    assert_eq!(seen, (1..=256).collect::<Vec<u64>>());
}

#[test]
fn alarms_fire_and_fire_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    assert_eq!(
        server.req("POST", "/demo/counter/a/alarm?in_ms=100").status,
        200
    );
    server.wait_until("the alarm fires", |s| {
        s.req("GET", "/demo/counter/a/alarms").text().trim() == "1"
    });
    assert_eq!(
        server
            .req("POST", "/demo/counter/a/alarm?in_ms=1500")
            .status,
        200
    );
    assert!(server.stop());
    let server = dev(dir.path(), &[]);
    server.wait_until("the alarm fires after a restart", |s| {
        s.req("GET", "/demo/counter/a/alarms").text().trim() == "2"
    });
}

#[test]
fn alarm_of_a_hibernated_actor_fires_via_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--idle-timeout", "200ms"]);
    assert_eq!(
        server
            .req("POST", "/demo/counter/sleepy/alarm?in_ms=2500")
            .status,
        200
    );
    server.wait_until("the actor hibernates", |s| {
        s.metric("wasmkeep_hibernations_total") >= 1.0
    });
    assert!(server.stop());
    // A new process knows of the alarm only through the bucket's alarm index.
    let server = dev(
        dir.path(),
        &["--idle-timeout", "200ms", "--alarm-sweep", "500ms"],
    );
    server.wait_until("the sweep activates the actor and fires", |s| {
        s.metric("wasmkeep_alarms_fired_total") >= 1.0
    });
    assert_eq!(
        server
            .req("GET", "/demo/counter/sleepy/alarms")
            .text()
            .trim(),
        "1"
    );
}

#[test]
fn failing_alarm_is_retried_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str()]);
    // kitchen-sink fails the first delivery of an alarm set at -1 ms.
    assert_eq!(server.req("POST", "/demo/ks/x/alarm/set?at=-1").status, 200);
    server.wait_until("a retry", |s| {
        s.metric("wasmkeep_alarm_retries_total") >= 1.0
    });
    server.wait_until("the retry succeeds and clears the alarm", |s| {
        s.req("GET", "/demo/ks/x/alarm/get").text() == "none"
    });
    assert!(server.metric("wasmkeep_alarms_fired_total") >= 2.0);
    // The firing alarm is spent in its handler, in each attempt.
    let logs = server.logs();
    assert!(
        logs.contains("alarm scheduled_ms=-1 retry_count=0 get=none")
            && logs.contains("alarm scheduled_ms=-1 retry_count=1 get=none"),
        "{logs}"
    );
}

#[test]
fn a_failing_alarm_keeps_its_retries_across_hibernation() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    // Hibernated between the retries (2 s, then 4 s apart).
    let server = dev(dir.path(), &["--idle-timeout", "300ms", ks.as_str()]);
    // kitchen-sink fails the first two deliveries of an alarm set at -2 ms.
    assert_eq!(server.req("POST", "/demo/ks/r/alarm/set?at=-2").status, 200);
    // The metrics, not the actor: a request would keep it resident.
    server.wait_until("the second retry succeeds", |s| {
        s.logs().contains("alarm scheduled_ms=-2 retry_count=2")
            && s.metric("wasmkeep_resident_actors") == 0.0
    });
    assert_eq!(server.metric("wasmkeep_alarm_retries_total"), 2.0);
    assert_eq!(server.metric("wasmkeep_alarms_fired_total"), 3.0);
    assert!(server.metric("wasmkeep_hibernations_total") >= 2.0);
    assert_eq!(server.req("GET", "/demo/ks/r/alarm/get").text(), "none");
}

#[test]
fn an_alarm_at_the_earliest_time_fires_and_the_actor_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str()]);
    let at = i64::MIN;
    assert_eq!(
        server
            .req("POST", &format!("/demo/ks/early/alarm/set?at={at}"))
            .status,
        200
    );
    server.wait_until("the alarm fires and is cleared", |s| {
        s.req("GET", "/demo/ks/early/alarm/get").text() == "none"
    });
    assert_eq!(server.metric("wasmkeep_alarms_fired_total"), 1.0);
}

#[test]
fn an_answer_that_cannot_be_sent_fails_the_event_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str()]);
    let ok = server.req("POST", "/demo/ks/a/answer?header=x-ok");
    assert_eq!((ok.status, ok.header("x-ok")), (200, Some("1")));
    assert_ne!(server.req("GET", "/demo/ks/a/alarm/get").text(), "none");
    for bad in ["header=b@d", "status=42", "status=101", "status=999"] {
        let answer = server.req("POST", &format!("/demo/ks/b/answer?{bad}"));
        assert_eq!(
            (answer.status, answer.json_code().as_str()),
            (500, "event_refused"),
            "{bad}: {}",
            answer.text()
        );
        // The event's write (its alarm) was discarded with it.
        assert_eq!(server.req("GET", "/demo/ks/b/alarm/get").text(), "none");
    }
    // A caller gets the refusal as the call's error, not the bad answer.
    let called = server.req(
        "POST",
        "/demo/ks/c/call?class=ks&name=d&path=/answer?header=b@d",
    );
    assert_eq!(called.status, 502, "{}", called.text());
    assert!(called.text().contains("refused"), "{}", called.text());
    assert_eq!(server.req("GET", "/demo/ks/d/alarm/get").text(), "none");
}

#[test]
fn idle_actors_hibernate_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--idle-timeout", "200ms"]);
    assert_eq!(
        server.req("POST", "/demo/counter/idle/increment").text(),
        "1"
    );
    server.wait_until("hibernation", |s| {
        s.metric("wasmkeep_hibernations_total") >= 1.0
            && s.metric("wasmkeep_resident_actors") == 0.0
    });
    assert_eq!(
        server.req("POST", "/demo/counter/idle/increment").text(),
        "2"
    );
    assert_eq!(server.metric("wasmkeep_activations_total"), 2.0);
}

#[test]
fn max_actors_evicts_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--max-actors", "2"]);
    for name in ["a", "b", "c", "d"] {
        assert_eq!(
            server
                .req("POST", &format!("/demo/counter/{name}/increment"))
                .status,
            200
        );
    }
    server.wait_until("evictions", |s| {
        s.metric("wasmkeep_hibernations_total") >= 2.0
    });
    for name in ["a", "b", "c", "d"] {
        assert_eq!(
            count(&server, name),
            1,
            "{name} kept its count across eviction"
        );
    }
}

#[test]
fn new_version_changes_behaviour_at_next_event() {
    let dir = tempfile::tempdir().unwrap();
    let app = format!("app={}", guest("counter").display());
    let server = dev(dir.path(), &[app.as_str(), "--heartbeat", "200ms"]);
    assert_eq!(server.req("POST", "/demo/app/x/increment").text(), "1");
    assert_eq!(
        server.req("GET", "/demo/app/x/noop").status,
        404,
        "the counter has no /noop"
    );
    // A broken component is refused and changes nothing.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let bucket = folder_bucket(dir.path());
    let out = std::process::Command::new(common::BIN)
        .args(["deploy", "app", junk.to_str().unwrap(), "--bucket", &bucket])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a broken component deploys");
    assert_eq!(server.req("POST", "/demo/app/x/increment").text(), "2");
    let out = std::process::Command::new(common::BIN)
        .args([
            "deploy",
            "app",
            guest("kitchen-sink").to_str().unwrap(),
            "--bucket",
            &bucket,
        ])
        .args(["--data-dir", common::data_dir().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.wait_until("the resident actor switches version", |s| {
        s.req("GET", "/demo/app/x/noop").status == 204
    });
}

#[test]
fn bad_input_gets_its_status_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let trap = format!("trap={}", guest("trap").display());
    let counter = format!("counter={}", guest("counter").display());
    let server = dev(dir.path(), &[counter.as_str(), trap.as_str()]);
    assert_eq!(server.req("POST", "/demo/counter/v/increment").text(), "1");
    let cases: [(&str, &str, u16, &str); 9] = [
        ("POST", "/Demo/counter/v/increment", 400, "invalid_name"),
        ("POST", "/demo/counter/%FF/increment", 400, "invalid_name"),
        ("POST", "/demo/counter/v%zz/increment", 400, "invalid_name"),
        ("POST", "/_wasmkeep/health", 405, "method_not_allowed"),
        ("DELETE", "/_wasmkeep/metrics", 405, "method_not_allowed"),
        ("POST", "/demo/nope/v/increment", 404, "unknown_class"),
        ("POST", "/demo/counter", 404, "no_route"),
        ("GET", "/_wasmkeep/nothing", 404, "no_route"),
        ("POST", "/demo/trap/v/panic", 500, "guest_failed"),
    ];
    for (method, path, status, code) in cases {
        let r = server.req(method, path);
        assert_eq!(
            (r.status, r.json_code().as_str()),
            (status, code),
            "{method} {path}: {}",
            r.text()
        );
    }
    assert_eq!(
        server.req("POST", "/_wasmkeep/health").header("allow"),
        Some("GET, HEAD")
    );
    let huge = request(
        &server.addr,
        "POST",
        "/demo/counter/v/increment",
        &[("content-length", "40000000")],
        b"",
    );
    assert_eq!(
        (huge.status, huge.json_code().as_str()),
        (413, "body_too_large")
    );
    // The trapped actor serves its next event on a fresh instance.
    assert_eq!(server.req("GET", "/demo/trap/v/count").status, 200);
    assert_eq!(count(&server, "v"), 1, "bad requests changed the count");
}

#[test]
fn calls_reach_other_actors_and_cycles_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str()]);
    // a calls b; b answers its /inner path with kitchen-sink's 404.
    let r = server.req("POST", "/demo/ks/a/call?class=ks&name=b");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("no route /inner"), "{}", r.text());
    // a calls a: a cycle, refused instead of a deadlock.
    let r = server.req("POST", "/demo/ks/a/call?class=ks&name=a");
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("call cycle"), "{}", r.text());
}

#[test]
fn marker_headers_from_clients_do_not_reach_the_actor() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str()]);
    let r = request(
        &server.addr,
        "GET",
        "/demo/ks/e/echo?q=1",
        &[("x-wasmkeep-node", "evil"), ("x-mine", "ok")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-path"), Some("/echo?q=1"));
    assert_eq!(r.header("x-mine"), Some("ok"));
    // The node names itself (the node that ran the event), never the client's value.
    assert_eq!(r.header("x-wasmkeep-node"), Some("dev"));
}

/// [`dev`] from async code (the harness waits for the node, blocking).
async fn dev_async(dir: &std::path::Path, extra: &[&str]) -> Server {
    let dir = dir.to_owned();
    let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        dev(&dir, &extra)
    })
    .await
    .unwrap()
}

/// Reads a WebSocket until the server's close frame; the frame's code.
async fn close_code<S>(ws: &mut S) -> Option<u16>
where
    S: futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match ws.next().await {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => continue,
            other => panic!("socket ended without a close frame: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_round_trip_close_event_and_1012_on_shutdown() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let counter = format!("counter={}", guest("counter").display());
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let d = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || {
        let bucket = folder_bucket(&d);
        Server::start(&d, &["dev", "--bucket", &bucket, &counter, &ks])
    })
    .await
    .unwrap();
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/demo/counter/w/ws", server.addr))
            .await
            .unwrap();
    ws.send(Message::text("inc")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("1"));
    ws.send(Message::text("inc")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("2"));

    // kitchen-sink echoes, and a client close reaches the actor as an event.
    let (mut echo, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/demo/ks/k/ws", server.addr))
            .await
            .unwrap();
    echo.send(Message::text("hello")).await.unwrap();
    assert_eq!(echo.next().await.unwrap().unwrap(), Message::text("hello"));
    // A message many times the node's 8 KiB read buffer arrives whole.
    let large: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    echo.send(Message::binary(large.clone())).await.unwrap();
    assert_eq!(echo.next().await.unwrap().unwrap(), Message::binary(large));
    let addr = server.addr.clone();
    let listed = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || request(&addr, "GET", "/demo/ks/k/sockets/list", &[], b"").text()
    })
    .await
    .unwrap();
    assert!(
        !listed.trim().is_empty() && listed.trim() != "[]",
        "socket not listed: {listed:?}"
    );
    // A socket the actor closes leaves its list and takes no more messages
    // at once, before its client has answered the close.
    let (mut quiet, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/demo/ks/q/ws"))
        .await
        .unwrap();
    let (closed, listed, sent, again) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            let text = |method: &str, path: &str| request(&addr, method, path, &[], b"").text();
            let id = text("GET", "/demo/ks/q/sockets/list").trim().to_owned();
            let close = format!("/demo/ks/q/sockets/close?id={id}&code=4001");
            (
                text("POST", &close),
                text("GET", "/demo/ks/q/sockets/list"),
                text("POST", &format!("/demo/ks/q/sockets/send?id={id}&text=x")),
                text("POST", &close),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(closed, "closed");
    assert_eq!(listed.trim(), "", "a closed socket is still listed");
    assert!(sent.contains("is closing"), "{sent}");
    assert!(again.contains("is closing"), "{again}");
    let code = close_code(&mut quiet).await;
    assert_eq!(code, Some(4001));
    echo.close(None).await.unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.wait_until("the close event", |s| s.logs().contains("socket-close id="));
        server
    })
    .await
    .unwrap();

    // A message over the limit (1 MiB) closes that socket with 1009.
    let (mut big, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/demo/ks/big/ws"))
        .await
        .unwrap();
    big.send(Message::binary(vec![7u8; 1536 * 1024]))
        .await
        .unwrap();
    let code = close_code(&mut big).await;
    assert_eq!(code, Some(1009));

    // Shutdown closes the counter's socket with 1012 and exits cleanly.
    let stopped = tokio::task::spawn_blocking(move || server.stop());
    let code = close_code(&mut ws).await;
    assert_eq!(code, Some(1012));
    assert!(stopped.await.unwrap(), "graceful shutdown exits 0");
}

#[test]
fn serve_runs_classes_deployed_with_the_deploy_command() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let out = std::process::Command::new(common::BIN)
        .args([
            "deploy",
            "counter",
            guest("counter").to_str().unwrap(),
            "--bucket",
            &bucket,
        ])
        .args([
            "--app",
            "shop",
            "--data-dir",
            common::data_dir().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("counter "),
        "deploy prints the class and digest on stdout: {stdout:?}"
    );
    let trap = std::process::Command::new(common::BIN)
        .args(["deploy", "trap", guest("trap").to_str().unwrap()])
        .args(["--bucket", &bucket, "--app", "shop"])
        .args(["--data-dir", common::data_dir().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        trap.status.success(),
        "{}",
        String::from_utf8_lossy(&trap.stderr)
    );
    let server = Server::start(
        dir.path(),
        &[
            "serve",
            "--bucket",
            &bucket,
            "--app",
            "shop",
            "--node-id",
            "n1",
            "--log-format",
            "json",
        ],
    );
    assert_eq!(server.req("POST", "/acme/counter/x/increment").text(), "1");
    // A trap's details (what the guest printed, where it panicked) reach
    // the node's log, not the client (`dev` tells its client too).
    let trapped = server.req("POST", "/acme/trap/x/panic");
    assert_eq!(
        (trapped.status, trapped.json_code().as_str()),
        (500, "guest_failed")
    );
    assert!(trapped.text().contains("trapped"), "{}", trapped.text());
    assert!(!trapped.text().contains("on purpose"), "{}", trapped.text());
    server.wait_until("the trap's details in the log", |s| {
        s.logs().contains("trap guest panics on purpose")
    });
    let first_line = server
        .logs()
        .lines()
        .find(|l| l.starts_with('{'))
        .map(str::to_owned);
    assert!(
        first_line.is_some(),
        "json logs expected:\n{}",
        server.logs()
    );
    // Another app in the same bucket does not see the class.
    let other = Server::start(
        dir.path(),
        &[
            "serve",
            "--bucket",
            &bucket,
            "--app",
            "other",
            "--node-id",
            "n2",
        ],
    );
    assert_eq!(other.req("POST", "/acme/counter/x/increment").status, 404);
}

/// Reads from `stream` until the server closes it (or the test's wait
/// ends, which fails); returns what arrived.
fn read_until_closed(stream: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    stream.set_read_timeout(Some(common::WAIT_MAX)).unwrap();
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .expect("the server closes the connection (a read timeout here means it never did)");
    raw
}

#[test]
fn slow_and_idle_connections_are_closed_and_a_stalled_body_gets_408() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let dir = tempfile::tempdir().unwrap();
    let counter = format!("counter={}", guest("counter").display());
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(
        dir.path(),
        &[
            &counter,
            &ks,
            "--header-timeout",
            "1s",
            "--body-timeout",
            "1s",
            "--send-timeout",
            "1s",
        ],
    );

    // A head that never ends (slowloris): closed without an answer.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.write_all(b"GET /_wasmkeep/health HTTP/1.1\r\nhost: x\r\nx-slow: 1")
        .unwrap();
    assert_eq!(
        read_until_closed(&mut slow),
        b"",
        "a slow head got an answer"
    );

    // A connection that never sends anything: closed.
    let mut silent = TcpStream::connect(&server.addr).unwrap();
    assert_eq!(read_until_closed(&mut silent), b"");

    // A keep-alive connection is answered, then closed once idle.
    let mut idle = TcpStream::connect(&server.addr).unwrap();
    idle.write_all(
        b"POST /demo/counter/c/increment HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
    )
    .unwrap();
    let answered = String::from_utf8(read_until_closed(&mut idle)).unwrap();
    assert!(
        answered.starts_with("HTTP/1.1 200") && answered.ends_with("\r\n\r\n1"),
        "the request before the idle time was not served: {answered:?}"
    );

    // A body that stops arriving: 408, and it reaches no actor.
    let mut stalled = TcpStream::connect(&server.addr).unwrap();
    stalled
        .write_all(b"POST /demo/counter/c/increment HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly a part")
        .unwrap();
    let answer = String::from_utf8(read_until_closed(&mut stalled)).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains(r#""code":"request_timeout""#),
        "a stalled body was not answered 408: {answer:?}"
    );
    assert_eq!(
        count(&server, "c"),
        1,
        "the stalled request changed the actor"
    );

    // A client that reads nothing of a large response: closed, not held.
    let timed_out = |s: &Server| s.metric("wasmkeep_connections_timed_out_total");
    assert_eq!(
        timed_out(&server),
        3.0,
        "the slow, silent and idle connections"
    );
    // A small receive buffer, set before connecting (it sizes the window),
    // so the response fills it and the node's send buffer quickly.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut deaf: TcpStream = socket.into();
    let body = vec![b'x'; 16 << 20];
    deaf.write_all(
        format!(
            "POST /demo/ks/deaf/echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    deaf.write_all(&body).unwrap();
    server.wait_until("the deaf client's connection is closed", |s| {
        timed_out(s) == 4.0
    });
    deaf.set_read_timeout(Some(common::WAIT_MAX)).unwrap();
    let mut received = Vec::new();
    // The end of what was sent before the close: EOF, or a reset.
    let _ = deaf.read_to_end(&mut received);
    assert!(
        received.len() < body.len(),
        "the whole response arrived after the close ({} bytes)",
        received.len()
    );

    // Zero would close every connection at once: refused at start.
    let refused = std::process::Command::new(common::BIN)
        .args(["dev", "--bucket", "memory://", "--header-timeout", "0s"])
        .output()
        .unwrap();
    assert!(
        common::failed(&refused).contains("--header-timeout"),
        "{}",
        common::failed(&refused)
    );
}

/// One GET on a kept-alive connection; returns the body (the status must be 200).
fn get_kept_alive(stream: &mut std::net::TcpStream, path: &str) -> String {
    use std::io::{Read, Write};
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    stream.set_read_timeout(Some(common::WAIT_MAX)).unwrap();
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed before the head");
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

#[test]
fn connections_over_the_limit_are_answered_503_and_their_slots_come_back() {
    use std::io::Read;
    use std::net::TcpStream;
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--max-connections", "2"]);
    // Two connections take the two slots: one kept alive to read the
    // metrics, one that sends nothing.
    let mut watch = TcpStream::connect(&server.addr).unwrap();
    let metric = |watch: &mut TcpStream, name: &str| {
        common::metric_in(&get_kept_alive(watch, "/_wasmkeep/metrics"), name)
    };
    let silent = TcpStream::connect(&server.addr).unwrap();
    server.wait_until(
        "both connections hold a slot (the start's checks let go)",
        |_| metric(&mut watch, "wasmkeep_connections_open") == 2.0,
    );

    let mut third = TcpStream::connect(&server.addr).unwrap();
    third.set_read_timeout(Some(common::WAIT_MAX)).unwrap();
    let mut answer = Vec::new();
    let _ = third.read_to_end(&mut answer);
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503")
            && answer.contains("retry-after: 1")
            && answer.contains(r#""code":"unavailable""#),
        "the third connection was not answered 503: {answer:?}"
    );
    assert_eq!(
        metric(&mut watch, "wasmkeep_connections_refused_total"),
        1.0
    );

    // A closed connection gives its slot back.
    drop(silent);
    server.wait_until("the silent connection's slot comes back", |_| {
        metric(&mut watch, "wasmkeep_connections_open") == 1.0
    });
    assert_eq!(
        server.req("POST", "/demo/counter/m/increment").text(),
        "1",
        "a new connection is served"
    );
}

#[test]
fn limits_answer_413_and_503_and_stop_runaway_guests() {
    let dir = tempfile::tempdir().unwrap();
    let guests: Vec<String> = ["counter", "spin", "hog"]
        .iter()
        .map(|g| format!("{g}={}", guest(g).display()))
        .collect();
    let mut args: Vec<&str> = guests.iter().map(String::as_str).collect();
    args.extend([
        "--max-body-bytes",
        "1024",
        "--max-mailbox-events",
        "1",
        "--event-time-max",
        "2s",
    ]);
    let server = dev(dir.path(), &args);

    // Bodies over the limit: announced, or streamed (chunked) without a length.
    let announced = request(
        &server.addr,
        "POST",
        "/demo/counter/l/increment",
        &[],
        &[b'x'; 2000],
    );
    assert_eq!(
        (announced.status, announced.json_code().as_str()),
        (413, "body_too_large")
    );
    let mut chunked = Vec::new();
    for _ in 0..4 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b'y'; 1024]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let streamed = request(
        &server.addr,
        "POST",
        "/demo/counter/l/increment",
        &[("transfer-encoding", "chunked")],
        &chunked,
    );
    assert_eq!(
        (streamed.status, streamed.json_code().as_str()),
        (413, "body_too_large")
    );
    assert_eq!(count(&server, "l"), 0, "a refused body changed the actor");

    // A guest that allocates without bound is stopped; the next event gets a fresh instance.
    let hog = server.req("GET", "/demo/hog/h/hog");
    assert_eq!(
        (hog.status, hog.json_code().as_str()),
        (500, "guest_failed")
    );
    assert_eq!(server.req("GET", "/demo/hog/h/count").text(), "1");

    // A spinning guest is stopped at the event time limit; meanwhile its
    // mailbox (room for 1) refuses extra events with 503, and other actors serve.
    let before = server.metric("wasmkeep_events_total");
    let addr = server.addr.clone();
    let spin = std::thread::spawn(move || request(&addr, "GET", "/demo/spin/s/spin", &[], b""));
    server.wait_until("the spin event starts", |s| {
        s.metric("wasmkeep_events_total") > before
    });
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let addr = server.addr.clone();
            std::thread::spawn(move || request(&addr, "GET", "/demo/spin/s/count", &[], b""))
        })
        .collect();
    assert_eq!(
        server.req("POST", "/demo/counter/l/increment").text(),
        "1",
        "another actor is served"
    );
    let statuses: Vec<(u16, Option<String>)> = waiting
        .into_iter()
        .map(|t| {
            let r = t.join().unwrap();
            (r.status, r.header("retry-after").map(str::to_owned))
        })
        .collect();
    assert!(
        statuses
            .iter()
            .any(|(status, retry)| *status == 503 && retry.is_some()),
        "no 503 with Retry-After from a full mailbox: {statuses:?}"
    );
    let spun = spin.join().unwrap();
    assert_eq!(
        (spun.status, spun.json_code().as_str()),
        (500, "guest_failed"),
        "{}",
        spun.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_per_actor_are_limited() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || dev(&d, &["--max-sockets-per-actor", "1"]))
        .await
        .unwrap();
    let url = format!("ws://{}/demo/counter/full/ws", server.addr);
    let (_first, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    match tokio_tungstenite::connect_async(&url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
            assert!(response.headers().contains_key("retry-after"));
        }
        other => panic!("a second socket was not refused: {other:?}"),
    }
    // Another actor still accepts sockets.
    let other = format!("ws://{}/demo/counter/free/ws", server.addr);
    assert!(tokio_tungstenite::connect_async(&other).await.is_ok());
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

/// An actor activated by one event drops its instance as soon as that event
/// is done, with a long instance idle timeout (below the idle timeout, 30 s:
/// at or above it instances are never dropped); from its second event on it
/// keeps the instance for the timeout.
#[test]
fn an_actor_with_one_event_drops_its_instance_at_once_a_busy_one_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--instance-idle-timeout", "20s"]);
    let unloads = |s: &Server| s.metric("wasmkeep_instance_unloads_total");
    let r = server.req("POST", "/demo/counter/once/increment");
    assert_eq!((r.status, r.text()), (200, "1".to_owned()));
    server.wait_until("the instance of the one-event actor is unloaded", |s| {
        unloads(s) >= 1.0
    });
    // Its second and later events run on an instance it then keeps.
    for n in 2..=4 {
        let r = server.req("POST", "/demo/counter/once/increment");
        assert_eq!((r.status, r.text()), (200, n.to_string()));
    }
    let r = server.req("GET", "/demo/counter/once/value");
    assert_eq!((r.status, r.text()), (200, "4".to_owned()));
    assert_eq!(unloads(&server), 1.0, "a busy actor dropped its instance");
    assert_eq!(server.metric("wasmkeep_resident_actors"), 1.0);
}

/// The series of an actor's events carry its tenant and class (ADR 0071):
/// two classes and two tenants of one class each count their own, their
/// sum is the node's value, an unknown class makes no series, and the page
/// is the Prometheus text format, every line of it readable.
#[test]
fn metrics_are_labelled_by_tenant_and_class() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    for n in 1..=3 {
        let r = server.req("POST", "/demo/counter/a/increment");
        assert_eq!((r.status, r.text()), (200, n.to_string()));
    }
    let r = server.req("POST", "/acme/counter/b/increment");
    assert_eq!((r.status, r.text()), (200, "1".to_owned()));
    for _ in 0..2 {
        let r = server.req("GET", "/demo/chat/lobby/history");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(server.req("GET", "/demo/nosuch/x").status, 404);

    let page = server.req("GET", "/_wasmkeep/metrics");
    assert_eq!(
        page.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = page.text();
    let of = |name: &str, tenant: &str, class: &str| {
        common::metric_labelled(&text, name, &[("tenant", tenant), ("class", class)])
            .unwrap_or_else(|| panic!("no {name} of {tenant}/{class}:\n{text}"))
    };
    let events = "wasmkeep_events_total";
    assert_eq!(of(events, "demo", "counter"), 3.0);
    assert_eq!(of(events, "acme", "counter"), 1.0);
    assert_eq!(of(events, "demo", "chat"), 2.0);
    assert_eq!(common::metric_in(&text, events), 6.0, "the node's value");
    for (tenant, class) in [("demo", "counter"), ("acme", "counter"), ("demo", "chat")] {
        assert_eq!(of("wasmkeep_activations_total", tenant, class), 1.0);
        assert_eq!(of("wasmkeep_resident_actors", tenant, class), 1.0);
        assert_eq!(
            of("wasmkeep_event_seconds_count", tenant, class),
            of(events, tenant, class)
        );
        assert_eq!(
            of("wasmkeep_sql_seconds_count", tenant, class),
            of(events, tenant, class),
            "each guest event's SQL time is observed"
        );
    }
    assert!(of("wasmkeep_sql_seconds_sum", "demo", "counter") > 0.0);
    // Each increment waited on its write; a read of nothing waited on none.
    assert_eq!(of("wasmkeep_commit_seconds_count", "demo", "counter"), 3.0);
    assert_eq!(of("wasmkeep_commit_seconds_count", "demo", "chat"), 0.0);
    // A class the node does not serve is refused before any stub: it
    // makes no series of its own.
    assert_eq!(
        common::metric_labelled(&text, events, &[("tenant", "demo"), ("class", "nosuch")]),
        None
    );
    assert_eq!(of(events, "_other", "_other"), 0.0);
    // Node-level series stay unlabelled.
    assert_eq!(
        common::metric_labelled(&text, "wasmkeep_lease_renewal_failures_total", &[]),
        Some(0.0)
    );

    // The text format: each family's HELP and TYPE once, then its samples,
    // every sample line `name{labels} value` of a declared family.
    let mut declared = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(declared.insert(name, kind).is_none(), "twice: {line}");
        } else if !line.starts_with("# HELP ") {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|f| declared.get(f) == Some(&"histogram"))
                })
                .unwrap_or(name);
            assert!(declared.contains_key(family), "undeclared: {line}");
            let value = line.rsplit_once(' ').unwrap().1;
            assert!(value.parse::<f64>().is_ok(), "not a value: {line}");
        }
    }
    assert_eq!(declared.get(events), Some(&"counter"));
    assert_eq!(declared.get("wasmkeep_commit_seconds"), Some(&"histogram"));
}

#[test]
fn an_idle_actor_drops_its_instance_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &["--instance-idle-timeout", "100ms"]);
    let r = server.req("POST", "/demo/counter/idle/increment");
    assert_eq!((r.status, r.text()), (200, "1".to_owned()));
    server.wait_until("the idle instance is unloaded", |s| {
        s.metric("wasmkeep_instance_unloads_total") >= 1.0
    });
    assert_eq!(server.metric("wasmkeep_resident_actors"), 1.0);
    let r = server.req("POST", "/demo/counter/idle/increment");
    assert_eq!((r.status, r.text()), (200, "2".to_owned()));
}

/// A tmpfs of a few MiB mounted at a folder (needs root), unmounted when
/// dropped: a disk that fills up without touching the machine's own.
struct SmallDisk {
    at: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(at: &std::path::Path, mib: u64) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then(|| SmallDisk { at: at.to_owned() })
    }

    /// Writes a file until the disk refuses (ENOSPC); returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write as _;
        let path = self.at.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5a_u8; 64 * 1024];
        let full = loop {
            if let Err(e) = file.write_all(&chunk) {
                break e;
            }
        };
        assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "{full}");
        // What does not fit in 64 KiB may still fit in smaller writes.
        for size in [4096, 512, 1] {
            while file.write_all(&chunk[..size]).is_ok() {}
        }
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
    }
}

/// The folder bucket's disk fills up under load: writes that cannot be made
/// durable answer 503 `unavailable` (never 200, never 500), the node serves
/// again by itself once space is freed, and neither then nor after a kill -9
/// and a restart is an acknowledged increment missing (nor one more than
/// was attempted).
#[test]
fn a_full_disk_answers_503_loses_nothing_acknowledged_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("bucket"), 64) else {
        assert!(
            std::env::var_os("WASMKEEP_REQUIRE_MOUNT").is_none(),
            "WASMKEEP_REQUIRE_MOUNT is set but a tmpfs cannot be mounted (root only)"
        );
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    };
    let server = dev(dir.path(), &[]);
    for n in 1..=3 {
        let r = server.req("POST", "/demo/counter/alice/increment");
        assert_eq!((r.status, r.text()), (200, n.to_string()));
    }

    // Sixteen clients, one actor each, increment in a loop; the disk fills
    // up under them once 320 increments are acknowledged between them, and
    // they go on until the node has refused some (a bound fails the test).
    const CLIENTS: usize = 16;
    const ATTEMPTS_MAX: u64 = 200_000;
    let acked_total = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let addr = server.addr.clone();
            let (acked_total, refused, attempts, stop) = (
                Arc::clone(&acked_total),
                Arc::clone(&refused),
                Arc::clone(&attempts),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let path = format!("/demo/counter/c{client}/increment");
                let (mut acked, mut attempted) = (0_u64, 0_u64);
                while !stop.load(Ordering::SeqCst)
                    && attempts.fetch_add(1, Ordering::SeqCst) < ATTEMPTS_MAX
                {
                    attempted += 1;
                    let r = request(&addr, "POST", &path, &[], b"");
                    match r.status {
                        200 => {
                            acked += 1;
                            acked_total.fetch_add(1, Ordering::SeqCst);
                        }
                        503 => {
                            assert_eq!(r.json_code(), "unavailable", "{}", r.text());
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("{path}: {other} {}", r.text()),
                    }
                }
                (acked, attempted)
            })
        })
        .collect();
    let bounded = |what: &str, done: &dyn Fn() -> bool| {
        while !done() {
            assert!(
                attempts.load(Ordering::SeqCst) < ATTEMPTS_MAX,
                "{ATTEMPTS_MAX} increments and still not {what}:\n{}",
                server.logs()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    bounded("320 acknowledged", &|| {
        acked_total.load(Ordering::SeqCst) >= 320
    });
    let filler = disk.fill();
    // Writes that still fit (the journal's pages written ahead) are
    // acknowledged; those that do not are refused.
    bounded("refused", &|| refused.load(Ordering::SeqCst) > 0);
    stop.store(true, Ordering::SeqCst);
    let counts: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    // Space comes back: the node serves again without a restart.
    std::fs::remove_file(&filler).unwrap();
    server.wait_until("an increment after space was freed", |s| {
        s.req("POST", "/demo/counter/alice/increment").status == 200
    });
    let alice = count(&server, "alice");
    assert!(alice >= 4, "alice lost acknowledged increments: {alice}");
    let check = |server: &Server| {
        for (client, (acked, attempted)) in counts.iter().enumerate() {
            let n = count(server, &format!("c{client}"));
            assert!(
                (*acked..=*attempted).contains(&n),
                "c{client}: {n} outside acknowledged {acked} ..= attempted {attempted}"
            );
        }
    };
    check(&server);

    server.kill();
    let server = dev(dir.path(), &[]);
    check(&server);
    assert_eq!(count(&server, "alice"), alice, "alice after a kill -9");
    drop(server);
}

/// A second process given a node id that a live process uses is refused,
/// from another data dir (another machine) and from the same one; the
/// first keeps serving. A process killed with SIGKILL leaves its heartbeat:
/// a restart on its data dir takes the node id back without watching it,
/// one from elsewhere watches it for a lease TTL first (ADR 0054).
#[test]
fn a_node_id_in_use_is_refused_and_a_dead_processes_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let out = std::process::Command::new(common::BIN)
        .args(["deploy", "counter", guest("counter").to_str().unwrap()])
        .args(["--bucket", &bucket])
        .args(["--data-dir", common::data_dir().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = dir.path().join("data-own");
    let elsewhere = dir.path().join("data-elsewhere");
    let args = [
        "serve",
        "--bucket",
        &bucket,
        "--node-id",
        "n1",
        "--lease-ttl",
        "2s",
        "--heartbeat",
        "200ms",
    ];
    let first = Server::start_with_data_dir(dir.path(), &args, &own);
    assert_eq!(first.req("POST", "/demo/counter/x/increment").text(), "1");
    for data in [&elsewhere, &own] {
        let listen = format!("127.0.0.1:{}", common::free_port());
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .args(["--listen", &listen, "--data-dir", data.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second n1 started:\n{stderr}");
        assert!(stderr.contains("node id n1 is in use"), "{stderr}");
    }
    assert_eq!(first.req("POST", "/demo/counter/x/increment").text(), "2");

    first.kill();
    let again = Server::start_with_data_dir(dir.path(), &args, &own);
    assert_eq!(again.req("POST", "/demo/counter/x/increment").text(), "3");
    assert!(
        !again.logs().contains("waiting to see whether"),
        "{}",
        again.logs()
    );
    again.kill();
    let moved = Server::start_with_data_dir(dir.path(), &args, &elsewhere);
    assert_eq!(moved.req("POST", "/demo/counter/x/increment").text(), "4");
    assert!(
        moved.logs().contains("waiting to see whether"),
        "{}",
        moved.logs()
    );
    assert!(moved.stop(), "a clean stop");
}

/// A call still waiting when its caller's event is nearly out of time
/// fails in the caller, which then answers; without it the caller would be
/// stopped at its limit, still waiting (the callee here spins until its own
/// limit, which comes later than the caller's).
#[test]
fn a_call_that_outlasts_its_callers_time_fails_in_time_for_the_caller_to_answer() {
    let dir = tempfile::tempdir().unwrap();
    let guests: Vec<String> = [("ks", "kitchen-sink"), ("spin", "spin")]
        .iter()
        .map(|(class, g)| format!("{class}={}", guest(g).display()))
        .collect();
    let mut args: Vec<&str> = guests.iter().map(String::as_str).collect();
    args.extend(["--event-time-max", "2s"]);
    let server = dev(dir.path(), &args);
    let answered = server.req("POST", "/demo/ks/a/call?class=spin&name=b&path=/spin");
    assert_eq!(answered.status, 502, "{}", answered.text());
    assert!(
        answered.text().contains("call to spin/b timed out"),
        "{}",
        answered.text()
    );
}

/// `wasmkeep actor delete` empties an actor's database and removes its alarm
/// and ownership record, resident (its holder deletes it) or not (a node
/// acquires it to delete it); its next event starts an empty actor and
/// other actors are untouched. An id with no actor, or no id, is refused (ADR 0055).
#[test]
fn actor_delete_removes_one_actor_resident_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let counter = format!("counter={}", guest("counter").display());
    let args = [counter.as_str(), "--heartbeat", "200ms"];
    let cli = |args: &[&str]| {
        std::process::Command::new(common::BIN)
            .args(args)
            .args(["--bucket", &bucket])
            .output()
            .unwrap()
    };
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let server = dev(dir.path(), &args);
    for _ in 0..3 {
        server.req("POST", "/demo/counter/alice/increment");
    }
    assert_eq!(
        server
            .req("POST", "/demo/counter/alice/alarm?in_ms=600000")
            .status,
        200
    );
    assert_eq!(
        server.req("POST", "/demo/counter/bob/increment").text(),
        "1"
    );

    let deleted = cli(&["actor", "delete", "demo/counter/alice", "--wait"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert!(stderr(&deleted).contains("deleted"), "{}", stderr(&deleted));
    let inspected = cli(&["actor", "inspect", "demo/counter/alice"]);
    assert!(
        !inspected.status.success() && stderr(&inspected).contains("nothing in the bucket"),
        "alice has data, a record or an alarm left: {}",
        String::from_utf8_lossy(&inspected.stdout)
    );
    assert_eq!(server.metric("wasmkeep_actors_deleted_total"), 1.0);
    assert_eq!(server.req("GET", "/demo/counter/alice/value").text(), "0");
    assert_eq!(
        server.req("POST", "/demo/counter/alice/increment").text(),
        "1"
    );
    assert_eq!(server.req("GET", "/demo/counter/alice/alarms").text(), "0");
    assert_eq!(server.req("GET", "/demo/counter/bob/value").text(), "1");

    // After a restart nothing is resident: the node acquires bob to delete it.
    assert!(server.stop(), "a clean stop");
    let server = dev(dir.path(), &args);
    let deleted = cli(&["actor", "delete", "demo/counter/bob", "--wait"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert_eq!(server.metric("wasmkeep_actors_deleted_total"), 1.0);
    assert_eq!(server.req("GET", "/demo/counter/bob/value").text(), "0");
    assert_eq!(server.req("GET", "/demo/counter/alice/value").text(), "1");

    let missing = cli(&["actor", "delete", "demo/counter/nobody"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("does not exist"),
        "{}",
        stderr(&missing)
    );
    let malformed = cli(&["actor", "delete", "Demo/counter"]);
    assert!(!malformed.status.success());
    assert!(
        stderr(&malformed).contains("not an actor id"),
        "{}",
        stderr(&malformed)
    );
}

/// Deleting an actor closes its WebSockets with 1000 ("actor deleted").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_delete_closes_the_actors_websockets_normally() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let counter = format!("counter={}", guest("counter").display());
    let server = dev_async(dir.path(), &[&counter, "--heartbeat", "200ms"]).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/demo/counter/w/ws", server.addr))
            .await
            .unwrap();
    ws.send(Message::text("inc")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("1"));
    let bucket = folder_bucket(dir.path());
    let deleting = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::BIN)
            .args([
                "actor",
                "delete",
                "demo/counter/w",
                "--wait",
                "--bucket",
                &bucket,
            ])
            .output()
            .unwrap()
    });
    assert_eq!(close_code(&mut ws).await, Some(1000));
    let out = deleting.await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A command that only reads (or writes an operator's request) refuses a
/// folder bucket that does not exist, and creates nothing: a mistyped path
/// no longer looks like an empty cluster.
#[test]
fn views_refuse_a_missing_folder_bucket_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let bucket = format!("file://{}", missing.display());
    for args in [
        &["node", "list"][..],
        &["actor", "list"][..],
        &["actor", "inspect", "demo/counter/a"][..],
        &["actor", "delete", "demo/counter/a"][..],
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .args(["--bucket", &bucket])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains("does not exist"), "{args:?}: {stderr}");
        assert!(!missing.exists(), "{args:?} created the folder");
    }
}

/// A text message that is not UTF-8 fails the socket with 1007 (RFC 6455
/// 8.1; it used to end without a close frame); the actor serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_message_that_is_not_utf8_closes_the_socket_with_1007() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

    let dir = tempfile::tempdir().unwrap();
    let counter = format!("counter={}", guest("counter").display());
    let server = dev_async(dir.path(), &[&counter]).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/demo/counter/u/ws", server.addr))
            .await
            .unwrap();
    ws.send(Message::text("inc")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("1"));
    let invalid = Frame::message(vec![0x69, 0xff, 0xfe], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(invalid)).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1007));
    let addr = server.addr.clone();
    let value = tokio::task::spawn_blocking(move || {
        request(&addr, "GET", "/demo/counter/u/value", &[], b"").text()
    })
    .await
    .unwrap();
    assert_eq!(value, "1");
}

/// One kind of hostile event: four actors run it at once (more than the
/// node has async workers).
struct Hostile {
    what: &'static str,
    class: &'static str,
    path: &'static str,
    body: &'static str,
    /// A statement run first on each actor.
    setup: Option<&'static str>,
    /// What the error answer says (a statement stopped at its time, or
    /// its event: a statement may run as long as its event).
    says: &'static str,
    /// It runs until its time is up (else it fails at once).
    long: bool,
}

const CTE: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)";

/// Guests that run the worst statements a tenant can write, loop forever
/// or allocate to their limit (issue 52, ADR 0063): while four actors run
/// each at once, another actor keeps answering and the node keeps renewing
/// its lease (2 s, renewed every 250 ms: a node whose async workers were
/// held for the 3 s a statement may run would lose it); each ends with a
/// clear error to its caller, and every actor works afterwards.
#[test]
fn hostile_guests_leave_other_actors_and_the_lease_alone() {
    let dir = tempfile::tempdir().unwrap();
    let guests: Vec<String> = [
        ("counter", "counter"),
        ("ks", "kitchen-sink"),
        ("spin", "spin"),
        ("hog", "hog"),
    ]
    .iter()
    .map(|(class, g)| format!("{class}={}", guest(g).display()))
    .collect();
    let mut args: Vec<&str> = guests.iter().map(String::as_str).collect();
    args.extend([
        "--event-time-max",
        "3s",
        "--heartbeat",
        "250ms",
        "--lease-ttl",
        "2s",
    ]);
    let server = dev(dir.path(), &args);
    let recursive = format!("{CTE} SELECT count(*) FROM c");
    let cross = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) \
                 SELECT count(*) FROM c AS a, c AS b";
    let write = format!("INSERT INTO w (x) {CTE} SELECT count(*) FROM c");
    let huge = format!("{CTE} SELECT length(group_concat(zeroblob(1000000))) FROM c");
    let big = "CREATE TABLE big AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200000) \
               SELECT x, zeroblob(1000) AS pad FROM c";
    let kinds = [
        Hostile {
            what: "an unbounded recursive query",
            class: "ks",
            path: "/sql/run?rows=1",
            body: Box::leak(recursive.into_boxed_str()),
            setup: None,
            says: "ran longer than",
            long: true,
        },
        Hostile {
            what: "a cross join of a million rows with itself",
            class: "ks",
            path: "/sql/run?rows=1",
            body: cross,
            setup: None,
            says: "ran longer than",
            long: true,
        },
        Hostile {
            what: "a write that loops",
            class: "ks",
            path: "/sql/run",
            body: Box::leak(write.into_boxed_str()),
            setup: Some("CREATE TABLE IF NOT EXISTS w (x)"),
            says: "ran longer than",
            long: true,
        },
        Hostile {
            what: "a value that grows without end",
            class: "ks",
            path: "/sql/run?rows=1",
            body: Box::leak(huge.into_boxed_str()),
            setup: None,
            says: "statement_memory_max",
            long: false,
        },
        Hostile {
            what: "a table of 200 MB made by one statement",
            class: "ks",
            path: "/sql/run",
            body: big,
            setup: None,
            says: "record_bytes_max",
            long: false,
        },
        Hostile {
            what: "a guest that loops forever",
            class: "spin",
            path: "/spin",
            body: "",
            setup: None,
            says: "guest_failed",
            long: true,
        },
        Hostile {
            what: "a guest that allocates to its limit",
            class: "hog",
            path: "/hog",
            body: "",
            setup: None,
            says: "guest_failed",
            long: false,
        },
    ];
    let mut increments = 0;
    for (k, kind) in kinds.iter().enumerate() {
        let actors: Vec<String> = (0..4)
            .map(|i| format!("/demo/{}/h{k}-{i}", kind.class))
            .collect();
        if let Some(setup) = kind.setup {
            for actor in &actors {
                let done = request(
                    &server.addr,
                    "POST",
                    &format!("{actor}/sql/run"),
                    &[],
                    setup.as_bytes(),
                );
                assert_eq!(done.status, 200, "{}: {}", kind.what, done.text());
            }
        }
        let events_before = server.metric("wasmkeep_events_total");
        let running: Vec<_> = actors
            .iter()
            .map(|actor| {
                let (addr, path, body) = (
                    server.addr.clone(),
                    format!("{actor}{}", kind.path),
                    kind.body,
                );
                std::thread::spawn(move || request(&addr, "POST", &path, &[], body.as_bytes()))
            })
            .collect();
        if kind.long {
            server.wait_until("the hostile events start", |s| {
                s.metric("wasmkeep_events_total") >= events_before + 4.0
            });
            let renewals = server.metric("wasmkeep_lease_renewals_total");
            for _ in 0..20 {
                increments += 1;
                let r = server.req("POST", "/demo/counter/bystander/increment");
                assert_eq!(
                    (r.status, r.text()),
                    (200, increments.to_string()),
                    "{}",
                    kind.what
                );
            }
            server.wait_until("the lease is renewed four times", |s| {
                s.metric("wasmkeep_lease_renewals_total") >= renewals + 4.0
            });
            if let Some(ended) = running
                .iter()
                .position(std::thread::JoinHandle::is_finished)
            {
                let ended = running.into_iter().nth(ended).unwrap().join().unwrap();
                panic!(
                    "{}: a hostile event ended before the others were served: {} {}\n{}",
                    kind.what,
                    ended.status,
                    ended.text(),
                    server.logs()
                );
            }
        }
        for t in running {
            let r = t.join().unwrap();
            assert_eq!(r.status, 500, "{}: {}", kind.what, r.text());
            assert!(r.text().contains(kind.says), "{}: {}", kind.what, r.text());
        }
        increments += 1;
        let r = server.req("POST", "/demo/counter/bystander/increment");
        assert_eq!(
            (r.status, r.text()),
            (200, increments.to_string()),
            "{}",
            kind.what
        );
        for actor in &actors {
            let (path, body) = match kind.class {
                "ks" => (format!("{actor}/sql/run?rows=1"), "SELECT 1"),
                _ => (format!("{actor}/count"), ""),
            };
            let r = request(&server.addr, "POST", &path, &[], body.as_bytes());
            assert_eq!(r.status, 200, "{} then: {}", kind.what, r.text());
        }
    }
    assert_eq!(server.metric("wasmkeep_lease_renewal_failures_total"), 0.0);
    assert!(server.metric("wasmkeep_sql_statements_off_worker_total") >= 12.0);
}

/// Runs one statement as kitchen-sink actor `name`'s own (`/sql/run`).
fn run_sql(server: &Server, name: &str, statement: &str) -> common::Resp {
    let path = format!("/demo/ks/{name}/sql/run");
    request(&server.addr, "POST", &path, &[], statement.as_bytes())
}

/// A statement that makes a table of `rows` rows of about one page each.
fn table_of_pages(rows: u32) -> String {
    format!(
        "CREATE TABLE t AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {rows}) \
         SELECT zeroblob(4000) AS pad FROM c"
    )
}

/// A class's database maximum is the deploy's word (ADR 0064): redeployed
/// with a smaller one, the class's next actors are held to it, with an
/// error that names it; a maximum below the floor is refused and changes
/// nothing.
#[test]
fn a_class_deployed_with_a_database_maximum_holds_its_actors_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(dir.path(), &[ks.as_str(), "--heartbeat", "250ms"]);
    let bucket = folder_bucket(dir.path());
    let deploy = |max: &str| {
        std::process::Command::new(common::BIN)
            .args(["deploy", "ks", guest("kitchen-sink").to_str().unwrap()])
            .args(["--bucket", &bucket, "--app", "default"])
            .args(["--data-dir", common::data_dir().to_str().unwrap()])
            .args(["--database-max-bytes", max])
            .output()
            .unwrap()
    };
    let refused = deploy("100");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("at least 65536 bytes"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // 1 MiB of rows fits the default maximum.
    let fill = table_of_pages(256);
    let first = run_sql(&server, "before", &fill);
    assert_eq!(first.status, 200, "{}", first.text());
    let redeployed = deploy("262144");
    assert!(
        redeployed.status.success(),
        "{}",
        String::from_utf8_lossy(&redeployed.stderr)
    );
    // The node reads the new maximum at a heartbeat; each try is a new actor.
    let mut tries = 0;
    server.wait_until("a new actor of the class is held to 256 KiB", |s| {
        tries += 1;
        let r = run_sql(s, &format!("after-{tries}"), &fill);
        r.status == 500
            && r.text()
                .contains("the database reached its class's maximum (262144 bytes)")
    });
    assert_eq!(run_sql(&server, "small", "CREATE TABLE s (x)").status, 200);
}

/// The node's cap on the memory of all its actors' databases
/// (`--max-database-memory`, ADR 0064): a write past it fails clearly, and
/// the node serves on.
#[test]
fn a_write_past_the_nodes_database_memory_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let server = dev(
        dir.path(),
        &[ks.as_str(), "--max-database-memory", "4194304"],
    );
    let fill = table_of_pages(2000);
    let refused = run_sql(&server, "big", &fill);
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("this node's memory for actor databases is full"),
        "{}",
        refused.text()
    );
    assert_eq!(run_sql(&server, "small", "CREATE TABLE s (x)").status, 200);
    assert!(server.metric("wasmkeep_database_bytes") < 4_194_304.0);
}

/// `wasmkeep actor ARGS --bucket BUCKET`: whether it succeeded, its stdout
/// and its stderr.
fn actor_cli(bucket: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(common::BIN)
        .args(["actor"])
        .args(args)
        .args(["--bucket", bucket])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `wasmkeep actor sql` and `actor export` read an actor's data from the
/// bucket while its node serves it (ADR 0065): the rows as a table or
/// JSON, a file SQLite opens; a statement that writes, bad SQL, an actor
/// with no data and an existing file are refused clearly and change
/// nothing.
#[test]
fn actor_sql_and_export_read_an_actors_data_from_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let server = dev(dir.path(), &[]);
    for expected in 1..=3 {
        let r = server.req("POST", "/demo/counter/seen/increment");
        assert_eq!(r.text(), expected.to_string());
    }
    let bucket = folder_bucket(dir.path());
    let cli = |args: &[&str]| actor_cli(&bucket, args);
    let (ok, table, err) = cli(&[
        "sql",
        "demo/counter/seen",
        "SELECT n, 'x' AS t, NULL AS z FROM counter",
    ]);
    assert!(ok, "{err}");
    assert_eq!(table, "n  t  z\n3  x  NULL\n");
    let (ok, json, err) = cli(&[
        "sql",
        "demo/counter/seen",
        "SELECT n FROM counter",
        "--json",
    ]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json, serde_json::json!({"columns": ["n"], "rows": [[3]]}));
    for (args, says) in [
        (
            ["sql", "demo/counter/seen", "UPDATE counter SET n = 0"],
            "read-only",
        ),
        (["sql", "demo/counter/seen", "SELEKT 1"], "syntax error"),
        (
            ["sql", "demo/counter/nobody", "SELECT 1"],
            "has nothing in the bucket",
        ),
        (["sql", "not-an-actor", "SELECT 1"], "not an actor id"),
    ] {
        let (ok, _, err) = cli(&args);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(
        count(&server, "seen"),
        3,
        "a refused statement changed the actor"
    );

    let file = dir.path().join("seen.sqlite");
    let (ok, _, err) = cli(&["export", "demo/counter/seen", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    let exported = rusqlite::Connection::open(&file).unwrap();
    let n: i64 = exported
        .query_row("SELECT n FROM counter", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
    let (ok, _, err) = cli(&["export", "demo/counter/seen", file.to_str().unwrap()]);
    assert!(
        !ok && err.contains("an existing file is left alone"),
        "{err}"
    );
    assert_eq!(
        server.req("POST", "/demo/counter/seen/increment").text(),
        "4"
    );
}

/// `actor sql --write` (ADR 0065, amended): the holder runs the statement
/// as an event, the guest sees its writes, a refused statement writes
/// nothing, a hibernated actor is activated for it, and a request carried
/// out again (same key) answers its recorded result without writing twice.
#[test]
fn actor_sql_write_runs_once_on_the_holder_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    // A node sees requests at its heartbeat.
    let fast = ["--heartbeat", "300ms"];
    let server = dev(dir.path(), &fast);
    for _ in 0..3 {
        server.req("POST", "/demo/counter/w/increment");
    }
    let bucket = folder_bucket(dir.path());
    let sql = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .args(["actor", "sql", "demo/counter/w"])
            .args(args)
            .args(["--write", "--bucket", &bucket])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = sql(&["UPDATE counter SET n = n + 10"]);
    assert!(ok && err.contains("committed; 1 rows changed"), "{err}");
    assert_eq!(
        count(&server, "w"),
        13,
        "the guest sees the operator's write"
    );
    let (ok, json, err) = sql(&["UPDATE counter SET n = n + 1 RETURNING n", "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["rows"], serde_json::json!([[14]]));
    assert_eq!(json["changes"], 1);
    for (statement, says) in [
        ("UPDATE nope SET x = 1", "no such table"),
        ("DELETE FROM _wasmkeep_alarm", "_wasmkeep"),
        ("SELEKT 1", "syntax error"),
    ] {
        let (ok, _, err) = sql(&[statement]);
        assert!(
            !ok && err.contains(says) && err.contains("nothing was written"),
            "{statement}: {err}"
        );
    }
    assert_eq!(count(&server, "w"), 14);
    assert!(server.stop());

    // Nobody holds the actor now: the node's pass activates it.
    let server = dev(dir.path(), &fast);
    let (ok, _, err) = sql(&["UPDATE counter SET n = n * 2"]);
    assert!(ok, "{err}");
    assert_eq!(count(&server, "w"), 28);

    // The same request twice (as when a node stops after the commit and
    // before it reports): the second answers the first's result.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = wasmkeep_bucket::open(&bucket).await.unwrap();
        let keys = wasmkeep_types::Keys::new(&wasmkeep_types::AppName::new("default").unwrap());
        let actor = wasmkeep_types::ActorId::parse("demo/counter/w").unwrap();
        let key = keys.sql_key(&actor, "00aa").unwrap();
        let result_key = keys.sql_result_key(&actor, "00aa").unwrap();
        let mut results = Vec::new();
        for _ in 0..2 {
            store
                .put(
                    &key,
                    bytes::Bytes::from_static(b"UPDATE counter SET n = n + 100"),
                )
                .await
                .unwrap();
            let deadline = std::time::Instant::now() + common::WAIT_MAX;
            let result = loop {
                if let Ok(object) = store.get(&result_key).await {
                    break object.bytes;
                }
                assert!(std::time::Instant::now() < deadline, "no result");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            };
            store.delete(&result_key).await.unwrap();
            results.push(result);
        }
        assert_eq!(results[0], results[1]);
    });
    assert_eq!(count(&server, "w"), 128, "the statement ran once");
}

/// `actor import` (ADR 0069): an exported database goes into an actor with
/// no data and serves at once, with its alarm; into an actor with data
/// only with `--replace`, resident (its holder hands it over first) or
/// unheld; a file that is not a sound SQLite database of ours is refused
/// before anything is written; and a request carried out again (same key)
/// does not replace what the actor wrote since.
#[test]
fn actor_import_puts_an_exported_database_in_place() {
    let dir = tempfile::tempdir().unwrap();
    // A node sees requests at its heartbeat.
    let fast = ["--heartbeat", "300ms"];
    let server = dev(dir.path(), &fast);
    for _ in 0..3 {
        server.req("POST", "/demo/counter/source/increment");
    }
    let alarm = server.req("POST", "/demo/counter/source/alarm?in_ms=3600000");
    assert_eq!(alarm.status, 200, "{}", alarm.text());
    let alarm_ms: i64 = alarm.text().trim().parse().unwrap();
    let bucket = folder_bucket(dir.path());
    let cli = |args: &[&str]| actor_cli(&bucket, args);
    let file = dir.path().join("source.sqlite");
    let path = file.to_str().unwrap();
    let (ok, _, err) = cli(&["export", "demo/counter/source", path]);
    assert!(ok, "{err}");

    // Into an actor with no data: it serves the file's rows and alarm.
    let (ok, json, err) = cli(&["import", "demo/counter/copy", path, "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["alarm_ms"], alarm_ms, "{json}");
    assert_eq!(json["replaced"], false, "{json}");
    assert_eq!(count(&server, "copy"), 3);
    assert_eq!(
        server.req("POST", "/demo/counter/copy/increment").text(),
        "4"
    );
    let (ok, inspected, err) = cli(&["inspect", "demo/counter/copy", "--json"]);
    assert!(ok, "{err}");
    assert!(inspected.contains(&alarm_ms.to_string()), "{inspected}");

    // Into an actor with data: only with --replace.
    let (ok, _, err) = cli(&["import", "demo/counter/copy", path]);
    assert!(
        !ok && err.contains("has data") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(count(&server, "copy"), 4);
    let (ok, _, err) = cli(&["import", "demo/counter/copy", path, "--replace"]);
    assert!(ok && err.contains("imported"), "{err}");
    assert_eq!(count(&server, "copy"), 3, "the resident actor was replaced");

    // Files that are not sound databases of ours: refused, nothing written.
    let good = std::fs::read(&file).unwrap();
    let mut wal = good.clone();
    (wal[18], wal[19]) = (2, 2);
    let mut noise = good.clone();
    let last = noise.len() - 4096;
    noise[last..last + 64].fill(0x5a);
    let bad_file = dir.path().join("bad.sqlite");
    for (bytes, says) in [
        (b"not a database".to_vec(), "not a SQLite database"),
        (good[..good.len() - 100].to_vec(), "whole number of pages"),
        (wal, "WAL"),
        (noise, "SQLite"),
    ] {
        std::fs::write(&bad_file, &bytes).unwrap();
        let (ok, _, err) = cli(&[
            "import",
            "demo/counter/copy",
            bad_file.to_str().unwrap(),
            "--replace",
        ]);
        assert!(
            !ok && err.contains(says) && err.contains("nothing was written"),
            "{says}: {err}"
        );
    }
    let (ok, _, err) = cli(&["import", "demo/counter/copy", "/nonexistent/file"]);
    assert!(!ok && err.contains("reading /nonexistent/file"), "{err}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let keys = wasmkeep_types::Keys::new(&wasmkeep_types::AppName::new("default").unwrap());
    let requests = rt.block_on(async {
        let store = wasmkeep_bucket::open(&bucket).await.unwrap();
        store.list(&keys.imports_prefix()).await.unwrap()
    });
    assert!(requests.is_empty(), "a refused import wrote {requests:?}");
    assert_eq!(count(&server, "copy"), 3);

    // Nobody holds the actor: the node's pass acquires it and imports.
    for _ in 0..2 {
        server.req("POST", "/demo/counter/source/increment");
    }
    assert!(server.stop());
    let server = dev(dir.path(), &fast);
    let (ok, _, err) = cli(&["import", "demo/counter/source", path, "--replace"]);
    assert!(ok, "{err}");
    assert_eq!(count(&server, "source"), 3);

    // The same request twice (as when a node stops after the import and
    // before it reports): the second finds the actor's data came from it
    // and leaves the writes made since.
    let import_once = || {
        rt.block_on(async {
            let store = wasmkeep_bucket::open(&bucket).await.unwrap();
            let actor = wasmkeep_types::ActorId::parse("demo/counter/again").unwrap();
            let key = keys.import_key(&actor, "00aa").unwrap();
            let result_key = keys.import_result_key(&actor, "00aa").unwrap();
            let mut body = b"wasmkeep-import 1 replace\n".to_vec();
            body.extend_from_slice(&good);
            store.put(&key, bytes::Bytes::from(body)).await.unwrap();
            let deadline = std::time::Instant::now() + common::WAIT_MAX;
            let result = loop {
                if let Ok(object) = store.get(&result_key).await {
                    break object.bytes;
                }
                assert!(std::time::Instant::now() < deadline, "no result");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            };
            store.delete(&result_key).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&result).unwrap()
        })
    };
    let first = import_once();
    assert_eq!(first["imported"], true, "{first}");
    assert_eq!(
        server.req("POST", "/demo/counter/again/increment").text(),
        "4"
    );
    let second = import_once();
    assert_eq!(second["earlier"], true, "{second}");
    assert_eq!(count(&server, "again"), 4, "the import ran once");
}

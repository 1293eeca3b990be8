//! Every import and export of world `actor`, through the kitchen-sink guest
//! and a host that records what crossed the boundary.

mod common;

use common::{body_text, get, instance, recorder};
use wasmkeep_runtime::{LogLevel, Message, Request, SqlRows, SqlValue};

fn every_value() -> Vec<SqlValue> {
    vec![
        SqlValue::Null,
        SqlValue::Integer(i64::MIN),
        SqlValue::Real(-0.25),
        SqlValue::Text("héllo ✓".into()),
        SqlValue::Blob(vec![0, 1, 255]),
    ]
}

#[tokio::test]
async fn handle_passes_the_whole_request_and_response() {
    let mut actor = instance("kitchen-sink", "echo").await;
    let request = Request {
        method: "PUT".into(),
        path: "/echo?q=1".into(),
        headers: vec![("x-a".into(), "1".into()), ("x-a".into(), "2".into())],
        body: vec![0, 159, 146, 150, 255],
    };
    let response = actor.handle(request.clone()).await.expect("echo");
    assert_eq!(response.status, 200);
    assert_eq!(response.body, request.body);
    assert_eq!(
        response.headers,
        vec![
            ("x-a".to_owned(), "1".to_owned()),
            ("x-a".to_owned(), "2".to_owned()),
            ("x-method".to_owned(), "PUT".to_owned()),
            ("x-path".to_owned(), "/echo?q=1".to_owned()),
        ]
    );
}

#[tokio::test]
async fn sql_execute_carries_every_value_type() {
    let mut actor = instance("kitchen-sink", "sql-execute").await;
    let response = actor.handle(get("/sql/execute")).await.expect("event");
    assert_eq!(
        (response.status, body_text(&response)),
        (200, "5".to_owned())
    );
    let expected = format!(
        "sql.execute INSERT INTO t VALUES (?, ?, ?, ?, ?) {:?}",
        every_value()
    );
    assert_eq!(recorder(&mut actor).calls, vec![expected]);
}

#[tokio::test]
async fn sql_query_returns_rows_of_every_value_type() {
    let mut actor = instance("kitchen-sink", "sql-query").await;
    recorder(&mut actor).sql_rows = SqlRows {
        columns: vec!["n".into(), "i".into(), "r".into(), "t".into(), "b".into()],
        rows: vec![
            vec![
                SqlValue::Null,
                SqlValue::Integer(i64::MAX),
                SqlValue::Real(1.5),
                SqlValue::Text("ü".into()),
                SqlValue::Blob(vec![7, 0]),
            ],
            vec![SqlValue::Integer(-1); 5],
        ],
    };
    let response = actor.handle(get("/sql/query")).await.expect("event");
    assert_eq!(response.status, 200);
    assert_eq!(
        body_text(&response),
        "n,i,r,t,b\nnull,integer(9223372036854775807),real(1.5),text(ü),blob([7, 0])\n\
         integer(-1),integer(-1),integer(-1),integer(-1),integer(-1)"
    );
    let expected = format!("sql.query SELECT * FROM t WHERE a = ? {:?}", every_value());
    assert_eq!(recorder(&mut actor).calls, vec![expected]);
}

#[tokio::test]
async fn sql_errors_reach_the_guest_as_values() {
    let mut actor = instance("kitchen-sink", "sql-error").await;
    recorder(&mut actor).sql_error = Some("no such table: t".into());
    for path in ["/sql/execute", "/sql/query"] {
        let response = actor
            .handle(get(path))
            .await
            .expect("an error value is not a trap");
        assert_eq!(
            (response.status, body_text(&response)),
            (500, "sql error: no such table: t".to_owned())
        );
    }
    // The same instance keeps serving: nothing trapped.
    let response = actor.handle(get("/noop")).await.expect("event");
    assert_eq!(response.status, 204);
}

#[tokio::test]
async fn alarm_get_set_clear_reach_the_host() {
    let mut actor = instance("kitchen-sink", "alarm").await;
    assert_eq!(
        body_text(&actor.handle(get("/alarm/get")).await.expect("get")),
        "none"
    );
    actor
        .handle(get("/alarm/set?at=1700000000123"))
        .await
        .expect("set");
    assert_eq!(recorder(&mut actor).alarm, Some(1_700_000_000_123));
    assert_eq!(
        body_text(&actor.handle(get("/alarm/get")).await.expect("get")),
        "1700000000123"
    );
    actor.handle(get("/alarm/clear")).await.expect("clear");
    assert_eq!(recorder(&mut actor).alarm, None);
    assert_eq!(
        recorder(&mut actor).calls,
        vec![
            "alarm.get",
            "alarm.set 1700000000123",
            "alarm.get",
            "alarm.clear"
        ]
    );
}

#[tokio::test]
async fn sockets_send_close_list_and_tags_reach_the_host() {
    let mut actor = instance("kitchen-sink", "sockets").await;
    recorder(&mut actor).sockets.extend([(3, None), (9, None)]);

    assert_eq!(
        body_text(&actor.handle(get("/sockets/list")).await.expect("list")),
        "3,9"
    );
    let sent = actor
        .handle(get("/sockets/send?id=3&text=hi"))
        .await
        .expect("send");
    assert_eq!(body_text(&sent), "sent");
    let mut binary = get("/sockets/send?id=9");
    binary.body = vec![1, 2, 3];
    actor.handle(binary).await.expect("send binary");
    assert_eq!(
        recorder(&mut actor).sent,
        vec![
            (3, Message::Text("hi".into())),
            (9, Message::Binary(vec![1, 2, 3]))
        ]
    );

    let tagged = actor
        .handle(get("/sockets/set-tag?id=3&tag=bob"))
        .await
        .expect("set-tag");
    assert_eq!(body_text(&tagged), "tagged");
    assert_eq!(
        body_text(
            &actor
                .handle(get("/sockets/get-tag?id=3"))
                .await
                .expect("get-tag")
        ),
        "bob"
    );
    let untagged = actor
        .handle(get("/sockets/get-tag?id=9"))
        .await
        .expect("get-tag");
    assert_eq!(
        (untagged.status, body_text(&untagged)),
        (404, "no tag".to_owned())
    );

    let closed = actor
        .handle(get("/sockets/close?id=9&code=4001&reason=bye"))
        .await
        .expect("close");
    assert_eq!(body_text(&closed), "closed");
    assert_eq!(
        recorder(&mut actor).closed,
        vec![(9, 4001, "bye".to_owned())]
    );
    assert_eq!(
        body_text(&actor.handle(get("/sockets/list")).await.expect("list")),
        "3"
    );

    // Host errors are values for the guest.
    let missing = actor
        .handle(get("/sockets/send?id=9&text=late"))
        .await
        .expect("send");
    assert_eq!(
        (missing.status, body_text(&missing)),
        (500, "send error: no socket 9".to_owned())
    );
    let missing = actor
        .handle(get("/sockets/set-tag?id=9&tag=x"))
        .await
        .expect("set-tag");
    assert_eq!(body_text(&missing), "tag error: no socket 9");
    let missing = actor
        .handle(get("/sockets/close?id=9"))
        .await
        .expect("close");
    assert_eq!(body_text(&missing), "close error: no socket 9");
}

#[tokio::test]
async fn actors_call_awaits_the_host_and_returns_its_response() {
    let mut actor = instance("kitchen-sink", "caller").await;
    let mut request = get("/call?class=ledger&name=acct-7");
    request.body = b"ping".to_vec();
    let response = actor.handle(request).await.expect("call");
    assert_eq!(response.status, 201);
    assert_eq!(response.body, b"gnip");
    assert_eq!(
        response.headers,
        vec![("x-callee".to_owned(), "ledger/acct-7".to_owned())]
    );
    let host = recorder(&mut actor);
    assert_eq!(host.call_requests.len(), 1);
    let (class, name, inner) = &host.call_requests[0];
    assert_eq!((class.as_str(), name.as_str()), ("ledger", "acct-7"));
    assert_eq!(
        *inner,
        Request {
            method: "POST".into(),
            path: "/inner?x=1".into(),
            headers: vec![("x-from".into(), "kitchen-sink".into())],
            body: b"ping".to_vec(),
        }
    );

    recorder(&mut actor).call_error = Some("actor acme/ledger/acct-7 is unavailable".into());
    let failed = actor
        .handle(get("/call?class=ledger&name=acct-7"))
        .await
        .expect("an error value");
    assert_eq!(
        (failed.status, body_text(&failed)),
        (
            502,
            "call error: actor acme/ledger/acct-7 is unavailable".to_owned()
        )
    );
}

#[tokio::test]
async fn secrets_get_answers_known_names_only() {
    let mut actor = instance("kitchen-sink", "secrets").await;
    recorder(&mut actor)
        .secrets
        .insert("api-key".into(), "s3cr3t".into());
    let found = actor
        .handle(get("/secret?name=api-key"))
        .await
        .expect("secret");
    assert_eq!(
        (found.status, body_text(&found)),
        (200, "s3cr3t".to_owned())
    );
    let missing = actor
        .handle(get("/secret?name=other"))
        .await
        .expect("secret");
    assert_eq!(missing.status, 404);
    assert_eq!(
        recorder(&mut actor).calls,
        vec!["secrets.get api-key", "secrets.get other"]
    );
}

#[tokio::test]
async fn log_carries_every_level() {
    let mut actor = instance("kitchen-sink", "logger").await;
    actor.handle(get("/log")).await.expect("log");
    assert_eq!(
        recorder(&mut actor).logs,
        vec![
            (LogLevel::Trace, "at trace".to_owned()),
            (LogLevel::Debug, "at debug".to_owned()),
            (LogLevel::Info, "at info".to_owned()),
            (LogLevel::Warn, "at warn".to_owned()),
            (LogLevel::Error, "at error".to_owned()),
        ]
    );
}

#[tokio::test]
async fn identity_names_the_actor() {
    let mut actor = instance("kitchen-sink", "who am i/π").await;
    let response = actor.handle(get("/identity")).await.expect("identity");
    assert_eq!(body_text(&response), "acme/sink/who am i/π");
}

#[tokio::test]
async fn wasi_gives_clocks_random_and_stdio_but_no_env_args_or_files() {
    let mut actor = instance("kitchen-sink", "wasi").await;
    let response = actor.handle(get("/wasi")).await.expect("wasi");
    assert_eq!(
        body_text(&response),
        "wall_ms_positive=true random_nonzero=true envs=0 args=0 fs_denied=true monotonic=true"
    );
}

/// Collects what the fmt subscriber writes.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("capture lock")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn guest_stdout_and_stderr_become_tracing_events_naming_the_actor() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test's runtime is single-threaded: the guest runs on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut actor = instance("kitchen-sink", "stdio").await;
    actor.handle(get("/wasi")).await.expect("wasi");

    let output =
        String::from_utf8(captured.0.lock().expect("capture lock").clone()).expect("utf-8");
    let line = |text: &str| {
        output
            .lines()
            .find(|line| line.contains(text))
            .unwrap_or_else(|| panic!("no line with {text:?} in:\n{output}"))
            .to_owned()
    };
    let stdout = line("to stdout from the guest");
    assert!(
        stdout.contains("INFO guest:") && stdout.contains("actor=acme/sink/stdio"),
        "{stdout}"
    );
    let stderr = line("to stderr from the guest");
    assert!(
        stderr.contains("WARN guest:") && stderr.contains("stream=\"stderr\""),
        "{stderr}"
    );
}

#[tokio::test]
async fn alarm_export_returns_ok_or_asks_for_a_retry() {
    let mut actor = instance("kitchen-sink", "alarm-export").await;
    assert_eq!(
        actor.alarm(1_700_000_000_000, 0).await.expect("event"),
        Ok(())
    );
    assert_eq!(
        actor.alarm(-1, 0).await.expect("event"),
        Err("not yet".to_owned())
    );
    assert_eq!(actor.alarm(-1, 1).await.expect("event"), Ok(()));
    let logs: Vec<String> = recorder(&mut actor)
        .logs
        .iter()
        .map(|(_, m)| m.clone())
        .collect();
    assert_eq!(
        logs,
        vec![
            "alarm scheduled_ms=1700000000000 retry_count=0 get=none",
            "alarm scheduled_ms=-1 retry_count=0 get=none",
            "alarm scheduled_ms=-1 retry_count=1 get=none",
        ]
    );
}

#[tokio::test]
async fn socket_message_and_close_exports_receive_their_arguments() {
    let mut actor = instance("kitchen-sink", "socket-events").await;
    recorder(&mut actor).sockets.insert(5, None);
    actor
        .socket_message(5, Message::Text("hello".into()))
        .await
        .expect("text");
    actor
        .socket_message(5, Message::Binary(vec![9, 8]))
        .await
        .expect("binary");
    actor
        .socket_close(5, 1001, "going away".into())
        .await
        .expect("close");
    let host = recorder(&mut actor);
    // The guest echoes each message back through sockets.send.
    assert_eq!(
        host.sent,
        vec![
            (5, Message::Text("hello".into())),
            (5, Message::Binary(vec![9, 8]))
        ]
    );
    let logs: Vec<&str> = host.logs.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(
        logs,
        vec![
            "socket-message id=5 text(hello)",
            "socket-message id=5 binary([9, 8])",
            "socket-close id=5 code=1001 reason=going away",
        ]
    );
}

// The harness's cases, run in both modes: `harness_in_process.rs` and `harness_spawned.rs`
// include this file after defining `start()`, which starts a node of
// their mode. The guests are those of `scripts/build-guests` (target/wasm).

use std::time::Duration;

fn guest(name: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-guests",
        path.display()
    );
    path
}

async fn node_with(class: &str, guest_name: &str) -> TestNode {
    let node = start().await;
    node.deploy_file(class, guest(guest_name)).await.unwrap();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_survives_hibernation() {
    let node = node_with("counter", "counter").await;
    let actor = node.actor("demo/counter/a").unwrap();
    assert_eq!(
        actor.post("/increment", b"").await.unwrap().text().unwrap(),
        "1"
    );
    assert_eq!(
        actor.post("/increment", b"").await.unwrap().text().unwrap(),
        "2"
    );
    assert!(actor.is_resident().await.unwrap());

    actor.hibernate().await.unwrap();
    assert!(!actor.is_resident().await.unwrap());
    let response = actor.get("/value").await.unwrap();
    assert_eq!((response.status, response.text().unwrap()), (200, "2"));
    assert!(actor.is_resident().await.unwrap());
    assert_eq!(
        actor.post("/increment", b"").await.unwrap().text().unwrap(),
        "3"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_reads_what_a_request_wrote_and_writes_what_the_next_reads() {
    let node = node_with("counter", "counter").await;
    let actor = node.actor("demo/counter/sql").unwrap();
    // Nothing in the bucket yet: an error that says so.
    let err = actor.sql("SELECT 1").await.unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert!(err.to_string().contains("nothing in the bucket"), "{err}");
    actor.post("/increment", b"").await.unwrap();
    let rows = actor
        .sql("SELECT n FROM counter WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(rows.columns, ["n"]);
    assert_eq!(rows.single_integer().unwrap(), 1);

    // A write is not the read's: refused, and nothing changed.
    let err = actor.sql("UPDATE counter SET n = 7").await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");

    let written = actor
        .sql_write("UPDATE counter SET n = 41 WHERE id = 1 RETURNING n")
        .await
        .unwrap();
    assert_eq!(written.changes, 1);
    assert_eq!(written.rows, [[serde_json::json!(41)]]);
    assert_eq!(
        actor.post("/increment", b"").await.unwrap().text().unwrap(),
        "42"
    );
    // A bad statement is the node's refusal, with SQLite's message, and
    // writes nothing.
    let err = actor.sql_write("UPDATE nowhere SET x = 1").await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().contains("no such table"), "{err}");
    assert_eq!(
        actor.sql("SELECT n FROM counter").await.unwrap().single_integer().unwrap(),
        42
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_alarm_runs_a_set_alarm_now_and_refuses_when_none_is_set() {
    let node = node_with("kitchen-sink", "kitchen-sink").await;
    let actor = node.actor("demo/kitchen-sink/alarm").unwrap();
    // Set far ahead: only the harness makes it run.
    let at_ms = node.now_ms() + 3_600_000;
    actor
        .post(&format!("/alarm/set?at={at_ms}"), b"")
        .await
        .unwrap();
    assert_eq!(
        actor.get("/alarm/get").await.unwrap().text().unwrap(),
        at_ms.to_string()
    );

    actor.fire_alarm().await.unwrap();
    // The handler ran: the alarm it fired is spent.
    assert_eq!(
        actor.get("/alarm/get").await.unwrap().text().unwrap(),
        "none"
    );
    let err = actor.fire_alarm().await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");

    // A hibernated actor's alarm runs too (the actor is activated for it).
    actor
        .post(&format!("/alarm/set?at={at_ms}"), b"")
        .await
        .unwrap();
    actor.hibernate().await.unwrap();
    actor.fire_alarm().await.unwrap();
    assert_eq!(
        actor.get("/alarm/get").await.unwrap().text().unwrap(),
        "none"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advancing_the_clock_runs_the_alarms_due_by_then_only() {
    let node = node_with("counter", "counter").await;
    let soon = node.actor("demo/counter/soon").unwrap();
    let later = node.actor("demo/counter/later").unwrap();
    soon.post("/alarm?in_ms=60000", b"").await.unwrap();
    later.post("/alarm?in_ms=7200000", b"").await.unwrap();
    // The hibernated one's alarm is found in the alarm index, as the
    // sweep finds it.
    later.hibernate().await.unwrap();

    let before = node.now_ms();
    let ran = node.advance(Duration::from_secs(61)).await.unwrap();
    assert_eq!(ran, [soon.id().clone()]);
    assert!(node.now_ms() >= before + 61_000);
    assert_eq!(soon.get("/alarms").await.unwrap().text().unwrap(), "1");
    assert_eq!(later.get("/alarms").await.unwrap().text().unwrap(), "0");

    let ran = node.advance(Duration::from_secs(7200)).await.unwrap();
    assert_eq!(ran, [later.id().clone()]);
    assert_eq!(later.get("/alarms").await.unwrap().text().unwrap(), "1");
    assert_eq!(soon.get("/alarms").await.unwrap().text().unwrap(), "1");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_is_answered_and_its_close_is_an_event() {
    let node = node_with("counter", "counter").await;
    let actor = node.actor("demo/counter/ws").unwrap();
    let mut ws = actor.socket("/ws").await.unwrap();
    ws.send_text("inc").await.unwrap();
    assert_eq!(ws.recv_text().await.unwrap(), "1");
    ws.send_text("hello").await.unwrap();
    assert_eq!(ws.recv_text().await.unwrap(), "hello");
    // An open socket keeps the actor resident.
    let err = actor.hibernate().await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert!(actor.is_resident().await.unwrap());
    ws.close().await.unwrap();
    // The close event ran before the hibernation, which waits for it.
    actor.hibernate().await.unwrap();
    assert_eq!(actor.get("/closes").await.unwrap().text().unwrap(), "1");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_message_is_broadcast_to_every_socket() {
    let node = node_with("chat", "chat").await;
    let room = node.actor("demo/chat/room").unwrap();
    let mut ann = room.socket("/ws").await.unwrap();
    let mut bob = room.socket("/ws").await.unwrap();
    ann.send_text("join ann").await.unwrap();
    assert_eq!(ann.recv_text().await.unwrap(), "ann joined");
    assert_eq!(bob.recv_text().await.unwrap(), "ann joined");
    bob.send_text("join bob").await.unwrap();
    assert_eq!(ann.recv_text().await.unwrap(), "bob joined");
    assert_eq!(bob.recv_text().await.unwrap(), "bob joined");
    ann.send_text("hi").await.unwrap();
    assert_eq!(ann.recv_text().await.unwrap(), "ann: hi");
    assert_eq!(bob.recv_text().await.unwrap(), "ann: hi");
    // A request's broadcast reaches the sockets too.
    room.post("/post?user=carl", b"hello").await.unwrap();
    assert_eq!(ann.recv_text().await.unwrap(), "carl: hello");
    assert_eq!(bob.recv_text().await.unwrap(), "carl: hello");
    ann.close().await.unwrap();
    bob.close().await.unwrap();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_name_or_component_is_refused() {
    let node = start().await;
    assert!(matches!(node.actor("no-slashes"), Err(wasmkeep_test::Error::Name(_))));
    assert!(matches!(
        node.deploy("Bad Class", b"").await,
        Err(wasmkeep_test::Error::Name(_))
    ));
    let err = node.deploy("counter", b"not wasm").await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    node.stop().await;
}

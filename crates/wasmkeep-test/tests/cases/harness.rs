//! The harness's own tests, each on a node of its own, with the guests
//! built by `scripts/build-guests` (target/wasm).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use wasmkeep_test::{Error, TestNode};

fn guest(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
    let node = TestNode::start().await.unwrap();
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
    assert!(actor.is_resident());

    actor.hibernate().await.unwrap();
    assert!(!actor.is_resident());
    let response = actor.get("/value").await.unwrap();
    assert_eq!((response.status, response.text().unwrap()), (200, "2"));
    assert!(actor.is_resident());
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
    assert!(matches!(
        actor.sql("SELECT 1").await,
        Err(Error::Unexpected(_))
    ));
    actor.post("/increment", b"").await.unwrap();
    let rows = actor
        .sql("SELECT n FROM counter WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(rows.columns, ["n"]);
    assert_eq!(rows.single_integer().unwrap(), 1);

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
    // A bad statement is the node's refusal, and writes nothing.
    assert!(matches!(
        actor.sql_write("UPDATE nowhere SET x = 1").await,
        Err(Error::Node(_))
    ));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_alarm_runs_a_set_alarm_now_and_refuses_when_none_is_set() {
    let node = node_with("kitchen-sink", "kitchen-sink").await;
    let actor = node.actor("demo/kitchen-sink/alarm").unwrap();
    // Set far ahead: only the harness makes it run.
    let at_ms = node.clock().now_ms() + 3_600_000;
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
    assert!(matches!(
        actor.fire_alarm().await,
        Err(Error::Unexpected(_))
    ));

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

    let ran = node.advance(Duration::from_secs(61)).await.unwrap();
    assert_eq!(ran, [soon.id().clone()]);
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
    assert!(matches!(actor.hibernate().await, Err(Error::Node(_))));
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

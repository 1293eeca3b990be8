//! Node tests in one process, against the memory bucket: what needs a second
//! writer or a look inside the bucket.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_runtime::Request;
use wasmkeep_server::{Error, Node, NodeConfig, actor::classes};
use wasmkeep_store::{ActorStore, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, ClassName, Keys, NodeId};

async fn start(bucket: Arc<dyn Bucket>) -> Arc<Node> {
    let cache = common::data_dir();
    let runtime = common::runtime(16);
    let app = AppName::default_app();
    let class = ClassName::new("counter").unwrap();
    classes::deploy(
        &*bucket,
        &Keys::new(&app),
        &class,
        common::guest_bytes("counter"),
        classes::ClassLimits::default(),
        &runtime,
    )
    .await
    .unwrap();
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = NodeConfig::new(app, NodeId::new("n1").unwrap(), listen, cache);
    Node::start(config, bucket, runtime).await.unwrap()
}

async fn increment(node: &Arc<Node>, actor: &ActorId) -> Result<String, Error> {
    let request = Request {
        method: "POST".into(),
        path: "/increment".into(),
        headers: vec![],
        body: vec![],
    };
    let response = node.request(actor, request, vec![actor.clone()]).await?;
    Ok(String::from_utf8(response.body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_actor_is_dropped_and_restored_with_the_other_writes() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    let node = start(Arc::clone(&bucket)).await;
    let actor = ActorId::parse("demo/counter/fenced").unwrap();
    assert_eq!(increment(&node, &actor).await.unwrap(), "1");

    // Another writer extends the actor's log behind the node's back.
    let writer = WriterId {
        node: "intruder".into(),
        incarnation: "x".into(),
    };
    let mut other = ActorStore::open(
        Arc::clone(&bucket),
        node.keys.clone(),
        actor.clone(),
        writer,
        StoreConfig::default(),
    )
    .await
    .unwrap();
    other.begin_event().unwrap();
    other.execute("CREATE TABLE intruder(x)", &[]).unwrap();
    other.commit_event().unwrap().await.unwrap();
    drop(other);

    // The node's next write is fenced: 503, and nothing acknowledged.
    let fenced = increment(&node, &actor).await;
    assert!(
        matches!(fenced, Err(Error::Unavailable { .. })),
        "{fenced:?}"
    );
    // The next event restores the actor from the bucket and goes on.
    let mut value = None;
    for _ in 0..100 {
        match increment(&node, &actor).await {
            Ok(v) => {
                value = Some(v);
                break;
            }
            Err(Error::Unavailable { .. }) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        value.as_deref(),
        Some("2"),
        "the fenced increment was never acknowledged nor kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_ownership_record() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    let node = start(Arc::clone(&bucket)).await;
    for name in ["a", "b", "c"] {
        increment(
            &node,
            &ActorId::parse(&format!("demo/counter/{name}")).unwrap(),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        bucket.list(&node.keys.owners_prefix()).await.unwrap().len(),
        3
    );
    node.shutdown(std::time::Duration::from_secs(30)).await;
    assert_eq!(node.residents.count(), 0);
    assert!(
        bucket
            .list(&node.keys.owners_prefix())
            .await
            .unwrap()
            .is_empty(),
        "ownership records left behind"
    );
    let refused = increment(&node, &ActorId::parse("demo/counter/a").unwrap()).await;
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{refused:?}"
    );
}

/// Deploying the bytes that already are the class's current version writes
/// nothing (a bucket whose every write reports "outcome unknown" does not
/// fail it); other bytes are validated and written as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploying_the_current_version_again_writes_nothing() {
    let memory = Arc::new(MemoryBucket::new());
    let bucket: Arc<dyn Bucket> = memory.clone();
    let runtime = common::runtime(4);
    let keys = Keys::new(&AppName::default_app());
    let class = ClassName::new("counter").unwrap();
    let first = classes::deploy(
        &*bucket,
        &keys,
        &class,
        common::guest_bytes("counter"),
        classes::ClassLimits::default(),
        &runtime,
    )
    .await
    .unwrap();
    memory.faults().set_reply_lost_probability(1.0);
    let again = classes::deploy(
        &*bucket,
        &keys,
        &class,
        common::guest_bytes("counter"),
        classes::ClassLimits::default(),
        &runtime,
    )
    .await
    .unwrap();
    assert_eq!(again, first);
    assert_eq!(
        memory.faults().injected_count(),
        0,
        "the second deploy wrote"
    );
    // Other bytes (a component of another class) are written: here the lost
    // reply makes that deploy fail.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm/chat.wasm");
    let chat = std::fs::read(&path).unwrap();
    assert!(
        classes::deploy(
            &*bucket,
            &keys,
            &class,
            chat,
            classes::ClassLimits::default(),
            &runtime
        )
        .await
        .is_err()
    );
    assert!(memory.faults().injected_count() > 0);
    // Bytes that do not validate are refused as before.
    memory.faults().clear();
    assert!(
        classes::deploy(
            &*bucket,
            &keys,
            &class,
            b"not wasm".to_vec(),
            classes::ClassLimits::default(),
            &runtime
        )
        .await
        .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_actor_name_is_kept_and_a_longer_one_refused() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    let node = start(Arc::clone(&bucket)).await;
    // 127 bytes of UTF-8: its hex is one 254-byte key segment.
    let name = format!("x{}", "é".repeat(63));
    let actor = ActorId::parse(&format!("demo/counter/{name}")).unwrap();
    assert_eq!(increment(&node, &actor).await.unwrap(), "1");
    let owners = bucket.list(&node.keys.owners_prefix()).await.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(node.keys.parse_owner_key(&owners[0].key).unwrap(), actor);

    let longer = ActorId::parse(&format!("demo/counter/{name}x"));
    let refused = Error::from(longer.expect_err("128 bytes"));
    assert_eq!(refused.status(), 400);
    node.shutdown(std::time::Duration::from_secs(5)).await;
}

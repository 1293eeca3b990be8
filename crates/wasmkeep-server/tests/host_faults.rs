//! Faults of the host around a real guest: a compile slower than the lease
//! TTL, a class still compiling when its first request comes, and a panic
//! in an actor's mailbox (a bug of ours, which no component can provoke).
//! The guest is the real counter component; the engine around it only
//! delays a load until the test lets it go, or panics in one event.

#![allow(clippy::unwrap_used)]

mod common;

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_runtime::{ActorHost, EventError, Message, Request, Response};
use wasmkeep_server::actor::guest::{GuestClass, GuestEngine, GuestInstance, WasmtimeEngine};
use wasmkeep_server::{Error, Node, NodeConfig, Platform, actor::classes};
use wasmkeep_types::{ActorId, AppName, ClassName, Keys, NodeId};

/// What the engine around the real one does.
#[derive(Default)]
struct Faults {
    /// A load first takes a permit (none: it waits until the test adds one)
    /// after announcing itself here.
    gate: Option<(Arc<Semaphore>, Arc<Semaphore>)>,
    /// A load first sleeps this long.
    load_delay: Duration,
    /// An event to this path panics in the mailbox.
    panic_path: Option<&'static str>,
    /// Loads fail (after the gate and the delay) while this is set.
    fail_loads: std::sync::atomic::AtomicBool,
}

struct FaultyEngine {
    inner: WasmtimeEngine,
    faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl GuestEngine for FaultyEngine {
    async fn load(&self, bytes: Vec<u8>) -> wasmkeep_server::Result<Arc<dyn GuestClass>> {
        if let Some((started, permits)) = &self.faults.gate {
            started.add_permits(1);
            permits.acquire().await.unwrap().forget();
        }
        tokio::time::sleep(self.faults.load_delay).await;
        if self
            .faults
            .fail_loads
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(wasmkeep_server::Error::Runtime(
                "a planted load failure".into(),
            ));
        }
        let inner = self.inner.load(bytes).await?;
        Ok(Arc::new(FaultyClass {
            inner,
            faults: Arc::clone(&self.faults),
        }))
    }
}

struct FaultyClass {
    inner: Arc<dyn GuestClass>,
    faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl GuestClass for FaultyClass {
    fn digest(&self) -> &str {
        self.inner.digest()
    }

    fn was_cached(&self) -> bool {
        self.inner.was_cached()
    }

    async fn instantiate(
        &self,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> wasmkeep_server::Result<Box<dyn GuestInstance>> {
        Ok(Box::new(FaultyInstance {
            inner: self.inner.instantiate(id, host).await?,
            faults: Arc::clone(&self.faults),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
}

struct FaultyInstance {
    inner: Box<dyn GuestInstance>,
    faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl GuestInstance for FaultyInstance {
    fn host(&mut self) -> &mut dyn ActorHost {
        self.inner.host()
    }

    fn set_component(&mut self, class: Arc<dyn GuestClass>) {
        self.inner.set_component(class);
    }

    fn unload(&mut self) {
        self.inner.unload();
    }

    fn is_loaded(&self) -> bool {
        self.inner.is_loaded()
    }

    fn component_digest(&self) -> &str {
        self.inner.component_digest()
    }

    async fn handle(&mut self, request: Request) -> Result<Response, EventError> {
        assert!(
            Some(request.path.as_str()) != self.faults.panic_path,
            "a planted panic in the mailbox"
        );
        self.inner.handle(request).await
    }

    async fn alarm(
        &mut self,
        scheduled_ms: i64,
        retry_count: u32,
    ) -> Result<Result<(), String>, EventError> {
        self.inner.alarm(scheduled_ms, retry_count).await
    }

    async fn socket_message(&mut self, id: u64, message: Message) -> Result<(), EventError> {
        self.inner.socket_message(id, message).await
    }

    async fn socket_close(&mut self, id: u64, code: u16, reason: String) -> Result<(), EventError> {
        self.inner.socket_close(id, code, reason).await
    }
}

async fn deploy(bucket: &dyn Bucket, class: &str) {
    classes::deploy(
        bucket,
        &Keys::new(&AppName::default_app()),
        &ClassName::new(class).unwrap(),
        common::guest_bytes("counter"),
        classes::ClassLimits::default(),
        &common::runtime(16),
    )
    .await
    .unwrap();
}

fn config() -> NodeConfig {
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    NodeConfig::new(
        AppName::default_app(),
        NodeId::new("n1").unwrap(),
        listen,
        common::data_dir(),
    )
}

async fn start(
    config: NodeConfig,
    bucket: Arc<dyn Bucket>,
    faults: Faults,
) -> wasmkeep_server::Result<Arc<Node>> {
    start_shared(config, bucket, Arc::new(faults)).await
}

/// [`start`] with faults the test keeps changing.
async fn start_shared(
    config: NodeConfig,
    bucket: Arc<dyn Bucket>,
    faults: Arc<Faults>,
) -> wasmkeep_server::Result<Arc<Node>> {
    let runtime = common::runtime(16);
    let mut platform = Platform::production(runtime.clone());
    platform.guest = Arc::new(FaultyEngine {
        inner: WasmtimeEngine::new(runtime),
        faults,
    });
    Node::start_with(config, bucket, platform).await
}

async fn send(node: &Arc<Node>, actor: &ActorId, path: &str) -> Result<String, Error> {
    let request = Request {
        method: "POST".into(),
        path: path.into(),
        headers: vec![],
        body: vec![],
    };
    let response = node.request(actor, request, vec![]).await?;
    Ok(String::from_utf8(response.body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_class_loads_outlast_the_lease_ttl_keeps_its_lease() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    deploy(&*bucket, "counter").await;
    let mut config = config();
    config.lease_ttl = Duration::from_millis(600);
    config.heartbeat_period = Duration::from_millis(100);
    // Three TTLs of compiling: without renewals in between, the lease
    // lapses and the start fails at its next renewal.
    let faults = Faults {
        load_delay: Duration::from_millis(1_800),
        ..Faults::default()
    };
    let node = start(config, bucket, faults).await.unwrap();
    assert!(node.peering.lease.is_valid());
    let actor = ActorId::parse("demo/counter/slow-start").unwrap();
    assert_eq!(send(&node, &actor, "/increment").await.unwrap(), "1");
    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_still_compiling_or_failed_to_load_asks_its_clients_to_retry_then_serves() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    deploy(&*bucket, "counter").await;
    let started = Arc::new(Semaphore::new(0));
    let permits = Arc::new(Semaphore::new(1));
    let faults = Faults {
        gate: Some((Arc::clone(&started), Arc::clone(&permits))),
        ..Faults::default()
    };
    // No background poll within the test: the test's own poll is the one
    // that finds the new class.
    let mut config = config();
    config.heartbeat_period = Duration::from_secs(60);
    config.lease_ttl = Duration::from_secs(180);
    let faults = Arc::new(faults);
    let node = start_shared(config, Arc::clone(&bucket), Arc::clone(&faults))
        .await
        .unwrap();
    started.acquire().await.unwrap().forget();

    // A second class is deployed; this node's poll finds it and its load
    // waits at the gate.
    deploy(&*bucket, "tally").await;
    let poll = tokio::spawn({
        let node = Arc::clone(&node);
        async move { node.poll_classes().await }
    });
    started.acquire().await.unwrap().forget();
    let actor = ActorId::parse("demo/tally/early").unwrap();
    let early = send(&node, &actor, "/increment").await;
    match &early {
        Err(e @ Error::Unavailable { reason, .. }) => {
            assert_eq!(e.status(), 503);
            assert!(reason.contains("being compiled"), "{reason}");
        }
        other => panic!("expected 503 while the class compiles, got {other:?}"),
    }
    // A class this node was never told of is still unknown.
    let unknown = send(&node, &ActorId::parse("demo/nosuch/x").unwrap(), "/").await;
    assert!(
        matches!(unknown, Err(Error::UnknownClass(_))),
        "{unknown:?}"
    );

    // A load that fails leaves the class asking to retry, with the reason;
    // the next poll loads it.
    faults
        .fail_loads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    permits.add_permits(1);
    poll.await.unwrap().unwrap();
    match send(&node, &actor, "/increment").await {
        Err(Error::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("did not load on this node") && reason.contains("planted"),
                "{reason}"
            );
        }
        other => panic!("expected 503 after a failed load, got {other:?}"),
    }
    faults
        .fail_loads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    permits.add_permits(1);
    node.poll_classes().await.unwrap();
    assert_eq!(send(&node, &actor, "/increment").await.unwrap(), "1");
    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_mailbox_fails_its_event_and_the_actor_serves_again() {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    deploy(&*bucket, "counter").await;
    let faults = Faults {
        panic_path: Some("/panic"),
        ..Faults::default()
    };
    let node = start(config(), bucket, faults).await.unwrap();
    let actor = ActorId::parse("demo/counter/panicky").unwrap();
    assert_eq!(send(&node, &actor, "/increment").await.unwrap(), "1");

    let panicked = send(&node, &actor, "/panic").await;
    assert!(
        matches!(panicked, Err(Error::Unavailable { .. })),
        "{panicked:?}"
    );
    // The next event activates the actor afresh, with its committed state.
    // One sent while the mailbox still unwinds may find it and be answered
    // 503 (retry), as a client would be.
    let mut answered = None;
    for _ in 0..100 {
        match send(&node, &actor, "/increment").await {
            Ok(value) => {
                answered = Some(value);
                break;
            }
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(answered.as_deref(), Some("2"), "the actor serves again");
    let metrics = node.metrics.render();
    assert_eq!(
        wasmkeep_server::ops::metrics::sum(&metrics, "wasmkeep_mailbox_panics_total"),
        Some(1.0),
        "{metrics}"
    );
    node.shutdown(Duration::from_secs(5)).await;
}

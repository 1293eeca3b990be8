//! Two or three nodes in one process on one memory bucket, each with a real
//! HTTP listener on loopback and a shared cluster key: forwarding to the
//! owner, signed-call refusal (forged, replayed), marker stripping,
//! heartbeats that do not parse, the owner hint kept in the actor's own
//! state, and a stale hint handed back naming the holder.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_cluster::hints::HINT_TTL;
use wasmkeep_cluster::{AcquireOutcome, OsRandom, Signer, SystemClock};
use wasmkeep_runtime::{Runtime, RuntimeConfig};
use wasmkeep_server::{Node, NodeConfig, Owner, actor::classes, front::http};
use wasmkeep_types::{ActorId, AppName, ClassName, Keys, NodeId};

const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn counter_bytes() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm/counter.wasm");
    std::fs::read(&path)
        .unwrap_or_else(|_| panic!("{} is missing: run scripts/build-guests", path.display()))
}

fn runtime() -> Runtime {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasmkeep-server-tests-cache");
    Runtime::new(RuntimeConfig {
        cache_dir: Some(cache.join("components")),
        instances_max: 16,
        ..RuntimeConfig::default()
    })
    .unwrap()
}

struct Running {
    node: Arc<Node>,
    addr: String,
}

async fn start(bucket: Arc<dyn Bucket>, id: &str, key_file: &Path) -> Running {
    start_with(bucket, id, key_file, |_| {}).await
}

async fn start_with(
    bucket: Arc<dyn Bucket>,
    id: &str,
    key_file: &Path,
    adjust: impl FnOnce(&mut NodeConfig),
) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasmkeep-server-tests-cache");
    let mut config = NodeConfig::new(
        AppName::default_app(),
        NodeId::new(id).unwrap(),
        addr,
        cache,
    );
    config.advertise = Some(format!("http://{addr}"));
    config.cluster_key_file = Some(key_file.to_path_buf());
    config.heartbeat_period = Duration::from_millis(200);
    config.lease_ttl = Duration::from_secs(3);
    adjust(&mut config);
    let node = Node::start(config, bucket, runtime()).await.unwrap();
    tokio::spawn(http::serve(
        Arc::clone(&node),
        listener,
        node.shutdown_rx(),
        Duration::from_secs(5),
    ));
    Running {
        node,
        addr: addr.to_string(),
    }
}

/// A fresh folder holding the cluster key file, and the file's path.
fn key_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, KEY).unwrap();
    (dir, key_file)
}

async fn deploy_counter(bucket: &dyn Bucket) {
    classes::deploy(
        bucket,
        &Keys::new(&AppName::default_app()),
        &ClassName::new("counter").unwrap(),
        counter_bytes(),
        classes::ClassLimits::default(),
        &runtime(),
    )
    .await
    .unwrap();
}

async fn two_nodes() -> (tempfile::TempDir, Arc<dyn Bucket>, Running, Running) {
    let (dir, key_file) = key_file();
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    deploy_counter(&*bucket).await;
    let a = start(Arc::clone(&bucket), "n1", &key_file).await;
    let b = start(Arc::clone(&bucket), "n2", &key_file).await;
    (dir, bucket, a, b)
}

/// One HTTP request on a blocking thread (the harness's client).
async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: Vec<(String, String)>,
) -> common::Resp {
    let (addr, method, path) = (addr.to_owned(), method.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        common::request(&addr, &method, &path, &headers, b"")
    })
    .await
    .unwrap()
}

/// Retries while the answer is 503 (a peer not seen yet, a lease starting).
async fn send_until_served(addr: &str, method: &str, path: &str) -> common::Resp {
    for _ in 0..200 {
        let r = send(addr, method, path, Vec::new()).await;
        if r.status != 503 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{method} {path} on {addr}: still 503");
}

/// The system's wall clock, `.0` ms ahead.
#[derive(Debug)]
struct AheadClock(i64);

impl wasmkeep_cluster::Clock for AheadClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        wasmkeep_cluster::Clock::wall_ms(&SystemClock) + self.0
    }
}

fn signer_for(node: &str) -> Signer {
    let (_dir, key_file) = key_file();
    Signer::from_key_file(
        &key_file,
        node.into(),
        Arc::new(SystemClock),
        Arc::new(OsRandom),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_non_owner_is_forwarded_and_answered() {
    let (_dir, _bucket, a, b) = two_nodes().await;
    let r = send_until_served(&a.addr, "POST", "/demo/counter/fwd/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-wasmkeep-node"), Some("n1"));
    let r = send_until_served(&b.addr, "POST", "/demo/counter/fwd/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "2", "the owner's count, not a second copy");
    assert_eq!(
        r.header("x-wasmkeep-node"),
        Some("n1"),
        "the owner ran the event"
    );
    assert_eq!(b.node.residents.count(), 0, "the non-owner holds nothing");
    let metrics = send(&b.addr, "GET", "/_wasmkeep/metrics", Vec::new())
        .await
        .text();
    assert!(
        wasmkeep_server::ops::metrics::sum(&metrics, "wasmkeep_forwarded_requests_total").unwrap()
            >= 1.0
    );
    a.node.shutdown(Duration::from_secs(10)).await;
    b.node.shutdown(Duration::from_secs(10)).await;
}

/// `ensure_owner` on n1 for `actor`: the peer it names, or `None` for Local.
async fn owner_seen_by(node: &Arc<Node>, actor: &ActorId) -> Option<String> {
    match node.ensure_owner(actor).await.unwrap() {
        Owner::Local(_) => None,
        Owner::Elsewhere { peer, .. } => Some(peer.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actors_own_hint_answers_first_expires_after_one_second_and_is_forgotten() {
    let (_dir, _bucket, a, b) = two_nodes().await;
    let actor = ActorId::parse("demo/counter/hinted").unwrap();
    let r = send_until_served(&a.addr, "POST", "/demo/counter/hinted/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let Owner::Local(stub) = a.node.ensure_owner(&actor).await.unwrap() else {
        panic!("n1 holds the actor it just ran");
    };
    let n2 = NodeId::new("n2").unwrap();
    // `Elsewhere` needs the peer's address: wait for n2's heartbeat.
    for _ in 0..200 {
        if a.node.peering.peers.get(&n2).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.node.peering.peers.get(&n2).is_some(), "n1 never saw n2");

    // The stub's hint answers, though the node's map has none.
    let learned = tokio::time::Instant::now();
    stub.hint.learn(&n2, learned);
    assert_eq!(owner_seen_by(&a.node, &actor).await.as_deref(), Some("n2"));
    assert_eq!(
        a.node.peering.hints.get(&actor),
        None,
        "the answer came from the stub"
    );

    // It expires: Local again, and never before HINT_TTL went by.
    let deadline = learned + Duration::from_secs(30);
    while owner_seen_by(&a.node, &actor).await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hint never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(learned.elapsed() >= HINT_TTL, "expired early");

    // A request forwarded to n1 (n2 reads n1's hold) forgets the stub's
    // hint: the sender read the record, which outranks a guess.
    stub.hint.learn(&n2, tokio::time::Instant::now());
    let r = send_until_served(&b.addr, "POST", "/demo/counter/hinted/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-wasmkeep-node"), Some("n1"));
    assert_eq!(r.text(), "2");
    assert_eq!(
        owner_seen_by(&a.node, &actor).await,
        None,
        "the hint was forgotten"
    );
    a.node.shutdown(Duration::from_secs(10)).await;
    b.node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_replayed_signed_calls_are_ordinary_requests_and_skewed_ones_503() {
    let (_dir, _bucket, a, _b) = two_nodes().await;
    let path = "/demo/counter/signed/increment";
    // A valid signed alarm hand-off: honoured once (no guest code runs).
    let signer = signer_for("n2");
    let markers = vec![("x-wasmkeep-alarm".to_owned(), "1".to_owned())];
    let signed = signer.sign("POST", path, "", &markers, b"");
    let r = send(&a.addr, "POST", path, signed.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "alarm armed\n", "a verified marker is honoured");
    // The same call again: replayed, so an ordinary request (the guest runs).
    let r = send(&a.addr, "POST", path, signed).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "1", "a replayed call's markers are ignored");
    // Forged: signed with another key.
    let mut forged = signer_for("n2").sign("POST", path, "", &markers, b"");
    for (name, value) in &mut forged {
        if name == "x-wasmkeep-signature" {
            *value = format!("v1={}", "00".repeat(32));
        }
    }
    let r = send(&a.addr, "POST", path, forged).await;
    assert_eq!(r.text(), "2", "a forged call's markers are ignored");
    // Unsigned markers from a client: stripped.
    let r = send(
        &a.addr,
        "POST",
        path,
        vec![
            ("x-wasmkeep-alarm".into(), "1".into()),
            ("x-wasmkeep-forwarded".into(), "1".into()),
        ],
    )
    .await;
    assert_eq!(r.text(), "3", "client markers are stripped");
    // Signed by a peer whose clock is a minute ahead: answered 503 naming
    // the skew, never served as a client's request (the guest does not run).
    let (_key_dir, key_file) = key_file();
    let ahead = Signer::from_key_file(
        &key_file,
        "n2".into(),
        Arc::new(AheadClock(60_000)),
        Arc::new(OsRandom),
    )
    .unwrap();
    let r = send(
        &a.addr,
        "POST",
        path,
        ahead.sign("POST", path, "", &[], b""),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("clock"), "{}", r.text());
    let r = send(&a.addr, "GET", "/demo/counter/signed/value", Vec::new()).await;
    assert_eq!(r.text(), "3", "the skewed call reached no actor");
    let metrics = send(&a.addr, "GET", "/_wasmkeep/metrics", Vec::new())
        .await
        .text();
    assert_eq!(
        wasmkeep_server::ops::metrics::sum(&metrics, "wasmkeep_signed_calls_refused_total"),
        Some(2.0)
    );
    assert_eq!(
        wasmkeep_server::ops::metrics::sum(&metrics, "wasmkeep_signed_calls_skewed_total"),
        Some(1.0)
    );
    a.node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_that_does_not_parse_is_ignored() {
    let (_dir, bucket, a, b) = two_nodes().await;
    let keys = Keys::new(&AppName::default_app());
    bucket
        .put(
            &keys.node(&NodeId::new("garbage").unwrap()),
            Bytes::from_static(b"not a heartbeat\n\xff"),
        )
        .await
        .unwrap();
    // A few heartbeat periods pass with the garbage in place.
    let renewals = |n: &Running| n.node.metrics.lease_renewals.get();
    let before = renewals(&a);
    while renewals(&a) < before + 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send(&a.addr, "GET", "/_wasmkeep/health", Vec::new())
            .await
            .status,
        200
    );
    assert!(
        a.node
            .peering
            .peers
            .get(&NodeId::new("garbage").unwrap())
            .is_none()
    );
    assert!(
        a.node
            .peering
            .peers
            .get(&NodeId::new("n2").unwrap())
            .is_some()
    );
    let r = send_until_served(&b.addr, "POST", "/demo/counter/hb/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    a.node.shutdown(Duration::from_secs(10)).await;
    b.node.shutdown(Duration::from_secs(10)).await;
    assert!(
        bucket.list(&keys.nodes_prefix()).await.unwrap().len() == 1,
        "both nodes resigned (deleted their heartbeats); only the garbage is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_that_fires_on_a_non_owner_is_handed_off_and_runs_once() {
    let (dir, bucket, a, _b) = two_nodes().await;
    // A third node that sweeps often, so it arms the alarm of an actor it
    // does not hold and must hand it off when it fires.
    let c = start_with(
        Arc::clone(&bucket),
        "n3",
        &dir.path().join("cluster.key"),
        |config| {
            config.alarm_sweep_period = Duration::from_millis(100);
        },
    )
    .await;
    let r = send_until_served(&a.addr, "POST", "/demo/counter/al/alarm?in_ms=1500").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let handed_off = |n: &Running| n.node.metrics.alarm_hand_offs.get();
    while handed_off(&c) == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut fired = String::new();
    for _ in 0..100 {
        fired = send_until_served(&a.addr, "GET", "/demo/counter/al/alarms")
            .await
            .text();
        if fired != "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fired, "1", "the alarm ran once, on the owner");
    assert_eq!(
        c.node.residents.count(),
        0,
        "the non-owner did not take the actor"
    );
    a.node.shutdown(Duration::from_secs(10)).await;
    c.node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_bucket_stops_serving_and_comes_back() {
    let (_dir, key_file) = key_file();
    let shared = MemoryBucket::new();
    deploy_counter(&shared).await;
    // The node's own client, which the test cuts off; `shared` still sees all.
    let client = Arc::new(shared.new_client(7));
    let a = start_with(
        Arc::clone(&client) as Arc<dyn Bucket>,
        "n1",
        &key_file,
        |config| {
            config.lease_ttl = Duration::from_secs(1);
        },
    )
    .await;
    let path = "/demo/counter/cut/increment";
    assert_eq!(send_until_served(&a.addr, "POST", path).await.text(), "1");
    let owner_key = Keys::new(&AppName::default_app())
        .owner(&wasmkeep_types::ActorId::parse("demo/counter/cut").unwrap());
    let held = shared.get(&owner_key).await.unwrap();

    client.faults().set_partitioned(true);
    while send(&a.addr, "GET", "/_wasmkeep/health", Vec::new())
        .await
        .status
        != 503
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while a.node.residents.count() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = send(&a.addr, "POST", path, Vec::new()).await;
    assert_eq!(r.status, 503, "no event runs without a lease: {}", r.text());
    assert!(r.header("retry-after").is_some());
    assert_eq!(
        shared.get(&owner_key).await.unwrap().meta.etag,
        held.meta.etag,
        "a node whose lease lapsed drops its actors without releasing them"
    );

    client.faults().set_partitioned(false);
    let r = send_until_served(&a.addr, "POST", path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "2", "every acknowledged write survived");
    a.node.shutdown(Duration::from_secs(10)).await;
}

/// Waits until `node` has seen the heartbeat of each of `peers`.
async fn wait_for_peers(node: &Arc<Node>, peers: &[&str]) {
    for peer in peers {
        let peer = NodeId::new(*peer).unwrap();
        let mut tries = 0;
        while node.peering.peers.get(&peer).is_none() {
            tries += 1;
            assert!(tries < 600, "{} never saw {peer}", node.node_id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn forward_loops(node: &Running) -> f64 {
    let metrics = send(&node.addr, "GET", "/_wasmkeep/metrics", Vec::new())
        .await
        .text();
    wasmkeep_server::ops::metrics::sum(&metrics, "wasmkeep_forward_loops_total").unwrap()
}

/// A WebSocket to `path` on `addr`: the node named by the 101, and the
/// counter's answer to "inc".
async fn socket_increment(addr: &str, path: &str) -> (Option<String>, String) {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async(format!("ws://{addr}{path}"), stream)
        .await
        .unwrap_or_else(|e| panic!("the upgrade through {addr}: {e}"));
    let node = response
        .headers()
        .get("x-wasmkeep-node")
        .map(|v| v.to_str().unwrap().to_owned());
    ws.send(Message::text("inc")).await.unwrap();
    let answer = loop {
        match ws.next().await.expect("an answer").unwrap() {
            Message::Text(text) => break text.to_string(),
            _ => continue,
        }
    };
    let _ = ws.close(None).await;
    (node, answer)
}

/// n3's hint names n2 (as it would just after the actor moved away from
/// n2); n1 holds the actor. n2 sends nothing on (one hop) but hands the
/// request, and the socket, back naming n1, and n3 sends it there: the
/// client is served, not answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hint_is_handed_back_naming_the_holder_and_served_there() {
    let (dir, bucket, a, b) = two_nodes().await;
    let c = start(Arc::clone(&bucket), "n3", &dir.path().join("cluster.key")).await;
    let path = "/demo/counter/stale/increment";
    let r = send_until_served(&a.addr, "POST", path).await;
    assert_eq!(r.header("x-wasmkeep-node"), Some("n1"), "{}", r.text());
    wait_for_peers(&b.node, &["n1"]).await;
    wait_for_peers(&c.node, &["n1", "n2"]).await;
    let actor = ActorId::parse("demo/counter/stale").unwrap();
    let n2 = NodeId::new("n2").unwrap();
    let mut count = 1;

    // A hint lives 1 s: on a stalled machine it may expire before the
    // request is routed, and nothing is handed back; then again.
    let mut handed_back = 0;
    for _ in 0..20 {
        let loops = forward_loops(&b).await;
        c.node.peering.hints.learn(&actor, &n2);
        let r = send(&c.addr, "POST", path, Vec::new()).await;
        assert_eq!(r.status, 200, "served through a stale hint: {}", r.text());
        assert_eq!(r.header("x-wasmkeep-node"), Some("n1"));
        assert!(
            r.header(wasmkeep_server::peering::forward::HEADER_HOLDER)
                .is_none(),
            "the marker never reaches the client"
        );
        count += 1;
        assert_eq!(r.text(), count.to_string());
        if forward_loops(&b).await > loops {
            handed_back += 1;
            break;
        }
    }
    assert_eq!(handed_back, 1, "n2 never handed the request back");

    let socket_path = "/demo/counter/stale/ws";
    for _ in 0..20 {
        let loops = forward_loops(&b).await;
        c.node.peering.hints.learn(&actor, &n2);
        let (node, answer) = socket_increment(&c.addr, socket_path).await;
        assert_eq!(node.as_deref(), Some("n1"), "the socket's events run on n1");
        count += 1;
        assert_eq!(answer, count.to_string());
        if forward_loops(&b).await > loops {
            handed_back += 1;
            break;
        }
    }
    assert_eq!(handed_back, 2, "n2 never handed the socket back");
    assert_eq!(b.node.residents.count(), 0, "n2 took nothing");
    assert_eq!(c.node.residents.count(), 0, "n3 took nothing");
    for node in [a, b, c] {
        node.node.shutdown(Duration::from_secs(10)).await;
    }
}

/// A bucket that notes the prefix of every listing (its first page, or a
/// listing of keys), in order, and wakes whoever waits on them. The first put-if-absent of the
/// key in `lose_write` applies but answers "outcome unknown", and the read
/// that follows it fails as unavailable (noted as the entry `lost`).
#[derive(Debug)]
struct ListLog {
    inner: Arc<dyn Bucket>,
    prefixes: parking_lot::Mutex<Vec<String>>,
    listed: tokio::sync::Notify,
    lose_write: parking_lot::Mutex<Option<String>>,
    fail_read: parking_lot::Mutex<Option<String>>,
}

impl ListLog {
    fn new(inner: Arc<dyn Bucket>) -> Self {
        Self {
            inner,
            prefixes: parking_lot::Mutex::new(Vec::new()),
            listed: tokio::sync::Notify::new(),
            lose_write: parking_lot::Mutex::new(None),
            fail_read: parking_lot::Mutex::new(None),
        }
    }

    fn note(&self, entry: &str) {
        self.prefixes.lock().push(entry.to_owned());
        self.listed.notify_waiters();
    }

    /// The prefixes listed so far, once `enough` holds for them.
    async fn wait_for(&self, enough: impl Fn(&[String]) -> bool) -> Vec<String> {
        loop {
            let listed = self.listed.notified();
            let prefixes = self.prefixes.lock().clone();
            if enough(&prefixes) {
                return prefixes;
            }
            listed.await;
        }
    }
}

impl wasmkeep_bucket::Around for ListLog {
    fn inner(&self) -> &dyn Bucket {
        &*self.inner
    }

    async fn around<T: wasmkeep_bucket::Answer>(
        &self,
        request: wasmkeep_bucket::Request<'_>,
        call: impl std::future::Future<Output = wasmkeep_bucket::Result<T>> + Send,
    ) -> wasmkeep_bucket::Result<T> {
        use wasmkeep_bucket::Request;
        match request {
            Request::Get { key } if self.fail_read.lock().take_if(|k| k == key).is_some() => {
                self.note("lost");
                return Err(wasmkeep_bucket::Error::Unavailable {
                    key: key.to_owned(),
                    reason: "injected by the test".into(),
                });
            }
            Request::ListPage {
                prefix,
                start_after: None,
            }
            | Request::ListKeys { prefix } => self.note(prefix),
            _ => {}
        }
        let answer = call.await;
        if let Request::PutIfAbsent { key, .. }
        | Request::PutIfAbsentUnhurried { key, .. }
        | Request::PutIfAbsentAlone { key, .. } = request
            && answer.is_ok()
            && self.lose_write.lock().take_if(|k| k == key).is_some()
        {
            *self.fail_read.lock() = Some(key.to_owned());
            return Err(wasmkeep_bucket::Error::OutcomeUnknown {
                key: key.to_owned(),
                reason: "injected by the test".into(),
            });
        }
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listing_of_the_control_keys_per_heartbeat_serves_moves_and_deletes() {
    let (_dir, key_file) = key_file();
    let log = Arc::new(ListLog::new(Arc::new(MemoryBucket::new())));
    let bucket: Arc<dyn Bucket> = Arc::clone(&log) as Arc<dyn Bucket>;
    let keys = Keys::new(&AppName::default_app());
    deploy_counter(&*bucket).await;
    // Work for both passes: a delete key for an actor nobody holds (and
    // one in the shape before per-request keys, which a node still carries
    // out), and a move key that names no actor (the move pass deletes it).
    let deleted = ActorId::parse("demo/counter/gone").unwrap();
    let delete_key = keys.delete_key(&deleted, "1").unwrap();
    bucket.put(&delete_key, Bytes::new()).await.unwrap();
    let before_upgrade = ActorId::parse("demo/counter/old").unwrap();
    let old_key = keys.delete_requests_prefix(&before_upgrade);
    let old_key = old_key.trim_end_matches('/');
    bucket.put(old_key, Bytes::new()).await.unwrap();
    let bad_move = format!("{}not-a-move", keys.moves_prefix());
    bucket.put(&bad_move, Bytes::new()).await.unwrap();

    let a = start(Arc::clone(&bucket), "n1", &key_file).await;
    // Each heartbeat refreshes the peers with one listing of `nodes/`.
    let nodes = keys.nodes_prefix();
    let refreshes = |p: &[String]| p.iter().filter(|x| **x == nodes).count();
    let prefixes = log.wait_for(|p| refreshes(p) >= 5).await;
    a.node.shutdown(Duration::from_secs(10)).await;

    let control = keys.control_prefix();
    let control_lists: Vec<&String> = prefixes
        .iter()
        .filter(|p| p.starts_with(&control))
        .collect();
    assert!(
        control_lists.iter().all(|p| **p == control),
        "the passes list `control/` as one: {control_lists:?}"
    );
    // Between two refreshes (a whole heartbeat, the first one aside): one
    // listing of the control keys.
    let at: Vec<usize> = prefixes
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == nodes)
        .map(|(i, _)| i)
        .collect();
    for pair in at[1..].windows(2) {
        let between = prefixes[pair[0]..pair[1]]
            .iter()
            .filter(|p| **p == control)
            .count();
        assert_eq!(
            between, 1,
            "control listings in one heartbeat: {prefixes:?}"
        );
    }
    // ... and both passes acted on it.
    for key in [delete_key.as_str(), old_key] {
        assert!(
            matches!(
                bucket.get(key).await,
                Err(wasmkeep_bucket::Error::NotFound { .. })
            ),
            "{key} was carried out"
        );
    }
    assert!(matches!(
        bucket.get(&bad_move).await,
        Err(wasmkeep_bucket::Error::NotFound { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_pass_that_may_hold_the_record_gives_it_back() {
    let (_dir, key_file) = key_file();
    let log = Arc::new(ListLog::new(Arc::new(MemoryBucket::new())));
    let bucket: Arc<dyn Bucket> = Arc::clone(&log) as Arc<dyn Bucket>;
    let keys = Keys::new(&AppName::default_app());
    deploy_counter(&*bucket).await;
    // The pass's acquire of the actor nobody holds lands, but its answer is
    // lost and the read that would tell fails: the acquire reports an
    // error while the record names this node.
    let actor = ActorId::parse("demo/counter/lost").unwrap();
    let delete_key = keys.delete_key(&actor, "1").unwrap();
    bucket.put(&delete_key, Bytes::new()).await.unwrap();
    *log.lose_write.lock() = Some(keys.owner(&actor));
    let a = start(Arc::clone(&bucket), "n1", &key_file).await;
    let lost_at = log.wait_for(|p| p.iter().any(|x| x == "lost")).await.len();
    // The request is withdrawn, so no later pass takes the actor up again:
    // only the pass that failed can give the record back.
    log.inner.delete(&delete_key).await.unwrap();
    // Two peer refreshes after the failure: the next heartbeat's, then the
    // one after it, which comes after that heartbeat's leftovers step.
    let nodes = keys.nodes_prefix();
    log.wait_for(|p| p[lost_at..].iter().filter(|x| **x == nodes).count() >= 2)
        .await;
    let record = a.node.peering.ownership.read(&actor).await.unwrap();
    assert!(
        record.as_ref().is_none_or(|(r, _)| !r.held),
        "the record was given back: {record:?}"
    );
    a.node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_whose_acquire_may_have_landed_gives_the_record_back() {
    let (_dir, key_file) = key_file();
    let log = Arc::new(ListLog::new(Arc::new(MemoryBucket::new())));
    let bucket: Arc<dyn Bucket> = Arc::clone(&log) as Arc<dyn Bucket>;
    let keys = Keys::new(&AppName::default_app());
    deploy_counter(&*bucket).await;
    let actor = ActorId::parse("demo/counter/lost").unwrap();
    *log.lose_write.lock() = Some(keys.owner(&actor));
    let a = start(Arc::clone(&bucket), "n1", &key_file).await;
    // Once the node serves, the actor's first event's acquire lands, but
    // the node cannot tell: the event fails, and nothing else asks for the
    // actor.
    let r = send_until_served(&a.addr, "POST", "/demo/counter/other/increment").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(&a.addr, "POST", "/demo/counter/lost/increment", Vec::new()).await;
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    let lost_at = log.wait_for(|p| p.iter().any(|x| x == "lost")).await.len();
    let nodes = keys.nodes_prefix();
    log.wait_for(|p| p[lost_at..].iter().filter(|x| **x == nodes).count() >= 2)
        .await;
    let record = a.node.peering.ownership.read(&actor).await.unwrap();
    assert!(
        record.as_ref().is_none_or(|(r, _)| !r.held),
        "the record was given back: {record:?}"
    );
    // The actor itself is fine.
    let r = send(&a.addr, "POST", "/demo/counter/lost/increment", Vec::new()).await;
    assert_eq!((r.status, r.text().trim()), (200, "1"));
    a.node.shutdown(Duration::from_secs(10)).await;
}

/// A draining node that finds its own hold on an actor's record, with no
/// stub (as a hand-over whose log did not settle leaves it: ADR 0062),
/// serves the actor itself, whichever node the client asks: no peer may take
/// an actor held by a live node, so routing it to one would refuse it until
/// the node stopped (sim seeds 1796643202, 1796647630).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_node_serves_an_actor_whose_record_it_still_holds() {
    let (_dir, bucket, a, b) = two_nodes().await;
    let keys = Keys::new(&AppName::default_app());
    // Both nodes serve and know each other.
    for (addr, name) in [(&a.addr, "warm-a"), (&b.addr, "warm-b")] {
        let r = send_until_served(addr, "POST", &format!("/demo/counter/{name}/increment")).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let actor = ActorId::parse("demo/counter/kept").unwrap();
    let acquired = a.node.peering.ownership.acquire(&actor).await.unwrap();
    assert!(
        matches!(acquired, AcquireOutcome::Acquired { .. }),
        "{acquired:?}"
    );
    bucket
        .put(
            &keys.drain(&NodeId::new("n1").unwrap()),
            Bytes::from_static(b"wasmkeep-drain 1\n"),
        )
        .await
        .unwrap();
    for _ in 0..200 {
        if a.node.peering.drain.is_active() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(a.node.peering.drain.is_active(), "n1 drains");
    let r = send(&a.addr, "POST", "/demo/counter/kept/increment", Vec::new()).await;
    assert_eq!((r.status, r.text().trim()), (200, "1"), "asked at n1");
    let r = send(&b.addr, "POST", "/demo/counter/kept/increment", Vec::new()).await;
    assert_eq!((r.status, r.text().trim()), (200, "2"), "asked at n2");
    a.node.shutdown(Duration::from_secs(10)).await;
    b.node.shutdown(Duration::from_secs(10)).await;
}

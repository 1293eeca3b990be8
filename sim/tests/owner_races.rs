//! The two ownership races the simulation found (ADR 0006, Findings), each
//! as a small directed test on the real `wasmkeep-cluster` types, so the fix
//! (`sim/findings/0001-owner-races.patch`) can be checked without a seed.
//! Ignored until the fix lands: today both fail.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_cluster::{
    AcquireOutcome, Clock, LeaseObserver, LeaseReturn, NodeLease, Ownership, Peers, Random,
    SeededRandom, SystemClock,
};
use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId};

const TTL: Duration = Duration::from_secs(10);

struct TestNode {
    id: NodeId,
    bucket: Arc<dyn Bucket>,
    lease: Arc<NodeLease>,
    peers: Peers,
    ownership: Ownership,
    keys: Keys,
}

impl TestNode {
    fn new(bucket: MemoryBucket, name: &str, seed: u64) -> Self {
        let bucket: Arc<dyn Bucket> = Arc::new(bucket);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let random: Arc<dyn Random> = Arc::new(SeededRandom::new(seed));
        let id = NodeId::new(name).expect("valid node id");
        let keys = Keys::new(&AppName::default_app());
        let lease = Arc::new(NodeLease::new(clock.clone(), random.clone(), TTL));
        let observer = Arc::new(LeaseObserver::new(
            clock.clone(),
            TTL,
            LeaseObserver::default_margin(TTL),
        ));
        let peers = Peers::new(
            bucket.clone(),
            keys.clone(),
            AppName::default_app(),
            id.clone(),
            clock.clone(),
            observer.clone(),
        );
        let ownership = Ownership::new(
            bucket.clone(),
            keys.clone(),
            id.clone(),
            lease.clone(),
            observer,
            clock,
            random,
        );
        Self {
            id,
            bucket,
            lease,
            peers,
            ownership,
            keys,
        }
    }

    async fn beat(&self) {
        let heartbeat = Heartbeat {
            node: self.id.clone(),
            advertise: "http://127.0.0.1:1".into(),
            app: AppName::default_app(),
            incarnation: String::new(),
            state: NodeState::Serving,
            classes: ClassesServed::All,
            resident_actors: 0,
            drain: DrainState::None,
            secrets: false,
            capabilities: BTreeSet::new(),
            generation: 0,
            sockets_closing: 0,
            releases_failed: 0,
            holder: String::new(),
        };
        self.lease
            .renew(&*self.bucket, &self.keys.node(&self.id), heartbeat)
            .await
            .expect("the heartbeat is written");
    }
}

fn actor() -> ActorId {
    ActorId::parse("t/counter/x").expect("valid actor id")
}

#[tokio::test(start_paused = true)]
async fn a_stale_sighting_does_not_take_an_actor_from_a_rejoined_node() {
    let root = MemoryBucket::new();
    let a = TestNode::new(root.new_client(1), "a", 1);
    let b = TestNode::new(root.new_client(2), "b", 2);
    a.beat().await;
    b.beat().await;
    b.peers.refresh().await.expect("refresh");
    // `a` lapses and rejoins (a new incarnation), then acquires the actor;
    // `b` has not refreshed since and still sees the old incarnation.
    a.lease.rejoin();
    a.beat().await;
    assert!(matches!(
        a.ownership.acquire(&actor()).await.expect("acquire"),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(
        b.ownership.acquire(&actor()).await.expect("acquire"),
        AcquireOutcome::HeldBy { node: a.id.clone() },
        "b took an actor that a holds with a valid lease"
    );
}

#[tokio::test(start_paused = true)]
async fn a_racing_first_acquire_is_not_overwritten() {
    let root = MemoryBucket::new();
    let a = TestNode::new(root.new_client(1), "a", 1);
    // Every request of `b` takes 100 ms.
    let slow = root.new_client(2);
    slow.faults()
        .set_latency(Duration::from_millis(100), Duration::ZERO);
    let b = Arc::new(TestNode::new(slow, "b", 2));
    a.beat().await;
    b.beat().await;
    b.peers.refresh().await.expect("refresh");
    // `a` holds the actor, so `b`'s first attempt (a put-if-absent, which
    // answers 100 ms from now) conflicts. `a` releases at 150 ms, so `b`'s
    // read of the record (200 ms) finds none; `a` acquires again at 250 ms,
    // between that read and `b`'s next put-if-absent (300 ms).
    let AcquireOutcome::Acquired { etag, .. } =
        a.ownership.acquire(&actor()).await.expect("acquire")
    else {
        panic!("a acquires a free actor");
    };
    let racing = {
        let b = b.clone();
        tokio::spawn(async move { b.ownership.acquire(&actor()).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        a.ownership.release(&actor(), &etag).await,
        LeaseReturn::Released
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        a.ownership.acquire(&actor()).await.expect("acquire"),
        AcquireOutcome::Acquired { .. }
    ));
    let outcome = racing.await.expect("joins").expect("acquire");
    assert_eq!(
        outcome,
        AcquireOutcome::HeldBy { node: a.id.clone() },
        "b overwrote the record a had just created"
    );
}

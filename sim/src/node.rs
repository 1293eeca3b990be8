//! One simulated node: the real [`NodeLease`], [`LeaseObserver`], [`Peers`]
//! and [`Ownership`] over its own bucket client and skewed clock, a
//! heartbeat loop like the server's (renew every period; on a lapse drop
//! every actor without releasing and rejoin with a new incarnation), and a
//! mailbox that serves the built-in counter actor: an increment runs only on
//! a node that holds the actor and has a valid lease, through the real
//! [`ActorStore`], and is acknowledged only when its output gate opens.
//!
//! Everything a node runs is in its [`JoinSet`], so a crash aborts it all at
//! once; its bucket client is partitioned first, so the stores' flushers,
//! which are not in the set, cannot write after the crash either.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{
    AcquireOutcome, Clock, LeaseObserver, NodeLease, Ownership, Peers, Random, SeededRandom,
};
use wasmkeep_store::{ActorStore, OutputGate, StoreConfig, WriterId};
use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId};

use crate::World;
use crate::bucket::SimBucket;
use crate::clock::SkewedClock;

/// Events that may wait in one node's mailbox; past it a client gets 503.
pub const MAILBOX_LEN_MAX: usize = 64;
/// Committed events whose output gates one node awaits; the mailbox waits
/// when it is full.
pub const GATES_IN_FLIGHT_MAX: usize = 256;

/// One increment of one actor, from a client or forwarded by a peer.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: u64,
    pub actor: ActorId,
    /// Forwarded once already: never forwarded again (the one-hop guard).
    pub forwarded: bool,
}

struct Resident {
    store: ActorStore,
    incarnation: String,
}

pub struct Node {
    pub index: usize,
    pub id: NodeId,
    pub bucket: Arc<SimBucket>,
    pub lease: Arc<NodeLease>,
    pub peers: Arc<Peers>,
    ownership: Ownership,
    keys: Keys,
    world: Arc<World>,
    actors: Mutex<BTreeMap<ActorId, Resident>>,
    tasks: Mutex<Option<JoinSet<()>>>,
    mailbox: mpsc::Sender<Event>,
    gates: mpsc::Sender<(Event, OutputGate)>,
    paused_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("id", &self.id).finish()
    }
}

impl Node {
    /// Starts a node process (a new incarnation): its heartbeat loop and
    /// its mailbox.
    pub fn start(world: &Arc<World>, index: usize, bucket: Arc<SimBucket>, seed: u64) -> Arc<Self> {
        let config = &world.config;
        let id = NodeId::new(format!("n{index}")).expect("n<digits> is a valid node id");
        let clock: Arc<dyn Clock> = Arc::new(SkewedClock::new(world.start, world.skew_ms(index)));
        let random: Arc<dyn Random> = Arc::new(SeededRandom::new(seed));
        let lease = Arc::new(NodeLease::new(
            clock.clone(),
            random.clone(),
            config.lease_ttl,
        ));
        let observer = Arc::new(LeaseObserver::new(
            clock.clone(),
            config.lease_ttl,
            LeaseObserver::default_margin(config.lease_ttl),
        ));
        let dyn_bucket: Arc<dyn Bucket> = bucket.clone();
        let keys = world.keys.clone();
        let peers = Arc::new(Peers::new(
            dyn_bucket.clone(),
            keys.clone(),
            AppName::default_app(),
            id.clone(),
            clock.clone(),
            observer.clone(),
        ));
        let ownership = Ownership::new(
            dyn_bucket,
            keys.clone(),
            id.clone(),
            lease.clone(),
            observer,
            clock,
            random,
        );
        let (mailbox, inbox) = mpsc::channel(MAILBOX_LEN_MAX);
        let (gates, gates_rx) = mpsc::channel(GATES_IN_FLIGHT_MAX);
        let node = Arc::new(Self {
            index,
            id,
            bucket,
            lease,
            peers,
            ownership,
            keys,
            world: world.clone(),
            actors: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(Some(JoinSet::new())),
            mailbox,
            gates,
            paused_until: Mutex::new(None),
        });
        node.log(format!("start, incarnation {}", node.lease.incarnation()));
        node.spawn(node.clone().heartbeat_loop());
        node.spawn(node.clone().mailbox_loop(inbox));
        node.spawn(node.clone().gate_loop(gates_rx));
        node
    }

    pub fn name(&self) -> &str {
        self.id.as_str()
    }

    fn log(&self, what: impl AsRef<str>) {
        self.world.truth.lock().log(self.name(), what);
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock();
        if let Some(set) = tasks.as_mut() {
            // Reap finished tasks so the set stays as small as what runs.
            while set.try_join_next().is_some() {}
            set.spawn(task);
        }
    }

    /// Hands an event to this node's mailbox; false when it is full.
    pub fn deliver(&self, event: Event) -> bool {
        self.mailbox.try_send(event).is_ok()
    }

    /// The process dies: nothing it runs takes another step, nothing it
    /// would write reaches the bucket.
    pub fn crash(&self) {
        self.bucket.faults().set_partitioned(true);
        let tasks = self.tasks.lock().take();
        drop(tasks);
        let actors = std::mem::take(&mut *self.actors.lock());
        drop(actors);
        self.log("crash");
    }

    /// Like a long GC pause of the heartbeat: no renewal until `until`.
    pub fn pause_until(&self, until: Instant) {
        *self.paused_until.lock() = Some(until);
    }

    pub fn unpause(&self) {
        *self.paused_until.lock() = None;
    }

    fn is_paused(&self) -> bool {
        self.paused_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            node: self.id.clone(),
            advertise: format!("http://127.0.0.1:{}", 7000 + self.index),
            app: AppName::default_app(),
            incarnation: String::new(),
            state: NodeState::Serving,
            classes: ClassesServed::All,
            resident_actors: self.actors.lock().len() as u64,
            drain: DrainState::None,
            secrets: false,
            capabilities: BTreeSet::new(),
            generation: 0,
        }
    }

    /// The server's heartbeat loop (`wasmkeep-server/src/cluster.rs`), on
    /// this node's clock and bucket client.
    async fn heartbeat_loop(self: Arc<Self>) {
        let period = self.world.config.heartbeat_period;
        let bucket_time_max = self.world.config.lease_ttl;
        let key = self.keys.node(&self.id);
        let mut first = true;
        loop {
            if !first {
                tokio::time::sleep(period).await;
            }
            first = false;
            if self.is_paused() {
                continue;
            }
            if self.lease.is_lapsed() {
                let dropped = std::mem::take(&mut *self.actors.lock());
                let count = dropped.len();
                drop(dropped);
                self.lease.rejoin();
                self.log(format!(
                    "lease lapsed: dropped {count} actors, rejoined as incarnation {}",
                    self.lease.incarnation()
                ));
            }
            let renewed = tokio::time::timeout(
                bucket_time_max,
                self.lease.renew(&*self.bucket, &key, self.heartbeat()),
            )
            .await;
            match renewed {
                Ok(Ok(())) => self.log("renewed"),
                Ok(Err(e)) => self.log(format!("renewal failed: {e}")),
                Err(_) => self.log("renewal timed out"),
            }
            match tokio::time::timeout(bucket_time_max, self.peers.refresh()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.log(format!("peer refresh failed: {e}")),
                Err(_) => self.log("peer refresh timed out"),
            }
        }
    }

    async fn mailbox_loop(self: Arc<Self>, mut inbox: mpsc::Receiver<Event>) {
        while let Some(event) = inbox.recv().await {
            self.handle(event).await;
        }
    }

    fn outcome(&self, event: &Event, what: impl AsRef<str>) {
        self.log(format!(
            "event {} {}: {}",
            event.id,
            event.actor,
            what.as_ref()
        ));
    }

    async fn handle(self: &Arc<Self>, event: Event) {
        if !self.lease.is_valid() {
            self.outcome(&event, "refused: lease not valid (503)");
            return;
        }
        let incarnation = self.lease.incarnation();
        let resident = self.actors.lock().remove(&event.actor);
        let mut resident = match resident {
            Some(r) if r.incarnation == incarnation && !r.store.is_failed() => r,
            _ => match self.activate(&event, &incarnation).await {
                Some(r) => r,
                None => return,
            },
        };
        // The acquire and the restore waited for the bucket: look again.
        if !self.lease.is_valid() || self.lease.incarnation() != incarnation {
            self.outcome(&event, "refused: lease not valid after activation (503)");
            return;
        }
        match increment(&mut resident.store) {
            Ok(gate) => {
                let actor = event.actor.to_string();
                {
                    let mut truth = self.world.truth.lock();
                    *truth.attempted.entry(actor.clone()).or_default() += 1;
                    truth.check_commit(
                        self.name(),
                        &incarnation,
                        &self.keys.owner(&event.actor),
                        &actor,
                        event.id,
                    );
                }
                self.outcome(&event, "committed");
                self.actors.lock().insert(event.actor.clone(), resident);
                // One task awaits every gate in commit order: tokio wakes
                // several waiters of one watch channel in an order it
                // draws at random, which would make the trace differ.
                if self.gates.send((event, gate)).await.is_err() {
                    self.log("gate queue closed");
                }
            }
            Err(e) => {
                self.outcome(&event, format!("failed: {e}"));
                if !resident.store.is_failed() {
                    self.actors.lock().insert(event.actor.clone(), resident);
                }
            }
        }
    }

    /// Acquires the actor and restores its store; `None` when the event
    /// went elsewhere or failed (its outcome is logged).
    async fn activate(self: &Arc<Self>, event: &Event, incarnation: &str) -> Option<Resident> {
        match self.ownership.acquire(&event.actor).await {
            Ok(AcquireOutcome::Acquired { .. }) => {}
            Ok(AcquireOutcome::HeldBy { node }) => {
                self.forward(event.clone(), node);
                return None;
            }
            Err(e) => {
                self.outcome(event, format!("failed: acquire: {e}"));
                return None;
            }
        }
        if self.lease.incarnation() != incarnation {
            self.outcome(event, "failed: rejoined during the acquire");
            return None;
        }
        let writer = WriterId {
            node: self.name().to_owned(),
            incarnation: incarnation.to_owned(),
        };
        let bucket: Arc<dyn Bucket> = self.bucket.clone();
        match ActorStore::open(
            bucket,
            self.keys.clone(),
            event.actor.clone(),
            writer,
            StoreConfig::default(),
        )
        .await
        {
            Ok(store) => {
                self.log(format!(
                    "activated {} (incarnation {incarnation})",
                    event.actor
                ));
                Some(Resident {
                    store,
                    incarnation: incarnation.to_owned(),
                })
            }
            Err(e) => {
                self.outcome(event, format!("failed: restore: {e}"));
                None
            }
        }
    }

    fn forward(self: &Arc<Self>, event: Event, holder: NodeId) {
        if event.forwarded {
            self.outcome(
                &event,
                format!("refused: held by {holder}, already forwarded once (503)"),
            );
            return;
        }
        let Some(target) = self.world.index_of(&holder) else {
            self.outcome(&event, format!("refused: held by unknown node {holder}"));
            return;
        };
        let (lost, delay) = self.world.forward_draw();
        if lost {
            self.outcome(&event, format!("forward to {holder} lost"));
            return;
        }
        self.outcome(&event, format!("forwarded to {holder}"));
        let world = self.world.clone();
        self.spawn(async move {
            tokio::time::sleep(delay).await;
            world.deliver(
                target,
                Event {
                    forwarded: true,
                    ..event
                },
            );
        });
    }

    async fn gate_loop(self: Arc<Self>, mut gates: mpsc::Receiver<(Event, OutputGate)>) {
        while let Some((event, gate)) = gates.recv().await {
            self.await_gate(event, gate).await;
        }
    }

    async fn await_gate(&self, event: Event, gate: OutputGate) {
        match gate.await {
            Ok(()) => {
                *self
                    .world
                    .truth
                    .lock()
                    .acked
                    .entry(event.actor.to_string())
                    .or_default() += 1;
                self.outcome(&event, "acknowledged");
            }
            Err(e) => {
                self.outcome(&event, format!("not acknowledged: {e}"));
                let mut actors = self.actors.lock();
                if actors
                    .get(&event.actor)
                    .is_some_and(|r| r.store.is_failed())
                {
                    actors.remove(&event.actor);
                }
            }
        }
    }
}

/// The counter actor's one event: add one, in one transaction.
fn increment(store: &mut ActorStore) -> Result<OutputGate, String> {
    store.begin_event().map_err(|e| e.to_string())?;
    let ran = store
        .execute(
            "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
            &[],
        )
        .and_then(|_| {
            store.execute(
                "INSERT INTO counter (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1",
                &[],
            )
        });
    if let Err(e) = ran {
        store.rollback_event();
        return Err(e.to_string());
    }
    store.commit_event().map_err(|e| e.to_string())
}

/// The counter as a fresh store restores it (0 when nothing was written).
pub async fn read_counter(
    bucket: Arc<dyn Bucket>,
    keys: &Keys,
    actor: &ActorId,
) -> Result<u64, String> {
    let writer = WriterId {
        node: "checker".into(),
        incarnation: "checker".into(),
    };
    let mut store = ActorStore::open(
        bucket,
        keys.clone(),
        actor.clone(),
        writer,
        StoreConfig::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let found = match store.query("SELECT n FROM counter WHERE id = 1", &[]) {
        Ok(rows) => match rows.rows.first().and_then(|r| r.first()) {
            Some(wasmkeep_store::SqlValue::Integer(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        },
        // No increment ever became durable: the table was never created.
        Err(e) if e.message.contains("no such table") => 0,
        Err(e) => return Err(e.to_string()),
    };
    store.rollback_event();
    Ok(found)
}

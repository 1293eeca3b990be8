//! The node: its resident actors (stubs), `ensure_owner`, the class
//! registry, its place in the cluster (node lease, peers, ownership records,
//! hints, signer) and the long-running parts (alarm timer, alarm sweep, class
//! poll, heartbeat) started and stopped together.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::{Request, Response, Runtime};
use wasmkeep_store::StoreConfig;
use wasmkeep_types::{ActorId, ClassName, Keys};

use wasmkeep_cluster::hints::{ActorHint, Hints};
use wasmkeep_cluster::{
    Clock, LeaseObserver, NodeLease, OsRandom, Ownership, Peers, Random, Signer, SystemClock,
};
use wasmkeep_types::NodeId;
use wasmkeep_types::heartbeat::{DrainState, NodeState};

use crate::actor::alarms::{AlarmTimer, Fire};
use crate::actor::guest::{GuestClass, GuestEngine, WasmtimeEngine};
use crate::actor::host::SharedSockets;
use crate::actor::mailbox::{self, Job};
use crate::ops::counting::CountingBucket;
use crate::ops::metrics::Metrics;
use crate::peering::forward::{self, HandBack, Hop, Routed};
use crate::peering::heartbeat;
use crate::signal::Signal;
use crate::{Error, NodeConfig, Result, actor::classes};

/// A resident actor's in-memory state shared outside its mailbox.
#[derive(Debug)]
pub struct Stub {
    pub id: ActorId,
    pub(crate) tx: mpsc::Sender<Box<Job>>,
    pub(crate) sockets: SharedSockets,
    last_used_ms: AtomicI64,
    /// Set when the actor's store failed; the mailbox drops the actor.
    pub(crate) broken: AtomicBool,
    pub(crate) broken_notify: Notify,
    /// The actor this actor's running event is calling, if any: the edges of
    /// the node's waits-for graph, followed to refuse deadlocking calls.
    waiting_on: Mutex<Option<ActorId>>,
    /// Set when this node's lease lapsed: the mailbox drops the actor
    /// without releasing it (self-fencing).
    pub(crate) fenced: AtomicBool,
    /// How the activation went; `ensure_owner` waits for it.
    pub(crate) activation: Signal<Activation>,
    /// The owner this actor learned it has elsewhere, at most 1 s old:
    /// `ensure_owner` asks it before the node's hints (the seed's "in the
    /// service and in the actor's own state"), and sends the actor's events
    /// there while it lasts, so learn it only once this node no longer holds
    /// the actor (a failed activation, a fenced store). Forgotten wherever
    /// the node's hint is ([`Node::forget_hints`]).
    pub hint: ActorHint,
}

/// A deployed class with no version loaded on this node.
#[derive(Debug, Clone)]
pub(crate) enum ClassPending {
    Loading,
    /// Its last load failed, for this reason; the next poll tries again.
    Failed(String),
}

/// The outcome of a stub's activation.
#[derive(Debug, Clone)]
pub(crate) enum Activation {
    Pending,
    Ready,
    /// Another node holds the actor.
    Elsewhere(NodeId),
    /// Anything else; `unknown_class` keeps a 404 a 404.
    Failed {
        reason: String,
        unknown_class: Option<String>,
    },
}

impl Stub {
    fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn open_sockets(&self) -> usize {
        self.sockets.lock().sockets.len()
    }

    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Release);
        self.broken_notify.notify_one();
    }

    pub(crate) fn mark_fenced(&self) {
        self.fenced.store(true, Ordering::Release);
        self.broken.store(true, Ordering::Release);
        self.broken_notify.notify_one();
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

/// A hand-over under way: dropping it (at its end, or if the hand-over
/// stops early) tells whoever waits to activate the actor again.
pub(crate) struct Released(Arc<Signal<bool>>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

/// An actor's place in the map, held by [`Node::reserve`]. Dropping it (at
/// the end, or when the pass that holds it is cut short by its time limit)
/// gives the place back and wakes the actor's waiting events: a place left
/// behind with its signal set would send them round `ensure_owner` forever.
pub(crate) struct Reservation<'n> {
    node: &'n Node,
    actor: ActorId,
    signal: Arc<Signal<bool>>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut actors = self.node.actors.lock();
        if let Some(Entry::Releasing(signal)) = actors.get(&self.actor)
            && Arc::ptr_eq(signal, &self.signal)
        {
            actors.remove(&self.actor);
        }
        drop(actors);
        self.signal.set(true);
        self.node.actors_changed.notify_waiters();
    }
}

/// Where an actor runs.
#[derive(Debug, Clone)]
pub enum Owner {
    /// Resident here.
    Local(Arc<Stub>),
    /// Held by `peer`, reached at its advertised `url`.
    Elsewhere { peer: NodeId, url: String },
}

enum Entry {
    Live(Arc<Stub>),
    /// Hibernating: wait for `true`, then look again.
    Releasing(Arc<Signal<bool>>),
}

/// The resident actors. Every event looks its actor up here: a hash of the
/// name, where an ordered map compared it with ~10 others (1,000 actors).
/// Names are chosen by clients, so the hasher is seeded per process; what
/// walks the map puts what it found in name order itself.
type ActorMap = HashMap<ActorId, Entry, foldhash::fast::RandomState>;

/// At `--max-actors`, this fraction of it (at least one) is asked to
/// hibernate at once: 1,000 resident actors give batches of 15.
const EVICTION_BATCH_DIVISOR: usize = 64;

/// Retry-After for a request to a class still compiling here: a Rust
/// component compiles in about a second, a JavaScript one in ~16 s.
const CLASS_LOADING_RETRY_AFTER_S: u32 = 2;

/// At shutdown, the least time given to deleting the heartbeat when the
/// releases used up the grace.
const RESIGN_TIME_MIN: Duration = Duration::from_secs(2);

pub struct Node {
    pub config: NodeConfig,
    pub bucket: Arc<dyn Bucket>,
    pub keys: Keys,
    /// Loads classes and runs guests (wasmtime, or the simulation's actor).
    pub guest: Arc<dyn GuestEngine>,
    pub node_id: NodeId,
    /// The value of `x-wasmkeep-node` naming this node, built once (every
    /// response carries it); `None` if the id is no valid header value.
    pub node_header: Option<hyper::header::HeaderValue>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    pub lease: Arc<NodeLease>,
    pub peers: Peers,
    pub ownership: Ownership,
    pub hints: Hints,
    /// Signs and verifies node calls; `None` without a cluster key.
    pub signer: Option<Arc<Signer>>,
    /// Sends signed calls to peers; `None` without a cluster key.
    pub transport: Option<Arc<dyn crate::peering::peer::PeerTransport>>,
    /// TLS roots for calls to `https` peers (the WebSocket relay).
    pub(crate) tls_client: Arc<rustls::ClientConfig>,
    /// The advertised URL (heartbeat line 3).
    pub advertise: String,
    pub(crate) state: Mutex<NodeState>,
    /// Held while the heartbeat is written, so a resignation never races a renewal.
    pub(crate) heartbeat_lock: tokio::sync::Mutex<()>,
    /// Turned true once the lease was resigned: the heartbeat task stops.
    pub(crate) resigned_tx: watch::Sender<bool>,
    /// The incarnation whose lease has not been valid yet, and when its first
    /// heartbeat write was tried (see `heartbeat::renew`).
    pub(crate) unproven: Mutex<Option<(String, Instant)>>,
    pub(crate) store_config: StoreConfig,
    classes: RwLock<HashMap<ClassName, Arc<dyn GuestClass>>>,
    /// Deployed classes with no version loaded here yet, being loaded or
    /// failed to load: their requests are asked to retry, not told the
    /// class does not exist.
    classes_pending: Mutex<HashMap<ClassName, ClassPending>>,
    /// Hashed (see [`ActorMap`]); the passes whose order shows (the drain,
    /// eviction ties) sort by name, so a simulation run repeats.
    actors: Mutex<ActorMap>,
    actors_changed: Notify,
    pub(crate) timer: Arc<AlarmTimer>,
    shutdown_tx: watch::Sender<bool>,
    socket_ids: AtomicU64,
    /// The drain of this node (ADR 0014): heartbeat line 9.
    pub drain: crate::peering::drain::Drain,
    /// Moves of single actors under way (ADR 0017).
    pub moves: crate::peering::moves::Moves,
    /// Holds a failed release left behind, given back once per heartbeat.
    pub(crate) leftovers: crate::peering::leftovers::Leftovers,
    /// The app's secrets as this node reads them (ADR 0016): heartbeat line 10.
    pub secrets: crate::actor::secrets::Secrets,
    /// Tenant bearer tokens on client requests.
    pub tenants: crate::front::tenants::TenantGate,
}

/// What a node runs on besides its configuration and bucket.
pub struct Platform {
    /// Loads classes and runs guests.
    pub guest: Arc<dyn GuestEngine>,
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    /// Signs and verifies node calls; `None`: from `--cluster-key-file`, if given.
    pub signer: Option<Arc<Signer>>,
    /// Sends node calls (used only with a signer); `None`: HTTP(S).
    pub transport: Option<Arc<dyn crate::peering::peer::PeerTransport>>,
}

impl Platform {
    /// wasmtime, the system clock, the OS's randomness, HTTP(S) peer calls.
    pub fn production(runtime: Runtime) -> Self {
        Self {
            guest: Arc::new(WasmtimeEngine::new(runtime)),
            clock: Arc::new(SystemClock),
            random: Arc::new(OsRandom),
            signer: None,
            transport: None,
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.node_id)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Builds the node, loads the deployed classes, writes its first
    /// heartbeat (the node lease: `starting`, then `serving`) and starts the
    /// alarm timer, the alarm sweep, the class poll and the heartbeat.
    pub async fn start(
        config: NodeConfig,
        bucket: Arc<dyn Bucket>,
        runtime: Runtime,
    ) -> Result<Arc<Self>> {
        Self::start_with(config, bucket, Platform::production(runtime)).await
    }

    /// [`start`](Self::start) on the given platform: guest engine, clock,
    /// randomness, signer and transport (the simulation gives its own).
    pub async fn start_with(
        config: NodeConfig,
        bucket: Arc<dyn Bucket>,
        platform: Platform,
    ) -> Result<Arc<Self>> {
        let Platform {
            guest,
            clock,
            random,
            signer,
            transport,
        } = platform;
        let metrics = Arc::new(Metrics::default());
        let bucket: Arc<dyn Bucket> = Arc::new(CountingBucket::new(bucket, Arc::clone(&metrics)));
        let (shutdown_tx, _) = watch::channel(false);
        let (resigned_tx, _) = watch::channel(false);
        let keys = Keys::new(&config.app);
        let node_id = config.node_id.clone();
        let lease = Arc::new(NodeLease::new(
            Arc::clone(&clock),
            Arc::clone(&random),
            config.lease_ttl,
        ));
        let observer = Arc::new(LeaseObserver::new(
            Arc::clone(&clock),
            config.lease_ttl,
            LeaseObserver::default_margin(config.lease_ttl),
        ));
        let peers = Peers::new(
            Arc::clone(&bucket),
            keys.clone(),
            config.app.clone(),
            node_id.clone(),
            Arc::clone(&clock),
            Arc::clone(&observer),
        );
        let ownership = Ownership::new(
            Arc::clone(&bucket),
            keys.clone(),
            node_id.clone(),
            Arc::clone(&lease),
            observer,
            Arc::clone(&clock),
            Arc::clone(&random),
        );
        let tls_client = wasmkeep_transport::tls::client_config(config.tls_ca.as_deref())
            .map_err(|e| Error::Config(e.to_string()))?;
        let signer = match (signer, &config.cluster_key_file) {
            (Some(signer), _) => Some(signer),
            (None, Some(path)) => Some(Arc::new(Signer::from_key_file(
                path,
                node_id.to_string(),
                Arc::clone(&clock),
                Arc::clone(&random),
            )?)),
            (None, None) => None,
        };
        let secrets = crate::actor::secrets::Secrets::load(
            &*bucket,
            &keys,
            config.secrets_identity.as_deref(),
        )
        .await?;
        let tenants = crate::front::tenants::TenantGate::new(config.tenant_tokens);
        let transport = match transport {
            Some(transport) if signer.is_some() => Some(transport),
            _ => signer.as_ref().map(|s| {
                let http: Arc<dyn crate::peering::peer::PeerTransport> =
                    Arc::new(crate::peering::peer::HttpTransport::new(
                        Arc::clone(s),
                        Arc::clone(&tls_client),
                    ));
                http
            }),
        };
        let timer = AlarmTimer::new(Arc::clone(&clock));
        let node = Arc::new(Self {
            keys,
            node_header: hyper::header::HeaderValue::from_str(node_id.as_str()).ok(),
            node_id,
            advertise: config.advertise_url(),
            config,
            bucket,
            guest,
            metrics,
            hints: Hints::new(Arc::clone(&clock)),
            clock,
            random,
            lease,
            peers,
            ownership,
            signer,
            transport,
            tls_client,
            state: Mutex::new(NodeState::Starting),
            heartbeat_lock: tokio::sync::Mutex::new(()),
            resigned_tx,
            unproven: Mutex::new(None),
            store_config: StoreConfig::default(),
            classes: RwLock::new(HashMap::new()),
            classes_pending: Mutex::new(HashMap::new()),
            actors: Mutex::new(ActorMap::default()),
            actors_changed: Notify::new(),
            timer,
            shutdown_tx,
            socket_ids: AtomicU64::new(1),
            drain: crate::peering::drain::Drain::default(),
            moves: crate::peering::moves::Moves::default(),
            leftovers: crate::peering::leftovers::Leftovers::default(),
            secrets,
            tenants,
        });
        if node.signer.is_none() {
            tracing::info!(
                "no --cluster-key-file: this node runs alone (it keeps its lease and ownership records, but forwards nothing)"
            );
        }
        heartbeat::claim(&node).await?;
        node.load_classes_at_start().await?;
        *node.state.lock() = NodeState::Serving;
        heartbeat::renew(&node).await?;
        if let Err(e) = node.peers.refresh().await {
            tracing::warn!(error = %e, "first peer refresh failed");
        }
        node.spawn_background();
        Ok(node)
    }

    /// The first class poll, with the lease renewed meanwhile: compiling a
    /// class takes seconds (a JavaScript one ~16 s here), and a start that
    /// compiles several could outlast the lease TTL, which the first renewal
    /// after it would then find lapsed (the node exited).
    async fn load_classes_at_start(self: &Arc<Self>) -> Result<()> {
        let renewing = async {
            loop {
                tokio::time::sleep(self.config.heartbeat_period).await;
                if let Err(e) = heartbeat::renew(self).await {
                    tracing::warn!(error = %e, "lease renewal during the start's class loads failed");
                }
            }
        };
        tokio::select! {
            // Checked in order: a run replays the same way (ADR 0006).
            biased;
            loaded = classes::poll(self) => loaded,
            never = renewing => never,
        }
    }

    fn spawn_background(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(Arc::clone(&self.timer).run(
            move |fire| {
                if let Some(node) = weak.upgrade() {
                    node.deliver_alarm(fire);
                }
            },
            self.shutdown_rx(),
        ));
        tokio::spawn(heartbeat::heartbeat_loop(Arc::clone(self)));
        let node = Arc::clone(self);
        let mut shutdown = self.shutdown_rx();
        tokio::spawn(async move {
            let heap_trim = crate::ops::heap::HeapTrim::default();
            let mut next_sweep = Instant::now();
            loop {
                if Instant::now() >= next_sweep {
                    if let Err(e) = node.sweep_alarms().await {
                        tracing::warn!(error = %e, "alarm sweep failed");
                    }
                    next_sweep = Instant::now() + node.config.alarm_sweep_period;
                }
                tokio::select! {
                    // Checked in order: a run replays the same way (ADR 0006).
                    biased;
                    _ = tokio::time::sleep(node.config.heartbeat_period) => {}
                    _ = shutdown.changed() => return,
                }
                if *shutdown.borrow() {
                    return;
                }
                if let Err(e) = classes::poll(&node).await {
                    tracing::warn!(error = %e, "class poll failed");
                }
                heap_trim.after_unloads(&node.metrics);
            }
        });
    }

    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    pub(crate) fn next_socket_id(&self) -> u64 {
        self.socket_ids.fetch_add(1, Ordering::Relaxed)
    }

    // ---- classes -------------------------------------------------------

    pub fn class(&self, class: &ClassName) -> Result<Arc<dyn GuestClass>> {
        if !self.config.serves_class(class) {
            return Err(Error::UnknownClass(class.to_string()));
        }
        if let Some(component) = self.classes.read().get(class) {
            return Ok(Arc::clone(component));
        }
        let reason = match self.classes_pending.lock().get(class) {
            None => return Err(Error::UnknownClass(class.to_string())),
            Some(ClassPending::Loading) => {
                format!("class {class} was just deployed and is being compiled here")
            }
            Some(ClassPending::Failed(why)) => format!(
                "class {class} is deployed but did not load on this node ({why}); it is tried again every heartbeat period"
            ),
        };
        Err(Error::Unavailable {
            reason,
            retry_after_s: CLASS_LOADING_RETRY_AFTER_S,
        })
    }

    /// Notes where the load of `class`'s first version here stands; `None`
    /// once a version is loaded.
    pub(crate) fn set_class_pending(&self, class: &ClassName, pending: Option<ClassPending>) {
        let mut map = self.classes_pending.lock();
        match pending {
            Some(pending) => {
                map.insert(class.clone(), pending);
            }
            None => {
                map.remove(class);
            }
        }
    }

    pub(crate) fn class_digest(&self, class: &ClassName) -> Option<String> {
        self.classes
            .read()
            .get(class)
            .map(|c| c.digest().to_owned())
    }

    pub(crate) fn set_class(&self, class: ClassName, component: Arc<dyn GuestClass>) {
        self.classes.write().insert(class, component);
    }

    // ---- actors ----------------------------------------------------------

    /// Number of resident actors (hibernating ones included until released).
    pub fn resident_count(&self) -> usize {
        self.actors.lock().len()
    }

    /// Where `actor`'s events go: resident here → `Local`; a fresh owner
    /// hint → `Elsewhere`; otherwise a new stub whose activation acquires
    /// the ownership record (`Local`) or finds another node's valid hold
    /// (`Elsewhere`, and a hint).
    pub async fn ensure_owner(self: &Arc<Self>, actor: &ActorId) -> Result<Owner> {
        // A draining node looks for the actor elsewhere once; only when no
        // eligible peer exists does it acquire the actor here.
        let mut drain_looked = false;
        let stub = loop {
            // `None`: look elsewhere first (the node drains).
            let waiter: Option<Arc<Signal<bool>>> = {
                let mut actors = self.actors.lock();
                match actors.get(actor) {
                    Some(Entry::Live(stub)) => {
                        // The actor's own hint answers first.
                        if let Some(peer) = stub.hint.get(self.clock.now())
                            && peer != self.node_id
                        {
                            drop(actors);
                            return self.elsewhere(actor, peer);
                        }
                        stub.touch(self.clock.wall_ms());
                        break Arc::clone(stub);
                    }
                    Some(Entry::Releasing(released)) => Some(Arc::clone(released)),
                    None => {
                        // A drained node that stops still sends events on.
                        let drain_look = !drain_looked && self.drain.is_active();
                        if self.is_shutting_down() && !drain_look {
                            return Err(Error::unavailable("the node is shutting down"));
                        }
                        self.class(&actor.class)?;
                        // A move under way: the actor goes to its target,
                        // which claims it, never back here (ADR 0017).
                        if let Some(target) = self.moves.target(actor)
                            && target != self.node_id
                        {
                            drop(actors);
                            return self.elsewhere(actor, target);
                        }
                        if let Some(peer) = self.hints.get(actor)
                            && peer != self.node_id
                        {
                            drop(actors);
                            return self.elsewhere(actor, peer);
                        }
                        if drain_look {
                            None
                        } else if self.is_shutting_down() {
                            return Err(Error::unavailable("the node is shutting down"));
                        } else {
                            if !self.lease.is_valid() {
                                return Err(Error::unavailable(
                                    "this node's lease is not valid; it serves again once renewed",
                                ));
                            }
                            if actors.len() >= self.config.actors_max {
                                self.evict_lru(&actors)?;
                            }
                            let stub = self.spawn_stub(actor.clone());
                            actors.insert(actor.clone(), Entry::Live(Arc::clone(&stub)));
                            self.metrics
                                .resident_actors
                                .store(actors.len() as i64, Ordering::Relaxed);
                            break stub;
                        }
                    }
                }
            };
            match waiter {
                // A hibernating actor is released before it is activated again.
                Some(waiter) => {
                    waiter.wait_for(|released| *released).await;
                }
                None => {
                    if let Some(owner) = self.drain_route(actor).await? {
                        return Ok(owner);
                    }
                    drain_looked = true;
                }
            }
        };
        let outcome = stub
            .activation
            .wait_for(|a| !matches!(a, Activation::Pending))
            .await;
        match outcome {
            Activation::Ready | Activation::Pending => Ok(Owner::Local(stub)),
            Activation::Elsewhere(peer) => {
                // Everyone still holding this stub asks it first.
                stub.hint.learn(&peer, self.clock.now());
                self.elsewhere(actor, peer)
            }
            Activation::Failed {
                unknown_class: Some(class),
                ..
            } => Err(Error::UnknownClass(class)),
            Activation::Failed { reason, .. } => Err(Error::unavailable(reason)),
        }
    }

    /// Forgets the owner hints for `actor`, the node's and its stub's: the
    /// record decides the next time.
    pub(crate) fn forget_hints(&self, actor: &ActorId) {
        self.hints.forget(actor);
        if let Some(Entry::Live(stub)) = self.actors.lock().get(actor) {
            stub.hint.forget();
        }
    }

    /// Learns from a peer that `holder` holds `actor`: the node's hint and
    /// the stub's both name it until they expire (one naming this node is
    /// forgotten instead, so that the record decides).
    pub(crate) fn learn_holder(&self, actor: &ActorId, holder: &NodeId) {
        if holder == &self.node_id {
            self.forget_hints(actor);
            return;
        }
        self.hints.learn(actor, holder);
        if let Some(Entry::Live(stub)) = self.actors.lock().get(actor) {
            stub.hint.learn(holder, self.clock.now());
        }
    }

    /// Where a draining node sends an actor it does not hold: to the node
    /// whose hold is valid, else to the eligible peer chosen by rendezvous
    /// hashing on the actor id (which claims it on the first event).
    /// `None` when no eligible peer exists: the node keeps serving.
    async fn drain_route(&self, actor: &ActorId) -> Result<Option<Owner>> {
        if let Some(holder) = self.ownership.holder(actor).await?
            && holder != self.node_id
        {
            self.hints.learn(actor, &holder);
            return self.elsewhere(actor, holder).map(Some);
        }
        Ok(self.peers.choose(actor).map(|p| Owner::Elsewhere {
            peer: p.heartbeat.node,
            url: p.heartbeat.advertise,
        }))
    }

    /// The actor's stub when it is resident here and not being released.
    pub(crate) fn live_stub(&self, actor: &ActorId) -> Option<Arc<Stub>> {
        match self.actors.lock().get(actor) {
            Some(Entry::Live(stub)) => Some(Arc::clone(stub)),
            _ => None,
        }
    }

    /// Whether the actor has a stub here, live or being released.
    pub(crate) fn has_stub(&self, actor: &ActorId) -> bool {
        self.actors.lock().contains_key(actor)
    }

    /// The resident actors that are not being released.
    pub(crate) fn live_stubs(&self) -> Vec<Arc<Stub>> {
        let mut stubs: Vec<Arc<Stub>> = self
            .actors
            .lock()
            .values()
            .filter_map(|e| match e {
                Entry::Live(stub) => Some(Arc::clone(stub)),
                Entry::Releasing(_) => None,
            })
            .collect();
        // In name order, whatever the map's: a drain asks them in an order
        // a simulation run repeats.
        stubs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        stubs
    }

    /// Notified whenever an actor leaves this node.
    pub(crate) fn actors_changed(&self) -> &Notify {
        &self.actors_changed
    }

    /// The classes this node has loaded and serves.
    pub(crate) fn loaded_classes(&self) -> Vec<ClassName> {
        self.classes
            .read()
            .keys()
            .filter(|c| self.config.serves_class(c))
            .cloned()
            .collect()
    }

    /// `Elsewhere` for `peer`, with its advertised URL, or 503 when its
    /// heartbeat was never seen.
    fn elsewhere(&self, actor: &ActorId, peer: NodeId) -> Result<Owner> {
        match self.peers.get(&peer) {
            Some(p) => Ok(Owner::Elsewhere {
                peer,
                url: p.heartbeat.advertise,
            }),
            None => {
                self.forget_hints(actor);
                Err(Error::unavailable(format!(
                    "actor {actor} is held by node {peer}, whose address is not known yet"
                )))
            }
        }
    }

    /// Asks the least recently used idle actors to hibernate (a batch of
    /// them, so the scan of every resident actor is paid once per batch of
    /// activations at the limit, not once per activation), or refuses when
    /// every resident actor is busy.
    fn evict_lru(&self, actors: &ActorMap) -> Result<()> {
        let mut idle: Vec<&Arc<Stub>> = actors
            .values()
            .filter_map(|e| match e {
                Entry::Live(stub) if stub.open_sockets() == 0 && stub.queue_is_empty() => {
                    Some(stub)
                }
                _ => None,
            })
            .collect();
        if idle.is_empty() {
            return Err(Error::unavailable(
                "every resident actor is busy (max-actors reached)",
            ));
        }
        let batch = (self.config.actors_max / EVICTION_BATCH_DIVISOR).clamp(1, idle.len());
        if batch < idle.len() {
            // Ties (one millisecond) go by name, whatever the map's order.
            idle.select_nth_unstable_by(batch - 1, |a, b| {
                let used = |s: &Arc<Stub>| s.last_used_ms.load(Ordering::Relaxed);
                used(a).cmp(&used(b)).then_with(|| a.id.cmp(&b.id))
            });
        }
        for stub in &idle[..batch] {
            // Best effort: a full mailbox is not idle and will not be chosen.
            let _ = stub.tx.try_send(Box::new(Job::Hibernate));
        }
        Ok(())
    }

    fn spawn_stub(self: &Arc<Self>, id: ActorId) -> Arc<Stub> {
        let (tx, rx) = mpsc::channel(self.config.limits.mailbox_events_max);
        let stub = Arc::new(Stub {
            id,
            tx,
            sockets: SharedSockets::default(),
            last_used_ms: AtomicI64::new(self.clock.wall_ms()),
            broken: AtomicBool::new(false),
            broken_notify: Notify::new(),
            waiting_on: Mutex::new(None),
            fenced: AtomicBool::new(false),
            activation: Signal::new(Activation::Pending),
            hint: ActorHint::default(),
        });
        let node = Arc::clone(self);
        let guarded = Arc::clone(&stub);
        tokio::spawn(async move {
            let run = mailbox::run(Arc::clone(&node), Arc::clone(&guarded), rx);
            if let Err(panic) = futures::FutureExt::catch_unwind(AssertUnwindSafe(run)).await {
                node.mailbox_panicked(&guarded, &*panic);
            }
        });
        stub
    }

    /// A panic in an actor's mailbox (a bug of ours) must not wedge the
    /// actor: its stub would stay in the map with nobody reading its events,
    /// answering 503 "changing hands" until the node restarts. The unwind
    /// dropped the mailbox's store and instance (their uncommitted writes
    /// with them), and its waiting events, which answer 503; the stub is
    /// forgotten here, so the next event activates the actor afresh from
    /// the bucket. The ownership record stays this node's, as after a
    /// hibernation that kept it.
    fn mailbox_panicked(&self, stub: &Arc<Stub>, panic: &(dyn std::any::Any + Send)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with no message".to_owned());
        self.metrics.mailbox_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!(actor = %stub.id, panic = %what, "the actor's mailbox panicked (a wasmkeep bug): its events in flight failed, and its next event activates it afresh");
        if matches!(stub.activation.get(), Activation::Pending) {
            stub.activation.set(Activation::Failed {
                reason: format!("actor {} failed to activate (an internal error)", stub.id),
                unknown_class: None,
            });
        }
        let mut actors = self.actors.lock();
        let orphaned = match actors.get(&stub.id) {
            Some(Entry::Live(s)) => Arc::ptr_eq(s, stub),
            // Its release guard was dropped by the unwind (so it reads
            // released) without the entry being removed: while the map is
            // locked, a release that ended normally shows no entry at all.
            Some(Entry::Releasing(released)) => released.get(),
            None => false,
        };
        if orphaned {
            actors.remove(&stub.id);
        }
        self.metrics
            .resident_actors
            .store(actors.len() as i64, Ordering::Relaxed);
        drop(actors);
        self.actors_changed.notify_waiters();
    }

    /// Step 1 of a hand-over: under the map lock, if the actor is still idle
    /// (or `force`), mark it releasing. Returns the sender to signal release.
    pub(crate) fn begin_release(
        &self,
        stub: &Arc<Stub>,
        idle_only: bool,
        queue_empty: bool,
    ) -> Option<Released> {
        let mut actors = self.actors.lock();
        let ours = matches!(actors.get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub));
        if !ours {
            return None;
        }
        if idle_only && (!queue_empty || stub.open_sockets() > 0) {
            return None;
        }
        let released = Arc::new(Signal::new(false));
        actors.insert(stub.id.clone(), Entry::Releasing(Arc::clone(&released)));
        Some(Released(released))
    }

    /// Last step of a hand-over: forget the actor and wake whoever waits.
    pub(crate) fn end_release(&self, stub: &Arc<Stub>, released: Option<Released>) {
        let mut actors = self.actors.lock();
        match actors.get(&stub.id) {
            Some(Entry::Releasing(_)) if released.is_some() => {
                actors.remove(&stub.id);
            }
            Some(Entry::Live(s)) if Arc::ptr_eq(s, stub) => {
                actors.remove(&stub.id);
            }
            _ => {}
        }
        self.metrics
            .resident_actors
            .store(actors.len() as i64, Ordering::Relaxed);
        drop(actors);
        // Dropping it wakes whoever waits for the release.
        drop(released);
        self.actors_changed.notify_waiters();
    }

    /// Holds `actor`'s place in the map while it has no stub here, as a
    /// release does: its events wait until the [`Reservation`] is dropped
    /// (deleting an actor that is not resident, ADR 0055). `None` when the
    /// actor has a stub.
    pub(crate) fn reserve(&self, actor: &ActorId) -> Option<Reservation<'_>> {
        let mut actors = self.actors.lock();
        if actors.contains_key(actor) {
            return None;
        }
        let signal = Arc::new(Signal::new(false));
        actors.insert(actor.clone(), Entry::Releasing(Arc::clone(&signal)));
        Some(Reservation {
            node: self,
            actor: actor.clone(),
            signal,
        })
    }

    /// Whether the stub is still this node's live stub for its actor.
    pub(crate) fn is_live(&self, stub: &Arc<Stub>) -> bool {
        matches!(self.actors.lock().get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub))
    }

    /// Runs a request (from HTTP or another actor) as an event of `actor`,
    /// here or, when another node holds it, there (one hop).
    /// `chain` lists the actors waiting on this call, `actor` last.
    pub async fn request(
        self: &Arc<Self>,
        actor: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
    ) -> Result<Response> {
        self.route_request(actor, request, chain, Hop::Client)
            .await
            .map(|routed| routed.response)
    }

    /// [`request`](Self::request), saying how it arrived and which node ran it.
    pub async fn route_request(
        self: &Arc<Self>,
        actor: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
        hop: Hop,
    ) -> Result<Routed> {
        /// A stub that closes between lookup and send is looked up again, this often.
        const STALE_STUB_RETRIES_MAX: usize = 3;
        /// Bodies up to this size are copied before a forward, so that a
        /// hand-back (a "released" answer from a holder whose drain this
        /// node has not seen yet, or a "moved" one naming another holder)
        /// is sent once more instead of failing the client.
        const HAND_BACK_COPY_BYTES_MAX: usize = 64 * 1024;
        let mut job = Box::new(Job::Request {
            request,
            chain,
            reply: None,
            started: Instant::now(),
        });
        let (reply_tx, reply_rx) = oneshot::channel();
        if let Job::Request { reply, .. } = &mut *job {
            *reply = Some(reply_tx);
        }
        if matches!(hop, Hop::Forwarded { .. }) {
            // The sender found this node named as the holder: a hint of ours
            // saying otherwise is older than its reading, so the record decides.
            self.forget_hints(actor);
        }
        // A forwarded request may come back handed back, with nothing run:
        // "released" by a draining holder (it is then run here or sent to
        // the new holder) or "moved" (the peer names the holder it sees,
        // which gets it). Once: a second hand-back goes to the client.
        let mut hand_back_retry = true;
        for _ in 0..STALE_STUB_RETRIES_MAX {
            let stub = match self.ensure_owner(actor).await? {
                Owner::Local(stub) => stub,
                Owner::Elsewhere { peer, url } => {
                    let Job::Request {
                        request,
                        chain,
                        reply,
                        started,
                    } = *job
                    else {
                        return Err(Error::Runtime("a request job is a request".into()));
                    };
                    if matches!(hop, Hop::Forwarded { .. }) && self.drain.is_active() {
                        // Sending it on would be a second hop. Nothing ran
                        // here: the sender, which is not draining, may claim
                        // the actor itself and run the request.
                        return Err(Error::Released {
                            actor: actor.to_string(),
                            peer: peer.to_string(),
                        });
                    }
                    // Kept for a second try when the holder may hand it
                    // back: it drains (as this node last saw it: its drain
                    // may have begun since) or the copy is cheap.
                    let holder_drains = self
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.heartbeat.drain != DrainState::None);
                    let cheap = request.body.len() <= HAND_BACK_COPY_BYTES_MAX;
                    let kept = (hand_back_retry && hop == Hop::Client && (holder_drains || cheap))
                        .then(|| (request.clone(), chain.clone()));
                    let mut routed = Box::pin(forward::forward_request(
                        self,
                        actor,
                        &peer,
                        &url,
                        request,
                        chain,
                        hop.clone(),
                    ))
                    .await?;
                    let hand_back = forward::hand_back(&mut routed.response);
                    match kept {
                        Some((request, chain)) if hand_back != HandBack::None => {
                            hand_back_retry = false;
                            match hand_back {
                                HandBack::Moved(holder) => self.learn_holder(actor, &holder),
                                _ => self.forget_hints(actor),
                            }
                            job = Box::new(Job::Request {
                                request,
                                chain,
                                reply,
                                started,
                            });
                            continue;
                        }
                        _ => return Ok(routed),
                    }
                }
            };
            match stub.tx.try_send(job) {
                Ok(()) => {
                    return match reply_rx.await {
                        Ok(result) => result.map(|response| Routed {
                            response,
                            ran_on: None,
                        }),
                        Err(_) => Err(Error::unavailable(format!(
                            "actor {actor} stopped before answering"
                        ))),
                    };
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(Error::unavailable(format!(
                        "the mailbox of {actor} is full"
                    )));
                }
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    job = back;
                    tokio::task::yield_now().await;
                }
            }
        }
        Err(Error::unavailable(format!(
            "actor {actor} is changing hands"
        )))
    }

    /// A call from `caller`'s running event to `target`. Refused with "call
    /// cycle" when `target` (transitively) waits on `caller` already: two
    /// concurrent calls A→B and B→A would otherwise wait on each other.
    pub(crate) async fn call(
        self: &Arc<Self>,
        caller: &ActorId,
        target: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
    ) -> Result<Response> {
        let caller_stub = match self.actors.lock().get(caller) {
            Some(Entry::Live(stub)) => Some(Arc::clone(stub)),
            _ => None,
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = Some(target.clone());
        }
        let cycle = self
            .waits_on_any(target, std::slice::from_ref(caller))
            .is_some();
        let result = if cycle {
            Err(Error::Call(format!(
                "call cycle: {target} is already waiting on {caller}"
            )))
        } else {
            self.request(target, request, chain).await
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = None;
        }
        result
    }

    /// The first of `callers` that `actor` waits on here, following the
    /// waits-for path through this node's actors (an actor waits on the one
    /// its running event calls). A call from any of them to `actor` would
    /// wait on itself: a deadlock, across nodes too when the incoming call
    /// chain names an actor that this node's actors wait on.
    pub(crate) fn waits_on_any(&self, actor: &ActorId, callers: &[ActorId]) -> Option<ActorId> {
        /// Longest waits-for path followed (longer ones are cut, not refused).
        const WAITS_FOR_STEPS_MAX: usize = 64;
        if callers.is_empty() {
            // A client's request: nobody to wait on (and no lookups to pay).
            return None;
        }
        let mut at = actor.clone();
        for _ in 0..WAITS_FOR_STEPS_MAX {
            let next = match self.actors.lock().get(&at) {
                Some(Entry::Live(stub)) => stub.waiting_on.lock().clone(),
                _ => None,
            }?;
            if callers.contains(&next) {
                return Some(next);
            }
            at = next;
        }
        None
    }

    /// Sends an event that no client waits for (alarm, socket), waiting for
    /// room in the mailbox. `Err(HeldElsewhere)` when another node holds it.
    pub(crate) async fn send_event(self: &Arc<Self>, actor: &ActorId, job: Job) -> Result<()> {
        let mut job = Box::new(job);
        for _ in 0..3 {
            let stub = match self.ensure_owner(actor).await? {
                Owner::Local(stub) => stub,
                Owner::Elsewhere { peer, .. } => return Err(Error::HeldElsewhere { node: peer }),
            };
            match stub.tx.send(job).await {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => job = back,
            }
        }
        Err(Error::unavailable(format!(
            "actor {actor} is changing hands"
        )))
    }

    /// Called by the timer: the alarm goes to the actor's mailbox,
    /// activating the actor if needed, or is handed off to the node that
    /// holds the actor.
    pub(crate) fn deliver_alarm(self: &Arc<Self>, fire: Fire) {
        let due_ms = self.clock.wall_ms();
        self.deliver_alarm_at(fire, due_ms);
    }

    /// [`Node::deliver_alarm`] for a delivery due at `due_ms`, which may be
    /// later: the alarm of an actor this node hands over keeps its retry
    /// count and backoff on the next holder.
    pub(crate) fn deliver_alarm_at(self: &Arc<Self>, fire: Fire, due_ms: i64) {
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let actor = fire.actor.clone();
            let mut sent = node.alarm_here(fire.clone(), due_ms).await;
            if let Err(Error::HeldElsewhere { node: peer }) = &sent {
                sent = forward::hand_off_alarm(&node, peer, &fire, due_ms).await;
            }
            // In the mailbox (which marked it arrived when it ran it),
            // handed off, or scheduled again below.
            node.timer.arrived(&fire);
            if let Err(e) = sent {
                // Not deliverable now (shutting down, class gone, bucket down):
                // the committed alarm stays; the sweep or next activation finds it.
                tracing::warn!(%actor, error = %e, "alarm not delivered");
                if !node.is_shutting_down()
                    && matches!(
                        e,
                        Error::Unavailable { .. }
                            | Error::Bucket(_)
                            | Error::Store(_)
                            | Error::Cluster(_)
                            | Error::HeldElsewhere { .. }
                    )
                {
                    let retry_at = (node.clock.wall_ms() + 1000).max(due_ms);
                    node.timer.set(retry_at, fire);
                }
            }
        });
    }

    /// Delivers an alarm on this node, activating the actor if needed: into
    /// its mailbox when due, else into the timer. `Err(HeldElsewhere)` when
    /// another node holds the actor.
    pub(crate) async fn alarm_here(self: &Arc<Self>, fire: Fire, due_ms: i64) -> Result<()> {
        if due_ms <= self.clock.wall_ms() {
            return self.send_event(&fire.actor.clone(), Job::Alarm(fire)).await;
        }
        match self.ensure_owner(&fire.actor).await? {
            Owner::Local(_) => {
                self.timer.adopt_retry(fire, due_ms);
                Ok(())
            }
            Owner::Elsewhere { peer, .. } => Err(Error::HeldElsewhere { node: peer }),
        }
    }

    /// Lists the alarm index and arms the timer for alarms of actors that are
    /// not resident here and fall due before the next sweep.
    pub async fn sweep_alarms(self: &Arc<Self>) -> Result<()> {
        let horizon_ms = self.clock.wall_ms()
            + i64::try_from(self.config.alarm_sweep_period.as_millis()).unwrap_or(i64::MAX);
        for meta in self.bucket.list(&self.keys.alarms_prefix()).await? {
            let Ok(actor) = self.keys.parse_alarm_key(&meta.key) else {
                tracing::warn!(key = %meta.key, "alarm index key does not parse; skipped");
                continue;
            };
            if !self.config.serves_class(&actor.class)
                || self.actors.lock().contains_key(&actor)
                || self.timer.contains(&actor)
            {
                continue;
            }
            let object = match self.bucket.get(&meta.key).await {
                Ok(object) => object,
                Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let Some(at_ms) = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
            else {
                tracing::warn!(key = %meta.key, "alarm index body does not parse; skipped");
                continue;
            };
            if at_ms <= horizon_ms {
                self.timer.set_if_absent(actor, at_ms);
            }
        }
        Ok(())
    }

    /// Graceful stop: no new activations, every resident actor finishes its
    /// queued events, closes its sockets (1012) and hibernates (releasing its
    /// ownership record); then the node resigns its lease (deletes its
    /// heartbeat) so peers need not wait for the TTL.
    pub async fn shutdown(&self, grace: Duration) {
        *self.state.lock() = NodeState::Stopping;
        let _ = self.shutdown_tx.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = self.actors_changed.notified();
            if self.actors.lock().is_empty() {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(
                    resident = self.resident_count(),
                    "shutdown grace expired with actors still resident"
                );
                break;
            }
        }
        // The heartbeat's delete gets what is left of the grace, and at
        // least a moment after a grace spent on slow releases.
        let resign_deadline = deadline.max(tokio::time::Instant::now() + RESIGN_TIME_MIN);
        heartbeat::resign(self, resign_deadline).await;
    }

    /// Self-fencing after a lapsed lease: every resident actor is dropped
    /// without releasing its ownership record (sockets closed with 1012).
    /// Returns once no actor is resident.
    pub(crate) async fn drop_every_actor(&self) {
        /// How often a slow drop is logged.
        const DROP_LOG_PERIOD: Duration = Duration::from_secs(5);
        loop {
            let notified = self.actors_changed.notified();
            for stub in &self.live_stubs() {
                stub.mark_fenced();
            }
            if self.actors.lock().is_empty() {
                return;
            }
            if tokio::time::timeout(DROP_LOG_PERIOD, notified)
                .await
                .is_err()
            {
                tracing::warn!(
                    resident = self.resident_count(),
                    "still dropping actors after the lease lapsed"
                );
            }
        }
    }

    /// The node's state as its heartbeat says it.
    pub fn node_state(&self) -> NodeState {
        *self.state.lock()
    }

    /// Serving: the lease is valid and the node is neither starting nor stopping.
    pub fn is_serving(&self) -> bool {
        !self.is_shutting_down() && self.node_state() == NodeState::Serving && self.lease.is_valid()
    }
}

impl Stub {
    /// Whether the stub's mailbox has no event waiting.
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.tx.capacity() == self.tx.max_capacity()
    }
}

// Compile-time check, never called: hyper and tokio::spawn need these futures Send.
#[allow(dead_code)]
fn _assert_send(node: Arc<Node>, actor: ActorId) {
    fn is_send<T: Send>(_: T) {}
    let (node2, actor2) = (Arc::clone(&node), actor.clone());
    is_send(async move { node.ensure_owner(&actor).await.map(|_| ()) });
    is_send(async move {
        let request = Request::default();
        node2
            .call(&actor2, &actor2, request, Vec::new())
            .await
            .map(|_| ())
    });
}

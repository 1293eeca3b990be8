//! The node: its resident actors (stubs), `ensure_owner`, the class
//! registry, its place in the cluster (node lease, peers, ownership records,
//! hints, signer) and the long-running parts (alarm timer, alarm sweep, class
//! poll, heartbeat) started and stopped together.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, watch};
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::{Request, Runtime};
use wasmkeep_store::StoreConfig;
use wasmkeep_types::{ActorId, ClassName, Keys};

use wasmkeep_cluster::hints::Hints;
use wasmkeep_cluster::{
    Clock, LeaseObserver, NodeLease, OsRandom, Ownership, Peers, Random, Signer, SystemClock,
};
use wasmkeep_types::NodeId;
use wasmkeep_types::heartbeat::NodeState;

use crate::actor::alarms::{AlarmTimer, TimerPart};
use crate::actor::guest::{GuestClass, GuestEngine, WasmtimeEngine};
pub use crate::actor::residents::Stub;
pub(crate) use crate::actor::residents::{Activation, ActorMap, ClassPending};
use crate::actor::upkeep::Upkeep;
use crate::ops::counting::CountingBucket;
use crate::ops::metrics::Metrics;
use crate::parts::Parts;
use crate::peering::heartbeat;
use crate::{Error, NodeConfig, Result, actor::classes};

/// Where an actor runs.
#[derive(Debug, Clone)]
pub enum Owner {
    /// Resident here.
    Local(Arc<Stub>),
    /// Held by `peer`, reached at its advertised `url`.
    Elsewhere { peer: NodeId, url: String },
}

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
    pub(crate) classes: RwLock<HashMap<ClassName, Arc<dyn GuestClass>>>,
    /// Deployed classes with no version loaded here yet, being loaded or
    /// failed to load: their requests are asked to retry, not told the
    /// class does not exist.
    pub(crate) classes_pending: Mutex<HashMap<ClassName, ClassPending>>,
    /// Hashed (see [`ActorMap`]); the passes whose order shows (the drain,
    /// eviction ties) sort by name, so a simulation run repeats.
    pub(crate) actors: Mutex<ActorMap>,
    pub(crate) actors_changed: Notify,
    pub(crate) timer: Arc<AlarmTimer>,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub(crate) socket_ids: AtomicU64,
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
    /// The long-running parts: which stopped, and how (the health answer).
    pub parts: Arc<Parts>,
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
        let parts = Arc::new(Parts::new(Arc::clone(&metrics)));
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
            parts,
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

    /// Starts the node's long-running parts, in this order (a simulation
    /// run repeats it): the alarm timer, the heartbeat, the upkeep.
    fn spawn_background(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.parts.spawn(
            TimerPart::new(Arc::clone(&self.timer), move |fire| {
                if let Some(node) = weak.upgrade() {
                    node.deliver_alarm(fire);
                }
            }),
            self.shutdown_rx(),
        );
        self.parts.spawn(
            heartbeat::HeartbeatPart::new(Arc::clone(self)),
            self.shutdown_rx(),
        );
        self.parts
            .spawn(Upkeep::new(Arc::clone(self)), self.shutdown_rx());
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

    /// The classes this node has loaded and serves.
    pub(crate) fn loaded_classes(&self) -> Vec<ClassName> {
        self.classes
            .read()
            .keys()
            .filter(|c| self.config.serves_class(c))
            .cloned()
            .collect()
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

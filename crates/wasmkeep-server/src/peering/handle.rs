//! The peering handle: this node's standing among its peers (its lease,
//! the peer table, ownership records, hints, the signer and transport of
//! node calls) and the state the passes keep between heartbeats (the
//! heartbeat's own, the drain's, the moves under way, leftover holds).
//! No pass lives here and nothing here takes the node: the passes
//! (`lease`, `heartbeat`, `drain`, `moves`, `leftovers`) do.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::hints::Hints;
use wasmkeep_cluster::{Clock, LeaseObserver, NodeLease, Ownership, Peers, Random, Signer};
use wasmkeep_types::heartbeat::{DrainState, NodeState};
use wasmkeep_types::{ActorId, Keys, NodeId};

use crate::ops::metrics::Metrics;
use crate::{Error, NodeConfig, Result};

/// This node's place in the cluster, a handle of the node: its lease, what
/// it knows of its peers and of who holds which actor, the ownership records
/// it claims, the signer and transport of node calls, and the state of its
/// drain, moves and leftovers that the heartbeat carries forward.
pub struct Peering {
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
    /// The heartbeat's own state: what it says and who writes it.
    pub(crate) beat: Beat,
    /// The drain of this node (ADR 0014): heartbeat line 9.
    pub drain: Drain,
    /// Moves of single actors under way (ADR 0017).
    pub moves: Moves,
    /// Holds a failed release left behind, given back once per heartbeat.
    pub(crate) leftovers: Leftovers,
    /// Operators' statements (`actor sql --write`) and imports (`actor
    /// import`) this node carries out now, by request key: a pass does not
    /// start one twice while it runs.
    pub(crate) operator_running: Mutex<BTreeSet<String>>,
}

/// What [`Peering::new`] takes from the node's platform.
pub(crate) struct PeeringPlatform {
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    pub signer: Option<Arc<Signer>>,
    pub transport: Option<Arc<dyn crate::peering::peer::PeerTransport>>,
}

impl Peering {
    /// The lease (not yet claimed), the peer table and ownership records
    /// over `bucket`, the signer from `--cluster-key-file` unless the
    /// platform gives one, and HTTP(S) node calls unless it gives a
    /// transport (used only with a signer).
    pub(crate) fn new(
        config: &NodeConfig,
        bucket: &Arc<dyn Bucket>,
        keys: &Keys,
        platform: PeeringPlatform,
    ) -> Result<Self> {
        let PeeringPlatform {
            clock,
            random,
            signer,
            transport,
        } = platform;
        let node_id = &config.node_id;
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
            Arc::clone(bucket),
            keys.clone(),
            config.app.clone(),
            node_id.clone(),
            Arc::clone(&clock),
            Arc::clone(&observer),
        );
        let ownership = Ownership::new(
            Arc::clone(bucket),
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
                random,
            )?)),
            (None, None) => None,
        };
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
        Ok(Self {
            lease,
            peers,
            ownership,
            hints: Hints::new(clock),
            signer,
            transport,
            tls_client,
            advertise: config.advertise_url(),
            beat: Beat::new(),
            drain: Drain::default(),
            moves: Moves::default(),
            leftovers: Leftovers::default(),
            operator_running: Mutex::new(BTreeSet::new()),
        })
    }

    /// The node's state as its heartbeat says it.
    pub fn node_state(&self) -> NodeState {
        *self.beat.state.lock()
    }

    pub(crate) fn set_node_state(&self, state: NodeState) {
        *self.beat.state.lock() = state;
    }
}

/// A move that has no outcome this long after it started is given up.
pub const MOVE_DEADLINE: Duration = Duration::from_secs(30);
/// Moves one node runs at once, each in its own task.
pub const MOVES_AT_ONCE_MAX: usize = 16;
/// Move keys for a target that is not ready are logged at most this often.
const WAITING_LOG_PERIOD: Duration = Duration::from_secs(30);

/// The heartbeat's own state, kept in the node's [`Peering`](super::Peering).
pub(crate) struct Beat {
    /// What the heartbeat says of the node: starting, serving, stopping.
    pub(crate) state: Mutex<NodeState>,
    /// Held while the heartbeat is written, so a resignation never races a renewal.
    pub(super) lock: tokio::sync::Mutex<()>,
    /// Turned true once the lease was resigned: the heartbeat part stops.
    pub(super) resigned_tx: watch::Sender<bool>,
    /// The incarnation whose lease has not been valid yet, and when its first
    /// heartbeat write was tried (see `lease::renew`).
    pub(super) unproven: Mutex<Option<(String, Instant)>>,
}

impl Beat {
    /// Turns true once the lease was resigned.
    pub(crate) fn resigned(&self) -> watch::Receiver<bool> {
        self.resigned_tx.subscribe()
    }

    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(NodeState::Starting),
            lock: tokio::sync::Mutex::new(()),
            resigned_tx: watch::channel(false).0,
            unproven: Mutex::new(None),
        }
    }
}

/// The node's drain, as heartbeat line 9 reports it.
#[derive(Debug, Default)]
pub struct Drain {
    pub(super) status: Mutex<Status>,
}

#[derive(Debug)]
pub(super) struct Status {
    pub(super) state: DrainState,
    /// The drain key exists (seen at the last heartbeat).
    pub(super) by_key: bool,
    /// SIGTERM asked for it.
    pub(super) by_signal: bool,
    /// Why a requested drain has not started (no eligible peer).
    pub(super) blocked: Option<String>,
    pub(super) blocked_logged: Option<Instant>,
    pub(super) task_running: bool,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            state: DrainState::None,
            by_key: false,
            by_signal: false,
            blocked: None,
            blocked_logged: None,
            task_running: false,
        }
    }
}

impl Drain {
    /// Heartbeat line 9.
    pub fn state(&self) -> DrainState {
        self.status.lock().state
    }

    /// Draining or drained: no actor is acquired here while an eligible peer
    /// exists.
    pub fn is_active(&self) -> bool {
        matches!(self.state(), DrainState::Draining | DrainState::Drained)
    }

    /// Why a requested drain waits, if it does.
    pub fn blocked_reason(&self) -> Option<String> {
        self.status.lock().blocked.clone()
    }
}

/// One move under way.
#[derive(Debug, Clone)]
struct Entry {
    target: NodeId,
    deadline: Instant,
    token: u64,
}

/// The moves under way on this node.
#[derive(Debug, Default)]
pub struct Moves {
    pub(super) state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    entries: HashMap<ActorId, Entry>,
    next_token: u64,
    /// Actors with a move or take task running (owner or target side).
    running: BTreeSet<ActorId>,
    /// Move keys naming this node whose actor nobody held at the last pass.
    pub(super) free_last_pass: BTreeSet<String>,
    waiting_logged: HashMap<String, Instant>,
}

impl Moves {
    /// The target of the actor's move under way, if any: `ensure_owner`
    /// sends the actor there instead of claiming it.
    pub fn target(&self, actor: &ActorId) -> Option<NodeId> {
        let mut state = self.state.lock();
        let entry = state.entries.get(actor)?;
        if Instant::now() >= entry.deadline {
            state.entries.remove(actor);
            return None;
        }
        Some(entry.target.clone())
    }

    /// Moves under way (entries, not yet ended).
    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn begin(&self, actor: &ActorId, target: &NodeId) -> u64 {
        let mut state = self.state.lock();
        state.next_token += 1;
        let token = state.next_token;
        state.entries.insert(
            actor.clone(),
            Entry {
                target: target.clone(),
                deadline: Instant::now() + MOVE_DEADLINE,
                token,
            },
        );
        token
    }

    /// Whether `token` is the attempt under way for `actor`.
    pub(crate) fn is_current(&self, actor: &ActorId, token: u64) -> bool {
        self.state
            .lock()
            .entries
            .get(actor)
            .is_some_and(|e| e.token == token && Instant::now() < e.deadline)
    }

    /// Ends the attempt `token` (if it is still the current one).
    pub(super) fn end(&self, actor: &ActorId, token: u64) {
        let mut state = self.state.lock();
        if state.entries.get(actor).is_some_and(|e| e.token == token) {
            state.entries.remove(actor);
        }
    }

    /// Drops the actor's move entry whatever its attempt (the planted bug).
    pub(crate) fn forget(&self, actor: &ActorId) {
        self.state.lock().entries.remove(actor);
    }

    /// Claims a task slot for `actor`: false when one runs for it already
    /// or [`MOVES_AT_ONCE_MAX`] run.
    pub(super) fn start_task(&self, actor: &ActorId) -> bool {
        let mut state = self.state.lock();
        if state.running.len() >= MOVES_AT_ONCE_MAX || state.running.contains(actor) {
            return false;
        }
        state.running.insert(actor.clone())
    }

    pub(super) fn finish_task(&self, actor: &ActorId) {
        self.state.lock().running.remove(actor);
    }

    /// True at most once per [`WAITING_LOG_PERIOD`] for `what`.
    pub(super) fn should_log(&self, what: &str) -> bool {
        let mut state = self.state.lock();
        let now = Instant::now();
        match state.waiting_logged.get(what) {
            Some(at) if now.duration_since(*at) < WAITING_LOG_PERIOD => false,
            _ => {
                state.waiting_logged.insert(what.to_owned(), now);
                true
            }
        }
    }
}

/// Actors whose release failed while this node's lease stayed valid.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    pub(super) actors: Mutex<BTreeSet<ActorId>>,
}

impl Leftovers {
    pub(crate) fn add(&self, metrics: &Metrics, actor: &ActorId) {
        let mut actors = self.actors.lock();
        actors.insert(actor.clone());
        metrics
            .leftover_holds
            .set(i64::try_from(actors.len()).unwrap_or(i64::MAX));
    }

    pub(super) fn remove(&self, metrics: &Metrics, actor: &ActorId) {
        let mut actors = self.actors.lock();
        actors.remove(actor);
        metrics
            .leftover_holds
            .set(i64::try_from(actors.len()).unwrap_or(i64::MAX));
    }
}

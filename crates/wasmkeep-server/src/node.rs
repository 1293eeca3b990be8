//! The node: its configuration, what every part runs on, a handle to each
//! part (the resident actors, the classes, the alarm timer, the secrets,
//! its peering, the front) and the long-running parts (alarm timer,
//! heartbeat, upkeep), started and stopped together.

use std::sync::Arc;

use tokio::sync::watch;
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Clock, OsRandom, Random, Signer, SystemClock};
use wasmkeep_runtime::Runtime;
use wasmkeep_types::heartbeat::NodeState;
use wasmkeep_types::{Keys, NodeId};

use crate::actor::alarms::AlarmTimer;
use crate::actor::classes::Classes;
use crate::actor::guest::{GuestEngine, WasmtimeEngine};
pub(crate) use crate::actor::residents::Activation;
use crate::actor::residents::Residents;
pub use crate::actor::residents::Stub;
use crate::actor::secrets::Secrets;
use crate::front::Front;
use crate::ops::metrics::Metrics;
use crate::parts::Parts;
use crate::peering::Peering;
use crate::{NodeConfig, Result};

/// Where an actor runs.
#[derive(Debug, Clone)]
pub enum Owner {
    /// Resident here.
    Local(Arc<Stub>),
    /// Held by `peer`, reached at its advertised `url`.
    Elsewhere { peer: NodeId, url: String },
}

/// One node: its configuration, what every part runs on (the bucket, its
/// keys, the node id, clock, metrics) and a handle to each part. The parts'
/// code lives in their folders; the node starts them and stops them.
pub struct Node {
    pub config: NodeConfig,
    pub bucket: Arc<dyn Bucket>,
    pub keys: Keys,
    pub node_id: NodeId,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The resident actors (`actor/residents`).
    pub residents: Residents,
    /// The classes served here and their loaded versions (`actor/classes`).
    pub classes: Classes,
    /// The alarm timer (`actor/alarms`).
    pub(crate) timer: Arc<AlarmTimer>,
    /// The app's secrets as this node reads them (ADR 0016): heartbeat line 10.
    pub secrets: Secrets,
    /// This node among its peers (`peering/`).
    pub peering: Peering,
    /// What the front keeps between requests (`front/`).
    pub front: Front,
    /// The long-running parts: which stopped, and how (the health answer).
    pub parts: Arc<Parts>,
    pub(crate) shutdown_tx: watch::Sender<bool>,
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
    /// Runs a bucket step of a hand-over unless this node's lease runs out
    /// first: then the step no longer matters (nothing can be acknowledged, and
    /// another node may take the actor once the lease is over), and a bucket
    /// that does not answer must not hold the actor past it.
    pub(crate) async fn unless_lapsed<T>(&self, step: impl Future<Output = T>) -> Option<T> {
        let lapsed = async {
            // Renewals move the end while the step runs.
            while let Some(until) = self.peering.lease.valid_until()
                && self.clock.now() < until
            {
                tokio::time::sleep_until(until).await;
            }
        };
        tokio::select! {
            biased;
            () = lapsed => None,
            out = step => Some(out),
        }
    }

    /// How a store of an actor of `class` is opened: the node's settings
    /// with the class's database maximum and retention window.
    pub(crate) fn store_config(
        &self,
        class: &wasmkeep_types::ClassName,
    ) -> wasmkeep_store::StoreConfig {
        let limits = self.classes.limits(class);
        wasmkeep_store::StoreConfig {
            database_bytes_max: limits.database_bytes_max,
            retention: limits.retention,
            ..self.residents.store_config.clone()
        }
    }

    /// Loads every class whose current version in the bucket differs from
    /// the one loaded here (see [`Classes::poll`]).
    pub async fn poll_classes(&self) -> Result<()> {
        self.classes
            .poll(&*self.bucket, &self.keys, &self.metrics)
            .await
    }

    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    /// Serving: the lease is valid and the node is neither starting nor stopping.
    pub fn is_serving(&self) -> bool {
        !self.is_shutting_down()
            && self.peering.node_state() == NodeState::Serving
            && self.peering.lease.is_valid()
    }
}

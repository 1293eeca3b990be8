//! This node among its peers: the heartbeat (the node lease), signed node
//! calls (forwarding, actor calls, alarm hand-offs, the take of a move),
//! the drain, moves and deletes of single actors, ownership records left
//! behind by a failed release, claiming the node id, and the transport of
//! node calls behind its trait. Decisions of ownership are the
//! `wasmkeep_cluster` crate's; this module carries them out.

pub(crate) mod deletes;
pub mod drain;
pub mod forward;
pub mod heartbeat;
pub mod holder;
pub mod lease;
pub(crate) mod leftovers;
pub mod moves;
pub mod peer;

use std::sync::Arc;

use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::hints::Hints;
use wasmkeep_cluster::{Clock, LeaseObserver, NodeLease, Ownership, Peers, Random, Signer};
use wasmkeep_types::Keys;
use wasmkeep_types::heartbeat::NodeState;

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
    pub transport: Option<Arc<dyn peer::PeerTransport>>,
    /// TLS roots for calls to `https` peers (the WebSocket relay).
    pub(crate) tls_client: Arc<rustls::ClientConfig>,
    /// The advertised URL (heartbeat line 3).
    pub advertise: String,
    /// The heartbeat's own state: what it says and who writes it.
    pub(crate) beat: lease::Beat,
    /// The drain of this node (ADR 0014): heartbeat line 9.
    pub drain: drain::Drain,
    /// Moves of single actors under way (ADR 0017).
    pub moves: moves::Moves,
    /// Holds a failed release left behind, given back once per heartbeat.
    pub(crate) leftovers: leftovers::Leftovers,
}

/// What [`Peering::new`] takes from the node's platform.
pub(crate) struct PeeringPlatform {
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    pub signer: Option<Arc<Signer>>,
    pub transport: Option<Arc<dyn peer::PeerTransport>>,
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
                let http: Arc<dyn peer::PeerTransport> = Arc::new(peer::HttpTransport::new(
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
            beat: lease::Beat::new(),
            drain: drain::Drain::default(),
            moves: moves::Moves::default(),
            leftovers: leftovers::Leftovers::default(),
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

//! One simulated node process: a real `wasmkeep_server::Node` (its heartbeat
//! loop, `ensure_owner`, mailboxes, alarm timer and sweep, drain and move
//! code, signed node calls) started on this process's platform: its own
//! bucket client ([`SimBucket`]), a skewed wall clock and tokio's virtual
//! monotonic clock ([`SkewedClock`]), seeded randomness, the cluster's
//! signer, the simulated network ([`SimTransport`]) and the built-in counter
//! actor ([`crate::guest`]).
//!
//! A crash cannot stop the node's tasks (they are the server's own
//! `tokio::spawn`s), so it cuts the process off instead: its bucket client is
//! partitioned for good, the network refuses its calls both ways, clients
//! stop reaching it, and every guest event it would still run traps. Nothing
//! it does after the crash reaches the bucket or another node, which is what
//! a dead process looks like from outside.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_cluster::{Clock, Random, SeededRandom, Signer};
use wasmkeep_server::{Node, NodeConfig, Platform};
use wasmkeep_store::{ActorStore, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId};

use crate::World;
use crate::bucket::SimBucket;
use crate::clock::SkewedClock;
use crate::guest::{GuestContext, SimEngine};
use crate::transport::{BASE_PORT, SimTransport, advertise_url};

/// The cluster key every simulated node shares.
pub const CLUSTER_KEY: &[u8] = b"wasmkeep-sim shared cluster key, 32 bytes or more";

/// Signed calls are accepted within 30 s of their timestamp, so the cluster
/// assumes wall clocks within 30 s of each other. The signer's clock keeps
/// the node's skew within half of that (leases, which must not rely on wall
/// clocks, see the full skew).
pub const SIGNING_SKEW_MAX_MS: i64 = 14_000;

pub struct SimNode {
    pub index: usize,
    pub id: NodeId,
    pub bucket: Arc<SimBucket>,
    pub node: Arc<Node>,
    pub alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode").field("id", &self.id).finish()
    }
}

impl SimNode {
    /// Starts a node process (a new incarnation) on `bucket`.
    pub async fn start(
        world: &Arc<World>,
        index: usize,
        bucket: Arc<SimBucket>,
        seed: u64,
    ) -> Result<Arc<Self>, String> {
        let config = &world.config;
        let id = NodeId::new(format!("n{index}")).expect("n<digits> is a valid node id");
        let skew_ms = world.skew_ms(index);
        let clock: Arc<dyn Clock> = Arc::new(SkewedClock::new(world.start, skew_ms));
        let random: Arc<dyn Random> = Arc::new(SeededRandom::new(seed));
        let signer = Arc::new(
            Signer::new(
                CLUSTER_KEY.to_vec(),
                id.to_string(),
                Arc::new(SkewedClock::new(
                    world.start,
                    skew_ms.clamp(-SIGNING_SKEW_MAX_MS, SIGNING_SKEW_MAX_MS),
                )),
                Arc::new(SeededRandom::new(crate::sub_seed(seed, 1))),
            )
            .map_err(|e| e.to_string())?,
        );
        let alive = Arc::new(AtomicBool::new(true));
        let ctx = Arc::new(GuestContext {
            node_name: id.to_string(),
            truth: world.truth.clone(),
            keys: world.keys.clone(),
            alive: alive.clone(),
            node: Mutex::new(Weak::new()),
        });
        let transport = Arc::new(SimTransport::new(
            world.clone(),
            index,
            signer.clone(),
            alive.clone(),
        ));
        let listen = format!("127.0.0.1:{}", BASE_PORT + index)
            .parse()
            .expect("a valid socket address");
        let mut node_config = NodeConfig::new(
            AppName::default_app(),
            id.clone(),
            listen,
            PathBuf::from("/nonexistent/wasmkeep-sim"),
        );
        node_config.advertise = Some(advertise_url(index));
        node_config.heartbeat_period = config.heartbeat_period;
        node_config.lease_ttl = config.lease_ttl;
        node_config.idle_timeout = config.idle_timeout;
        node_config.alarm_sweep_period = config.alarm_sweep_period;
        // Each node index is one machine with its own data dir: a restart
        // after a crash takes its heartbeat over at once (ADR 0054).
        node_config.holder = Some(format!("{:016x}", 0x5e5e_0000_u64 + index as u64));
        let platform = Platform {
            guest: Arc::new(SimEngine::new(ctx.clone())),
            clock,
            random,
            signer: Some(signer),
            transport: Some(transport),
        };
        let dyn_bucket: Arc<dyn Bucket> = bucket.clone();
        let node = Node::start_with(node_config, dyn_bucket, platform)
            .await
            .map_err(|e| e.to_string())?;
        *ctx.node.lock() = Arc::downgrade(&node);
        Ok(Arc::new(Self {
            index,
            id,
            bucket,
            node,
            alive,
        }))
    }

    pub fn name(&self) -> &str {
        self.id.as_str()
    }

    /// The process dies: nothing it runs takes another step that anyone
    /// outside sees.
    pub fn crash(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.bucket.faults().set_partitioned(true);
    }
}

/// A fresh bucket client of the shared objects, without faults.
pub fn checker_bucket(root: &MemoryBucket) -> Arc<dyn Bucket> {
    Arc::new(root.new_client(0))
}

/// What a fresh store restores of a counter actor.
#[derive(Debug, Default)]
pub struct Counted {
    /// The counter (0 when nothing was written).
    pub n: u64,
    /// The client event ids of the increments in the database.
    pub events: std::collections::BTreeSet<u64>,
}

/// The counter and its event ids as a fresh store restores them.
pub async fn read_counter(
    bucket: Arc<dyn Bucket>,
    keys: &Keys,
    actor: &ActorId,
) -> Result<Counted, String> {
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
    let integers = |store: &mut ActorStore, sql: &str| match store.query(sql, &[]) {
        Ok(rows) => Ok(rows
            .rows
            .iter()
            .filter_map(|r| match r.first() {
                Some(wasmkeep_store::SqlValue::Integer(n)) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Vec<u64>>()),
        // No increment ever became durable: the table was never created.
        Err(e) if e.message.contains("no such table") => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    };
    let n = integers(&mut store, "SELECT n FROM counter WHERE id = 1")?;
    let events = integers(&mut store, "SELECT id FROM events")?;
    store.rollback_event();
    Ok(Counted {
        n: n.first().copied().unwrap_or(0),
        events: events.into_iter().collect(),
    })
}

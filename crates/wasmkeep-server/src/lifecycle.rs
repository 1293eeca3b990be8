//! The node's start and graceful stop: it builds the handles, claims the
//! lease, loads the classes and spawns the long-running parts; at the end
//! it hands its actors over and resigns. The one place that knows every
//! part, and imported by none.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::{Request, Runtime};
use wasmkeep_types::heartbeat::NodeState;
use wasmkeep_types::{ActorId, Keys};

use crate::actor::alarms::{AlarmTimer, TimerPart};
use crate::actor::classes::Classes;
use crate::actor::residents::Residents;
use crate::actor::secrets::Secrets;
use crate::actor::upkeep::Upkeep;
use crate::front::{Front, tenants};
use crate::node::{Node, Platform};
use crate::ops::counting::CountingBucket;
use crate::ops::metrics::Metrics;
use crate::parts::Parts;
use crate::peering::{Peering, PeeringPlatform, heartbeat, lease};
use crate::{NodeConfig, Result};

/// At shutdown, the least time given to deleting the heartbeat when the
/// releases used up the grace.
const RESIGN_TIME_MIN: Duration = Duration::from_secs(2);

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
        // The actors' databases live in this process's memory: their cap is
        // the process's (the last node started in one process sets it).
        wasmkeep_store::set_pages_max(
            (config.limits.database_memory_bytes_max / wasmkeep_store::PAGE_BYTES) as u64,
        );
        let bucket: Arc<dyn Bucket> = Arc::new(CountingBucket::new(bucket, Arc::clone(&metrics)));
        let keys = Keys::new(&config.app);
        let peering = Peering::new(
            &config,
            &bucket,
            &keys,
            PeeringPlatform {
                clock: Arc::clone(&clock),
                random,
                signer,
                transport,
            },
        )?;
        let secrets = Secrets::load(&*bucket, &keys, config.secrets_identity.as_deref()).await?;
        let node = Arc::new(Self {
            node_id: config.node_id.clone(),
            residents: Residents::new(
                config.actors_max,
                config.limits.event_time_max,
                Arc::clone(&metrics),
                Arc::clone(&clock),
            ),
            classes: Classes::new(guest, config.classes.clone()),
            timer: AlarmTimer::new(Arc::clone(&clock)),
            front: Front::new(&config),
            parts: Arc::new(Parts::new(Arc::clone(&metrics))),
            shutdown_tx: watch::channel(false).0,
            config,
            bucket,
            keys,
            metrics,
            clock,
            secrets,
            peering,
        });
        if node.peering.signer.is_none() {
            tracing::info!(
                "no --cluster-key-file: this node runs alone (it keeps its lease and ownership records, but forwards nothing)"
            );
        }
        lease::claim(&node).await?;
        // The tenant-token policy before the first request (ADR 0059): a
        // node started with --tenant-tokens true makes it the app's (and
        // then knows it without reading it back).
        let policy = if node.front.tenants.forced() {
            if tenants::require(&*node.bucket, &node.keys).await? {
                tracing::info!(
                    "--tenant-tokens true: wrote control/tenant-tokens, so every node of the app requires tenant tokens"
                );
            }
            tenants::Policy::Required
        } else {
            tenants::read_policy(&*node.bucket, &node.keys).await?
        };
        node.front.tenants.set_policy(policy);
        node.load_classes_at_start().await?;
        node.peering.set_node_state(NodeState::Serving);
        lease::renew(&node).await?;
        if let Err(e) = node.peering.peers.refresh().await {
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
        // A renewal is never cut off in flight when the loads end: its
        // write could land late, and the first renewal after the start
        // would find it and fail the start. It is told to stop, and
        // finishes the renewal it is in.
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let renewing = async {
            loop {
                tokio::select! {
                    // Checked in order: a run replays the same way (ADR 0006).
                    biased;
                    _ = stop_rx.changed() => return,
                    () = tokio::time::sleep(self.config.heartbeat_period) => {}
                }
                if let Err(e) = lease::renew(self).await {
                    tracing::warn!(error = %e, "lease renewal during the start's class loads failed");
                }
            }
        };
        let loading = async {
            let loaded = self.poll_classes().await;
            let _ = stop_tx.send(true);
            loaded
        };
        let (loaded, ()) = tokio::join!(loading, renewing);
        loaded
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

    /// Graceful stop: no new activations, every resident actor finishes its
    /// queued events, closes its sockets (1012) and hibernates (releasing its
    /// ownership record); then the node resigns its lease (deletes its
    /// heartbeat) so peers need not wait for the TTL.
    pub async fn shutdown(&self, grace: Duration) {
        self.peering.set_node_state(NodeState::Stopping);
        let _ = self.shutdown_tx.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        if !self.residents.wait_empty(deadline).await {
            tracing::warn!(
                resident = self.residents.count(),
                "shutdown grace expired with actors still resident"
            );
        }
        // The heartbeat's delete gets what is left of the grace, and at
        // least a moment after a grace spent on slow releases.
        let resign_deadline = deadline.max(tokio::time::Instant::now() + RESIGN_TIME_MIN);
        lease::resign(self, resign_deadline).await;
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

//! The heartbeat, a part of the node: every period it renews the node
//! lease (`peering::lease`), self-fences when the lease lapsed, and runs
//! the passes due once per heartbeat (drain, secrets, peers, leftovers,
//! moves and deletes). Never carries a client request.

use std::sync::Arc;
use std::time::Duration;

use crate::node::Node;
use crate::peering::lease::{renew, unproven_for_too_long};

/// The heartbeat as a part of the node (`crate::parts`): runs
/// [`heartbeat_loop`]. It ends when the lease is resigned, not at the
/// shutdown signal: a node that shuts down keeps renewing while its actors
/// are handed over.
pub(crate) struct HeartbeatPart {
    node: Arc<Node>,
}

impl HeartbeatPart {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self { node }
    }
}

impl crate::parts::Part for HeartbeatPart {
    const NAME: &'static str = "heartbeat";
    const NEEDED: bool = true;

    fn run(
        self,
        _shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = ()> + Send {
        heartbeat_loop(self.node)
    }
}

/// The heartbeat: every period, renew the lease, then refresh the peers.
/// A lease that lapsed (the bucket unreachable for longer than the TTL)
/// makes the node drop every actor without releasing, rejoin with a new
/// incarnation and renew again. Runs until the lease is resigned.
pub async fn heartbeat_loop(node: Arc<Node>) {
    let mut resigned = node.peering.beat.resigned();
    let period = node.config.heartbeat_period;
    loop {
        tokio::select! {
            // Checked in order: a run replays the same way (ADR 0006).
            biased;
            _ = tokio::time::sleep(period) => {}
            _ = resigned.changed() => {}
        }
        if *resigned.borrow() {
            return;
        }
        if unproven_for_too_long(&node) {
            // No actor was acquired under it: nothing to drop.
            node.peering.lease.rejoin();
            tracing::warn!(incarnation = %node.peering.lease.incarnation(), "the lease never became valid within a TTL: rejoined with a new incarnation");
        }
        if node.peering.lease.is_lapsed() {
            tracing::error!(
                resident = node.residents.count(),
                "this node's lease lapsed (the bucket was unreachable longer than the lease TTL): dropping every actor and rejoining"
            );
            node.residents.drop_every_actor().await;
            node.peering.lease.rejoin();
            tracing::info!(incarnation = %node.peering.lease.incarnation(), "rejoined with a new incarnation");
        }
        // A bucket that hangs must not hold the loop past a lapse: the next
        // tick then drops the actors. A write cut off here may land later;
        // the lease adopts its own late writes (and rejoins write afresh).
        let bucket_time_max = node.config.lease_ttl;
        // The drain state first, so this renewal already reports it. A slow
        // bucket must not delay the renewal by more than one period.
        let drain_check_time_max = node.config.heartbeat_period.min(bucket_time_max);
        if tokio::time::timeout(drain_check_time_max, crate::peering::drain::check(&node))
            .await
            .is_err()
        {
            tracing::warn!("reading the drain key timed out");
        }
        if tokio::time::timeout(
            drain_check_time_max,
            node.secrets.refresh(&*node.bucket, &node.keys),
        )
        .await
        .is_err()
        {
            tracing::warn!("refreshing the app's secrets timed out");
        }
        match tokio::time::timeout(bucket_time_max, renew(&node)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease renewal failed"),
            Err(_) => {
                node.metrics.lease_failures.inc();
                tracing::warn!(timeout = ?bucket_time_max, "lease renewal timed out");
            }
        }
        match tokio::time::timeout(bucket_time_max, node.peering.peers.refresh())
            .await
            .unwrap_or_else(|_| {
                Err(wasmkeep_cluster::Error::Bucket(
                    wasmkeep_bucket::Error::Unavailable {
                        key: node.keys.nodes_prefix(),
                        reason: "the peer refresh timed out".into(),
                    },
                ))
            }) {
            Ok(()) => {
                let live = node
                    .peering
                    .peers
                    .all()
                    .iter()
                    .filter(|p| p.live && p.heartbeat.node != node.node_id)
                    .count();
                node.metrics
                    .peers_live
                    .set(i64::try_from(live).unwrap_or(i64::MAX));
            }
            Err(e) => tracing::warn!(error = %e, "peer refresh failed"),
        }
        if tokio::time::timeout(bucket_time_max, crate::peering::leftovers::release(&node))
            .await
            .is_err()
        {
            tracing::warn!("giving back leftover ownership records timed out");
        }
        // Move keys, with the peers just refreshed (targets' line 11).
        control_passes(&node, bucket_time_max).await;
    }
}

/// The passes over the move, delete, import and SQL keys, on one listing of
/// `control/` (one LIST per heartbeat, not one per pass; the drain keys in
/// it are read by the drain check, each node its own).
async fn control_passes(node: &Arc<Node>, time_max: Duration) {
    let moves = crate::peering::moves::wanted(node);
    let deletes = crate::peering::deletes::wanted(node);
    let sqls = crate::peering::sql::wanted(node);
    if !moves && !deletes && !sqls {
        return;
    }
    let listed =
        match tokio::time::timeout(time_max, node.bucket.list(&node.keys.control_prefix())).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "listing the control keys failed");
                return;
            }
            Err(_) => {
                tracing::warn!("listing the control keys timed out");
                return;
            }
        };
    node.front.tenants.note_listing(&node.keys, &listed);
    let (moves_prefix, deletes_prefix, imports_prefix, sqls_prefix) = (
        node.keys.moves_prefix(),
        node.keys.deletes_prefix(),
        node.keys.imports_prefix(),
        node.keys.sqls_prefix(),
    );
    let (mut move_keys, mut delete_keys, mut import_keys, mut sql_keys) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for meta in listed {
        if meta.key.starts_with(&moves_prefix) {
            move_keys.push(meta);
        } else if meta.key.starts_with(&deletes_prefix) {
            delete_keys.push(meta);
        } else if meta.key.starts_with(&imports_prefix) {
            import_keys.push(meta);
        } else if meta.key.starts_with(&sqls_prefix) {
            sql_keys.push(meta);
        }
    }
    if moves
        && tokio::time::timeout(time_max, crate::peering::moves::check(node, move_keys))
            .await
            .is_err()
    {
        tracing::warn!("the pass over the move keys timed out");
    }
    if deletes
        && tokio::time::timeout(time_max, crate::peering::deletes::check(node, delete_keys))
            .await
            .is_err()
    {
        tracing::warn!("the pass over the delete keys timed out");
    }
    // Imports replace data as deletes do, under the same conditions.
    if deletes {
        crate::peering::imports::check(node, import_keys).await;
    }
    if sqls {
        crate::peering::sql::check(node, sql_keys).await;
    }
}

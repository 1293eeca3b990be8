//! The heartbeat (the node lease, ADR 0020): claiming the node id at start,
//! renewing, self-fencing when it lapses, resigning at shutdown, and the
//! passes that run once per heartbeat (drain, secrets, peers, leftovers,
//! moves and deletes). Never carries a client request.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use wasmkeep_types::heartbeat::{CAPABILITY_TAKE, ClassesServed, Heartbeat};

use crate::Result;
use crate::node::Node;

/// This node's heartbeat now.
fn heartbeat(node: &Node) -> Heartbeat {
    Heartbeat {
        node: node.node_id.clone(),
        advertise: node.advertise.clone(),
        app: node.config.app.clone(),
        // Filled in by the lease.
        incarnation: String::new(),
        state: node.node_state(),
        classes: match &node.config.classes {
            None => ClassesServed::All,
            Some(list) => ClassesServed::Only(list.iter().cloned().collect()),
        },
        resident_actors: node.resident_count() as u64,
        drain: node.drain.state(),
        secrets: node.secrets.readable(),
        // A node without the cluster key cannot verify a take call.
        capabilities: if node.signer.is_some() {
            [CAPABILITY_TAKE.to_owned()].into()
        } else {
            Default::default()
        },
        generation: 0,
        sockets_closing: count(&node.metrics.sockets_closing),
        releases_failed: count(&node.metrics.leftover_holds),
        holder: node.config.holder.clone().unwrap_or_default(),
    }
}

fn count(gauge: &std::sync::atomic::AtomicI64) -> u64 {
    u64::try_from(gauge.load(Ordering::Relaxed)).unwrap_or(0)
}

/// Renews the node lease once (writes the heartbeat).
/// The process's first heartbeat: claims the node id, waiting up to a lease
/// TTL (and the observers' margin) when another process may still hold it,
/// and refusing it when that process is alive (ADR 0054).
pub async fn claim(node: &Node) -> Result<()> {
    let _writing = node.heartbeat_lock.lock().await;
    let key = node.keys.node(&node.node_id);
    let ttl = node.config.lease_ttl;
    let unchanged_for = ttl + wasmkeep_cluster::lease::LeaseObserver::default_margin(ttl);
    let claimed = node
        .lease
        .claim(
            &*node.bucket,
            &key,
            heartbeat(node),
            node.config.holder.as_deref(),
            unchanged_for,
            node.config.heartbeat_period,
        )
        .await;
    counted(node, claimed)
}

/// Counts a heartbeat write in the lease metrics.
fn counted(node: &Node, written: std::result::Result<(), wasmkeep_cluster::Error>) -> Result<()> {
    match written {
        Ok(()) => {
            node.metrics.lease_renewals.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            node.metrics.lease_failures.fetch_add(1, Ordering::Relaxed);
            Err(e.into())
        }
    }
}

pub async fn renew(node: &Node) -> Result<()> {
    let _writing = node.heartbeat_lock.lock().await;
    if *node.resigned_tx.borrow() {
        return Ok(());
    }
    let key = node.keys.node(&node.node_id);
    let renewal = node.lease.renew(&*node.bucket, &key, heartbeat(node));
    // A renewal whose answer comes after the lease ran out must not revive
    // it: peers may have called the lease expired meanwhile and taken its
    // actors, and the node itself may not have looked (found by the
    // simulation, seed 93 of mixed_drains_moves_crashes_partitions: a pause
    // held the write past the lapse, the late success kept the incarnation,
    // and the node took an actor a peer then took over). Past the end the
    // renewal is abandoned; the next heartbeat finds the lease lapsed, drops
    // every actor and rejoins. An incarnation never valid yet ends one TTL
    // after its first write was tried (see `unproven_for_too_long`).
    let renewed = match node.lease.valid_until().or_else(|| unproven_until(node)) {
        Some(until) => tokio::select! {
            biased;
            () = tokio::time::sleep_until(until) => Err(wasmkeep_cluster::Error::LeaseInvalid),
            renewed = renewal => renewed,
        },
        None => renewal.await,
    };
    if renewed.is_ok() {
        *node.unproven.lock() = None;
    }
    counted(node, renewed)
}

/// For an incarnation whose lease was never valid: one TTL after its first
/// heartbeat write was tried (that try is noted now if it is this one).
fn unproven_until(node: &Node) -> Option<Instant> {
    let incarnation = node.lease.incarnation();
    let mut unproven = node.unproven.lock();
    let since = match &*unproven {
        Some((of, since)) if *of == incarnation => *since,
        _ => {
            let now = node.clock.now();
            *unproven = Some((incarnation, now));
            now
        }
    };
    Some(since + node.config.lease_ttl)
}

/// Whether the current incarnation's lease was never valid and its first
/// heartbeat write was tried a TTL ago or more. That write may have landed
/// with its answer lost, and peers that saw it unchanged for a TTL call the
/// incarnation expired; were a later renewal to make it valid, they would
/// take its actors. The node then starts over with a new incarnation (found
/// by the simulation, seed 4560 of mixed_drains_moves_crashes_partitions).
fn unproven_for_too_long(node: &Node) -> bool {
    if node.lease.valid_until().is_some() {
        return false;
    }
    let incarnation = node.lease.incarnation();
    node.unproven.lock().as_ref().is_some_and(|(of, since)| {
        *of == incarnation && node.clock.now() >= *since + node.config.lease_ttl
    })
}

/// Ends the lease at a clean shutdown (after the actors were released),
/// waiting for the heartbeat's delete until `deadline` at most.
pub async fn resign(node: &Node, deadline: tokio::time::Instant) {
    let _writing = node.heartbeat_lock.lock().await;
    let _ = node.resigned_tx.send(true);
    let key = node.keys.node(&node.node_id);
    match tokio::time::timeout_at(deadline, node.lease.resign(&*node.bucket, &key)).await {
        Ok(Ok(true)) => tracing::info!("lease resigned: heartbeat deleted"),
        Ok(Ok(false)) => tracing::info!("the lease had lapsed; its heartbeat expires by itself"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "deleting the heartbeat failed; it expires after the TTL")
        }
        Err(_) => tracing::warn!("deleting the heartbeat took too long; it expires after the TTL"),
    }
}

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
    let mut resigned = node.resigned_tx.subscribe();
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
            node.lease.rejoin();
            tracing::warn!(incarnation = %node.lease.incarnation(), "the lease never became valid within a TTL: rejoined with a new incarnation");
        }
        if node.lease.is_lapsed() {
            tracing::error!(
                resident = node.resident_count(),
                "this node's lease lapsed (the bucket was unreachable longer than the lease TTL): dropping every actor and rejoining"
            );
            node.drop_every_actor().await;
            node.lease.rejoin();
            tracing::info!(incarnation = %node.lease.incarnation(), "rejoined with a new incarnation");
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
                node.metrics.lease_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(timeout = ?bucket_time_max, "lease renewal timed out");
            }
        }
        match tokio::time::timeout(bucket_time_max, node.peers.refresh())
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
                    .peers
                    .all()
                    .iter()
                    .filter(|p| p.live && p.heartbeat.node != node.node_id)
                    .count();
                node.metrics
                    .peers_live
                    .store(i64::try_from(live).unwrap_or(i64::MAX), Ordering::Relaxed);
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

/// The passes over the move and the delete keys, on one listing of
/// `control/` (one LIST per heartbeat, not one per pass; the drain keys in
/// it are read by the drain check, each node its own).
async fn control_passes(node: &Arc<Node>, time_max: Duration) {
    let moves = crate::peering::moves::wanted(node);
    let deletes = crate::peering::deletes::wanted(node);
    if !moves && !deletes {
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
    let (moves_prefix, deletes_prefix) = (node.keys.moves_prefix(), node.keys.deletes_prefix());
    let (move_keys, delete_keys): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .filter(|meta| meta.key.starts_with(&moves_prefix) || meta.key.starts_with(&deletes_prefix))
        .partition(|meta| meta.key.starts_with(&moves_prefix));
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
}

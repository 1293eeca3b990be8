//! The node lease as this node writes it (ADR 0020): its heartbeat
//! record, claimed at start (the node id, ADR 0054), renewed once per
//! period by the heartbeat part, resigned at shutdown. Runs no pass.

use tokio::time::Instant;
use wasmkeep_types::heartbeat::{CAPABILITY_TAKE, ClassesServed, Heartbeat};

use crate::Result;
use crate::node::Node;

/// This node's heartbeat now.
fn heartbeat(node: &Node) -> Heartbeat {
    Heartbeat {
        node: node.node_id.clone(),
        advertise: node.peering.advertise.clone(),
        app: node.config.app.clone(),
        // Filled in by the lease.
        incarnation: String::new(),
        state: node.peering.node_state(),
        classes: match &node.config.classes {
            None => ClassesServed::All,
            Some(list) => ClassesServed::Only(list.iter().cloned().collect()),
        },
        resident_actors: node.residents.count() as u64,
        drain: node.peering.drain.state(),
        secrets: node.secrets.readable(),
        // A node without the cluster key cannot verify a take call.
        capabilities: if node.peering.signer.is_some() {
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

fn count(gauge: &prometheus_client::metrics::gauge::Gauge) -> u64 {
    u64::try_from(gauge.get()).unwrap_or(0)
}

/// Renews the node lease once (writes the heartbeat).
/// The process's first heartbeat: claims the node id, waiting up to a lease
/// TTL (and the observers' margin) when another process may still hold it,
/// and refusing it when that process is alive (ADR 0054).
pub async fn claim(node: &Node) -> Result<()> {
    let _writing = node.peering.beat.lock.lock().await;
    let key = node.keys.node(&node.node_id);
    let ttl = node.config.lease_ttl;
    let unchanged_for = ttl + wasmkeep_cluster::lease::LeaseObserver::default_margin(ttl);
    let claimed = node
        .peering
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
            node.metrics.lease_renewals.inc();
            Ok(())
        }
        Err(e) => {
            node.metrics.lease_failures.inc();
            Err(e.into())
        }
    }
}

pub async fn renew(node: &Node) -> Result<()> {
    let _writing = node.peering.beat.lock.lock().await;
    if *node.peering.beat.resigned_tx.borrow() {
        return Ok(());
    }
    let key = node.keys.node(&node.node_id);
    let renewal = node
        .peering
        .lease
        .renew(&*node.bucket, &key, heartbeat(node));
    // A renewal whose answer comes after the lease ran out must not revive
    // it: peers may have called the lease expired meanwhile and taken its
    // actors, and the node itself may not have looked (found by the
    // simulation, seed 93 of mixed_drains_moves_crashes_partitions: a pause
    // held the write past the lapse, the late success kept the incarnation,
    // and the node took an actor a peer then took over). Past the end the
    // renewal is abandoned; the next heartbeat finds the lease lapsed, drops
    // every actor and rejoins. An incarnation never valid yet ends one TTL
    // after its first write was tried (see `unproven_for_too_long`).
    let renewed = match node
        .peering
        .lease
        .valid_until()
        .or_else(|| unproven_until(node))
    {
        Some(until) => tokio::select! {
            biased;
            () = tokio::time::sleep_until(until) => Err(wasmkeep_cluster::Error::LeaseInvalid),
            renewed = renewal => renewed,
        },
        None => renewal.await,
    };
    if renewed.is_ok() {
        *node.peering.beat.unproven.lock() = None;
    }
    counted(node, renewed)
}

/// For an incarnation whose lease was never valid: one TTL after its first
/// heartbeat write was tried (that try is noted now if it is this one).
fn unproven_until(node: &Node) -> Option<Instant> {
    let incarnation = node.peering.lease.incarnation();
    let mut unproven = node.peering.beat.unproven.lock();
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
pub(crate) fn unproven_for_too_long(node: &Node) -> bool {
    if node.peering.lease.valid_until().is_some() {
        return false;
    }
    let incarnation = node.peering.lease.incarnation();
    node.peering
        .beat
        .unproven
        .lock()
        .as_ref()
        .is_some_and(|(of, since)| {
            *of == incarnation && node.clock.now() >= *since + node.config.lease_ttl
        })
}

/// Ends the lease at a clean shutdown (after the actors were released),
/// waiting for the heartbeat's delete until `deadline` at most.
pub async fn resign(node: &Node, deadline: tokio::time::Instant) {
    let _writing = node.peering.beat.lock.lock().await;
    let _ = node.peering.beat.resigned_tx.send(true);
    let key = node.keys.node(&node.node_id);
    match tokio::time::timeout_at(deadline, node.peering.lease.resign(&*node.bucket, &key)).await {
        Ok(Ok(true)) => tracing::info!("lease resigned: heartbeat deleted"),
        Ok(Ok(false)) => tracing::info!("the lease had lapsed; its heartbeat expires by itself"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "deleting the heartbeat failed; it expires after the TTL")
        }
        Err(_) => tracing::warn!("deleting the heartbeat took too long; it expires after the TTL"),
    }
}

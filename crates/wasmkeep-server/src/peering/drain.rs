//! Draining a node (ADR 0014): the drain request (`control/drain/<node>`,
//! or SIGTERM), the drain state of heartbeat line 9 (`asked`, `draining`,
//! `drained`), and the task that hands every resident actor over to the
//! eligible peer chosen for it by rendezvous hashing.
//!
//! While the node drains, `ensure_owner` never acquires an actor here: an
//! actor that is not resident goes to its holder, or to its chosen peer
//! (see [`Node::drain_route`](crate::node::Node)). The decision lives in the
//! node, not in the actor's stub, so a stub that was hibernated, evicted or
//! rebuilt still forwards rather than claiming the actor back (ADR 0017).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use wasmkeep_types::ActorId;
use wasmkeep_types::heartbeat::DrainState;

use crate::actor::orders::Job;
use crate::node::{Node, Stub};

/// A drain blocked for want of an eligible peer is logged at most this often.
const BLOCKED_LOG_PERIOD: Duration = Duration::from_secs(10);
/// The drain task looks again at least this often (a full mailbox, a stub
/// that appeared through a fallback).
const DRAIN_PASS_PERIOD: Duration = Duration::from_millis(250);

/// Called once per heartbeat period, after the peers were refreshed: reads
/// the drain key and moves the drain state along.
pub async fn check(node: &Arc<Node>) {
    let key = node.keys.drain(&node.node_id);
    let by_key = match node.bucket.head(&key).await {
        Ok(_) => true,
        Err(wasmkeep_bucket::Error::NotFound { .. }) => false,
        Err(e) => {
            tracing::warn!(error = %e, "reading the drain key failed; the drain state stays");
            return;
        }
    };
    node.peering.drain.status.lock().by_key = by_key;
    step(node);
}

/// SIGTERM: drains this node as the drain key would, and waits until it is
/// drained or `timeout` passed. Returns at once when no eligible peer can
/// take the actors (the caller then stops as before).
pub async fn drain_for_signal(node: &Arc<Node>, timeout: Duration) -> bool {
    node.peering.drain.status.lock().by_signal = true;
    if let Err(e) = node.peering.peers.refresh().await {
        tracing::warn!(error = %e, "peer refresh before the drain failed");
    }
    // `asked`, published, then `draining` (or blocked), published. Between
    // the two, two heartbeat periods: peers refresh their view once per
    // period, and a peer that knows this node drains neither chooses it nor
    // keeps a hint for it, and takes back requests it released.
    for round in 0..2 {
        step(node);
        if let Err(e) = crate::peering::lease::renew(node).await {
            tracing::warn!(error = %e, "heartbeat during the drain failed");
        }
        if round == 0 && node.peering.drain.blocked_reason().is_none() {
            tokio::time::sleep((node.config.heartbeat_period * 2).min(timeout)).await;
        }
    }
    if let Some(reason) = node.peering.drain.blocked_reason() {
        tracing::warn!(%reason, "SIGTERM: nothing to drain to; stopping without a drain");
        return false;
    }
    let deadline = Instant::now() + timeout;
    loop {
        if node.peering.drain.state() == DrainState::Drained {
            tracing::info!("SIGTERM: drained");
            return true;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                resident = node.residents.count(),
                ?timeout,
                "SIGTERM: drain timeout; stopping with actors still resident"
            );
            return false;
        }
        tokio::time::sleep(DRAIN_PASS_PERIOD.min(deadline - Instant::now())).await;
        step(node);
    }
}

/// Why no drain can start now: a class this node serves that no eligible
/// peer serves.
fn blocking_reason(node: &Node) -> Option<String> {
    let classes = node.classes.loaded();
    if classes.is_empty() {
        return None;
    }
    let orphans: Vec<String> = classes
        .iter()
        .filter(|class| node.peering.peers.eligible(class).is_empty())
        .map(|class| class.to_string())
        .collect();
    if orphans.is_empty() {
        None
    } else {
        Some(format!(
            "no eligible peer (live, serving, not draining, not suspect) serves class {}",
            orphans.join(", ")
        ))
    }
}

/// Moves the drain state along: none → asked → draining → drained, and
/// back to none when the request is withdrawn (`node undrain`).
fn step(node: &Arc<Node>) {
    // Counted before the status lock: `ensure_owner` reads the drain state
    // while it holds the actors map, so the two locks are never taken in the
    // other order (that deadlocked a SIGTERM drain under load).
    let resident = node.residents.count();
    // Likewise the classes and peers it reads: judged before the lock.
    let blocked = (node.peering.drain.state() == DrainState::Asked)
        .then(|| blocking_reason(node))
        .flatten();
    let mut status = node.peering.drain.status.lock();
    let requested = status.by_key || status.by_signal;
    if !requested {
        if status.state != DrainState::None {
            tracing::info!("drain withdrawn: acquiring actors again");
        }
        status.state = DrainState::None;
        status.blocked = None;
        node.metrics.drain_blocked.set(0);
        return;
    }
    match status.state {
        DrainState::None => {
            // Published as `asked` first, so peers stop choosing this node
            // before it starts sending actors away.
            tracing::info!("drain asked");
            status.state = DrainState::Asked;
        }
        DrainState::Asked => match blocked {
            Some(reason) => {
                let now = Instant::now();
                if status
                    .blocked_logged
                    .is_none_or(|at| now.duration_since(at) >= BLOCKED_LOG_PERIOD)
                {
                    status.blocked_logged = Some(now);
                    tracing::warn!(%reason, "drain asked but not started: this node keeps serving (logged at most every 10 s)");
                }
                status.blocked = Some(reason);
                node.metrics.drain_blocked.set(1);
            }
            None => {
                status.blocked = None;
                node.metrics.drain_blocked.set(0);
                status.state = DrainState::Draining;
                tracing::info!(resident, "draining: handing every resident actor over");
                if !status.task_running {
                    status.task_running = true;
                    tokio::spawn(run(Arc::clone(node)));
                }
            }
        },
        DrainState::Draining | DrainState::Drained => {
            status.state = if resident == 0 {
                DrainState::Drained
            } else {
                DrainState::Draining
            };
        }
    }
}

/// The drain task: asks each resident actor's mailbox for a hand-over (it
/// runs after the events queued before it), until none is resident.
async fn run(node: Arc<Node>) {
    let started = Instant::now();
    // The stubs already asked, by identity: an actor handed over and then
    // acquired here again (no eligible peer for a while) is asked again.
    let mut asked: HashMap<ActorId, Arc<Stub>> = HashMap::new();
    let mut reported_drained = false;
    loop {
        {
            let mut status = node.peering.drain.status.lock();
            let active = matches!(status.state, DrainState::Draining | DrainState::Drained);
            if !active || node.is_shutting_down() {
                // Under the lock: a drain asked again meanwhile finds no task
                // and starts one.
                status.task_running = false;
                return;
            }
        }
        let changed = node.residents.changed().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let stubs = node.residents.live_stubs();
        for stub in &stubs {
            if asked.get(&stub.id).is_some_and(|s| Arc::ptr_eq(s, stub))
                || node.peering.peers.choose(&stub.id).is_none()
            {
                continue;
            }
            // A full mailbox is asked again at the next pass.
            if stub.tx.try_send(Box::new(Job::Drain)).is_ok() {
                asked.insert(stub.id.clone(), Arc::clone(stub));
            }
        }
        let live: HashMap<&ActorId, &Arc<Stub>> = stubs.iter().map(|s| (&s.id, s)).collect();
        asked.retain(|id, s| live.get(id).is_some_and(|l| Arc::ptr_eq(l, s)));
        {
            // Counted before the status lock (see `step`).
            let resident = node.residents.count();
            let mut status = node.peering.drain.status.lock();
            if matches!(status.state, DrainState::Draining | DrainState::Drained) {
                status.state = if resident == 0 {
                    DrainState::Drained
                } else {
                    DrainState::Draining
                };
                if status.state == DrainState::Drained && !reported_drained {
                    reported_drained = true;
                    tracing::info!(elapsed = ?started.elapsed(), "drained: no actor resident");
                } else if status.state == DrainState::Draining {
                    reported_drained = false;
                }
            }
        }
        let _ = tokio::time::timeout(DRAIN_PASS_PERIOD, changed).await;
    }
}

//! The output gate's side of a mailbox: a finished event waits here until
//! its writes are durable, then its response and socket messages go out,
//! in event order, without holding up the next event (group commit). A
//! write that became durable after this node's lease ran out is still
//! acknowledged (ADR 0062); one that failed drops the actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;
use wasmkeep_cluster::planted;
use wasmkeep_runtime::Response;
use wasmkeep_store::OutputGate;

use crate::Error;
use crate::actor::orders::Reply;
use crate::actor::socket_table::Outgoing;
use crate::node::{Node, Stub};
use crate::ops::metrics::observe;

/// A finished event waiting for its output gate.
pub(crate) struct Delivery {
    pub(crate) gate: OutputGate,
    /// The event wrote nothing and read only durable data: nothing of it
    /// waits for a record, so its answer says only what the data was when
    /// it ran.
    pub(crate) read_durable: bool,
    pub(crate) reply: Option<(Reply, Response)>,
    pub(crate) sends: Vec<(u64, Outgoing)>,
    pub(crate) started: Instant,
    /// When the event ended (its commit): the output gate's wait starts.
    pub(crate) ended: Instant,
    /// The commit's span (traces on): it ends when the gate opens and the
    /// answer goes out.
    pub(crate) span: tracing::Span,
}

/// Releases responses and socket writes in event order, each once its
/// output gate opens. A task of its own: delivering from the store's
/// flusher instead cost S3 ~10 % more CPU per request (ADR 0043).
pub(crate) async fn deliverer(
    node: Arc<Node>,
    stub: Arc<Stub>,
    mut rx: mpsc::Receiver<Box<Delivery>>,
    delivering: Arc<AtomicUsize>,
) {
    while let Some(mut delivery) = rx.recv().await {
        let durable = (&mut delivery.gate).await;
        deliver(&node, &stub, *delivery, durable);
        // After the delivery: the mailbox delivers an open event itself
        // only once every earlier one is out.
        delivering.fetch_sub(1, Ordering::Release);
    }
}

/// Sends an event's response and socket messages once its gate opened
/// (`durable`), or fails them and drops the actor.
pub(crate) fn deliver(
    node: &Node,
    stub: &Stub,
    delivery: Delivery,
    durable: wasmkeep_store::Result<()>,
) {
    // A durable record is read by every later holder before it answers
    // (one that took the actor over fenced the log first: ADR 0062), so it
    // is acknowledged even after this node's lease ran out; the actor is
    // then dropped, as the lease's end drops every actor.
    let lapsed = stub.is_fenced() || !node.peering.lease.is_valid();
    let durable = match durable {
        // A read of durable data after the lease ran out may miss a write
        // a new holder made since: not answered (nothing was applied).
        Ok(()) if lapsed && delivery.read_durable => Err(Error::unavailable(
            "this node's lease ran out before the answer; it serves again once renewed",
        )),
        // The code before ADR 0062, planted: such a record was answered
        // 503 and became a write all the same.
        Ok(()) if lapsed && planted::late_record_answered_failed() => Err(Error::unavailable(
            "the write was not acknowledged: it became durable after this node's lease ran out",
        )),
        Ok(()) => Ok(()),
        Err(e @ wasmkeep_store::Error::Unsettled { .. }) => {
            node.metrics.outcomes_unknown.inc();
            Err(Error::OutcomeUnknown(e.to_string()))
        }
        Err(e) => {
            if matches!(e, wasmkeep_store::Error::Fenced { .. }) {
                node.metrics.store_fenced.inc();
            }
            Err(Error::unavailable(format!(
                "the write was not acknowledged: {e}"
            )))
        }
    };
    match durable {
        Ok(()) => {
            if !delivery.read_durable {
                // The event waited for its writes (or for the earlier
                // writes it read) to be durable.
                observe(&stub.metrics.commit_seconds, delivery.ended.elapsed());
            }
            if !delivery.sends.is_empty() {
                let sockets = stub.sockets.lock();
                for (id, out) in delivery.sends {
                    if let Some(entry) = sockets.sockets.get(&id)
                        && entry.tx.try_send(out).is_err()
                    {
                        tracing::warn!(actor = %stub.id, socket = id, "socket outbox full; message dropped");
                    }
                }
            }
            if let Some((reply, response)) = delivery.reply {
                let _ = reply.send(Ok(response));
            }
            if lapsed {
                stub.mark_broken();
            }
        }
        Err(e) => {
            tracing::warn!(actor = %stub.id, error = %e, "output gate failed; dropping the actor");
            if let Some((reply, _)) = delivery.reply {
                let _ = reply.send(Err(e));
            }
            stub.mark_broken();
        }
    }
    observe(&stub.metrics.event_seconds, delivery.started.elapsed());
    // The commit's span ends with its answer out.
    drop(delivery.span);
}

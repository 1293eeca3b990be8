//! Holds a failed release left behind (ADR 0020, ADR 0017's "the release
//! failed"): the actor left this node, but its ownership record still names
//! this node's incarnation, which stays valid while the node lives. Nobody
//! else may claim the actor then, and a move or drain stalls until an event
//! comes back here. Once per heartbeat the node gives such holds back.

use std::sync::Arc;

use wasmkeep_types::ActorId;

use crate::node::Node;

/// Leftover holds retried in one heartbeat; the rest wait for the next.
const RETRIES_PER_PASS_MAX: usize = 64;

/// One attempt per leftover hold: an actor resident here again keeps its
/// hold (its next hand-over releases it); a record that no longer names
/// this incarnation needs nothing. The release is conditional on the etag
/// read after checking that no stub exists, so an acquire by this node
/// that starts meanwhile is never undone (it changes the etag first).
pub(crate) async fn release(node: &Arc<Node>) {
    let actors: Vec<ActorId> = node
        .peering
        .leftovers
        .actors
        .lock()
        .iter()
        .take(RETRIES_PER_PASS_MAX)
        .cloned()
        .collect();
    for actor in actors {
        let done = if node.residents.has_stub(&actor) {
            true
        } else {
            match node.peering.ownership.leftover_hold(&actor).await {
                Ok(None) => true,
                Ok(Some(_)) if node.residents.has_stub(&actor) => true,
                Ok(Some(etag)) => {
                    let released = node.peering.ownership.release_leftover(&actor, &etag).await;
                    if released {
                        tracing::info!(%actor, "gave back the ownership record a failed release left behind");
                    }
                    released
                }
                Err(e) => {
                    tracing::warn!(%actor, error = %e, "reading a leftover ownership record failed; next heartbeat");
                    false
                }
            }
        };
        if done {
            node.peering.leftovers.remove(&node.metrics, &actor);
        }
    }
}

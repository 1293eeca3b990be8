//! Deleting one actor (ADR 0055). `wasmkeep actor delete` writes
//! `control/delete/<tenant>/<class>/<name hex>/<request>`; once per heartbeat period
//! every node looks at those keys (in its one listing of `control/`, with
//! the move keys). The node that holds the actor hands it
//! over as for a hibernation ([`Job::Replace`]), and deletes its data while
//! the ownership record still names it; a node finds an actor nobody holds
//! and acquires its record itself, with the actor's place in its map held,
//! so no event opens it meanwhile. Either way the key goes once the data
//! is gone, and the actor's next event starts an empty one.
//!
//! Everything here acts on one request, the key as listed: a node that
//! carried a request out removes that key and no other, so a removal that
//! lands late (a paused node, a slow bucket) never takes a later request of
//! the same actor with it.

use std::sync::{Arc, Weak};

use wasmkeep_bucket::ObjectMeta;
use wasmkeep_cluster::{AcquireOutcome, LeaseReturn};
use wasmkeep_store::Image;
use wasmkeep_types::ActorId;

use crate::Result;
use crate::actor::erase::replace_data;
use crate::actor::orders::{Job, ReplaceOrder};
use crate::node::Node;

/// Whether this node runs the pass over the delete keys now.
pub(crate) fn wanted(node: &Node) -> bool {
    node.peering.lease.is_valid() && !node.is_shutting_down()
}

/// The pass over the delete keys, when [`wanted`]: `listed` is the
/// heartbeat's listing under [`Keys::deletes_prefix`].
///
/// [`Keys::deletes_prefix`]: wasmkeep_types::Keys::deletes_prefix
pub(crate) async fn check(node: &Arc<Node>, listed: Vec<ObjectMeta>) {
    for item in listed {
        let actor = match node.keys.parse_delete_key(&item.key) {
            Ok(actor) => actor,
            Err(e) => {
                crate::peering::control::remove_unparsed(node, &item.key, &e).await;
                continue;
            }
        };
        let order = DeleteKey {
            node: Arc::downgrade(node),
            key: item.key,
        };
        if let Some(order) = send_or_keep(node, &actor, order).await
            && let Err(e) = replace_unheld(node, &actor, &order).await
        {
            tracing::warn!(%actor, error = %e, "deleting the actor failed; the next pass tries again");
        }
    }
}

/// Where a request to replace `actor`'s data (a delete, an import) is
/// carried out: sent to the actor's mailbox when it is resident here
/// (queued behind its events; a full mailbox is tried next pass), left
/// alone when another pass or node is the one to act, else given back for
/// [`replace_unheld`].
pub(super) async fn send_or_keep<O: ReplaceOrder + 'static>(
    node: &Node,
    actor: &ActorId,
    order: O,
) -> Option<O> {
    if let Some(stub) = node.residents.live_stub(actor) {
        let _ = stub.tx.try_send(Box::new(Job::Replace(Box::new(order))));
        return None;
    }
    // Being released here, or an actor this node moves away (it goes
    // to its target, never back here; ADR 0017): the next pass, or a
    // peer, acts.
    let moving_away = node
        .peering
        .moves
        .target(actor)
        .is_some_and(|target| target != node.node_id);
    if node.residents.has_stub(actor) || moving_away {
        return None;
    }
    // A draining node takes no actor, but one whose record it still
    // holds (a hand-over whose log did not settle, ADR 0062) nobody
    // else can take while it lives: that one it replaces itself.
    if node.peering.drain.is_active() && !holds_itself(node, actor).await {
        return None;
    }
    Some(order)
}

/// Carries out `order` for an actor that is not resident here, if no other
/// node holds it.
pub(super) async fn replace_unheld(
    node: &Node,
    actor: &ActorId,
    order: &dyn ReplaceOrder,
) -> Result<()> {
    // A request carried out since the listing leaves nothing to do, and no
    // record is written for nothing.
    if !order.stands(actor).await {
        return Ok(());
    }
    // Held until the end of this function, or of the pass if its time
    // limit cuts it short.
    let Some(_reserved) = node.residents.reserve(actor) else {
        return Ok(());
    };
    // From here until the release below, the record may name this node: a
    // pass cut short (its time limit) or an acquire whose outcome is not
    // known leaves it to the leftovers (ADR 0020) rather than held.
    let mut may_hold = MayHold {
        node,
        actor,
        settled: false,
    };
    let AcquireOutcome::Acquired { etag, .. } = node.peering.ownership.acquire(actor).await? else {
        // Its holder acts at its own pass.
        may_hold.settled = true;
        return Ok(());
    };
    // The listing may be older than a request carried out since (and a
    // new actor's first writes): only a standing request is carried out.
    let carried = if order.stands(actor).await {
        order.carry_out(actor).await.map(drop)
    } else {
        Ok(())
    };
    if node.peering.ownership.release(actor, &etag).await == LeaseReturn::Failed
        && node.peering.lease.is_valid()
    {
        node.peering.leftovers.add(&node.metrics, actor);
    }
    may_hold.settled = true;
    carried
}

/// While a pass may hold an actor's ownership record: dropped
/// unsettled, it hands the record to the leftovers, which give it back at the
/// next heartbeat if it still names this node's incarnation (and leave it
/// alone otherwise).
struct MayHold<'a> {
    node: &'a Node,
    actor: &'a ActorId,
    settled: bool,
}

impl Drop for MayHold<'_> {
    fn drop(&mut self) {
        if !self.settled {
            tracing::warn!(actor = %self.actor, "a pass over the delete or import keys ended while it may hold the actor; the record is given back at the next heartbeat");
            self.node
                .peering
                .leftovers
                .add(&self.node.metrics, self.actor);
        }
    }
}

/// Whether this node's own hold names `actor` (a bucket that does not
/// answer counts as no: the next pass asks again).
async fn holds_itself(node: &Node, actor: &ActorId) -> bool {
    match node.peering.ownership.holder(actor).await {
        Ok(holder) => holder.as_ref() == Some(&node.node_id),
        Err(e) => {
            tracing::warn!(%actor, error = %e, "reading the ownership record failed");
            false
        }
    }
}

/// Whether the request `key` of `actor` still stands (a bucket that does
/// not answer counts as no: the next pass asks again).
pub(super) async fn requested(node: &Node, actor: &ActorId, key: &str) -> bool {
    match node.bucket.head(key).await {
        Ok(_) => true,
        Err(wasmkeep_bucket::Error::NotFound { .. }) => false,
        Err(e) => {
            tracing::warn!(%actor, key, error = %e, "reading a request's key failed");
            false
        }
    }
}

/// One delete request as a mailbox or a pass carries it out. Holds its
/// node weakly: a job left in a mailbox must not keep a stopped node alive.
struct DeleteKey {
    node: Weak<Node>,
    /// The request's key, as listed.
    key: String,
}

#[async_trait::async_trait]
impl ReplaceOrder for DeleteKey {
    async fn stands(&self, actor: &ActorId) -> bool {
        match self.node.upgrade() {
            Some(node) => requested(&node, actor, &self.key).await,
            None => false,
        }
    }

    fn reads_data(&self) -> bool {
        false
    }

    fn close_reason(&self) -> &'static str {
        "actor deleted"
    }

    async fn carry_out(&self, actor: &ActorId) -> Result<bool> {
        let Some(node) = self.node.upgrade() else {
            return Ok(false);
        };
        replace_data(&node, actor, &Image::empty()).await?;
        // Before the release: a pass that lists the key from now on finds
        // the actor still held here, and leaves it be. Only this key goes:
        // a later request stands.
        node.metrics.actors_deleted.inc();
        tracing::info!(%actor, "actor deleted");
        if let Err(e) = node.bucket.delete(&self.key).await {
            tracing::warn!(%actor, error = %e, "removing the delete key failed; the next pass deletes the actor again");
        }
        Ok(true)
    }
}

//! What the node's other parts ask of an actor's mailbox, as the mailbox
//! sees it: a move (ADR 0017) and a delete (ADR 0055). The traits are
//! defined here and implemented by `peering::moves` and
//! `peering::deletes`, so that `actor/` never imports `peering/`.

use tokio::sync::oneshot;
use wasmkeep_types::ActorId;

use crate::node::Node;

/// What the move job in the actor's mailbox reports.
#[derive(Debug)]
pub(crate) enum MoveOutcome {
    /// Handed over and released; the committed alarm it had.
    Released { alarm: Option<i64> },
    /// Kept: a socket is open (or the alarm could not be read).
    Busy(&'static str),
    /// Handed over, but the ownership record could not be released within
    /// one lease TTL: it expires with this node's lease.
    ReleaseFailed,
    /// This attempt was given up before the job ran.
    Abandoned,
}

pub(crate) type MoveReply = oneshot::Sender<MoveOutcome>;

/// A move of the actor as its mailbox sees it (ADR 0017); the move itself
/// (keys, the take call) is `peering::moves`'s, which implements this.
pub(crate) trait MoveOrder: Send + Sync {
    /// Whether this attempt is still the move under way when the job runs.
    fn is_current(&self, node: &Node, actor: &ActorId) -> bool;
    /// Forgets the move (only the planted bug `hibernate_after_release`).
    fn forget(&self, node: &Node, actor: &ActorId);
}

/// A delete of the actor as its mailbox sees it (ADR 0055); the request
/// itself (the delete key) is `peering::deletes`'s, which implements this.
#[async_trait::async_trait]
pub(crate) trait DeleteOrder: Send + Sync {
    /// Whether the request still stands: a pass that listed the key before
    /// an earlier deletion removed it must not delete the new actor's writes.
    async fn stands(&self, node: &Node, actor: &ActorId) -> bool;
    /// The actor's data is gone (called while the record still names this
    /// node, before its release).
    async fn done(&self, node: &Node, actor: &ActorId);
}

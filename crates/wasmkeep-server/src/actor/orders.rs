//! What the node's other parts ask of an actor's mailbox: the jobs its
//! channel carries, among them a move (ADR 0017) and a delete (ADR 0055) or
//! import (ADR 0069) as the mailbox sees them. Their traits are defined
//! here and implemented by `peering::moves` and `peering::deletes`, so that `actor/` never
//! imports `peering/`; an order carries what it needs, so the mailbox hands
//! it nothing of the node.

use tokio::sync::oneshot;
use tokio::time::Instant;
use wasmkeep_runtime::{Message, Request, Response};
use wasmkeep_types::ActorId;

use crate::Result;
use crate::actor::alarms::Fire;

/// Where an event's response goes.
pub(crate) type Reply = oneshot::Sender<Result<Response>>;

/// One unit of work for an actor. A mailbox's channel carries it boxed (one
/// allocation per job, the request inside it): the channel allocates room for
/// 32 jobs up front, and jobs inline held 2.7 KiB per resident actor
/// (ADR 0038).
pub(crate) enum Job {
    Request {
        request: Request,
        /// The actors waiting on this event, the target last.
        chain: Vec<ActorId>,
        reply: Option<Reply>,
        started: Instant,
        /// The span it was sent in (the request's, or an actor call's):
        /// its event's span is a child of it. `Span::none()` with traces off.
        span: tracing::Span,
    },
    Alarm(Fire),
    /// Run the committed alarm now if it is due by `due_by_ms` (any
    /// time when `None`), whatever the timer says (ADR 0073: a test
    /// harness fires an actor's alarm, or those a moved clock made due).
    /// The reply, once the alarm's writes are durable: a text body,
    /// `ran`, `none` (no alarm set) or `not-due`; a failed handler is an
    /// error (its retry is scheduled as for any delivery).
    AlarmNow {
        due_by_ms: Option<i64>,
        reply: Reply,
    },
    SocketMessage {
        id: u64,
        message: Message,
    },
    SocketClose {
        id: u64,
        code: u16,
        reason: String,
    },
    /// Hibernate now if idle (LRU eviction).
    Hibernate,
    /// Hand the actor over now, after the events queued before this job
    /// (the node drains, ADR 0014).
    Drain,
    /// Hand the actor over for a move (ADR 0017), unless the attempt
    /// `token` was given up meanwhile or a socket is open.
    Move {
        order: Box<dyn MoveOrder>,
        reply: MoveReply,
    },
    /// An operator's statement (`wasmkeep actor sql --write`, ADR 0065
    /// amended), run as one event: once per `request`, whose result is
    /// kept in the actor's database with the statement's writes. The reply
    /// carries the result as JSON once it is durable.
    Sql {
        request: String,
        statement: String,
        reply: Reply,
        started: Instant,
    },
    /// Delete the actor (ADR 0055), or import a database in its place (ADR
    /// 0069): hand it over now, after the events queued before this job,
    /// replacing its data before its ownership record is released, if the
    /// order still stands when the job runs.
    Replace(Box<dyn ReplaceOrder>),
}

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
    fn is_current(&self, actor: &ActorId) -> bool;
    /// Forgets the move (only the planted bug `hibernate_after_release`).
    fn forget(&self, actor: &ActorId);
}

/// A delete (ADR 0055) or an import (ADR 0069) of the actor as its mailbox
/// sees it; the request itself (its key, and for an import the database)
/// is `peering::deletes`'s, which implements this.
#[async_trait::async_trait]
pub(crate) trait ReplaceOrder: Send + Sync {
    /// Whether the request still stands: a pass that listed the key before
    /// an earlier one carried it out must not replace the new writes.
    async fn stands(&self, actor: &ActorId) -> bool;
    /// Whether the actor's data is read before it is replaced (an import
    /// looks at it; a delete does not), so every record of its store must
    /// land first.
    fn reads_data(&self) -> bool;
    /// The close reason the actor's sockets are given.
    fn close_reason(&self) -> &'static str;
    /// Carries the request out, called while the ownership record names
    /// this node and nothing of the actor's store writes any more: replaces
    /// the data, or refuses and reports why. `Ok(true)`: the data was
    /// replaced (the log is fenced). `Ok(false)`: nothing was written.
    /// `Err`: the next pass tries again.
    async fn carry_out(&self, actor: &ActorId) -> Result<bool>;
}

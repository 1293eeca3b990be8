//! [`ActorStore`]: one actor's database, its events, and the flusher that
//! turns committed events into log records (group commit).
//!
//! Two halves share [`Shared`]:
//! - the store, used by the actor's mailbox task, runs each event as one
//!   SQLite transaction and, at COMMIT, moves the pages the event changed
//!   into the queue of records to write (merging into the newest queued
//!   record while it is not yet being written and stays under
//!   `record_bytes_max`);
//! - the flusher, a tokio task per store, writes the queued records one at a
//!   time, in order, with put-if-absent, and publishes how far the log is
//!   durable. Output gates watch that number.
//!
//! A failed record write (fenced, or the bucket failing past the retries)
//! fails that record's gates and every later one, and the store refuses
//! further events: the node drops the actor and restores it.
//!
//! This file owns the state the halves share ([`Shared`], the queue of
//! pending records, the durable progress) and the output gate; the rest is
//! in `store/`: `open` (restore, start, close), `events` (the store's half:
//! transactions, guest SQL, the alarm, commit), `connection` (SQLite's
//! connection and its settings), `flusher` (the flusher's half: group
//! commit), `snapshots` (the snapshot writer and compaction) and `write`
//! (the bucket writes and their retries). Each imports from this file and
//! from the ones listed after it (`open` starts the flusher and the
//! snapshot writer, the flusher hands snapshots on, and both write through
//! `write`), never the other way round.

mod connection;
mod events;
mod flusher;
mod open;
mod operator;
pub(crate) use connection::{has_table, read_alarm_table};
pub use operator::OPERATOR_RESULTS_KEPT;
mod snapshots;
pub(crate) mod write;

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use wasmkeep_bucket::Bucket;
use wasmkeep_types::{ActorId, Keys};

use crate::conn::Conn;
use crate::sql::Guard;
use crate::vfs::{MemFile, SharedFile, SharedPage};
use crate::{Error, Result, StoreConfig, WriterId};

/// A record waiting to be written.
struct Pending {
    seq: u64,
    pages: BTreeMap<u32, SharedPage>,
    db_pages: u32,
    alarm_ms: Option<i64>,
    /// The whole database as of this record, when it is to be snapshotted.
    image: Option<Vec<SharedPage>>,
    /// Events whose changes this record carries.
    events: u32,
}

#[derive(Debug, Clone)]
pub(crate) enum FailureKind {
    /// Another writer's record holds the number: ours never will.
    Fenced,
    /// Not written, and no attempt of it can still apply.
    Broken(String),
    /// Not known to be written: an attempt whose reply was lost may still
    /// apply (or may have, unseen by the read-back).
    Unsettled(String),
}

#[derive(Debug, Clone)]
struct Failure {
    seq: u64,
    kind: FailureKind,
}

#[derive(Debug, Clone, Default)]
struct Progress {
    /// Every record up to this one is durable.
    durable_seq: u64,
    failure: Option<Failure>,
    /// Snapshots handed to the snapshot writer and not finished.
    snapshots_pending: u64,
}

struct FlushState {
    queue: VecDeque<Pending>,
    /// Sequence number the next new record gets.
    next_seq: u64,
    closed: bool,
    failure: Option<Failure>,
    /// The flusher lingers until the one queued record holds this many
    /// events (or its deadline passes): a commit that leaves the record
    /// short of it does not wake the flusher, which would only look and
    /// wait again (once per event of the group).
    lingering_for: Option<u32>,
}

struct Shared {
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    actor: ActorId,
    /// `actor` as record headers spell it, made once.
    actor_text: String,
    /// The actor's log prefix in the bucket, made once.
    log_prefix: String,
    writer: WriterId,
    config: StoreConfig,
    state: Mutex<FlushState>,
    wake: Notify,
    progress: watch::Sender<Progress>,
}

impl Shared {
    /// The error of an event whose writes went into record `target` (or
    /// that read what record `target` holds), after record `f.seq` failed.
    /// Only the record whose own outcome is unknown answers `Unsettled`: a
    /// later one was never written.
    fn error_for(&self, f: &Failure, target: u64) -> Error {
        match &f.kind {
            FailureKind::Fenced => Error::Fenced {
                actor: self.actor.clone(),
                seq: f.seq,
            },
            FailureKind::Unsettled(reason) if f.seq == target => Error::Unsettled {
                actor: self.actor.clone(),
                seq: f.seq,
                reason: reason.clone(),
            },
            FailureKind::Broken(reason) if f.seq == target => Error::Broken {
                actor: self.actor.clone(),
                seq: f.seq,
                reason: reason.clone(),
            },
            FailureKind::Broken(reason) | FailureKind::Unsettled(reason) => Error::Broken {
                actor: self.actor.clone(),
                seq: target,
                reason: format!("record {} before it failed: {reason}", f.seq),
            },
        }
    }

    fn header_text_bytes(&self) -> usize {
        self.actor_text.len() + self.writer.node.len() + self.writer.incarnation.len()
    }
}

/// Resolves when every write up to and including its event is durable
/// (`Ok`), or when the record holding them failed (`Err`).
pub struct OutputGate {
    /// `None`: open from the start.
    inner: Option<BoxFuture<'static, Result<()>>>,
}

impl OutputGate {
    fn ready() -> Self {
        Self { inner: None }
    }

    /// Whether the gate was open when the event committed: the event wrote
    /// nothing, and everything it could have read was durable already.
    pub fn is_open(&self) -> bool {
        self.inner.is_none()
    }

    fn waiting(shared: &Arc<Shared>, target: u64) -> Self {
        let mut rx = shared.progress.subscribe();
        let shared = Arc::clone(shared);
        Self {
            inner: Some(Box::pin(async move {
                loop {
                    {
                        let p = rx.borrow_and_update();
                        if p.durable_seq >= target {
                            return Ok(());
                        }
                        if let Some(f) = &p.failure
                            && f.seq <= target
                        {
                            return Err(shared.error_for(f, target));
                        }
                    }
                    if rx.changed().await.is_err() {
                        return Err(Error::Closed);
                    }
                }
            })),
        }
    }
}

impl Future for OutputGate {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.inner {
            None => Poll::Ready(Ok(())),
            // Planted (the simulation's tests): open before durable.
            Some(_) if wasmkeep_cluster::planted::ack_before_durable() => Poll::Ready(Ok(())),
            Some(inner) => inner.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for OutputGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputGate")
    }
}

/// One actor's database; used from one task (the mailbox).
pub struct ActorStore {
    /// `None` while parked: the pages stay in `file`, SQLite's connection
    /// (about 25 KiB) is opened again by the next event.
    conn: Option<Conn>,
    file: SharedFile,
    db_name: String,
    guard: Arc<Guard>,
    deadline: Arc<Mutex<Option<Instant>>>,
    shared: Arc<Shared>,
    in_event: bool,
    event_aborted: Option<String>,
    committed_alarm: Option<i64>,
    event_alarm: Option<i64>,
    records_since_snapshot: u64,
    bytes_since_snapshot: u64,
    /// Set when this side (not the flusher) made the store unusable.
    local_failure: Option<String>,
    /// The snapshot writer, which ends last: after the flusher, with the
    /// compaction it was doing finished (see [`ActorStore::close`]).
    background: Option<tokio::task::JoinHandle<()>>,
    /// Opened by [`ActorStore::open_reader`]: read-only statements only,
    /// nothing written to the bucket.
    reader: bool,
}

impl std::fmt::Debug for ActorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorStore")
            .field("actor", &self.shared.actor)
            .field("db_name", &self.db_name)
            .finish_non_exhaustive()
    }
}

impl Drop for ActorStore {
    fn drop(&mut self) {
        // The flusher finishes the queued records (their gates may still be
        // awaited) and then exits.
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
        MemFile::unregister(&self.db_name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn the_store_moves_between_tasks_and_gates_outlive_it() {
        assert_send_static::<ActorStore>();
        assert_send_static::<OutputGate>();
    }
}

//! The resident actors of this node: their stubs (the handle every event,
//! socket and pass holds), the map of them, activation's signal, the
//! release of a stub leaving the map, eviction of the least recently used,
//! and a mailbox's panic contained. Never decides where an actor lives
//! (`crate::routing` asks `wasmkeep_cluster::placement`) and never imports
//! `peering`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use wasmkeep_cluster::hints::ActorHint;
use wasmkeep_store::StoreConfig;
use wasmkeep_types::{ActorId, NodeId};

use crate::actor::orders::Job;
use crate::actor::socket_table::SharedSockets;
use crate::ops::metrics::{ClassMetrics, Metrics};
use crate::wait_cell::WaitCell;
use crate::{Error, Result};

/// A resident actor's in-memory state shared outside its mailbox.
#[derive(Debug)]
pub struct Stub {
    pub id: ActorId,
    pub(crate) tx: mpsc::Sender<Box<Job>>,
    pub(crate) sockets: SharedSockets,
    last_used_ms: AtomicI64,
    /// Set when the actor's store failed; the mailbox drops the actor.
    pub(crate) broken: AtomicBool,
    pub(crate) broken_notify: Notify,
    /// The actor this actor's running event is calling, if any: the edges of
    /// the node's waits-for graph, followed to refuse deadlocking calls.
    pub(crate) waiting_on: Mutex<Option<ActorId>>,
    /// Set when this node's lease lapsed: the mailbox drops the actor
    /// without releasing it (self-fencing).
    pub(crate) fenced: AtomicBool,
    /// How the activation went; `ensure_owner` waits for it.
    pub(crate) activation: WaitCell<Activation>,
    /// The owner this actor learned it has elsewhere, at most 1 s old:
    /// `ensure_owner` asks it before the node's hints (the seed's "in the
    /// service and in the actor's own state"), and sends the actor's events
    /// there while it lasts, so learn it only once this node no longer holds
    /// the actor (a failed activation, a fenced store). Forgotten wherever
    /// the node's hint is ([`Node::forget_hints`]).
    pub hint: ActorHint,
    /// The handles of the actor's (tenant, class) metrics, found once
    /// when the stub is made: its events count without a lookup.
    pub(crate) metrics: Arc<ClassMetrics>,
}

/// The outcome of a stub's activation.
#[derive(Debug, Clone)]
pub(crate) enum Activation {
    Pending,
    Ready,
    /// Another node holds the actor.
    Elsewhere(NodeId),
    /// Anything else; `unknown_class` keeps a 404 a 404.
    Failed {
        reason: String,
        unknown_class: Option<String>,
    },
}

impl Stub {
    /// A new actor's stub, its activation pending, its events sent on `tx`.
    pub(crate) fn new(
        id: ActorId,
        tx: mpsc::Sender<Box<Job>>,
        now_ms: i64,
        metrics: Arc<ClassMetrics>,
    ) -> Arc<Self> {
        Arc::new(Stub {
            id,
            tx,
            sockets: SharedSockets::default(),
            last_used_ms: AtomicI64::new(now_ms),
            broken: AtomicBool::new(false),
            broken_notify: Notify::new(),
            waiting_on: Mutex::new(None),
            fenced: AtomicBool::new(false),
            activation: WaitCell::new(Activation::Pending),
            hint: ActorHint::default(),
            metrics,
        })
    }

    pub(crate) fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn open_sockets(&self) -> usize {
        self.sockets.lock().sockets.len()
    }

    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Release);
        self.broken_notify.notify_one();
    }

    pub(crate) fn mark_fenced(&self) {
        self.fenced.store(true, Ordering::Release);
        self.broken.store(true, Ordering::Release);
        self.broken_notify.notify_one();
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

/// A hand-over under way: dropping it (at its end, or if the hand-over
/// stops early) tells whoever waits to activate the actor again.
pub(crate) struct Left(Arc<WaitCell<bool>>);

impl Drop for Left {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

/// An actor's place in the map, held by [`Residents::reserve`]. Dropping it (at
/// the end, or when the pass that holds it is cut short by its time limit)
/// gives the place back and wakes the actor's waiting events: a place left
/// behind with its signal set would send them round `ensure_owner` forever.
pub(crate) struct Reservation<'n> {
    residents: &'n Residents,
    actor: ActorId,
    signal: Arc<WaitCell<bool>>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut actors = self.residents.map.lock();
        if let Some(Entry::Leaving(signal)) = actors.get(&self.actor)
            && Arc::ptr_eq(signal, &self.signal)
        {
            actors.remove(&self.actor);
        }
        drop(actors);
        self.signal.set(true);
        self.residents.changed.notify_waiters();
    }
}

pub(crate) enum Entry {
    Live(Arc<Stub>),
    /// Hibernating: wait for `true`, then look again.
    Leaving(Arc<WaitCell<bool>>),
}

/// The resident actors. Every event looks its actor up here: a hash of the
/// name, where an ordered map compared it with ~10 others (1,000 actors).
/// Names are chosen by clients, so the hasher is seeded per process; what
/// walks the map puts what it found in name order itself.
pub(crate) type ActorMap = HashMap<ActorId, Entry, foldhash::fast::RandomState>;

/// At `--max-actors`, this fraction of it (at least one) is asked to
/// hibernate at once: 1,000 resident actors give batches of 15.
const EVICTION_BATCH_DIVISOR: usize = 64;

/// The actors resident on this node: the map of their stubs, notified
/// whenever one leaves. A handle of the [`Node`]; it never starts a mailbox
/// (the node's `spawn_stub` does) and never asks where an actor lives.
pub struct Residents {
    map: Mutex<ActorMap>,
    changed: Notify,
    /// `--max-actors`: eviction asks a fraction of it to hibernate at once.
    actors_max: usize,
    metrics: Arc<Metrics>,
    /// How each actor's store is opened.
    pub(crate) store_config: StoreConfig,
}

impl Residents {
    /// `event_time_max` also bounds one statement: no statement outlasts
    /// the event that runs it.
    pub(crate) fn new(
        actors_max: usize,
        event_time_max: Duration,
        metrics: Arc<Metrics>,
        clock: Arc<dyn wasmkeep_cluster::clock::Clock>,
    ) -> Self {
        let defaults = StoreConfig::default();
        Self {
            map: Mutex::new(ActorMap::default()),
            changed: Notify::new(),
            actors_max,
            metrics,
            store_config: StoreConfig {
                statement_time_max: defaults.statement_time_max.min(event_time_max),
                clock,
                ..defaults
            },
        }
    }

    /// Waits until no actor is resident, or `deadline`; whether none is.
    pub(crate) async fn wait_empty(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.changed.notified();
            if self.map.lock().is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Self-fencing after a lapsed lease: every resident actor is dropped
    /// without releasing its ownership record (sockets closed with 1012).
    /// Returns once no actor is resident.
    pub(crate) async fn drop_every_actor(&self) {
        /// How often a slow drop is logged.
        const DROP_LOG_PERIOD: Duration = Duration::from_secs(5);
        loop {
            let notified = self.changed.notified();
            for stub in &self.live_stubs() {
                stub.mark_fenced();
            }
            if self.map.lock().is_empty() {
                return;
            }
            if tokio::time::timeout(DROP_LOG_PERIOD, notified)
                .await
                .is_err()
            {
                tracing::warn!(
                    resident = self.count(),
                    "still dropping actors after the lease lapsed"
                );
            }
        }
    }

    /// The map itself, for the passes that look and change under one lock
    /// (`ensure_owner`'s activation).
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, ActorMap> {
        self.map.lock()
    }

    /// Number of resident actors (hibernating ones included until released).
    pub fn count(&self) -> usize {
        self.map.lock().len()
    }

    /// The actor's stub when it is resident here and not being released.
    pub(crate) fn live_stub(&self, actor: &ActorId) -> Option<Arc<Stub>> {
        match self.map.lock().get(actor) {
            Some(Entry::Live(stub)) => Some(Arc::clone(stub)),
            _ => None,
        }
    }

    /// Whether the actor has a stub here, live or being released.
    pub fn has_stub(&self, actor: &ActorId) -> bool {
        self.map.lock().contains_key(actor)
    }

    /// The resident actors that are not being released.
    pub(crate) fn live_stubs(&self) -> Vec<Arc<Stub>> {
        let mut stubs: Vec<Arc<Stub>> = self
            .map
            .lock()
            .values()
            .filter_map(|e| match e {
                Entry::Live(stub) => Some(Arc::clone(stub)),
                Entry::Leaving(_) => None,
            })
            .collect();
        // In name order, whatever the map's: a drain asks them in an order
        // a simulation run repeats.
        stubs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        stubs
    }

    /// Notified whenever an actor leaves this node.
    pub(crate) fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Asks the least recently used idle actors to hibernate (a batch of
    /// them, so the scan of every resident actor is paid once per batch of
    /// activations at the limit, not once per activation), or refuses when
    /// every resident actor is busy.
    pub(crate) fn evict_lru(&self, actors: &ActorMap) -> Result<()> {
        let mut idle: Vec<&Arc<Stub>> = actors
            .values()
            .filter_map(|e| match e {
                Entry::Live(stub) if stub.open_sockets() == 0 && stub.queue_is_empty() => {
                    Some(stub)
                }
                _ => None,
            })
            .collect();
        if idle.is_empty() {
            return Err(Error::unavailable(
                "every resident actor is busy (max-actors reached)",
            ));
        }
        let batch = (self.actors_max / EVICTION_BATCH_DIVISOR).clamp(1, idle.len());
        if batch < idle.len() {
            // Ties (one millisecond) go by name, whatever the map's order.
            idle.select_nth_unstable_by(batch - 1, |a, b| {
                let used = |s: &Arc<Stub>| s.last_used_ms.load(Ordering::Relaxed);
                used(a).cmp(&used(b)).then_with(|| a.id.cmp(&b.id))
            });
        }
        for stub in &idle[..batch] {
            // Best effort: a full mailbox is not idle and will not be chosen.
            let _ = stub.tx.try_send(Box::new(Job::Hibernate));
        }
        Ok(())
    }

    /// Step 1 of a hand-over: under the map lock, if the actor is still idle
    /// (or `force`), mark it leaving. Returns the guard that signals it left.
    pub(crate) fn begin_leaving(
        &self,
        stub: &Arc<Stub>,
        idle_only: bool,
        queue_empty: bool,
    ) -> Option<Left> {
        let mut actors = self.map.lock();
        let ours = matches!(actors.get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub));
        if !ours {
            return None;
        }
        if idle_only && (!queue_empty || stub.open_sockets() > 0) {
            return None;
        }
        let released = Arc::new(WaitCell::new(false));
        actors.insert(stub.id.clone(), Entry::Leaving(Arc::clone(&released)));
        Some(Left(released))
    }

    /// Last step of a hand-over: forget the actor and wake whoever waits.
    pub(crate) fn end_leaving(&self, stub: &Arc<Stub>, released: Option<Left>) {
        let mut actors = self.map.lock();
        match actors.get(&stub.id) {
            Some(Entry::Leaving(_)) if released.is_some() => {
                actors.remove(&stub.id);
                stub.metrics.resident_actors.dec();
            }
            Some(Entry::Live(s)) if Arc::ptr_eq(s, stub) => {
                actors.remove(&stub.id);
                stub.metrics.resident_actors.dec();
            }
            _ => {}
        }
        drop(actors);
        // Dropping it wakes whoever waits for the release.
        drop(released);
        self.changed.notify_waiters();
    }

    /// Holds `actor`'s place in the map while it has no stub here, as a
    /// release does: its events wait until the [`Reservation`] is dropped
    /// (deleting an actor that is not resident, ADR 0055). `None` when the
    /// actor has a stub.
    pub(crate) fn reserve(&self, actor: &ActorId) -> Option<Reservation<'_>> {
        let mut actors = self.map.lock();
        if actors.contains_key(actor) {
            return None;
        }
        let signal = Arc::new(WaitCell::new(false));
        actors.insert(actor.clone(), Entry::Leaving(Arc::clone(&signal)));
        Some(Reservation {
            residents: self,
            actor: actor.clone(),
            signal,
        })
    }

    /// Whether the stub is still this node's live stub for its actor.
    pub(crate) fn is_live(&self, stub: &Arc<Stub>) -> bool {
        matches!(self.map.lock().get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub))
    }

    /// A panic in an actor's mailbox (a bug of ours) must not wedge the
    /// actor: its stub would stay in the map with nobody reading its events,
    /// answering 503 "changing hands" until the node restarts. The unwind
    /// dropped the mailbox's store and instance (their uncommitted writes
    /// with them), and its waiting events, which answer 503; the stub is
    /// forgotten here, so the next event activates the actor afresh from
    /// the bucket. The ownership record stays this node's, as after a
    /// hibernation that kept it.
    pub(crate) fn mailbox_panicked(&self, stub: &Arc<Stub>, panic: &(dyn std::any::Any + Send)) {
        let what = crate::parts::panic_text(panic);
        self.metrics.mailbox_panics.inc();
        tracing::error!(actor = %stub.id, panic = %what, "the actor's mailbox panicked (a wasmkeep bug): its events in flight failed, and its next event activates it afresh");
        if matches!(stub.activation.get(), Activation::Pending) {
            stub.activation.set(Activation::Failed {
                reason: format!("actor {} failed to activate (an internal error)", stub.id),
                unknown_class: None,
            });
        }
        let mut actors = self.map.lock();
        let orphaned = match actors.get(&stub.id) {
            Some(Entry::Live(s)) => Arc::ptr_eq(s, stub),
            // Its release guard was dropped by the unwind (so it reads
            // released) without the entry being removed: while the map is
            // locked, a release that ended normally shows no entry at all.
            Some(Entry::Leaving(released)) => released.get(),
            None => false,
        };
        if orphaned {
            actors.remove(&stub.id);
            stub.metrics.resident_actors.dec();
        }
        drop(actors);
        self.changed.notify_waiters();
    }
}

impl Stub {
    /// Whether the stub's mailbox has no event waiting.
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.tx.capacity() == self.tx.max_capacity()
    }
}

//! Where an event goes, and getting it there: `ensure_owner` (the actor
//! resident here, a peer named by a move or a hint, the drain's route, or a
//! new activation, as `wasmkeep_cluster::placement` decides), requests and
//! actor calls routed to a mailbox or forwarded (one hop, ADR 0005), and
//! alarms delivered here or handed to the holder. The node's glue between
//! its parts: it may use each of them.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument as _;
use wasmkeep_cluster::placement::{self, Placement};
use wasmkeep_runtime::{Request, Response};
use wasmkeep_types::heartbeat::DrainState;
use wasmkeep_types::{ActorId, NodeId};

use crate::actor::alarms::Fire;
use crate::actor::mailbox;
use crate::actor::orders::Job;
use crate::actor::residents::{Activation, Entry, Stub};
use crate::node::{Node, Owner};
use crate::peering::forward::{self, HandBack, Hop, Routed};
use crate::wait_cell::WaitCell;
use crate::{Error, Result};

impl Node {
    /// Where `actor`'s events go: resident here → `Local`; a fresh owner
    /// hint → `Elsewhere`; otherwise a new stub whose activation acquires
    /// the ownership record (`Local`) or finds another node's valid hold
    /// (`Elsewhere`, and a hint).
    pub async fn ensure_owner(self: &Arc<Self>, actor: &ActorId) -> Result<Owner> {
        // A draining node looks for the actor elsewhere once; only when no
        // eligible peer exists does it acquire the actor here.
        let mut drain_looked = false;
        let stub = loop {
            // `None`: look elsewhere first (the node drains).
            let waiter: Option<Arc<WaitCell<bool>>> = {
                let mut actors = self.residents.lock();
                match actors.get(actor) {
                    Some(Entry::Live(stub)) => {
                        // The actor's own hint answers first.
                        if let Some(peer) = stub.hint.get(self.clock.now())
                            && peer != self.node_id
                        {
                            drop(actors);
                            return self.elsewhere(actor, peer);
                        }
                        stub.touch(self.clock.wall_ms());
                        break Arc::clone(stub);
                    }
                    Some(Entry::Leaving(released)) => Some(Arc::clone(released)),
                    None => {
                        let drain_look = !drain_looked && self.peering.drain.is_active();
                        let class = self.classes.get(&actor.class);
                        let (move_target, hint) = (
                            self.peering.moves.target(actor),
                            self.peering.hints.get(actor),
                        );
                        let facts = placement::Facts {
                            node: &self.node_id,
                            shutting_down: self.is_shutting_down(),
                            drain_look,
                            class_ready: class.is_ok(),
                            move_target: move_target.as_ref(),
                            hint: hint.as_ref(),
                        };
                        match placement::place(&facts, || self.peering.lease.is_valid()) {
                            Placement::ShuttingDown => {
                                return Err(Error::unavailable("the node is shutting down"));
                            }
                            Placement::ClassNotReady => {
                                return Err(class
                                    .err()
                                    .expect("a class that is not ready has an error"));
                            }
                            Placement::Elsewhere(peer) => {
                                drop(actors);
                                return self.elsewhere(actor, peer);
                            }
                            Placement::LookElsewhere => None,
                            Placement::LeaseNotValid => {
                                return Err(Error::unavailable(
                                    "this node's lease is not valid; it serves again once renewed",
                                ));
                            }
                            Placement::Here => {
                                if actors.len() >= self.config.actors_max {
                                    self.residents.evict_lru(&actors)?;
                                }
                                let stub = self.spawn_stub(actor.clone());
                                actors.insert(actor.clone(), Entry::Live(Arc::clone(&stub)));
                                // Taken off where the entry is removed
                                // (`Residents::end_leaving`).
                                stub.metrics.resident_actors.inc();
                                break stub;
                            }
                        }
                    }
                }
            };
            match waiter {
                // A hibernating actor is released before it is activated again.
                Some(waiter) => {
                    waiter.wait_for(|released| *released).await;
                }
                None => {
                    if let Some(owner) = self.drain_route(actor).await? {
                        return Ok(owner);
                    }
                    drain_looked = true;
                }
            }
        };
        let outcome = stub
            .activation
            .wait_for(|a| !matches!(a, Activation::Pending))
            .await;
        match outcome {
            Activation::Ready | Activation::Pending => Ok(Owner::Local(stub)),
            Activation::Elsewhere(peer) => {
                // Everyone still holding this stub asks it first.
                stub.hint.learn(&peer, self.clock.now());
                self.elsewhere(actor, peer)
            }
            Activation::Failed {
                unknown_class: Some(class),
                ..
            } => Err(Error::UnknownClass(class)),
            Activation::Failed { reason, .. } => Err(Error::unavailable(reason)),
        }
    }

    /// Forgets the owner hints for `actor`, the node's and its stub's: the
    /// record decides the next time.
    pub(crate) fn forget_hints(&self, actor: &ActorId) {
        self.peering.hints.forget(actor);
        if let Some(Entry::Live(stub)) = self.residents.lock().get(actor) {
            stub.hint.forget();
        }
    }

    /// Learns from a peer that `holder` holds `actor`: the node's hint and
    /// the stub's both name it until they expire (one naming this node is
    /// forgotten instead, so that the record decides).
    pub(crate) fn learn_holder(&self, actor: &ActorId, holder: &NodeId) {
        if holder == &self.node_id {
            self.forget_hints(actor);
            return;
        }
        self.peering.hints.learn(actor, holder);
        if let Some(Entry::Live(stub)) = self.residents.lock().get(actor) {
            stub.hint.learn(holder, self.clock.now());
        }
    }

    /// Where a draining node sends an actor it does not hold: to the node
    /// whose hold is valid, else to the eligible peer chosen by rendezvous
    /// hashing on the actor id (which claims it on the first event).
    /// `None` when no eligible peer exists: the node keeps serving.
    async fn drain_route(&self, actor: &ActorId) -> Result<Option<Owner>> {
        match self.peering.ownership.holder(actor).await? {
            Some(holder) if holder != self.node_id => {
                self.peering.hints.learn(actor, &holder);
                return self.elsewhere(actor, holder).map(Some);
            }
            // This node's own hold, never released: a hand-over whose log
            // did not settle keeps it (ADR 0062), and no peer may take the
            // actor while this node lives. Only an activation here settles
            // it (it fences the log), so the actor is served here until it
            // hands over again (ADR 0014).
            Some(_) => return Ok(None),
            None => {}
        }
        Ok(self.peering.peers.choose(actor).map(|p| Owner::Elsewhere {
            peer: p.heartbeat.node,
            url: p.heartbeat.advertise,
        }))
    }

    /// `Elsewhere` for `peer`, with its advertised URL, or 503 when its
    /// heartbeat was never seen.
    fn elsewhere(&self, actor: &ActorId, peer: NodeId) -> Result<Owner> {
        match self.peering.peers.get(&peer) {
            Some(p) => Ok(Owner::Elsewhere {
                peer,
                url: p.heartbeat.advertise,
            }),
            None => {
                self.forget_hints(actor);
                Err(Error::unavailable(format!(
                    "actor {actor} is held by node {peer}, whose address is not known yet"
                )))
            }
        }
    }

    /// Runs a request (from HTTP or another actor) as an event of `actor`,
    /// here or, when another node holds it, there (one hop).
    /// `chain` lists the actors waiting on this call, `actor` last.
    pub async fn request(
        self: &Arc<Self>,
        actor: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
    ) -> Result<Response> {
        self.route_request(actor, request, chain, Hop::Client)
            .await
            .map(|routed| routed.response)
    }

    /// [`request`](Self::request), saying how it arrived and which node ran it.
    pub async fn route_request(
        self: &Arc<Self>,
        actor: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
        hop: Hop,
    ) -> Result<Routed> {
        /// A stub that closes between lookup and send is looked up again, this often.
        const STALE_STUB_RETRIES_MAX: usize = 3;
        /// Bodies up to this size are copied before a forward, so that a
        /// hand-back (a "released" answer from a holder whose drain this
        /// node has not seen yet, or a "moved" one naming another holder)
        /// is sent once more instead of failing the client.
        const HAND_BACK_COPY_BYTES_MAX: usize = 64 * 1024;
        let mut job = Box::new(Job::Request {
            request,
            chain,
            reply: None,
            started: Instant::now(),
            span: crate::ops::telemetry::current(),
        });
        let (reply_tx, reply_rx) = oneshot::channel();
        if let Job::Request { reply, .. } = &mut *job {
            *reply = Some(reply_tx);
        }
        if matches!(hop, Hop::Forwarded { .. }) {
            // The sender found this node named as the holder: a hint of ours
            // saying otherwise is older than its reading, so the record decides.
            self.forget_hints(actor);
        }
        // A forwarded request may come back handed back, with nothing run:
        // "released" by a draining holder (it is then run here or sent to
        // the new holder) or "moved" (the peer names the holder it sees,
        // which gets it). Once: a second hand-back goes to the client.
        let mut hand_back_retry = true;
        for _ in 0..STALE_STUB_RETRIES_MAX {
            let stub = match self.ensure_owner(actor).await? {
                Owner::Local(stub) => stub,
                Owner::Elsewhere { peer, url } => {
                    let Job::Request {
                        request,
                        chain,
                        reply,
                        started,
                        span,
                    } = *job
                    else {
                        return Err(Error::Runtime("a request job is a request".into()));
                    };
                    if matches!(hop, Hop::Forwarded { .. }) && self.peering.drain.is_active() {
                        // Sending it on would be a second hop. Nothing ran
                        // here: the sender, which is not draining, may claim
                        // the actor itself and run the request.
                        return Err(Error::Released {
                            actor: actor.to_string(),
                            peer: peer.to_string(),
                        });
                    }
                    // Kept for a second try when the holder may hand it
                    // back: it drains (as this node last saw it: its drain
                    // may have begun since) or the copy is cheap.
                    let holder_drains = self
                        .peering
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.heartbeat.drain != DrainState::None);
                    let cheap = request.body.len() <= HAND_BACK_COPY_BYTES_MAX;
                    let kept = (hand_back_retry && hop == Hop::Client && (holder_drains || cheap))
                        .then(|| (request.clone(), chain.clone()));
                    let mut routed = Box::pin(forward::forward_request(
                        self,
                        actor,
                        &peer,
                        &url,
                        request,
                        chain,
                        hop.clone(),
                    ))
                    .await?;
                    let hand_back = forward::hand_back(&mut routed.response);
                    match kept {
                        Some((request, chain)) if hand_back != HandBack::None => {
                            hand_back_retry = false;
                            match hand_back {
                                HandBack::Moved(holder) => self.learn_holder(actor, &holder),
                                _ => self.forget_hints(actor),
                            }
                            job = Box::new(Job::Request {
                                request,
                                chain,
                                reply,
                                started,
                                span,
                            });
                            continue;
                        }
                        _ => return Ok(routed),
                    }
                }
            };
            match stub.tx.try_send(job) {
                Ok(()) => {
                    return match reply_rx.await {
                        Ok(result) => result.map(|response| Routed {
                            response,
                            ran_on: None,
                        }),
                        // Dropped unanswered only by a mailbox that stopped
                        // before the event committed (a committed event's
                        // answer is the deliverer's, which answers every
                        // one): nothing was applied.
                        Err(_) => Err(Error::unavailable(format!(
                            "actor {actor} stopped before answering"
                        ))),
                    };
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(Error::unavailable(format!(
                        "the mailbox of {actor} is full"
                    )));
                }
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    job = back;
                    tokio::task::yield_now().await;
                }
            }
        }
        Err(Error::unavailable(format!(
            "actor {actor} is changing hands"
        )))
    }

    /// A call from `caller`'s running event to `target`. Refused with "call
    /// cycle" when `target` (transitively) waits on `caller` already: two
    /// concurrent calls A→B and B→A would otherwise wait on each other.
    pub(crate) async fn call(
        self: &Arc<Self>,
        caller: &ActorId,
        target: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
    ) -> Result<Response> {
        let caller_stub = match self.residents.lock().get(caller) {
            Some(Entry::Live(stub)) => Some(Arc::clone(stub)),
            _ => None,
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = Some(target.clone());
        }
        let cycle = self
            .waits_on_any(
                target,
                std::slice::from_ref(caller),
                forward::WAITS_FOR_NODES_MAX,
            )
            .await
            .is_some();
        let result = if cycle {
            Err(Error::Call(format!(
                "call cycle: {target} is already waiting on {caller}"
            )))
        } else {
            let span = if crate::ops::telemetry::current_sampled() {
                tracing::info_span!(target: "wasmkeep::trace", "call", otel.kind = "client", wasmkeep.target = %target)
            } else {
                tracing::Span::none()
            };
            self.request(target, request, chain).instrument(span).await
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = None;
        }
        result
    }

    /// The first of `callers` that `actor` waits on here, following the
    /// waits-for path through this node's actors (an actor waits on the one
    /// its running event calls). A call from any of them to `actor` would
    /// wait on itself: a deadlock, across nodes too when the incoming call
    /// chain names an actor that this node's actors wait on.
    pub(crate) async fn waits_on_any(
        &self,
        actor: &ActorId,
        callers: &[ActorId],
        nodes_left: u32,
    ) -> Option<ActorId> {
        match self.waits_here(actor, callers) {
            Waits::On(found) => Some(found),
            Waits::Nobody => None,
            // A resident actor waits on one held elsewhere: ask its holder
            // (as far as the hints know it), which follows the chain on.
            Waits::Elsewhere(next) if nodes_left > 0 => {
                let holder = self.peering.hints.get(&next)?;
                if holder == self.node_id {
                    return None;
                }
                Box::pin(forward::ask_waits_for(
                    self,
                    &holder,
                    &next,
                    callers,
                    nodes_left - 1,
                ))
                .await
            }
            Waits::Elsewhere(_) => None,
        }
    }

    /// The waits-for path from `actor` through this node's resident actors.
    fn waits_here(&self, actor: &ActorId, callers: &[ActorId]) -> Waits {
        /// Longest waits-for path followed (longer ones are cut, not refused).
        const WAITS_FOR_STEPS_MAX: usize = 64;
        if callers.is_empty() {
            // A client's request: nobody to wait on (and no lookups to pay).
            return Waits::Nobody;
        }
        let mut at = actor.clone();
        for _ in 0..WAITS_FOR_STEPS_MAX {
            let next = match self.residents.lock().get(&at) {
                Some(Entry::Live(stub)) => stub.waiting_on.lock().clone(),
                // Not resident here: only an actor a resident one waits on
                // is asked about elsewhere, never the first.
                _ if at != *actor => return Waits::Elsewhere(at),
                _ => None,
            };
            let Some(next) = next else {
                return Waits::Nobody;
            };
            if callers.contains(&next) {
                return Waits::On(next);
            }
            at = next;
        }
        Waits::Nobody
    }

    /// Sends an event that no client waits for (alarm, socket), waiting for
    /// room in the mailbox. `Err(HeldElsewhere)` when another node holds it.
    pub(crate) async fn send_event(self: &Arc<Self>, actor: &ActorId, job: Job) -> Result<()> {
        let mut job = Box::new(job);
        for _ in 0..3 {
            let stub = match self.ensure_owner(actor).await? {
                Owner::Local(stub) => stub,
                Owner::Elsewhere { peer, .. } => return Err(Error::HeldElsewhere { node: peer }),
            };
            match stub.tx.send(job).await {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => job = back,
            }
        }
        Err(Error::unavailable(format!(
            "actor {actor} is changing hands"
        )))
    }

    /// Called by the timer: the alarm goes to the actor's mailbox,
    /// activating the actor if needed, or is handed off to the node that
    /// holds the actor.
    pub(crate) fn deliver_alarm(self: &Arc<Self>, fire: Fire) {
        let due_ms = self.clock.wall_ms();
        self.deliver_alarm_at(fire, due_ms);
    }

    /// [`Node::deliver_alarm`] for a delivery due at `due_ms`, which may be
    /// later: the alarm of an actor this node hands over keeps its retry
    /// count and backoff on the next holder.
    pub(crate) fn deliver_alarm_at(self: &Arc<Self>, fire: Fire, due_ms: i64) {
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let actor = fire.actor.clone();
            let mut sent = node.alarm_here(fire.clone(), due_ms).await;
            if let Err(Error::HeldElsewhere { node: peer }) = &sent {
                sent = forward::hand_off_alarm(&node, peer, &fire, due_ms).await;
            }
            // In the mailbox (which marked it arrived when it ran it),
            // handed off, or scheduled again below.
            node.timer.arrived(&fire);
            if let Err(e) = sent {
                // Not deliverable now (shutting down, class gone, bucket down):
                // the committed alarm stays; the sweep or next activation finds it.
                tracing::warn!(%actor, error = %e, "alarm not delivered");
                if !node.is_shutting_down()
                    && matches!(
                        e,
                        Error::Unavailable { .. }
                            | Error::Bucket(_)
                            | Error::Store(_)
                            | Error::Cluster(_)
                            | Error::HeldElsewhere { .. }
                    )
                {
                    let retry_at = (node.clock.wall_ms() + 1000).max(due_ms);
                    node.timer.set(retry_at, fire);
                }
            }
        });
    }

    /// Delivers an alarm on this node, activating the actor if needed: into
    /// its mailbox when due, else into the timer. `Err(HeldElsewhere)` when
    /// another node holds the actor.
    pub(crate) async fn alarm_here(self: &Arc<Self>, fire: Fire, due_ms: i64) -> Result<()> {
        if due_ms <= self.clock.wall_ms() {
            return self.send_event(&fire.actor.clone(), Job::Alarm(fire)).await;
        }
        self.arm_then_activate(fire, due_ms).await
    }

    /// Schedules `fire` at `due_ms` (unless a delivery of the same alarm as
    /// far along is registered) and makes the actor resident here. The
    /// entry goes in before the activation: activation arms the committed
    /// alarm only when no delivery of it is registered, so a retry in
    /// backoff is not overtaken by a fresh first delivery, which would run
    /// at once and start the retries over. When the actor is not ours
    /// (`Err(HeldElsewhere)`) or its activation fails, the entry is
    /// withdrawn: whoever handed the alarm here keeps it.
    pub(crate) async fn arm_then_activate(self: &Arc<Self>, fire: Fire, due_ms: i64) -> Result<()> {
        let actor = fire.actor.clone();
        let scheduled_ms = fire.scheduled_ms;
        let adopted = self.timer.adopt_retry(fire, due_ms);
        let refused = match self.ensure_owner(&actor).await {
            Ok(Owner::Local(_)) => return Ok(()),
            Ok(Owner::Elsewhere { peer, .. }) => Error::HeldElsewhere { node: peer },
            Err(e) => e,
        };
        if adopted {
            self.timer.clear_if(&actor, scheduled_ms);
        }
        Err(refused)
    }

    /// Lists the alarm index and arms the timer for alarms of actors that are
    /// not resident here and fall due before the next sweep.
    pub async fn sweep_alarms(self: &Arc<Self>) -> Result<()> {
        let horizon_ms = self.clock.wall_ms()
            + i64::try_from(self.config.alarm_sweep_period.as_millis()).unwrap_or(i64::MAX);
        for meta in self.bucket.list(&self.keys.alarms_prefix()).await? {
            let Ok(actor) = self.keys.parse_alarm_key(&meta.key) else {
                tracing::warn!(key = %meta.key, "alarm index key does not parse; skipped");
                continue;
            };
            if !self.classes.serves(&actor.class)
                || self.residents.lock().contains_key(&actor)
                || self.timer.contains(&actor)
            {
                continue;
            }
            let object = match self.bucket.get(&meta.key).await {
                Ok(object) => object,
                Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let Some(at_ms) = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
            else {
                tracing::warn!(key = %meta.key, "alarm index body does not parse; skipped");
                continue;
            };
            if at_ms <= horizon_ms {
                self.timer.set_if_absent(actor, at_ms);
            }
        }
        Ok(())
    }
}

impl Node {
    /// A new stub for `id` and its mailbox task, whose panic is contained
    /// (see [`Residents::mailbox_panicked`](crate::actor::residents::Residents::mailbox_panicked)).
    pub(crate) fn spawn_stub(self: &Arc<Self>, id: ActorId) -> Arc<Stub> {
        let (tx, rx) = mpsc::channel(self.config.limits.mailbox_events_max);
        // Routing refused a class this node has not loaded; one that went
        // away since gets no series of its own.
        let metrics = if self.classes.is_loaded(&id.class) {
            self.metrics.class(id.tenant.as_str(), id.class.as_str())
        } else {
            self.metrics.unknown_class()
        };
        let stub = Stub::new(id, tx, self.clock.wall_ms(), metrics);
        let node = Arc::clone(self);
        let guarded = Arc::clone(&stub);
        tokio::spawn(async move {
            let run = mailbox::run(Arc::clone(&node), Arc::clone(&guarded), rx);
            if let Err(panic) = futures::FutureExt::catch_unwind(AssertUnwindSafe(run)).await {
                node.residents.mailbox_panicked(&guarded, &*panic);
            }
        });
        stub
    }
}

/// Where a waits-for path through this node's residents ends.
enum Waits {
    /// At one of the callers: a cycle.
    On(ActorId),
    /// At an actor that waits on nobody (or is not resident, or too far).
    Nobody,
    /// At an actor a resident one waits on, not resident here.
    Elsewhere(ActorId),
}

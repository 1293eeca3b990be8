//! One actor's mailbox: a task that activates the actor, runs its events one
//! at a time in arrival order, releases each response once the event's writes
//! are durable (without holding up the next event: group commit), and hands
//! the actor over (hibernation, shutdown, a broken store).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument as _;
use wasmkeep_bucket::Etag;
use wasmkeep_cluster::{AcquireOutcome, LeaseReturn, planted};
use wasmkeep_runtime::{EventError, Response};
use wasmkeep_store::{ActorStore, WriterId};
use wasmkeep_types::ActorId;
use wasmkeep_types::heartbeat::DrainState;

use crate::actor::alarms::{Fire, retry_delay};
use crate::actor::delivery::{Delivery, deliver, deliverer};
use crate::actor::guest::GuestInstance;
use crate::actor::host::NodeHost;
pub(crate) use crate::actor::orders::{
    Job, MoveOrder, MoveOutcome, MoveReply, ReplaceOrder, Reply,
};
use crate::actor::socket_table::{
    CLOSE_HANDSHAKE_TIME_MAX, CLOSE_INTERNAL_ERROR, CLOSE_NORMAL, CLOSE_SERVICE_RESTART, Outgoing,
};
use crate::node::{Activation, Node, Stub};
use crate::ops::metrics::observe;
use crate::{Error, Result};

struct Active {
    instance: Box<dyn GuestInstance>,
    /// The etag of this node's ownership record, needed to release it.
    hold: Etag,
    /// Boxed: a channel allocates its first block of 32 slots up front, and
    /// a slot the size of a `Delivery` would cost every resident actor ~5 KiB.
    delivery_tx: mpsc::Sender<Box<Delivery>>,
    deliverer: tokio::task::JoinHandle<()>,
    /// Deliveries sent to the deliverer and not yet delivered: while none
    /// are, an event whose gate is open is delivered by the mailbox itself.
    delivering: Arc<AtomicUsize>,
    /// Set when the actor leaves for a move: told how the hand-over went.
    move_reply: Option<(MoveReply, Box<dyn MoveOrder>)>,
    /// Set when the actor leaves to be deleted: told once its data is gone.
    replace_order: Option<Box<dyn ReplaceOrder>>,
    /// Jobs run since the activation, counted up to 2: after only one, the
    /// instance is dropped as soon as the mailbox is empty (ADR 0024,
    /// amended). Most actors activated by one event get no second one
    /// soon (first touches, alarms, one-off calls); a busy one reloads its
    /// instance once, at its second event, and keeps it from then on.
    jobs_run: u8,
}

fn host(instance: &mut Box<dyn GuestInstance>) -> &mut NodeHost {
    instance
        .host()
        .as_any()
        .downcast_mut::<NodeHost>()
        .expect("every instance of this node has a NodeHost")
}

/// Why the actor leaves this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    Idle,
    Shutdown,
    Broken,
    /// This node's lease lapsed: drop the actor without releasing it.
    Fenced,
    /// The node drains: hand over, then pass the committed alarm on to the
    /// peer that takes the actor.
    Drain,
    /// One actor moves (ADR 0017): hand over and report to the move task,
    /// which sends the take call; the alarm stays registered here until the
    /// take succeeded.
    Move,
    /// `wasmkeep actor delete` or `actor import`: hand over and replace
    /// the actor's data while the ownership record still names this node.
    Replace,
}

pub(crate) async fn run(node: Arc<Node>, stub: Arc<Stub>, mut rx: mpsc::Receiver<Box<Job>>) {
    let active = match Box::pin(activate(&node, &stub)).await {
        Ok(active) => active,
        Err(e) => {
            let outcome = match &e {
                Error::HeldElsewhere { node: peer } => {
                    tracing::debug!(actor = %stub.id, %peer, "held by another node");
                    Activation::Elsewhere(peer.clone())
                }
                other => {
                    stub.metrics.activation_failures.inc();
                    tracing::warn!(actor = %stub.id, error = %other, "activation failed");
                    Activation::Failed {
                        reason: other.to_string(),
                        unknown_class: match other {
                            Error::UnknownClass(c) => Some(c.clone()),
                            _ => None,
                        },
                    }
                }
            };
            let released = node.residents.begin_leaving(&stub, false, true);
            stub.activation.set(outcome);
            rx.close();
            while let Ok(job) = rx.try_recv() {
                fail_job(&node, *job, &e);
            }
            node.residents.end_leaving(&stub, released);
            return;
        }
    };
    stub.activation.set(Activation::Ready);
    serve(node, stub, rx, active).await;
}

/// Acquires the ownership record, restores the store and instantiates.
/// `Err(HeldElsewhere)` (and a hint) when another node holds the actor.
async fn activate(node: &Arc<Node>, stub: &Arc<Stub>) -> Result<Active> {
    let actor = &stub.id;
    let component = node.classes.get(&actor.class)?;
    let (hold, prior_hold) = match node.peering.ownership.acquire(actor).await {
        Ok(AcquireOutcome::Acquired { etag, prior_hold }) => (etag, prior_hold),
        Ok(AcquireOutcome::HeldBy { node: other }) => {
            // No hint for a draining holder: it is about to release, and a
            // hint would send events back to it for a second after that,
            // where the one-hop rule can only answer 503.
            let draining = node
                .peering
                .peers
                .get(&other)
                .is_some_and(|p| p.heartbeat.drain != DrainState::None);
            if !draining {
                node.peering.hints.learn(actor, &other);
            }
            return Err(Error::HeldElsewhere { node: other });
        }
        Err(wasmkeep_cluster::Error::LeaseInvalid) => {
            return Err(Error::unavailable(
                "this node's lease is not valid; it serves again once renewed",
            ));
        }
        Err(e) => {
            // The write may have landed (its answer lost, the re-read
            // failed): the leftovers give the record back if it names this
            // incarnation, as for a failed release (ADR 0020).
            node.peering.leftovers.add(&node.metrics, actor);
            return Err(e.into());
        }
    };
    node.peering.hints.forget(actor);
    let opened = ActorStore::open(
        Arc::clone(&node.bucket),
        node.keys.clone(),
        actor.clone(),
        WriterId {
            node: node.node_id.to_string(),
            incarnation: node.peering.lease.incarnation(),
        },
        node.store_config(&actor.class),
    )
    .await;
    let mut store = match opened {
        Ok(store) => store,
        Err(e) => {
            release_hold(node, actor, &hold).await;
            return Err(Error::Store(e.to_string()));
        }
    };
    // The holder before may have a record in flight: fence first (ADR 0062).
    if prior_hold && !planted::late_record_answered_failed() {
        store.fence_log();
        node.metrics.log_fences.inc();
    }
    let alarm = store.alarm();
    let host = NodeHost::new(
        Arc::clone(node),
        actor.clone(),
        store,
        Arc::clone(&stub.sockets),
        Arc::clone(&stub.metrics),
    );
    let instance = match component.instantiate(actor.clone(), Box::new(host)).await {
        Ok(instance) => instance,
        Err(e) => {
            release_hold(node, actor, &hold).await;
            return Err(e);
        }
    };
    if let Some(at_ms) = alarm {
        node.timer.follow(actor, Some(at_ms));
    }
    let (delivery_tx, delivery_rx) = mpsc::channel(node.config.limits.mailbox_events_max);
    let delivering = Arc::new(AtomicUsize::new(0));
    let deliverer = tokio::spawn(deliverer(
        Arc::clone(node),
        Arc::clone(stub),
        delivery_rx,
        Arc::clone(&delivering),
    ));
    stub.metrics.activations.inc();
    tracing::debug!(%actor, "activated");
    Ok(Active {
        instance,
        hold,
        delivery_tx,
        deliverer,
        delivering,
        move_reply: None,
        replace_order: None,
        jobs_run: 0,
    })
}

async fn release_hold(node: &Node, actor: &ActorId, hold: &Etag) -> LeaseReturn {
    let returned = node.peering.ownership.release(actor, hold).await;
    if returned == LeaseReturn::Failed {
        tracing::warn!(%actor, "ownership record not released; it expires with this node's lease");
    }
    returned
}

fn fail_job(node: &Arc<Node>, job: Job, error: &Error) {
    match job {
        Job::Request {
            reply: Some(reply), ..
        } => {
            let e = match error {
                Error::UnknownClass(c) => Error::UnknownClass(c.clone()),
                Error::HeldElsewhere { node } => Error::HeldElsewhere { node: node.clone() },
                Error::Unavailable {
                    reason,
                    retry_after_s,
                } => Error::Unavailable {
                    reason: reason.clone(),
                    retry_after_s: *retry_after_s,
                },
                other => Error::unavailable(other.to_string()),
            };
            let _ = reply.send(Err(e));
        }
        Job::Sql { reply, .. } | Job::AlarmNow { reply, .. } => {
            let _ = reply.send(Err(Error::unavailable(error.to_string())));
        }
        // An alarm that could not run here is delivered again (here or
        // handed off); the committed alarm stays in the actor's database.
        Job::Alarm(fire) if !node.is_shutting_down() => {
            node.timer.set(node.clock.wall_ms() + 1000, fire);
        }
        _ => {}
    }
}

/// Switches to the newest loaded version of the class at an event boundary.
fn switch_component(node: &Node, stub: &Stub, instance: &mut Box<dyn GuestInstance>) {
    if let Some(digest) = node.classes.digest(&stub.id.class)
        && digest != instance.component_digest()
        && let Ok(component) = node.classes.get(&stub.id.class)
    {
        tracing::info!(actor = %stub.id, %digest, "switching to the new class version");
        instance.set_component(component);
    }
}

/// Runs one job as an event.
async fn run_job(node: &Arc<Node>, stub: &Arc<Stub>, active: &mut Active, mut job: Job) {
    // Self-fencing: no event runs without a valid node lease.
    if stub.is_fenced() || !node.peering.lease.is_valid() {
        fail_job(
            node,
            job,
            &Error::unavailable("this node's lease is not valid; it serves again once renewed"),
        );
        stub.mark_fenced();
        return;
    }
    switch_component(node, stub, &mut active.instance);
    stub.metrics.events.inc();
    let instance = &mut active.instance;
    let alarm_before = host(instance).store.alarm();
    // The transaction begins with the event's first statement (a WebSocket
    // echo never opens one).
    if let Err(e) = host(instance).store.check_usable() {
        tracing::warn!(actor = %stub.id, error = %e, "the store is unusable; dropping the actor");
        fail_job(node, job, &Error::Store(e.to_string()));
        stub.mark_broken();
        return;
    }
    let started = Instant::now();
    // Calls made by this event carry the chain of actors waiting on it: a
    // request's own (its callers, then this actor), else this actor alone.
    host(instance).chain = match &mut job {
        Job::Request { chain, .. } => std::mem::take(chain),
        _ => vec![stub.id.clone()],
    };
    // Each arm: the guest's outcome; `Ok(reply)` commits, `Err` rolls back.
    // A request's event has a span (traces on), a child of its request's
    // or call's; its commit's span is a child of it.
    let mut event_span = tracing::Span::none();
    let mut sampled = false;
    let (outcome, reply, started): (Result<Option<Response>, Error>, Option<Reply>, Instant) =
        match job {
            Job::Request {
                request,
                reply,
                started,
                span,
                ..
            } => {
                // Unsampled, the request's own span is entered instead:
                // the event's log lines still carry its trace id.
                sampled = crate::ops::telemetry::sampled(&span);
                event_span = if sampled {
                    tracing::info_span!(target: "wasmkeep::trace", parent: &span, "event", wasmkeep.actor = %stub.id)
                } else {
                    span
                };
                let result = instance
                    .handle(request)
                    .instrument(event_span.clone())
                    .await;
                observe_sql_time(stub, instance);
                let outcome = match result {
                    // Checked before the commit: an answer that cannot be
                    // sent fails the event whole, its writes with it.
                    Ok(response) => match crate::actor::host::check_response(&response) {
                        Ok(()) => Ok(Some(response)),
                        Err(reason) => {
                            stub.metrics.guest_failures.inc();
                            Err(Error::EventRefused(reason))
                        }
                    },
                    Err(e) => Err(Error::Guest(event_error(node, stub, &e))),
                };
                (outcome, reply, started)
            }
            Job::SocketMessage { id, message } => {
                let result = instance.socket_message(id, message).await;
                observe_sql_time(stub, instance);
                (
                    result
                        .map(|()| None)
                        .map_err(|e| Error::Guest(event_error(node, stub, &e))),
                    None,
                    started,
                )
            }
            Job::SocketClose { id, code, reason } => {
                let result = instance.socket_close(id, code, reason).await;
                observe_sql_time(stub, instance);
                (
                    result
                        .map(|()| None)
                        .map_err(|e| Error::Guest(event_error(node, stub, &e))),
                    None,
                    started,
                )
            }
            Job::Sql {
                request,
                statement,
                reply,
                started,
            } => {
                let outcome =
                    crate::actor::operator::run(&mut host(instance).store, &request, &statement);
                (outcome.map(Some), Some(reply), started)
            }
            Job::Alarm(fire) => {
                // Boxed: rare, and inline it would size every event's
                // future for it (ADR 0046).
                // An alarm starts a trace of its own (traces on): its
                // calls are its children.
                let span = if crate::ops::telemetry::on() {
                    tracing::info_span!(target: "wasmkeep::trace", "alarm", wasmkeep.actor = %stub.id, wasmkeep.retry = fire.retry_count)
                } else {
                    tracing::Span::none()
                };
                Box::pin(run_alarm(node, stub, active, fire, alarm_before, None))
                    .instrument(span)
                    .await;
                return;
            }
            Job::AlarmNow { due_by_ms, reply } => {
                let due = alarm_before.filter(|at| due_by_ms.is_none_or(|by| *at <= by));
                let Some(scheduled_ms) = due else {
                    host(instance).store.rollback_event();
                    let answer = alarm_before.map_or("none", |_| "not-due");
                    let _ = reply.send(Ok(crate::actor::alarms::answer(answer)));
                    return;
                };
                // A retry under way is run now as that retry; the timer's
                // entry is spent by this run (what the handler sets, or its
                // retry, is scheduled afresh).
                let retry_count = node
                    .timer
                    .retry_pending(&stub.id, scheduled_ms)
                    .map_or(0, |(pending, _)| pending);
                node.timer.clear_if(&stub.id, scheduled_ms);
                let fire = Fire {
                    actor: stub.id.clone(),
                    scheduled_ms,
                    retry_count,
                };
                Box::pin(run_alarm(
                    node,
                    stub,
                    active,
                    fire,
                    alarm_before,
                    Some(reply),
                ))
                .await;
                return;
            }
            Job::Hibernate | Job::Drain | Job::Replace(_) => {
                host(instance).store.rollback_event();
                return;
            }
            Job::Move { reply, .. } => {
                // Reached only when queued behind a hand-over that began.
                host(instance).store.rollback_event();
                let _ = reply.send(MoveOutcome::Abandoned);
                return;
            }
        };
    match outcome {
        Ok(response) => {
            let span = if sampled {
                tracing::info_span!(target: "wasmkeep::trace", parent: &event_span, "commit")
            } else {
                tracing::Span::none()
            };
            commit(
                node,
                stub,
                active,
                alarm_before,
                response.zip(reply).map(|(r, tx)| (tx, r)),
                started,
                span,
            )
            .await
        }
        Err(error) => {
            let h = host(&mut active.instance);
            h.store.rollback_event();
            h.outbox.clear();
            if let Some(reply) = reply {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// Observes the time the guest's SQL calls took in the event that just
/// ended, and starts the next event's count at zero.
fn observe_sql_time(stub: &Stub, instance: &mut Box<dyn GuestInstance>) {
    let sql_time = std::mem::take(&mut host(instance).sql_time);
    observe(&stub.metrics.sql_seconds, sql_time);
}

/// Counts and logs a failed event; what its client is told (a trap's
/// details only with `guest_error_detail`).
fn event_error(node: &Node, stub: &Stub, error: &EventError) -> String {
    stub.metrics.guest_failures.inc();
    tracing::warn!(actor = %stub.id, %error, "an event failed");
    match error {
        EventError::Trap(_) if !node.config.guest_error_detail => {
            "the guest trapped (the node's log has the details)".to_owned()
        }
        other => other.to_string(),
    }
}

/// Commits the event and queues its response behind the output gate.
async fn commit(
    node: &Arc<Node>,
    stub: &Arc<Stub>,
    active: &mut Active,
    alarm_before: Option<i64>,
    reply: Option<(Reply, Response)>,
    started: Instant,
    span: tracing::Span,
) {
    let h = host(&mut active.instance);
    let sends = std::mem::take(&mut h.outbox);
    match h.store.commit_event() {
        Ok(gate) => {
            if sends
                .iter()
                .any(|(_, out)| matches!(out, Outgoing::Close(..)))
            {
                // Closed from now on for the actor's later events, though
                // the close frame waits for this event's output gate.
                let mut sockets = stub.sockets.lock();
                for (id, out) in &sends {
                    if matches!(out, Outgoing::Close(..))
                        && let Some(entry) = sockets.sockets.get_mut(id)
                    {
                        entry.closing = true;
                    }
                }
            }
            let alarm_after = h.store.alarm();
            if alarm_after != alarm_before {
                node.timer.follow(&stub.id, alarm_after);
            }
            let delivery = Delivery {
                read_durable: gate.is_open(),
                gate,
                reply,
                sends,
                started,
                ended: Instant::now(),
                span,
            };
            // An event that wrote nothing and saw only durable data, with
            // no earlier event's output still held back: out at once,
            // without the deliverer task in between (WebSocket echoes,
            // reads).
            if delivery.gate.is_open() && active.delivering.load(Ordering::Acquire) == 0 {
                deliver(node, stub, delivery, Ok(()));
                return;
            }
            active.delivering.fetch_add(1, Ordering::Relaxed);
            if active.delivery_tx.send(Box::new(delivery)).await.is_err() {
                stub.mark_broken();
            }
        }
        Err(e) => {
            let broken = h.store.is_failed();
            if h.store.is_fenced() {
                node.metrics.store_fenced.inc();
            }
            tracing::warn!(actor = %stub.id, error = %e, broken, "commit failed");
            if let Some((reply, _)) = reply {
                let error = if broken {
                    Error::unavailable(e.to_string())
                } else if matches!(e, wasmkeep_store::Error::EventTooLarge { .. }) {
                    Error::EventRefused(e.to_string())
                } else {
                    Error::Guest(e.to_string())
                };
                let _ = reply.send(Err(error));
            }
            if broken {
                stub.mark_broken();
            }
        }
    }
}

/// An alarm event: runs only if the committed alarm is still the one that
/// fired; clears it on success, retries with backoff on failure.
async fn run_alarm(
    node: &Arc<Node>,
    stub: &Arc<Stub>,
    active: &mut Active,
    fire: Fire,
    committed: Option<i64>,
    reply: Option<Reply>,
) {
    let actor = &stub.id;
    let instance = &mut active.instance;
    // From here on the timer follows what this event commits.
    node.timer.arrived(&fire);
    if committed != Some(fire.scheduled_ms) {
        // Changed or cleared since the timer was armed: nothing to fire.
        host(instance).store.rollback_event();
        node.timer.follow(actor, committed);
        if let Some(reply) = reply {
            let _ = reply.send(Ok(crate::actor::alarms::answer("none")));
        }
        return;
    }
    if node
        .timer
        .retry_pending(actor, fire.scheduled_ms)
        .is_some_and(|(pending, _)| pending > fire.retry_count)
    {
        // A later retry of this same alarm is already scheduled: this is a
        // stale delivery (a first one armed afresh while a retry was
        // pending, say by an alarm handed over). Running it would start
        // the retries over, and a handler that always fails would never be
        // given up.
        host(instance).store.rollback_event();
        if let Some(reply) = reply {
            let _ = reply.send(Ok(crate::actor::alarms::answer("not-due")));
        }
        return;
    }
    stub.metrics.alarms_fired.inc();
    // Saturating: the guest may set any time, i64::MIN included.
    let lag_ms = u64::try_from(node.clock.wall_ms().saturating_sub(fire.scheduled_ms)).unwrap_or(0);
    observe(
        &stub.metrics.alarm_lag_seconds,
        std::time::Duration::from_millis(lag_ms),
    );
    let started = Instant::now();
    // The firing alarm is spent by this event: its handler reads no alarm
    // but one it sets itself (a handler that re-arms "if none is set" then
    // works), and a failed attempt rolls back to it for the retry.
    if let Err(e) = host(instance).store.set_alarm(None) {
        tracing::warn!(%actor, error = %e, "clearing the firing alarm before its handler failed");
    }
    let result = instance.alarm(fire.scheduled_ms, fire.retry_count).await;
    observe_sql_time(stub, instance);
    let outcome = match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(message),
        Err(e) => {
            // Whole: it reaches only the log line of the retry below.
            stub.metrics.guest_failures.inc();
            Err(e.to_string())
        }
    };
    match outcome {
        Ok(()) => {
            // The firing alarm was cleared before the handler ran: what the
            // handler set (or nothing) commits. "Before" is None: the fired
            // entry left the timer; follow any new alarm.
            commit(
                node,
                stub,
                active,
                None,
                reply.map(|reply| (reply, crate::actor::alarms::answer("ran"))),
                started,
                tracing::Span::none(),
            )
            .await;
        }
        Err(message) => {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Error::Guest(format!("the alarm failed: {message}"))));
            }
            let h = host(instance);
            h.store.rollback_event();
            h.outbox.clear();
            let limits = &node.config.limits;
            if fire.retry_count < limits.alarm_retries_max {
                stub.metrics.alarm_retries.inc();
                let delay = retry_delay(limits.alarm_retry_backoff_first, fire.retry_count);
                tracing::warn!(%actor, retry = fire.retry_count + 1, ?delay, error = %message, "alarm failed; retrying");
                let due = node
                    .clock
                    .wall_ms()
                    .saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
                node.timer.set(
                    due,
                    Fire {
                        retry_count: fire.retry_count + 1,
                        ..fire
                    },
                );
            } else {
                tracing::error!(%actor, retries = fire.retry_count, error = %message, "alarm failed too often; given up and cleared");
                let h = host(&mut active.instance);
                let cleared = h.store.begin_event().and_then(|()| h.store.set_alarm(None));
                match cleared {
                    Ok(()) => {
                        commit(
                            node,
                            stub,
                            active,
                            Some(fire.scheduled_ms),
                            None,
                            Instant::now(),
                            tracing::Span::none(),
                        )
                        .await
                    }
                    Err(e) => {
                        host(&mut active.instance).store.rollback_event();
                        tracing::warn!(%actor, error = %e, "clearing the given-up alarm failed");
                    }
                }
            }
        }
    }
}

/// Hands the actor over: finishes queued events, closes sockets, flushes,
/// closes the instance and the database, releases the ownership record.
/// Returns the mailbox back when a hibernation is called off.
async fn hand_over(
    node: &Arc<Node>,
    stub: &Arc<Stub>,
    mut rx: mpsc::Receiver<Box<Job>>,
    mut active: Active,
    leave: Leave,
) -> Option<(mpsc::Receiver<Box<Job>>, Active)> {
    let released = node
        .residents
        .begin_leaving(stub, leave == Leave::Idle, rx.is_empty());
    if leave == Leave::Idle && released.is_none() && node.residents.is_live(stub) {
        // Work arrived while we decided: keep serving.
        return Some((rx, active));
    }
    rx.close();
    let fenced = leave == Leave::Fenced;
    let healthy = !matches!(leave, Leave::Broken | Leave::Fenced);
    if healthy {
        // Events queued before the close still run here.
        while let Ok(job) = rx.try_recv() {
            if !matches!(*job, Job::Hibernate | Job::Drain | Job::Replace(_)) {
                run_job(node, stub, &mut active, *job).await;
            }
        }
    } else {
        let error = Error::unavailable(format!("actor {} is being restored", stub.id));
        while let Ok(job) = rx.try_recv() {
            fail_job(node, *job, &error);
        }
    }
    // Sockets: clients are told to reconnect; the guest sees each close.
    let (code, reason) = if let Some(order) = &active.replace_order {
        (CLOSE_NORMAL, order.close_reason())
    } else if healthy || fenced {
        (CLOSE_SERVICE_RESTART, "server restarting")
    } else {
        (CLOSE_INTERNAL_ERROR, "actor restarting")
    };
    let sockets: Vec<_> = stub.sockets.lock().take_for_close().into_iter().collect();
    for (id, entry) in sockets {
        let _ = entry.tx.try_send(Outgoing::Close(code, reason.to_owned()));
        stub.metrics.sockets_open.dec();
        if healthy {
            run_job(
                node,
                stub,
                &mut active,
                Job::SocketClose {
                    id,
                    code,
                    reason: reason.to_owned(),
                },
            )
            .await;
        }
    }
    let Active {
        mut instance,
        hold,
        delivery_tx,
        deliverer,
        delivering: _,
        move_reply,
        replace_order,
        jobs_run: _,
    } = active;
    drop(delivery_tx);
    let _ = deliverer.await;
    let replacing = replace_order.as_ref();
    // Every record of the store landed or was refused: only then is the
    // hold released (the next holder then need not fence: ADR 0062).
    let mut settled = false;
    if replacing.is_some_and(|order| !order.reads_data()) {
        // Nothing of the store may write after its data is deleted.
        node.unless_lapsed(host(&mut instance).store.close_in_place())
            .await;
    } else if healthy {
        match node.unless_lapsed(host(&mut instance).store.flush()).await {
            Some(Ok(())) => settled = true,
            Some(Err(e)) => {
                tracing::warn!(actor = %stub.id, error = %e, "flush at hand-over failed");
            }
            None => {}
        }
    }
    // The committed alarm, read before the database closes.
    let alarm = host(&mut instance).store.alarm();
    drop(instance);
    // Replaced while the record still names this node: nobody else can
    // open the actor meanwhile (ADR 0055). An import reads the data first,
    // so only once all of it landed.
    if let Some(order) = replacing
        && !stub.is_fenced()
        && (settled || !order.reads_data())
    {
        match node.unless_lapsed(order.carry_out(&stub.id)).await {
            // The replacement fenced the log itself.
            Some(Ok(replaced)) => settled |= replaced,
            Some(Err(e)) => {
                tracing::warn!(actor = %stub.id, error = %e, "replacing the actor's data failed; the next pass over the requests tries again");
            }
            None => {}
        }
    }
    if healthy && replacing.is_none() {
        // The lease is kept while a socket is closing: its client learns
        // the code before the actor leaves. A deleted or imported actor
        // leaves nothing for a new holder to answer for: its record goes at
        // once, and its sockets finish their close handshakes on their own.
        await_sockets_closed(stub).await;
    }
    // The lease lapsed (before or during the hand-over): another node may
    // hold the actor by now, so the record is not touched (or its release
    // is abandoned); it names an incarnation that never renews.
    let lapsed = "dropped without release: this node's lease lapsed";
    let release = if fenced || stub.is_fenced() {
        tracing::warn!(actor = %stub.id, "{lapsed}");
        None
    } else if !settled {
        // A record may still land: the hold stays, and whoever acquires
        // the actor next (this node too) fences the log first.
        tracing::warn!(actor = %stub.id, "dropped without release: a log record of it may still land");
        None
    } else {
        let release = node
            .unless_lapsed(release_hold(node, &stub.id, &hold))
            .await;
        if release.is_none() {
            tracing::warn!(actor = %stub.id, "{lapsed}");
        }
        release
    };
    let returned = match release {
        None => LeaseReturn::Failed,
        Some(returned) => {
            if returned == LeaseReturn::Failed && node.peering.lease.is_valid() {
                // The record names this node while it lives: given back at a
                // later heartbeat, so the actor does not wait for this node to stop.
                node.peering.leftovers.add(&node.metrics, &stub.id);
            }
            returned
        }
    };
    if leave == Leave::Move && planted::hibernate_after_release() {
        // Planted bug (ADR 0017's first draft): forget the move right after
        // the release, so this node's next event claims the actor back.
        if let Some((_, order)) = &move_reply {
            order.forget(&stub.id);
        }
    }
    node.residents.end_leaving(stub, released);
    if let Some((reply, _)) = move_reply {
        let outcome = match returned {
            LeaseReturn::Released => MoveOutcome::Released { alarm },
            LeaseReturn::Failed => MoveOutcome::ReleaseFailed,
        };
        let _ = reply.send(outcome);
    }
    if leave == Leave::Idle {
        stub.metrics.hibernations.inc();
    }

    if leave == Leave::Drain
        && let Some(scheduled_ms) = alarm
    {
        // The alarm goes to the peer now (signed hand-off), so it fires
        // there on time; a failed hand-off is retried from this node's timer.
        // A retry in backoff goes with its count and due time, so the
        // peer neither starts the retries over nor runs it early.
        let (retry_count, due_ms) = node
            .timer
            .retry_pending(&stub.id, scheduled_ms)
            .unwrap_or((0, scheduled_ms));
        node.timer.clear(&stub.id);
        node.deliver_alarm_at(
            Fire {
                actor: stub.id.clone(),
                scheduled_ms,
                retry_count,
            },
            due_ms,
        );
    }
    tracing::debug!(actor = %stub.id, ?leave, "handed over");
    None
}

/// Waits until every socket the hand-over closed finished its close
/// handshake (each is bounded by `CLOSE_HANDSHAKE_TIME_MAX`; so is this).
async fn await_sockets_closed(stub: &Stub) {
    /// How often the closing sockets are counted.
    const POLL: std::time::Duration = std::time::Duration::from_millis(10);
    let deadline = tokio::time::Instant::now() + CLOSE_HANDSHAKE_TIME_MAX;
    while stub.sockets.lock().closing > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
}

/// Runs events until the actor leaves this node.
async fn serve(
    node: Arc<Node>,
    stub: Arc<Stub>,
    mut rx: mpsc::Receiver<Box<Job>>,
    mut active: Active,
) {
    loop {
        let leave = serve_until_leave(&node, &stub, &mut rx, &mut active).await;
        // Boxed, like the activation: this task lives as long as the actor
        // is resident, and its future is as large as the largest step it
        // may take; inline, the hand-over (which runs the events still
        // queued) made it 2.3 KiB per resident actor.
        match Box::pin(hand_over(&node, &stub, rx, active, leave)).await {
            Some((back_rx, back_active)) => {
                rx = back_rx;
                active = back_active;
            }
            None => return,
        }
    }
}

async fn serve_until_leave(
    node: &Arc<Node>,
    stub: &Arc<Stub>,
    rx: &mut mpsc::Receiver<Box<Job>>,
    active: &mut Active,
) -> Leave {
    let mut shutdown: watch::Receiver<bool> = node.shutdown_rx();
    let idle_timeout = node.config.idle_timeout;
    let instance_idle_timeout = node.config.instance_idle_timeout;
    let mut last_job = tokio::time::Instant::now();
    loop {
        if stub.is_fenced() {
            return Leave::Fenced;
        }
        if stub.broken.load(Ordering::Acquire) {
            return Leave::Broken;
        }
        if *shutdown.borrow() {
            return Leave::Shutdown;
        }
        let job = tokio::select! {
            biased;
            _ = stub.broken_notify.notified() => continue,
            _ = shutdown.changed() => continue,
            job = rx.recv() => job,
            _ = tokio::time::sleep_until(if active.jobs_run > 1 {
                    last_job + instance_idle_timeout
                } else {
                    last_job
                }),
                if active.instance.is_loaded() && instance_idle_timeout < idle_timeout =>
            {
                active.instance.unload();
                // The database stays in memory; SQLite's connection is
                // opened again by the next event (~25 µs, ~25 KiB saved).
                host(&mut active.instance).store.park();
                stub.metrics.instance_unloads.inc();
                continue;
            }
            _ = tokio::time::sleep_until(last_job + idle_timeout) => {
                if stub.open_sockets() == 0 {
                    return Leave::Idle;
                }
                last_job = tokio::time::Instant::now();
                continue;
            }
        };
        last_job = tokio::time::Instant::now();
        match job.map(|job| *job) {
            Some(Job::Hibernate) => {
                if stub.open_sockets() == 0 && rx.is_empty() {
                    return Leave::Idle;
                }
            }
            Some(Job::Drain) => return Leave::Drain,
            // Only while the request stands: a pass that listed the key
            // before an earlier deletion removed it must not delete the
            // new actor's writes.
            Some(Job::Replace(order)) => {
                if order.stands(&stub.id).await {
                    active.replace_order = Some(order);
                    return Leave::Replace;
                }
            }
            Some(Job::Move { order, reply }) => {
                if !order.is_current(&stub.id) {
                    let _ = reply.send(MoveOutcome::Abandoned);
                } else if stub.open_sockets() > 0 {
                    let _ = reply.send(MoveOutcome::Busy("a socket is still open"));
                } else {
                    active.move_reply = Some((reply, order));
                    return Leave::Move;
                }
            }
            // Boxed: the event's future (guest call included) is large; inline
            // it would size every idle actor's mailbox task for it.
            Some(job) => {
                active.jobs_run = active.jobs_run.saturating_add(1).min(2);
                Box::pin(run_job(node, stub, active, job)).await;
            }
            None => return Leave::Shutdown,
        }
    }
}

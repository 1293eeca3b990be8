//! The node's alarm timer: one task and a `BTreeMap` of due times for every
//! alarm this node knows of (resident actors' committed alarms, retries of
//! failed deliveries, and alarms the sweep found for actors nobody holds).
//!
//! The timer only says *when*; the actor's mailbox decides *whether*: it runs
//! the alarm only if the committed alarm still equals the time that fired.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use wasmkeep_cluster::Clock;
use wasmkeep_types::ActorId;

/// One delivery the timer asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    pub actor: ActorId,
    /// The committed alarm time (what the guest set).
    pub scheduled_ms: i64,
    /// 0 on the first delivery.
    pub retry_count: u32,
}

#[derive(Debug, Default)]
struct TimerState {
    due: BTreeMap<(i64, ActorId), Fire>,
    by_actor: HashMap<ActorId, i64>,
    /// Deliveries taken from `due` that have not reached their mailbox yet.
    /// The delivery may activate the actor, whose activation arms its
    /// committed alarm: an in-flight delivery of that alarm counts as
    /// armed, or a fresh first delivery could overtake a retry and start
    /// the retries over.
    in_flight: HashMap<ActorId, Fire>,
}

impl TimerState {
    /// The delivery registered for the actor: scheduled or in flight.
    fn registered(&self, actor: &ActorId) -> Option<&Fire> {
        self.by_actor
            .get(actor)
            .and_then(|due| self.due.get(&(*due, actor.clone())))
            .or_else(|| self.in_flight.get(actor))
    }
}

/// Delay before retry `retry_count + 1` of a failed alarm: `first * 2^retry_count`.
pub fn retry_delay(first: Duration, retry_count: u32) -> Duration {
    first.saturating_mul(1u32 << retry_count.min(20))
}

/// Alarm times are wall-clock milliseconds of the node's [`Clock`] (the
/// guest sets them so); the timer sleeps on tokio's monotonic time, so a
/// simulated node's timer runs on virtual time.
pub struct AlarmTimer {
    state: Mutex<TimerState>,
    wake: Notify,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AlarmTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlarmTimer")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl AlarmTimer {
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            wake: Notify::new(),
            clock,
        })
    }

    /// Schedules `fire` at `due_ms`, replacing whatever the actor had.
    pub fn set(&self, due_ms: i64, fire: Fire) {
        let mut state = self.state.lock();
        if let Some(old) = state.by_actor.remove(&fire.actor) {
            state.due.remove(&(old, fire.actor.clone()));
        }
        state.by_actor.insert(fire.actor.clone(), due_ms);
        state.due.insert((due_ms, fire.actor.clone()), fire);
        drop(state);
        self.wake.notify_one();
    }

    /// Schedules the first delivery of a committed alarm unless the actor
    /// already has an entry or a delivery in flight (a retry in progress
    /// keeps its backoff).
    pub fn set_if_absent(&self, actor: ActorId, at_ms: i64) {
        if self.contains(&actor) {
            return;
        }
        self.set(
            at_ms,
            Fire {
                actor,
                scheduled_ms: at_ms,
                retry_count: 0,
            },
        );
    }

    /// Makes the timer follow a committed alarm: schedules it (unless an
    /// entry or an in-flight delivery for the same time is already there)
    /// or forgets the actor.
    pub fn follow(&self, actor: &ActorId, committed: Option<i64>) {
        match committed {
            Some(at_ms) => {
                let same = self
                    .state
                    .lock()
                    .registered(actor)
                    .is_some_and(|fire| fire.scheduled_ms == at_ms);
                if !same {
                    self.set(
                        at_ms,
                        Fire {
                            actor: actor.clone(),
                            scheduled_ms: at_ms,
                            retry_count: 0,
                        },
                    );
                }
            }
            None => self.clear(actor),
        }
    }

    pub fn clear(&self, actor: &ActorId) {
        let mut state = self.state.lock();
        if let Some(old) = state.by_actor.remove(actor) {
            state.due.remove(&(old, actor.clone()));
        }
    }

    /// Forgets the actor's entry only if it is the registration of the
    /// alarm scheduled at `scheduled_ms` (a newer one stays).
    pub fn clear_if(&self, actor: &ActorId, scheduled_ms: i64) {
        let mut state = self.state.lock();
        let matches = state
            .by_actor
            .get(actor)
            .and_then(|due| state.due.get(&(*due, actor.clone())))
            .is_some_and(|fire| fire.scheduled_ms == scheduled_ms);
        if matches && let Some(old) = state.by_actor.remove(actor) {
            state.due.remove(&(old, actor.clone()));
        }
    }

    /// The retry count and due time of the actor's scheduled entry, if it
    /// is a delivery of the alarm committed for `scheduled_ms`.
    pub fn retry_pending(&self, actor: &ActorId, scheduled_ms: i64) -> Option<(u32, i64)> {
        let state = self.state.lock();
        let due = state.by_actor.get(actor)?;
        let fire = state.due.get(&(*due, actor.clone()))?;
        (fire.scheduled_ms == scheduled_ms).then_some((fire.retry_count, *due))
    }

    /// Schedules a retry handed over by the actor's former holder, at its
    /// own due time, unless this node already knows of a delivery of the
    /// same alarm that is as far along. An entry of another alarm stays: it
    /// is the actor's committed alarm here (the mailbox runs only that one).
    /// True when the retry was scheduled.
    pub fn adopt_retry(&self, fire: Fire, due_ms: i64) -> bool {
        let known = self
            .state
            .lock()
            .registered(&fire.actor)
            .map(|known| (known.scheduled_ms, known.retry_count));
        match known {
            Some((scheduled_ms, _)) if scheduled_ms != fire.scheduled_ms => false,
            Some((_, retry_count)) if retry_count >= fire.retry_count => false,
            _ => {
                self.set(due_ms, fire);
                true
            }
        }
    }

    /// Whether the actor has an entry or a delivery in flight.
    pub fn contains(&self, actor: &ActorId) -> bool {
        self.state.lock().registered(actor).is_some()
    }

    /// The delivery `fire` reached its mailbox, or will not: it no longer
    /// counts as armed (a later delivery of the actor stays).
    pub fn arrived(&self, fire: &Fire) {
        let mut state = self.state.lock();
        if state.in_flight.get(&fire.actor) == Some(fire) {
            state.in_flight.remove(&fire.actor);
        }
    }

    /// The actors with a delivery due by `now_ms` or in flight, in time
    /// order (nothing is taken: the timer still delivers them).
    pub fn due_by(&self, now_ms: i64) -> Vec<ActorId> {
        let state = self.state.lock();
        let mut actors: Vec<ActorId> = state
            .due
            .keys()
            .take_while(|(due, _)| *due <= now_ms)
            .map(|(_, actor)| actor.clone())
            .collect();
        let mut in_flight: Vec<ActorId> = state.in_flight.keys().cloned().collect();
        in_flight.sort_unstable();
        actors.extend(
            in_flight
                .into_iter()
                .filter(|a| !state.by_actor.contains_key(a)),
        );
        actors
    }

    pub fn len(&self) -> usize {
        self.state.lock().by_actor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes and returns every entry due at `now_ms`, or the next due
    /// time. Each stays in flight until [`AlarmTimer::arrived`].
    fn take_due(&self, now_ms: i64) -> (Vec<Fire>, Option<i64>) {
        // Planted (the simulation's tests): a minute early.
        let now_ms = now_ms
            + if wasmkeep_cluster::planted::alarm_early() {
                60_000
            } else {
                0
            };
        let mut state = self.state.lock();
        let mut fired = Vec::new();
        while let Some(((due, _), _)) = state.due.first_key_value() {
            if *due > now_ms {
                return (fired, Some(*due));
            }
            let ((_, actor), fire) = state.due.pop_first().expect("first entry exists");
            state.by_actor.remove(&actor);
            state.in_flight.insert(actor, fire.clone());
            fired.push(fire);
        }
        (fired, None)
    }

    /// The timer task: calls `deliver` for each due alarm until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        deliver: impl Fn(Fire) + Send + 'static,
        mut shutdown: watch::Receiver<bool>,
    ) {
        /// Longest sleep without re-checking the clock (wall-clock jumps).
        const SLEEP_MAX: Duration = Duration::from_secs(1);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let (fired, next) = self.take_due(self.clock.wall_ms());
            for fire in fired {
                deliver(fire);
            }
            let sleep = next
                .map(|due| {
                    Duration::from_millis(u64::try_from(due - self.clock.wall_ms()).unwrap_or(0))
                })
                .unwrap_or(SLEEP_MAX)
                .min(SLEEP_MAX);
            tokio::select! {
                // Checked in order: a run replays the same way (ADR 0006).
                biased;
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// The alarm timer as a part of the node (`crate::parts`): calls `deliver`
/// for each due alarm until shutdown.
pub(crate) struct TimerPart<F> {
    timer: Arc<AlarmTimer>,
    deliver: F,
}

impl<F: Fn(Fire) + Send + 'static> TimerPart<F> {
    pub(crate) fn new(timer: Arc<AlarmTimer>, deliver: F) -> Self {
        Self { timer, deliver }
    }
}

impl<F: Fn(Fire) + Send + 'static> crate::parts::Part for TimerPart<F> {
    const NAME: &'static str = "alarm-timer";
    const NEEDED: bool = true;

    fn run(self, shutdown: watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + Send {
        self.timer.run(self.deliver, shutdown)
    }
}

/// What [`Job::AlarmNow`] answers: a text body.
pub(crate) fn answer(outcome: &str) -> wasmkeep_runtime::Response {
    wasmkeep_runtime::Response {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: outcome.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(name: &str) -> ActorId {
        ActorId::parse(&format!("t/c/{name}")).expect("valid")
    }

    #[test]
    fn backoff_doubles_from_the_first_delay() {
        let first = Duration::from_secs(2);
        assert_eq!(retry_delay(first, 0), Duration::from_secs(2));
        assert_eq!(retry_delay(first, 1), Duration::from_secs(4));
        assert_eq!(retry_delay(first, 5), Duration::from_secs(64));
    }

    #[test]
    fn due_entries_come_out_in_time_order_and_once() {
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        timer.set(
            30,
            Fire {
                actor: actor("b"),
                scheduled_ms: 30,
                retry_count: 0,
            },
        );
        timer.set(
            10,
            Fire {
                actor: actor("a"),
                scheduled_ms: 10,
                retry_count: 0,
            },
        );
        timer.set(
            50,
            Fire {
                actor: actor("c"),
                scheduled_ms: 50,
                retry_count: 0,
            },
        );
        let (fired, next) = timer.take_due(40);
        assert_eq!(
            fired
                .iter()
                .map(|f| f.actor.name().to_owned())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(next, Some(50));
        assert!(timer.take_due(40).0.is_empty());
    }

    #[test]
    fn set_replaces_and_follow_clears() {
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        timer.follow(&actor("a"), Some(100));
        timer.follow(&actor("a"), Some(20));
        assert_eq!(timer.len(), 1);
        assert_eq!(timer.take_due(25).0.len(), 1);
        timer.follow(&actor("a"), Some(100));
        timer.follow(&actor("a"), None);
        assert!(timer.is_empty());
        timer.set(
            5,
            Fire {
                actor: actor("a"),
                scheduled_ms: 1,
                retry_count: 2,
            },
        );
        assert_eq!(timer.retry_pending(&actor("a"), 1), Some((2, 5)));
        assert_eq!(timer.retry_pending(&actor("a"), 7), None);
        assert_eq!(timer.retry_pending(&actor("b"), 1), None);
        timer.set_if_absent(actor("a"), 1);
        assert_eq!(timer.take_due(5).0[0].retry_count, 2);
        assert_eq!(timer.retry_pending(&actor("a"), 1), None);
    }

    #[test]
    fn a_delivery_in_flight_counts_as_armed_until_it_arrives() {
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        let retry = Fire {
            actor: actor("a"),
            scheduled_ms: 1,
            retry_count: 2,
        };
        timer.set(5, retry.clone());
        assert_eq!(timer.take_due(5).0, std::slice::from_ref(&retry));
        // The activation the retry causes, and a sweep, arm nothing new.
        timer.follow(&actor("a"), Some(1));
        timer.set_if_absent(actor("a"), 1);
        assert!(timer.contains(&actor("a")));
        assert!(timer.take_due(i64::MAX).0.is_empty());
        // A different alarm is armed at once.
        timer.follow(&actor("a"), Some(3));
        assert_eq!(timer.retry_pending(&actor("a"), 3), Some((0, 3)));
        timer.clear(&actor("a"));
        // Once arrived, the alarm it carried is armed afresh when followed.
        timer.arrived(&retry);
        assert!(!timer.contains(&actor("a")));
        timer.follow(&actor("a"), Some(1));
        assert_eq!(timer.retry_pending(&actor("a"), 1), Some((0, 1)));
    }

    #[test]
    fn a_handed_over_retry_keeps_its_count_and_time() {
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        let retry = |retry_count| Fire {
            actor: actor("a"),
            scheduled_ms: 1,
            retry_count,
        };
        // The activation armed the committed alarm's first delivery; the
        // hand-over's retry 2, due at 9, replaces it.
        timer.follow(&actor("a"), Some(1));
        timer.adopt_retry(retry(2), 9);
        assert_eq!(timer.retry_pending(&actor("a"), 1), Some((2, 9)));
        assert!(timer.take_due(8).0.is_empty());
        // A delivery as far along, or further, stays as it is.
        timer.adopt_retry(retry(1), 4);
        timer.adopt_retry(retry(2), 5);
        assert_eq!(timer.retry_pending(&actor("a"), 1), Some((2, 9)));
        // So does another committed alarm: the mailbox runs only that one.
        timer.follow(&actor("a"), Some(7));
        timer.adopt_retry(retry(3), 5);
        assert_eq!(timer.retry_pending(&actor("a"), 7), Some((0, 7)));
        // With nothing registered, the retry is scheduled at its time.
        timer.clear(&actor("a"));
        assert!(timer.adopt_retry(retry(3), 5));
        assert_eq!(timer.take_due(5).0, [retry(3)]);
    }

    #[test]
    fn an_activation_after_a_handed_over_retry_keeps_it() {
        // The receiving node registers the retry before it activates the
        // actor; the activation's arming of the committed alarm must not
        // put a first delivery, due at once, in its place.
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        let fire = Fire {
            actor: actor("a"),
            scheduled_ms: 1,
            retry_count: 1,
        };
        assert!(timer.adopt_retry(fire.clone(), 9));
        timer.follow(&actor("a"), Some(1));
        assert_eq!(timer.retry_pending(&actor("a"), 1), Some((1, 9)));
        assert!(timer.take_due(8).0.is_empty());
        assert_eq!(timer.take_due(9).0, [fire]);
    }

    #[tokio::test]
    async fn run_delivers_a_due_alarm() {
        let timer = AlarmTimer::new(Arc::new(wasmkeep_cluster::SystemClock));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (_stop, shutdown) = watch::channel(false);
        tokio::spawn(Arc::clone(&timer).run(
            move |fire| {
                let _ = tx.send(fire);
            },
            shutdown,
        ));
        timer.set(
            wasmkeep_cluster::SystemClock.wall_ms() + 20,
            Fire {
                actor: actor("a"),
                scheduled_ms: 7,
                retry_count: 0,
            },
        );
        let fire = rx.recv().await.expect("delivered");
        assert_eq!(fire.scheduled_ms, 7);
    }
}

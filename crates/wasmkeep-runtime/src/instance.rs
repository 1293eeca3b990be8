//! [`ActorInstance`]: one live instance of a class for one actor, and the
//! running of its events under the time and memory limits.
//!
//! After a guest fails an event (trap, time limit, memory limit) its instance
//! is dropped at once with its store, freeing its pool slot and memory; the
//! host is parked, and the next event makes a fresh store and instantiates
//! the component again there.

use std::time::{Duration, Instant};

use tokio::time::error::Elapsed;
use wasmkeep_types::ActorId;
use wasmtime::Store;

use crate::bindings::Actor;
use crate::bindings::wasmkeep::actor::types;
use crate::component::ClassComponent;
use crate::error::{Error, EventError};
use crate::host::{ActorHost, Message, Request, Response};
use crate::state::{MemoryLimitExceeded, State, TimeLimitExceeded};

/// Extra time past `event_time_max` before the event's future is dropped. The
/// epoch callback stops a running guest at the limit; this backstop covers an
/// event stuck in a host call (`actors.call`) that never returns.
const BACKSTOP_GRACE: Duration = Duration::from_secs(1);

/// One live instance; re-instantiates itself after a failed event (at the next
/// event). Events run one at a time (`&mut self`).
pub struct ActorInstance {
    component: ClassComponent,
    /// Set by [`ActorInstance::set_component`]; taken at the next event.
    next_component: Option<ClassComponent>,
    /// `None` while the instance is unloaded: then `parked` holds the host
    /// and a store is made again by the next event. An empty store with its
    /// WASI context costs ~20 KiB, so an unloaded actor keeps none.
    store: Option<Store<State>>,
    /// The actor and its host while there is no store.
    parked: Option<(ActorId, Box<dyn ActorHost>)>,
    /// `None` when the store holds no instance yet (after a failure or a
    /// version switch): the next event instantiates first.
    actor: Option<Actor>,
}

impl ActorInstance {
    pub(crate) async fn new(
        component: ClassComponent,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> Result<Self, Error> {
        let store = component.runtime().new_store(id, host);
        let mut instance = Self {
            component,
            next_component: None,
            store: Some(store),
            parked: None,
            actor: None,
        };
        instance
            .instantiate()
            .await
            .map_err(|e| Error::Instantiate(e.to_string()))?;
        Ok(instance)
    }

    /// The node's per-actor host state.
    pub fn host(&mut self) -> &mut dyn ActorHost {
        match (&mut self.store, &mut self.parked) {
            (Some(store), _) => store.data_mut().host.as_mut(),
            (None, Some((_, host))) => host.as_mut(),
            (None, None) => unreachable!("an instance always has a store or a parked host"),
        }
    }

    /// The component version events run on from the next event on.
    pub fn set_component(&mut self, component: ClassComponent) {
        self.next_component = Some(component);
    }

    /// Drops the guest instance, freeing its memory and pool slot, but keeps
    /// the host: the next event instantiates afresh. The node unloads actors
    /// idle for a short while, because an idle instance holds tens of KiB of
    /// touched guest memory and re-instantiating costs about 14 µs.
    pub fn unload(&mut self) {
        self.renew();
    }

    /// Whether a guest instance is live (false after [`ActorInstance::unload`]
    /// or a failed event, until the next event).
    pub fn is_loaded(&self) -> bool {
        self.actor.is_some()
    }

    /// SHA-256 of the component the instance runs (or will run at the next
    /// event, after [`ActorInstance::set_component`]).
    pub fn component_digest(&self) -> &str {
        self.next_component
            .as_ref()
            .unwrap_or(&self.component)
            .digest()
    }

    pub async fn handle(&mut self, request: Request) -> Result<Response, EventError> {
        let request = types::Request::from(request);
        let time_max = self.time_max();
        let (actor, store) = self.begin().await?;
        let call = actor.wasmkeep_actor_handler().call_handle(store, &request);
        let outcome = tokio::time::timeout(time_max, call).await;
        self.finish(outcome).map(Response::from)
    }

    pub async fn alarm(
        &mut self,
        scheduled_ms: i64,
        retry_count: u32,
    ) -> Result<Result<(), String>, EventError> {
        let time_max = self.time_max();
        let (actor, store) = self.begin().await?;
        let call = actor
            .wasmkeep_actor_events()
            .call_alarm(store, scheduled_ms, retry_count);
        let outcome = tokio::time::timeout(time_max, call).await;
        self.finish(outcome)
    }

    pub async fn socket_message(&mut self, id: u64, message: Message) -> Result<(), EventError> {
        let message = types::Message::from(message);
        let time_max = self.time_max();
        let (actor, store) = self.begin().await?;
        let call = actor
            .wasmkeep_actor_events()
            .call_socket_message(store, id, &message);
        let outcome = tokio::time::timeout(time_max, call).await;
        self.finish(outcome)
    }

    pub async fn socket_close(
        &mut self,
        id: u64,
        code: u16,
        reason: String,
    ) -> Result<(), EventError> {
        let time_max = self.time_max();
        let (actor, store) = self.begin().await?;
        let call = actor
            .wasmkeep_actor_events()
            .call_socket_close(store, id, code, &reason);
        let outcome = tokio::time::timeout(time_max, call).await;
        self.finish(outcome)
    }

    fn time_max(&self) -> Duration {
        self.component.runtime().config.event_time_max + BACKSTOP_GRACE
    }

    /// The store, made again from the parked host if the instance was unloaded.
    fn store_mut(&mut self) -> &mut Store<State> {
        if self.store.is_none() {
            let (id, host) = self
                .parked
                .take()
                .expect("an instance always has a store or a parked host");
            self.store = Some(self.component.runtime().new_store(id, host));
        }
        self.store.as_mut().expect("made just above")
    }

    /// Readies the instance for an event: switches version if asked,
    /// instantiates if needed, and arms the event's deadline.
    async fn begin(&mut self) -> Result<(&Actor, &mut Store<State>), EventError> {
        if let Some(next) = self.next_component.take() {
            self.component = next;
            self.renew();
        }
        if self.actor.is_none() {
            self.instantiate().await?;
        }
        let store = self.store.as_mut().expect("instantiate made the store");
        arm(store, self.component.runtime().config.event_time_max);
        let actor = self.actor.as_ref().expect("instantiated above");
        Ok((actor, store))
    }

    async fn instantiate(&mut self) -> Result<(), EventError> {
        let event_time_max = self.component.runtime().config.event_time_max;
        let pre = self.component.pre().clone();
        let store = self.store_mut();
        arm(store, event_time_max);
        let outcome = tokio::time::timeout(
            event_time_max + BACKSTOP_GRACE,
            pre.instantiate_async(&mut *store),
        )
        .await;
        match outcome {
            Ok(Ok(actor)) => {
                self.actor = Some(actor);
                Ok(())
            }
            Ok(Err(error)) => {
                let error = match classify(&error, None) {
                    EventError::Trap(message) => EventError::Instantiate(message),
                    other => other,
                };
                self.fail(&error);
                Err(error)
            }
            Err(Elapsed { .. }) => {
                self.fail(&EventError::TimeLimit);
                Err(EventError::TimeLimit)
            }
        }
    }

    /// Maps the outcome of one export call; a failure drops the instance.
    fn finish<T>(
        &mut self,
        outcome: Result<wasmtime::Result<T>, Elapsed>,
    ) -> Result<T, EventError> {
        let error = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => classify(&error, self.store_mut().data().stderr_tail.text()),
            Err(_elapsed) => EventError::TimeLimit,
        };
        self.fail(&error);
        Err(error)
    }

    fn fail(&mut self, error: &EventError) {
        let actor = match (&self.store, &self.parked) {
            (Some(store), _) => store.data().id.to_string(),
            (None, Some((id, _))) => id.to_string(),
            (None, None) => String::new(),
        };
        tracing::warn!(%actor, component = %self.component.digest(), %error, "guest event failed; the instance is dropped");
        self.renew();
    }

    /// Drops the current instance and its store (freeing its pool slot) and
    /// parks the host; the next event makes a fresh store.
    fn renew(&mut self) {
        self.actor = None;
        if let Some(old) = self.store.take() {
            let State { host, id, .. } = old.into_data();
            self.parked = Some((id, host));
        }
    }
}

/// Starts an event's clock: the epoch callback stops the guest once
/// `time_max` has passed, and the tail of stderr is the event's own.
fn arm(store: &mut Store<State>, time_max: Duration) {
    let data = store.data_mut();
    data.event_deadline = Instant::now() + time_max;
    data.outbound.deadline = data.event_deadline;
    data.stderr_tail.clear();
    store.set_epoch_deadline(1);
}

/// Names why a guest call failed. `stderr` is what the guest last wrote there
/// (a Rust panic message), added to a trap's message.
fn classify(error: &wasmtime::Error, stderr: Option<String>) -> EventError {
    if error.downcast_ref::<TimeLimitExceeded>().is_some() {
        return EventError::TimeLimit;
    }
    if let Some(limit) = error.downcast_ref::<MemoryLimitExceeded>() {
        return EventError::MemoryLimit(limit.0.clone());
    }
    let mut message = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => format!("the guest called exit({})", exit.0),
            None => format!("{error:#}"),
        },
    };
    if let Some(stderr) = stderr {
        message.push_str("; guest stderr: ");
        message.push_str(&stderr);
    }
    EventError::Trap(message)
}

//! The node: its resident actors (stubs), `ensure_owner`, the class
//! registry, and the long-running parts (alarm timer, alarm sweep, class
//! poll) started and stopped together.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::{ClassComponent, Request, Response, Runtime};
use wasmkeep_store::StoreConfig;
use wasmkeep_types::{ActorId, ClassName, Keys};

use crate::alarms::{AlarmTimer, Fire, now_ms};
use crate::counting::CountingBucket;
use crate::host::SharedSockets;
use crate::mailbox::{self, Job};
use crate::metrics::Metrics;
use crate::owner::Me;
use crate::{Error, NodeConfig, Result, classes};

/// A resident actor's in-memory state shared outside its mailbox.
#[derive(Debug)]
pub struct Stub {
    pub id: ActorId,
    pub(crate) tx: mpsc::Sender<Job>,
    pub(crate) sockets: SharedSockets,
    last_used_ms: AtomicI64,
    /// Set when the actor's store failed; the mailbox drops the actor.
    pub(crate) broken: AtomicBool,
    pub(crate) broken_notify: Notify,
    /// The actor this actor's running event is calling, if any: the edges of
    /// the node's waits-for graph, followed to refuse deadlocking calls.
    waiting_on: Mutex<Option<ActorId>>,
}

impl Stub {
    fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn open_sockets(&self) -> usize {
        self.sockets.lock().sockets.len()
    }

    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Release);
        self.broken_notify.notify_one();
    }
}

/// Where an actor runs. Only `Local` for now; the cluster adds `Elsewhere`.
#[derive(Debug, Clone)]
pub enum Owner {
    Local(Arc<Stub>),
}

enum Entry {
    Live(Arc<Stub>),
    /// Hibernating: wait for `true`, then look again.
    Releasing(watch::Receiver<bool>),
}

pub struct Node {
    pub config: NodeConfig,
    pub bucket: Arc<dyn Bucket>,
    pub keys: Keys,
    pub runtime: Runtime,
    pub me: Me,
    pub metrics: Arc<Metrics>,
    pub(crate) store_config: StoreConfig,
    classes: RwLock<HashMap<ClassName, ClassComponent>>,
    actors: Mutex<HashMap<ActorId, Entry>>,
    actors_changed: Notify,
    pub(crate) timer: Arc<AlarmTimer>,
    shutdown_tx: watch::Sender<bool>,
    socket_ids: AtomicU64,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.me.node)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Builds the node, loads the deployed classes and starts the alarm
    /// timer, the alarm sweep and the class poll.
    pub async fn start(
        config: NodeConfig,
        bucket: Arc<dyn Bucket>,
        runtime: Runtime,
    ) -> Result<Arc<Self>> {
        let metrics = Arc::new(Metrics::default());
        let bucket: Arc<dyn Bucket> = Arc::new(CountingBucket::new(bucket, Arc::clone(&metrics)));
        let (shutdown_tx, _) = watch::channel(false);
        let node = Arc::new(Self {
            keys: Keys::new(&config.app),
            me: Me {
                node: config.node_id.clone(),
                incarnation: format!("{:016x}", rand::random::<u64>()),
            },
            config,
            bucket,
            runtime,
            metrics,
            store_config: StoreConfig::default(),
            classes: RwLock::new(HashMap::new()),
            actors: Mutex::new(HashMap::new()),
            actors_changed: Notify::new(),
            timer: AlarmTimer::new(),
            shutdown_tx,
            socket_ids: AtomicU64::new(1),
        });
        classes::poll(&node).await?;
        node.spawn_background();
        Ok(node)
    }

    fn spawn_background(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(Arc::clone(&self.timer).run(
            move |fire| {
                if let Some(node) = weak.upgrade() {
                    node.deliver_alarm(fire);
                }
            },
            self.shutdown_rx(),
        ));
        let node = Arc::clone(self);
        let mut shutdown = self.shutdown_rx();
        tokio::spawn(async move {
            let mut next_sweep = Instant::now();
            loop {
                if Instant::now() >= next_sweep {
                    if let Err(e) = node.sweep_alarms().await {
                        tracing::warn!(error = %e, "alarm sweep failed");
                    }
                    next_sweep = Instant::now() + node.config.alarm_sweep_period;
                }
                tokio::select! {
                    _ = tokio::time::sleep(node.config.heartbeat_period) => {}
                    _ = shutdown.changed() => return,
                }
                if *shutdown.borrow() {
                    return;
                }
                if let Err(e) = classes::poll(&node).await {
                    tracing::warn!(error = %e, "class poll failed");
                }
            }
        });
    }

    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    pub(crate) fn next_socket_id(&self) -> u64 {
        self.socket_ids.fetch_add(1, Ordering::Relaxed)
    }

    // ---- classes -------------------------------------------------------

    pub fn class(&self, class: &ClassName) -> Result<ClassComponent> {
        if !self.config.serves_class(class) {
            return Err(Error::UnknownClass(class.to_string()));
        }
        self.classes
            .read()
            .get(class)
            .cloned()
            .ok_or_else(|| Error::UnknownClass(class.to_string()))
    }

    pub(crate) fn class_digest(&self, class: &ClassName) -> Option<String> {
        self.classes
            .read()
            .get(class)
            .map(|c| c.digest().to_owned())
    }

    pub(crate) fn set_class(&self, class: ClassName, component: ClassComponent) {
        self.classes.write().insert(class, component);
    }

    // ---- actors ----------------------------------------------------------

    /// Number of resident actors (hibernating ones included until released).
    pub fn resident_count(&self) -> usize {
        self.actors.lock().len()
    }

    /// Makes sure this node holds `actor` and returns its stub; the first
    /// event of a new stub activates it (ownership record, store, instance).
    pub async fn ensure_owner(self: &Arc<Self>, actor: &ActorId) -> Result<Owner> {
        loop {
            let mut waiter = {
                let mut actors = self.actors.lock();
                match actors.get(actor) {
                    Some(Entry::Live(stub)) => {
                        stub.touch();
                        return Ok(Owner::Local(Arc::clone(stub)));
                    }
                    Some(Entry::Releasing(rx)) => rx.clone(),
                    None => {
                        if self.is_shutting_down() {
                            return Err(Error::unavailable("the node is shutting down"));
                        }
                        self.class(&actor.class)?;
                        if actors.len() >= self.config.actors_max {
                            self.evict_lru(&actors)?;
                        }
                        let stub = self.spawn_stub(actor.clone());
                        actors.insert(actor.clone(), Entry::Live(Arc::clone(&stub)));
                        self.metrics
                            .resident_actors
                            .store(actors.len() as i64, Ordering::Relaxed);
                        return Ok(Owner::Local(stub));
                    }
                }
            };
            // A hibernating actor is released before it is activated again.
            let _ = waiter.wait_for(|released| *released).await;
        }
    }

    /// Asks the least recently used idle actor to hibernate, or refuses when
    /// every resident actor is busy.
    fn evict_lru(&self, actors: &HashMap<ActorId, Entry>) -> Result<()> {
        let victim = actors
            .values()
            .filter_map(|e| match e {
                Entry::Live(stub) if stub.open_sockets() == 0 && stub.queue_is_empty() => {
                    Some(stub)
                }
                _ => None,
            })
            .min_by_key(|stub| stub.last_used_ms.load(Ordering::Relaxed));
        match victim {
            Some(stub) => {
                // Best effort: a full mailbox is not idle and will not be chosen.
                let _ = stub.tx.try_send(Job::Hibernate);
                Ok(())
            }
            None => Err(Error::unavailable(
                "every resident actor is busy (max-actors reached)",
            )),
        }
    }

    fn spawn_stub(self: &Arc<Self>, id: ActorId) -> Arc<Stub> {
        let (tx, rx) = mpsc::channel(self.config.limits.mailbox_events_max);
        let stub = Arc::new(Stub {
            id,
            tx,
            sockets: SharedSockets::default(),
            last_used_ms: AtomicI64::new(now_ms()),
            broken: AtomicBool::new(false),
            broken_notify: Notify::new(),
            waiting_on: Mutex::new(None),
        });
        tokio::spawn(mailbox::run(Arc::clone(self), Arc::clone(&stub), rx));
        stub
    }

    /// Step 1 of a hand-over: under the map lock, if the actor is still idle
    /// (or `force`), mark it releasing. Returns the sender to signal release.
    pub(crate) fn begin_release(
        &self,
        stub: &Arc<Stub>,
        idle_only: bool,
        queue_empty: bool,
    ) -> Option<watch::Sender<bool>> {
        let mut actors = self.actors.lock();
        let ours = matches!(actors.get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub));
        if !ours {
            return None;
        }
        if idle_only && (!queue_empty || stub.open_sockets() > 0) {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        actors.insert(stub.id.clone(), Entry::Releasing(rx));
        Some(tx)
    }

    /// Last step of a hand-over: forget the actor and wake whoever waits.
    pub(crate) fn end_release(&self, stub: &Arc<Stub>, released: Option<watch::Sender<bool>>) {
        let mut actors = self.actors.lock();
        match actors.get(&stub.id) {
            Some(Entry::Releasing(_)) if released.is_some() => {
                actors.remove(&stub.id);
            }
            Some(Entry::Live(s)) if Arc::ptr_eq(s, stub) => {
                actors.remove(&stub.id);
            }
            _ => {}
        }
        self.metrics
            .resident_actors
            .store(actors.len() as i64, Ordering::Relaxed);
        drop(actors);
        if let Some(tx) = released {
            let _ = tx.send(true);
        }
        self.actors_changed.notify_waiters();
    }

    /// Whether the stub is still this node's live stub for its actor.
    pub(crate) fn is_live(&self, stub: &Arc<Stub>) -> bool {
        matches!(self.actors.lock().get(&stub.id), Some(Entry::Live(s)) if Arc::ptr_eq(s, stub))
    }

    /// Runs a request (from HTTP or another actor) as an event of `actor`.
    /// `chain` lists the actors waiting on this call, `actor` last.
    pub async fn request(
        self: &Arc<Self>,
        actor: &ActorId,
        request: Request,
        chain: Vec<ActorId>,
    ) -> Result<Response> {
        /// A stub that closes between lookup and send is looked up again, this often.
        const STALE_STUB_RETRIES_MAX: usize = 3;
        let mut job = Job::Request {
            request,
            chain,
            reply: None,
            started: Instant::now(),
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if let Job::Request { reply, .. } = &mut job {
            *reply = Some(reply_tx);
        }
        for _ in 0..STALE_STUB_RETRIES_MAX {
            let Owner::Local(stub) = self.ensure_owner(actor).await?;
            match stub.tx.try_send(job) {
                Ok(()) => {
                    return match reply_rx.await {
                        Ok(result) => result,
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
        /// Longest waits-for path followed (longer ones are cut, not refused).
        const WAITS_FOR_STEPS_MAX: usize = 64;
        let caller_stub = match self.actors.lock().get(caller) {
            Some(Entry::Live(stub)) => Some(Arc::clone(stub)),
            _ => None,
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = Some(target.clone());
        }
        let mut at = target.clone();
        let mut cycle = false;
        for _ in 0..WAITS_FOR_STEPS_MAX {
            let next = match self.actors.lock().get(&at) {
                Some(Entry::Live(stub)) => stub.waiting_on.lock().clone(),
                _ => None,
            };
            match next {
                Some(next) if &next == caller => {
                    cycle = true;
                    break;
                }
                Some(next) => at = next,
                None => break,
            }
        }
        let result = if cycle {
            Err(Error::Call(format!(
                "call cycle: {target} is already waiting on {caller}"
            )))
        } else {
            self.request(target, request, chain).await
        };
        if let Some(stub) = &caller_stub {
            *stub.waiting_on.lock() = None;
        }
        result
    }

    /// Sends an event that no client waits for (alarm, socket), waiting for
    /// room in the mailbox.
    pub(crate) async fn send_event(self: &Arc<Self>, actor: &ActorId, mut job: Job) -> Result<()> {
        for _ in 0..3 {
            let Owner::Local(stub) = self.ensure_owner(actor).await?;
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
    /// activating the actor if needed.
    fn deliver_alarm(self: &Arc<Self>, fire: Fire) {
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let actor = fire.actor.clone();
            if let Err(e) = node.send_event(&actor, Job::Alarm(fire.clone())).await {
                // Not deliverable now (shutting down, class gone, bucket down):
                // the committed alarm stays; the sweep or next activation finds it.
                tracing::warn!(%actor, error = %e, "alarm not delivered");
                if !node.is_shutting_down()
                    && matches!(
                        e,
                        Error::Unavailable { .. } | Error::Bucket(_) | Error::Store(_)
                    )
                {
                    let retry_at = now_ms() + 1000;
                    node.timer.set(retry_at, fire);
                }
            }
        });
    }

    /// Lists the alarm index and arms the timer for alarms of actors that are
    /// not resident here and fall due before the next sweep.
    pub async fn sweep_alarms(self: &Arc<Self>) -> Result<()> {
        let horizon_ms = now_ms()
            + i64::try_from(self.config.alarm_sweep_period.as_millis()).unwrap_or(i64::MAX);
        for meta in self.bucket.list(&self.keys.alarms_prefix()).await? {
            let Ok(actor) = self.keys.parse_alarm_key(&meta.key) else {
                tracing::warn!(key = %meta.key, "alarm index key does not parse; skipped");
                continue;
            };
            if !self.config.serves_class(&actor.class)
                || self.actors.lock().contains_key(&actor)
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

    /// Graceful stop: no new activations, every resident actor finishes its
    /// queued events, closes its sockets (1012) and hibernates.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.shutdown_tx.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = self.actors_changed.notified();
            if self.actors.lock().is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(
                    resident = self.resident_count(),
                    "shutdown grace expired with actors still resident"
                );
                return;
            }
        }
    }
}

impl Stub {
    /// Whether the stub's mailbox has no event waiting.
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.tx.capacity() == self.tx.max_capacity()
    }
}

// Compile-time check, never called: hyper and tokio::spawn need these futures Send.
#[allow(dead_code)]
fn _assert_send(node: Arc<Node>, actor: ActorId) {
    fn is_send<T: Send>(_: T) {}
    let (node2, actor2) = (Arc::clone(&node), actor.clone());
    is_send(async move { node.ensure_owner(&actor).await.map(|_| ()) });
    is_send(async move {
        let request = Request::default();
        node2
            .call(&actor2, &actor2, request, Vec::new())
            .await
            .map(|_| ())
    });
}

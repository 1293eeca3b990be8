//! The simulation's guest: a small built-in actor (no wasmtime) behind the
//! server's guest traits (`wasmkeep_server::actor::guest`). The node runs it
//! exactly as it runs a component: in the actor's mailbox, through its
//! `ActorHost` (SQL in the actor's store, the alarm), with its commit and
//! output gate. It reports to the ground truth what only a guest sees: the
//! instant an event runs (and commits right after, with no await between),
//! so the checkers judge every commit against the bucket's truth.
//!
//! Requests (POST to `/<tenant>/counter/<name>/...`):
//! - `/inc`, body the client's event id: adds one to the counter and
//!   notes the id; answers the new count;
//! - `/alarm`, body a wall-clock time in ms: sets the actor's alarm.
//!
//! The alarm event counts the firing (truth) and clears the alarm.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmkeep_runtime::{ActorHost, EventError, Message, Request, Response, SqlValue};
use wasmkeep_server::actor::guest::{GuestClass, GuestEngine, GuestInstance};
use wasmkeep_server::{Error as ServerError, Node};
use wasmkeep_types::{ActorId, Keys};

use crate::truth::Truth;

/// The bytes deployed as the `counter` class: the engine accepts only these.
pub const COUNTER_CLASS_BYTES: &[u8] = b"wasmkeep-sim built-in counter 1\n";

/// One node process's guest engine.
pub struct SimEngine {
    ctx: Arc<GuestContext>,
}

/// What the built-in actor needs from its node process.
pub struct GuestContext {
    pub node_name: String,
    pub truth: Arc<Mutex<Truth>>,
    pub keys: Keys,
    /// False once the process crashed: a crashed process runs nothing (its
    /// tasks still exist in the runtime; every event of theirs traps).
    pub alive: Arc<AtomicBool>,
    /// The node, set right after it started (its lease names the
    /// incarnation a commit is checked under).
    pub node: Mutex<Weak<Node>>,
}

impl SimEngine {
    pub fn new(ctx: Arc<GuestContext>) -> Self {
        Self { ctx }
    }
}

fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[async_trait::async_trait]
impl GuestEngine for SimEngine {
    async fn load(&self, bytes: Vec<u8>) -> wasmkeep_server::Result<Arc<dyn GuestClass>> {
        if bytes != COUNTER_CLASS_BYTES {
            return Err(ServerError::Component(
                "the simulation runs only its built-in counter".into(),
            ));
        }
        Ok(Arc::new(SimClass {
            digest: digest_of(&bytes),
            ctx: Arc::clone(&self.ctx),
        }))
    }
}

struct SimClass {
    digest: String,
    ctx: Arc<GuestContext>,
}

#[async_trait::async_trait]
impl GuestClass for SimClass {
    fn digest(&self) -> &str {
        &self.digest
    }

    fn was_cached(&self) -> bool {
        true
    }

    async fn instantiate(
        &self,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> wasmkeep_server::Result<Box<dyn GuestInstance>> {
        Ok(Box::new(SimInstance {
            actor: id,
            loaded: true,
            host,
            digest: self.digest.clone(),
            ctx: Arc::clone(&self.ctx),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct SimInstance {
    actor: ActorId,
    /// Unloaded when idle (the node frees an idle instance); every event
    /// loads it again.
    loaded: bool,
    host: Box<dyn ActorHost>,
    digest: String,
    ctx: Arc<GuestContext>,
}

impl SimInstance {
    /// The event runs now and commits right after: the checkers judge it.
    fn committing(&self, what: &str) -> Result<(), EventError> {
        if !self.ctx.alive.load(Ordering::SeqCst) {
            return Err(EventError::Trap("the process crashed".into()));
        }
        let Some(node) = self.ctx.node.lock().upgrade() else {
            return Err(EventError::Trap("the node is not started yet".into()));
        };
        let incarnation = node.peering.lease.incarnation();
        let actor = self.actor.to_string();
        let mut truth = self.ctx.truth.lock();
        truth.log(
            &self.ctx.node_name,
            format!("{actor}: {what} runs (incarnation {incarnation})"),
        );
        truth.check_commit(
            &self.ctx.node_name,
            &incarnation,
            &self.ctx.keys.owner(&self.actor),
            &actor,
            what,
        );
        Ok(())
    }

    /// Adds one to the counter and notes the client's event id (the
    /// checkers look for the ids of writes answered as failed).
    fn increment(&mut self, event_id: i64) -> Result<i64, String> {
        self.host.sql_execute(
            "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
            Vec::new(),
        )?;
        self.host.sql_execute(
            "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY)",
            Vec::new(),
        )?;
        self.host.sql_execute(
            "INSERT INTO events (id) VALUES (?1)",
            vec![SqlValue::Integer(event_id)],
        )?;
        self.host.sql_execute(
            "INSERT INTO counter (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1",
            Vec::new(),
        )?;
        let rows = self
            .host
            .sql_query("SELECT n FROM counter WHERE id = 1", Vec::new())?;
        match rows.rows.first().and_then(|r| r.first()) {
            Some(SqlValue::Integer(n)) => Ok(*n),
            _ => Err("the counter row is missing".into()),
        }
    }
}

fn text(status: u16, body: impl Into<String>) -> Response {
    Response {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.into().into_bytes(),
    }
}

#[async_trait::async_trait]
impl GuestInstance for SimInstance {
    fn host(&mut self) -> &mut dyn ActorHost {
        self.host.as_mut()
    }

    fn set_component(&mut self, class: Arc<dyn GuestClass>) {
        class.digest().clone_into(&mut self.digest);
    }

    fn unload(&mut self) {
        self.loaded = false;
    }

    fn is_loaded(&self) -> bool {
        self.loaded
    }

    fn component_digest(&self) -> &str {
        &self.digest
    }

    async fn handle(&mut self, request: Request) -> Result<Response, EventError> {
        self.loaded = true;
        let body = String::from_utf8_lossy(&request.body).trim().to_owned();
        match request.path.as_str() {
            "/inc" => {
                let Ok(event_id) = body.parse::<i64>() else {
                    return Ok(text(400, "the body must be an event id"));
                };
                let n = self
                    .increment(event_id)
                    .map_err(|e| EventError::Trap(format!("increment: {e}")))?;
                self.committing(&format!("event {body}"))?;
                self.ctx
                    .truth
                    .lock()
                    .increment_committed(&self.actor.to_string(), event_id.unsigned_abs());
                Ok(text(200, n.to_string()))
            }
            "/alarm" => {
                let Ok(at_ms) = body.parse::<i64>() else {
                    return Ok(text(400, "the body must be a time in ms"));
                };
                self.host.alarm_set(at_ms);
                self.committing(&format!("set alarm {at_ms}"))?;
                self.ctx
                    .truth
                    .lock()
                    .alarm_set_attempted(&self.actor.to_string(), at_ms);
                Ok(text(200, "alarm set"))
            }
            other => Ok(text(404, format!("no route {other}"))),
        }
    }

    async fn alarm(
        &mut self,
        scheduled_ms: i64,
        _retry_count: u32,
    ) -> Result<Result<(), String>, EventError> {
        self.loaded = true;
        self.committing(&format!("alarm {scheduled_ms}"))?;
        self.ctx
            .truth
            .lock()
            .alarm_fired(&self.actor.to_string(), scheduled_ms);
        Ok(Ok(()))
    }

    async fn socket_message(&mut self, _id: u64, _message: Message) -> Result<(), EventError> {
        Ok(())
    }

    async fn socket_close(
        &mut self,
        _id: u64,
        _code: u16,
        _reason: String,
    ) -> Result<(), EventError> {
        Ok(())
    }
}

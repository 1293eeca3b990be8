//! Direct operations on one actor of this node, for a test harness
//! (`wasmkeep-test` in its process, `dev --test-routes` over HTTP; ADR
//! 0073): run its alarm now, run the alarms a moved clock made due,
//! hibernate it, run an operator's statement in it, read its database,
//! deploy a class and load it at once. Each goes through the actor's
//! mailbox as the node's own parts do (the timer, the LRU eviction,
//! `actor sql --write`) or reads the bucket as `actor sql` does: nothing
//! here changes what an event does, only when it is asked for.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use wasmkeep_types::sql::SqlRows;
use wasmkeep_types::{ActorId, ClassName};

use crate::actor::classes;
use crate::actor::orders::Job;
use crate::node::Node;
use crate::{Error, Result};

/// What running an actor's alarm now did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlarmRun {
    /// The handler ran and its writes are durable.
    Ran,
    /// No alarm is set.
    NotSet,
    /// The alarm is set later than asked for.
    NotDue,
}

/// How long a hibernation waits for the actor to leave before it asks
/// again (a request queued behind the first ask keeps it resident).
const HIBERNATE_ASK_PERIOD: Duration = Duration::from_secs(1);

/// How many times a hibernation asks before it gives up.
const HIBERNATE_ASKS_MAX: u32 = 30;

impl Node {
    /// Runs the actor's committed alarm now, whatever its time, activating
    /// the actor if needed. A handler that fails is an error, and its
    /// retry is scheduled as for any delivery.
    pub async fn run_alarm_now(self: &Arc<Self>, actor: &ActorId) -> Result<AlarmRun> {
        self.alarm_job(actor, None).await
    }

    /// Runs every alarm due by the node's clock now: the resident actors'
    /// (the timer's) and those of actors nobody holds (the alarm index, as
    /// the sweep reads it). Each actor's alarm runs in its mailbox; the
    /// timer's own delivery of the same alarm, if it comes too, finds it
    /// spent. Returns the actors whose alarm ran.
    pub async fn run_due_alarms(self: &Arc<Self>) -> Result<Vec<ActorId>> {
        self.sweep_alarms().await?;
        let now_ms = self.clock.wall_ms();
        let mut ran = Vec::new();
        for actor in self.timer.due_by(now_ms) {
            if self.alarm_job(&actor, Some(now_ms)).await? == AlarmRun::Ran {
                ran.push(actor);
            }
        }
        Ok(ran)
    }

    async fn alarm_job(
        self: &Arc<Self>,
        actor: &ActorId,
        due_by_ms: Option<i64>,
    ) -> Result<AlarmRun> {
        let (reply, answer) = oneshot::channel();
        self.send_event(actor, Job::AlarmNow { due_by_ms, reply })
            .await?;
        let response = answer.await.map_err(|_| {
            Error::unavailable(format!("actor {actor} left before its alarm ran"))
        })??;
        match response.body.as_slice() {
            b"ran" => Ok(AlarmRun::Ran),
            b"none" => Ok(AlarmRun::NotSet),
            b"not-due" => Ok(AlarmRun::NotDue),
            other => Err(Error::Runtime(format!(
                "an alarm run answered {:?}",
                String::from_utf8_lossy(other)
            ))),
        }
    }

    /// Hibernates the actor as an idle one is (its instance and database
    /// closed, its ownership record released, its stub dropped) and
    /// returns once it left; its next event activates it again from the
    /// bucket. `false`: it was not resident. An open socket keeps an
    /// actor resident: refused ([`Error::Conflict`]).
    pub async fn hibernate(&self, actor: &ActorId) -> Result<bool> {
        let mut asks = 0;
        loop {
            let changed = self.residents.changed().notified();
            tokio::pin!(changed);
            // Registered before the look, so a departure in between wakes it.
            changed.as_mut().enable();
            if !self.residents.has_stub(actor) {
                return Ok(asks > 0);
            }
            if let Some(stub) = self.residents.live_stub(actor) {
                if stub.open_sockets() > 0 {
                    return Err(Error::Conflict(format!(
                        "actor {actor} has an open socket: it stays resident until it closes"
                    )));
                }
                if asks == HIBERNATE_ASKS_MAX {
                    return Err(Error::unavailable(format!(
                        "actor {actor} stayed busy: not hibernated"
                    )));
                }
                asks += 1;
                // A closed mailbox is leaving already.
                let _ = stub.tx.send(Box::new(Job::Hibernate)).await;
            }
            // Woken by any departure; asked again when a queued event kept
            // this actor (the mailbox leaves only when idle).
            let _ = tokio::time::timeout(HIBERNATE_ASK_PERIOD, changed).await;
        }
    }

    /// Runs an operator's statement as one event of the actor, activating
    /// it here if needed (`wasmkeep actor sql --write`, ADR 0065 amended):
    /// the statement's rows and the number of rows it changed, as JSON
    /// (`{"columns": [...], "rows": [[...]], "changes": N}`), once durable.
    pub async fn operator_sql(
        self: &Arc<Self>,
        actor: &ActorId,
        statement: &str,
    ) -> Result<serde_json::Value> {
        if let Some(why) = crate::peering::sql::refused(statement) {
            return Err(Error::BadRequest(why));
        }
        let (reply, answer) = oneshot::channel();
        let job = Job::Sql {
            // Each statement asked here is a new request (the id keys its
            // recorded result).
            request: format!("direct-{:016x}", rand::random::<u64>()),
            statement: statement.to_owned(),
            reply,
            started: tokio::time::Instant::now(),
        };
        self.send_event(actor, job).await?;
        let response = answer
            .await
            .map_err(|_| Error::unavailable(format!("actor {actor} left before it answered")))??;
        serde_json::from_slice(&response.body)
            .map_err(|e| Error::Runtime(format!("an operator's statement answered no JSON: {e}")))
    }

    /// A read-only statement on the actor's database as the bucket holds
    /// it (every acknowledged write), as `wasmkeep actor sql` runs it:
    /// nothing of the actor runs and nothing is written. A statement that
    /// writes, or fails, is [`Error::BadRequest`] with SQLite's message; an
    /// actor with nothing in the bucket yet is [`Error::NotFound`].
    pub async fn read_sql(&self, actor: &ActorId, statement: &str) -> Result<SqlRows> {
        let store =
            crate::ops::survey::open_reader(Arc::clone(&self.bucket), self.keys.clone(), actor)
                .await?;
        let Some(mut store) = store else {
            return Err(Error::NotFound(format!(
                "actor {actor} has nothing in the bucket yet"
            )));
        };
        let rows = store
            .query(statement, &[])
            .map_err(|e| Error::BadRequest(format!("actor {actor}: {}", e.message)));
        store.rollback_event();
        rows
    }

    /// Deploys a component as `class` (validated and compiled as `wasmkeep
    /// deploy` does, keeping the class's limits if it was deployed before)
    /// and loads it here now, not at the next heartbeat; returns its
    /// digest. Actors switch at their next event.
    pub async fn deploy_now(&self, class: &ClassName, component: Vec<u8>) -> Result<String> {
        let limits = classes::current(&*self.bucket, &self.keys, class)
            .await?
            .map(|current| current.limits)
            .unwrap_or_default();
        let digest = classes::deploy_with(
            &*self.bucket,
            &self.keys,
            class,
            component,
            limits,
            &**self.classes.engine(),
        )
        .await?;
        self.poll_classes().await?;
        Ok(digest)
    }
}

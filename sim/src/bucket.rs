//! [`SimBucket`]: one node's view of the shared bucket. It wraps that node's
//! [`MemoryBucket`] client (request latency, unavailability, lost replies and
//! partitions are the client's [`wasmkeep_bucket::Faults`]) and adds what the
//! memory bucket lacks: a seeded *reply* latency after the write applied, so
//! a request's start, its effect and its reply are three different instants,
//! as on a real network. It also reports to the ground truth the instant each
//! heartbeat, ownership record and log record really applied.
//!
//! It is an [`Around`] (ADR 0057): the node's hinted requests (a snapshot
//! put unhurried, a record put alone, the bulk delete of compaction and of
//! `actor delete`, a listing of keys) reach it as one request each, as
//! they reach the folder or S3 in production, instead of as the core
//! requests they fall back to.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wasmkeep_bucket::{
    Answer, Around, Bucket, Error, Etag, MemoryBucket, Object, ObjectMeta, Request, Result,
};
use wasmkeep_cluster::OwnershipRecord;
use wasmkeep_types::Keys;
use wasmkeep_types::heartbeat::Heartbeat;

use crate::truth::Truth;

pub struct SimBucket {
    inner: MemoryBucket,
    /// A fault-free client of the same objects: after a lost reply it tells
    /// the ground truth whether the write really applied (the memory bucket
    /// reports a lost reply even for a conditional write that did not).
    oracle: MemoryBucket,
    node: String,
    keys: Keys,
    truth: Arc<Mutex<Truth>>,
    rng: Mutex<StdRng>,
    reply_latency_max: Mutex<Duration>,
    /// A paused process (a long GC pause): no request leaves it until then.
    stalled_until: Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for SimBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBucket")
            .field("node", &self.node)
            .field("inner", &self.inner)
            .finish()
    }
}

impl SimBucket {
    pub fn new(
        inner: MemoryBucket,
        node: &str,
        keys: Keys,
        truth: Arc<Mutex<Truth>>,
        seed: u64,
    ) -> Self {
        Self {
            oracle: inner.new_client(0),
            inner,
            node: node.to_owned(),
            keys,
            truth,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            reply_latency_max: Mutex::new(Duration::ZERO),
            stalled_until: Mutex::new(None),
        }
    }

    pub fn faults(&self) -> &wasmkeep_bucket::Faults {
        self.inner.faults()
    }

    /// Every reply waits a uniform random part of `max` after the operation.
    pub fn set_reply_latency_max(&self, max: Duration) {
        *self.reply_latency_max.lock() = max;
    }

    /// Removes every fault of this client, reply latency and pause included.
    pub fn heal(&self) {
        self.inner.faults().clear();
        self.set_reply_latency_max(Duration::ZERO);
        *self.stalled_until.lock() = None;
    }

    /// The process stalls until `until`: its requests wait for then.
    pub fn stall_until(&self, until: tokio::time::Instant) {
        *self.stalled_until.lock() = Some(until);
    }

    async fn before(&self) {
        let until = *self.stalled_until.lock();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    async fn reply<T>(&self, result: Result<T>) -> Result<T> {
        let max = *self.reply_latency_max.lock();
        if !max.is_zero() {
            let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
            let delay = Duration::from_nanos(self.rng.lock().random_range(0..=nanos));
            tokio::time::sleep(delay).await;
        }
        result
    }

    /// Tells the ground truth about a write that applied now.
    fn applied(&self, key: &str, body: Option<&Bytes>, created: bool) {
        let mut truth = self.truth.lock();
        if key.starts_with(&self.keys.nodes_prefix()) {
            if let Some(hb) = body
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|t| Heartbeat::parse(t).ok())
            {
                truth.heartbeat_applied(hb.node.as_str(), &hb.incarnation);
            }
        } else if key.starts_with(&self.keys.owners_prefix()) {
            let record = body
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(OwnershipRecord::parse)
                .map(|r| (r.node.to_string(), r.incarnation, r.held));
            truth.owner_applied(key, record);
        } else if created && key.contains("/log/") {
            truth.log_record_applied(key, &self.node);
        } else if body.is_some() && key.contains("/snap/") {
            truth.snapshot_applied(key);
        } else if body.is_none()
            && key.starts_with(&self.keys.moves_prefix())
            && let Ok((actor, target)) = self.keys.parse_move_key(key)
        {
            truth.move_key_deleted(
                &self.node,
                &self.keys.owner(&actor),
                &actor.to_string(),
                target.as_str(),
            );
        } else if body.is_none()
            && key.starts_with(&self.keys.deletes_prefix())
            && let Ok(actor) = self.keys.parse_delete_key(key)
        {
            truth.delete_key_removed(&self.node, &actor.to_string(), key);
        }
    }
}

impl SimBucket {
    /// Traces what an ownership-record or heartbeat read returned (the
    /// instant it was served), so a failure shows what each node saw.
    fn note_read(&self, key: &str, result: Result<&Object, &Error>) {
        let what = if key.starts_with(&self.keys.owners_prefix()) {
            match result {
                Ok(o) => std::str::from_utf8(&o.bytes)
                    .ok()
                    .and_then(OwnershipRecord::parse)
                    .map(|r| {
                        format!(
                            "read owner {key}: {} {} {} ({})",
                            r.node,
                            r.incarnation,
                            if r.held { "held" } else { "released" },
                            o.meta.etag.0
                        )
                    }),
                Err(e) => Some(format!("read owner {key}: {}", short(e))),
            }
        } else if key.starts_with(&self.keys.nodes_prefix()) {
            match result {
                Ok(o) => std::str::from_utf8(&o.bytes)
                    .ok()
                    .and_then(|t| Heartbeat::parse(t).ok())
                    .map(|h| {
                        format!(
                            "read heartbeat {}: {} gen {} ({})",
                            h.node, h.incarnation, h.generation, o.meta.etag.0
                        )
                    }),
                Err(e) => Some(format!("read heartbeat {key}: {}", short(e))),
            }
        } else {
            None
        };
        if let Some(what) = what {
            self.truth.lock().log(&self.node, what);
        }
    }

    fn note_owner_write(
        &self,
        key: &str,
        bytes: &Bytes,
        etag: Option<&Etag>,
        result: Result<&ObjectMeta, &Error>,
    ) {
        if key.starts_with(&self.keys.nodes_prefix()) {
            let heartbeat = std::str::from_utf8(bytes)
                .ok()
                .and_then(|t| Heartbeat::parse(t).ok())
                .map(|h| format!("{} gen {} drain {:?}", h.incarnation, h.generation, h.drain))
                .unwrap_or_default();
            let outcome = match result {
                Ok(m) => format!("ok ({})", m.etag.0),
                Err(e) => short(e),
            };
            self.truth.lock().log(
                &self.node,
                format!("write heartbeat {heartbeat}: {outcome}"),
            );
            return;
        }
        if !key.starts_with(&self.keys.owners_prefix()) {
            return;
        }
        let record = std::str::from_utf8(bytes)
            .ok()
            .and_then(OwnershipRecord::parse)
            .map(|r| format!("{} {}", r.node, r.incarnation))
            .unwrap_or_default();
        let outcome = match result {
            Ok(m) => format!("ok ({})", m.etag.0),
            Err(e) => short(e),
        };
        let condition = etag.map_or("absent".to_owned(), |e| format!("match {}", e.0));
        self.truth.lock().log(
            &self.node,
            format!("write owner {key} [{condition}] {record}: {outcome}"),
        );
    }
}

fn short(e: &Error) -> String {
    match e {
        Error::NotFound { .. } => "not found".into(),
        Error::Conflict { .. } => "conflict".into(),
        Error::Unavailable { .. } => "unavailable".into(),
        Error::OutcomeUnknown { .. } => "applied, reply lost".into(),
        other => other.to_string(),
    }
}

impl SimBucket {
    /// A put of `bytes` to `key` (`created`: if absent) answered `result`:
    /// traced, and told to the ground truth if it applied.
    async fn wrote<T: Answer>(
        &self,
        key: &str,
        bytes: &Bytes,
        etag: Option<&Etag>,
        created: bool,
        result: &Result<T>,
    ) {
        if let Some(written) = seen(result, Answer::meta) {
            self.note_owner_write(key, bytes, etag, written);
        }
        if self.did_apply(key, Some(bytes), result).await {
            self.applied(key, Some(bytes), created);
        }
    }

    /// Whether a write of `bytes` (`None`: a delete) to `key` that returned
    /// `result` applied. The oracle has no latency, so asking it never
    /// yields to another task.
    async fn did_apply<T>(&self, key: &str, bytes: Option<&Bytes>, result: &Result<T>) -> bool {
        match result {
            Ok(_) => true,
            Err(Error::OutcomeUnknown { .. }) => match (self.oracle.get(key).await, bytes) {
                (Ok(object), Some(bytes)) => object.bytes == *bytes,
                (Err(Error::NotFound { .. }), None) => true,
                _ => false,
            },
            Err(_) => false,
        }
    }

    /// Whether a bulk delete that returned `result` removed `key`: on any
    /// error some of its keys may be gone and others not, so the oracle is
    /// asked for each.
    async fn did_delete_one_of_many<T>(&self, key: &str, result: &Result<T>) -> bool {
        match result {
            Ok(_) => true,
            Err(_) => matches!(self.oracle.get(key).await, Err(Error::NotFound { .. })),
        }
    }
}

/// Every request, hinted ones included (ADR 0057): the pause first, then
/// the request on the memory bucket, what the ground truth must learn of
/// it, and the reply's latency. A bulk delete is one request with one
/// reply, as it is to S3 or the folder; each of its keys is still one
/// delete on the memory bucket (which has no bulk delete), under its
/// faults.
impl Around for SimBucket {
    fn inner(&self) -> &dyn Bucket {
        &self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request<'_>,
        call: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        self.before().await;
        let result = call.await;
        match request {
            Request::Get { key } => {
                if let Some(read) = seen(&result, Answer::object) {
                    self.note_read(key, read);
                }
            }
            Request::Head { .. } | Request::ListPage { .. } | Request::ListKeys { .. } => {}
            Request::PutIfAbsent { key, bytes }
            | Request::PutIfAbsentUnhurried { key, bytes }
            | Request::PutIfAbsentAlone { key, bytes } => {
                self.wrote(key, bytes, None, true, &result).await;
            }
            Request::PutIfMatch { key, bytes, etag } => {
                self.wrote(key, bytes, Some(etag), false, &result).await;
            }
            Request::Put { key, bytes } => self.wrote(key, bytes, None, false, &result).await,
            Request::Delete { key } | Request::DeleteIfMatch { key, .. } => {
                if self.did_apply(key, None, &result).await {
                    self.applied(key, None, false);
                }
            }
            Request::DeleteAllNotDurable { keys } => {
                for key in keys {
                    if self.did_delete_one_of_many(key, &result).await {
                        self.applied(key, None, false);
                    }
                }
            }
        }
        self.reply(result).await
    }
}

/// What a wrapper can see of an answer: `look`'s part of a success (none
/// if it has no such part), or the error.
fn seen<'a, T, U: ?Sized>(
    result: &'a Result<T>,
    look: impl Fn(&'a T) -> Option<&'a U>,
) -> Option<Result<&'a U, &'a Error>> {
    match result {
        Ok(answer) => look(answer).map(Ok),
        Err(e) => Some(Err(e)),
    }
}

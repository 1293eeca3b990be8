//! The in-process backend (`memory://`): a sorted map behind a mutex, plus
//! [`Faults`] so tests and the simulation can make the bucket slow, failing,
//! partitioned, or lose replies of writes that did apply.
//!
//! Every operation takes the map lock once, so conditional writes are atomic.
//! Etags are `m<counter>` from one counter per storage, so every write gives a
//! new etag even when the bytes are the same (stricter than S3; callers must
//! not rely on it). Latency is a `tokio::time::sleep`, so it follows paused or
//! simulated tokio time; randomness comes from one seeded [`StdRng`] per
//! [`Faults`], so a seed reproduces a run as long as the calls come in the
//! same order.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::key::{validate_key, validate_prefix};
use crate::{Bucket, Error, Etag, LIST_PAGE_OBJECTS_MAX, ListPage, Object, ObjectMeta, Result};

/// Most one-shot faults that may wait in a [`Faults`] queue.
pub const FAULT_QUEUE_LEN_MAX: usize = 10_000;

/// One injected failure, consumed by the next operation it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next operation (read or write) fails with [`Error::Unavailable`]
    /// and changes nothing.
    Unavailable,
    /// The next write applies, but its caller gets [`Error::OutcomeUnknown`]
    /// (the reply was lost). Reads leave this fault queued.
    ReplyLost,
}

struct FaultState {
    rng: StdRng,
    latency: Duration,
    latency_jitter: Duration,
    unavailable_probability: f64,
    reply_lost_probability: f64,
    queue: VecDeque<Fault>,
    partitioned: bool,
    injected_count: u64,
}

/// Fault injection for one [`MemoryBucket`] client. All setters take effect
/// for operations that start after the call.
pub struct Faults {
    state: Mutex<FaultState>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Faults")
            .field("latency", &s.latency)
            .field("latency_jitter", &s.latency_jitter)
            .field("unavailable_probability", &s.unavailable_probability)
            .field("reply_lost_probability", &s.reply_lost_probability)
            .field("queued", &s.queue.len())
            .field("partitioned", &s.partitioned)
            .finish()
    }
}

/// What [`Faults::before`] decided for one operation.
enum Verdict {
    Proceed,
    ProceedReplyLost,
}

impl Faults {
    /// No faults, no latency; RNG seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Faults {
            state: Mutex::new(FaultState {
                rng: StdRng::seed_from_u64(seed),
                latency: Duration::ZERO,
                latency_jitter: Duration::ZERO,
                unavailable_probability: 0.0,
                reply_lost_probability: 0.0,
                queue: VecDeque::new(),
                partitioned: false,
                injected_count: 0,
            }),
        }
    }

    /// Re-seeds the RNG (for a simulation that picks its seed after setup).
    pub fn set_seed(&self, seed: u64) {
        self.state.lock().rng = StdRng::seed_from_u64(seed);
    }

    /// Every operation sleeps `latency` plus a uniform random part of
    /// `jitter` (tokio time) before it runs.
    pub fn set_latency(&self, latency: Duration, jitter: Duration) {
        let mut s = self.state.lock();
        s.latency = latency;
        s.latency_jitter = jitter;
    }

    /// Each operation fails with `Unavailable` (before applying) with this
    /// probability, clamped to `0.0..=1.0`.
    pub fn set_unavailable_probability(&self, probability: f64) {
        self.state.lock().unavailable_probability = probability_clamped(probability);
    }

    /// Each write that was not failed otherwise applies but reports
    /// `OutcomeUnknown` with this probability, clamped to `0.0..=1.0`.
    pub fn set_reply_lost_probability(&self, probability: f64) {
        self.state.lock().reply_lost_probability = probability_clamped(probability);
    }

    /// Queues a one-shot fault. Returns false (and queues nothing) when
    /// [`FAULT_QUEUE_LEN_MAX`] faults are already waiting.
    pub fn push(&self, fault: Fault) -> bool {
        let mut s = self.state.lock();
        if s.queue.len() >= FAULT_QUEUE_LEN_MAX {
            return false;
        }
        s.queue.push_back(fault);
        true
    }

    /// While set, every operation fails with `Unavailable` and changes
    /// nothing (the client is cut off from the bucket).
    pub fn set_partitioned(&self, partitioned: bool) {
        self.state.lock().partitioned = partitioned;
    }

    pub fn is_partitioned(&self) -> bool {
        self.state.lock().partitioned
    }

    /// Removes every fault and the latency (the RNG keeps its position).
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.latency = Duration::ZERO;
        s.latency_jitter = Duration::ZERO;
        s.unavailable_probability = 0.0;
        s.reply_lost_probability = 0.0;
        s.queue.clear();
        s.partitioned = false;
    }

    /// How many faults (errors and lost replies) have been injected so far.
    pub fn injected_count(&self) -> u64 {
        self.state.lock().injected_count
    }

    /// Runs before every operation: waits the latency, then decides whether
    /// the operation fails, proceeds, or proceeds with its reply lost.
    async fn before(&self, key: &str, is_write: bool) -> Result<Verdict> {
        let delay = {
            let mut s = self.state.lock();
            let jitter = if s.latency_jitter.is_zero() {
                Duration::ZERO
            } else {
                let max_nanos = u64::try_from(s.latency_jitter.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(s.rng.random_range(0..=max_nanos))
            };
            s.latency.saturating_add(jitter)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut s = self.state.lock();
        let unavailable = |s: &mut FaultState, reason: &str| {
            s.injected_count += 1;
            Err(Error::Unavailable {
                key: key.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if s.partitioned {
            return unavailable(&mut s, "injected: partitioned from the bucket");
        }
        match s.queue.front() {
            Some(Fault::Unavailable) => {
                s.queue.pop_front();
                return unavailable(&mut s, "injected: one-shot unavailable");
            }
            Some(Fault::ReplyLost) if is_write => {
                s.queue.pop_front();
                s.injected_count += 1;
                return Ok(Verdict::ProceedReplyLost);
            }
            _ => {}
        }
        let p_unavailable = s.unavailable_probability;
        if p_unavailable > 0.0 && s.rng.random_bool(p_unavailable) {
            return unavailable(&mut s, "injected: random unavailable");
        }
        let p_lost = s.reply_lost_probability;
        if is_write && p_lost > 0.0 && s.rng.random_bool(p_lost) {
            s.injected_count += 1;
            return Ok(Verdict::ProceedReplyLost);
        }
        Ok(Verdict::Proceed)
    }
}

/// `p` limited to `0.0..=1.0`; NaN counts as 0 (never inject).
fn probability_clamped(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

#[derive(Clone)]
struct Stored {
    bytes: Bytes,
    etag: Etag,
    last_modified: SystemTime,
}

impl Stored {
    fn meta(&self, key: &str) -> ObjectMeta {
        ObjectMeta {
            key: key.to_owned(),
            etag: self.etag.clone(),
            last_modified: self.last_modified,
            size: self.bytes.len() as u64,
        }
    }
}

#[derive(Default)]
struct Storage {
    objects: BTreeMap<String, Stored>,
    etag_counter: u64,
}

impl Storage {
    fn insert(&mut self, key: &str, bytes: Bytes) -> ObjectMeta {
        self.etag_counter += 1;
        let stored = Stored {
            // A copy of exactly its length: the caller's buffer may be a
            // slice of a much larger allocation (a record encoded into a
            // page-sized buffer), which would otherwise stay alive with it.
            bytes: Bytes::copy_from_slice(&bytes),
            etag: Etag(format!("m{}", self.etag_counter)),
            last_modified: SystemTime::now(),
        };
        let meta = stored.meta(key);
        self.objects.insert(key.to_owned(), stored);
        meta
    }
}

/// The `memory://` bucket. Cloning is not offered on purpose: use
/// [`MemoryBucket::new_client`] to get another client of the same storage
/// with its own [`Faults`] (one per simulated node).
pub struct MemoryBucket {
    storage: Arc<Mutex<Storage>>,
    faults: Faults,
}

impl fmt::Debug for MemoryBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBucket")
            .field("objects", &self.storage.lock().objects.len())
            .field("faults", &self.faults)
            .finish()
    }
}

impl Default for MemoryBucket {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBucket {
    /// An empty bucket with no faults (fault RNG seeded with 0).
    pub fn new() -> Self {
        Self::with_seed(0)
    }

    /// An empty bucket whose fault RNG is seeded with `seed`.
    pub fn with_seed(seed: u64) -> Self {
        MemoryBucket {
            storage: Arc::default(),
            faults: Faults::new(seed),
        }
    }

    /// Another client of the same objects, with its own faults seeded with
    /// `seed` (partitioning it leaves the other clients connected).
    pub fn new_client(&self, seed: u64) -> Self {
        MemoryBucket {
            storage: Arc::clone(&self.storage),
            faults: Faults::new(seed),
        }
    }

    /// This client's fault injection.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Every key currently stored (for checkers), in order. Ignores faults.
    pub fn keys(&self) -> Vec<String> {
        self.storage.lock().objects.keys().cloned().collect()
    }

    fn finish_write<T>(key: &str, verdict: Verdict, result: Result<T>) -> Result<T> {
        match verdict {
            Verdict::Proceed => result,
            Verdict::ProceedReplyLost => Err(Error::OutcomeUnknown {
                key: key.to_owned(),
                reason: "injected: the write was applied but its reply was lost".to_owned(),
            }),
        }
    }
}

fn not_found(key: &str) -> Error {
    Error::NotFound {
        key: key.to_owned(),
    }
}

fn conflict(key: &str) -> Error {
    Error::Conflict {
        key: key.to_owned(),
    }
}

#[async_trait]
impl Bucket for MemoryBucket {
    async fn get(&self, key: &str) -> Result<Object> {
        validate_key(key)?;
        self.faults.before(key, false).await?;
        let storage = self.storage.lock();
        let stored = storage.objects.get(key).ok_or_else(|| not_found(key))?;
        Ok(Object {
            bytes: stored.bytes.clone(),
            meta: stored.meta(key),
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        self.faults.before(key, false).await?;
        let storage = self.storage.lock();
        storage
            .objects
            .get(key)
            .map(|s| s.meta(key))
            .ok_or_else(|| not_found(key))
    }

    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        validate_key(key)?;
        let verdict = self.faults.before(key, true).await?;
        let result = {
            let mut storage = self.storage.lock();
            if storage.objects.contains_key(key) {
                Err(conflict(key))
            } else {
                Ok(storage.insert(key, bytes))
            }
        };
        Self::finish_write(key, verdict, result)
    }

    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta> {
        validate_key(key)?;
        let verdict = self.faults.before(key, true).await?;
        let result = {
            let mut storage = self.storage.lock();
            match storage.objects.get(key) {
                None => Err(not_found(key)),
                Some(stored) if stored.etag != *etag => Err(conflict(key)),
                Some(_) => Ok(storage.insert(key, bytes)),
            }
        };
        Self::finish_write(key, verdict, result)
    }

    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        validate_key(key)?;
        let verdict = self.faults.before(key, true).await?;
        let result = Ok(self.storage.lock().insert(key, bytes));
        Self::finish_write(key, verdict, result)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let verdict = self.faults.before(key, true).await?;
        self.storage.lock().objects.remove(key);
        Self::finish_write(key, verdict, Ok(()))
    }

    async fn delete_if_match(&self, key: &str, etag: &Etag) -> Result<()> {
        validate_key(key)?;
        let verdict = self.faults.before(key, true).await?;
        let result = {
            let mut storage = self.storage.lock();
            match storage.objects.get(key) {
                None => Err(not_found(key)),
                Some(stored) if stored.etag != *etag => Err(conflict(key)),
                Some(_) => {
                    storage.objects.remove(key);
                    Ok(())
                }
            }
        };
        Self::finish_write(key, verdict, result)
    }

    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage> {
        validate_prefix(prefix)?;
        self.faults.before(prefix, false).await?;
        let storage = self.storage.lock();
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_owned()),
            _ => Bound::Included(prefix.to_owned()),
        };
        let mut objects = Vec::new();
        let mut more = false;
        for (key, stored) in storage.objects.range((lower, Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            if objects.len() == LIST_PAGE_OBJECTS_MAX {
                more = true;
                break;
            }
            objects.push(stored.meta(key));
        }
        let next = if more {
            objects.last().map(|m| m.key.clone())
        } else {
            None
        };
        Ok(ListPage { objects, next })
    }
}

//! Test helpers: a [`Probe`] around `MemoryBucket` that counts requests and
//! can hold log-record writes until released (to make group commit
//! observable without sleeping).

#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::{Semaphore, watch};
use wasmkeep_bucket::{Answer, Around, Bucket, MemoryBucket, Request, Result};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

#[derive(Debug, Default)]
pub struct Counts {
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    /// Calls of `delete_all_not_durable` (their keys count in `deletes`).
    pub delete_calls: AtomicU64,
}

/// Counts every request and can hold log-record puts.
#[derive(Debug)]
pub struct Probe {
    pub inner: MemoryBucket,
    pub counts: Counts,
    hold: Mutex<Option<Arc<Semaphore>>>,
    /// How many log puts have reached the bucket (held or not).
    log_puts_entered: watch::Sender<u64>,
    /// Every snapshot put: its key, and whether it was unhurried.
    snapshot_puts: Mutex<Vec<(String, bool)>>,
    /// Every log record put: its key, and whether it was a lone writer's.
    log_puts: Mutex<Vec<(String, bool)>>,
}

impl Probe {
    pub fn new() -> Arc<Self> {
        Self::over(MemoryBucket::new())
    }

    pub fn over(inner: MemoryBucket) -> Arc<Self> {
        Arc::new(Self {
            inner,
            counts: Counts::default(),
            hold: Mutex::new(None),
            log_puts_entered: watch::channel(0).0,
            snapshot_puts: Mutex::new(Vec::new()),
            log_puts: Mutex::new(Vec::new()),
        })
    }

    /// Another client of the same objects (its own faults and counters).
    pub fn client(&self, seed: u64) -> Arc<Self> {
        Self::over(self.inner.new_client(seed))
    }

    pub fn puts(&self) -> u64 {
        self.counts.puts.load(Ordering::SeqCst)
    }

    pub fn gets(&self) -> u64 {
        self.counts.gets.load(Ordering::SeqCst)
    }

    pub fn lists(&self) -> u64 {
        self.counts.lists.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> u64 {
        self.puts()
            + self.gets()
            + self.counts.lists.load(Ordering::SeqCst)
            + self.counts.deletes.load(Ordering::SeqCst)
    }

    /// From now on, log-record puts wait until [`Probe::release`].
    pub fn hold_log_puts(&self) {
        *self.hold.lock() = Some(Arc::new(Semaphore::new(0)));
    }

    pub fn release(&self) {
        if let Some(s) = self.hold.lock().take() {
            s.add_permits(Semaphore::MAX_PERMITS / 2);
        }
    }

    /// Waits until `n` log puts have reached the bucket.
    pub async fn log_puts_entered(&self, n: u64) {
        let mut rx = self.log_puts_entered.subscribe();
        rx.wait_for(|v| *v >= n)
            .await
            .expect("sender lives in self");
    }

    /// Every snapshot put so far: its key, and whether it was unhurried.
    pub fn snapshot_puts(&self) -> Vec<(String, bool)> {
        self.snapshot_puts.lock().clone()
    }

    /// Every log record put so far: its key, and whether it was a lone
    /// writer's ([`wasmkeep_bucket::hinted::put_if_absent_alone`]).
    pub fn log_puts(&self) -> Vec<(String, bool)> {
        self.log_puts.lock().clone()
    }

    fn note_put(&self, key: &str, unhurried: bool) {
        self.counts.puts.fetch_add(1, Ordering::SeqCst);
        if key.contains("/snap/") {
            self.snapshot_puts.lock().push((key.to_owned(), unhurried));
        }
    }

    /// Counts a put in a hurry and, for a log record, notes it and waits
    /// while records are held.
    async fn before_hurried_put(&self, key: &str, alone: bool) {
        self.note_put(key, false);
        if key.contains("/log/") {
            self.log_puts.lock().push((key.to_owned(), alone));
            self.log_puts_entered.send_modify(|v| *v += 1);
            let hold = self.hold.lock().clone();
            if let Some(sem) = hold {
                let _permit = sem.acquire().await.expect("never closed");
            }
        }
    }

    pub fn keys_under(&self, prefix: &str) -> Vec<String> {
        self.inner
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(prefix))
            .collect()
    }
}

impl Around for Probe {
    fn inner(&self) -> &dyn Bucket {
        &self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request<'_>,
        call: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let count = |counter: &AtomicU64, n: usize| {
            counter.fetch_add(n as u64, Ordering::SeqCst);
        };
        match request {
            Request::Get { .. } | Request::Head { .. } => count(&self.counts.gets, 1),
            Request::PutIfAbsent { key, .. } => self.before_hurried_put(key, false).await,
            Request::PutIfAbsentAlone { key, .. } => self.before_hurried_put(key, true).await,
            Request::PutIfAbsentUnhurried { key, .. } => self.note_put(key, true),
            Request::PutIfMatch { .. } | Request::Put { .. } => count(&self.counts.puts, 1),
            Request::Delete { .. } | Request::DeleteIfMatch { .. } => {
                count(&self.counts.deletes, 1);
            }
            Request::DeleteAllNotDurable { keys } => {
                count(&self.counts.delete_calls, 1);
                count(&self.counts.deletes, keys.len());
            }
            // A listing of keys is one list request, as one page is.
            Request::ListPage { .. } | Request::ListKeys { .. } => count(&self.counts.lists, 1),
        }
        call.await
    }
}

pub fn keys() -> Keys {
    Keys::new(&AppName::new("test").expect("valid app"))
}

pub fn actor(name: &str) -> ActorId {
    ActorId::parse(&format!("acme/counter/{name}")).expect("valid actor id")
}

pub fn writer(node: &str) -> WriterId {
    WriterId {
        node: node.into(),
        incarnation: format!("{node}-inc"),
    }
}

/// Fast retries so failure tests finish quickly.
pub fn config() -> StoreConfig {
    StoreConfig {
        write_retry_backoff: std::time::Duration::from_millis(1),
        write_attempts_max: 3,
        ..StoreConfig::default()
    }
}

pub async fn open(bucket: &Arc<Probe>, actor: &ActorId, node: &str) -> ActorStore {
    open_with(bucket, actor, node, config()).await
}

pub async fn open_with(
    bucket: &Arc<Probe>,
    actor: &ActorId,
    node: &str,
    config: StoreConfig,
) -> ActorStore {
    ActorStore::open(bucket.clone(), keys(), actor.clone(), writer(node), config)
        .await
        .expect("open")
}

/// One event: run statements, commit, return the gate.
pub fn event(store: &mut ActorStore, statements: &[&str]) -> wasmkeep_store::OutputGate {
    store.begin_event().expect("begin");
    for s in statements {
        store.execute(s, &[]).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    store.commit_event().expect("commit")
}

pub fn int(store: &mut ActorStore, sql: &str) -> i64 {
    let rows = store
        .query(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    match rows.rows.first().and_then(|r| r.first()) {
        Some(SqlValue::Integer(i)) => *i,
        other => panic!("{sql}: not an integer: {other:?}"),
    }
}

//! The bucket: the only shared state of a wasmkeep cluster.
//!
//! One trait, [`Bucket`], with conditional writes (put-if-absent,
//! put-if-match on an etag) that everything else — leases, ownership records,
//! the actor log — builds on. The bucket knows nothing of leases, actors or
//! nodes: it stores bytes under keys (built by `wasmkeep_types::keys`).
//!
//! Errors say what the caller should do next ([`Error`]): a failed condition
//! is a [`Error::Conflict`], a transient failure is [`Error::Unavailable`],
//! and a write whose outcome cannot be known is [`Error::OutcomeUnknown`]:
//! the caller must re-read before deciding anything.
//!
//! The trait holds the core operations only. What a backend may do better
//! when it is told more about a call (a put in no hurry, a bulk delete that
//! need not be durable, a listing of names only) is one optional capability,
//! [`Hints`], which callers use through the functions of [`hinted`]; they
//! fall back to the core operations on a bucket without it. A bucket that
//! wraps another (to count, record or inject faults) implements [`Around`],
//! which passes the hints on through its own hook (ADR 0057).
//!
//! Backends, chosen by URL with [`open`]:
//! - [`MemoryBucket`] (`memory://`): in-process, with [`Faults`] (latency,
//!   errors, lost replies, partitions) for tests and the simulation.
//! - [`FolderBucket`] (`file:///abs/path`): files under a folder, atomic
//!   across threads and processes (striped `flock`s), durable with group
//!   commit.
//! - [`S3Bucket`] (`s3://bucket/prefix`): any S3 server with conditional
//!   writes, through `object_store`.
//!
//! Every backend accepts the same keys ([`key`]), so code tested against
//! memory behaves the same on a folder or S3.

mod around;
mod folder;
pub mod hinted;
pub mod key;
mod memory;
mod open;
mod s3;

/// The hasher of the folder committer's maps of keys (its batch, the young
/// index, the names of ADR 0036): fast on keys of tens of bytes, and seeded
/// per process, since keys are partly chosen by clients (actor names).
pub(crate) type KeyHasher = foldhash::fast::RandomState;

pub use around::{Answer, Around, Request};
/// For the journal's property tests only (`tests/journal.rs`).
#[doc(hidden)]
pub use folder::journal_fuzzing;
pub use folder::{CHECKPOINT_INTERVAL, JOURNAL_BODY_MAX, JOURNAL_BYTES_MAX};
pub use folder::{
    COMMIT_BATCH_WRITES_MAX, COMMIT_QUEUE_WRITES_MAX, FolderBucket, FolderOptions, LOCK_STRIPES,
    SyncMode, content_etag,
};
pub use hinted::Hints;
pub use memory::{FAULT_QUEUE_LEN_MAX, Fault, Faults, MemoryBucket};
pub use open::{open, open_existing};
pub use s3::{
    ANSWER_TIME_MAX, REQUEST_TIME_MAX, RETRIES_MAX, RETRY_TIMEOUT, S3Bucket, answer_time_max,
};

use std::fmt;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

/// An object's version as the backend names it. Two objects with the same
/// bytes may have the same etag (S3 servers hash the content), so every
/// lease-like body must carry a nonce or generation of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etag(pub String);

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a listing or a write reports about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub etag: Etag,
    pub last_modified: SystemTime,
    pub size: u64,
}

/// An object read whole.
#[derive(Debug, Clone)]
pub struct Object {
    pub bytes: Bytes,
    pub meta: ObjectMeta,
}

/// A key a listing found, with its size: what [`hinted::list_keys`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

/// One page of a listing; pass `next` back to get the following page.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    pub next: Option<String>,
}

/// What went wrong, phrased as what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The condition of a conditional write failed: someone else wrote first.
    #[error("conflict on {key}: the object changed or already exists")]
    Conflict { key: String },
    /// The key does not exist.
    #[error("not found: {key}")]
    NotFound { key: String },
    /// The backend could not be reached or refused for now: retry later.
    #[error("bucket unavailable ({key}): {reason}")]
    Unavailable { key: String, reason: String },
    /// A write may or may not have applied (a lost reply, a retried request):
    /// re-read the object before deciding.
    #[error("outcome unknown for {key}: {reason}")]
    OutcomeUnknown { key: String, reason: String },
    /// The key is not acceptable to this backend (e.g. it would escape the
    /// folder backend's root).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    /// The bucket URL or its configuration is wrong.
    #[error("bucket configuration: {0}")]
    Config(String),
    /// The backend does not offer this operation.
    #[error("not supported by this backend: {0}")]
    Unsupported(&'static str),
}

impl Error {
    /// True for errors after which the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Longest page a listing returns.
pub const LIST_PAGE_OBJECTS_MAX: usize = 1000;

/// Deletes [`hinted::delete_all_not_durable`] has in flight at once on a
/// backend without a bulk delete.
pub const DELETES_IN_FLIGHT_MAX: usize = 16;

/// The operations wasmkeep needs from an object store: the core every
/// backend has, and nothing else (ADR 0057). What a backend may do better
/// when it knows more about a call (a write in no hurry, a bulk delete) is
/// its [`Hints`], offered through [`Bucket::hints`] and used through the
/// functions of [`hinted`]. A bucket that wraps another implements
/// [`Around`] instead of this trait, which passes the hints on.
///
/// Every write is durable when it returns `Ok`. Conditional writes are atomic:
/// of two racing writers with the same condition, exactly one succeeds.
#[async_trait]
pub trait Bucket: Send + Sync + fmt::Debug + 'static {
    async fn get(&self, key: &str) -> Result<Object>;

    /// Metadata only (no body).
    async fn head(&self, key: &str) -> Result<ObjectMeta>;

    /// Creates the object only if no object has the key; `Conflict` otherwise.
    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta>;

    /// Replaces the object only if its etag is still `etag`; `Conflict` if it
    /// changed, `NotFound` if it is gone.
    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta>;

    /// Creates or replaces the object.
    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta>;

    /// Deletes the object; deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<()>;

    /// Deletes the object only if its etag is still `etag`. Backends without
    /// conditional deletes return `Unsupported`; callers then fall back to
    /// writing a "released" body with `put_if_match`.
    async fn delete_if_match(&self, key: &str, etag: &Etag) -> Result<()>;

    /// Lists keys starting with `prefix` in lexicographic order, one page at a
    /// time, starting after `start_after` when given.
    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage>;

    /// Lists every key under `prefix` (all pages), sorted in byte order
    /// whatever order a server's pages came in. Built from
    /// [`Bucket::list_page`] alone: backends do not override it.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.list_page(prefix, after.as_deref()).await?;
            all.extend(page.objects);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        // Already sorted on every backend but S3, whose servers may differ;
        // sorting sorted keys is one pass.
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    /// The hints this bucket offers beyond the core, if any: a backend that
    /// has some returns itself; every [`Around`] wrapper returns itself too,
    /// so its hook sees each hinted call. Call them through [`hinted`], which
    /// falls back to the core operations when this is `None`.
    fn hints(&self) -> Option<&dyn Hints> {
        None
    }
}

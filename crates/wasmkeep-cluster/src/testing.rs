//! Test support: a bucket that writes down every request it is given.
//!
//! The simulation compares a digest of every run, so the order, number and
//! kind of bucket requests of this crate's code are part of its behaviour.
//! [`Recorder`] lets a unit test pin them: each request becomes one line
//! (`put_if_match owners/t/counter/a if m2 #1b2c3d4e -> conflict`) naming
//! the operation, the key, the condition, a hash of the body (which covers
//! the nonces drawn from the seeded randomness) and the answer.

use std::fmt::Write as _;
use std::future::Future;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmkeep_bucket::{Answer, Around, Bucket, Error, Etag, MemoryBucket, Request, Result};

/// What happens just before one of the recorded requests.
#[derive(Debug)]
pub enum Meddling {
    /// Another writer puts these bytes under this key.
    Put(String, Bytes),
    /// Another writer deletes this key.
    Delete(String),
    /// The request fails with `Unavailable` and changes nothing.
    Unavailable,
}

/// Given a request's operation and key, what happens just before it.
pub type Meddle = Box<dyn FnMut(&str, &str) -> Option<Meddling> + Send>;

/// A [`MemoryBucket`] client that records every request (see the module).
pub struct Recorder {
    pub inner: MemoryBucket,
    /// Another client of the same objects, for meddling writes: the faults
    /// queued on `inner` are left for the recorded requests.
    other: MemoryBucket,
    log: Mutex<Vec<String>>,
    /// Whether `delete_if_match` works (the S3 backend may refuse it).
    conditional_delete: bool,
    /// Called with (operation, key) before each request (see [`Meddling`]).
    meddle: Mutex<Option<Meddle>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self::over(MemoryBucket::new(), true)
    }

    pub fn over(inner: MemoryBucket, conditional_delete: bool) -> Self {
        Self {
            other: inner.new_client(u64::MAX),
            inner,
            log: Mutex::new(Vec::new()),
            conditional_delete,
            meddle: Mutex::new(None),
        }
    }

    /// The requests recorded since the last call, one line each.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock())
    }

    /// Adds a line of the test's own to the log (to show where something
    /// happened between two requests).
    pub fn mark(&self, line: &str) {
        self.log.lock().push(line.to_owned());
    }

    pub fn meddle(&self, meddle: Option<Meddle>) {
        *self.meddle.lock() = meddle;
    }

    /// Carries out the meddling planned for this request: an error when
    /// the request is to fail.
    async fn before(&self, op: &str, key: &str) -> Result<()> {
        let meddling = self.meddle.lock().as_mut().and_then(|m| m(op, key));
        match meddling {
            Some(Meddling::Put(key, bytes)) => {
                self.other
                    .put(&key, bytes)
                    .await
                    .expect("a meddling put to the memory bucket");
            }
            Some(Meddling::Delete(key)) => {
                self.other
                    .delete(&key)
                    .await
                    .expect("a meddling delete from the memory bucket");
            }
            Some(Meddling::Unavailable) => {
                return Err(Error::Unavailable {
                    key: key.to_owned(),
                    reason: "meddled: unavailable".to_owned(),
                });
            }
            None => {}
        }
        Ok(())
    }

    /// Writes one request's line; `key` is already shortened.
    fn note<T>(
        &self,
        op: &str,
        key: &str,
        condition: Option<&Etag>,
        body: Option<&Bytes>,
        result: &Result<T>,
    ) {
        let mut line = format!("{op} {key}");
        if let Some(etag) = condition {
            let _ = write!(line, " if {etag}");
        }
        if let Some(body) = body {
            let _ = write!(line, " #{:08x}", fnv1a(body));
        }
        let answer = match result {
            Ok(_) => "ok",
            Err(Error::Conflict { .. }) => "conflict",
            Err(Error::NotFound { .. }) => "not found",
            Err(Error::Unavailable { .. }) => "unavailable",
            Err(Error::OutcomeUnknown { .. }) => "unknown",
            Err(Error::Unsupported(_)) => "unsupported",
            Err(_) => "error",
        };
        let _ = write!(line, " -> {answer}");
        self.log.lock().push(line);
    }
}

/// The key without the app's prefix, to keep the lines short.
fn short_key(key: &str) -> &str {
    key.strip_prefix("apps/default/").unwrap_or(key)
}

/// FNV-1a: a stable hash of a body, the same on every run and platform.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

impl Around for Recorder {
    fn inner(&self) -> &dyn Bucket {
        &self.inner
    }

    /// Meddles (listings excepted), sends, and writes the line down. A bulk
    /// delete is one line naming its keys, and meddled with as one request
    /// whose key is those keys joined by spaces.
    async fn around<T: Answer>(
        &self,
        request: Request<'_>,
        call: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let (key, condition, body) = match request {
            Request::Get { key } | Request::Head { key } | Request::Delete { key } => {
                (key.to_owned(), None, None)
            }
            Request::PutIfAbsent { key, bytes }
            | Request::PutIfAbsentUnhurried { key, bytes }
            | Request::PutIfAbsentAlone { key, bytes }
            | Request::Put { key, bytes } => (key.to_owned(), None, Some(bytes)),
            Request::PutIfMatch { key, bytes, etag } => (key.to_owned(), Some(etag), Some(bytes)),
            Request::DeleteIfMatch { key, etag } => (key.to_owned(), Some(etag), None),
            Request::ListPage { prefix, .. } | Request::ListKeys { prefix } => {
                (prefix.to_owned(), None, None)
            }
            Request::DeleteAllNotDurable { keys } => (keys.join(" "), None, None),
        };
        let op = request.op();
        let result = match request {
            Request::ListPage { .. } | Request::ListKeys { .. } => call.await,
            _ => match self.before(op, &key).await {
                Ok(()) if op == "delete_if_match" && !self.conditional_delete => {
                    Err(Error::Unsupported("conditional delete"))
                }
                Ok(()) => call.await,
                Err(e) => Err(e),
            },
        };
        let shown = match request {
            Request::DeleteAllNotDurable { keys } => {
                let short: Vec<&str> = keys.iter().map(|k| short_key(k)).collect();
                short.join(" ")
            }
            _ => short_key(&key).to_owned(),
        };
        self.note(op, &shown, condition, body, &result);
        result
    }
}

//! [`Around`]: how a bucket that wraps another is written (the server's
//! request counter, test recorders and fault injectors, the simulation's
//! client), so that it cannot forget the hints (ADR 0057).
//!
//! A wrapper names the bucket it wraps and one hook, [`Around::around`],
//! that runs each request: the core operations and the hinted calls of
//! [`crate::hinted`] alike, each described by a [`Request`]. It does not
//! implement [`Bucket`] itself: every [`Around`] is a [`Bucket`] and offers
//! [`Hints`] through the implementations here, which send each call to the
//! bucket inside through the hook. A hinted call reaches the bucket inside
//! as the same hint (so the folder bucket behind a counter still takes it),
//! and the wrapper counts, records or fails it as one call, where a wrapper
//! that only passed on `inner.hints()` would let it go by unseen.

use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use bytes::Bytes;

use crate::hinted::{self, Hints};
use crate::{Bucket, Etag, ListPage, Listed, Object, ObjectMeta, Result};

/// A bucket that wraps another and does something around each of its
/// requests. Implement this, never [`Bucket`], for such a type: it is then
/// a [`Bucket`] whose every call, hinted ones included, goes through
/// [`Around::around`].
pub trait Around: Send + Sync + fmt::Debug + 'static {
    /// The bucket this one wraps: where each request goes.
    fn inner(&self) -> &dyn Bucket;

    /// Runs one request: `call` sends it to [`Around::inner`] (nothing is
    /// sent until it is awaited; dropping it unawaited sends nothing, which
    /// is how a wrapper fails a request itself). The wrapper may wait
    /// before it, look at or replace its answer, or wait after it.
    fn around<T: Answer>(
        &self,
        request: Request<'_>,
        call: impl Future<Output = Result<T>> + Send,
    ) -> impl Future<Output = Result<T>> + Send;
}

/// One request as a wrapper sees it: the operation and its arguments. A
/// hinted call is one request of its own kind (a bulk delete is one
/// request, not one per key), as the bucket inside receives it.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    Get {
        key: &'a str,
    },
    Head {
        key: &'a str,
    },
    PutIfAbsent {
        key: &'a str,
        bytes: &'a Bytes,
    },
    PutIfMatch {
        key: &'a str,
        bytes: &'a Bytes,
        etag: &'a Etag,
    },
    Put {
        key: &'a str,
        bytes: &'a Bytes,
    },
    Delete {
        key: &'a str,
    },
    DeleteIfMatch {
        key: &'a str,
        etag: &'a Etag,
    },
    ListPage {
        prefix: &'a str,
        start_after: Option<&'a str>,
    },
    /// [`hinted::put_if_absent_unhurried`].
    PutIfAbsentUnhurried {
        key: &'a str,
        bytes: &'a Bytes,
    },
    /// [`hinted::put_if_absent_alone`].
    PutIfAbsentAlone {
        key: &'a str,
        bytes: &'a Bytes,
    },
    /// [`hinted::delete_all_not_durable`].
    DeleteAllNotDurable {
        keys: &'a [String],
    },
    /// [`hinted::list_keys`].
    ListKeys {
        prefix: &'a str,
    },
}

impl Request<'_> {
    /// The name of the method or hinted function that made the request.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Get { .. } => "get",
            Request::Head { .. } => "head",
            Request::PutIfAbsent { .. } => "put_if_absent",
            Request::PutIfMatch { .. } => "put_if_match",
            Request::Put { .. } => "put",
            Request::Delete { .. } => "delete",
            Request::DeleteIfMatch { .. } => "delete_if_match",
            Request::ListPage { .. } => "list_page",
            Request::PutIfAbsentUnhurried { .. } => "put_if_absent_unhurried",
            Request::PutIfAbsentAlone { .. } => "put_if_absent_alone",
            Request::DeleteAllNotDurable { .. } => "delete_all_not_durable",
            Request::ListKeys { .. } => "list_keys",
        }
    }
}

/// What a request answers on success, as far as a wrapper looks into it.
/// `Sync` as well, so that a wrapper may keep looking at it across an
/// await (the simulation asks its oracle about a write it answered).
pub trait Answer: Send + Sync {
    /// The object a `get` read.
    fn object(&self) -> Option<&Object> {
        None
    }

    /// The metadata a `get`, `head` or put gave.
    fn meta(&self) -> Option<&ObjectMeta> {
        None
    }
}

impl Answer for Object {
    fn object(&self) -> Option<&Object> {
        Some(self)
    }

    fn meta(&self) -> Option<&ObjectMeta> {
        Some(&self.meta)
    }
}

impl Answer for ObjectMeta {
    fn meta(&self) -> Option<&ObjectMeta> {
        Some(self)
    }
}

impl Answer for () {}

impl Answer for ListPage {}

impl Answer for Vec<Listed> {}

// The bodies below clone `bytes` (a reference count) so that the request
// can show them while the call owns them.

#[async_trait]
impl<W: Around> Bucket for W {
    async fn get(&self, key: &str) -> Result<Object> {
        self.around(Request::Get { key }, self.inner().get(key))
            .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        self.around(Request::Head { key }, self.inner().head(key))
            .await
    }

    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        let call = self.inner().put_if_absent(key, bytes.clone());
        self.around(Request::PutIfAbsent { key, bytes: &bytes }, call)
            .await
    }

    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta> {
        let call = self.inner().put_if_match(key, bytes.clone(), etag);
        let request = Request::PutIfMatch {
            key,
            bytes: &bytes,
            etag,
        };
        self.around(request, call).await
    }

    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        let call = self.inner().put(key, bytes.clone());
        self.around(Request::Put { key, bytes: &bytes }, call).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.around(Request::Delete { key }, self.inner().delete(key))
            .await
    }

    async fn delete_if_match(&self, key: &str, etag: &Etag) -> Result<()> {
        let call = self.inner().delete_if_match(key, etag);
        self.around(Request::DeleteIfMatch { key, etag }, call)
            .await
    }

    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage> {
        let call = self.inner().list_page(prefix, start_after);
        self.around(
            Request::ListPage {
                prefix,
                start_after,
            },
            call,
        )
        .await
    }

    /// Always: each hint goes to the bucket inside through the hook, and
    /// that bucket takes it or falls back as [`crate::hinted`] does.
    fn hints(&self) -> Option<&dyn Hints> {
        Some(self)
    }
}

#[async_trait]
impl<W: Around> Hints for W {
    async fn put_if_absent_unhurried(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        let call = hinted::put_if_absent_unhurried(self.inner(), key, bytes.clone());
        self.around(Request::PutIfAbsentUnhurried { key, bytes: &bytes }, call)
            .await
    }

    async fn put_if_absent_alone(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        let call = hinted::put_if_absent_alone(self.inner(), key, bytes.clone());
        self.around(Request::PutIfAbsentAlone { key, bytes: &bytes }, call)
            .await
    }

    async fn delete_all_not_durable(&self, keys: &[String]) -> Result<()> {
        let call = hinted::delete_all_not_durable(self.inner(), keys);
        self.around(Request::DeleteAllNotDurable { keys }, call)
            .await
    }

    /// Not a request (no I/O, nothing to count): asked of the bucket inside.
    fn short_lived_objects_are_cheap(&self) -> bool {
        hinted::short_lived_objects_are_cheap(self.inner())
    }

    async fn list_keys(&self, prefix: &str) -> Result<Vec<Listed>> {
        let call = hinted::list_keys(self.inner(), prefix);
        self.around(Request::ListKeys { prefix }, call).await
    }

    async fn list_keys_after(&self, prefix: &str, start_after: &str) -> Result<Vec<Listed>> {
        let call = hinted::list_keys_after(self.inner(), prefix, start_after);
        self.around(Request::ListKeys { prefix }, call).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::{Error, MemoryBucket};

    /// Writes down the operation of each request it sees, and fails the
    /// requests of one operation without sending them.
    #[derive(Debug)]
    struct Log {
        inner: Arc<dyn Bucket>,
        name: &'static str,
        seen: Arc<Mutex<Vec<String>>>,
        fail: Option<&'static str>,
    }

    impl Around for Log {
        fn inner(&self) -> &dyn Bucket {
            &*self.inner
        }

        async fn around<T: Answer>(
            &self,
            request: Request<'_>,
            call: impl Future<Output = Result<T>> + Send,
        ) -> Result<T> {
            self.seen
                .lock()
                .push(format!("{} {}", self.name, request.op()));
            if self.fail == Some(request.op()) {
                return Err(Error::Unavailable {
                    key: String::new(),
                    reason: "failed by the test".to_owned(),
                });
            }
            call.await
        }
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| (*k).to_owned()).collect()
    }

    /// Each hinted call is one request at every wrapper it passes, and the
    /// bucket inside the inner wrapper is given the hint, not the core
    /// requests it stands for: a wrapper around the folder bucket does not
    /// take its hints away.
    #[tokio::test]
    async fn each_wrapper_sees_a_hinted_call_once_and_passes_it_on_as_the_hint() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let memory = MemoryBucket::new();
        let inner = Log {
            inner: Arc::new(memory.new_client(0)),
            name: "inner",
            seen: Arc::clone(&seen),
            fail: None,
        };
        let outer = Log {
            inner: Arc::new(inner),
            name: "outer",
            seen: Arc::clone(&seen),
            fail: None,
        };
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        outer.put("a/1", b("one")).await.expect("put");
        hinted::put_if_absent_unhurried(&outer, "a/2", b("two"))
            .await
            .expect("unhurried put");
        hinted::put_if_absent_alone(&outer, "a/3", b("three"))
            .await
            .expect("lone put");
        let listed = hinted::list_keys(&outer, "a/").await.expect("listed");
        assert_eq!(listed.len(), 3);
        hinted::delete_all_not_durable(&outer, &keys(&["a/1", "a/2", "a/9"]))
            .await
            .expect("deleted");
        assert!(!hinted::short_lived_objects_are_cheap(&outer));
        assert_eq!(memory.keys(), ["a/3"]);
        let ops = [
            "put",
            "put_if_absent_unhurried",
            "put_if_absent_alone",
            "list_keys",
            "delete_all_not_durable",
        ];
        let expected: Vec<String> = ops
            .iter()
            .flat_map(|op| [format!("outer {op}"), format!("inner {op}")])
            .collect();
        assert_eq!(*seen.lock(), expected);
    }

    /// A wrapper that fails a hinted call (an injected fault) fails all of
    /// it: nothing reaches the bucket inside.
    #[tokio::test]
    async fn a_wrapper_fails_a_hinted_call_as_one_request() {
        let memory = MemoryBucket::new();
        let wrapper = Log {
            inner: Arc::new(memory.new_client(0)),
            name: "w",
            seen: Arc::new(Mutex::new(Vec::new())),
            fail: Some("delete_all_not_durable"),
        };
        for key in ["a/1", "a/2"] {
            wrapper
                .put(key, Bytes::from_static(b"x"))
                .await
                .expect("put");
        }
        let r = hinted::delete_all_not_durable(&wrapper, &keys(&["a/1", "a/2"])).await;
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
        assert_eq!(memory.keys(), ["a/1", "a/2"]);
        assert_eq!(
            *wrapper.seen.lock(),
            ["w put", "w put", "w delete_all_not_durable"]
        );
    }
}

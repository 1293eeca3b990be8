//! The hints: calls that tell a bucket more than the core operations of
//! [`Bucket`] do, so that a backend able to use it does better (ADR 0057).
//!
//! A backend offers them by implementing [`Hints`] (overriding the ones it
//! can use) and returning itself from [`Bucket::hints`]. Callers use the
//! functions of this module: each takes the hint where the bucket offers
//! it and otherwise does what the hint stands for with the core operations
//! (those fallbacks are also [`Hints`]' provided methods, so a backend that
//! overrides one hint gets the others as they were). A wrapper offers the
//! hints whatever it wraps: see [`crate::Around`].
//!
//! The hints, and the ADRs that made them:
//! - [`put_if_absent_unhurried`]: a put that may wait to share a flush
//!   (ADR 0041);
//! - [`put_if_absent_alone`]: a put with nothing queued behind it, which the
//!   folder may commit on the caller's thread (ADR 0045);
//! - [`delete_all_not_durable`]: compaction's deletes as one request
//!   (ADR 0042);
//! - [`short_lived_objects_are_cheap`]: whether an object deleted soon after
//!   its write costs next to nothing (ADR 0034);
//! - [`list_keys`]: keys and sizes without etags or times;
//! - [`list_keys_after`]: the same from a key on (ADR 0076: the log after
//!   an actor's newest snapshot, not every record its retention keeps).

use async_trait::async_trait;
use bytes::Bytes;

use crate::{Bucket, DELETES_IN_FLIGHT_MAX, Error, Listed, ObjectMeta, Result, key};

/// What a backend may do better than the core operations when it is told
/// more about a call. Every method has the same outcome as its fallback
/// (the provided body); only its cost differs. Call them through the
/// functions of [`crate::hinted`], never on a backend directly, so that a
/// bucket without hints still works and a wrapper still sees each call.
#[async_trait]
pub trait Hints: Bucket {
    /// [`Bucket::put_if_absent`] for a caller in no hurry (the store's
    /// snapshots): the same guarantees once it returns, but the backend may
    /// hold it back for a moment so that it shares a flush with a write that
    /// comes right after it, instead of making that write wait for a flush
    /// of its own (ADR 0041). Backends without flushes to share just put.
    async fn put_if_absent_unhurried(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.put_if_absent(key, bytes).await
    }

    /// [`Bucket::put_if_absent`] for a caller that waits for this write
    /// alone, with nothing queued behind it (the store's record of a lone
    /// event): the same guarantees, but a backend that hands its writes to a
    /// thread of its own may do this one on the caller's thread instead,
    /// when nothing else is in flight, and save the two hand-offs
    /// (ADR 0045). Backends without such a thread just put.
    async fn put_if_absent_alone(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.put_if_absent(key, bytes).await
    }

    /// Deletes `keys`, whose removal need not survive a crash: after one,
    /// any of them may exist again (the store's compaction deletes records a
    /// durable snapshot covers; one that comes back is ignored). Missing
    /// keys are not an error. Every key is checked before any is deleted.
    ///
    /// Where a backend can, the keys go as one request, in no hurry (ADR
    /// 0042): the folder bucket takes them into one batch of its committer,
    /// which flushes nothing for their sake; S3 sends one `DeleteObjects`
    /// per 1,000 keys. Others delete them [`DELETES_IN_FLIGHT_MAX`] at a
    /// time. On an error some keys may be deleted and others not.
    async fn delete_all_not_durable(&self, keys: &[String]) -> Result<()> {
        delete_each(self, keys).await
    }

    /// Whether an object written and deleted again within moments costs
    /// little more than nothing: the folder bucket alone on its folder keeps
    /// young objects in its journal, and one deleted before the next
    /// checkpoint never becomes a file (ADR 0034). The store then snapshots
    /// small databases sooner, so their log records die young. It may change
    /// from `true` to `false` (another process opened the folder).
    fn short_lived_objects_are_cheap(&self) -> bool {
        false
    }

    /// Lists every key under `prefix` with its size (all pages), for
    /// callers that need neither etags nor times. The folder bucket gives it
    /// without reading each object (its etags hash the bodies) or asking for
    /// its times; other backends list as [`Bucket::list`] does.
    async fn list_keys(&self, prefix: &str) -> Result<Vec<Listed>> {
        list_all(self, prefix).await
    }

    /// [`Hints::list_keys`] of the keys after `start_after` only (in byte
    /// order), as [`Bucket::list_page`] pages from it.
    async fn list_keys_after(&self, prefix: &str, start_after: &str) -> Result<Vec<Listed>> {
        list_all_after(self, prefix, start_after).await
    }
}

/// [`Hints::put_if_absent_unhurried`] where `bucket` offers it, else
/// [`Bucket::put_if_absent`].
pub async fn put_if_absent_unhurried<B: Bucket + ?Sized>(
    bucket: &B,
    key: &str,
    bytes: Bytes,
) -> Result<ObjectMeta> {
    match bucket.hints() {
        Some(hints) => hints.put_if_absent_unhurried(key, bytes).await,
        None => bucket.put_if_absent(key, bytes).await,
    }
}

/// [`Hints::put_if_absent_alone`] where `bucket` offers it, else
/// [`Bucket::put_if_absent`].
pub async fn put_if_absent_alone<B: Bucket + ?Sized>(
    bucket: &B,
    key: &str,
    bytes: Bytes,
) -> Result<ObjectMeta> {
    match bucket.hints() {
        Some(hints) => hints.put_if_absent_alone(key, bytes).await,
        None => bucket.put_if_absent(key, bytes).await,
    }
}

/// [`Hints::delete_all_not_durable`] where `bucket` offers it, else one
/// [`Bucket::delete`] per key, [`DELETES_IN_FLIGHT_MAX`] at a time.
pub async fn delete_all_not_durable<B: Bucket + ?Sized>(bucket: &B, keys: &[String]) -> Result<()> {
    match bucket.hints() {
        Some(hints) => hints.delete_all_not_durable(keys).await,
        None => delete_each(bucket, keys).await,
    }
}

/// [`Hints::short_lived_objects_are_cheap`] where `bucket` offers it, else
/// `false`.
pub fn short_lived_objects_are_cheap<B: Bucket + ?Sized>(bucket: &B) -> bool {
    bucket
        .hints()
        .is_some_and(|hints| hints.short_lived_objects_are_cheap())
}

/// [`Hints::list_keys`] where `bucket` offers it, else [`Bucket::list`]
/// without the etags and times.
pub async fn list_keys<B: Bucket + ?Sized>(bucket: &B, prefix: &str) -> Result<Vec<Listed>> {
    match bucket.hints() {
        Some(hints) => hints.list_keys(prefix).await,
        None => list_all(bucket, prefix).await,
    }
}

/// [`Hints::list_keys_after`] where `bucket` offers it, else the pages of
/// [`Bucket::list_page`] from `start_after`.
pub async fn list_keys_after<B: Bucket + ?Sized>(
    bucket: &B,
    prefix: &str,
    start_after: &str,
) -> Result<Vec<Listed>> {
    match bucket.hints() {
        Some(hints) => hints.list_keys_after(prefix, start_after).await,
        None => list_all_after(bucket, prefix, start_after).await,
    }
}

/// The bulk delete with the core operations: every key checked first, then
/// [`DELETES_IN_FLIGHT_MAX`] deletes at a time, a missing key not an error.
async fn delete_each<B: Bucket + ?Sized>(bucket: &B, keys: &[String]) -> Result<()> {
    use futures::StreamExt as _;
    for key in keys {
        key::validate_key(key)?;
    }
    // Collected first: a stream mapped by a closure over borrowed keys is
    // not `Send` for every lifetime, as `async_trait` needs.
    let deletes: Vec<_> = keys
        .iter()
        .map(|key| async move {
            match bucket.delete(key).await {
                Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .collect();
    let mut deletes = futures::stream::iter(deletes).buffer_unordered(DELETES_IN_FLIGHT_MAX);
    while let Some(deleted) = deletes.next().await {
        deleted?;
    }
    Ok(())
}

/// Keys and sizes after `start_after` with the core operations: the pages
/// of [`Bucket::list_page`] from it.
async fn list_all_after<B: Bucket + ?Sized>(
    bucket: &B,
    prefix: &str,
    start_after: &str,
) -> Result<Vec<Listed>> {
    let mut all = Vec::new();
    let mut after = start_after.to_owned();
    loop {
        let page = bucket.list_page(prefix, Some(&after)).await?;
        all.extend(page.objects.into_iter().map(|meta| Listed {
            key: meta.key,
            size: meta.size,
        }));
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    // Sorted as `Bucket::list` sorts (an S3 server's pages may differ).
    all.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(all)
}

/// Keys and sizes with the core operations: [`Bucket::list`].
async fn list_all<B: Bucket + ?Sized>(bucket: &B, prefix: &str) -> Result<Vec<Listed>> {
    Ok(bucket
        .list(prefix)
        .await?
        .into_iter()
        .map(|meta| Listed {
            key: meta.key,
            size: meta.size,
        })
        .collect())
}

//! The store's bucket writes and their retries: a log record or snapshot
//! created through the cluster's [`Fenced`] and settled (ours, another
//! writer's, or unknown after the retries), the alarm index's unconditional
//! put and delete, and the bulk deletes of compaction.

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Error as BucketError, hinted};
/// How a record or snapshot is put: the store picks it per write.
pub(crate) use wasmkeep_cluster::fenced::Haste;
use wasmkeep_cluster::fenced::{Fenced, Outcome};

use crate::{Result, StoreConfig};

use super::FailureKind;

/// put-if-absent of a record whose body is unique to this writer, settled:
/// `Ok` once our bytes are in the bucket under `key`; `Fenced` when other
/// bytes are; `Broken` when no attempt applied and the bucket refused or
/// failed past the retries; `Unsettled` when an attempt whose reply was
/// lost may still apply (the bucket would not tell within the retries).
/// `haste` picks the bucket request: whether a response waits for this
/// write ([`Haste::Unhurried`] when none does), and whether its writer
/// waits for nothing else ([`Haste::Alone`]).
pub(crate) async fn put_settled(
    bucket: &dyn Bucket,
    key: &str,
    body: Bytes,
    config: &StoreConfig,
    haste: Haste,
) -> Result<(), FailureKind> {
    let record = Fenced::new(bucket, key);
    let mut backoff = config.write_retry_backoff;
    let mut last_error: String;
    let started = tokio::time::Instant::now();
    let mut attempts = 0;
    // An attempt whose reply was lost: it may apply later, whatever the
    // read-back finds now.
    let mut in_doubt = false;
    loop {
        attempts += 1;
        match record.create_with(body.clone(), haste).await {
            Ok(Outcome::Done(_)) => return Ok(()),
            Ok(Outcome::Conflict) => {
                // Ours (an earlier attempt that applied) or another writer's?
                match record.read().await {
                    Ok(Some(current)) if current.value == body => return Ok(()),
                    Ok(Some(_)) => return Err(FailureKind::Fenced),
                    // It existed a moment ago: another writer compacted it away.
                    Ok(None) => return Err(FailureKind::Fenced),
                    Err(e) => last_error = e.to_string(),
                }
            }
            // Tried again: the next attempt's conflict, if it applied, is
            // read back.
            Ok(Outcome::Unknown(e)) => {
                in_doubt = true;
                last_error = e.to_string();
            }
            Err(e @ BucketError::Unavailable { .. }) => last_error = e.to_string(),
            // A put-if-absent answered "not found" breaks the bucket's
            // contract: the store breaks, naming it.
            Ok(Outcome::Gone) => {
                return Err(failed(
                    in_doubt,
                    BucketError::NotFound {
                        key: key.to_owned(),
                    }
                    .to_string(),
                ));
            }
            Err(e) => return Err(failed(in_doubt, e.to_string())),
        }
        if !retry_allowed(attempts, started, config) {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
    }
    // Out of attempts (or time): one last read decides if an attempt applied.
    match record.read().await {
        Ok(Some(current)) if current.value == body => Ok(()),
        Ok(Some(_)) => Err(FailureKind::Fenced),
        Ok(None) => Err(failed(
            in_doubt,
            format!(
                "{attempts} {} failed (last: {last_error}); read-back: {}",
                if attempts == 1 { "attempt" } else { "attempts" },
                BucketError::NotFound {
                    key: key.to_owned()
                }
            ),
        )),
        Err(e) => Err(failed(
            in_doubt,
            format!(
                "{attempts} {} failed (last: {last_error}); read-back: {e}",
                if attempts == 1 { "attempt" } else { "attempts" }
            ),
        )),
    }
}

/// How a put that did not settle as ours failed: `Unsettled` when an
/// attempt may still apply, else `Broken`.
fn failed(in_doubt: bool, reason: String) -> FailureKind {
    if in_doubt {
        FailureKind::Unsettled(reason)
    } else {
        FailureKind::Broken(reason)
    }
}

/// Whether a write that failed `attempts` times since `started` may be
/// tried again ([`StoreConfig::write_attempts_max`],
/// [`StoreConfig::write_time_max`]).
fn retry_allowed(attempts: u32, started: tokio::time::Instant, config: &StoreConfig) -> bool {
    attempts < config.write_attempts_max && started.elapsed() < config.write_time_max
}

pub(super) async fn put_retrying(
    bucket: &dyn Bucket,
    key: &str,
    body: Bytes,
    config: &StoreConfig,
) -> Result<(), BucketError> {
    retrying(key, config, || bucket.put(key, body.clone()))
        .await
        .map(|_| ())
}

pub(super) async fn delete_retrying(
    bucket: &dyn Bucket,
    key: &str,
    config: &StoreConfig,
) -> Result<(), BucketError> {
    retrying(key, config, || bucket.delete(key)).await
}

/// Runs a write that may be repeated (an unconditional put, a delete) until
/// it succeeds, fails for good, or [`retry_allowed`] says no more:
/// `Unavailable` and `OutcomeUnknown` are tried again after a doubling
/// backoff.
async fn retrying<T, F>(
    key: &str,
    config: &StoreConfig,
    mut write: impl FnMut() -> F,
) -> Result<T, BucketError>
where
    F: std::future::Future<Output = Result<T, BucketError>>,
{
    let mut backoff = config.write_retry_backoff;
    let mut attempt = 1;
    let started = tokio::time::Instant::now();
    loop {
        match write().await {
            Ok(done) => return Ok(done),
            Err(e @ (BucketError::Unavailable { .. } | BucketError::OutcomeUnknown { .. }))
                if retry_allowed(attempt, started, config) =>
            {
                tracing::debug!(key, error = %e, "retrying a write");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
        attempt += 1;
    }
}

/// Deletes `keys` as one bucket request where the bucket can
/// ([`hinted::delete_all_not_durable`]).
pub(crate) async fn delete_all(bucket: &dyn Bucket, keys: Vec<String>) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    Ok(hinted::delete_all_not_durable(bucket, &keys).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store config whose writes give up after `attempts`.
    fn attempts(attempts: u32) -> StoreConfig {
        StoreConfig {
            write_attempts_max: attempts,
            ..StoreConfig::default()
        }
    }

    // Pins the bucket requests of a settled put, call for call: the
    // simulation's digests see every one of them.
    #[tokio::test(start_paused = true)]
    async fn a_settled_put_reads_back_only_after_a_conflict_or_its_last_attempt() {
        use wasmkeep_bucket::Fault;
        use wasmkeep_cluster::testing::{Meddling, Recorder};
        let bucket = Recorder::new();
        let ours = Bytes::from_static(b"ours");
        let put = |key: &'static str, haste: Haste, config: StoreConfig| {
            let (bucket, ours) = (&bucket, ours.clone());
            async move { put_settled(bucket, key, ours, &config, haste).await }
        };
        let six = StoreConfig::default;
        // Each haste its own request.
        assert!(put("a/1", Haste::Hurried, six()).await.is_ok());
        assert!(put("a/2", Haste::Unhurried, six()).await.is_ok());
        assert!(put("a/3", Haste::Alone, six()).await.is_ok());
        // A lost reply: tried again, the conflict read back, ours.
        bucket.inner.faults().push(Fault::ReplyLost);
        assert!(put("a/4", Haste::Alone, six()).await.is_ok());
        // Another writer's bytes: fenced.
        bucket
            .inner
            .put("a/5", Bytes::from_static(b"theirs"))
            .await
            .unwrap();
        assert!(matches!(
            put("a/5", Haste::Hurried, six()).await,
            Err(FailureKind::Fenced)
        ));
        // The read-back fails: tried again.
        bucket.inner.put("a/6", ours.clone()).await.unwrap();
        let mut reads = 0;
        bucket.meddle(Some(Box::new(move |op, _| {
            reads += u32::from(op == "get");
            (op == "get" && reads == 1).then_some(Meddling::Unavailable)
        })));
        assert!(put("a/6", Haste::Hurried, six()).await.is_ok());
        // Gone by the read-back (compacted by another writer): fenced.
        bucket.inner.faults().push(Fault::ReplyLost);
        bucket.meddle(Some(Box::new(|op, key| {
            (op == "get" && key == "a/7").then(|| Meddling::Delete("a/7".to_owned()))
        })));
        assert!(matches!(
            put("a/7", Haste::Hurried, six()).await,
            Err(FailureKind::Fenced)
        ));
        bucket.meddle(None);
        // Out of attempts: one last read decides.
        for _ in 0..2 {
            bucket.inner.faults().push(Fault::Unavailable);
        }
        let broken = put("a/8", Haste::Hurried, attempts(2)).await;
        assert!(
            matches!(&broken, Err(FailureKind::Broken(reason)) if reason ==
                "2 attempts failed (last: bucket unavailable (a/8): injected: one-shot unavailable); read-back: not found: a/8"),
            "{broken:?}"
        );
        bucket.inner.faults().push(Fault::Unavailable);
        bucket.inner.faults().push(Fault::ReplyLost);
        assert!(put("a/9", Haste::Hurried, attempts(2)).await.is_ok());
        // A lost reply (the write applied), then the bucket fails, the
        // read-back too: the record may be there, or land: unsettled.
        bucket.inner.faults().push(Fault::ReplyLost);
        bucket.inner.faults().push(Fault::Unavailable);
        bucket.meddle(Some(Box::new(|op, _| {
            (op == "get").then_some(Meddling::Unavailable)
        })));
        let unsettled = put("a/10", Haste::Hurried, attempts(2)).await;
        assert!(
            matches!(&unsettled, Err(FailureKind::Unsettled(_))),
            "{unsettled:?}"
        );
        bucket.meddle(None);
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent a/1 #7e3ebd7e -> ok",
                "put_if_absent_unhurried a/2 #7e3ebd7e -> ok",
                "put_if_absent_alone a/3 #7e3ebd7e -> ok",
                "put_if_absent_alone a/4 #7e3ebd7e -> unknown",
                "put_if_absent_alone a/4 #7e3ebd7e -> conflict",
                "get a/4 -> ok",
                "put_if_absent a/5 #7e3ebd7e -> conflict",
                "get a/5 -> ok",
                "put_if_absent a/6 #7e3ebd7e -> conflict",
                "get a/6 -> unavailable",
                "put_if_absent a/6 #7e3ebd7e -> conflict",
                "get a/6 -> ok",
                "put_if_absent a/7 #7e3ebd7e -> unknown",
                "put_if_absent a/7 #7e3ebd7e -> conflict",
                "get a/7 -> not found",
                "put_if_absent a/8 #7e3ebd7e -> unavailable",
                "put_if_absent a/8 #7e3ebd7e -> unavailable",
                "get a/8 -> not found",
                "put_if_absent a/9 #7e3ebd7e -> unavailable",
                "put_if_absent a/9 #7e3ebd7e -> unknown",
                "get a/9 -> ok",
                "put_if_absent a/10 #7e3ebd7e -> unknown",
                "put_if_absent a/10 #7e3ebd7e -> unavailable",
                "get a/10 -> unavailable",
            ]
        );
    }
}

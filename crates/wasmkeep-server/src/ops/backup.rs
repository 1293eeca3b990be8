//! A backup of an app to another bucket (`wasmkeep backup --to URL`, ADR
//! 0076): its actors' log records and snapshots, alarms, classes and
//! components, secrets and tenant tokens, copied to the same keys under
//! any object store URL. Nothing of the source is written.
//!
//! Incremental: a log record or snapshot is never rewritten under its key
//! (no sequence number is reused, ADR 0055), so one the destination has is
//! skipped. The other records (a class's `current`, an alarm index, a
//! secret, a policy) change in place and are copied when their bytes
//! differ. A backup deletes nothing at the destination: what compaction
//! deleted at the source since the last backup stays there, so a backup
//! run more often than a class's retention window keeps every instant
//! since the first. What the nodes keep for themselves (leases, ownership
//! records, operators' requests and results) is not copied: a bucket
//! restored from a backup starts with no node and no owner.
//!
//! The backup is read like the source: `actor history`, `actor sql --at`
//! and `actor export --at` take its URL as `--bucket`, and `actor restore`
//! and `actor fork` take it as `--from`. A whole app comes back by a backup
//! of the backup into an empty bucket.

use std::collections::HashMap;

use futures::StreamExt;
use wasmkeep_bucket::{Bucket, Error as BucketError, hinted};
use wasmkeep_types::Keys;

use crate::Result;

/// Objects copied at once.
const COPIES_IN_FLIGHT: usize = 16;

/// What one backup did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Copied {
    /// Objects written to the destination.
    pub objects: u64,
    pub bytes: u64,
    /// Log records and snapshots the destination had already.
    pub skipped: u64,
    /// Objects listed at the source and gone before they were read
    /// (compacted meanwhile): their successors are copied.
    pub vanished: u64,
}

/// The prefixes of an app that a backup copies, and whether their objects
/// are written once (log records and snapshots) or change in place.
fn prefixes(keys: &Keys) -> Vec<(String, bool)> {
    vec![
        (keys.actors_prefix(), true),
        (keys.alarms_prefix(), false),
        (keys.classes_prefix(), false),
        (keys.secrets_prefix(), false),
        (keys.recipient(), false),
        (keys.tenants_prefix(), false),
        (keys.tenant_tokens_policy(), false),
    ]
}

/// Copies the app's data from `source` to `destination` (see the module).
pub async fn backup(source: &dyn Bucket, destination: &dyn Bucket, keys: &Keys) -> Result<Copied> {
    let mut copied = Copied::default();
    for (prefix, write_once) in prefixes(keys) {
        let listed = hinted::list_keys(source, &prefix).await?;
        let there: HashMap<String, u64> = hinted::list_keys(destination, &prefix)
            .await?
            .into_iter()
            .map(|l| (l.key, l.size))
            .collect();
        let mut todo = Vec::new();
        for l in listed {
            if write_once && there.get(&l.key) == Some(&l.size) {
                copied.skipped += 1;
            } else {
                todo.push(l.key);
            }
        }
        let copies: Vec<_> = todo
            .into_iter()
            .map(|key| async move { copy(source, destination, key, write_once).await })
            .collect();
        let mut copies = futures::stream::iter(copies).buffer_unordered(COPIES_IN_FLIGHT);
        while let Some(one) = copies.next().await {
            match one? {
                Copy::Written(bytes) => {
                    copied.objects += 1;
                    copied.bytes += bytes;
                }
                Copy::Same => {}
                Copy::Vanished => copied.vanished += 1,
            }
        }
    }
    Ok(copied)
}

enum Copy {
    Written(u64),
    /// The destination holds the same bytes.
    Same,
    Vanished,
}

async fn copy(
    source: &dyn Bucket,
    destination: &dyn Bucket,
    key: String,
    write_once: bool,
) -> Result<Copy> {
    let object = match source.get(&key).await {
        Ok(object) => object,
        Err(BucketError::NotFound { .. }) => return Ok(Copy::Vanished),
        Err(e) => return Err(e.into()),
    };
    if !write_once {
        match destination.get(&key).await {
            Ok(there) if there.bytes == object.bytes => return Ok(Copy::Same),
            Ok(_) | Err(BucketError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let bytes = object.bytes.len() as u64;
    destination.put(&key, object.bytes).await?;
    Ok(Copy::Written(bytes))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use bytes::Bytes;
    use wasmkeep_bucket::{Answer, Around, MemoryBucket, Request};
    use wasmkeep_types::{ActorId, AppName, ClassName};

    use super::*;

    /// Counts every request that is not a read.
    #[derive(Debug)]
    struct Watched {
        inner: MemoryBucket,
        writes: AtomicU64,
    }

    impl Around for Watched {
        fn inner(&self) -> &dyn Bucket {
            &self.inner
        }

        async fn around<T: Answer>(
            &self,
            request: Request<'_>,
            call: impl Future<Output = wasmkeep_bucket::Result<T>> + Send,
        ) -> wasmkeep_bucket::Result<T> {
            match request {
                Request::Get { .. }
                | Request::Head { .. }
                | Request::ListPage { .. }
                | Request::ListKeys { .. } => {}
                _ => {
                    self.writes.fetch_add(1, Ordering::SeqCst);
                }
            }
            call.await
        }
    }

    async fn put(bucket: &dyn Bucket, key: &str, text: &str) {
        bucket
            .put(key, Bytes::from(text.to_owned()))
            .await
            .expect("put");
    }

    async fn text(bucket: &dyn Bucket, key: &str) -> Option<String> {
        match bucket.get(key).await {
            Ok(o) => Some(String::from_utf8_lossy(&o.bytes).into_owned()),
            Err(BucketError::NotFound { .. }) => None,
            Err(e) => panic!("get {key}: {e}"),
        }
    }

    #[tokio::test]
    async fn a_backup_copies_the_apps_data_once_reads_only_the_source_and_leaves_the_nodes_own() {
        let keys = Keys::new(&AppName::new("app").expect("valid"));
        let actor = ActorId::parse("t/counter/a").expect("valid");
        let class = ClassName::new("counter").expect("valid");
        let source = Watched {
            inner: MemoryBucket::new(),
            writes: AtomicU64::new(0),
        };
        let log1 = keys.actor_log(&actor, 1);
        let snap1 = keys.actor_snapshot(&actor, 1);
        let current = keys.class_current(&class);
        let kept = [
            (log1.clone(), "record 1"),
            (snap1.clone(), "snapshot 1"),
            (current.clone(), "digest\n"),
            (keys.class_component(&class, "digest"), "component"),
            (keys.alarm(&actor), "1234"),
            (keys.secret("api-key"), "sealed"),
        ];
        let nodes_own = [
            keys.owners_prefix() + "t/counter/x",
            keys.nodes_prefix() + "n1",
            keys.control_prefix() + "move/x",
        ];
        for (key, value) in &kept {
            put(&source.inner, key, value).await;
        }
        for key in &nodes_own {
            put(&source.inner, key, "a node's").await;
        }
        let destination = MemoryBucket::new();

        let first = backup(&source, &destination, &keys)
            .await
            .expect("backed up");
        assert_eq!((first.objects, first.skipped), (kept.len() as u64, 0));
        for (key, value) in &kept {
            assert_eq!(
                text(&destination, key).await.as_deref(),
                Some(*value),
                "{key}"
            );
        }
        for key in &nodes_own {
            assert_eq!(
                text(&destination, key).await,
                None,
                "{key} is the nodes' own"
            );
        }

        // Again: the log is skipped, unchanged records are not rewritten.
        let log2 = keys.actor_log(&actor, 2);
        put(&source.inner, &log2, "record 2").await;
        put(&source.inner, &current, "digest2\n").await;
        // Compacted at the source: the backup keeps it.
        source.inner.delete(&log1).await.expect("deleted");
        let second = backup(&source, &destination, &keys)
            .await
            .expect("backed up");
        assert_eq!(
            second.objects, 2,
            "the new record and the changed class: {second:?}"
        );
        assert_eq!(second.skipped, 1, "the snapshot: {second:?}");
        assert_eq!(text(&destination, &log2).await.as_deref(), Some("record 2"));
        assert_eq!(
            text(&destination, &current).await.as_deref(),
            Some("digest2\n")
        );
        assert_eq!(text(&destination, &log1).await.as_deref(), Some("record 1"));

        assert_eq!(
            source.writes.load(Ordering::SeqCst),
            0,
            "the source was only read"
        );
    }
}

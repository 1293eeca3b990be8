//! Reading an actor back from the bucket: the newest snapshot, then every
//! log record after it, each verified before use.
//!
//! A listing can race with a compaction (a snapshot written, then the log
//! records it covers deleted): the log then seems to start late, or a listed
//! object is gone when read. Both are retried from a fresh listing a bounded
//! number of times; a gap that persists is corruption and is reported with
//! the key, never papered over.

use std::time::Duration;

use futures::StreamExt;
use wasmkeep_bucket::{Bucket, Error as BucketError, hinted};
use wasmkeep_types::{ActorId, Keys};

use crate::record::{self, Decoded, Kind};
use crate::vfs::{SharedPage, zero_page};
use crate::{Error, Result};

/// Fresh listings tried when the log races a compaction.
const RESTORE_LISTINGS_MAX: u32 = 4;
/// Objects read at once while restoring (applied in order): a restore after
/// 256 records costs about 256 / 16 bucket round trips, not 256.
const RESTORE_READS_IN_FLIGHT: usize = 16;
/// Attempts of one read while the bucket is unavailable.
const READ_ATTEMPTS_MAX: u32 = 5;
/// Wait before the second read attempt; doubles each attempt.
const READ_RETRY_BACKOFF: Duration = Duration::from_millis(10);

/// Runs one bucket read, retrying while the bucket is unavailable.
async fn read<T, F, Fut>(mut op: F) -> Result<T, BucketError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BucketError>>,
{
    let mut backoff = READ_RETRY_BACKOFF;
    let mut attempt = 1;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && attempt < READ_ATTEMPTS_MAX => {
                tracing::debug!(error = %e, "retrying a read");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The database image and log position an actor restores to.
#[derive(Debug)]
pub(crate) struct Restored {
    pub pages: Vec<SharedPage>,
    /// Last log record applied (0: none ever written).
    pub last_seq: u64,
    pub alarm_ms: Option<i64>,
    pub records_since_snapshot: u64,
    pub bytes_since_snapshot: u64,
}

/// What a listing says to read.
struct Plan {
    snapshot: Option<(u64, String)>,
    log: Vec<(u64, String, u64)>,
}

/// Why a plan could not be followed.
enum Failed {
    /// Retry with a fresh listing (a race with compaction).
    Race(Error),
    Fatal(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Fatal(e)
    }
}

async fn plan(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<Plan, Failed> {
    let snap_prefix = keys.actor_snapshot_prefix(actor);
    let log_prefix = keys.actor_log_prefix(actor);
    // One listing of the actor's whole prefix, not one per kind: a new
    // actor's restore is then one empty listing (one request, or one failed
    // folder lookup). A compaction between the two halves of the listing is
    // harmless: log records listed before a newer snapshot are skipped
    // (seq <= base), and a log that seems to start late is retried.
    let prefix = keys.actor_prefix(actor);
    let listed = read(|| hinted::list_keys(bucket, &prefix))
        .await
        .map_err(Error::from)?;
    let mut snapshot = None;
    let mut logs = Vec::new();
    for listed in listed {
        if listed.key.starts_with(&log_prefix) {
            logs.push(listed);
        } else if listed.key.starts_with(&snap_prefix) {
            let seq = parse_seq(&listed.key)?;
            if snapshot.as_ref().is_none_or(|(s, _)| seq > *s) {
                snapshot = Some((seq, listed.key));
            }
        } else {
            // Nothing else is written there; a newer version may add kinds.
            tracing::debug!(key = listed.key, "restore skips an unknown key");
        }
    }
    let base = snapshot.as_ref().map_or(0, |(s, _)| *s);
    let mut log = Vec::new();
    for listed in logs {
        let seq = parse_seq(&listed.key)?;
        if seq > base {
            log.push((seq, listed.key, listed.size));
        }
    }
    log.sort_by_key(|(s, ..)| *s);
    for (want, (seq, key, _)) in (base + 1..).zip(log.iter()) {
        if *seq != want {
            let missing = keys.actor_log(actor, want);
            return Err(Failed::Race(Error::Corrupt {
                key: missing,
                reason: format!("log record {want} is missing (the log continues at {key})"),
            }));
        }
    }
    Ok(Plan { snapshot, log })
}

fn parse_seq(key: &str) -> Result<u64> {
    Keys::parse_seq(key).map_err(|e| Error::Corrupt {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// Reads and verifies one object; a vanished object is a race.
async fn fetch(
    bucket: &dyn Bucket,
    key: &str,
    kind: Kind,
    seq: u64,
    actor: &ActorId,
) -> Result<Decoded, Failed> {
    let object = match read(|| bucket.get(key)).await {
        Ok(o) => o,
        Err(e @ BucketError::NotFound { .. }) => return Err(Failed::Race(e.into())),
        Err(e) => return Err(Failed::Fatal(e.into())),
    };
    let corrupt = |reason: String| {
        Failed::Fatal(Error::Corrupt {
            key: key.to_owned(),
            reason,
        })
    };
    let d = record::decode(&object.bytes).map_err(corrupt)?;
    if d.kind != kind {
        return Err(corrupt(format!(
            "holds a {:?}, expected a {kind:?}",
            d.kind
        )));
    }
    if d.seq != seq {
        return Err(corrupt(format!(
            "holds sequence number {}, its key says {seq}",
            d.seq
        )));
    }
    let id = actor.to_string();
    if d.actor != id {
        return Err(corrupt(format!(
            "belongs to actor {:?}, not {id:?}",
            d.actor
        )));
    }
    Ok(d)
}

fn apply(pages: &mut Vec<SharedPage>, d: Decoded) {
    pages.resize_with(d.db_pages as usize, zero_page);
    for (idx, page) in d.pages {
        pages[idx as usize] = page;
    }
}

async fn follow(bucket: &dyn Bucket, actor: &ActorId, plan: Plan) -> Result<Restored, Failed> {
    let mut pages = Vec::new();
    let mut alarm_ms = None;
    let mut last_seq = 0;
    if let Some((seq, key)) = &plan.snapshot {
        let d = fetch(bucket, key, Kind::Snapshot, *seq, actor).await?;
        alarm_ms = d.alarm_ms;
        last_seq = *seq;
        apply(&mut pages, d);
    }
    let mut bytes_since_snapshot = 0;
    let records_since_snapshot = plan.log.len() as u64;
    let reads: Vec<_> = plan
        .log
        .into_iter()
        .map(|(seq, key, size)| async move {
            fetch(bucket, &key, Kind::Log, seq, actor)
                .await
                .map(|d| (d, seq, key, size))
        })
        .collect();
    let mut records = futures::stream::iter(reads).buffered(RESTORE_READS_IN_FLIGHT);
    while let Some(fetched) = records.next().await {
        let (d, seq, key, size) = fetched?;
        tracing::trace!(key, node = %d.node, incarnation = %d.incarnation, "applying log record");
        alarm_ms = d.alarm_ms;
        last_seq = seq;
        bytes_since_snapshot += size;
        apply(&mut pages, d);
    }
    Ok(Restored {
        pages,
        last_seq,
        alarm_ms,
        records_since_snapshot,
        bytes_since_snapshot,
    })
}

/// Restores the actor's database image (empty when nothing was ever written).
pub(crate) async fn load(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<Restored> {
    retrying(|| async {
        let p = plan(bucket, keys, actor).await?;
        follow(bucket, actor, p).await
    })
    .await
}

/// The committed alarm: the newest record's header (or the snapshot's).
pub(crate) async fn alarm(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
) -> Result<Option<i64>> {
    retrying(|| async {
        let p = plan(bucket, keys, actor).await?;
        if let Some((seq, key, _)) = p.log.last() {
            return Ok(fetch(bucket, key, Kind::Log, *seq, actor).await?.alarm_ms);
        }
        if let Some((seq, key)) = &p.snapshot {
            return Ok(fetch(bucket, key, Kind::Snapshot, *seq, actor)
                .await?
                .alarm_ms);
        }
        Ok(None)
    })
    .await
}

async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failed>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(Failed::Fatal(e)) => return Err(e),
            Err(Failed::Race(e)) if tries >= RESTORE_LISTINGS_MAX => {
                return Err(match e {
                    Error::Bucket(BucketError::NotFound { key }) => Error::Corrupt {
                        key,
                        reason: "listed but missing on every read".into(),
                    },
                    other => other,
                });
            }
            Err(Failed::Race(e)) => {
                tracing::debug!(error = %e, "restore raced a compaction; listing again");
            }
        }
    }
}

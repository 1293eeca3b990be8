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
use wasmkeep_bucket::{Bucket, Error as BucketError, Listed, hinted};
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
    // The snapshots, then the log after the newest (a new actor: two empty
    // listings). A compaction between the two is harmless: a log that
    // seems to start late is retried.
    let listed = read(|| list_newest(bucket, keys, actor))
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
    unbroken(keys, actor, base, &log)?;
    Ok(Plan { snapshot, log })
}

/// Whether `log` (sorted) runs on from `base` without a gap; a gap is a
/// race with a compaction (listed again) until it persists.
fn unbroken(
    keys: &Keys,
    actor: &ActorId,
    base: u64,
    log: &[(u64, String, u64)],
) -> Result<(), Failed> {
    for (want, (seq, key, _)) in (base + 1..).zip(log) {
        if *seq != want {
            return Err(Failed::Race(Error::Corrupt {
                key: keys.actor_log(actor, want),
                reason: format!("log record {want} is missing (the log continues at {key})"),
            }));
        }
    }
    Ok(())
}

/// What a restore of the newest state lists: the actor's snapshots, then
/// its log after the newest one, not every record its retention window
/// keeps (ADR 0076). A compaction in between shows as a log that starts
/// late: a race, listed again.
async fn list_newest(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
) -> Result<Vec<Listed>, BucketError> {
    let mut listed = hinted::list_keys(bucket, &keys.actor_snapshot_prefix(actor)).await?;
    let newest = listed
        .iter()
        .filter_map(|l| Keys::parse_seq(&l.key).ok())
        .max();
    let log_prefix = keys.actor_log_prefix(actor);
    let log = match newest {
        Some(seq) => {
            hinted::list_keys_after(bucket, &log_prefix, &keys.actor_log(actor, seq)).await?
        }
        None => hinted::list_keys(bucket, &log_prefix).await?,
    };
    listed.extend(log);
    Ok(listed)
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

/// Reads the plan's snapshot, then applies its whole log.
async fn follow(bucket: &dyn Bucket, actor: &ActorId, plan: Plan) -> Result<Restored, Failed> {
    let base = match &plan.snapshot {
        Some((seq, key)) => Some(fetch(bucket, key, Kind::Snapshot, *seq, actor).await?),
        None => None,
    };
    follow_until(bucket, actor, base, plan.log, i64::MAX).await
}

/// Restores the actor's database image (empty when nothing was ever written).
pub(crate) async fn load(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<Restored> {
    retrying(|| async {
        let p = plan(bucket, keys, actor).await?;
        follow(bucket, actor, p).await
    })
    .await
}

/// Restores the actor's database as it was at `at_ms` (ADR 0076): the
/// newest snapshot at or before it, then the log after that snapshot for
/// as long as its records are at or before it (a prefix of the log: every
/// write acknowledged by then, nothing committed after). An instant before
/// the oldest snapshot is restorable only while the log still starts at
/// its first record (the empty database before it).
pub(crate) async fn load_at(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    at_ms: i64,
) -> Result<Restored> {
    retrying(|| async {
        let (base, log) = plan_at(bucket, keys, actor, at_ms).await?;
        follow_until(bucket, actor, base, log, at_ms).await
    })
    .await
}

/// The snapshot a restore to `at_ms` starts from (read), and the records
/// after it.
async fn plan_at(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    at_ms: i64,
) -> Result<(Option<Decoded>, Vec<(u64, String, u64)>), Failed> {
    let prefix = keys.actor_prefix(actor);
    let listed = read(|| hinted::list_keys(bucket, &prefix))
        .await
        .map_err(Error::from)?;
    let (snap_prefix, log_prefix) = (
        keys.actor_snapshot_prefix(actor),
        keys.actor_log_prefix(actor),
    );
    let mut snapshots = Vec::new();
    let mut log = Vec::new();
    for listed in listed {
        if listed.key.starts_with(&snap_prefix) {
            snapshots.push((parse_seq(&listed.key)?, listed.key));
        } else if listed.key.starts_with(&log_prefix) {
            log.push((parse_seq(&listed.key)?, listed.key, listed.size));
        }
    }
    snapshots.sort_by_key(|(s, _)| *s);
    log.sort_by_key(|(s, ..)| *s);
    // The base: the newest snapshot at or before the instant, found by a
    // binary search over the numbers (times grow with them), so a restore
    // far back in a long window reads a few snapshots, not every one.
    let (mut lo, mut hi) = (0, snapshots.len());
    let mut oldest_ms = None;
    let mut base: Option<Decoded> = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let (seq, key) = &snapshots[mid];
        let d = fetch(bucket, key, Kind::Snapshot, *seq, actor).await?;
        if mid == 0 {
            oldest_ms = Some(d.time_ms);
        }
        if d.time_ms <= at_ms {
            lo = mid + 1;
            base = Some(d);
        } else {
            hi = mid;
        }
    }
    let base_seq = base.as_ref().map_or(0, |d| d.seq);
    log.retain(|(s, ..)| *s > base_seq);
    // Before every snapshot, the instant needs the log from its first
    // record: gone (compacted) means outside the window.
    let from_start = log
        .first()
        .map_or(snapshots.is_empty(), |(first, ..)| *first == 1);
    if base.is_none() && !from_start {
        return Err(Failed::Fatal(Error::NotRestorable {
            actor: actor.clone(),
            at_ms,
            oldest_ms,
        }));
    }
    unbroken(keys, actor, base_seq, &log)?;
    Ok((base, log))
}

/// Applies `base` (a snapshot read), then the records of `log` in order
/// while they are at or before `at_ms`.
async fn follow_until(
    bucket: &dyn Bucket,
    actor: &ActorId,
    base: Option<Decoded>,
    log: Vec<(u64, String, u64)>,
    at_ms: i64,
) -> Result<Restored, Failed> {
    let mut pages = Vec::new();
    let mut alarm_ms = None;
    let mut last_seq = 0;
    if let Some(d) = base {
        alarm_ms = d.alarm_ms;
        last_seq = d.seq;
        apply(&mut pages, d);
    }
    let (mut records_since_snapshot, mut bytes_since_snapshot) = (0, 0);
    let reads: Vec<_> = log
        .into_iter()
        .map(|(seq, key, size)| async move {
            fetch(bucket, &key, Kind::Log, seq, actor)
                .await
                .map(|d| (d, size))
        })
        .collect();
    let mut records = futures::stream::iter(reads).buffered(RESTORE_READS_IN_FLIGHT);
    while let Some(fetched) = records.next().await {
        let (d, size) = fetched?;
        if d.time_ms > at_ms {
            break;
        }
        tracing::trace!(seq = d.seq, node = %d.node, incarnation = %d.incarnation, "applying log record");
        alarm_ms = d.alarm_ms;
        last_seq = d.seq;
        records_since_snapshot += 1;
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

/// One record or snapshot of an actor's log, as `actor history` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub snapshot: bool,
    /// When it was sealed (0: written before records had times).
    pub time_ms: i64,
    pub bytes: u64,
    /// The node that wrote it.
    pub node: String,
}

/// Every record and snapshot of the actor's log, oldest first (snapshots
/// before the record of the same number), each read and verified.
pub(crate) async fn history(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
) -> Result<Vec<Entry>> {
    retrying(|| async {
        let prefix = keys.actor_prefix(actor);
        let listed = read(|| hinted::list_keys(bucket, &prefix))
            .await
            .map_err(Error::from)?;
        let snap_prefix = keys.actor_snapshot_prefix(actor);
        let log_prefix = keys.actor_log_prefix(actor);
        let mut wanted = Vec::new();
        for listed in listed {
            let kind = if listed.key.starts_with(&snap_prefix) {
                Kind::Snapshot
            } else if listed.key.starts_with(&log_prefix) {
                Kind::Log
            } else {
                continue;
            };
            wanted.push((parse_seq(&listed.key)?, kind == Kind::Log, kind, listed));
        }
        // By number, a snapshot before the record it holds up to.
        wanted.sort_by_key(|(seq, is_log, ..)| (*seq, *is_log));
        let reads: Vec<_> = wanted
            .into_iter()
            .map(|(seq, _, kind, listed)| async move {
                let d = fetch(bucket, &listed.key, kind, seq, actor).await?;
                Ok::<_, Failed>(Entry {
                    seq,
                    snapshot: kind == Kind::Snapshot,
                    time_ms: d.time_ms,
                    bytes: listed.size,
                    node: d.node,
                })
            })
            .collect();
        let mut entries = Vec::with_capacity(reads.len());
        let mut reads = futures::stream::iter(reads).buffered(RESTORE_READS_IN_FLIGHT);
        while let Some(entry) = reads.next().await {
            entries.push(entry?);
        }
        Ok(entries)
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

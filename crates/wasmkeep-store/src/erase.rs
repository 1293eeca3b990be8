//! Emptying an actor's database for good (`wasmkeep actor delete`, ADR 0055),
//! or putting another in its place (`wasmkeep actor import`, ADR 0069).
//!
//! Fencing rests on a log sequence number never being written twice: a
//! former holder that was paused past its lease learns that it is stale
//! when the record it writes next already exists. Deleting the log would
//! free those numbers, and the former holder's next record would land and
//! be restored on top of the actor's next life. So [`replace`] frees none:
//! it extends the log with a record of the whole new database (no pages for
//! a delete) at the next free number, which fences every former writer,
//! then writes a snapshot of it at that number, which leaves everything
//! before it unread, and only then deletes what is before it. The record
//! carries every page, not only a page count: should the snapshot not be
//! written, the log alone restores the new database. From then on the
//! actor restores as the new database whose log goes on after the fence;
//! the actor's next life compacts the two objects away like any others.

use wasmkeep_bucket::{Bucket, hinted};
use wasmkeep_types::{ActorId, Keys};

use crate::image::Image;
use crate::record::{self, Header, Kind};
use crate::store::FailureKind;
use crate::store::write::{Haste, delete_all, put_settled};
use crate::{Error, Result, StoreConfig, WriterId};

/// Fences tried while a former holder keeps extending the log (each of its
/// records costs it a round trip, and it stops at its lease's end).
const FENCE_ATTEMPTS_MAX: u32 = 8;

/// Empties `actor`'s database in the bucket so that no former writer can
/// add to it: [`replace`] with [`Image::empty`], except that what was
/// before goes whatever the retention window: a delete is for good.
pub async fn erase(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    writer: &WriterId,
    config: &StoreConfig,
) -> Result<u64> {
    let fence = put_in_place(bucket, keys, actor, writer, config, &Image::empty()).await?;
    delete_before(bucket, keys, actor, fence).await?;
    Ok(fence)
}

/// Puts `image` in place of `actor`'s database in the bucket so that no
/// former writer can add to it (see the module). The caller holds the
/// actor's ownership record and has no store of it open. Returns the
/// fence's sequence number, the first of the new database's log.
///
/// With a retention window (ADR 0076) the database it replaced stays in
/// the log, restorable, until compaction ages it out: a restore is undone
/// by another. Without one, what is before the fence is deleted.
pub async fn replace(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    writer: &WriterId,
    config: &StoreConfig,
    image: &Image,
) -> Result<u64> {
    let fence = put_in_place(bucket, keys, actor, writer, config, image).await?;
    if config.retention.is_zero() {
        delete_before(bucket, keys, actor, fence).await?;
    }
    Ok(fence)
}

/// Writes the fence record and the snapshot of `image` at the next free
/// number; returns that number.
async fn put_in_place(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    writer: &WriterId,
    config: &StoreConfig,
    image: &Image,
) -> Result<u64> {
    let mut attempts = 0;
    let (fence, time_ms) = loop {
        attempts += 1;
        let seq = newest_seq(bucket, keys, actor).await? + 1;
        let key = keys.actor_log(actor, seq);
        let time_ms = config.clock.wall_ms();
        let body = whole(Kind::Log, seq, actor, writer, image, time_ms);
        match put_settled(bucket, &key, body, config, Haste::Hurried).await {
            Ok(()) => break (seq, time_ms),
            // A former holder's record landed since the listing.
            Err(FailureKind::Fenced) if attempts < FENCE_ATTEMPTS_MAX => {}
            Err(FailureKind::Fenced) => {
                return Err(Error::Fenced {
                    actor: actor.clone(),
                    seq,
                });
            }
            Err(FailureKind::Broken(reason) | FailureKind::Unsettled(reason)) => {
                return Err(Error::Broken {
                    actor: actor.clone(),
                    seq,
                    reason: format!("replacing fence: {reason}"),
                });
            }
        }
    };
    let key = keys.actor_snapshot(actor, fence);
    let body = whole(Kind::Snapshot, fence, actor, writer, image, time_ms);
    if let Err(kind) = put_settled(bucket, &key, body, config, Haste::Hurried).await {
        return Err(Error::Broken {
            actor: actor.clone(),
            seq: fence,
            reason: format!("replacing snapshot: {kind:?}"),
        });
    }
    Ok(fence)
}

/// Deletes the actor's records and snapshots before `fence`: unread from
/// now on, so the deletes need not be durable.
async fn delete_before(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    fence: u64,
) -> Result<()> {
    let dead = hinted::list_keys(bucket, &keys.actor_prefix(actor))
        .await?
        .into_iter()
        .filter(|listed| seq_of(keys, actor, &listed.key).is_some_and(|s| s < fence))
        .map(|listed| listed.key)
        .collect();
    delete_all(bucket, dead).await?;
    Ok(())
}

/// The highest sequence number among the actor's log records and
/// snapshots (0: none).
async fn newest_seq(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<u64> {
    Ok(hinted::list_keys(bucket, &keys.actor_prefix(actor))
        .await?
        .iter()
        .filter_map(|listed| seq_of(keys, actor, &listed.key))
        .max()
        .unwrap_or(0))
}

/// The sequence number of a log record's or snapshot's key.
fn seq_of(keys: &Keys, actor: &ActorId, key: &str) -> Option<u64> {
    let ours = key.starts_with(&keys.actor_log_prefix(actor))
        || key.starts_with(&keys.actor_snapshot_prefix(actor));
    ours.then(|| Keys::parse_seq(key).ok()).flatten()
}

/// A record or snapshot holding every page of `image`, and its alarm.
fn whole(
    kind: Kind,
    seq: u64,
    actor: &ActorId,
    writer: &WriterId,
    image: &Image,
    time_ms: i64,
) -> bytes::Bytes {
    record::encode(
        &Header {
            kind,
            seq,
            db_pages: image.db_pages(),
            alarm_ms: image.alarm_ms(),
            time_ms,
            actor: &actor.to_string(),
            node: &writer.node,
            incarnation: &writer.incarnation,
        },
        image.pages().iter().enumerate().map(|(i, page)| {
            (
                u32::try_from(i).expect("bounded by the database maximum"),
                &**page,
            )
        }),
    )
}

//! Snapshots and compaction: the snapshot writer task writes the newest
//! image offered and then deletes what it covers, paced to the actor's own
//! writes (ADR 0027, ADR 0031, ADR 0042).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use wasmkeep_bucket::hinted;
use wasmkeep_types::Keys;

use crate::record::{self, Header, Kind};
use crate::vfs::SharedPage;
use crate::{Error, Result};

use super::write::{Haste, delete_all, put_settled};
use super::{Progress, Shared};

pub(super) struct Snapshot {
    pub(super) seq: u64,
    pub(super) alarm_ms: Option<i64>,
    /// The time of the record at `seq`, whose state it holds.
    pub(super) time_ms: i64,
    pub(super) image: Vec<SharedPage>,
    /// How it is put ([`Haste::Unhurried`] when no one waits for it).
    pub(super) haste: Haste,
}

/// The next snapshot to write: one slot, the newest image wins. A snapshot
/// waiting while an older one is written is replaced by a newer one (which
/// covers more), so the writer never falls behind by more than one.
#[derive(Default)]
pub(super) struct SnapshotSlot {
    next: Mutex<Option<Snapshot>>,
    /// Set when the flusher has exited: no more snapshots will come.
    done: std::sync::atomic::AtomicBool,
    wake: Notify,
}

impl SnapshotSlot {
    pub(super) fn offer(&self, shared: &Shared, snap: Snapshot) {
        let replaced = self.next.lock().replace(snap);
        match replaced {
            Some(old) => {
                tracing::debug!(actor = %shared.actor, seq = old.seq, "snapshot superseded before it was written")
            }
            None => shared.progress.send_modify(|p| p.snapshots_pending += 1),
        }
        self.wake.notify_one();
    }

    pub(super) fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

/// Writes snapshots one at a time, then deletes what they cover. A failure
/// here loses nothing (the log is still whole): it is logged and the next
/// threshold tries again.
pub(super) async fn snapshot_writer(shared: Arc<Shared>, slot: Arc<SnapshotSlot>) {
    let mut known: Option<Known> = None;
    loop {
        let next = slot.next.lock().take();
        let Some(snap) = next else {
            if slot.done.load(Ordering::SeqCst) {
                return;
            }
            slot.wake.notified().await;
            continue;
        };
        let written = Box::pin(write_snapshot(&shared, &snap)).await;
        // A flush (hand-over, hibernation) waits for the snapshot, not for
        // the cleanup of what it covers.
        shared.progress.send_modify(|p| p.snapshots_pending -= 1);
        // Even one that failed may be in the bucket (the reply was lost).
        if let Some(known) = &mut known {
            known.snapshots.push((snap.seq, snap.time_ms));
        }
        match written {
            Ok(()) => {
                if let Err(e) = Box::pin(compact(
                    &shared,
                    &slot,
                    &mut known,
                    (snap.seq, snap.time_ms),
                ))
                .await
                {
                    tracing::warn!(actor = %shared.actor, seq = snap.seq, error = %e, "compaction after a snapshot failed; the next one retries");
                }
            }
            Err(e) => {
                tracing::warn!(actor = %shared.actor, seq = snap.seq, error = %e, "snapshot not written");
            }
        }
    }
}

/// What a compaction knows to delete without listing: everything this
/// store wrote after the last compaction that succeeded.
struct Known {
    /// Every log record up to this one is deleted; each after it was
    /// written by this store. `None`: not known (a listing found a base
    /// to keep and no record was listed); the next deleting compaction
    /// lists the records.
    records_deleted_through: Option<u64>,
    /// Snapshots that may be in the bucket, oldest first, with their times.
    snapshots: Vec<(u64, i64)>,
    /// Compactions since the last one that listed.
    unlisted: u32,
}

/// A compaction lists the actor's keys once in this many (and always the
/// first after the store opened): records a listing finds that the store
/// does not know of are leftovers of an earlier writer, such as a
/// compaction cut short by a crash, or a snapshot that a writer whose lease
/// ran out wrote after the restore listed. Between listings a compaction
/// deletes what this store wrote, which costs no listing (two per
/// snapshot, with a snapshot every eight records of a small database).
const COMPACTIONS_PER_LISTING: u32 = 64;

async fn write_snapshot(shared: &Shared, snap: &Snapshot) -> Result<()> {
    let header = Header {
        kind: Kind::Snapshot,
        seq: snap.seq,
        db_pages: u32::try_from(snap.image.len()).expect("bounded by max_page_count"),
        alarm_ms: snap.alarm_ms,
        time_ms: snap.time_ms,
        actor: &shared.actor_text,
        node: &shared.writer.node,
        incarnation: &shared.writer.incarnation,
    };
    let body = record::encode(
        &header,
        snap.image.iter().enumerate().map(|(i, p)| (i as u32, &**p)),
    );
    let key = shared.keys.actor_snapshot(&shared.actor, snap.seq);
    match put_settled(&*shared.bucket, &key, body, &shared.config, snap.haste).await {
        Ok(()) => {}
        Err(kind) => {
            return Err(Error::Broken {
                actor: shared.actor.clone(),
                seq: snap.seq,
                reason: format!("snapshot: {kind:?}"),
            });
        }
    }
    Ok(())
}

/// Deletes the records and snapshots that a durable snapshot makes
/// needless: with no retention window, everything the snapshot at `seq`
/// covers; with one (ADR 0076), everything before the newest snapshot at
/// least the window old (the base: any instant in the window is rebuilt
/// from it or a later snapshot, and the records after it), and nothing
/// while no snapshot is that old. What to delete comes from what `known`
/// names, or from a listing (see [`COMPACTIONS_PER_LISTING`]); `known`
/// then says what is left.
/// Older snapshots go at once; log records as many as this actor writes
/// meanwhile (sixteen at a time), the rest at once when a newer snapshot waits, the store
/// closes, or the actor writes nothing for [`COMPACTION_IDLE`]. Paced, a
/// node's deletes follow its writes: many actors that reach their snapshot
/// together (a uniform load) would otherwise delete a quarter of a million
/// files within seconds, more than the folder bucket keeps for reuse, and
/// every file created in the next minutes on ext4 without a journal scans
/// past the inodes freed (ADR 0027). A restore racing it lists again.
async fn compact(
    shared: &Shared,
    slot: &SnapshotSlot,
    known: &mut Option<Known>,
    (seq, time_ms): (u64, i64),
) -> Result<()> {
    let bucket = &*shared.bucket;
    let listing = known
        .as_ref()
        .is_none_or(|k| k.unlisted + 1 >= COMPACTIONS_PER_LISTING);
    // Every snapshot that may be in the bucket up to `seq`, with its time.
    let snapshots: Vec<(u64, i64)> = match known.as_ref() {
        Some(k) if !listing => k.snapshots.clone(),
        _ => {
            let listed: Vec<u64> =
                hinted::list_keys(bucket, &shared.keys.actor_snapshot_prefix(&shared.actor))
                    .await?
                    .into_iter()
                    .filter_map(|listed| Keys::parse_seq(&listed.key).ok())
                    .filter(|s| *s < seq)
                    .collect();
            let mut timed = vec![(seq, time_ms)];
            for s in listed {
                let cached = known
                    .as_ref()
                    .and_then(|k| k.snapshots.iter().find(|(k, _)| *k == s));
                match cached {
                    Some(pair) => timed.push(*pair),
                    // Without a window only the numbers matter.
                    None if shared.config.retention.is_zero() => timed.push((s, i64::MIN)),
                    None => {
                        if let Some(time) = snapshot_time(shared, s).await? {
                            timed.push((s, time));
                        }
                    }
                }
            }
            timed.sort_unstable();
            timed
        }
    };
    let unlisted = match known.as_ref() {
        Some(k) if !listing => k.unlisted + 1,
        _ => 0,
    };
    let Some(base) = base(&snapshots, seq, time_ms, shared) else {
        // No snapshot is the window old yet: everything is kept.
        let mut kept = snapshots;
        if !kept.iter().any(|(s, _)| *s == seq) {
            kept.push((seq, time_ms));
        }
        let records_deleted_through = match known.as_ref() {
            Some(k) if !listing => k.records_deleted_through,
            _ => None,
        };
        *known = Some(Known {
            records_deleted_through,
            snapshots: kept,
            unlisted,
        });
        return Ok(());
    };
    let deleted_through = known
        .as_ref()
        .filter(|_| !listing)
        .and_then(|k| k.records_deleted_through);
    let records: Vec<u64> = match deleted_through {
        Some(through) => (through + 1..=base).collect(),
        None => {
            let mut records: Vec<u64> =
                hinted::list_keys(bucket, &shared.keys.actor_log_prefix(&shared.actor))
                    .await?
                    .into_iter()
                    .filter_map(|listed| Keys::parse_seq(&listed.key).ok())
                    .filter(|s| *s <= base)
                    .collect();
            records.sort_unstable();
            records
        }
    };
    let dead_snapshots = snapshots
        .iter()
        .filter(|(s, _)| *s < base)
        .map(|(s, _)| shared.keys.actor_snapshot(&shared.actor, *s))
        .collect();
    delete_all(bucket, dead_snapshots).await?;
    let record_key = |s: &u64| Keys::log_under(&shared.log_prefix, *s);
    let mut progress = shared.progress.subscribe();
    let start = progress.borrow_and_update().durable_seq;
    // Sixteen at a time (one batch for the folder bucket's committer), the
    // n-th sixteen once n x 16 records were written since.
    for (n, chunk) in records.chunks(COMPACTION_DELETES_PER_STEP).enumerate() {
        let done = n * COMPACTION_DELETES_PER_STEP;
        if !paced(&mut progress, slot, start + done as u64).await {
            delete_all(bucket, records[done..].iter().map(record_key).collect()).await?;
            break;
        }
        delete_all(bucket, chunk.iter().map(record_key).collect()).await?;
    }
    // Everything up to `base` is gone; what is after it and what this
    // store writes from now on is all there is.
    let mut snapshots_left = snapshots;
    if !snapshots_left.iter().any(|(s, _)| *s == seq) {
        snapshots_left.push((seq, time_ms));
    }
    snapshots_left.retain(|(s, _)| *s >= base);
    snapshots_left.sort_unstable();
    *known = Some(Known {
        records_deleted_through: Some(base),
        snapshots: snapshots_left,
        unlisted,
    });
    Ok(())
}

/// The snapshot everything before can go: the newest at least the
/// retention window old (by its time), `seq` itself without a window.
fn base(snapshots: &[(u64, i64)], seq: u64, time_ms: i64, shared: &Shared) -> Option<u64> {
    let retention = shared.config.retention;
    if retention.is_zero() {
        return Some(seq);
    }
    let window = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = shared.config.clock.wall_ms().saturating_sub(window);
    snapshots
        .iter()
        .chain(std::iter::once(&(seq, time_ms)))
        .filter(|(_, t)| *t <= cutoff)
        .map(|(s, _)| *s)
        .max()
}

/// The time of a snapshot this store did not write, from its header;
/// `None` when it is gone since the listing.
async fn snapshot_time(shared: &Shared, seq: u64) -> Result<Option<i64>> {
    let key = shared.keys.actor_snapshot(&shared.actor, seq);
    let object = match shared.bucket.get(&key).await {
        Ok(object) => object,
        Err(wasmkeep_bucket::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    record::decode(&object.bytes)
        .map(|d| Some(d.time_ms))
        .map_err(|reason| Error::Corrupt { key, reason })
}

/// Waits until the actor's records up to `due` are durable: `true`; `false`
/// when compaction should rather finish at once (see [`compact`]).
async fn paced(progress: &mut watch::Receiver<Progress>, slot: &SnapshotSlot, due: u64) -> bool {
    // One timer per call, looked at when it fires (not re-armed at every
    // record): idle means no record became durable since it was armed.
    let idle = tokio::time::sleep(COMPACTION_IDLE);
    tokio::pin!(idle);
    let mut armed_at = progress.borrow().durable_seq;
    loop {
        if slot.next.lock().is_some() || slot.done.load(Ordering::SeqCst) {
            return false;
        }
        let durable = {
            let now = progress.borrow_and_update();
            if now.failure.is_some() {
                return false;
            }
            now.durable_seq
        };
        if durable >= due {
            return true;
        }
        // A newer snapshot or the store's close also wake the slot; the
        // snapshot writer looks at both again before it waits.
        tokio::select! {
            changed = progress.changed() => if changed.is_err() { return false },
            () = slot.wake.notified() => {}
            () = &mut idle => {
                let durable = progress.borrow().durable_seq;
                if durable == armed_at {
                    return false;
                }
                armed_at = durable;
                idle.as_mut().reset(tokio::time::Instant::now() + COMPACTION_IDLE);
            }
        }
    }
}

/// How many records a paced compaction deletes per step.
const COMPACTION_DELETES_PER_STEP: usize = 16;
/// A paced compaction (see [`compact`]) of an actor that wrote nothing for
/// this long deletes the rest at once.
const COMPACTION_IDLE: Duration = Duration::from_secs(1);

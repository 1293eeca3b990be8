//! The flusher, one task per store: writes the queued log records one at a
//! time, in order, lingering for the writers the last record released
//! (group commit), keeps the alarm index in step, and hands a record's
//! image to the snapshot writer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_types::Keys;

use crate::Result;
use crate::record::{self, Header, Kind};

use super::snapshots::{Snapshot, SnapshotSlot};
use super::write::{Haste, delete_retrying, put_retrying, put_settled};
use super::{Failure, FailureKind, Pending, Shared};

/// Longest the next record waits for the writers whose events the last
/// record released (see `write_records`).
const LINGER_TIME_MAX: Duration = Duration::from_micros(500);

pub(super) async fn flusher(
    shared: Arc<Shared>,
    durable_alarm: Option<i64>,
    snapshots: Arc<SnapshotSlot>,
) {
    write_records(&shared, durable_alarm, &snapshots).await;
    snapshots.finish();
}

/// What the flusher does next.
enum Next {
    /// The record, and how it is put.
    Write(Pending, Haste),
    /// Nothing queued: wait for a commit.
    Idle,
    /// Linger: more events are expected for the queued record (see
    /// [`LINGER_TIME_MAX`]); wait for a commit or the deadline.
    Linger(tokio::time::Instant),
}

/// Writes queued records until the store is closed and drained, or a record fails.
///
/// Group commit lingers: when a record of `k` events becomes durable while
/// `q` events wait for the next one, the `k` writers whose responses it
/// releases usually send their next events within microseconds. Starting
/// the next record at once would carry only the `q` and leave the `k` for
/// the record after, splitting the writers into two alternating groups
/// (half the events per record). So the next record waits until it holds
/// `k + q` events, or [`LINGER_TIME_MAX`] passed. A lone writer (`k = 1`,
/// `q = 0`) never waits: its next event is the whole group.
async fn write_records(
    shared: &Arc<Shared>,
    mut durable_alarm: Option<i64>,
    snapshots: &SnapshotSlot,
) {
    // (events expected in the next record, until when to wait for them)
    // Tokio's clock, so that the simulation's virtual time drives it.
    let mut linger: Option<(u32, tokio::time::Instant)> = None;
    loop {
        let next = {
            let mut st = shared.state.lock();
            if st.failure.is_some() {
                return;
            }
            // The linger still on: the one queued record is short of the
            // events expected and the deadline has not passed.
            let lingering = match (st.queue.front(), linger) {
                (Some(front), Some((expected, until)))
                    if !st.closed
                        && st.queue.len() == 1
                        && front.events < expected
                        && tokio::time::Instant::now() < until =>
                {
                    Some((expected, until))
                }
                _ => None,
            };
            st.lingering_for = lingering.map(|(expected, _)| expected);
            match lingering {
                Some((_, until)) => Next::Linger(until),
                None => match st.queue.pop_front() {
                    // One event, nothing behind it: its writer waits for
                    // this record alone (ADR 0045).
                    Some(p) if p.events == 1 && st.queue.is_empty() => Next::Write(p, Haste::Alone),
                    Some(p) => Next::Write(p, Haste::Hurried),
                    None if st.closed => return,
                    None => Next::Idle,
                },
            }
        };
        let (rec, haste) = match next {
            Next::Write(rec, haste) => (rec, haste),
            Next::Idle => {
                shared.wake.notified().await;
                continue;
            }
            Next::Linger(until) => {
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(until) => {}
                }
                continue;
            }
        };
        // Boxed (and the snapshot writer's steps): these tasks live as long
        // as the store, mostly idle, and an inline bucket write sized each
        // of their futures at ~900 bytes (ADR 0038).
        let time_ms = shared.config.clock.wall_ms();
        match Box::pin(write_record(
            shared,
            &rec,
            time_ms,
            haste,
            &mut durable_alarm,
        ))
        .await
        {
            Ok(()) => {
                let queued: u32 = shared.state.lock().queue.iter().map(|p| p.events).sum();
                let lingers = rec.events + queued >= 2;
                linger = lingers.then(|| {
                    (
                        rec.events + queued,
                        tokio::time::Instant::now() + LINGER_TIME_MAX,
                    )
                });
                if let Some(image) = rec.image {
                    let snap = Snapshot {
                        seq: rec.seq,
                        alarm_ms: rec.alarm_ms,
                        time_ms,
                        image,
                        // A lone writer's next record comes at once: the
                        // snapshot goes with it. One that lingers may come
                        // only after the snapshot could have been flushed
                        // on its own (ADR 0041).
                        haste: if lingers {
                            Haste::Hurried
                        } else {
                            Haste::Unhurried
                        },
                    };
                    snapshots.offer(shared, snap);
                }
                shared.progress.send_modify(|p| p.durable_seq = rec.seq);
            }
            Err(kind) => {
                let failure = Failure { seq: rec.seq, kind };
                tracing::warn!(actor = %shared.actor, seq = rec.seq, failure = ?failure.kind, "log record failed; store unusable");
                {
                    let mut st = shared.state.lock();
                    st.failure = Some(failure.clone());
                    st.queue.clear();
                }
                shared.progress.send_modify(|p| p.failure = Some(failure));
                return;
            }
        }
    }
}

async fn write_record(
    shared: &Shared,
    rec: &Pending,
    time_ms: i64,
    haste: Haste,
    durable_alarm: &mut Option<i64>,
) -> Result<(), FailureKind> {
    let header = Header {
        kind: Kind::Log,
        seq: rec.seq,
        db_pages: rec.db_pages,
        alarm_ms: rec.alarm_ms,
        time_ms,
        actor: &shared.actor_text,
        node: &shared.writer.node,
        incarnation: &shared.writer.incarnation,
    };
    let body = record::encode(&header, rec.pages.iter().map(|(i, p)| (*i, &**p)));
    let alarm_key = || shared.keys.alarm(&shared.actor);
    // Alarm index before a record that sets the alarm: the sweep may then see
    // an alarm that is not committed (it checks), never miss one that is.
    if let Some(at) = rec.alarm_ms
        && rec.alarm_ms != *durable_alarm
    {
        put_retrying(
            &*shared.bucket,
            &alarm_key(),
            Bytes::from(at.to_string()),
            &shared.config,
        )
        .await
        .map_err(|e| FailureKind::Broken(format!("alarm index not written: {e}")))?;
    }
    let key = Keys::log_under(&shared.log_prefix, rec.seq);
    put_settled(&*shared.bucket, &key, body, &shared.config, haste).await?;
    let before = std::mem::replace(durable_alarm, rec.alarm_ms);
    // ... and deleted only after the record that clears it.
    if rec.alarm_ms.is_none()
        && before.is_some()
        && let Err(e) = delete_retrying(&*shared.bucket, &alarm_key(), &shared.config).await
    {
        tracing::warn!(actor = %shared.actor, error = %e, "alarm index not deleted; the sweep will find no alarm");
    }
    Ok(())
}

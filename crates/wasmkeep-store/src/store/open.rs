//! Opening an [`ActorStore`] (restore from the bucket, the alarm index put
//! back, the flusher and the snapshot writer started) and closing it
//! (waiting for them), and the reads that need no open store.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use wasmkeep_bucket::Bucket;
use wasmkeep_types::{ActorId, Keys};

use crate::restore;
use crate::sql::Guard;
use crate::vfs::{MemFile, SharedFile};
use crate::{Error, Result, StoreConfig, WriterId};

use super::connection::{open_connection, read_alarm_table};
use super::flusher::flusher;
use super::snapshots::{SnapshotSlot, snapshot_writer};
use super::write::put_retrying;
use super::{ActorStore, FlushState, Progress, Shared};

static DB_NAMES: AtomicU64 = AtomicU64::new(0);

/// What a store that writes nothing reads.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// The state as the bucket holds it.
    Now,
    /// The state at this instant (wall-clock ms).
    At(i64),
}

impl ActorStore {
    /// Restores from the bucket (newest snapshot + log after it); creates an
    /// empty database if the actor has no data. Must run inside a tokio
    /// runtime (the flusher is a task).
    pub async fn open(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        actor: ActorId,
        writer: WriterId,
        config: StoreConfig,
    ) -> Result<Self> {
        Self::open_as(bucket, keys, actor, writer, config, None).await
    }

    /// Restores the actor's state as the bucket holds it, for reading only
    /// (`wasmkeep actor sql` and `actor export`, ADR 0065): nothing of this
    /// store ever writes to the bucket (no flusher, no alarm index), and it
    /// runs only read-only statements. Every acknowledged write of the
    /// actor is in the bucket, so this is the state some moment after the
    /// last acknowledged write, whoever holds the actor.
    pub async fn open_reader(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        actor: ActorId,
        config: StoreConfig,
    ) -> Result<Self> {
        Self::open_as(
            bucket,
            keys,
            actor,
            Self::reader(),
            config,
            Some(Reading::Now),
        )
        .await
    }

    /// As [`ActorStore::open_reader`], the actor's state as it was at
    /// `at_ms` (wall-clock milliseconds), rebuilt from the log's records
    /// and snapshots (ADR 0076): `actor restore`, `actor fork` and
    /// `actor export --at`. An instant the log no longer holds is
    /// [`Error::NotRestorable`].
    pub async fn open_reader_at(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        actor: ActorId,
        config: StoreConfig,
        at_ms: i64,
    ) -> Result<Self> {
        let reading = Some(Reading::At(at_ms));
        Self::open_as(bucket, keys, actor, Self::reader(), config, reading).await
    }

    /// Every record and snapshot of the actor's log, oldest first, with
    /// the time each was sealed and its size (`actor history`).
    pub async fn history(
        bucket: &dyn Bucket,
        keys: &Keys,
        actor: &ActorId,
    ) -> Result<Vec<restore::Entry>> {
        restore::history(bucket, keys, actor).await
    }

    fn reader() -> WriterId {
        WriterId {
            node: "reader".into(),
            incarnation: "reader".into(),
        }
    }

    /// `reading`: `None` for a store that writes, else what a reader reads.
    async fn open_as(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        actor: ActorId,
        writer: WriterId,
        config: StoreConfig,
        reading: Option<Reading>,
    ) -> Result<Self> {
        let restored = match reading {
            Some(Reading::At(at_ms)) => restore::load_at(&*bucket, &keys, &actor, at_ms).await?,
            _ => restore::load(&*bucket, &keys, &actor).await?,
        };
        let reader = reading.is_some();
        let empty = restored.pages.is_empty();
        let file: SharedFile = Arc::new(Mutex::new(MemFile::with_pages(restored.pages)));
        let db_name = format!("wasmkeep-db-{}", DB_NAMES.fetch_add(1, Ordering::Relaxed));
        MemFile::register(&db_name, Arc::clone(&file));
        let guard = Arc::new(Guard::default());
        let deadline = Arc::new(Mutex::new(None));
        let conn = match open_connection(&db_name, &config, &guard, &deadline) {
            Ok(c) => c,
            Err(e) => {
                MemFile::unregister(&db_name);
                return Err(e);
            }
        };
        // An empty database has no tables: a new actor skips the lookup.
        let alarm = if empty {
            Ok(None)
        } else {
            read_alarm_table(&conn)
        };
        let alarm = match alarm {
            Ok(a) => a,
            Err(e) => {
                MemFile::unregister(&db_name);
                return Err(e);
            }
        };
        // The alarm is kept twice (table and record header); they must agree.
        if alarm != restored.alarm_ms {
            MemFile::unregister(&db_name);
            return Err(Error::Corrupt {
                key: keys.actor_log(&actor, restored.last_seq),
                reason: format!(
                    "the alarm in the database ({alarm:?}) differs from the record header ({:?})",
                    restored.alarm_ms
                ),
            });
        }
        // Setting pragmas must not have produced a change (that would be a
        // record written for an actor nobody wrote to).
        let stray = file.lock().take_changes();
        debug_assert!(
            stray.is_empty(),
            "opening wrote pages: {:?}",
            stray.pages.len()
        );

        // The index may lag a record that failed after the index was
        // rewritten; put it back to the committed value.
        if let Some(at) = alarm.filter(|_| !reader) {
            put_retrying(
                &*bucket,
                &keys.alarm(&actor),
                Bytes::from(at.to_string()),
                &config,
            )
            .await?;
        }

        let (progress, _) = watch::channel(Progress {
            durable_seq: restored.last_seq,
            ..Progress::default()
        });
        let shared = Arc::new(Shared {
            bucket,
            actor_text: actor.to_string(),
            log_prefix: keys.actor_log_prefix(&actor),
            keys,
            actor,
            writer,
            state: Mutex::new(FlushState {
                queue: VecDeque::new(),
                next_seq: restored.last_seq + 1,
                closed: reader,
                failure: None,
                lingering_for: None,
            }),
            config,
            wake: Notify::new(),
            progress,
        });
        let background = (!reader).then(|| {
            let slot = Arc::new(SnapshotSlot::default());
            let background = tokio::spawn(snapshot_writer(Arc::clone(&shared), Arc::clone(&slot)));
            tokio::spawn(flusher(Arc::clone(&shared), alarm, slot));
            background
        });
        Ok(Self {
            conn: Some(conn),
            file,
            db_name,
            guard,
            deadline,
            shared,
            in_event: false,
            event_aborted: None,
            committed_alarm: alarm,
            event_alarm: alarm,
            records_since_snapshot: restored.records_since_snapshot,
            bytes_since_snapshot: restored.bytes_since_snapshot,
            local_failure: None,
            background,
            reader,
        })
    }

    /// Closes the store, as dropping it does, and waits until its work in
    /// the background is done: the queued records written, the last
    /// snapshot written and what it covers deleted.
    pub async fn close(mut self) {
        let background = self.background.take();
        drop(self);
        if let Some(background) = background {
            // A panic there was logged by the runtime; nothing to add.
            let _ = background.await;
        }
    }

    /// [`close`](Self::close) for a store its owner cannot give up (it
    /// lives in a guest's host): afterwards no event runs on it, and
    /// nothing of it writes to the bucket again, so its objects can be
    /// deleted (`wasmkeep actor delete`, ADR 0055).
    pub async fn close_in_place(&mut self) {
        self.local_failure = Some("the store was closed".to_owned());
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(background) = self.background.take() {
            let _ = background.await;
        }
    }

    /// True when the actor has any data in the bucket.
    pub async fn exists(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<bool> {
        let page = bucket.list_page(&keys.actor_prefix(actor), None).await?;
        Ok(!page.objects.is_empty())
    }

    /// The committed alarm, read from the newest record's header (nothing is
    /// kept open and no component is needed).
    pub async fn read_alarm(
        bucket: Arc<dyn Bucket>,
        keys: &Keys,
        actor: &ActorId,
    ) -> Result<Option<i64>> {
        restore::alarm(&*bucket, keys, actor).await
    }
}

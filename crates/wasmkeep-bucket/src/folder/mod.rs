//! The folder backend (`file:///abs/path`): one file per object under a root
//! folder, safe for many threads and many processes sharing the folder, and
//! durable when a write returns.
//!
//! Layout: the object `a/b/c` is the file `<root>/a/b/c`; `<root>/.locks/NN`
//! are 256 lock files (their first 8 bytes: the stripe's journal order);
//! `<root>/.tmp/` holds files being written and files kept for reuse (each
//! process's named after its `<pid>.<random>.lock`, held with `flock` while
//! it runs); `<root>/.wal/` the journals.
//!
//! How a write stays atomic and durable:
//! - All writes of one `FolderBucket` go to one committer thread, which takes
//!   them in batches (group commit). For a batch it takes an exclusive
//!   `flock` on the lock stripe of every key (`fnv1a(key) % 256`, in
//!   ascending order, so processes cannot deadlock), checks each condition
//!   against the file on disk (and earlier writes of the same batch), writes
//!   each new object to a temporary file, makes all of them durable at once,
//!   renames them into place, makes the renames durable, releases the locks
//!   and only then answers. Readers never lock: a rename replaces a file
//!   whole, so a reader sees the old or the new object, never a torn one
//!   (with inode reuse, below: as long as its read is not slow).
//! - `SyncMode::Journal` (default, ADR 0025): instead of syncing the new
//!   files and folders, the committer appends the batch to this process's
//!   write-ahead journal (`.wal/`, see `journal/`) with one `fdatasync`
//!   (after writing the temporary files), then renames the files into
//!   place unsynced; a checkpoint (`syncfs`,
//!   every [`CHECKPOINT_INTERVAL`]) makes them durable in place, and the next
//!   open after a reboot replays what the journals hold beyond it. Bodies
//!   over [`JOURNAL_BODY_MAX`] are synced in place as below, then marked in
//!   the journal.
//! - Solo mode (ADR 0034, journal mode only): a process alone on the folder
//!   (an exclusive `flock` on `.wal/solo`, see `solo.rs`) keeps the objects
//!   it writes in its journal only, indexed in memory (`young.rs`), until a
//!   checkpoint writes them in place; an object deleted before that never
//!   becomes a file. Reads and listings merge the index with the folder.
//!   Another process that opens the folder knocks; the solo process then
//!   writes every young object in place, shares the lock and makes files
//!   before it answers from then on, as below.
//! - Two sync-in-place strategies: `Syncfs` issues one
//!   `syncfs(2)` before and one after the renames; `PerFile` fdatasyncs the
//!   batch's temporary files from a pool of threads, then fsyncs each touched
//!   folder. Measured on the development VM (ext4, `benches/folder.rs`), 64
//!   writers: `Syncfs` ~12 500 writes/s, `PerFile` ~5 900 writes/s; one
//!   writer: ~1 000-1 300 writes/s both. `syncfs` also flushes other
//!   programs' dirty data on the same file system, so its latency depends on
//!   them; choose `PerFile` where that matters. In `Syncfs` mode a step with
//!   at most [`PER_FILE_SYNCS_MAX`] paths syncs them one by one (a lone
//!   writer: ~2x the writes per second of two `syncfs`).
//!
//! Inode reuse (ADR 0027). A file that leaves its key (replaced: swapped out
//! with `renameat2(RENAME_EXCHANGE)`; deleted: renamed into `.tmp/`) is kept,
//! up to [`INODE_POOL_FILES_MAX`] files of at most
//! [`INODE_POOL_FILE_BYTES_MAX`] and [`INODE_POOL_BYTES_MAX`] in all (ADR
//! 0031), and rewritten as a later temporary file,
//! no sooner than [`INODE_REUSE_GRACE`] after it left. On ext4 without a
//! journal every new inode is chosen by scanning past the inodes freed in
//! the last minutes, which cost up to a fifth of the server's CPU under
//! load. A reader may still be reading a file when it leaves its key, so
//! every read that took longer than [`READ_TIME_MAX`] (half the grace) is
//! done again: a read within it ended before any reuse began.
//!
//! Reads run on the caller's thread when they cannot wait for the device
//! (ADR 0028): small objects whose pages are all cached (`preadv2` with
//! `RWF_NOWAIT`), listings of a few objects. Any other read goes to a
//! blocking thread. Handing every read to another thread cost more than the
//! read: a new actor's activation reads three times (its ownership record,
//! its snapshots and its log, all missing).
//!
//! The etag is the first 16 bytes of the SHA-256 of the body, in hex,
//! computed when read. Writing the same bytes again gives the same etag (as
//! on S3); bodies that need to be told apart carry a nonce.
//!
//! Limitation: a key cannot also be a prefix "folder" of other keys (`a` and
//! `a/b`); such a write fails with [`Error::InvalidKey`] and changes nothing.
//! A reader in this process may see a new object a moment before its write is
//! durable (between the rename and the directory sync).
//!
//! The parts, each using only those listed before it: `sys` (system
//! calls), `layout` (reserved names, etags, errors), `locks` (`flock`,
//! stripes), `sync` (sync modes and threads), `pools` (files kept for
//! reuse), `solo` (the lock and the knock), `journal/`, `young` (the young
//! index), `names` (ADR 0036), `alone` (solo mode wired to the journal),
//! `reads`, `polling` (ADR 0032) and `committer/`. This file opens the
//! bucket and answers the [`Bucket`] calls: it never writes an object
//! itself (every write goes to the committer) nor reads one (`reads` does).
//!
//! [`PER_FILE_SYNCS_MAX`]: sync::PER_FILE_SYNCS_MAX
//! [`INODE_POOL_FILES_MAX`]: pools::INODE_POOL_FILES_MAX
//! [`INODE_POOL_FILE_BYTES_MAX`]: pools::INODE_POOL_FILE_BYTES_MAX
//! [`INODE_POOL_BYTES_MAX`]: pools::INODE_POOL_BYTES_MAX
//! [`READ_TIME_MAX`]: reads::READ_TIME_MAX

mod alone;
mod committer;
mod journal;
mod layout;
mod locks;
mod names;
mod polling;
mod pools;
mod reads;
mod solo;
mod sync;
mod sys;
#[cfg(test)]
mod tests;
mod young;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

pub use committer::COMMIT_BATCH_WRITES_MAX;
#[doc(hidden)]
pub use journal::fuzzing as journal_fuzzing;
pub use journal::{CHECKPOINT_INTERVAL, JOURNAL_BODY_MAX, JOURNAL_BYTES_MAX};
pub use layout::content_etag;
pub use locks::LOCK_STRIPES;
pub use sync::SyncMode;

use crate::key::{validate_key, validate_prefix};
use crate::{Bucket, Error, Etag, Hints, ListPage, Listed, Object, ObjectMeta, Result};
use alone::{SOLO_WAIT_MAX, Solo};
use committer::{
    Answer, CLOSE_WAIT_MAX, Committer, CommitterThread, WriteOp, WriteRequest, empty_orders,
    run_committer,
};
use journal::{Journal, JournalOptions};
use layout::{LOCKS_DIR, TEMP_DIR, check_not_reserved, io_unavailable};
use locks::lock_file_in_place;
use names::Names;
use polling::Polling;
use pools::{INODE_REUSE_GRACE, InodePool, TEMP_LOCK_SUFFIX, adopt_temp_files};
use reads::{Detail, ReadFailure, Reader, list_merged, read_object};
use sync::{SYNC_THREADS_MAX, SyncPool};
use young::Young;

/// Most writes waiting for the committer; further writers wait to enqueue.
pub const COMMIT_QUEUE_WRITES_MAX: usize = 4096;

/// Options of [`FolderBucket::open_with`].
#[derive(Debug, Clone, Default)]
pub struct FolderOptions {
    pub sync_mode: SyncMode,
    /// Tests: the boot id the journal compares with the folder's last one
    /// (default: this machine's), to play a reboot.
    #[doc(hidden)]
    pub journal_boot_id: Option<String>,
    /// Tests: how often the journal checkpoints (default
    /// [`CHECKPOINT_INTERVAL`]); a long one plays a crash before it.
    #[doc(hidden)]
    pub journal_checkpoint_interval: Option<Duration>,
    /// Tests: how long a replaced or deleted file waits before its inode is
    /// reused (default [`INODE_REUSE_GRACE`]). Readers in this process are
    /// only safe with the default.
    #[doc(hidden)]
    pub inode_reuse_grace: Option<Duration>,
    /// Never solo (ADR 0034): every object is a file before it is
    /// answered, as when other processes share the folder. Tests run the
    /// conformance suite both ways.
    #[doc(hidden)]
    pub never_solo: bool,
    /// Tests: how long an opener waits for a solo process to make room
    /// (default [`SOLO_WAIT_MAX`]).
    #[doc(hidden)]
    pub solo_wait_max: Option<Duration>,
    /// Tests: alone, never answer a knock (another opener waits until this
    /// process is gone), to test an opener that outlives the solo process.
    #[doc(hidden)]
    pub deaf_to_knocks: bool,
}

/// The `file://` bucket. Cheap to share behind an `Arc`; dropping it stops
/// its committer thread after the queued writes and waits for that thread's
/// last checkpoint, so that a process that drops its bucket before it exits
/// leaves every write durable in place and no journal to recover.
pub struct FolderBucket {
    root: Arc<PathBuf>,
    /// The objects that live in the journal for now (ADR 0034; none unless
    /// this process is alone on the folder). `None` without a journal.
    young: Option<Arc<Young>>,
    /// Whether this process is alone on the folder (see `Solo::alone`).
    alone: Arc<AtomicBool>,
    queue: mpsc::Sender<WriteRequest>,
    polling: Arc<Polling>,
    /// The committer, shared with its thread: a lone writer takes it to
    /// commit its own write while the thread is idle (ADR 0045).
    committer: Arc<parking_lot::Mutex<Committer>>,
    /// Becomes `true` once the files of gone processes were looked at.
    adopted: watch::Receiver<bool>,
    /// Last: fields drop in order, so `queue` is gone (the committer sees the
    /// end of its queue) before this waits for the thread.
    _committer: CommitterThread,
}

/// Opens the folder's journal (recovering the gone processes' journals) and
/// takes this process's place on the folder. Once the place is taken, no
/// process can leave young objects on the folder unseen: only this one may
/// be alone now. Before, one could: a process alone that this one waits
/// for at the knock may die instead of making room, after this one's
/// recovery, with young objects only in its journal; taking its place
/// without them would lose them (and a checkpoint would later call them
/// durable). So when a gone process's journal appeared meanwhile, the open
/// starts over and recovers it (ADR 0040).
fn open_journal(root: &Arc<PathBuf>, options: &FolderOptions) -> Result<(Journal, Solo)> {
    let config = |what: &str, e: io::Error| {
        Error::Config(format!("folder bucket {}: {what}: {e}", root.display()))
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut journal = Journal::open(
            root,
            &JournalOptions {
                boot_id: options.journal_boot_id.clone(),
                checkpoint_interval: options
                    .journal_checkpoint_interval
                    .unwrap_or(CHECKPOINT_INTERVAL),
                adopt: !options.never_solo,
            },
        )
        .map_err(|e| config("open the write-ahead journal (.wal)", e))?;
        let solo = Solo::start(
            root,
            &mut journal,
            options.solo_wait_max.unwrap_or(SOLO_WAIT_MAX),
            options.never_solo,
            options.deaf_to_knocks,
        )
        .map_err(|e| config("take .wal/solo", e))?;
        let gone = journal
            .gone_present()
            .map_err(|e| config("look for gone processes' journals", e))?;
        if !gone {
            return Ok((journal, solo));
        }
        // Nothing of this process's own is in it yet (only copies of the
        // gone processes' young objects, which the next try adopts again):
        // removed, so that no other opener takes it for a gone process's.
        drop(solo);
        journal.abandon();
        if attempts >= OPEN_ATTEMPTS_MAX {
            return Err(config(
                "open",
                io::Error::other(format!(
                    "processes on this folder died while it was being opened, {attempts} times in a row"
                )),
            ));
        }
        tracing::info!(
            "folder bucket: a process on this folder died while this one waited for its place; opening again"
        );
    }
}

/// Opens of the journal in a row that found a gone process's journal
/// appear before [`open_journal`] gives up.
const OPEN_ATTEMPTS_MAX: usize = 5;

impl std::fmt::Debug for FolderBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderBucket")
            .field("root", &self.root)
            .finish()
    }
}

/// A write whose answer never came: it was queued, so it may have applied.
fn committer_died(key: &str) -> Error {
    Error::OutcomeUnknown {
        key: key.to_owned(),
        reason: "the folder committer stopped".to_owned(),
    }
}

impl FolderBucket {
    /// Opens (creating if needed) the folder `root` as a bucket, with the
    /// default options.
    pub fn open(root: &Path) -> Result<Self> {
        Self::open_with(root, FolderOptions::default())
    }

    /// Opens (creating if needed) the folder `root` as a bucket.
    pub fn open_with(root: &Path, options: FolderOptions) -> Result<Self> {
        let config = |what: &str, e: io::Error| {
            Error::Config(format!("folder bucket {}: {what}: {e}", root.display()))
        };
        fs::create_dir_all(root).map_err(|e| config("create", e))?;
        let root = root.canonicalize().map_err(|e| config("resolve", e))?;
        fs::create_dir_all(root.join(LOCKS_DIR)).map_err(|e| config("create .locks", e))?;
        fs::create_dir_all(root.join(TEMP_DIR)).map_err(|e| config("create .tmp", e))?;
        let temp_prefix = format!("{}.{:016x}", std::process::id(), rand::random::<u64>());
        // Held (exclusive flock) for the committer's life: the temporary
        // and pooled files named after it are this process's own. Locked
        // under a name the search for gone processes' pools passes over,
        // then renamed (the lock goes with the file): under its own name an
        // unlocked lock file would look like a gone process's to another
        // process opening the folder at that moment, which would take it.
        let temp_lock = lock_file_in_place(
            &root.join(TEMP_DIR),
            &format!("{temp_prefix}{TEMP_LOCK_SUFFIX}"),
        )
        .map_err(|e| config("create the temporary files' lock", e))?;
        // The files of gone processes are looked at on a thread of their
        // own: a pool of tens of thousands of them takes the kernel tens of
        // milliseconds to list, which would delay the node's start. The
        // committer takes them in at its next batch.
        let (adopted_tx, adopted_rx) = std::sync::mpsc::channel();
        let (adopted_done, adopted) = watch::channel(false);
        let temp_dir = root.join(TEMP_DIR);
        std::thread::Builder::new()
            .name("wasmkeep-folder-adopt".to_owned())
            .spawn(move || {
                // The committer may be gone already: its locks go with it.
                let _ = adopted_tx.send(adopt_temp_files(&temp_dir));
                adopted_done.send_replace(true);
            })
            .map_err(|e| config("start the thread that adopts temporary files", e))?;
        let root_dir = File::open(&root).map_err(|e| config("open", e))?;
        let sync_pool = SyncPool::new(SYNC_THREADS_MAX);
        let root = Arc::new(root);
        let (mut journal, solo) = match options.sync_mode {
            SyncMode::Journal => {
                let (journal, solo) = open_journal(&root, &options)?;
                (Some(journal), Some(solo))
            }
            SyncMode::PerFile | SyncMode::Syncfs => (None, None),
        };
        if let Some(journal) = &mut journal {
            journal
                .start_checkpointer()
                .map_err(|e| config("start the checkpoint thread", e))?;
        }
        let young = solo.as_ref().map(|solo| Arc::clone(&solo.young));
        let alone = solo.as_ref().map_or_else(
            || Arc::new(AtomicBool::new(false)),
            |solo| Arc::clone(&solo.alone_hint),
        );
        let pool = InodePool::new(
            root.join(TEMP_DIR),
            temp_prefix.clone(),
            options.inode_reuse_grace.unwrap_or(INODE_REUSE_GRACE),
        );
        let (queue, receiver) = mpsc::channel(COMMIT_QUEUE_WRITES_MAX);
        let polling = Arc::new(Polling::default());
        let committer = Committer {
            root: Arc::clone(&root),
            root_dir,
            locks: (0..LOCK_STRIPES).map(|_| None).collect(),
            sync_mode: options.sync_mode,
            temp_prefix,
            temp_lock,
            temp_counter: 0,
            sync_pool,
            journal,
            adopted_locks: Vec::new(),
            adoption: Some(adopted_rx),
            pool,
            solo,
            solo_orders: empty_orders(),
            names: Names::default(),
        };
        let committer = Arc::new(parking_lot::Mutex::new(committer));
        let committer_thread = {
            let committer = Arc::clone(&committer);
            let polling = Arc::clone(&polling);
            CommitterThread::spawn(CLOSE_WAIT_MAX, move || {
                run_committer(&committer, &polling, receiver);
            })
            .map_err(|e| config("start the committer thread", e))?
        };
        Ok(FolderBucket {
            root,
            young,
            alone,
            queue,
            polling,
            committer,
            adopted,
            _committer: committer_thread,
        })
    }

    /// Waits until the temporary files of gone processes were looked at
    /// (adopted into the pool, or removed); a write after this reuses them.
    #[doc(hidden)]
    pub async fn adoption_finished(&self) {
        let mut adopted = self.adopted.clone();
        // Dropped without a `true`: the thread is gone, nothing more comes.
        let _ = adopted.wait_for(|done| *done).await;
    }

    /// The resolved root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    async fn write(&self, key: &str, op: WriteOp) -> Result<Option<ObjectMeta>> {
        self.write_with(key, op, false).await
    }

    async fn write_with(
        &self,
        key: &str,
        op: WriteOp,
        unhurried: bool,
    ) -> Result<Option<ObjectMeta>> {
        validate_key(key)?;
        check_not_reserved(key)?;
        // An unhurried write neither polls for its answer nor keeps the one
        // write that waits with it from polling (ADR 0032): it is answered
        // with that write's batch.
        let _in_flight = (!unhurried).then(|| self.polling.write_sent());
        let answer = self.send(key, op, unhurried).await?;
        let answered = if unhurried {
            answer.await
        } else {
            self.polling.answer(answer).await
        };
        answered.map_err(|_| committer_died(key))?
    }

    /// A put-if-absent whose caller waits for nothing else
    /// ([`Hints::put_if_absent_alone`]): committed on the caller's thread
    /// when it is the only write in flight, the committer's thread is idle
    /// and does not poll (writes come far apart), and this process is alone
    /// on the folder; otherwise queued as any write (ADR 0045).
    async fn put_alone(&self, key: &str, bytes: Bytes) -> Result<Option<ObjectMeta>> {
        validate_key(key)?;
        check_not_reserved(key)?;
        let _in_flight = self.polling.write_sent();
        let op = match self.lead(key, WriteOp::PutIfAbsent(bytes)) {
            Ok(answered) => return answered,
            Err(op) => op,
        };
        let answer = self.send(key, op, false).await?;
        self.polling
            .answer(answer)
            .await
            .map_err(|_| committer_died(key))?
    }

    /// Commits `op` as a batch of its own on this thread, as the committer's
    /// thread would, if nothing else waits for the committer (see
    /// [`FolderBucket::put_alone`]); gives `op` back otherwise. Blocks for
    /// the journal's flush: only a writer with nothing else in flight may
    /// call it, and with nothing else in flight a node has no other work
    /// that the flush would hold up.
    fn lead(
        &self,
        key: &str,
        op: WriteOp,
    ) -> std::result::Result<Result<Option<ObjectMeta>>, WriteOp> {
        if self.polling.in_flight.load(Ordering::Acquire) != 1
            || self.polling.quick.load(Ordering::Acquire)
            || !self.alone.load(Ordering::Relaxed)
        {
            return Err(op);
        }
        let Some(mut committer) = self.committer.try_lock() else {
            return Err(op);
        };
        let (reply, mut answer) = oneshot::channel();
        committer.commit(vec![WriteRequest {
            key: key.to_owned(),
            op,
            unhurried: false,
            reply,
        }]);
        drop(committer);
        self.polling.led.fetch_add(1, Ordering::Relaxed);
        Ok(answer
            .try_recv()
            .unwrap_or_else(|_| Err(committer_died(key))))
    }

    /// Queues a write (its key checked) for the committer: the receiver of
    /// its answer.
    async fn send(&self, key: &str, op: WriteOp, unhurried: bool) -> Result<Answer> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(WriteRequest {
                key: key.to_owned(),
                op,
                unhurried,
                reply,
            })
            .await
            .map_err(|_| Error::Unavailable {
                key: key.to_owned(),
                reason: "the folder committer stopped".to_owned(),
            })?;
        Ok(answer)
    }

    /// Runs `read` on this thread as [`Reader::Inline`] and, if that would
    /// block, again on a blocking thread as [`Reader::Blocking`].
    async fn read<T: Send + 'static>(
        &self,
        key: &str,
        read: impl Fn(&Path, Reader) -> Result<T, ReadFailure> + Send + 'static,
    ) -> Result<T> {
        match read(&self.root, Reader::Inline) {
            Ok(found) => return Ok(found),
            Err(ReadFailure::Failed(e)) => return Err(e),
            Err(ReadFailure::WouldBlock) => {}
        }
        let root = Arc::clone(&self.root);
        let owned = key.to_owned();
        tokio::task::spawn_blocking(move || {
            read(&root, Reader::Blocking).map_err(|f| f.into_error(&owned))
        })
        .await
        .map_err(|e| Error::Unavailable {
            key: key.to_owned(),
            reason: format!("blocking task failed: {e}"),
        })?
    }
}

#[async_trait]
impl Bucket for FolderBucket {
    async fn get(&self, key: &str) -> Result<Object> {
        validate_key(key)?;
        check_not_reserved(key)?;
        let owned = key.to_owned();
        let young = self.young.clone();
        self.read(key, move |root, reader| match &young {
            Some(young) => young
                .read(
                    &owned,
                    |object| Ok(Some(object)),
                    || read_object(root, &owned, reader),
                )
                .map_err(|e| {
                    ReadFailure::Failed(io_unavailable(&owned, "read from the journal", &e))
                })?,
            None => read_object(root, &owned, reader),
        })
        .await?
        .ok_or_else(|| Error::NotFound {
            key: key.to_owned(),
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        Ok(self.get(key).await?.meta)
    }

    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.write(key, WriteOp::PutIfAbsent(bytes))
            .await?
            .ok_or_else(|| committer_bug(key))
    }

    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta> {
        self.write(key, WriteOp::PutIfMatch(bytes, etag.clone()))
            .await?
            .ok_or_else(|| committer_bug(key))
    }

    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.write(key, WriteOp::Put(bytes))
            .await?
            .ok_or_else(|| committer_bug(key))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.write(key, WriteOp::Delete).await.map(drop)
    }

    async fn delete_if_match(&self, key: &str, etag: &Etag) -> Result<()> {
        self.write(key, WriteOp::DeleteIfMatch(etag.clone()))
            .await
            .map(drop)
    }

    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage> {
        validate_prefix(prefix)?;
        let owned = prefix.to_owned();
        let after = start_after.map(str::to_owned);
        let young = self.young.clone();
        self.read(prefix, move |root, reader| {
            list_merged(
                young.as_deref(),
                root,
                &owned,
                after.as_deref(),
                reader,
                Detail::Full,
            )
        })
        .await
    }

    /// Every hint: see [`Hints`] below.
    fn hints(&self) -> Option<&dyn Hints> {
        Some(self)
    }
}

#[async_trait]
impl Hints for FolderBucket {
    async fn put_if_absent_unhurried(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.write_with(key, WriteOp::PutIfAbsent(bytes), true)
            .await?
            .ok_or_else(|| committer_bug(key))
    }

    async fn put_if_absent_alone(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.put_alone(key, bytes)
            .await?
            .ok_or_else(|| committer_bug(key))
    }

    /// All queued before the first answer is awaited, unhurried (ADR 0042):
    /// they reach the committer together, in one batch or with the writes
    /// queued beside them, and a batch of them alone goes at once (nothing
    /// in it is flushed). They neither poll for their answers nor count as
    /// writes in flight, so a lone writer's record still polls for its own
    /// while they are out.
    async fn delete_all_not_durable(&self, keys: &[String]) -> Result<()> {
        for key in keys {
            validate_key(key)?;
            check_not_reserved(key)?;
        }
        let mut answers = Vec::with_capacity(keys.len());
        for key in keys {
            answers.push(self.send(key, WriteOp::DeleteNotDurable, true).await?);
        }
        for (key, answer) in keys.iter().zip(answers) {
            match answer.await.map_err(|_| committer_died(key))? {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn short_lived_objects_are_cheap(&self) -> bool {
        self.alone.load(Ordering::Relaxed)
    }

    /// Names and sizes from the folders and one `statx` per file (type and
    /// size only, see `shape_of`): no object is read. The store's compaction
    /// used to read and hash every record it then deleted, and the `fstat`
    /// of each made the next journal append write its inode as well.
    async fn list_keys(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.list_keys_from(prefix, None).await
    }

    async fn list_keys_after(&self, prefix: &str, start_after: &str) -> Result<Vec<Listed>> {
        self.list_keys_from(prefix, Some(start_after.to_owned()))
            .await
    }
}

impl FolderBucket {
    /// [`Hints::list_keys`] from after `after` (from the start: `None`).
    async fn list_keys_from(&self, prefix: &str, mut after: Option<String>) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let mut all = Vec::new();
        loop {
            let owned = prefix.to_owned();
            let from = after.take();
            let young = self.young.clone();
            let page = self
                .read(prefix, move |root, reader| {
                    list_merged(
                        young.as_deref(),
                        root,
                        &owned,
                        from.as_deref(),
                        reader,
                        Detail::Size,
                    )
                })
                .await?;
            all.extend(page.objects.into_iter().map(|meta| Listed {
                key: meta.key,
                size: meta.size,
            }));
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }
}

fn committer_bug(key: &str) -> Error {
    Error::Unavailable {
        key: key.to_owned(),
        reason: "internal: a put was answered without metadata".to_owned(),
    }
}

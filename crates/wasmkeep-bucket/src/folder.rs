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
//!   write-ahead journal (`.wal/`, see `journal.rs`) with one `fdatasync`
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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, watch};

use crate::journal::{
    CHECKPOINT_INTERVAL, Checkpoints, Entry, EntryAt, EntryKind, JOURNAL_BATCH_BYTES_MAX,
    JOURNAL_BODY_MAX, JOURNAL_DIR, Journal, JournalOptions, entry_bytes, read_u64,
};
use crate::key::{validate_key, validate_prefix};
use crate::names::Names;
use crate::solo::{Hold, Mode, Watcher};
use crate::young::{self, Young, YoungObject};
use crate::{
    Bucket, Error, Etag, LIST_PAGE_OBJECTS_MAX, ListPage, Listed, Object, ObjectMeta, Result,
};

/// Number of lock files; a key's stripe is `fnv1a(key) % LOCK_STRIPES`.
/// Fixed forever: every process sharing a folder must agree on it.
pub const LOCK_STRIPES: usize = 256;
/// Most writes the committer takes into one batch.
pub const COMMIT_BATCH_WRITES_MAX: usize = 256;
/// Most writes waiting for the committer; further writers wait to enqueue.
pub const COMMIT_QUEUE_WRITES_MAX: usize = 4096;
/// Most threads used to sync one batch's files in [`SyncMode::PerFile`].
pub const SYNC_THREADS_MAX: usize = 32;
/// A temporary file older than this at open belongs to a crashed writer.
pub const TEMP_FILE_STALE_AGE: Duration = Duration::from_secs(3600);
/// The lock file of one process's temporary files: `.tmp/<prefix>.lock`.
const TEMP_LOCK_SUFFIX: &str = ".lock";
/// Longest a dropped bucket waits for its committer's last checkpoint.
pub const CLOSE_WAIT_MAX: Duration = Duration::from_secs(10);
/// A lock file while it is being locked (see `lock_file_in_place`); one
/// left by a crash goes by age like any unclaimed temporary file.
const LOCKING_SUFFIX: &str = ".locking";

/// Inode reuse (see the module docs): a file replaced or deleted by the
/// committer is kept under `.tmp/` and rewritten as a later temporary file,
/// at the earliest this long after it left its key.
pub const INODE_REUSE_GRACE: Duration = Duration::from_secs(2);
/// A read that took longer than this (open to last byte) is done again: the
/// file it opened may have been reused meanwhile. Half the grace.
pub const READ_TIME_MAX: Duration = Duration::from_secs(1);
/// Reads of one object tried before the read is called unavailable.
const READ_ATTEMPTS_MAX: usize = 3;
/// Most files one committer keeps for reuse; beyond, they are unlinked. A
/// file is reused only after [`INODE_REUSE_GRACE`], so sustained writes need
/// about `rate x grace` files in the pool: 65,536 covers 32,000 writes/s.
pub const INODE_POOL_FILES_MAX: usize = 65_536;
/// Larger files are unlinked rather than kept (their blocks would be held).
pub const INODE_POOL_FILE_BYTES_MAX: u64 = 64 << 10;
/// Most disk the pool holds, sizes rounded up to [`POOL_BLOCK_BYTES`].
pub const INODE_POOL_BYTES_MAX: u64 = 256 << 20;
/// The block size the pool counts in (ext4's default).
const POOL_BLOCK_BYTES: u64 = 4096;

const LOCKS_DIR: &str = ".locks";
pub(crate) const TEMP_DIR: &str = ".tmp";

/// How the committer makes a batch durable. Every process sharing a folder
/// must use the same mode (`wasmkeep` always uses the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Append the batch to this process's write-ahead journal with one
    /// `fdatasync`, then rename the objects into place unsynced; a
    /// checkpoint (`syncfs`, every [`CHECKPOINT_INTERVAL`]) makes them
    /// durable in place. One flush per batch (ADR 0025).
    #[default]
    Journal,
    /// `fdatasync` every new file (in parallel), `fsync` every touched folder.
    /// Slower under many writers, but never waits for other programs' dirty
    /// data on the same file system.
    PerFile,
    /// One `syncfs(2)` for the new files and one for the renames: the fastest
    /// with many concurrent writers (see `benches/folder.rs`), but each sync
    /// also flushes whatever else is dirty on that file system. A step with at
    /// most [`PER_FILE_SYNCS_MAX`] files (or folders) syncs them one by one
    /// instead: a lone writer waits for two small fsyncs (~0.2 ms each here),
    /// not two file-system-wide syncs (~1 ms each).
    Syncfs,
}

/// In `Syncfs` mode, a step with at most this many paths to make durable
/// syncs them one by one rather than the whole file system.
pub const PER_FILE_SYNCS_MAX: usize = 2;

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

/// How long an opener waits for a process alone on the folder to put its
/// young objects in place and make room (ADR 0034).
pub const SOLO_WAIT_MAX: Duration = Duration::from_secs(60);
/// Tries of the checkpoint that leaves solo mode before it gives up (the
/// knocking process then times out; the objects go in place at the next
/// checkpoint that succeeds).
const LEAVE_SOLO_ATTEMPTS_MAX: usize = 50;

/// This process's place on the folder (ADR 0034): alone, young objects stay
/// in its journal until a checkpoint; another process's knock ends that.
struct Solo {
    young: Arc<Young>,
    /// Whether batches may leave objects young. The committer holds it for
    /// each batch; leaving solo mode turns it false for good.
    alone: Arc<parking_lot::Mutex<bool>>,
    /// `alone` for readers that must not wait for a batch.
    alone_hint: Arc<AtomicBool>,
    /// The lock on `.wal/solo`, held until the committer stops.
    _hold: Arc<parking_lot::Mutex<Hold>>,
    /// Watches for knocks while alone; dropped (its thread joined) before
    /// the journal's last checkpoint.
    watcher: Option<Watcher>,
}

impl Solo {
    fn start(
        root: &Arc<PathBuf>,
        journal: &mut Journal,
        wait_max: Duration,
        never: bool,
        deaf: bool,
    ) -> io::Result<Solo> {
        let wal = root.join(JOURNAL_DIR);
        // Young objects of a gone solo process adopted at open come with
        // the lock, taken then (ADR 0040).
        let (hold, adopted) = match journal.take_adoption() {
            Some(adoption) => (adoption.hold, adoption.objects),
            None => (
                Hold::take(&wal, wait_max, &|| Ok(never || journal.others_present()?))?,
                Vec::new(),
            ),
        };
        let young = Arc::new(Young::new(Arc::clone(root), journal.reader()?));
        // In the index before any checkpoint or knock could look, and before
        // the first read.
        young.adopt(adopted);
        {
            let young = Arc::clone(&young);
            journal.set_placer(Arc::new(move |epoch| young.place_through(epoch).map(drop)));
        }
        let alone = hold.mode() == Mode::Solo;
        if alone {
            journal.mark_young()?;
            tracing::info!(
                folder = %root.display(),
                "folder bucket: alone on this folder; new objects stay in the journal until a checkpoint (ADR 0034)"
            );
        }
        let alone_hint = Arc::new(AtomicBool::new(alone));
        let alone = Arc::new(parking_lot::Mutex::new(alone));
        let hold = Arc::new(parking_lot::Mutex::new(hold));
        let watcher = if *alone.lock() && !deaf {
            let checkpoints = journal.checkpoints();
            let (alone, hint, hold) = (
                Arc::clone(&alone),
                Arc::clone(&alone_hint),
                Arc::clone(&hold),
            );
            Some(Watcher::start(&wal, move || {
                hint.store(false, Ordering::Relaxed);
                leave_solo(&alone, &hold, &checkpoints);
            })?)
        } else {
            None
        };
        Ok(Solo {
            young,
            alone,
            alone_hint,
            _hold: hold,
            watcher,
        })
    }
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

/// Another process knocked: no more young objects; a checkpoint puts those
/// there are in place; then the lock on `.wal/solo` becomes a shared one.
fn leave_solo(
    alone: &parking_lot::Mutex<bool>,
    hold: &parking_lot::Mutex<Hold>,
    checkpoints: &Checkpoints,
) {
    // Waits for the batch in progress: every later one makes files.
    *alone.lock() = false;
    for _ in 0..LEAVE_SOLO_ATTEMPTS_MAX {
        match checkpoints.run().and_then(|()| checkpoints.unmark_young()) {
            Ok(()) => {
                match hold.lock().share() {
                    Ok(()) => tracing::info!(
                        "folder bucket: another process opened this folder; its objects are all files now"
                    ),
                    Err(e) => {
                        tracing::error!(error = %e, "folder bucket: could not share .wal/solo")
                    }
                }
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "folder bucket: the checkpoint that leaves solo mode failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    tracing::error!(
        attempts = LEAVE_SOLO_ATTEMPTS_MAX,
        "folder bucket: gave up leaving solo mode; the process that knocked will time out (young objects go in place at the next checkpoint that succeeds)"
    );
}

/// The committer thread, waited for when the bucket is dropped (at most
/// [`CLOSE_WAIT_MAX`]).
struct CommitterThread {
    handle: Option<std::thread::JoinHandle<()>>,
    /// [`CLOSE_WAIT_MAX`] (tests shorten it).
    wait_max: Duration,
    /// Disconnected when the thread ends (its sender goes with it; nothing
    /// is ever sent). In a mutex only to make the bucket `Sync`; `drop`
    /// needs no lock.
    ended: parking_lot::Mutex<std::sync::mpsc::Receiver<std::convert::Infallible>>,
}

impl CommitterThread {
    /// Starts `run` on the committer's thread.
    fn spawn(wait_max: Duration, run: impl FnOnce() + Send + 'static) -> io::Result<Self> {
        let (ended_tx, ended) = std::sync::mpsc::channel::<std::convert::Infallible>();
        let handle = std::thread::Builder::new()
            .name("wasmkeep-folder-commit".to_owned())
            .spawn(move || {
                // Dropped when `run` returns or unwinds: the bucket's drop
                // then sees the thread end.
                let _ended = ended_tx;
                run();
            })?;
        Ok(CommitterThread {
            handle: Some(handle),
            wait_max,
            ended: parking_lot::Mutex::new(ended),
        })
    }
}

impl Drop for CommitterThread {
    fn drop(&mut self) {
        match self.ended.get_mut().recv_timeout(self.wait_max) {
            Ok(never) => match never {},
            // A panic in the committer was already reported by the thread;
            // its writers got "outcome unknown".
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(handle) = self.handle.take() {
                    let _ = handle.join();
                }
            }
            // A file system that does not answer: the process may go on
            // (and exit) without it; the journal stays for the next open to
            // recover, as after a crash.
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "folder bucket: the committer's last checkpoint did not end within {:?}; not waiting longer",
                    self.wait_max
                );
            }
        }
    }
}

impl std::fmt::Debug for FolderBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderBucket")
            .field("root", &self.root)
            .finish()
    }
}

enum WriteOp {
    Put(Bytes),
    PutIfAbsent(Bytes),
    PutIfMatch(Bytes, Etag),
    Delete,
    /// A delete that need not survive a crash: the folder is not synced.
    DeleteNotDurable,
    DeleteIfMatch(Etag),
}

struct WriteRequest {
    key: String,
    op: WriteOp,
    /// The caller is in no hurry ([`Bucket::put_if_absent_unhurried`],
    /// [`Bucket::delete_all_not_durable`]).
    unhurried: bool,
    reply: oneshot::Sender<Result<Option<ObjectMeta>>>,
}

/// Where the committer sends its answer to one write.
type Answer = oneshot::Receiver<Result<Option<ObjectMeta>>>;

/// A write whose answer never came: it was queued, so it may have applied.
fn committer_died(key: &str) -> Error {
    Error::OutcomeUnknown {
        key: key.to_owned(),
        reason: "the folder committer stopped".to_owned(),
    }
}

fn io_unavailable(key: &str, what: &str, e: &io::Error) -> Error {
    Error::Unavailable {
        key: key.to_owned(),
        reason: format!("{what}: {e}"),
    }
}

/// The etag of a body: SHA-256 truncated to 16 bytes, hex.
pub fn content_etag(bytes: &[u8]) -> Etag {
    let digest = Sha256::digest(bytes);
    let mut text = [0_u8; 32];
    // `hex::encode` builds its string a char at a time (ADR 0046).
    hex::encode_to_slice(&digest[..16], &mut text).expect("16 bytes are 32 hex digits");
    Etag(String::from_utf8(text.to_vec()).expect("hex digits are UTF-8"))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn stripe_of(key: &str) -> usize {
    (fnv1a(key.as_bytes()) % LOCK_STRIPES as u64) as usize
}

fn is_missing(e: &io::Error) -> bool {
    // ENOTDIR: a parent "folder" of the key is an object, so the key is absent.
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

fn prefix_collision(key: &str) -> Error {
    Error::InvalidKey {
        key: key.to_owned(),
        reason: "the folder backend cannot hold a key that is also the folder of other keys (`a` and `a/b`)",
    }
}

/// Keys whose first segment is reserved for the backend's own files.
fn check_not_reserved(key: &str) -> Result<()> {
    let first = key.split('/').next().unwrap_or_default();
    if first == LOCKS_DIR || first == TEMP_DIR || first == JOURNAL_DIR {
        return Err(Error::InvalidKey {
            key: key.to_owned(),
            reason: "`.locks`, `.tmp` and `.wal` are reserved by the folder backend",
        });
    }
    Ok(())
}

/// `path` for a system call.
fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// What the committer asks of a path: whether it is a folder, and its size.
#[derive(Debug, Clone, Copy)]
struct Shape {
    dir: bool,
    len: u64,
}

/// `statx` asking for the type and size only. Asking for a timestamp (as
/// `fs::metadata` does) marks the inode's times as seen, and the kernel
/// (multigrain timestamps, Linux 6.13+) then gives the inode's next change a
/// fine-grained time, which also raises the coarse time every later change
/// on the machine gets. Renaming a file just `stat`ed did that once per
/// commit, so the journal's mtime changed at every append and each
/// `fdatasync` wrote its inode as well: one more device write per commit
/// (ADR 0029).
fn shape_of(path: &Path) -> io::Result<Shape> {
    let path = c_path(path)?;
    let out = statx_only(
        libc::AT_FDCWD,
        &path,
        0,
        libc::STATX_TYPE | libc::STATX_SIZE,
    )?;
    Ok(Shape {
        dir: u32::from(out.stx_mode) & libc::S_IFMT == libc::S_IFDIR,
        len: out.stx_size,
    })
}

/// `statx` of `path` relative to `dirfd` (with `flags`, such as
/// `AT_EMPTY_PATH`), asking for the fields in `mask` only: never for a
/// timestamp unless the caller means to (see `shape_of`).
pub(crate) fn statx_only(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> io::Result<libc::statx> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `out` is valid for writes; both
    // outlive the call.
    let rc = unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            flags | libc::AT_STATX_SYNC_AS_STAT,
            mask,
            &mut out,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(out)
}

/// Where a read runs, and so how long it may block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// A blocking thread: any read.
    Blocking,
    /// The caller's own (async) thread, which must not wait for the device:
    /// at most [`INLINE_LIST_OBJECTS_MAX`] objects of at most
    /// [`INLINE_READ_BYTES_MAX`] bytes each, whose pages are all in memory
    /// (`preadv2` with `RWF_NOWAIT`). Anything else is [`ReadFailure::WouldBlock`]
    /// and is read again on a blocking thread.
    Inline,
}

/// Largest object read on the caller's thread.
const INLINE_READ_BYTES_MAX: u64 = 64 << 10;
/// Most objects one listing reads on the caller's thread (to hash them for
/// their etags); a longer listing runs on a blocking thread.
const INLINE_LIST_OBJECTS_MAX: usize = 8;

/// Why a read gave no answer.
#[derive(Debug)]
enum ReadFailure {
    Failed(Error),
    /// An inline read would have to wait (see [`Reader::Inline`]).
    WouldBlock,
}

impl From<Error> for ReadFailure {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

impl ReadFailure {
    /// The error of a [`Reader::Blocking`] read, which never would block.
    fn into_error(self, key: &str) -> Error {
        match self {
            Self::Failed(e) => e,
            Self::WouldBlock => Error::Unavailable {
                key: key.to_owned(),
                reason: "internal: a blocking read would block".to_owned(),
            },
        }
    }
}

/// Reads an object whole; `Ok(None)` when it does not exist. A read that
/// took longer than [`READ_TIME_MAX`] is done again: the committer may have
/// reused the file it opened (see the module docs).
fn read_object(root: &Path, key: &str, reader: Reader) -> Result<Option<Object>, ReadFailure> {
    read_object_within(root, key, READ_TIME_MAX, reader)
}

fn read_object_within(
    root: &Path,
    key: &str,
    time_max: Duration,
    reader: Reader,
) -> Result<Option<Object>, ReadFailure> {
    let path = root.join(key);
    for _ in 0..READ_ATTEMPTS_MAX {
        let started = Instant::now();
        let read = read_object_once(&path, key, reader)?;
        if started.elapsed() <= time_max {
            return Ok(read);
        }
    }
    Err(ReadFailure::Failed(Error::Unavailable {
        key: key.to_owned(),
        reason: format!(
            "each of {READ_ATTEMPTS_MAX} reads took longer than {time_max:?} (the machine is overloaded)"
        ),
    }))
}

fn read_object_once(path: &Path, key: &str, reader: Reader) -> Result<Option<Object>, ReadFailure> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if is_missing(&e) => return Ok(None),
        Err(e) => return Err(io_unavailable(key, "open", &e).into()),
    };
    let metadata = file
        .metadata()
        .map_err(|e| io_unavailable(key, "stat", &e))?;
    if metadata.is_dir() {
        return Ok(None);
    }
    let buf = match reader {
        Reader::Blocking => {
            let mut buf = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
            file.read_to_end(&mut buf)
                .map_err(|e| io_unavailable(key, "read", &e))?;
            buf
        }
        Reader::Inline if metadata.len() > INLINE_READ_BYTES_MAX => {
            return Err(ReadFailure::WouldBlock);
        }
        Reader::Inline => read_cached(&file, metadata.len())
            .map_err(|e| io_unavailable(key, "read", &e))?
            .ok_or(ReadFailure::WouldBlock)?,
    };
    let meta = ObjectMeta {
        key: key.to_owned(),
        etag: content_etag(&buf),
        last_modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        size: buf.len() as u64,
    };
    Ok(Some(Object {
        bytes: Bytes::from(buf),
        meta,
    }))
}

/// Reads the `len` bytes of `file` if all of them are in the page cache;
/// `Ok(None)` if reading would wait for the device (or the file system
/// cannot tell). A file is not rewritten while a read of it may still be
/// used (see inode reuse in the module docs), so its length is the one
/// `fstat` gave.
fn read_cached(file: &File, len: u64) -> io::Result<Option<Vec<u8>>> {
    let len = usize::try_from(len).expect("at most INLINE_READ_BYTES_MAX");
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let rest = &mut buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let offset = libc::off_t::try_from(done).expect("small");
        // SAFETY: `iov` describes `rest`, which is valid for writes of its
        // length and outlives the call.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL) => return Ok(None),
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        done += usize::try_from(n).expect("non-negative");
    }
    buf.truncate(done);
    Ok(Some(buf))
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
    /// ([`Bucket::put_if_absent_alone`]): committed on the caller's thread
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

/// The temporary files a new process takes over at open.
struct Adopted {
    /// The prefixes of processes that are gone and left files.
    prefixes: Vec<String>,
    /// Their files kept for reuse (their inodes), each `.tmp/<prefix>.<n>`
    /// as (index in `prefixes`, `n`): no path per file, which with tens of
    /// thousands of pooled files cost a restart ~20 ms.
    files: Vec<(u32, u64)>,
    /// The lock files of those processes, held from now on, so their files
    /// stay this process's own.
    locks: Vec<File>,
}

/// Takes over the temporary files of processes that are gone (named after a
/// lock file, `<prefix>.lock`, that nobody holds): they join this process's
/// pool, up to [`INODE_POOL_FILES_MAX`] (a stopped process leaves its pool
/// for the next one: unlinking thousands of files cost a restart 0.2-0.4 s),
/// the rest are removed. A live process's files are never touched, however old (a pooled
/// file keeps the time its object was written). Files of builds that kept no
/// lock go by age ([`TEMP_FILE_STALE_AGE`]).
/// Creates `dir/name` already locked (exclusive `flock`): the file is made
/// and locked as `name` plus [`LOCKING_SUFFIX`], which nobody takes for a
/// lock file, then renamed.
fn lock_file_in_place(dir: &Path, name: &str) -> io::Result<File> {
    let locking = dir.join(format!("{name}{LOCKING_SUFFIX}"));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&locking)?;
    let placed = flock(&file, libc::LOCK_EX | libc::LOCK_NB)
        .and_then(|()| fs::rename(&locking, dir.join(name)));
    if let Err(e) = placed {
        let _ = fs::remove_file(&locking);
        return Err(e);
    }
    Ok(file)
}

fn adopt_temp_files(temp_dir: &Path) -> Adopted {
    let mut adopted = Adopted {
        prefixes: Vec::new(),
        files: Vec::new(),
        locks: Vec::new(),
    };
    let Ok(entries) = fs::read_dir(temp_dir) else {
        return adopted;
    };
    // Names, and whether each is a plain file (from the directory entry: no
    // `stat` per file, which with thousands of pooled files cost a restart
    // ~15 ms).
    let listed: Vec<(String, bool)> = entries
        .flatten()
        .filter_map(|e| {
            let is_file = e.file_type().is_ok_and(|t| t.is_file());
            e.file_name().into_string().ok().map(|n| (n, is_file))
        })
        .collect();
    // Gone prefixes: (index in `adopted.prefixes`, its lock, files kept).
    let mut dead: HashMap<&str, (u32, File, usize)> = HashMap::new();
    let mut held: Vec<&str> = Vec::new();
    for (name, _) in &listed {
        let Some(prefix) = name.strip_suffix(TEMP_LOCK_SUFFIX) else {
            continue;
        };
        let Ok(lock) = OpenOptions::new().write(true).open(temp_dir.join(name)) else {
            continue;
        };
        if flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let index = u32::try_from(adopted.prefixes.len()).unwrap_or(u32::MAX);
            adopted.prefixes.push(prefix.to_owned());
            dead.insert(prefix, (index, lock, 0));
        } else {
            held.push(prefix);
        }
    }
    for (name, is_file) in &listed {
        if name.ends_with(TEMP_LOCK_SUFFIX) {
            continue;
        }
        // `<pid>.<random>.<n>`: the prefix is everything before the last dot.
        let (prefix, n) = match name.rsplit_once('.') {
            Some((prefix, n)) => (prefix, n.parse::<u64>().ok()),
            None => (name.as_str(), None),
        };
        let remove = match dead.get_mut(prefix) {
            Some((index, _, kept)) => {
                // Sizes are not checked: pooled files are small, and the
                // others (writes in flight when a process crashed) are few;
                // a reuse cuts any file to its new length.
                match n {
                    Some(n) if *is_file && adopted.files.len() < INODE_POOL_FILES_MAX => {
                        adopted.files.push((*index, n));
                        *kept += 1;
                        false
                    }
                    _ => true,
                }
            }
            None if held.contains(&prefix) => false,
            None => fs::metadata(temp_dir.join(name))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > TEMP_FILE_STALE_AGE),
        };
        if remove {
            // Best effort: another process may remove it at the same time.
            let _ = fs::remove_file(temp_dir.join(name));
        }
    }
    for (prefix, (_, lock, kept)) in dead {
        if kept == 0 {
            let _ = fs::remove_file(temp_dir.join(format!("{prefix}{TEMP_LOCK_SUFFIX}")));
        } else {
            adopted.locks.push(lock);
        }
    }
    adopted
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

    /// Names and sizes from the folders and one `statx` per file (type and
    /// size only, see `shape_of`): no object is read. The store's compaction
    /// used to read and hash every record it then deleted, and the `fstat`
    /// of each made the next journal append write its inode as well.
    async fn list_keys(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let mut all = Vec::new();
        let mut after: Option<String> = None;
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

/// What a listing learns of each object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// Everything: each object is read for its etag.
    Full,
    /// Its key and size only (the etag is left empty and the time is the
    /// epoch): for [`Bucket::list_keys`], which passes on neither.
    Size,
}

/// A page of the listing: the folder's, with the young objects merged in
/// (they replace the older files of their keys).
fn list_merged(
    young: Option<&Young>,
    root: &Path,
    prefix: &str,
    start_after: Option<&str>,
    reader: Reader,
    detail: Detail,
) -> Result<ListPage, ReadFailure> {
    let disk = || list_page_with(root, prefix, start_after, reader, detail);
    let Some(young) = young else {
        return disk();
    };
    // One more than a page: a page holds no young key past the first
    // page's worth of them.
    let (mut listed, page) = young.list(
        |index| young::listed(index, prefix, start_after, LIST_PAGE_OBJECTS_MAX + 1),
        disk,
    );
    let page = page?;
    if listed.is_empty() {
        return Ok(page);
    }
    let cut = listed.len() > LIST_PAGE_OBJECTS_MAX;
    listed.truncate(LIST_PAGE_OBJECTS_MAX);
    // With more to come, young keys past this page's last are later pages'.
    let bound = page.next.clone();
    let mut merged: std::collections::BTreeMap<String, ObjectMeta> = page
        .objects
        .into_iter()
        .map(|meta| (meta.key.clone(), meta))
        .collect();
    for meta in listed {
        if bound
            .as_deref()
            .is_some_and(|last| meta.key.as_str() > last)
        {
            break;
        }
        merged.insert(meta.key.clone(), meta);
    }
    let mut objects: Vec<ObjectMeta> = merged.into_values().collect();
    let mut next = bound;
    if objects.len() > LIST_PAGE_OBJECTS_MAX || cut {
        objects.truncate(LIST_PAGE_OBJECTS_MAX);
        next = objects.last().map(|meta| meta.key.clone());
    }
    Ok(ListPage { objects, next })
}

/// Walks the folder in key order (a folder `d` sorts as `d/`), collecting
/// keys under `prefix` after `start_after`, up to one page.
fn list_page_with(
    root: &Path,
    prefix: &str,
    start_after: Option<&str>,
    reader: Reader,
    detail: Detail,
) -> Result<ListPage, ReadFailure> {
    // The deepest folder fully named by the prefix.
    let (dir_key, _) = prefix
        .rsplit_once('/')
        .map_or(("", prefix), |(d, rest)| (d, rest));
    let dir_key_slash = if dir_key.is_empty() {
        String::new()
    } else {
        format!("{dir_key}/")
    };
    let mut out = Vec::new();
    let mut more = false;
    let mut walk = Walk {
        root,
        prefix,
        start_after,
        out: &mut out,
        more: &mut more,
        reader,
        detail,
    };
    walk.dir(&dir_key_slash)?;
    let next = if more {
        out.last().map(|m| m.key.clone())
    } else {
        None
    };
    Ok(ListPage { objects: out, next })
}

struct Walk<'a> {
    root: &'a Path,
    prefix: &'a str,
    start_after: Option<&'a str>,
    out: &'a mut Vec<ObjectMeta>,
    more: &'a mut bool,
    reader: Reader,
    detail: Detail,
}

impl Walk<'_> {
    /// Visits the folder whose keys start with `dir_key` ("" or ending in '/').
    /// Returns false once the page is full.
    fn dir(&mut self, dir_key: &str) -> Result<bool, ReadFailure> {
        let path = self.root.join(dir_key);
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if is_missing(&e) => return Ok(true),
            Err(e) => return Err(io_unavailable(dir_key, "list", &e).into()),
        };
        let mut children: Vec<(String, bool)> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io_unavailable(dir_key, "list", &e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if dir_key.is_empty() && (name == LOCKS_DIR || name == TEMP_DIR || name == JOURNAL_DIR)
            {
                continue;
            }
            let is_dir = entry
                .file_type()
                .map_err(|e| io_unavailable(dir_key, "list", &e))?
                .is_dir();
            let sort_key = if is_dir {
                format!("{dir_key}{name}/")
            } else {
                format!("{dir_key}{name}")
            };
            children.push((sort_key, is_dir));
            // A long listing goes to a blocking thread before this one
            // spent anything on it.
            if self.reader == Reader::Inline && children.len() > INLINE_LIST_OBJECTS_MAX {
                return Err(ReadFailure::WouldBlock);
            }
        }
        children.sort();
        for (key, is_dir) in children {
            // Subtrees and files that cannot match the prefix.
            if !(key.starts_with(self.prefix) || (is_dir && self.prefix.starts_with(&key))) {
                continue;
            }
            if let Some(after) = self.start_after {
                // Everything under `key` sorts before `after` unless `after` is inside it.
                if key.as_str() <= after && !(is_dir && after.starts_with(&key)) {
                    continue;
                }
            }
            if is_dir {
                if !self.dir(&key)? {
                    return Ok(false);
                }
                continue;
            }
            if self.reader == Reader::Inline && self.out.len() == INLINE_LIST_OBJECTS_MAX {
                return Err(ReadFailure::WouldBlock);
            }
            let meta = match self.detail {
                Detail::Full => read_object(self.root, &key, self.reader)?.map(|o| o.meta),
                Detail::Size => match shape_of(&self.root.join(&key)) {
                    Ok(shape) if shape.dir => None,
                    Ok(shape) => Some(ObjectMeta {
                        key,
                        etag: Etag(String::new()),
                        last_modified: SystemTime::UNIX_EPOCH,
                        size: shape.len,
                    }),
                    Err(e) if is_missing(&e) => None,
                    Err(e) => return Err(io_unavailable(&key, "stat", &e).into()),
                },
            };
            let Some(meta) = meta else {
                continue;
            };
            if self.out.len() == LIST_PAGE_OBJECTS_MAX {
                *self.more = true;
                return Ok(false);
            }
            self.out.push(meta);
        }
        Ok(true)
    }
}

/// The committer thread's state.
struct Committer {
    root: Arc<PathBuf>,
    root_dir: File,
    locks: Vec<Option<File>>,
    sync_mode: SyncMode,
    temp_prefix: String,
    /// `.tmp/<temp_prefix>.lock`, locked while the committer runs.
    temp_lock: File,
    /// The lock files of gone processes whose temporary files joined the
    /// pool at open: held, so those files stay this process's own.
    adopted_locks: Vec<File>,
    /// The files of gone processes, from the thread that looks at them at
    /// open; taken in at the first batch after they arrive.
    adoption: Option<std::sync::mpsc::Receiver<Adopted>>,
    /// Journal mode: this process's place on the folder (ADR 0034).
    solo: Option<Solo>,
    /// Orders reserved for batches alone on the folder, not used yet
    /// ([`Committer::reserve_solo_orders`]).
    solo_orders: std::ops::RangeInclusive<u64>,
    /// Alone on the folder: the names its folders may hold (ADR 0036).
    names: Names,
    temp_counter: u64,
    sync_pool: SyncPool,
    journal: Option<Journal>,
    pool: InodePool,
}

/// Files (under `.tmp/`) whose inodes the committer reuses for new
/// temporary files, oldest first.
struct InodePool {
    files: VecDeque<Spare>,
    /// The disk `files` hold, each size rounded up to whole blocks.
    bytes: u64,
    /// `.tmp/` and this process's prefix there: its own files are kept by
    /// number (`<prefix>.<n>`), not by path, so that a full pool costs
    /// ~3 MiB of memory rather than ~9.
    temp_dir: PathBuf,
    prefix: String,
    /// The prefixes of gone processes whose files were adopted at open.
    adopted_prefixes: Vec<String>,
    /// [`INODE_REUSE_GRACE`] (tests shorten it).
    grace: Duration,
    /// `renameat2(RENAME_EXCHANGE)` failed as unsupported on this file
    /// system: replaced files are unlinked by a plain rename instead.
    no_exchange: bool,
}

/// A kept file: which, when it left its key, and its size (`None`: not
/// known, for files adopted from a gone process).
struct Spare {
    name: SpareName,
    since: Instant,
    len: Option<u64>,
}

enum SpareName {
    /// `.tmp/<prefix>.<n>`, this process's own.
    Own(u64),
    /// `.tmp/<adopted prefix>.<n>`, adopted from a gone process.
    Adopted(u32, u64),
    /// Named otherwise.
    Other(Box<Path>),
}

/// The disk a file of `len` bytes holds, in whole blocks. A file adopted
/// without its size counts one block: it was pooled under the same limits.
fn held_bytes(len: Option<u64>) -> u64 {
    len.map_or(POOL_BLOCK_BYTES, |len| {
        len.div_ceil(POOL_BLOCK_BYTES) * POOL_BLOCK_BYTES
    })
}

impl InodePool {
    fn new(temp_dir: PathBuf, prefix: String, grace: Duration) -> Self {
        InodePool {
            files: VecDeque::new(),
            bytes: 0,
            temp_dir,
            prefix,
            adopted_prefixes: Vec::new(),
            grace,
            no_exchange: false,
        }
    }

    /// Takes in the files of gone processes (see [`adopt_temp_files`]).
    fn adopt(&mut self, prefixes: Vec<String>, files: &[(u32, u64)]) {
        self.adopted_prefixes = prefixes;
        let since = Instant::now();
        self.bytes += held_bytes(None) * files.len() as u64;
        for (prefix, n) in files {
            self.files.push_back(Spare {
                name: SpareName::Adopted(*prefix, *n),
                since,
                len: None,
            });
        }
    }

    /// Whether a file of `len` bytes leaving its key is kept.
    fn wants(&self, len: u64) -> bool {
        self.files.len() < INODE_POOL_FILES_MAX
            && len <= INODE_POOL_FILE_BYTES_MAX
            && self.bytes + held_bytes(Some(len)) <= INODE_POOL_BYTES_MAX
    }

    fn keep(&mut self, path: PathBuf, len: Option<u64>) {
        let parsed = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.rsplit_once('.'))
            .and_then(|(prefix, n)| Some((prefix, n.parse::<u64>().ok()?)))
            .filter(|_| path.parent() == Some(self.temp_dir.as_path()));
        let name = match parsed {
            Some((prefix, n)) if prefix == self.prefix => SpareName::Own(n),
            Some((prefix, n)) => match self.adopted_prefixes.iter().position(|p| p == prefix) {
                Some(i) => SpareName::Adopted(u32::try_from(i).unwrap_or(u32::MAX), n),
                None => SpareName::Other(path.into_boxed_path()),
            },
            None => SpareName::Other(path.into_boxed_path()),
        };
        self.bytes += held_bytes(len);
        self.files.push_back(Spare {
            name,
            since: Instant::now(),
            len,
        });
    }

    /// The path of this process's `n`th temporary file.
    fn own_path(&self, n: u64) -> PathBuf {
        self.temp_dir.join(format!("{}.{n}", self.prefix))
    }

    /// The oldest kept file that left its key at least the grace ago,
    /// opened for writing (not emptied: the writer overwrites it from the
    /// start, then cuts it to length). A file another process removed
    /// meanwhile (stale temporary files are removed at open) is skipped.
    fn take(&mut self) -> Option<(PathBuf, File, Option<u64>)> {
        while let Some(spare) = self.files.front() {
            if spare.since.elapsed() < self.grace {
                return None;
            }
            let spare = self.files.pop_front().expect("front exists");
            self.bytes -= held_bytes(spare.len);
            let path = match spare.name {
                SpareName::Own(n) => self.own_path(n),
                SpareName::Adopted(i, n) => match self.adopted_prefixes.get(i as usize) {
                    Some(prefix) => self.temp_dir.join(format!("{prefix}.{n}")),
                    None => continue,
                },
                SpareName::Other(path) => path.into_path_buf(),
            };
            if let Ok(file) = OpenOptions::new().write(true).open(&path) {
                return Some((path, file, spare.len));
            }
        }
        None
    }
}

/// The error of a rename into place at `key`.
fn rename_error(key: &str, e: &io::Error) -> Error {
    if e.kind() == io::ErrorKind::IsADirectory || e.raw_os_error() == Some(libc::ENOTDIR) {
        prefix_collision(key)
    } else {
        io_unavailable(key, "rename into place", e)
    }
}

/// Swaps two paths atomically (`renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: two valid NUL-terminated paths that live across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The state of the keys a batch wrote so far (etag and size; `None`:
/// deleted), which its later requests see.
type Overlay = HashMap<String, Option<(Etag, u64)>, crate::KeyHasher>;

/// What one request of a batch turned into.
enum Plan {
    Answered(Result<Option<ObjectMeta>>),
    /// `journaled`: the body goes into the journal (the file is not synced).
    /// `replaces`: the size of the object it replaces, if one exists.
    Write {
        temp: PathBuf,
        meta: ObjectMeta,
        journaled: bool,
        replaces: Option<u64>,
    },
    /// A journaled write whose file is made while the journal flushes.
    Pending {
        etag: Etag,
        replaces: Option<u64>,
    },
    /// A journaled write that stays young (solo mode, ADR 0034): no file
    /// until a checkpoint.
    Young {
        etag: Etag,
        size: u64,
        /// An older file of the key may be in place (see
        /// [`YoungObject::file_below`]).
        file_below: bool,
        /// `file_below` is the young object's that this one replaces: if a
        /// checkpoint puts that one in place before this one is indexed,
        /// a file is there after all.
        over_young: bool,
    },
    /// `existed`: the size of the object removed, if one exists.
    Remove {
        existed: Option<u64>,
        durable: bool,
    },
}

/// What [`Committer::exists`] found of a key.
struct Existing {
    /// The object's size, if there is one.
    len: Option<u64>,
    /// A file of the key may be in place (under a young object too).
    file: bool,
    /// The object is young.
    young: bool,
}

/// Opens (creating it if needed) a small file that is read under a lock on
/// every batch: a stripe's lock file with its counter, the journal's epoch.
/// Without `O_NOATIME`, each read after the counter's last write would
/// update the file's access time (`relatime`) and dirty its inode for the
/// next flush or checkpoint to write. Where the flag is refused (a file of
/// another user), the file opens without it.
pub(crate) fn open_counter_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags: libc::c_int| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
}

pub(crate) fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) fn syncfs(file: &File) -> io::Result<()> {
    // SAFETY: syncfs on a file descriptor we own; no memory is passed.
    let rc = unsafe { libc::syncfs(file.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How long the committer polls for its next write before it sleeps, while
/// writes come that soon (ADR 0032).
pub const ARRIVAL_POLL_MAX: Duration = Duration::from_micros(150);
/// How long a lone writer polls for its answer before it sleeps, while the
/// committer polls too (ADR 0032): about two flushes of a fast disk.
pub const ANSWER_POLL_MAX: Duration = Duration::from_micros(300);
/// How long a batch of unhurried writes waits for a write in a hurry to
/// share its flush with, while writes come in quick succession (ADR 0041).
pub const UNHURRIED_WAIT_MAX: Duration = Duration::from_micros(300);

/// What the writers and the committer share to decide whether a writer
/// polls for its answer instead of sleeping (ADR 0032). A writer polls only
/// when its write is the only one in flight and the committer polls for its
/// writes (they come in quick succession): one writer waiting on its
/// flush, with nothing else for the runtime to do. With more writes in
/// flight, or writes far apart, polling would take time from other work
/// (measured: 15 % of S1 c=16, 8 % of S3).
#[derive(Debug, Default)]
struct Polling {
    /// Writes sent to the committer and not yet answered.
    in_flight: AtomicUsize,
    /// The committer polls for its next write ([`Arrivals::polls`]).
    quick: AtomicBool,
    /// A writer is polling for its answer (one at a time).
    writer_polls: AtomicBool,
    /// Writes committed on their writer's thread (ADR 0045).
    led: AtomicU64,
}

/// Counts a write as in flight until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Clears the "a writer is polling" flag when its poll ends or is dropped.
struct PollingNow<'a>(&'a AtomicBool);

impl Drop for PollingNow<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Polling {
    fn write_sent(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(&self.in_flight)
    }

    /// The committer's answer to a write: polled for up to
    /// [`ANSWER_POLL_MAX`] (yielding to the runtime's other tasks and its
    /// I/O between polls) when the write is alone and writes come quickly,
    /// then awaited.
    async fn answer<T>(
        &self,
        answer: oneshot::Receiver<T>,
    ) -> std::result::Result<T, oneshot::error::RecvError> {
        self.answer_within(answer, ANSWER_POLL_MAX).await
    }

    async fn answer_within<T>(
        &self,
        mut answer: oneshot::Receiver<T>,
        poll_max: Duration,
    ) -> std::result::Result<T, oneshot::error::RecvError> {
        if self.in_flight.load(Ordering::Acquire) == 1
            && self.quick.load(Ordering::Acquire)
            && !self.writer_polls.swap(true, Ordering::AcqRel)
        {
            let _polling = PollingNow(&self.writer_polls);
            let started = Instant::now();
            loop {
                match answer.try_recv() {
                    Ok(value) => return Ok(value),
                    Err(oneshot::error::TryRecvError::Closed) => break,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if started.elapsed() >= poll_max {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        answer.await
    }
}

/// The committer's recent waits for a write: it polls for the next one (and
/// yields the core between polls) only while most of the last four came
/// within [`ARRIVAL_POLL_MAX`]; otherwise it sleeps at once. A sleeping
/// thread costs the writer a wake-up, which on a VM is tens of µs: about a
/// fifth of a one-writer commit (ADR 0032).
#[derive(Debug, Default)]
struct Arrivals {
    /// One bit per recent wait, newest lowest: set when it was short.
    recent: u8,
}

impl Arrivals {
    fn polls(&self) -> bool {
        (self.recent & 0b1111).count_ones() >= 3
    }

    fn note(&mut self, waited: Duration) {
        self.recent = (self.recent << 1) | u8::from(waited <= ARRIVAL_POLL_MAX);
    }

    /// The next batch: the next write and those queued behind it (at most
    /// [`COMMIT_BATCH_WRITES_MAX`]), or `None` once every sender is gone.
    ///
    /// A batch of unhurried writes alone (a snapshot) is not flushed for its
    /// own sake while writes come in quick succession: it waits up to
    /// `wait_max` for a write in a hurry and goes with it. Flushed alone, the
    /// next write (the same actor's next record, a few µs later) would wait
    /// for that whole flush before its own began (ADR 0041).
    fn next_batch(
        &mut self,
        receiver: &mut mpsc::Receiver<WriteRequest>,
        wait_max: Duration,
    ) -> Option<Vec<WriteRequest>> {
        let first = self.next(receiver)?;
        let mut batch = vec![first];
        while batch.len() < COMMIT_BATCH_WRITES_MAX {
            match receiver.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        if !self.polls() || !waits_for_a_hurried_write(&batch) {
            return Some(batch);
        }
        let started = Instant::now();
        while batch.len() < COMMIT_BATCH_WRITES_MAX && started.elapsed() < wait_max {
            match receiver.try_recv() {
                Ok(request) => {
                    let hurried = !request.unhurried;
                    batch.push(request);
                    if hurried {
                        break;
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
        Some(batch)
    }

    /// The next write, or `None` once every sender is gone.
    fn next(&mut self, receiver: &mut mpsc::Receiver<WriteRequest>) -> Option<WriteRequest> {
        let started = Instant::now();
        if self.polls() {
            loop {
                match receiver.try_recv() {
                    Ok(request) => {
                        self.note(started.elapsed());
                        return Some(request);
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                    Err(mpsc::error::TryRecvError::Empty) => {}
                }
                if started.elapsed() >= ARRIVAL_POLL_MAX {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let request = receiver.blocking_recv();
        self.note(started.elapsed());
        request
    }
}

/// Whether a batch is worth holding back for a write in a hurry: it is all
/// unhurried, and something in it needs a flush to share. Deletes that
/// need not be durable are flushed for nobody, so a batch of those alone
/// (a compaction step, ADR 0042) goes at once.
fn waits_for_a_hurried_write(batch: &[WriteRequest]) -> bool {
    batch.iter().all(|r| r.unhurried)
        && batch
            .iter()
            .any(|r| !matches!(r.op, WriteOp::DeleteNotDurable))
}

/// The committer's thread: commits the queued writes batch by batch (a lone
/// writer may take the committer between two batches, ADR 0045), then
/// closes the journal once every sender is gone.
fn run_committer(
    committer: &parking_lot::Mutex<Committer>,
    polling: &Polling,
    mut receiver: mpsc::Receiver<WriteRequest>,
) {
    committer.lock().reserve_at_start();
    let mut arrivals = Arrivals::default();
    while let Some(batch) = arrivals.next_batch(&mut receiver, UNHURRIED_WAIT_MAX) {
        polling.quick.store(arrivals.polls(), Ordering::Release);
        committer.lock().commit(batch);
    }
    committer.lock().close();
}

impl Committer {
    /// After the last batch: the journal's last checkpoint, and the
    /// temporary files left for the next process.
    fn close(&mut self) {
        // A knock seen now is answered before the last checkpoint.
        if let Some(solo) = &mut self.solo {
            drop(solo.watcher.take());
        }
        if let Some(journal) = self.journal.take() {
            journal.close();
        }
        // The pool stays for the next process on this folder to adopt (see
        // `adopt_temp_files`), with the lock file that names it as gone once
        // unlocked; without a pool the lock file goes too.
        if self.pool.files.is_empty() {
            let lock = self
                .root
                .join(TEMP_DIR)
                .join(format!("{}{TEMP_LOCK_SUFFIX}", self.temp_prefix));
            let _ = fs::remove_file(lock);
        }
        let _ = flock(&self.temp_lock, libc::LOCK_UN);
        self.adopted_locks.clear();
    }

    fn lock_file(&mut self, stripe: usize) -> io::Result<&File> {
        let slot = &mut self.locks[stripe];
        if slot.is_none() {
            let path = self.root.join(LOCKS_DIR).join(format!("{stripe:02x}"));
            *slot = Some(open_counter_file(&path)?);
        }
        Ok(slot.as_ref().expect("set just above"))
    }

    /// Takes in the files of gone processes once they were looked at.
    /// Adopted files wait out the grace like any other: a reader elsewhere
    /// may have opened one before its process died.
    fn take_adopted(&mut self) {
        let Some(adoption) = &self.adoption else {
            return;
        };
        match adoption.try_recv() {
            Ok(adopted) => {
                self.pool.adopt(adopted.prefixes, &adopted.files);
                self.adopted_locks.extend(adopted.locks);
                self.adoption = None;
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
            Err(std::sync::mpsc::TryRecvError::Disconnected) => self.adoption = None,
        }
    }

    fn commit(&mut self, batch: Vec<WriteRequest>) {
        self.take_adopted();
        // Held for the whole batch: leaving solo mode waits for it.
        let alone = self.solo.as_ref().map(|solo| Arc::clone(&solo.alone));
        let alone = alone.as_ref().map(|alone| alone.lock());
        let solo = alone.as_deref().copied().unwrap_or(false);
        if !solo {
            // Another process may write the folder from now on.
            self.names.forget();
        }
        let budget = journal_budget(&batch);
        if let Some(journal) = &mut self.journal
            && let Err(e) = journal.reserve(budget.iter().sum())
        {
            for request in batch {
                let _ = request.reply.send(Err(io_unavailable(
                    &request.key,
                    "make room in the journal",
                    &e,
                )));
            }
            return;
        }
        // Alone on the folder nobody else writes: no stripe is locked, and
        // the batch's order comes from a block reserved beforehand (ADR 0035).
        let stripes: BTreeSet<usize> = if solo {
            BTreeSet::new()
        } else {
            batch.iter().map(|r| stripe_of(&r.key)).collect()
        };
        let mut locked = Vec::with_capacity(stripes.len());
        for stripe in &stripes {
            let result = self
                .lock_file(*stripe)
                .and_then(|f| flock(f, libc::LOCK_EX));
            if let Err(e) = result {
                self.unlock(&locked);
                for request in batch {
                    let _ = request
                        .reply
                        .send(Err(io_unavailable(&request.key, "lock", &e)));
                }
                return;
            }
            locked.push(*stripe);
        }
        // Held for the batch when alone: see `Journal::begin_solo_batch`.
        let gate_lock = self.journal.as_ref().filter(|_| solo).map(Journal::gate);
        let gate = gate_lock.as_ref().map(|gate| gate.lock());
        let answers = if self.journal.is_some() {
            let begun = match &gate {
                Some(gate) => self.begin_solo_batch(gate),
                None => self.begin_journal_batch(&locked),
            };
            match begun {
                Ok(position) => {
                    let answers = self.commit_locked(&batch, &budget, Some(position), solo);
                    if let Some(journal) = &mut self.journal
                        && let Err(e) = journal.end_batch()
                    {
                        tracing::error!(error = %e, "folder bucket: releasing the epoch lock failed");
                    }
                    answers
                }
                Err(e) => batch
                    .iter()
                    .map(|r| Err(io_unavailable(&r.key, "start a journal batch", &e)))
                    .collect(),
            }
        } else {
            self.commit_locked(&batch, &budget, None, false)
        };
        drop(gate);
        self.unlock(&locked);
        for (request, answer) in batch.into_iter().zip(answers) {
            // The caller may have gone away; the write stands anyway.
            let _ = request.reply.send(answer);
        }
    }

    /// Alone on the folder at start: reserves the first block of orders now,
    /// while the process is still starting, so that its first write (a
    /// node's first lease write, which its first answer waits for) does not
    /// wait for it. On failure the first batch alone tries again.
    fn reserve_at_start(&mut self) {
        let Some(solo) = &self.solo else {
            return;
        };
        let alone = Arc::clone(&solo.alone);
        let alone = alone.lock();
        if !*alone || self.journal.is_none() {
            return;
        }
        match self.reserve_solo_orders() {
            Ok(orders) => self.solo_orders = orders,
            Err(e) => {
                tracing::warn!(error = %e, "folder bucket: reserving orders at start failed; the first batch tries again");
            }
        }
    }

    /// A batch alone on the folder: the next order of the block reserved for
    /// such batches, and the epoch under the journal's in-process gate.
    fn begin_solo_batch(
        &mut self,
        gate: &parking_lot::MutexGuard<'_, ()>,
    ) -> io::Result<JournalPosition> {
        if self.solo_orders.is_empty() {
            self.solo_orders = self.reserve_solo_orders()?;
        }
        let order = self
            .solo_orders
            .next()
            .expect("a reserved block is not empty");
        let journal = self.journal.as_mut().expect("journal mode");
        let epoch = journal.begin_solo_batch(gate)?;
        Ok(JournalPosition { epoch, order })
    }

    /// Moves every stripe's counter [`SOLO_ORDERS`] past the highest one and
    /// returns the orders in between, for batches alone on the folder. Any
    /// batch that starts from the counters later (this process's own once it
    /// shares the folder, or the next process's after this one died) orders
    /// after all of them, as the replay of journals after a reboot needs.
    fn reserve_solo_orders(&mut self) -> io::Result<std::ops::RangeInclusive<u64>> {
        let mut locked = Vec::with_capacity(LOCK_STRIPES);
        let reserved = (|| {
            for stripe in 0..LOCK_STRIPES {
                flock(self.lock_file(stripe)?, libc::LOCK_EX)?;
                locked.push(stripe);
            }
            // Every counter's block asked for at once: read one after the
            // other, stripe files that left the page cache cost a disk read
            // each in turn, ~12-15 ms of a node's start (see
            // `reserve_at_start`).
            for file in self.locks.iter().flatten() {
                // SAFETY: an open descriptor of ours; advice changes no data.
                unsafe {
                    libc::posix_fadvise(file.as_raw_fd(), 0, 8, libc::POSIX_FADV_WILLNEED);
                }
            }
            let mut highest = 0u64;
            for file in self.locks.iter().flatten() {
                highest = highest.max(read_u64(file, 0)?.unwrap_or(0));
            }
            let last = highest.checked_add(SOLO_ORDERS).ok_or_else(|| {
                io::Error::other("the stripe counters are at their end (2^64 batches)")
            })?;
            for file in self.locks.iter().flatten() {
                file.write_all_at(&last.to_le_bytes(), 0)?;
            }
            Ok(highest + 1..=last)
        })();
        self.unlock(&locked);
        // Not needed again until the next block or a batch in company (then
        // opened again one by one): no 256 descriptors held for nothing.
        self.locks.iter_mut().for_each(|slot| *slot = None);
        reserved
    }

    /// Takes the shared epoch lock and the batch's order (one more than the
    /// highest counter of its stripes, which all move to it). The epoch lock
    /// is released again on error.
    fn begin_journal_batch(&mut self, stripes: &[usize]) -> io::Result<JournalPosition> {
        let journal = self.journal.as_mut().expect("journal mode");
        let epoch = journal.begin_batch()?;
        let ordered = (|| {
            let mut order = 0u64;
            for stripe in stripes {
                let file = self.locks[*stripe].as_ref().expect("locked above");
                order = order.max(read_u64(file, 0)?.unwrap_or(0));
            }
            let order = order + 1;
            for stripe in stripes {
                let file = self.locks[*stripe].as_ref().expect("locked above");
                file.write_all_at(&order.to_le_bytes(), 0)?;
            }
            Ok(order)
        })();
        match ordered {
            Ok(order) => Ok(JournalPosition { epoch, order }),
            Err(e) => {
                let journal = self.journal.as_mut().expect("journal mode");
                let _ = journal.end_batch();
                Err(e)
            }
        }
    }

    fn unlock(&mut self, stripes: &[usize]) {
        for stripe in stripes {
            if let Some(file) = &self.locks[*stripe]
                && let Err(e) = flock(file, libc::LOCK_UN)
            {
                tracing::error!(stripe, error = %e, "folder bucket: unlock failed; closing the lock file");
                // Closing the descriptor releases the lock for sure.
                self.locks[*stripe] = None;
            }
        }
    }

    /// The key's etag and size now (this batch's earlier writes included);
    /// `None` when it is absent. Reads and hashes the object: only
    /// conditions on an etag need this.
    fn current(&self, overlay: &Overlay, key: &str) -> Result<Option<(Etag, u64)>> {
        if let Some(state) = overlay.get(key) {
            return Ok(state.clone());
        }
        if let Some(state) = self.young(key, |o| (o.etag.clone(), o.size)) {
            return Ok(Some(state));
        }
        if shape_of(&self.root.join(key)).is_ok_and(|shape| shape.dir) {
            return Err(prefix_collision(key));
        }
        Ok(read_object(&self.root, key, Reader::Blocking)
            .map_err(|f| f.into_error(key))?
            .map(|o| (o.meta.etag, o.meta.size)))
    }

    /// Whether the key exists now (this batch's earlier writes included),
    /// for the writes whose condition is only existence: from the young
    /// index, the names known alone on the folder (ADR 0036), or one `stat`.
    fn exists(&mut self, overlay: &Overlay, key: &str, put: bool, solo: bool) -> Result<Existing> {
        if let Some(state) = overlay.get(key) {
            // Written earlier in this batch: whether over a file is not kept.
            return Ok(Existing {
                len: state.as_ref().map(|(_, len)| *len),
                file: true,
                young: false,
            });
        }
        if let Some((size, file_below)) = self.young(key, |o| (o.size, o.file_below)) {
            return Ok(Existing {
                len: Some(size),
                file: file_below,
                young: true,
            });
        }
        let absent = Existing {
            len: None,
            file: false,
            young: false,
        };
        if solo
            && let Some(state) = &self.solo
            && self.names.known_absent(&self.root, &state.young, key)
        {
            return Ok(absent);
        }
        match shape_of(&self.root.join(key)) {
            Ok(shape) if shape.dir => Err(prefix_collision(key)),
            Ok(shape) => Ok(Existing {
                len: Some(shape.len),
                file: true,
                young: false,
            }),
            // A folder of the key is an object: the key cannot be written.
            Err(e) if put && e.raw_os_error() == Some(libc::ENOTDIR) => Err(prefix_collision(key)),
            Err(e) if is_missing(&e) => Ok(absent),
            Err(e) => Err(io_unavailable(key, "stat", &e)),
        }
    }

    /// `what` of the young object of `key`, if it is one.
    fn young<T>(&self, key: &str, what: impl FnOnce(&YoungObject) -> T) -> Option<T> {
        let solo = self.solo.as_ref()?;
        solo.young.objects().read().get(key).map(what)
    }

    /// Whether a put of `key` would make it a folder of a young object or
    /// an object in a young object's folder (this batch's young puts
    /// included, `young`): the folder could not hold both in place.
    fn collides_with_young(&self, overlay: &Overlay, key: &str, young: bool) -> bool {
        if let Some(solo) = &self.solo
            && young::collides(&solo.young.objects().read(), key)
        {
            return true;
        }
        if !young {
            // Renames find this batch's collisions on the disk.
            return false;
        }
        let ancestor = key
            .match_indices('/')
            .any(|(at, _)| matches!(overlay.get(&key[..at]), Some(Some(_))));
        ancestor
            || overlay.iter().any(|(k, state)| {
                state.is_some()
                    && k.len() > key.len()
                    && k.starts_with(key)
                    && k.as_bytes()[key.len()] == b'/'
            })
    }

    /// Makes `temp` the object at `target`. When it replaces an object
    /// (`replaces`: its size), the two are exchanged so the old inode stays
    /// at `temp` for reuse instead of being freed.
    fn place(&mut self, temp: &Path, target: &Path, replaces: Option<u64>) -> io::Result<()> {
        if let Some(len) = replaces
            && !self.pool.no_exchange
            && self.pool.wants(len)
        {
            match exchange(temp, target) {
                Ok(()) => {
                    self.pool.keep(temp.to_path_buf(), Some(len));
                    return Ok(());
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                    self.pool.no_exchange = true;
                }
                // Not there after all: a plain rename creates it.
                Err(e) if is_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        fs::rename(temp, target)
    }

    /// Removes the object at `target` (`len`: its size): moved into the
    /// pool when it is kept for reuse, unlinked otherwise.
    fn remove(&mut self, target: &Path, len: u64) -> io::Result<()> {
        if self.pool.wants(len) {
            let slot = self.next_temp_path();
            fs::rename(target, &slot)?;
            self.pool.keep(slot, Some(len));
            return Ok(());
        }
        fs::remove_file(target)
    }

    fn next_temp_path(&mut self) -> PathBuf {
        self.temp_counter += 1;
        self.root
            .join(TEMP_DIR)
            .join(format!("{}.{}", self.temp_prefix, self.temp_counter))
    }

    fn write_temp(&mut self, key: &str, bytes: &[u8], etag: Etag) -> Result<(PathBuf, ObjectMeta)> {
        let (temp, mut file, old_len) = match self.pool.take() {
            Some(reused) => reused,
            None => {
                let temp = self.next_temp_path();
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&temp)
                    .map_err(|e| io_unavailable(key, "create temp file", &e))?;
                (temp, file, Some(0))
            }
        };
        // A reused file is overwritten from its start and cut to the new
        // length afterwards: its blocks are reused too, and ext4 starts
        // writing back at once any file truncated to zero and rewritten
        // (`auto_da_alloc`), which would add a device write per object.
        // No `fstat`: its size is known, and asking for its times would
        // make every later timestamp fine-grained (see `shape_of`).
        let len = bytes.len() as u64;
        let written = file.write_all(bytes).and_then(|()| match old_len {
            Some(old) if old <= len => Ok(()),
            _ => file.set_len(len),
        });
        match written {
            // The time the write returned, as the S3 backend gives: a later
            // read reports the file's mtime, which is no later than this.
            Ok(()) => Ok((
                temp,
                ObjectMeta {
                    key: key.to_owned(),
                    etag,
                    last_modified: SystemTime::now(),
                    size: len,
                },
            )),
            Err(e) => {
                let _ = fs::remove_file(&temp);
                Err(io_unavailable(key, "write temp file", &e))
            }
        }
    }

    fn plan(
        &mut self,
        overlay: &mut Overlay,
        request: &WriteRequest,
        journaled: bool,
        solo: bool,
    ) -> Result<Plan> {
        let key = request.key.as_str();
        let put = matches!(
            request.op,
            WriteOp::Put(_) | WriteOp::PutIfAbsent(_) | WriteOp::PutIfMatch(_, _)
        );
        let young = journaled && solo;
        if put && self.collides_with_young(overlay, key, young) {
            return Err(prefix_collision(key));
        }
        // Whether a file of the key may be in place, and whether that came
        // from a young object (see `Plan::Young`).
        let (mut file_below, mut over_young) = (true, false);
        let current = match &request.op {
            WriteOp::PutIfMatch(_, _) | WriteOp::DeleteIfMatch(_) => self.current(overlay, key)?,
            // Existence is all these ask (one stat, where reading and hashing
            // the object cost a fifth of the committer's time): an empty etag
            // stands for "present", and these arms never compare it.
            WriteOp::Put(_)
            | WriteOp::PutIfAbsent(_)
            | WriteOp::Delete
            | WriteOp::DeleteNotDurable => {
                let existing = self.exists(overlay, key, put, solo)?;
                (file_below, over_young) = (existing.file, existing.young);
                existing.len.map(|len| (Etag(String::new()), len))
            }
        };
        let existing_len = current.as_ref().map(|(_, len)| *len);
        let current = current.map(|(etag, _)| etag);
        let conflict = || {
            Err(Error::Conflict {
                key: key.to_owned(),
            })
        };
        let not_found = || {
            Err(Error::NotFound {
                key: key.to_owned(),
            })
        };
        let bytes = match (&request.op, &current) {
            (WriteOp::Put(b), _) | (WriteOp::PutIfAbsent(b), None) => b,
            (WriteOp::PutIfAbsent(_), Some(_)) => return conflict(),
            (WriteOp::PutIfMatch(_, _) | WriteOp::DeleteIfMatch(_), None) => return not_found(),
            (WriteOp::PutIfMatch(b, want), Some(have)) => {
                if want != have {
                    return conflict();
                }
                b
            }
            (WriteOp::DeleteIfMatch(want), Some(have)) if want != have => return conflict(),
            (WriteOp::Delete | WriteOp::DeleteIfMatch(_) | WriteOp::DeleteNotDurable, _) => {
                overlay.insert(key.to_owned(), None);
                return Ok(Plan::Remove {
                    existed: existing_len,
                    durable: !matches!(request.op, WriteOp::DeleteNotDurable),
                });
            }
        };
        let etag = content_etag(bytes);
        overlay.insert(key.to_owned(), Some((etag.clone(), bytes.len() as u64)));
        if young {
            return Ok(Plan::Young {
                etag,
                size: bytes.len() as u64,
                file_below,
                over_young,
            });
        }
        if journaled {
            return Ok(Plan::Pending {
                etag,
                replaces: existing_len,
            });
        }
        let (temp, meta) = self.write_temp(key, bytes, etag)?;
        Ok(Plan::Write {
            temp,
            meta,
            journaled,
            replaces: existing_len,
        })
    }

    /// Writes the files of the batch's journaled writes (their entries are
    /// in the journal). A failure here answers "outcome unknown": the entry
    /// may be durable, and a replay after a reboot would apply it.
    fn make_pending_files(&mut self, plans: &mut [Plan], batch: &[WriteRequest]) {
        for (plan, request) in plans.iter_mut().zip(batch) {
            let Plan::Pending { etag, replaces } = plan else {
                continue;
            };
            let replaces = *replaces;
            let bytes = match &request.op {
                WriteOp::Put(b) | WriteOp::PutIfAbsent(b) | WriteOp::PutIfMatch(b, _) => b,
                WriteOp::Delete | WriteOp::DeleteNotDurable | WriteOp::DeleteIfMatch(_) => {
                    unreachable!("only writes with a body are pending")
                }
            };
            let etag = std::mem::replace(etag, Etag(String::new()));
            *plan = match self.write_temp(&request.key, bytes, etag) {
                Ok((temp, meta)) => Plan::Write {
                    temp,
                    meta,
                    journaled: true,
                    replaces,
                },
                Err(e) => Plan::Answered(Err(Error::OutcomeUnknown {
                    key: request.key.clone(),
                    reason: format!("journaled, but its file was not written: {e}"),
                })),
            };
        }
    }

    fn commit_locked(
        &mut self,
        batch: &[WriteRequest],
        budget: &[usize],
        journal: Option<JournalPosition>,
        solo: bool,
    ) -> Vec<Result<Option<ObjectMeta>>> {
        let mut overlay = Overlay::default();
        let mut plans: Vec<Plan> = batch
            .iter()
            .zip(budget)
            .map(|(r, bytes)| {
                let journaled = journal.is_some() && *bytes > 0;
                self.plan(&mut overlay, r, journaled, solo)
                    .unwrap_or_else(|e| Plan::Answered(Err(e)))
            })
            .collect();
        // Where each young write's entry sits in the journal.
        let mut young_at: Vec<Option<EntryAt>> = Vec::new();

        // 1. Make the new files that the journal does not hold durable
        //    before any of them becomes visible.
        let temps: Vec<&Path> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Write {
                    temp,
                    journaled: false,
                    ..
                } => Some(temp.as_path()),
                _ => None,
            })
            .collect();
        if !temps.is_empty()
            && let Err(e) = self.sync_files(&temps)
        {
            fail_unapplied(&mut plans, batch, "sync new files", &e);
        }

        // 1b. Journal mode: the journaled writes and deletes, durable in the
        //     journal before any of them becomes visible.
        if let Some(position) = journal {
            // Which plan each entry is of, and whether any must be durable.
            let mut entry_plans = Vec::new();
            let mut durable_entries = false;
            let entries: Vec<Entry<'_>> = plans
                .iter()
                .zip(batch)
                .enumerate()
                .filter_map(|(at, (plan, request))| {
                    let index = u32::try_from(at).expect("batches are small");
                    let entry = match (plan, &request.op) {
                        (
                            Plan::Pending { .. } | Plan::Young { .. },
                            WriteOp::Put(body)
                            | WriteOp::PutIfAbsent(body)
                            | WriteOp::PutIfMatch(body, _),
                        ) => Entry {
                            index,
                            kind: EntryKind::Put,
                            key: &request.key,
                            body,
                            young: solo,
                        },
                        // Alone, a delete that need not be durable is
                        // journaled too (not flushed for its own sake):
                        // else a crash would bring back every young object
                        // deleted since the last checkpoint, and the next
                        // open would write each of them as a file.
                        (
                            Plan::Remove {
                                existed: Some(_),
                                durable,
                            },
                            _,
                        ) if *durable || solo => Entry {
                            index,
                            kind: EntryKind::Delete,
                            key: &request.key,
                            body: &[],
                            young: solo,
                        },
                        _ => return None,
                    };
                    durable_entries |= !matches!(plan, Plan::Remove { durable: false, .. });
                    entry_plans.push(at);
                    Some(entry)
                })
                .collect();
            // The new files are made before the journal's flush: invisible
            // until renamed, which waits for the flush.
            let mut journal = self.journal.take().expect("journal mode");
            let appended = journal.append_with(
                position.epoch,
                position.order,
                &entries,
                durable_entries,
                || {
                    self.make_pending_files(&mut plans, batch);
                },
            );
            if appended.is_ok() && solo {
                young_at = vec![None; plans.len()];
                for (plan, at) in entry_plans.iter().zip(journal.appended()) {
                    young_at[*plan] = Some(*at);
                }
            }
            self.journal = Some(journal);
            drop(entries);
            if let Err(e) = appended {
                fail_unapplied(&mut plans, batch, "append to the journal", &e);
            }
        }

        // 2. Rename into place / remove, in request order. Folders to sync:
        //    those of writes and deletes the journal does not hold.
        let mut touched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
        let mut unsynced_dirs: BTreeSet<PathBuf> = BTreeSet::new();
        let mut answers = Vec::with_capacity(plans.len());
        let mut applied = Vec::with_capacity(plans.len());
        let mut markers = Vec::new();
        // The young index changes with the files (see `young.rs`); its lock
        // is needed only while it may hold something.
        let solo_state = self.solo.as_ref().map(|s| Arc::clone(&s.young));
        let mut index_guard = solo_state.as_ref().and_then(|young| {
            let objects = young.objects().write();
            (solo || !objects.is_empty()).then_some(objects)
        });
        let now = SystemTime::now();
        for (index, (plan, request)) in plans.into_iter().zip(batch).enumerate() {
            let key = request.key.as_str();
            let target = self.root.join(key);
            // A write or delete of a young key replaces its young object
            // once (and only if) it applied: a failed one leaves it.
            let was_young = index_guard
                .as_ref()
                .is_some_and(|objects| objects.contains_key(key));
            let answer = match plan {
                Plan::Answered(answer) => {
                    applied.push(false);
                    answer
                }
                Plan::Pending { .. } => {
                    applied.push(false);
                    Err(Error::OutcomeUnknown {
                        key: key.to_owned(),
                        reason: "internal: a journaled write without its file".to_owned(),
                    })
                }
                Plan::Young {
                    etag,
                    size,
                    file_below,
                    over_young,
                } => {
                    applied.push(false);
                    match (
                        young_at.get(index).copied().flatten(),
                        index_guard.as_mut(),
                        journal,
                    ) {
                        (Some(at), Some(objects), Some(position)) => {
                            // Before a checkpoint can put it in place.
                            self.names.note_present(key);
                            objects.insert(
                                key,
                                YoungObject {
                                    at,
                                    epoch: position.epoch,
                                    etag: etag.clone(),
                                    size,
                                    modified: now,
                                    file_below: file_below || (over_young && !was_young),
                                },
                            );
                            Ok(Some(ObjectMeta {
                                key: key.to_owned(),
                                etag,
                                last_modified: now,
                                size,
                            }))
                        }
                        _ => Err(Error::OutcomeUnknown {
                            key: key.to_owned(),
                            reason: "internal: a young write without its journal entry".to_owned(),
                        }),
                    }
                }
                Plan::Write {
                    temp,
                    meta,
                    journaled,
                    replaces,
                } => {
                    let dirs = if journaled {
                        &mut unsynced_dirs
                    } else {
                        &mut touched_dirs
                    };
                    // Most keys' folders exist: their parents are made (and
                    // looked at) only when the rename finds none.
                    self.names.note_present(key);
                    let moved = match self.place(&temp, &target, replaces) {
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {
                            self.create_parents(&target, dirs).and_then(|()| {
                                self.place(&temp, &target, replaces)
                                    .map_err(|e| rename_error(key, &e))
                            })
                        }
                        placed => placed.map_err(|e| rename_error(key, &e)),
                    };
                    if moved.is_err() {
                        let _ = fs::remove_file(&temp);
                    }
                    applied.push(moved.is_ok() && !journaled);
                    if !journaled && let Some(parent) = target.parent() {
                        touched_dirs.insert(parent.to_path_buf());
                    }
                    if moved.is_ok() && !journaled && journal.is_some() {
                        markers.push(index);
                    }
                    if moved.is_ok()
                        && was_young
                        && let Some(objects) = index_guard.as_mut()
                    {
                        objects.remove(key);
                    }
                    moved.map(|()| Some(meta))
                }
                Plan::Remove { existed, durable } => {
                    let removed = if was_young {
                        // Its file, if any, is older than the young object.
                        let file_below = index_guard
                            .as_ref()
                            .and_then(|objects| objects.get(key))
                            .is_none_or(|object| object.file_below);
                        let unlinked = match file_below.then(|| fs::remove_file(&target)) {
                            Some(Err(e)) if !is_missing(&e) => {
                                Err(io_unavailable(key, "remove", &e))
                            }
                            _ => Ok(None),
                        };
                        if unlinked.is_ok()
                            && let Some(objects) = index_guard.as_mut()
                        {
                            objects.remove(key);
                        }
                        unlinked
                    } else if let Some(len) = existed {
                        match self.remove(&target, len) {
                            Ok(()) => Ok(None),
                            Err(e) if is_missing(&e) => Ok(None),
                            Err(e) => Err(io_unavailable(key, "remove", &e)),
                        }
                    } else {
                        Ok(None)
                    };
                    if removed.is_ok() {
                        self.names.note_gone(key);
                    }
                    let synced_here = existed.is_some() && durable && journal.is_none();
                    applied.push(synced_here && removed.is_ok());
                    if synced_here && let Some(parent) = target.parent() {
                        touched_dirs.insert(parent.to_path_buf());
                    }
                    removed
                }
            };
            answers.push(answer);
        }

        // 3. Make the renames durable (those the journal does not hold).
        if !touched_dirs.is_empty()
            && let Err(e) = self.sync_dirs(&touched_dirs)
        {
            for ((answer, request), applied) in answers.iter_mut().zip(batch).zip(&applied) {
                if *applied {
                    *answer = Err(Error::OutcomeUnknown {
                        key: request.key.clone(),
                        reason: format!("sync after rename failed: {e}"),
                    });
                }
            }
            markers.clear();
        }

        drop(index_guard);

        // 4. Journal mode: mark the writes synced in place, so an older
        //    journaled entry for their key is never replayed over them.
        if let Some(position) = journal
            && !markers.is_empty()
        {
            let entries: Vec<Entry<'_>> = markers
                .iter()
                .map(|index| Entry {
                    index: u32::try_from(*index).expect("batches are small"),
                    kind: EntryKind::Durable,
                    key: &batch[*index].key,
                    body: &[],
                    young: solo,
                })
                .collect();
            let appended = self.journal.as_mut().expect("journal mode").append(
                position.epoch,
                position.order,
                &entries,
                || {},
            );
            if let Err(e) = appended {
                for index in &markers {
                    answers[*index] = Err(Error::OutcomeUnknown {
                        key: batch[*index].key.clone(),
                        reason: format!("journal marker failed: {e}"),
                    });
                }
            }
        }
        answers
    }

    /// Creates the missing parent folders of `target`, remembering every
    /// folder whose entries changed so it gets synced.
    fn create_parents(&self, target: &Path, touched: &mut BTreeSet<PathBuf>) -> Result<()> {
        let key = target
            .strip_prefix(self.root.as_path())
            .unwrap_or(target)
            .to_string_lossy()
            .into_owned();
        let Some(parent) = target.parent() else {
            return Ok(());
        };
        let mut missing = Vec::new();
        let mut dir = parent;
        while dir != self.root.as_path() {
            match shape_of(dir) {
                Ok(shape) if shape.dir => break,
                Ok(_) => return Err(prefix_collision(&key)),
                Err(e) if is_missing(&e) => missing.push(dir),
                Err(e) => return Err(io_unavailable(&key, "stat folder", &e)),
            }
            match dir.parent() {
                Some(p) => dir = p,
                None => break,
            }
        }
        for dir in missing.into_iter().rev() {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::AlreadyExists
                        && shape_of(dir).is_ok_and(|shape| shape.dir) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::AlreadyExists
                        || e.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    return Err(prefix_collision(&key));
                }
                Err(e) => return Err(io_unavailable(&key, "create folder", &e)),
            }
            if let Some(p) = dir.parent() {
                touched.insert(p.to_path_buf());
            }
        }
        Ok(())
    }

    fn sync_files(&self, temps: &[&Path]) -> io::Result<()> {
        match self.sync_mode {
            SyncMode::Syncfs | SyncMode::Journal if temps.len() > PER_FILE_SYNCS_MAX => {
                syncfs(&self.root_dir)
            }
            SyncMode::Syncfs | SyncMode::Journal | SyncMode::PerFile => {
                self.sync_pool.sync_all(temps, true)
            }
        }
    }

    fn sync_dirs(&self, dirs: &BTreeSet<PathBuf>) -> io::Result<()> {
        match self.sync_mode {
            SyncMode::Syncfs | SyncMode::Journal if dirs.len() > PER_FILE_SYNCS_MAX => {
                syncfs(&self.root_dir)
            }
            SyncMode::Syncfs | SyncMode::Journal | SyncMode::PerFile => {
                let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
                self.sync_pool.sync_all(&dirs, false)
            }
        }
    }
}

/// Batch orders reserved at a time for batches alone on the folder: at
/// 10,000 batches a second, one reservation (a lock, a read and a write of
/// each stripe's counter) every ~2 minutes.
const SOLO_ORDERS: u64 = 1 << 20;

/// No orders reserved (an empty range).
fn empty_orders() -> std::ops::RangeInclusive<u64> {
    let mut orders = 1..=1;
    orders.next();
    orders
}

/// Where a journal batch stands: its epoch and its order.
#[derive(Debug, Clone, Copy)]
struct JournalPosition {
    epoch: u64,
    order: u64,
}

/// The journal bytes each request of a batch may use (0: not journaled; its
/// file is synced in place instead). Bodies over [`JOURNAL_BODY_MAX`] and
/// everything past [`JOURNAL_BATCH_BYTES_MAX`] in a batch are not journaled;
/// deletes need a small entry, markers are counted for the rest.
fn journal_budget(batch: &[WriteRequest]) -> Vec<usize> {
    let mut used = 0usize;
    batch
        .iter()
        .map(|request| {
            let body = match &request.op {
                WriteOp::Put(b) | WriteOp::PutIfAbsent(b) | WriteOp::PutIfMatch(b, _) => {
                    Some(b.len())
                }
                // A non-durable delete is journaled alone on the folder.
                WriteOp::Delete | WriteOp::DeleteIfMatch(_) | WriteOp::DeleteNotDurable => Some(0),
            };
            let marker = entry_bytes(&request.key, 0);
            let bytes = match body {
                Some(len) if len <= JOURNAL_BODY_MAX => entry_bytes(&request.key, len),
                _ => 0,
            };
            if bytes > 0 && used + bytes <= JOURNAL_BATCH_BYTES_MAX {
                used += bytes;
                bytes
            } else {
                // Room for a marker.
                used += marker;
                0
            }
        })
        .collect()
}

/// Answers every plan not yet answered with `what` failed, removing its
/// temporary file: nothing of it was applied.
fn fail_unapplied(plans: &mut [Plan], batch: &[WriteRequest], what: &str, e: &io::Error) {
    for (plan, request) in plans.iter_mut().zip(batch) {
        if let Plan::Write { temp, .. } = plan {
            let _ = fs::remove_file(&temp);
        }
        if !matches!(plan, Plan::Answered(_)) {
            *plan = Plan::Answered(Err(io_unavailable(&request.key, what, e)));
        }
    }
}

/// Threads that sync files for the committer (the modes without a journal,
/// and bodies too large for the journal):
/// concurrent syncs share the file system's journal commits, where a loop
/// would wait for one commit per file. A thread is started when a job finds
/// none idle (up to the pool's limit) and then kept (spawning per batch
/// costs about as much as a sync on a busy machine); all stop when the pool
/// is dropped. In journal mode most processes never start one.
///
/// A job goes straight to the thread that became idle last (its stack and
/// caches are warm) and wakes only that thread. A shared receiver behind a
/// lock instead passed every job through the lock's queue of waiters: about
/// six thread switches per sync (measured when the journal flushed here),
/// spread over all the threads.
struct SyncPool {
    /// Shared with the threads, which hold it until they return.
    state: Arc<parking_lot::Mutex<SyncState>>,
    threads_max: usize,
}

impl Drop for SyncPool {
    fn drop(&mut self) {
        let idle = {
            let mut state = self.state.lock();
            state.stopped = true;
            std::mem::take(&mut state.idle)
        };
        for slot in idle {
            slot.thread.unpark();
        }
    }
}

struct SyncState {
    /// Threads started (idle or not).
    threads: usize,
    /// Jobs that found no idle thread, oldest first.
    queued: VecDeque<SyncJob>,
    /// Idle threads, the most recently idle last.
    idle: Vec<Arc<SyncSlot>>,
    stopped: bool,
}

/// One sync thread's hand-off slot.
struct SyncSlot {
    job: parking_lot::Mutex<Option<SyncJob>>,
    thread: std::thread::Thread,
}

/// `fdatasync` (`data_only`) or `fsync` of the file or folder at `path`.
struct SyncJob {
    path: PathBuf,
    data_only: bool,
    done: std::sync::mpsc::Sender<io::Result<()>>,
}

impl SyncJob {
    fn run(self) {
        let _ = self.done.send(sync_path(&self.path, self.data_only));
    }
}

/// `fdatasync` (`data_only`) or `fsync` of the file at `path`.
fn sync_path(path: &Path, data_only: bool) -> io::Result<()> {
    let file = File::open(path)?;
    if data_only {
        file.sync_data()
    } else {
        file.sync_all()
    }
}

/// A sync thread: takes a queued job, or waits idle for one handed to it,
/// until the pool stops.
fn sync_thread(shared: &parking_lot::Mutex<SyncState>) {
    let slot = Arc::new(SyncSlot {
        job: parking_lot::Mutex::new(None),
        thread: std::thread::current(),
    });
    loop {
        let queued = {
            let mut state = shared.lock();
            match state.queued.pop_front() {
                Some(job) => Some(job),
                None if state.stopped => return,
                None => {
                    state.idle.push(Arc::clone(&slot));
                    None
                }
            }
        };
        let job = match queued {
            Some(job) => job,
            None => loop {
                if let Some(job) = slot.job.lock().take() {
                    break job;
                }
                if shared.lock().stopped {
                    return;
                }
                std::thread::park();
            },
        };
        job.run();
    }
}

impl SyncPool {
    fn new(threads_max: usize) -> Self {
        SyncPool {
            state: Arc::new(parking_lot::Mutex::new(SyncState {
                threads: 0,
                queued: VecDeque::new(),
                idle: Vec::new(),
                stopped: false,
            })),
            threads_max,
        }
    }

    /// Hands one sync to the threads; its result arrives on `done`.
    fn submit(
        &self,
        path: &Path,
        data_only: bool,
        done: &std::sync::mpsc::Sender<io::Result<()>>,
    ) -> io::Result<()> {
        let job = SyncJob {
            path: path.to_path_buf(),
            data_only,
            done: done.clone(),
        };
        let mut state = self.state.lock();
        if state.stopped {
            return Err(io::Error::other("sync threads stopped"));
        }
        match state.idle.pop() {
            Some(slot) => {
                drop(state);
                *slot.job.lock() = Some(job);
                slot.thread.unpark();
            }
            None => {
                if state.threads < self.threads_max {
                    let shared = Arc::clone(&self.state);
                    match std::thread::Builder::new()
                        .name("wasmkeep-folder-sync".to_owned())
                        .spawn(move || sync_thread(&shared))
                    {
                        Ok(_) => state.threads += 1,
                        // Nobody would take the job.
                        Err(e) if state.threads == 0 => return Err(e),
                        Err(e) => {
                            tracing::warn!(error = %e, "folder bucket: could not start another sync thread");
                        }
                    }
                }
                state.queued.push_back(job);
            }
        }
        Ok(())
    }

    /// Syncs every path (all at once); the first error, if any.
    fn sync_all(&self, paths: &[&Path], data_only: bool) -> io::Result<()> {
        if let [only] = paths {
            return sync_path(only, data_only);
        }
        let (done, results) = std::sync::mpsc::channel();
        for path in paths {
            self.submit(path, data_only, &done)?;
        }
        drop(done);
        let mut first_error = None;
        for _ in 0..paths.len() {
            match results.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(io::Error::other("a sync thread stopped"));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_is_the_first_half_of_sha256_in_lower_case_hex() {
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 ...
        assert_eq!(content_etag(b"abc").0, "ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(content_etag(b"").0, "e3b0c44298fc1c149afbf4c8996fb924");
    }

    /// Reading a counter file leaves its access time alone: under the
    /// default `relatime`, a read after a write would otherwise update it
    /// (the access time is set older than the write, as after every batch).
    #[test]
    fn reading_a_counter_file_does_not_touch_its_access_time() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("00");
        let file = open_counter_file(&path).expect("created");
        file.write_all_at(&7u64.to_le_bytes(), 0).expect("written");
        let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        file.set_times(fs::FileTimes::new().set_accessed(long_ago))
            .expect("access time set");
        drop(file);

        let file = open_counter_file(&path).expect("opened again");
        let mut counter = [0u8; 8];
        file.read_exact_at(&mut counter, 0).expect("read");
        assert_eq!(u64::from_le_bytes(counter), 7);
        let accessed = fs::metadata(&path)
            .and_then(|m| m.accessed())
            .expect("access time");
        assert_eq!(accessed, long_ago, "the read updated the access time");
    }

    fn request_of(key: &str, op: WriteOp, unhurried: bool) -> WriteRequest {
        let (reply, _) = oneshot::channel();
        WriteRequest {
            key: key.to_owned(),
            op,
            unhurried,
            reply,
        }
    }

    fn delete_of(key: &str) -> WriteRequest {
        request_of(key, WriteOp::Delete, false)
    }

    fn unhurried_put_of(key: &str) -> WriteRequest {
        let body = Bytes::from_static(b"snapshot");
        request_of(key, WriteOp::PutIfAbsent(body), true)
    }

    fn quick_arrivals() -> Arrivals {
        let mut arrivals = Arrivals::default();
        for _ in 0..4 {
            arrivals.note(Duration::ZERO);
        }
        arrivals
    }

    fn keys_of(batch: &[WriteRequest]) -> Vec<&str> {
        batch.iter().map(|r| r.key.as_str()).collect()
    }

    /// The keys of the next batch, which must come.
    fn next_keys(
        arrivals: &mut Arrivals,
        receiver: &mut mpsc::Receiver<WriteRequest>,
        wait_max: Duration,
    ) -> Vec<String> {
        let batch = arrivals.next_batch(receiver, wait_max).expect("a batch");
        keys_of(&batch).into_iter().map(str::to_owned).collect()
    }

    /// While writes come quickly, unhurried writes wait for a write in a
    /// hurry and go in its batch; what comes after that write waits for the
    /// next batch.
    #[test]
    fn unhurried_writes_wait_for_a_hurried_one_to_share_its_flush() {
        let (sender, mut receiver) = mpsc::channel(8);
        let mut arrivals = quick_arrivals();
        sender.try_send(unhurried_put_of("snap/1")).expect("queued");
        let late = std::thread::spawn(move || {
            sender
                .blocking_send(unhurried_put_of("snap/2"))
                .expect("queued");
            sender.blocking_send(delete_of("log/1")).expect("queued");
            sender.blocking_send(delete_of("log/2")).expect("queued");
            sender
        });
        // Long enough never to run out on a loaded machine.
        let batch = arrivals
            .next_batch(&mut receiver, Duration::from_secs(60))
            .expect("a batch");
        let sender = late.join().expect("the sender thread");
        let keys = keys_of(&batch);
        assert_eq!(&keys[..3], ["snap/1", "snap/2", "log/1"]);
        // "log/2" may have been queued before the batch was taken.
        assert!(keys.len() <= 4, "{keys:?}");
        drop(sender);
    }

    /// Unhurried writes go at once when writes come far apart (no write in a
    /// hurry is on its way), and a polling wait ends at its limit or at the
    /// end of the queue.
    #[test]
    fn unhurried_writes_go_alone_when_nothing_comes() {
        let (sender, mut receiver) = mpsc::channel(8);
        let long = Duration::from_secs(60);
        sender.try_send(unhurried_put_of("snap/1")).expect("queued");
        let keys = next_keys(&mut Arrivals::default(), &mut receiver, long);
        assert_eq!(keys, ["snap/1"], "not polling: no wait");

        sender.try_send(unhurried_put_of("snap/2")).expect("queued");
        let keys = next_keys(
            &mut quick_arrivals(),
            &mut receiver,
            Duration::from_millis(1),
        );
        assert_eq!(keys, ["snap/2"], "the wait has a limit");

        let mut quick = quick_arrivals();
        sender.try_send(unhurried_put_of("snap/3")).expect("queued");
        drop(sender);
        let keys = next_keys(&mut quick, &mut receiver, long);
        assert_eq!(keys, ["snap/3"], "the queue ended");
        assert!(quick.next_batch(&mut receiver, Duration::ZERO).is_none());
    }

    /// Only a batch of unhurried writes with something to flush waits for a
    /// write in a hurry; a compaction step's deletes alone do not.
    #[test]
    fn only_unhurried_writes_with_a_flush_to_share_wait_for_a_hurried_one() {
        let forget = |key: &str| request_of(key, WriteOp::DeleteNotDurable, true);
        assert!(waits_for_a_hurried_write(&[unhurried_put_of("snap/1")]));
        assert!(waits_for_a_hurried_write(&[
            forget("log/1"),
            unhurried_put_of("snap/1")
        ]));
        assert!(!waits_for_a_hurried_write(&[
            forget("log/1"),
            forget("log/2")
        ]));
        assert!(!waits_for_a_hurried_write(&[
            unhurried_put_of("snap/1"),
            delete_of("log/1")
        ]));
    }

    /// The committer polls for its next write only while most recent writes
    /// came soon after the previous batch, and sleeps at once after waits
    /// that were long: a node with writes seconds apart never spins.
    #[test]
    fn the_committer_polls_only_while_writes_come_in_quick_succession() {
        let short = ARRIVAL_POLL_MAX / 2;
        let long = ARRIVAL_POLL_MAX * 2;
        let mut arrivals = Arrivals::default();
        assert!(!arrivals.polls(), "a new committer sleeps");
        arrivals.note(short);
        arrivals.note(short);
        assert!(!arrivals.polls(), "two short waits are not enough");
        arrivals.note(short);
        assert!(arrivals.polls(), "three short waits of four");
        arrivals.note(long);
        assert!(arrivals.polls(), "one long wait in four still polls");
        arrivals.note(long);
        assert!(!arrivals.polls(), "two long waits of four stop the polling");
        arrivals.note(short);
        arrivals.note(short);
        assert!(!arrivals.polls(), "still two long waits of four");
        arrivals.note(short);
        assert!(arrivals.polls(), "three short waits again resume it");
    }

    #[test]
    fn a_dropped_bucket_waits_for_its_committer_but_not_for_ever() {
        // The thread ends after a little work: the drop returns after it
        // ended (without the wait, the flag would most likely still be
        // unset when the drop returned).
        let ended = Arc::new(AtomicBool::new(false));
        let thread = CommitterThread::spawn(Duration::from_secs(60), {
            let ended = Arc::clone(&ended);
            move || {
                for _ in 0..1_000 {
                    std::thread::yield_now();
                }
                ended.store(true, Ordering::SeqCst);
            }
        })
        .expect("spawn");
        drop(thread);
        assert!(ended.load(Ordering::SeqCst), "the drop waited for the end");

        // The thread hangs (a file system that does not answer): the drop
        // gives up after its limit and leaves the thread running.
        let ended = Arc::new(AtomicBool::new(false));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = CommitterThread::spawn(Duration::from_millis(20), {
            let ended = Arc::clone(&ended);
            move || {
                let _ = wait.recv();
                ended.store(true, Ordering::SeqCst);
            }
        })
        .expect("spawn");
        drop(thread);
        assert!(
            !ended.load(Ordering::SeqCst),
            "the drop did not wait for ever"
        );
        drop(go);

        // A thread that panics ends too.
        let thread = CommitterThread::spawn(Duration::from_secs(60), || {
            panic!("a committer bug");
        })
        .expect("spawn");
        drop(thread);
    }

    /// Polling or sleeping, the committer takes a queued write and sees the
    /// end of the queue (every sender gone), so it stops.
    #[test]
    fn the_committer_takes_queued_writes_and_stops_at_the_end_either_way() {
        for polling in [false, true] {
            let (sender, mut receiver) = mpsc::channel(4);
            let mut arrivals = if polling {
                quick_arrivals()
            } else {
                Arrivals::default()
            };
            assert_eq!(arrivals.polls(), polling);
            sender.try_send(delete_of("a")).expect("queued");
            let first = arrivals.next(&mut receiver).expect("the queued write");
            assert_eq!(first.key, "a");
            drop(sender);
            assert!(
                arrivals.next(&mut receiver).is_none(),
                "polling {polling}: the end"
            );
        }
    }

    /// A writer waiting on its answer, polling for it as long as the test
    /// needs (a minute): the test decides when the answer comes.
    fn waiter(
        polling: &Arc<Polling>,
        answer: oneshot::Receiver<u32>,
        alongside: usize,
    ) -> tokio::task::JoinHandle<std::result::Result<u32, oneshot::error::RecvError>> {
        let polling = Arc::clone(polling);
        tokio::spawn(async move {
            let _others: Vec<_> = (0..alongside).map(|_| polling.write_sent()).collect();
            let _in_flight = polling.write_sent();
            polling.answer_within(answer, Duration::from_secs(60)).await
        })
    }

    /// Shared state as while writes come in quick succession.
    fn quick_polling() -> Arc<Polling> {
        let polling = Arc::new(Polling::default());
        polling.quick.store(true, Ordering::Release);
        polling
    }

    /// A lone write's answer, which it polls for.
    async fn answered_polling(polling: &Arc<Polling>, value: u32) {
        let (reply, answer) = oneshot::channel();
        let waiting = waiter(polling, answer, 0);
        until_polling(polling).await;
        reply.send(value).expect("the writer waits");
        assert_eq!(waiting.await.expect("joined").expect("answered"), value);
    }

    /// Until a writer polls; it does at its first wait, so a few turns of
    /// the (single-threaded) test runtime are plenty.
    async fn until_polling(polling: &Polling) {
        for _ in 0..1000 {
            if polling.writer_polls.load(Ordering::Acquire) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the writer never polled");
    }

    /// A lone write, while the committer polls, polls for its answer; the
    /// mark of a polling writer and the write's count go when it is answered.
    #[tokio::test]
    async fn a_lone_write_polls_for_its_answer_while_writes_come_quickly() {
        let polling = quick_polling();
        answered_polling(&polling, 7).await;
        assert!(
            !polling.writer_polls.load(Ordering::Acquire),
            "the poll ended"
        );
        assert_eq!(polling.in_flight.load(Ordering::Acquire), 0);
    }

    /// A write among others, or while writes come far apart, sleeps at once.
    #[tokio::test]
    async fn writes_in_company_or_far_apart_sleep_for_their_answer() {
        for (quick, alongside) in [(true, 1), (false, 0)] {
            let polling = Arc::new(Polling::default());
            polling.quick.store(quick, Ordering::Release);
            let (reply, answer) = oneshot::channel();
            let waiting = waiter(&polling, answer, alongside);
            // The waiter runs up to its first wait.
            tokio::task::yield_now().await;
            assert_eq!(polling.in_flight.load(Ordering::Acquire), alongside + 1);
            assert!(
                !polling.writer_polls.load(Ordering::Acquire),
                "quick {quick}, {alongside} alongside: it polls"
            );
            reply.send(3).expect("the writer waits");
            assert_eq!(waiting.await.expect("joined").expect("answered"), 3);
        }
    }

    /// A writer dropped while it polls (its request cancelled) leaves
    /// neither its mark nor its count behind, so the next lone write polls.
    #[tokio::test]
    async fn a_writer_dropped_while_polling_leaves_no_mark() {
        let polling = quick_polling();
        let (_reply, answer) = oneshot::channel();
        let waiting = waiter(&polling, answer, 0);
        until_polling(&polling).await;
        waiting.abort();
        assert!(waiting.await.expect_err("aborted").is_cancelled());
        assert!(!polling.writer_polls.load(Ordering::Acquire));
        assert_eq!(polling.in_flight.load(Ordering::Acquire), 0);
        answered_polling(&polling, 1).await;
    }

    /// A lone writer's put, with nothing else in flight, the committer
    /// asleep and this process alone on the folder, is committed on the
    /// writer's thread (ADR 0045), with the same outcome as through the
    /// committer: the object is there, and a second put conflicts.
    #[tokio::test]
    async fn a_lone_writers_put_is_committed_on_its_own_thread() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let bucket = FolderBucket::open(dir.path()).expect("opened");
        committer_idle(&bucket).await;
        bucket
            .put_if_absent_alone("a/1", Bytes::from_static(b"one"))
            .await
            .expect("put");
        assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 1);
        let r = bucket
            .put_if_absent_alone("a/1", Bytes::from_static(b"two"))
            .await;
        assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
        assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 2);
        let object = bucket.get("a/1").await.expect("read");
        assert_eq!(object.bytes, Bytes::from_static(b"one"));
        assert_eq!(bucket.polling.in_flight.load(Ordering::Acquire), 0);
    }

    /// Once the committer's thread has started (it holds the committer
    /// while it reserves its first orders), committed a write and let go of
    /// the committer: it waits for the next write.
    async fn committer_idle(bucket: &FolderBucket) {
        bucket.adoption_finished().await;
        bucket
            .put("warm", Bytes::from_static(b"up"))
            .await
            .expect("put through the committer");
        drop(bucket.committer.lock());
        assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 0);
    }

    /// With another write in flight, while the committer polls for writes,
    /// or when other processes may share the folder, a lone writer's put
    /// goes through the committer as any other.
    #[tokio::test]
    async fn a_lone_writers_put_is_queued_when_the_committer_has_other_work() {
        for case in [
            "another write in flight",
            "committer polls",
            "shared folder",
        ] {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let options = FolderOptions {
                never_solo: case == "shared folder",
                ..FolderOptions::default()
            };
            let bucket = FolderBucket::open_with(dir.path(), options).expect("opened");
            committer_idle(&bucket).await;
            let other = (case == "another write in flight").then(|| bucket.polling.write_sent());
            if case == "committer polls" {
                bucket.polling.quick.store(true, Ordering::Release);
            }
            bucket
                .put_if_absent_alone("a/1", Bytes::from_static(b"one"))
                .await
                .expect("put");
            assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 0, "{case}");
            let object = bucket.get("a/1").await.expect("read");
            assert_eq!(object.bytes, Bytes::from_static(b"one"), "{case}");
            drop(other);
        }
    }

    /// The pool keeps files up to its byte limit (sizes in whole blocks) and
    /// file limit, remembers its own files by number, and gives each back
    /// at the path it was kept under.
    #[test]
    fn the_inode_pool_counts_whole_blocks_and_returns_files_where_they_are() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let temp_dir = dir.path().to_path_buf();
        let mut pool = InodePool::new(temp_dir.clone(), "7.abc".to_owned(), Duration::ZERO);
        assert_eq!(held_bytes(Some(0)), 0);
        assert_eq!(held_bytes(Some(1)), POOL_BLOCK_BYTES);
        assert_eq!(held_bytes(Some(POOL_BLOCK_BYTES + 1)), 2 * POOL_BLOCK_BYTES);
        assert_eq!(held_bytes(None), POOL_BLOCK_BYTES);

        let own = temp_dir.join("7.abc.12");
        let other = temp_dir.join("9.def.3");
        let adopted = temp_dir.join("5.gone.4");
        for path in [&own, &other, &adopted] {
            fs::write(path, b"x").expect("written");
        }
        pool.adopt(vec!["5.gone".to_owned()], &[(0, 4)]);
        pool.keep(own.clone(), Some(5000));
        pool.keep(other.clone(), None);
        assert!(matches!(pool.files[0].name, SpareName::Adopted(0, 4)));
        assert!(matches!(pool.files[1].name, SpareName::Own(12)));
        assert!(matches!(pool.files[2].name, SpareName::Other(_)));
        assert_eq!(pool.bytes, 4 * POOL_BLOCK_BYTES);
        // A file adopted, reused and replaced comes back under its name.
        pool.keep(adopted.clone(), Some(10));
        assert!(matches!(pool.files[3].name, SpareName::Adopted(0, 4)));
        let (path, _, len) = pool.take().expect("the adopted file");
        assert_eq!((path, len), (adopted, None));
        pool.files.pop_back();
        pool.bytes = 3 * POOL_BLOCK_BYTES;

        pool.bytes = INODE_POOL_BYTES_MAX - POOL_BLOCK_BYTES;
        assert!(pool.wants(POOL_BLOCK_BYTES));
        assert!(!pool.wants(POOL_BLOCK_BYTES + 1), "over the byte limit");
        assert!(
            !pool.wants(INODE_POOL_FILE_BYTES_MAX + 1),
            "over the file size limit"
        );
        pool.bytes = 3 * POOL_BLOCK_BYTES;

        let (path, _, len) = pool.take().expect("the first kept file");
        assert_eq!((path, len), (own, Some(5000)));
        let (path, _, len) = pool.take().expect("the second kept file");
        assert_eq!((path, len), (other, None));
        assert_eq!(pool.bytes, 0);
        assert!(pool.take().is_none());
    }

    /// A read slower than the limit is done again, and one that stays slow
    /// is an error naming the key, never possibly torn bytes; within the
    /// limit the object reads as written.
    #[test]
    fn reads_slower_than_the_limit_are_retried_then_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        fs::write(dir.path().join("k"), b"body").expect("written");
        match read_object_within(dir.path(), "k", Duration::ZERO, Reader::Blocking) {
            Err(ReadFailure::Failed(Error::Unavailable { key, reason })) => {
                assert_eq!(key, "k");
                assert!(reason.contains("took longer"), "{reason}");
            }
            other => panic!("a read over the limit gave {other:?}"),
        }
        let read = read_object_within(dir.path(), "k", READ_TIME_MAX, Reader::Blocking)
            .expect("readable")
            .expect("present");
        assert_eq!(read.bytes, Bytes::from_static(b"body"));
    }

    /// Drops `path`'s pages from the page cache (written back first).
    fn evict(path: &Path) {
        let file = File::open(path).expect("open");
        file.sync_all().expect("written back");
        // SAFETY: a plain advice call on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "fadvise");
    }

    /// Sync threads start only for jobs, at most the pool's limit of them;
    /// they answer every job, also more at once than there are threads, each
    /// with its own result, and stop once the pool is dropped.
    #[test]
    fn the_sync_threads_answer_every_job_with_its_own_result_and_stop_with_the_pool() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let paths: Vec<PathBuf> = (0..3 * 4)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                fs::write(&path, b"x").expect("written");
                path
            })
            .collect();
        let pool = SyncPool::new(4);
        let threads = || pool.state.lock().threads;
        assert_eq!(threads(), 0, "no thread before the first job");
        let shared = Arc::downgrade(&pool.state);
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        pool.sync_all(&refs, true).expect("all synced");
        assert!((1..=4).contains(&threads()), "{} threads", threads());

        let missing = dir.path().join("missing");
        let mut with_missing = refs.clone();
        with_missing.insert(5, &missing);
        let error = pool
            .sync_all(&with_missing, false)
            .expect_err("a missing file cannot be synced");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);

        // The threads hold the shared state until they return.
        drop(pool);
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.strong_count() > 0 {
            assert!(Instant::now() < deadline, "the sync threads did not stop");
            std::thread::yield_now();
        }
    }

    /// An inline read answers only from memory: a cached object reads
    /// whole, and one that would wait for the device, is too large, or is
    /// one object too many for a listing is left to a blocking thread,
    /// which reads it whole.
    #[test]
    fn inline_reads_take_only_what_is_in_memory_and_leave_the_rest_to_a_blocking_read() {
        // Under the target folder: on the disk (a tmpfs keeps every page).
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp");
        fs::create_dir_all(&base).expect("the target folder");
        let dir = tempfile::tempdir_in(base).expect("a temporary folder");
        let body = vec![7u8; 10_000];
        fs::write(dir.path().join("cached"), &body).expect("written");
        let read = read_object(dir.path(), "cached", Reader::Inline)
            .expect("in memory")
            .expect("present");
        assert_eq!(read.bytes, body);
        assert_eq!(read.meta.etag, content_etag(&body));

        fs::write(dir.path().join("evicted"), &body).expect("written");
        evict(&dir.path().join("evicted"));
        assert!(matches!(
            read_object(dir.path(), "evicted", Reader::Inline),
            Err(ReadFailure::WouldBlock)
        ));
        let big = vec![1u8; usize::try_from(INLINE_READ_BYTES_MAX).expect("small") + 1];
        fs::write(dir.path().join("big"), &big).expect("written");
        assert!(matches!(
            read_object(dir.path(), "big", Reader::Inline),
            Err(ReadFailure::WouldBlock)
        ));
        for key in ["evicted", "big"] {
            let read = read_object(dir.path(), key, Reader::Blocking)
                .expect("readable")
                .expect("present");
            assert_eq!(
                read.meta.size,
                fs::metadata(dir.path().join(key)).expect("stat").len()
            );
        }
        assert!(matches!(
            read_object(dir.path(), "missing", Reader::Inline),
            Ok(None)
        ));

        fs::create_dir(dir.path().join("few")).expect("folder");
        fs::create_dir(dir.path().join("many")).expect("folder");
        for i in 0..INLINE_LIST_OBJECTS_MAX {
            fs::write(dir.path().join(format!("few/{i}")), b"x").expect("written");
        }
        for i in 0..=INLINE_LIST_OBJECTS_MAX {
            fs::write(dir.path().join(format!("many/{i}")), b"x").expect("written");
        }
        let few =
            list_page_with(dir.path(), "few/", None, Reader::Inline, Detail::Full).expect("inline");
        assert_eq!(few.objects.len(), INLINE_LIST_OBJECTS_MAX);
        assert!(matches!(
            list_page_with(dir.path(), "many/", None, Reader::Inline, Detail::Full),
            Err(ReadFailure::WouldBlock)
        ));
        let many = list_page_with(dir.path(), "many/", None, Reader::Blocking, Detail::Full)
            .expect("listed");
        assert_eq!(many.objects.len(), INLINE_LIST_OBJECTS_MAX + 1);
    }
}

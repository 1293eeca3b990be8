//! The folder bucket's write-ahead journal (ADR 0025): one flush per batch.
//!
//! Each process sharing a folder appends its batches to a journal file of its
//! own (`.wal/j.<pid>.<random>`, held with an exclusive `flock` for its life)
//! and makes them durable with one `fdatasync` of blocks that were written
//! before (no metadata to flush); the objects themselves are then renamed into
//! place without syncing them. A checkpoint makes the materialized objects
//! durable with one `syncfs` and lets every journal start over.
//!
//! Epochs tie the journals of all processes to the checkpoints:
//! - `.wal/epoch` holds the current epoch. A batch holds a shared `flock` on
//!   it from before it reads the epoch until its objects are renamed into
//!   place; its entries carry that epoch.
//! - A checkpoint takes the exclusive `flock` (so every batch of the old epoch,
//!   in every process, has materialized its objects), bumps the epoch to
//!   `e + 1`, releases the lock, runs `syncfs`, and then records `e` as
//!   durable in `.wal/durable` (synced, never lowered). Every entry of an
//!   epoch up to the durable one is on disk as an object and never replayed.
//! - Entries carry an order: one more than the highest counter of the batch's
//!   lock stripes (kept in the stripe lock files, under their locks), then
//!   the position in the batch. Two entries for one key always share a stripe,
//!   so the order of entries for one key is the order of their writes, across
//!   processes.
//! - A process alone on the folder (ADR 0034) takes neither lock: its
//!   batches hold an in-process gate that its checkpoints take around the
//!   bump, and their orders come from a block reserved by moving every
//!   stripe's counter past it at once (ADR 0035).
//! - While it holds young objects (ADR 0034), its periodic checkpoints lag
//!   one epoch: each puts in place and makes durable the epoch before the
//!   current one, then bumps. A young object becomes a file only if it
//!   outlives the whole next epoch. A clean close, another process's knock,
//!   a full region and dead journals to remove take a full checkpoint.
//!
//! Recovery, at open, under the exclusive epoch lock:
//! - The machine rebooted since the folder was last opened (`.wal/boot` names
//!   another boot id): objects renamed after the last checkpoint may be lost
//!   or torn. For every key, the last journaled entry of an epoch after the
//!   durable one is applied again (a put writes its body, a delete removes the
//!   object, a marker leaves the durable object as it is), then `syncfs`, then
//!   the epoch moves past every replayed entry and the journals are removed.
//! - Same boot: the page cache still holds every object a dead process
//!   renamed. This process's first checkpoint makes them durable and then
//!   removes the dead journals (locked by this process until then, so
//!   nobody else recovers them); the entries of a batch that died before
//!   renaming (never answered) are dropped with them. The open itself does
//!   not wait for that `syncfs`: right after a crash under load it flushes
//!   everything the dead process left dirty, ~300 ms on the development VM,
//!   which a restart would otherwise spend before it serves. A power cut
//!   before that checkpoint finds the dead journals still there and replays
//!   them with this process's own, by stripe order, as after any reboot.
//!   Dead journals without any entry need no checkpoint: one of them is
//!   taken over at once.
//! - Same boot, a dead journal written alone on the folder (ADR 0034): its
//!   young objects were never files. An opener that can be alone on the
//!   folder at once (the solo lock taken without waiting, under the epoch
//!   lock) adopts them: it copies each key's last young put into its own
//!   journal and keeps it young in its index, and its first checkpoint puts
//!   them in place (ADR 0040). Any other opener writes them as files before
//!   it serves.
//!
//! The journal's inode gets an inode-table block of its own: pad files
//! (in `.wal/p.<journal name>/`, empty and never changed) fill the rest of
//! it, because on ext4 without a journal every `fdatasync` of the journal
//! also writes that block whenever any inode in it changed (ADR 0029,
//! "The journal's inode alone"). Pads go with their journal.
//!
//! Bodies larger than [`JOURNAL_BODY_MAX`] are not copied into the journal:
//! they are written the old way (file synced before the rename, folder synced
//! after) and the journal gets a marker for their key once they are durable,
//! so an older entry for the key is never replayed over them.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::Etag;
use crate::folder::{content_etag, flock, open_counter_file, statx_only, syncfs};
use crate::solo::Hold;

/// The journal folder under the bucket's root (reserved, never an object).
pub(crate) const JOURNAL_DIR: &str = ".wal";
const EPOCH_FILE: &str = "epoch";
const DURABLE_FILE: &str = "durable";
const BOOT_FILE: &str = "boot";
const JOURNAL_PREFIX: &str = "j.";
/// `.wal/y.<journal name>`: that journal holds young entries (ADR 0034), so
/// a recovery on the same boot must read and apply them. Made when the
/// process goes solo, removed with the journal or when it leaves solo mode.
const YOUNG_PREFIX: &str = "y.";
const PAD_PREFIX: &str = "p.";
/// Inodes whose places are taken around the journal's: an aligned run this
/// long covers the inode-table block holding the journal's inode for every
/// inode size from 128 bytes (32 per 4 KiB block) up.
const PAD_GROUP: u64 = 32;
/// Most pad files made in search of a whole aligned run; without one the
/// journal goes unpadded (a file system that does not hand out inode
/// numbers in order, or a busy one).
const PAD_FILES_MAX: usize = 512;
/// Longest time spent making pad files: beside many recent deletions, each
/// new inode on ext4 without a journal scans past them (ADR 0027), and one
/// pad took 330 µs instead of 15.
const PAD_TIME_MAX: Duration = Duration::from_millis(5);

/// Largest journal file: two regions of half this size (see [`Journal`]); a
/// full region waits for a checkpoint.
pub const JOURNAL_BYTES_MAX: u64 = 64 << 20;
const REGION_BYTES: u64 = JOURNAL_BYTES_MAX / 2;
/// Bytes of each region zero-filled when a journal is created; a region
/// grows by doubling, so overwriting is metadata-free after the first pass.
const JOURNAL_ZEROED_START: u64 = 128 << 10;
/// Larger bodies are synced in place (with a marker in the journal) rather
/// than copied into it.
pub const JOURNAL_BODY_MAX: usize = 256 << 10;
/// Most journal bytes one batch may use; the rest of its writes take the
/// synced path.
pub(crate) const JOURNAL_BATCH_BYTES_MAX: usize = (REGION_BYTES / 2) as usize;
/// How often the checkpointer looks for journaled work to make durable.
/// (4 s rather than 1 s: a log record compacted away before the checkpoint
/// is never written in place; ADR 0025, "Checkpoint interval".)
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(4);

const ENTRY_MAGIC: u32 = 0x314A_4B57; // "WKJ1"
const ENTRY_HEADER_BYTES: usize = 32;
const ENTRY_CRC_BYTES: usize = 4;
const DURABLE_CHECK: u64 = 0x5741_534D_4B45_4550; // "WASMKEEP"

/// What a journal entry does to its key when replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// The key holds the body.
    Put = 1,
    /// The key is absent.
    Delete = 2,
    /// The key was made durable in place: keep what the disk holds.
    Durable = 3,
}

impl EntryKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Put),
            2 => Some(Self::Delete),
            3 => Some(Self::Durable),
            _ => None,
        }
    }
}

/// One entry to append.
pub(crate) struct Entry<'a> {
    pub index: u32,
    pub kind: EntryKind,
    pub key: &'a str,
    pub body: &'a [u8],
    /// Written in solo mode and not yet in place as a file (ADR 0034): a
    /// recovery after this process died applies it even on the same boot.
    pub young: bool,
}

/// The flags byte of an entry's header (byte 29; zero before ADR 0034).
const FLAG_YOUNG: u8 = 1;

/// Where an appended entry sits in its journal file, for reading its body
/// back ([`JournalReader::body`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryAt {
    /// Byte offset of the entry in the journal file.
    pub offset: u64,
    /// The entry's encoded length.
    pub len: u32,
}

/// The encoded size of an entry.
pub(crate) fn entry_bytes(key: &str, body_len: usize) -> usize {
    ENTRY_HEADER_BYTES + key.len() + body_len + ENTRY_CRC_BYTES
}

fn encode(out: &mut Vec<u8>, epoch: u64, order: u64, entry: &Entry<'_>) {
    let start = out.len();
    let len = entry_bytes(entry.key, entry.body.len());
    out.extend_from_slice(&ENTRY_MAGIC.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(len)
            .expect("entries are bounded")
            .to_le_bytes(),
    );
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&order.to_le_bytes());
    out.extend_from_slice(&entry.index.to_le_bytes());
    out.push(entry.kind as u8);
    out.push(if entry.young { FLAG_YOUNG } else { 0 });
    out.extend_from_slice(
        &u16::try_from(entry.key.len())
            .expect("keys are at most 1024 bytes")
            .to_le_bytes(),
    );
    out.extend_from_slice(entry.key.as_bytes());
    out.extend_from_slice(entry.body);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// A decoded entry, as recovery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub epoch: u64,
    pub order: u64,
    pub index: u32,
    pub kind: EntryKind,
    pub key: String,
    pub body: Vec<u8>,
    pub young: bool,
}

/// Decodes entries from the start of a journal until the first one that is
/// not whole (zeros, a torn write, or an older entry cut by a newer one).
pub(crate) fn decode_all(bytes: &[u8]) -> Vec<Decoded> {
    decode_prefix(bytes).0
}

/// Why [`decode_prefix`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The bytes end before the next entry does (or exactly where it
    /// starts): more bytes may make it whole.
    Short,
    /// The next bytes are not an entry, whatever follows them.
    NotAnEntry,
}

/// [`decode_all`], also returning where the decoded entries end and why
/// decoding stopped there.
fn decode_prefix(bytes: &[u8]) -> (Vec<Decoded>, usize, Stop) {
    let mut out = Vec::new();
    let mut at = 0usize;
    let stop = loop {
        let Some(header) = bytes.get(at..at + ENTRY_HEADER_BYTES) else {
            break Stop::Short;
        };
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        let long = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        if word(0) != ENTRY_MAGIC {
            break Stop::NotAnEntry;
        }
        let len = word(4) as usize;
        let key_len = usize::from(u16::from_le_bytes([header[30], header[31]]));
        if len < ENTRY_HEADER_BYTES + key_len + ENTRY_CRC_BYTES {
            break Stop::NotAnEntry;
        }
        let Some(whole) = bytes.get(at..at + len) else {
            break Stop::Short;
        };
        let (content, crc) = whole.split_at(len - ENTRY_CRC_BYTES);
        if crc32fast::hash(content) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            break Stop::NotAnEntry;
        }
        let Some(kind) = EntryKind::from_byte(header[28]) else {
            break Stop::NotAnEntry;
        };
        let key_end = ENTRY_HEADER_BYTES + key_len;
        let Ok(key) = std::str::from_utf8(&content[ENTRY_HEADER_BYTES..key_end]) else {
            break Stop::NotAnEntry;
        };
        out.push(Decoded {
            epoch: long(8),
            order: long(16),
            index: word(24),
            kind,
            key: key.to_owned(),
            body: content[key_end..].to_vec(),
            young: header[29] & FLAG_YOUNG != 0,
        });
        at += len;
    };
    (out, at, stop)
}

/// Reads appended entries back from a journal file, from any thread.
#[derive(Debug, Clone)]
pub(crate) struct JournalReader {
    file: Arc<File>,
}

impl JournalReader {
    /// The body of the entry at `at`, checked whole: an entry that is not
    /// there any more (its region started over) is an error, never another
    /// entry's bytes.
    pub(crate) fn body(&self, at: EntryAt) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; at.len as usize];
        self.file.read_exact_at(&mut bytes, at.offset)?;
        let changed = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "journal entry at {} ({} bytes) is not there any more",
                    at.offset, at.len
                ),
            )
        };
        match decode_all(&bytes).pop() {
            Some(entry) if entry_bytes(&entry.key, entry.body.len()) == bytes.len() => {
                Ok(entry.body)
            }
            _ => Err(changed()),
        }
    }
}

/// This machine's boot id: a restart of the machine changes it, a restart of
/// a process does not.
fn current_boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

pub(crate) fn read_u64(file: &File, at: u64) -> io::Result<Option<u64>> {
    let mut buf = [0u8; 8];
    match file.read_exact_at(&mut buf, at) {
        Ok(()) => Ok(Some(u64::from_le_bytes(buf))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// The durable epoch: two slots of (value, value ^ check), the newer valid
/// one wins, so a torn write of one slot leaves the other.
fn read_durable(file: &File) -> io::Result<u64> {
    let mut best = 0;
    for slot in 0..2u64 {
        if let (Some(value), Some(check)) =
            (read_u64(file, slot * 16)?, read_u64(file, slot * 16 + 8)?)
            && value ^ DURABLE_CHECK == check
        {
            best = best.max(value);
        }
    }
    Ok(best)
}

/// Raises the durable epoch to `epoch` (never lowers it), synced.
fn raise_durable(file: &File, epoch: u64) -> io::Result<()> {
    flock(file, libc::LOCK_EX)?;
    let result = (|| {
        if read_durable(file)? >= epoch {
            return Ok(());
        }
        let mut slot = [0u8; 16];
        slot[..8].copy_from_slice(&epoch.to_le_bytes());
        slot[8..].copy_from_slice(&(epoch ^ DURABLE_CHECK).to_le_bytes());
        file.write_all_at(&slot, (epoch % 2) * 16)?;
        file.sync_data()
    })();
    let unlocked = flock(file, libc::LOCK_UN);
    result.and(unlocked)
}

/// What the committer and the checkpointer thread share.
struct Shared {
    root_dir: File,
    /// A descriptor of `.wal/epoch` for the exclusive lock of checkpoints
    /// (the committer's shared locks use another one: `flock` locks belong to
    /// open file descriptions).
    epoch_exclusive: Mutex<File>,
    /// Held by a batch of this process while it is alone on the folder,
    /// instead of the shared `flock` on `.wal/epoch` (ADR 0035), and by a
    /// checkpoint around its bump: with no other process on the folder, the
    /// only bump such a batch must not straddle is this process's own.
    gate: Arc<Mutex<()>>,
    durable: File,
    /// The highest epoch this process journaled (0: none).
    journaled: AtomicU64,
    /// The highest durable epoch this process knows of.
    durable_seen: AtomicU64,
    /// Journals of gone processes (same boot) whose entries the next
    /// checkpoint makes durable in place; locked by this process, removed
    /// after that checkpoint.
    pending: Mutex<Vec<(PathBuf, File)>>,
    /// Puts young objects (ADR 0034) of epochs up to the one given in
    /// place; each checkpoint calls it before its `syncfs`.
    placer: Mutex<Option<Placer>>,
    /// Whether the journal is marked as holding young entries (the process
    /// is alone on the folder): then a periodic checkpoint lags by one epoch
    /// (see [`Shared::checkpoint`]).
    young: AtomicBool,
    /// The newest epoch this process has seen (its batches', its bumps').
    epoch_seen: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// See [`Journal::set_placer`].
pub(crate) type Placer = Arc<dyn Fn(u64) -> io::Result<()> + Send + Sync>;

impl Shared {
    /// A checkpoint. `full`: every journaled entry so far is durable in place
    /// when it returns (see the module docs). Otherwise, while the journal
    /// holds young objects, it lags one epoch behind (ADR 0034, amended):
    /// it puts in place and makes durable the epoch before the current one,
    /// then bumps the epoch. A young object then becomes a file only if it
    /// outlives a whole epoch, not merely the checkpoint that ends its own:
    /// most of a busy actor's records and snapshots die within a second.
    fn checkpoint(&self, full: bool) -> io::Result<()> {
        if !full && self.young.load(Ordering::SeqCst) && self.pending.lock().is_empty() {
            return self.checkpoint_lagging();
        }
        // Every batch of the epoch bumped past is done (they hold the shared
        // lock or the gate): its young objects go in place before the sync
        // that makes them durable.
        let epoch = self.bump()?;
        self.make_durable(epoch)
    }

    /// The lagging checkpoint of a process alone on the folder: the epoch
    /// before the current one goes in place and is made durable, then the
    /// epoch is bumped. In that order, the region the new epoch writes to
    /// (the one of the epoch made durable here) can start over at its first
    /// batch, as after a full checkpoint.
    fn checkpoint_lagging(&self) -> io::Result<()> {
        let current = read_u64(&self.epoch_exclusive.lock(), 0)?
            .unwrap_or(1)
            .max(1);
        // The bump to `current` waited for every batch of the epoch before,
        // so all its objects are in the young index or in place.
        self.make_durable(current - 1)?;
        self.bump().map(drop)
    }

    /// Moves the epoch on by one, once every batch of the current one is
    /// done (a batch holds the gate or the shared lock); returns the epoch
    /// moved past.
    fn bump(&self) -> io::Result<u64> {
        let gate = self.gate.lock();
        let epoch_file = self.epoch_exclusive.lock();
        flock(&epoch_file, libc::LOCK_EX)?;
        let bumped = (|| {
            let epoch = read_u64(&epoch_file, 0)?.unwrap_or(1).max(1);
            epoch_file.write_all_at(&(epoch + 1).to_le_bytes(), 0)?;
            Ok::<_, io::Error>(epoch)
        })();
        let unlocked = flock(&epoch_file, libc::LOCK_UN);
        let epoch = bumped?;
        unlocked?;
        drop(epoch_file);
        drop(gate);
        self.epoch_seen.fetch_max(epoch + 1, Ordering::SeqCst);
        Ok(epoch)
    }

    /// Puts the young objects of epochs up to `epoch` in place, syncs the
    /// file system and raises the durable epoch to `epoch`; then removes the
    /// dead journals taken over at open (only a full checkpoint has any).
    fn make_durable(&self, epoch: u64) -> io::Result<()> {
        let placer = self.placer.lock().clone();
        if let Some(place) = placer {
            place(epoch)?;
        }
        syncfs(&self.root_dir)?;
        raise_durable(&self.durable, epoch)?;
        self.durable_seen.fetch_max(epoch, Ordering::SeqCst);
        // Their entries predate the bump of this full checkpoint: durable in
        // place now.
        let pending = std::mem::take(&mut *self.pending.lock());
        if let Some((first, _)) = pending.first()
            && let Some(dir) = first.parent()
        {
            for (path, _lock) in &pending {
                remove_dead_journal(path)?;
            }
            remove_orphan_pads(dir)?;
            tracing::debug!(
                journals = pending.len(),
                "folder bucket: the dead journals of this boot are durable in place; removed"
            );
        }
        Ok(())
    }

    fn dirty(&self) -> bool {
        self.journaled.load(Ordering::SeqCst) > self.durable_seen.load(Ordering::SeqCst)
            || !self.pending.lock().is_empty()
    }
}

/// One process's journal (owned by the folder committer thread).
///
/// The file has two regions; a batch of epoch `e` goes to region `e % 2`.
/// A region starts over (at its beginning) when the batch's epoch is newer
/// than everything in it and all of that is durable, so the entries of the
/// epoch after a checkpoint's bump never stand in the way of reusing the
/// space of the epoch before it. Recovery reads both regions.
pub(crate) struct Journal {
    shared: Arc<Shared>,
    path: PathBuf,
    file: File,
    /// The descriptor of `.wal/epoch` for the shared lock of batches.
    epoch_shared: File,
    /// Whether the batch in progress holds the shared lock (one alone on
    /// the folder holds the gate instead).
    shared_lock_held: bool,
    regions: [Region; 2],
    buffer: Vec<u8>,
    /// Where the entries of the last `append` sit ([`Journal::appended`]).
    appended: Vec<EntryAt>,
    checkpointer: Option<std::thread::JoinHandle<()>>,
    checkpoint_interval: Duration,
    /// The folder of the pad files around the journal's inode (`None`:
    /// unpadded).
    pads: Option<PathBuf>,
    /// Adopted at open, until the caller takes it.
    adoption: Option<Adoption>,
}

/// Where one region of the journal stands.
#[derive(Debug, Clone, Copy)]
struct Region {
    /// Bytes of entries from the region's start.
    offset: u64,
    /// Bytes from the region's start known to be written (allocated).
    zeroed: u64,
    /// The highest epoch among its entries (0: none).
    epoch: u64,
}

/// The region a batch of `epoch` writes to.
fn region_index(epoch: u64) -> usize {
    usize::try_from(epoch % 2).expect("0 or 1")
}

impl Region {
    fn base(index: usize) -> u64 {
        index as u64 * REGION_BYTES
    }

    /// Whether a batch of `epoch` may start the region over.
    fn reusable(&self, epoch: u64, durable: u64) -> bool {
        self.epoch < epoch && self.epoch <= durable
    }
}

/// Options of [`Journal::open`] (tests change them).
#[derive(Debug, Clone)]
pub(crate) struct JournalOptions {
    pub boot_id: Option<String>,
    pub checkpoint_interval: Duration,
    /// Whether young objects of a gone solo process may be adopted (ADR
    /// 0040): `false` for a folder opened never to be solo.
    pub adopt: bool,
}

/// The young objects of gone solo processes that this process adopted at
/// open (ADR 0040), with the solo lock taken for them: the caller keeps
/// them young in its index ([`Journal::take_adoption`]).
#[derive(Debug)]
pub(crate) struct Adoption {
    pub hold: Hold,
    pub objects: Vec<Adopted>,
}

/// One adopted young object, copied into this process's journal.
#[derive(Debug)]
pub(crate) struct Adopted {
    pub key: String,
    pub at: EntryAt,
    pub epoch: u64,
    pub size: u64,
    pub etag: Etag,
}

impl Journal {
    /// Recovers the folder's journals (see the module docs) and starts this
    /// process's own journal and checkpointer.
    pub(crate) fn open(root: &Path, options: &JournalOptions) -> io::Result<Journal> {
        let dir = root.join(JOURNAL_DIR);
        fs::create_dir_all(&dir)?;
        let root_dir = File::open(root)?;
        let epoch_exclusive = open_counter_file(&dir.join(EPOCH_FILE))?;
        let durable = open_counter_file(&dir.join(DURABLE_FILE))?;
        let boot_id = match &options.boot_id {
            Some(id) => id.clone(),
            None => current_boot_id()?,
        };
        flock(&epoch_exclusive, libc::LOCK_EX)?;
        // Everything up to the unlock runs under the exclusive epoch lock.
        // `Shared` keeps a duplicate of the descriptor: the lock belongs to
        // the open file description both share.
        let opened = epoch_exclusive.try_clone().and_then(|locked| {
            Self::open_locked(root, &dir, root_dir, locked, durable, &boot_id, options)
        });
        let unlocked = flock(&epoch_exclusive, libc::LOCK_UN);
        let journal = opened?;
        unlocked?;
        Ok(journal)
    }

    /// [`Journal::open`] under the exclusive epoch lock (`epoch_exclusive`).
    fn open_locked(
        root: &Path,
        dir: &Path,
        root_dir: File,
        epoch_exclusive: File,
        durable: File,
        boot_id: &str,
        options: &JournalOptions,
    ) -> io::Result<Journal> {
        let mut pending = Vec::new();
        let mut owed = Vec::new();
        let (path, file, pads) =
            match recover(root, dir, &root_dir, &epoch_exclusive, &durable, boot_id)? {
                Recovered::Durable(dead) => take_journal(dir, dead)?,
                Recovered::NotYetDurable { dead, young } => {
                    pending = dead;
                    owed = young;
                    remove_orphan_pads(dir)?;
                    create_journal_file(dir)?
                }
            };
        // Young objects of a gone solo process: adopted when this process
        // will be alone (ADR 0040), else put in place now, before it serves.
        let mut adopt = None;
        if !owed.is_empty() {
            let ours: Vec<&Path> = std::iter::once(path.as_path())
                .chain(pending.iter().map(|(p, _)| p.as_path()))
                .collect();
            let hold = if options.adopt && adoptable_bytes(&owed) <= ADOPTED_BYTES_MAX {
                Hold::try_solo(dir, &|| Ok(others_in(dir, &ours)?.live))?
            } else {
                None
            };
            match hold {
                Some(hold) => {
                    let (puts, rest): (Vec<_>, Vec<_>) =
                        owed.into_iter().partition(|e| e.kind == EntryKind::Put);
                    let removed = replay_young(root, rest)?;
                    adopt = Some((hold, puts, removed));
                }
                None => {
                    let placed = replay_young(root, owed)?;
                    tracing::info!(
                        objects = placed,
                        "folder bucket: put the young objects of a gone solo process in place"
                    );
                }
            }
        }
        let durable_now = read_durable(&durable)?;
        let epoch_now = read_u64(&epoch_exclusive, 0)?.unwrap_or(1).max(1);
        let shared = Arc::new(Shared {
            root_dir,
            epoch_exclusive: Mutex::new(epoch_exclusive),
            gate: Arc::new(Mutex::new(())),
            durable,
            journaled: AtomicU64::new(0),
            durable_seen: AtomicU64::new(durable_now),
            pending: Mutex::new(pending),
            placer: Mutex::new(None),
            young: AtomicBool::new(false),
            epoch_seen: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let epoch_shared = open_counter_file(&dir.join(EPOCH_FILE))?;
        let mut journal = Journal {
            shared,
            path,
            file,
            epoch_shared,
            shared_lock_held: false,
            regions: [Region {
                offset: 0,
                zeroed: JOURNAL_ZEROED_START,
                epoch: 0,
            }; 2],
            buffer: Vec::new(),
            appended: Vec::new(),
            checkpointer: None,
            checkpoint_interval: options.checkpoint_interval,
            pads,
            adoption: None,
        };
        if let Some((hold, puts, removed)) = adopt {
            let objects = journal.write_adopted(epoch_now, &puts)?;
            tracing::info!(
                adopted = objects.len(),
                removed,
                "folder bucket: adopted the young objects of a gone solo process (they go in place at the first checkpoint)"
            );
            journal.adoption = Some(Adoption { hold, objects });
        }
        Ok(journal)
    }

    /// The young objects adopted at open, and the solo lock taken for them
    /// (once; `None` when there were none).
    pub(crate) fn take_adoption(&mut self) -> Option<Adoption> {
        self.adoption.take()
    }

    /// Copies adopted young puts into this journal, in the current epoch
    /// (`epoch`), each with the order and index its batch gave it: copies
    /// of the same writes, they sort as those do against every other entry
    /// of their keys. Not flushed: until this process's first checkpoint
    /// puts them in place, the gone process's journal (flushed before it
    /// answered) stays, and a recovery reads both.
    fn write_adopted(&mut self, epoch: u64, puts: &[Decoded]) -> io::Result<Vec<Adopted>> {
        self.buffer.clear();
        self.appended.clear();
        for put in puts {
            self.encode_entry(
                epoch,
                put.order,
                &Entry {
                    index: put.index,
                    kind: EntryKind::Put,
                    key: &put.key,
                    body: &put.body,
                    young: true,
                },
            );
        }
        let (index, end) = self.write_buffer(epoch)?;
        self.wrote(index, end, epoch);
        Ok(puts
            .iter()
            .zip(&self.appended)
            .map(|(put, at)| Adopted {
                key: put.key.clone(),
                at: *at,
                epoch,
                size: put.body.len() as u64,
                etag: content_etag(&put.body),
            })
            .collect())
    }

    /// Makes room for `bytes` more journal bytes in whichever region the
    /// batch's epoch picks: a region that is full of entries not yet durable
    /// is checkpointed first. Call before taking any lock.
    pub(crate) fn reserve(&mut self, bytes: usize) -> io::Result<()> {
        let bytes = bytes as u64;
        let durable = self.shared.durable_seen.load(Ordering::SeqCst);
        let tight = self.regions.iter().any(|r| {
            // The batch either appends or (newer epoch, all durable) starts over.
            r.offset + bytes > REGION_BYTES && r.epoch > durable
        });
        let half_full = |r: &Region| r.epoch > durable && r.offset + bytes > REGION_BYTES / 2;
        let epoch = self.shared.epoch_seen.load(Ordering::SeqCst);
        let soon = if self.shared.young.load(Ordering::SeqCst) && epoch > 0 {
            // Lagging checkpoints leave the region of the epoch before half
            // full and not yet durable until the next one: only the region
            // of the current epoch says when that is due.
            half_full(&self.regions[region_index(epoch)])
        } else {
            self.regions.iter().any(half_full)
        };
        if tight {
            self.shared.checkpoint(true)?;
        } else if soon {
            // Half full of entries not yet durable: checkpoint soon (a
            // region that is all durable starts over at its next epoch).
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Starts a batch: takes the shared epoch lock and returns the epoch its
    /// entries carry. [`Journal::end_batch`] releases it once the batch's
    /// objects are in place.
    pub(crate) fn begin_batch(&mut self) -> io::Result<u64> {
        flock(&self.epoch_shared, libc::LOCK_SH)?;
        match read_u64(&self.epoch_shared, 0) {
            Ok(epoch) => {
                self.shared_lock_held = true;
                let epoch = epoch.unwrap_or(1).max(1);
                self.shared.epoch_seen.fetch_max(epoch, Ordering::SeqCst);
                Ok(epoch)
            }
            Err(e) => {
                let _ = flock(&self.epoch_shared, libc::LOCK_UN);
                Err(e)
            }
        }
    }

    /// The gate a batch alone on the folder holds instead of the shared
    /// epoch lock ([`Journal::begin_solo_batch`]).
    pub(crate) fn gate(&self) -> Arc<Mutex<()>> {
        Arc::clone(&self.shared.gate)
    }

    /// [`Journal::begin_batch`] for a batch alone on the folder: no other
    /// process is there (ADR 0034), and none can come before the batch ends
    /// (a newcomer waits at the knock until the batch in progress is done).
    /// Only this process's checkpoints bump the epoch then, so the batch
    /// holds [`Journal::gate`] (`_gate`, locked by the caller for the
    /// batch) instead of the `flock` (ADR 0035): two system calls fewer.
    pub(crate) fn begin_solo_batch(&mut self, _gate: &MutexGuard<'_, ()>) -> io::Result<u64> {
        let epoch = read_u64(&self.epoch_shared, 0)?.unwrap_or(1).max(1);
        self.shared.epoch_seen.fetch_max(epoch, Ordering::SeqCst);
        Ok(epoch)
    }

    pub(crate) fn end_batch(&mut self) -> io::Result<()> {
        if !std::mem::take(&mut self.shared_lock_held) {
            return Ok(());
        }
        flock(&self.epoch_shared, libc::LOCK_UN)
    }

    /// Appends entries and makes them durable (one `fdatasync`, on the
    /// calling thread).
    ///
    /// `before_flush` runs after the entries are written and before the
    /// flush (the committer makes the batch's temporary files then); it runs
    /// whatever the outcome. Flushing on a sync thread instead, with
    /// `before_flush` overlapping the device's write, cost two thread
    /// wake-ups per batch on the way to every answer, which on this VM was
    /// more than the overlap saved (ADR 0025: 5-35% more writes per second
    /// from S1 c=1 to S3, less CPU per write).
    pub(crate) fn append(
        &mut self,
        epoch: u64,
        order: u64,
        entries: &[Entry<'_>],
        before_flush: impl FnOnce(),
    ) -> io::Result<()> {
        self.append_with(epoch, order, entries, true, before_flush)
    }

    /// [`Journal::append`], flushed only when `flush`: entries that need
    /// not be durable (the deletes of young objects that need not survive a
    /// power cut) reach the disk with the next flush, and a recovery on the
    /// same boot reads them from the page cache.
    pub(crate) fn append_with(
        &mut self,
        epoch: u64,
        order: u64,
        entries: &[Entry<'_>],
        flush: bool,
        before_flush: impl FnOnce(),
    ) -> io::Result<()> {
        if entries.is_empty() {
            before_flush();
            return Ok(());
        }
        let written = self.write_entries(epoch, order, entries);
        before_flush();
        let (index, end) = written?;
        if flush {
            self.file.sync_data()?;
        }
        self.wrote(index, end, epoch);
        Ok(())
    }

    /// Notes entries of `epoch` written to region `index` up to `end`.
    fn wrote(&mut self, index: usize, end: u64, epoch: u64) {
        let region = &mut self.regions[index];
        region.offset = end;
        region.epoch = region.epoch.max(epoch);
        self.shared.journaled.fetch_max(epoch, Ordering::SeqCst);
    }

    /// Encodes one entry into the batch's buffer and notes where it sits
    /// in the buffer.
    fn encode_entry(&mut self, epoch: u64, order: u64, entry: &Entry<'_>) {
        let start = self.buffer.len();
        encode(&mut self.buffer, epoch, order, entry);
        // Offsets within the batch for now; `write_buffer` places them.
        self.appended.push(EntryAt {
            offset: start as u64,
            len: u32::try_from(self.buffer.len() - start).expect("entries are bounded"),
        });
    }

    /// Writes the entries (not yet flushed) to the region of `epoch`:
    /// returns the region and where its entries now end.
    fn write_entries(
        &mut self,
        epoch: u64,
        order: u64,
        entries: &[Entry<'_>],
    ) -> io::Result<(usize, u64)> {
        self.buffer.clear();
        self.appended.clear();
        for entry in entries {
            self.encode_entry(epoch, order, entry);
        }
        self.write_buffer(epoch)
    }

    /// Writes the encoded batch (not yet flushed) to the region of `epoch`:
    /// returns the region and where its entries now end.
    fn write_buffer(&mut self, epoch: u64) -> io::Result<(usize, u64)> {
        let index = region_index(epoch);
        let durable = self.shared.durable_seen.load(Ordering::SeqCst);
        let region = &mut self.regions[index];
        if region.reusable(epoch, durable) {
            region.offset = 0;
        }
        let end = region.offset + self.buffer.len() as u64;
        if end > REGION_BYTES {
            return Err(io::Error::other(
                "journal region full: the batch was not reserved (internal)",
            ));
        }
        let base = Region::base(index);
        if end > region.zeroed {
            // Allocate (write) the next stretch now, so later passes
            // overwrite blocks without metadata to flush.
            let grown = (region.zeroed * 2).max(end).min(REGION_BYTES);
            let zeros = vec![0u8; usize::try_from(grown - region.zeroed).expect("bounded")];
            self.file.write_all_at(&zeros, base + region.zeroed)?;
            region.zeroed = grown;
        }
        let at = base + region.offset;
        self.file.write_all_at(&self.buffer, at)?;
        for entry in &mut self.appended {
            entry.offset += at;
        }
        Ok((index, end))
    }

    /// Where the entries of the last successful [`Journal::append`] sit, in
    /// the order given.
    pub(crate) fn appended(&self) -> &[EntryAt] {
        &self.appended
    }

    /// Marks this journal as holding young entries (the process went solo),
    /// so that a recovery on this boot reads and applies them.
    pub(crate) fn mark_young(&self) -> io::Result<()> {
        if let Some(marker) = young_marker(&self.path) {
            File::create(marker)?;
        }
        self.shared.young.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// A handle other threads read entries' bodies through.
    pub(crate) fn reader(&self) -> io::Result<JournalReader> {
        Ok(JournalReader {
            file: Arc::new(self.file.try_clone()?),
        })
    }

    /// Starts the thread that checkpoints every interval (and when a region
    /// fills). Not at open: a process that waits for a solo process to make
    /// room (ADR 0034) must not raise the durable epoch past young entries
    /// that process has not put in place yet.
    pub(crate) fn start_checkpointer(&mut self) -> io::Result<()> {
        if self.checkpointer.is_none() {
            let shared = Arc::clone(&self.shared);
            let interval = self.checkpoint_interval;
            self.checkpointer = Some(
                std::thread::Builder::new()
                    .name("wasmkeep-folder-checkpoint".to_owned())
                    .spawn(move || checkpoint_loop(&shared, interval))?,
            );
        }
        Ok(())
    }

    /// Sets what each checkpoint calls to put young objects in place.
    pub(crate) fn set_placer(&self, placer: Placer) {
        *self.shared.placer.lock() = Some(placer);
    }

    /// A handle that runs checkpoints from another thread.
    pub(crate) fn checkpoints(&self) -> Checkpoints {
        Checkpoints {
            shared: Arc::clone(&self.shared),
            journal: self.path.clone(),
        }
    }

    /// Whether another live process has a journal in this folder (its lock
    /// is held, and not by this process).
    pub(crate) fn others_present(&self) -> io::Result<bool> {
        Ok(self.others()?.live)
    }

    /// Whether a gone process's journal is in the folder that this process
    /// has not recovered (it died after this process's open).
    pub(crate) fn gone_present(&self) -> io::Result<bool> {
        Ok(self.others()?.gone)
    }

    fn others(&self) -> io::Result<Others> {
        let dir = self.path.parent().expect("a journal lives in .wal");
        let pending = self.shared.pending.lock();
        let ours: Vec<&Path> = std::iter::once(self.path.as_path())
            .chain(pending.iter().map(|(path, _)| path.as_path()))
            .collect();
        others_in(dir, &ours)
    }

    /// Removes this journal, unused: the open that made it starts over
    /// before any batch (entries copied at open from gone processes'
    /// journals are still in those).
    pub(crate) fn abandon(mut self) {
        self.stop_checkpointer();
        self.remove_files();
    }

    /// A clean stop: everything journaled is made durable in place and the
    /// journal file removed.
    pub(crate) fn close(mut self) {
        self.stop_checkpointer();
        if self.shared.dirty()
            && let Err(e) = self.shared.checkpoint(true)
        {
            tracing::warn!(error = %e, "folder bucket: the last checkpoint failed; the journal stays for recovery");
            return;
        }
        self.remove_files();
    }

    /// Removes the journal file, then its young marker and its pads; a
    /// journal that stays keeps its marker for the recovery that reads it.
    fn remove_files(&self) {
        if let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "folder bucket: could not remove the journal");
            return;
        }
        let _ = remove_young_marker(&self.path);
        // If they stay, they go at the next open (`remove_orphan_pads`).
        if let Some(pads) = &self.pads {
            let _ = fs::remove_dir_all(pads);
        }
    }

    fn stop_checkpointer(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(handle) = self.checkpointer.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop_checkpointer();
    }
}

/// Runs checkpoints of a journal from another thread (see
/// [`Journal::checkpoints`]).
#[derive(Clone)]
pub(crate) struct Checkpoints {
    shared: Arc<Shared>,
    journal: PathBuf,
}

impl Checkpoints {
    /// Makes everything journaled so far durable in place.
    pub(crate) fn run(&self) -> io::Result<()> {
        self.shared.checkpoint(true)
    }

    /// Unmarks the journal: the process left solo mode and its young
    /// entries are durable in place.
    pub(crate) fn unmark_young(&self) -> io::Result<()> {
        self.shared.young.store(false, Ordering::SeqCst);
        remove_young_marker(&self.journal)
    }
}

fn checkpoint_loop(shared: &Shared, interval: Duration) {
    loop {
        {
            let mut stop = shared.stop.lock();
            if *stop {
                return;
            }
            shared.wake.wait_for(&mut stop, interval);
            if *stop {
                return;
            }
        }
        if shared.dirty()
            && let Err(e) = shared.checkpoint(false)
        {
            tracing::error!(error = %e, "folder bucket: checkpoint failed; retrying");
        }
    }
}

/// This process's journal: a gone process's padded journal taken over (its
/// entries are all durable now, so a replay skips them, and its pads still
/// surround it), else a new one. Removes the other gone journals and the
/// pads whose journal is gone. The caller holds the exclusive epoch lock.
fn take_journal(
    dir: &Path,
    dead: Vec<(PathBuf, File)>,
) -> io::Result<(PathBuf, File, Option<PathBuf>)> {
    let names = names_in(dir)?;
    let mut taken = None;
    for (path, lock) in dead {
        let pads = path
            .file_name()
            .map(|name| format!("{PAD_PREFIX}{}", name.to_string_lossy()))
            .filter(|pads| names.contains(pads));
        if taken.is_none()
            && let Some(pads) = pads
        {
            // The lock moves to a descriptor that can write; nobody else
            // looks for gone journals while we hold the epoch lock.
            let reopened = OpenOptions::new().read(true).write(true).open(&path);
            drop(lock);
            if let Ok(file) = reopened
                && flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_ok()
            {
                remove_young_marker(&path)?;
                taken = Some((path, file, Some(dir.join(pads))));
                continue;
            }
        }
        remove_dead_journal(&path)?;
    }
    remove_orphan_pads(dir)?;
    match taken {
        Some(journal) => Ok(journal),
        None => create_journal_file(dir),
    }
}

/// The names in a folder.
pub(crate) fn names_in(dir: &Path) -> io::Result<std::collections::HashSet<String>> {
    let mut names = std::collections::HashSet::new();
    for entry in fs::read_dir(dir)? {
        names.insert(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Creates this process's journal: zero-filled, locked, and durable as a
/// folder entry before any batch relies on it; padded where the file system
/// allows (returns the pads' folder). The caller holds the exclusive epoch
/// lock.
fn create_journal_file(dir: &Path) -> io::Result<(PathBuf, File, Option<PathBuf>)> {
    let name = format!(
        "{JOURNAL_PREFIX}{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    let path = dir.join(&name);
    let started = std::time::Instant::now();
    let pads = match pad_journal(dir, &name, &path) {
        Ok(pads) => {
            tracing::debug!(
                padded = pads.is_some(),
                micros = started.elapsed().as_micros(),
                "folder bucket: journal created"
            );
            pads
        }
        Err(e) => {
            tracing::debug!(error = %e, "folder bucket: the journal goes unpadded");
            None
        }
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(pads.is_none())
        .open(&path)?;
    flock(&file, libc::LOCK_EX)?;
    let zeros = vec![0u8; usize::try_from(JOURNAL_ZEROED_START).expect("small")];
    for index in 0..2 {
        file.write_all_at(&zeros, Region::base(index))?;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok((path, file, pads))
}

/// Makes empty pad files in a new folder `p.<name>` until they hold every
/// inode of an aligned run of [`PAD_GROUP`], then renames one in the middle
/// of the run to `path` (the journal, so its inode-table block holds nothing
/// that changes but the journal). Returns the pads' folder, or `None` (and
/// no pads left) when no run came together within [`PAD_FILES_MAX`] files
/// and [`PAD_TIME_MAX`].
///
/// ext4 hands out the lowest free inode of the folder's group, so in a
/// group with holes (files deleted there) the pads would first fill them,
/// one by one. `dir` is therefore flagged `TOPDIR`, so that ext4 places the
/// pads' folder like a top-level one, in a group with more free inodes than
/// average (Orlov), where they come in order. Pads that filled holes all
/// the same stay with the others: removing them would free inodes that
/// every file created in the next minute scans past on ext4 without a
/// journal (ADR 0027).
fn pad_journal(dir: &Path, name: &str, path: &Path) -> io::Result<Option<PathBuf>> {
    mark_top_folder(dir);
    let folder = dir.join(format!("{PAD_PREFIX}{name}"));
    fs::create_dir(&folder)?;
    let mut made: std::collections::BTreeMap<u64, PathBuf> = std::collections::BTreeMap::new();
    let mut run = None;
    let mut failed = None;
    let started = std::time::Instant::now();
    for n in 0..PAD_FILES_MAX {
        if started.elapsed() > PAD_TIME_MAX {
            break;
        }
        let pad = folder.join(n.to_string());
        let file = match OpenOptions::new().write(true).create_new(true).open(&pad) {
            Ok(file) => file,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        let ino = match inode_number(&file) {
            Ok(ino) => ino,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        made.insert(ino, pad);
        let start = ino.saturating_sub(1) / PAD_GROUP * PAD_GROUP + 1;
        if made.range(start..start + PAD_GROUP).count() == PAD_GROUP as usize {
            run = Some(start);
            break;
        }
    }
    let placed = match run {
        Some(start) => {
            let pad = made
                .remove(&(start + PAD_GROUP / 2))
                .expect("the run is whole");
            fs::rename(&pad, path).map(|()| true)
        }
        None => failed.map_or(Ok(false), Err),
    };
    if !matches!(placed, Ok(true)) {
        let _ = fs::remove_dir_all(&folder);
    }
    Ok(placed?.then_some(folder))
}

/// Sets ext4's `TOPDIR` flag on a folder (`chattr +T`): folders made in it
/// are spread over the file system like top-level ones. Where the flag is
/// refused (another file system, another owner) nothing changes.
fn mark_top_folder(dir: &Path) {
    use std::os::fd::AsRawFd;
    const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;
    let Ok(folder) = File::open(dir) else {
        return;
    };
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int to the pointer, which is valid
    // for writes for the duration of the call.
    if unsafe { libc::ioctl(folder.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0
        || flags & FS_TOPDIR_FL != 0
    {
        return;
    }
    flags |= FS_TOPDIR_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, valid for the
    // duration of the call.
    let _ = unsafe { libc::ioctl(folder.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
}

/// The inode number of an open file (asking for the number only, see
/// `statx_only`).
fn inode_number(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    statx_only(file.as_raw_fd(), c"", libc::AT_EMPTY_PATH, libc::STATX_INO).map(|out| out.stx_ino)
}

/// Removes the pads whose journal is gone: a journal removed at a clean
/// close or by `take_journal`, or one that died while its pads were made.
/// The caller holds the exclusive epoch lock, under which journals are
/// made, taken over and removed.
fn remove_orphan_pads(dir: &Path) -> io::Result<()> {
    let names = names_in(dir)?;
    for name in &names {
        let Some(journal) = name.strip_prefix(PAD_PREFIX) else {
            continue;
        };
        if !names.contains(journal) {
            let path = dir.join(name);
            // A folder of pads, or a pad file of an earlier build.
            let removed = match fs::remove_dir_all(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => fs::remove_file(&path),
                other => other,
            };
            match removed {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The journals in `dir` that are none of `ours` (this process's own and
/// the gone ones it holds): whether any is a live process's (its lock is
/// held) and whether any is a gone one's.
#[derive(Debug, Clone, Copy, Default)]
struct Others {
    live: bool,
    gone: bool,
}

fn others_in(dir: &Path, ours: &[&Path]) -> io::Result<Others> {
    let mut others = Others::default();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(JOURNAL_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        if ours.contains(&path.as_path()) {
            continue;
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // A gone process's: this process's next open would take it.
            Ok(()) => others.gone = true,
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => others.live = true,
            Err(e) => return Err(e),
        }
    }
    Ok(others)
}

/// The most journal bytes of adopted young objects (ADR 0040): more are put
/// in place as files instead. Half a region, as a batch: the first epoch's
/// region then still has room for batches before its checkpoint.
const ADOPTED_BYTES_MAX: usize = JOURNAL_BATCH_BYTES_MAX;

/// The journal bytes the young puts among `entries` take.
fn adoptable_bytes(entries: &[Decoded]) -> usize {
    entries
        .iter()
        .filter(|e| e.kind == EntryKind::Put)
        .map(|e| entry_bytes(&e.key, e.body.len()))
        .sum()
}

/// The journals of processes that are gone (their lock is free), locked.
fn dead_journals(dir: &Path) -> io::Result<Vec<(PathBuf, File)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(JOURNAL_PREFIX) {
            continue;
        }
        let path = entry.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => out.push((path, file)),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Removes a dead journal. Its process may have stopped cleanly and removed
/// it after `dead_journals` opened it (the lock was free once it was gone).
fn remove_dead_journal(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    remove_young_marker(path)
}

/// The marker saying `journal` holds young entries.
fn young_marker(journal: &Path) -> Option<PathBuf> {
    let name = journal.file_name()?.to_string_lossy();
    Some(journal.with_file_name(format!("{YOUNG_PREFIX}{name}")))
}

fn remove_young_marker(journal: &Path) -> io::Result<()> {
    let Some(marker) = young_marker(journal) else {
        return Ok(());
    };
    match fs::remove_file(marker) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Bytes read at a time from a journal region by recovery.
const RECOVERY_READ_BYTES: usize = 1 << 20;

/// The entries of both regions of a journal, read from the locked file (not
/// its path: its owner, stopping, may have removed it after we opened it).
/// Each region is read a chunk at a time and decoded as it comes, up to the
/// first bytes that are not an entry: what follows is zeros (a region is
/// allocated as it fills) or entries of an earlier pass through the region
/// (it starts over once they are durable). Reading whole regions took
/// 7-20 ms of a restart after a crash under load (ADR 0040).
fn decoded_regions(journal: &File) -> io::Result<Vec<Decoded>> {
    let mut entries = Vec::new();
    let mut chunk = vec![0u8; RECOVERY_READ_BYTES];
    for index in 0..2 {
        let base = Region::base(index);
        // Read but not yet decoded: at most the start of one entry.
        let mut bytes = Vec::new();
        let mut read_so_far = 0u64;
        while read_so_far < REGION_BYTES {
            let want = RECOVERY_READ_BYTES.min((REGION_BYTES - read_so_far) as usize);
            let read = read_at_most(journal, &mut chunk[..want], base + read_so_far)?;
            read_so_far += read as u64;
            bytes.extend_from_slice(&chunk[..read]);
            let (decoded, end, stop) = decode_prefix(&bytes);
            entries.extend(decoded);
            bytes.drain(..end);
            if stop == Stop::NotAnEntry || read < want {
                break;
            }
        }
    }
    Ok(entries)
}

/// Reads into `buf` from `at` until it is full or the file ends; returns
/// how much was read.
fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Of each key's last entry (see [`keep_last`]), those that are young: in
/// solo mode nobody else wrote those keys meanwhile. A later entry that is
/// not young (written after its process left solo mode, or by a process
/// that never was alone) was in place as a file when it was answered.
fn young_only(last: HashMap<String, Decoded>) -> Vec<Decoded> {
    last.into_values().filter(|entry| entry.young).collect()
}

/// Keeps in `last`, for each key, its last entry (by order, then position
/// in the batch) of an epoch past `durable`; returns the highest such epoch
/// seen (0: none).
fn keep_last(
    last: &mut HashMap<String, Decoded>,
    entries: impl IntoIterator<Item = Decoded>,
    durable: u64,
) -> u64 {
    let mut highest = 0;
    for entry in entries {
        if entry.epoch <= durable {
            continue;
        }
        highest = highest.max(entry.epoch);
        let newer = last
            .get(&entry.key)
            .is_none_or(|have| (entry.order, entry.index) > (have.order, have.index));
        if newer {
            last.insert(entry.key.clone(), entry);
        }
    }
    highest
}

/// The journals of gone processes after recovery, still locked.
enum Recovered {
    /// Every entry of theirs is durable in place: the caller takes one over
    /// or removes them.
    Durable(Vec<(PathBuf, File)>),
    /// Same boot, and they hold entries: their objects stand in the page
    /// cache but some may not be durable yet; the caller's first checkpoint
    /// makes them so, and the journals stay until then. `young`: each key's
    /// last entry where that is young (written alone on the folder, ADR
    /// 0034), which the caller adopts or applies before it serves.
    NotYetDurable {
        dead: Vec<(PathBuf, File)>,
        young: Vec<Decoded>,
    },
}

/// Recovery at open; the caller holds the exclusive epoch lock.
fn recover(
    root: &Path,
    dir: &Path,
    root_dir: &File,
    epoch_file: &File,
    durable_file: &File,
    boot_id: &str,
) -> io::Result<Recovered> {
    let boot_path = dir.join(BOOT_FILE);
    let last_boot = match fs::read_to_string(&boot_path) {
        Ok(s) => Some(s.trim().to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let dead = dead_journals(dir)?;
    let epoch = read_u64(epoch_file, 0)?.unwrap_or(1).max(1);
    let durable = read_durable(durable_file)?;
    if last_boot.as_deref() == Some(boot_id) {
        // Same boot: the page cache holds what the dead processes renamed.
        // Journals without a single entry need no checkpoint. Any entry
        // counts, durable or not: telling them apart means reading the whole
        // journal (up to 64 MiB, ~30 ms after a crash under load), and a
        // checkpoint owed for nothing costs only a `syncfs` later.
        let mut entries = false;
        for (_, journal) in &dead {
            entries |= has_entries(journal)?;
        }
        if !entries {
            return Ok(Recovered::Durable(dead));
        }
        // A journal written alone on the folder (ADR 0034) holds objects
        // that never became files: the caller adopts them or puts them in
        // place, before this process serves. Only when some journal is
        // marked are journals read, and then all of them, each key's last
        // entry taken across all (by batch order): writers killed in turn
        // leave one journal each until a checkpoint, and the newest write of
        // a key may be in any of them, young or already in place.
        let marked = dead
            .iter()
            .any(|(path, _)| young_marker(path).is_some_and(|m| m.exists()));
        let young = if marked {
            let mut last = HashMap::new();
            for (_, journal) in &dead {
                keep_last(&mut last, decoded_regions(journal)?, durable);
            }
            young_only(last)
        } else {
            Vec::new()
        };
        // This process's entries come after theirs; its first checkpoint
        // (which bumps again) makes theirs durable.
        epoch_file.write_all_at(&(epoch + 1).to_le_bytes(), 0)?;
        return Ok(Recovered::NotYetDurable { dead, young });
    }
    // Another boot (or the first open): replay what may have been lost.
    let mut last = HashMap::new();
    let mut highest = epoch.max(durable);
    for (_, journal) in &dead {
        highest = highest.max(keep_last(&mut last, decoded_regions(journal)?, durable));
    }
    let replayed = last.len();
    for entry in last.into_values() {
        replay(root, &entry)?;
    }
    syncfs(root_dir)?;
    epoch_file.write_all_at(&(highest + 1).to_le_bytes(), 0)?;
    epoch_file.sync_data()?;
    raise_durable(durable_file, highest)?;
    let temp = dir.join(format!("{BOOT_FILE}.tmp"));
    fs::write(&temp, boot_id)?;
    File::open(&temp)?.sync_all()?;
    fs::rename(&temp, &boot_path)?;
    File::open(dir)?.sync_all()?;
    if replayed > 0 {
        tracing::info!(
            objects = replayed,
            journals = dead.len(),
            "folder bucket: replayed the journals of the last boot"
        );
    }
    Ok(Recovered::Durable(dead))
}

/// Whether either region of a journal begins with an entry's magic (a
/// journal nobody wrote to is zeros, or shorter).
fn has_entries(journal: &File) -> io::Result<bool> {
    // From the locked file, not its path (see `recover`).
    for index in 0..2 {
        let mut magic = [0u8; 4];
        match journal.read_exact_at(&mut magic, Region::base(index)) {
            Ok(()) if u32::from_le_bytes(magic) == ENTRY_MAGIC => return Ok(true),
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Deletes in one folder from which [`replay_young`] lists the folder
/// instead of trying each `unlink`.
const LISTED_DELETES_MIN: usize = 16;

/// Applies the young entries of a gone solo process (each key's last one)
/// and returns how many changed the folder. Deletes go first, so that a
/// folder an object left is free for a put below it.
///
/// Most deletes name records compacted before they ever became files. The
/// folders they name are listed once each, and only names found there are
/// removed: a failed `unlink` costs a negative lookup, tens of µs in a
/// folder that many files passed through, and a crash under load leaves
/// thousands of such deletes (the first answer after a restart waits for
/// this).
fn replay_young(root: &Path, mut entries: Vec<Decoded>) -> io::Result<usize> {
    entries.sort_by_key(|entry| entry.kind != EntryKind::Delete);
    // A folder with only a few deletes is not listed: it may be a large one
    // (a listing costs per entry), and a few failed unlinks cost little.
    let mut deletes: HashMap<PathBuf, usize> = HashMap::new();
    for entry in entries.iter().filter(|e| e.kind == EntryKind::Delete) {
        if let Some(dir) = root.join(&entry.key).parent() {
            *deletes.entry(dir.to_path_buf()).or_default() += 1;
        }
    }
    let mut listed: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut applied = 0;
    for entry in &entries {
        if entry.kind == EntryKind::Delete {
            let target = root.join(&entry.key);
            if let (Some(dir), Some(name)) = (target.parent(), target.file_name())
                && deletes.get(dir).is_some_and(|n| *n >= LISTED_DELETES_MIN)
            {
                if !listed.contains_key(dir) {
                    // No such folder: none of its names is there.
                    let names = match names_in(dir) {
                        Err(e)
                            if e.kind() == io::ErrorKind::NotFound
                                || e.raw_os_error() == Some(libc::ENOTDIR) =>
                        {
                            HashSet::new()
                        }
                        names => names?,
                    };
                    listed.insert(dir.to_path_buf(), names);
                }
                let present = listed
                    .get(dir)
                    .is_some_and(|names| names.contains(name.to_string_lossy().as_ref()));
                if !present {
                    continue;
                }
            }
        }
        replay(root, entry)?;
        applied += 1;
    }
    Ok(applied)
}

/// Applies one entry again (not synced: recovery syncs the file system once).
fn replay(root: &Path, entry: &Decoded) -> io::Result<()> {
    let target = root.join(&entry.key);
    match entry.kind {
        EntryKind::Durable => Ok(()),
        EntryKind::Delete => match fs::remove_file(&target) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        EntryKind::Put => {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            let temp = root
                .join(crate::folder::TEMP_DIR)
                .join(format!("replay.{:016x}", rand::random::<u64>()));
            fs::write(&temp, &entry.body)?;
            fs::rename(&temp, &target)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_stop_at_the_first_damaged_one() {
        let mut bytes = Vec::new();
        let entries = [
            Entry {
                index: 0,
                kind: EntryKind::Put,
                key: "a/b",
                body: b"hello",
                young: false,
            },
            Entry {
                index: 1,
                kind: EntryKind::Delete,
                key: "c",
                body: b"",
                young: true,
            },
            Entry {
                index: 2,
                kind: EntryKind::Durable,
                key: "d/e/f",
                body: b"",
                young: false,
            },
        ];
        for entry in &entries {
            encode(&mut bytes, 7, 42, entry);
        }
        let decoded = decode_all(&bytes);
        assert_eq!(decoded.len(), 3);
        assert_eq!(decoded[0].key, "a/b");
        assert_eq!(decoded[0].body, b"hello");
        assert_eq!(
            (decoded[1].epoch, decoded[1].order, decoded[1].index),
            (7, 42, 1)
        );
        assert_eq!(decoded[2].kind, EntryKind::Durable);
        let young: Vec<bool> = decoded.iter().map(|d| d.young).collect();
        assert_eq!(young, [false, true, false]);
        assert_eq!(
            bytes.len(),
            entries
                .iter()
                .map(|e| entry_bytes(e.key, e.body.len()))
                .sum::<usize>()
        );
        // A flipped byte in the second entry ends the journal there.
        let second = entry_bytes("a/b", 5);
        let mut damaged = bytes.clone();
        damaged[second + ENTRY_HEADER_BYTES] ^= 1;
        assert_eq!(decode_all(&damaged).len(), 1);
        // Zeros and a cut entry end it too.
        assert!(decode_all(&[0u8; 64]).is_empty());
        assert_eq!(decode_all(&bytes[..bytes.len() - 1]).len(), 2);
    }

    #[test]
    fn the_durable_epoch_only_rises_and_survives_a_torn_slot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = open_counter_file(&dir.path().join("durable"))?;
        assert_eq!(read_durable(&file)?, 0);
        raise_durable(&file, 5)?;
        raise_durable(&file, 3)?;
        assert_eq!(read_durable(&file)?, 5);
        raise_durable(&file, 6)?;
        assert_eq!(read_durable(&file)?, 6);
        // Tear the slot of 6: the other slot (5) still answers.
        file.write_all_at(&[0xff; 4], 0)?;
        assert_eq!(read_durable(&file)?, 5);
        Ok(())
    }

    fn test_options() -> JournalOptions {
        JournalOptions {
            boot_id: Some("test-boot".to_owned()),
            checkpoint_interval: Duration::from_secs(3600),
            adopt: false,
        }
    }

    /// Journals one put of `a/b` as a batch of its own; returns its epoch.
    fn journal_put(journal: &mut Journal, body: &[u8]) -> io::Result<u64> {
        let epoch = journal.begin_batch()?;
        let entry = Entry {
            index: 0,
            kind: EntryKind::Put,
            key: "a/b",
            body,
            young: false,
        };
        journal.append(epoch, 1, &[entry], || {})?;
        journal.end_batch()?;
        Ok(epoch)
    }

    /// Recovery reads a region a megabyte at a time and stops at a stretch
    /// of zeros: entries over several reads, bodies with long zero runs of
    /// their own included, all come back, as a whole read would give them.
    #[test]
    fn recovery_reads_every_entry_of_a_region_however_many_reads_it_takes() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut journal = Journal::open(dir.path(), &test_options())?;
        let mut body = vec![7u8; 200 << 10];
        body[1000..(150 << 10)].fill(0);
        for _ in 0..12 {
            journal_put(&mut journal, &body)?;
        }
        let decoded = decoded_regions(&journal.file)?;
        assert_eq!(decoded.len(), 12);
        assert!(decoded.iter().all(|entry| entry.body == body));
        let mut whole = Vec::new();
        std::io::Read::read_to_end(&mut &journal.file, &mut whole)?;
        let half = whole.len().min(REGION_BYTES as usize);
        let expected: Vec<Decoded> = decode_all(&whole[..half])
            .into_iter()
            .chain(decode_all(&whole[half..]))
            .collect();
        assert_eq!(decoded, expected);
        Ok(())
    }

    #[test]
    fn appended_entries_read_back_and_a_changed_one_is_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut journal = Journal::open(dir.path(), &test_options())?;
        let epoch = journal.begin_batch()?;
        let entries = [
            Entry {
                index: 0,
                kind: EntryKind::Put,
                key: "a/log/1",
                body: b"first body",
                young: true,
            },
            Entry {
                index: 1,
                kind: EntryKind::Put,
                key: "b/log/1",
                body: b"second, longer body",
                young: true,
            },
        ];
        journal.append(epoch, 1, &entries, || {})?;
        journal.end_batch()?;
        let at = journal.appended().to_vec();
        assert_eq!(at.len(), 2);
        assert_eq!(at[0].offset + u64::from(at[0].len), at[1].offset);
        let reader = journal.reader()?;
        assert_eq!(reader.body(at[0])?, b"first body");
        assert_eq!(reader.body(at[1])?, b"second, longer body");
        // Bytes that are not that entry any more (here: zeroed, as a region
        // that started over may leave them) are an error, not a body.
        journal.file.write_all_at(&[0u8; 8], at[1].offset)?;
        let err = reader.body(at[1]).expect_err("a changed entry");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(reader.body(at[0])?, b"first body");
        journal.close();
        Ok(())
    }

    #[test]
    fn a_gone_solo_journal_has_its_young_objects_put_in_place_on_the_same_boot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        // The folder bucket makes it before it opens the journal; a replay
        // writes through it.
        fs::create_dir_all(dir.path().join(crate::folder::TEMP_DIR))?;
        let mut first = Journal::open(dir.path(), &test_options())?;
        first.mark_young()?;
        let epoch = first.begin_batch()?;
        let put = |key: &'static str, body: &'static [u8], index| Entry {
            index,
            kind: EntryKind::Put,
            key,
            body,
            young: true,
        };
        first.append(
            epoch,
            1,
            &[
                put("a/log/1", b"replaced later", 0),
                put("a/log/2", b"deleted later", 1),
                // Not young: already a file when it was journaled.
                Entry {
                    young: false,
                    ..put("a/placed", b"made at commit", 2)
                },
            ],
            || {},
        )?;
        first.append(
            epoch,
            2,
            &[
                put("a/log/1", b"the last body", 0),
                Entry {
                    index: 1,
                    kind: EntryKind::Delete,
                    key: "a/log/2",
                    body: b"",
                    young: true,
                },
            ],
            || {},
        )?;
        first.end_batch()?;
        let first_path = first.path.clone();
        drop(first); // gone without a clean close

        let second = Journal::open(dir.path(), &test_options())?;
        assert_eq!(fs::read(dir.path().join("a/log/1"))?, b"the last body");
        assert!(!dir.path().join("a/log/2").exists(), "deleted last");
        assert!(
            !dir.path().join("a/placed").exists(),
            "an entry that was not young is not applied on the same boot"
        );
        // The journal and its marker go at the first checkpoint.
        second.shared.checkpoint(true)?;
        assert!(!first_path.exists());
        assert!(young_marker(&first_path).is_some_and(|m| !m.exists()));
        second.close();
        Ok(())
    }

    /// While the journal holds young objects, a periodic checkpoint puts in
    /// place and makes durable only the epoch before the current one, then
    /// bumps: an object of the current epoch waits for the next checkpoint.
    /// The region of the new epoch starts over all the same, and a full
    /// checkpoint (a clean close, another process's knock) leaves nothing
    /// behind. Without young objects, every checkpoint is full.
    #[test]
    fn checkpoints_lag_one_epoch_while_the_journal_holds_young_objects() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut journal = Journal::open(dir.path(), &test_options())?;
        let placed = Arc::new(Mutex::new(Vec::new()));
        {
            let placed = Arc::clone(&placed);
            journal.set_placer(Arc::new(move |epoch| {
                placed.lock().push(epoch);
                Ok(())
            }));
        }
        let durable = |journal: &Journal| read_durable(&journal.shared.durable);
        let current = |journal: &Journal| -> io::Result<u64> {
            Ok(read_u64(&journal.epoch_shared, 0)?.unwrap_or(1))
        };

        // Not marked young: full.
        let e1 = journal_put(&mut journal, b"1")?;
        journal.shared.checkpoint(false)?;
        assert_eq!((durable(&journal)?, current(&journal)?), (e1, e1 + 1));
        assert_eq!(placed.lock().as_slice(), [e1]);

        journal.mark_young()?;
        let e2 = journal_put(&mut journal, b"2")?;
        assert_eq!(e2, e1 + 1);
        journal.shared.checkpoint(false)?;
        assert_eq!(
            (durable(&journal)?, current(&journal)?),
            (e2 - 1, e2 + 1),
            "lagging: the epoch before is made durable, then the epoch moves on"
        );
        assert_eq!(placed.lock().last(), Some(&(e2 - 1)));
        assert!(journal.shared.dirty(), "epoch {e2} is not durable yet");

        // The next epoch writes to the region of `e2 - 1`, all durable: it
        // starts over.
        let e3 = journal_put(&mut journal, b"3")?;
        assert_eq!(journal.appended()[0].offset, Region::base(region_index(e3)));
        journal.shared.checkpoint(false)?;
        assert_eq!((durable(&journal)?, current(&journal)?), (e2, e3 + 1));
        assert_eq!(placed.lock().last(), Some(&e2));

        // A full checkpoint puts everything in place.
        journal.shared.checkpoint(true)?;
        assert_eq!(durable(&journal)?, e3 + 1);
        assert_eq!(placed.lock().last(), Some(&(e3 + 1)));
        assert!(!journal.shared.dirty());
        journal.close();
        Ok(())
    }

    #[test]
    fn a_gone_journal_without_the_marker_is_not_read_on_the_same_boot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut first = Journal::open(dir.path(), &test_options())?;
        let epoch = first.begin_batch()?;
        first.append(
            epoch,
            1,
            &[Entry {
                index: 0,
                kind: EntryKind::Put,
                key: "b/log/1",
                body: b"young, but the journal was never marked",
                young: true,
            }],
            || {},
        )?;
        first.end_batch()?;
        drop(first);
        let second = Journal::open(dir.path(), &test_options())?;
        assert!(!dir.path().join("b/log/1").exists());
        second.close();
        Ok(())
    }

    /// The pad folders in `.wal`, by name.
    fn pad_folders(wal: &Path) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = names_in(wal)?
            .into_iter()
            .filter(|name| name.starts_with(PAD_PREFIX))
            .collect();
        names.sort();
        Ok(names)
    }

    fn name_of(pads: &Option<PathBuf>) -> Vec<String> {
        pads.iter()
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_journal_shares_its_inode_table_block_with_its_pads_only() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let wal = dir.path().join(JOURNAL_DIR);
        let journal = Journal::open(dir.path(), &test_options())?;
        match &journal.pads {
            // A file system that did not hand out a whole run: nothing is
            // left of the attempt.
            None => assert!(pad_folders(&wal)?.is_empty()),
            Some(pads) => {
                let ino = inode_number(&journal.file)?;
                let start = (ino - 1) / PAD_GROUP * PAD_GROUP + 1;
                let mut run = vec![ino];
                for entry in fs::read_dir(pads)? {
                    run.push(inode_number(&File::open(entry?.path())?)?);
                }
                run.sort_unstable();
                run.retain(|i| (start..start + PAD_GROUP).contains(i));
                assert_eq!(run, (start..start + PAD_GROUP).collect::<Vec<_>>());
                assert_eq!(pad_folders(&wal)?, name_of(&journal.pads));
            }
        }
        let path = journal.path.clone();
        journal.close();
        assert!(!path.exists());
        assert!(pad_folders(&wal)?.is_empty());
        Ok(())
    }

    #[test]
    fn pads_stay_while_their_journal_does_and_go_with_it() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let wal = dir.path().join(JOURNAL_DIR);
        let first = Journal::open(dir.path(), &test_options())?;
        // A gone process's pads, its journal already removed.
        let orphan = wal.join(format!("{PAD_PREFIX}j.1.00000000000000ab"));
        fs::create_dir(&orphan)?;
        for n in 0..3 {
            File::create(orphan.join(n.to_string()))?;
        }
        // And a pad file of an earlier build, which kept pads beside the
        // journal rather than in a folder.
        let loose = wal.join(format!("{PAD_PREFIX}j.2.00000000000000ef.0"));
        File::create(&loose)?;
        let second = Journal::open(dir.path(), &test_options())?;
        assert!(!orphan.exists());
        assert!(!loose.exists());
        let mut live = name_of(&first.pads);
        live.extend(name_of(&second.pads));
        live.sort();
        assert_eq!(pad_folders(&wal)?, live);
        let (first_path, second_path) = (first.path.clone(), second.path.clone());
        first.close();
        assert!(!first_path.exists());
        assert_eq!(pad_folders(&wal)?, name_of(&second.pads));
        second.close();
        assert!(!second_path.exists());
        assert!(pad_folders(&wal)?.is_empty());
        Ok(())
    }

    #[test]
    fn a_gone_padded_journal_is_taken_over_and_one_without_pads_removed() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let wal = dir.path().join(JOURNAL_DIR);
        let first = Journal::open(dir.path(), &test_options())?;
        let (first_path, first_pads) = (first.path.clone(), first.pads.clone());
        // Gone without a clean close (a crash, or a stop that left it).
        drop(first);
        // And a gone journal of a build without pads.
        let unpadded = wal.join(format!("{JOURNAL_PREFIX}1.00000000000000cd"));
        File::create(&unpadded)?;
        let mut second = Journal::open(dir.path(), &test_options())?;
        assert!(!unpadded.exists());
        if first_pads.is_none() {
            // Unpadded (a file system without a whole run): a new journal.
            assert_ne!(second.path, first_path);
            assert!(!first_path.exists());
        } else {
            assert_eq!(second.path, first_path);
            assert_eq!(second.pads, first_pads);
            assert_eq!(pad_folders(&wal)?, name_of(&first_pads));
        }
        // The journal taken over writes and reads back as its own.
        let epoch = journal_put(&mut second, b"after the takeover")?;
        let bytes = fs::read(&second.path)?;
        let index = usize::try_from(epoch % 2).expect("0 or 1");
        let region = &bytes[usize::try_from(Region::base(index)).expect("small")..];
        let decoded = decode_all(region);
        assert_eq!(decoded[0].body, b"after the takeover");
        assert_eq!(decoded[0].epoch, epoch);
        // A journal in use is never taken.
        let third = Journal::open(dir.path(), &test_options())?;
        assert_ne!(third.path, second.path);
        third.close();
        second.close();
        assert!(pad_folders(&wal)?.is_empty());
        Ok(())
    }

    #[test]
    fn a_gone_journal_with_entries_not_yet_durable_stays_until_the_first_checkpoint()
    -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let wal = dir.path().join(JOURNAL_DIR);
        let mut first = Journal::open(dir.path(), &test_options())?;
        let epoch = journal_put(&mut first, b"journaled, not yet durable in place")?;
        let (first_path, first_pads) = (first.path.clone(), first.pads.clone());
        // Gone before any checkpoint (a crash).
        drop(first);

        let second = Journal::open(dir.path(), &test_options())?;
        assert_ne!(second.path, first_path, "not taken over");
        assert!(first_path.exists(), "kept until a checkpoint");
        let mut both = name_of(&first_pads);
        both.extend(name_of(&second.pads));
        both.sort();
        assert_eq!(pad_folders(&wal)?, both, "its pads stay with it");
        assert!(second.shared.dirty(), "a checkpoint is owed");
        assert!(
            read_u64(&second.epoch_shared, 0)?.unwrap_or(1) > epoch,
            "this process's entries come after the gone one's"
        );
        // A third process sees it held (by the second): it leaves it alone.
        let third = Journal::open(dir.path(), &test_options())?;
        assert!(first_path.exists());
        third.close();

        second.shared.checkpoint(true)?;
        assert!(
            read_durable(&second.shared.durable)? >= epoch,
            "its entries are durable"
        );
        assert!(!first_path.exists(), "removed after the checkpoint");
        assert_eq!(pad_folders(&wal)?, name_of(&second.pads));
        assert!(!second.shared.dirty());
        second.close();
        Ok(())
    }
}

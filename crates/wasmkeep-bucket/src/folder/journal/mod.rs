//! The folder bucket's write-ahead journal (ADR 0025): one flush per batch.
//!
//! Each process sharing a folder appends its batches to a journal file of its
//! own (`.wal/j.<pid>.<random>`, held with an exclusive `flock` for its life)
//! and makes them durable with one `fdatasync` of blocks that were written
//! before (no metadata to flush); the objects themselves are then renamed into
//! place without syncing them. A checkpoint makes the materialized objects
//! durable with one `syncfs` and lets every journal start over.
//!
//! Generations (called epochs before, hence the name `.wal/epoch`) tie the
//! journals of all processes to the checkpoints:
//! - `.wal/epoch` holds the current generation. A batch holds a shared `flock`
//!   on it from before it reads the generation until its objects are renamed
//!   into place; its entries carry that generation.
//! - A checkpoint takes the exclusive `flock` (so every batch of the old
//!   generation, in every process, has materialized its objects), bumps the
//!   generation to `e + 1`, releases the lock, runs `syncfs`, and then records
//!   `e` as durable in `.wal/durable` (synced, never lowered). Every entry of
//!   a generation up to the durable one is on disk as an object and never
//!   replayed.
//! - Entries carry an order: one more than the highest counter of the batch's
//!   lock stripes (kept in the stripe lock files, under their locks), then
//!   the position in the batch. Two entries for one key always share a stripe,
//!   so the order of entries for one key is the order of their writes, across
//!   processes.
//! - A process alone on the folder (ADR 0034) takes neither lock: its
//!   batches hold an in-process gate that its checkpoints take around the
//!   bump, and their orders come from a block reserved by moving every
//!   stripe's counter past it at once (ADR 0035).
//! - While it holds young objects (ADR 0034), its periodic checkpoints lag one
//!   generation: each puts in place and makes durable the generation before the
//!   current one, then bumps. A young object becomes a file only if it outlives
//!   the whole next generation. A clean close, another process's knock, a full
//!   region and dead journals to remove take a full checkpoint.
//!
//! Recovery, at open, under the exclusive generation lock:
//! - The machine rebooted since the folder was last opened (`.wal/boot` names
//!   another boot id): objects renamed after the last checkpoint may be lost or
//!   torn. For every key, the last journaled entry of a generation after the
//!   durable one is applied again (a put writes its body, a delete removes the
//!   object, a marker leaves the durable object as it is), then `syncfs`, then
//!   the generation moves past every replayed entry and the journals are
//!   removed.
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
//!   folder at once (the solo lock taken without waiting, under the generation
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
//!
//! The parts, each using only those listed before it: `format` (the bytes),
//! `files` (the files in `.wal`), `checkpoint` and `recovery`. This file is
//! the journal a process appends to, opened with recovery and closed with a
//! last checkpoint. The journal never decides what a batch writes (the
//! committer gives it the entries) and never reads an object.

mod checkpoint;
mod files;
mod format;
mod recovery;
#[cfg(test)]
mod tests;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

pub(crate) use checkpoint::Checkpoints;
pub use format::JOURNAL_BYTES_MAX;
pub(crate) use format::{Entry, EntryAt, EntryKind, JournalReader, entry_bytes};

use super::layout::{JOURNAL_DIR, content_etag};
use super::locks::flock;
use super::solo::SoloLock;
use super::sys::{open_counter_file, read_u64};
use crate::Etag;
use checkpoint::{Placer, Shared, checkpoint_loop};
use files::{
    Others, create_journal_file, others_in, remove_orphan_pads, remove_young_marker, take_journal,
    young_marker,
};
use format::{
    Decoded, JOURNAL_ZEROED_START, REGION_BYTES, Region, encode, read_durable, region_index,
};
use recovery::{Recovered, current_boot_id, recover, replay_young};

/// For the property tests of the journal's bytes (`tests/journal.rs`), not
/// an API: entries encoded as a process appends them, and a file's entries
/// as recovery reads them back.
#[doc(hidden)]
pub mod fuzzing {
    use std::fs::File;
    use std::io;

    use super::format::{self, Decoded, Entry, EntryKind};

    /// Where the second region of a journal file starts.
    pub const REGION_BYTES: u64 = format::REGION_BYTES;

    /// One journal entry; `kind` is 1 (put), 2 (delete) or 3 (durable).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct JournalEntry {
        pub generation: u64,
        pub order: u64,
        pub index: u32,
        pub kind: u8,
        pub key: String,
        pub body: Vec<u8>,
        pub young: bool,
    }

    /// Appends `entry` to `out` as a journal writes it.
    pub fn encode(out: &mut Vec<u8>, entry: &JournalEntry) {
        let kind = match entry.kind {
            1 => EntryKind::Put,
            2 => EntryKind::Delete,
            3 => EntryKind::Durable,
            other => panic!("no entry kind {other}"),
        };
        let written = Entry {
            index: entry.index,
            kind,
            key: &entry.key,
            body: &entry.body,
            young: entry.young,
        };
        format::encode(out, entry.generation, entry.order, &written);
    }

    /// The entries of both regions of `journal`, as recovery reads them.
    pub fn recover(journal: &File) -> io::Result<Vec<JournalEntry>> {
        Ok(super::recovery::decoded_regions(journal)?
            .into_iter()
            .map(|decoded: Decoded| JournalEntry {
                generation: decoded.generation,
                order: decoded.order,
                index: decoded.index,
                kind: decoded.kind as u8,
                key: decoded.key,
                body: decoded.body,
                young: decoded.young,
            })
            .collect())
    }
}

/// `.wal/epoch`: the file keeps its name from before the counter was
/// called a generation, so that existing folders open.
const GENERATION_FILE: &str = "epoch";
const DURABLE_FILE: &str = "durable";

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

/// One process's journal (owned by the folder committer thread).
///
/// The file has two regions; a batch of generation `e` goes to region `e % 2`.
/// A region starts over (at its beginning) when the batch's generation is newer
/// than everything in it and all of that is durable, so the entries of the
/// generation after a checkpoint's bump never stand in the way of reusing the
/// space of the generation before it. Recovery reads both regions.
pub(crate) struct Journal {
    shared: Arc<Shared>,
    path: PathBuf,
    file: File,
    /// The descriptor of `.wal/epoch` for the shared lock of batches.
    generation_shared: File,
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
    pub solo_lock: SoloLock,
    pub objects: Vec<Adopted>,
}

/// One adopted young object, copied into this process's journal.
#[derive(Debug)]
pub(crate) struct Adopted {
    pub key: String,
    pub at: EntryAt,
    pub generation: u64,
    pub size: u64,
    pub etag: Etag,
}

/// The most journal bytes of adopted young objects (ADR 0040): more are put
/// in place as files instead. Half a region, as a batch: the first generation's
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

impl Journal {
    /// Recovers the folder's journals (see the module docs) and starts this
    /// process's own journal and checkpointer.
    pub(crate) fn open(root: &Path, options: &JournalOptions) -> io::Result<Journal> {
        let dir = root.join(JOURNAL_DIR);
        fs::create_dir_all(&dir)?;
        let root_dir = File::open(root)?;
        let generation_exclusive = open_counter_file(&dir.join(GENERATION_FILE))?;
        let durable = open_counter_file(&dir.join(DURABLE_FILE))?;
        let boot_id = match &options.boot_id {
            Some(id) => id.clone(),
            None => current_boot_id()?,
        };
        flock(&generation_exclusive, libc::LOCK_EX)?;
        // Everything up to the unlock runs under the exclusive generation lock.
        // `Shared` keeps a duplicate of the descriptor: the lock belongs to
        // the open file description both share.
        let opened = generation_exclusive.try_clone().and_then(|locked| {
            Self::open_locked(root, &dir, root_dir, locked, durable, &boot_id, options)
        });
        let unlocked = flock(&generation_exclusive, libc::LOCK_UN);
        let journal = opened?;
        unlocked?;
        Ok(journal)
    }

    /// [`Journal::open`] under the exclusive generation lock
    /// (`generation_exclusive`).
    fn open_locked(
        root: &Path,
        dir: &Path,
        root_dir: File,
        generation_exclusive: File,
        durable: File,
        boot_id: &str,
        options: &JournalOptions,
    ) -> io::Result<Journal> {
        let mut pending = Vec::new();
        let mut owed = Vec::new();
        let (path, file, pads) = match recover(
            root,
            dir,
            &root_dir,
            &generation_exclusive,
            &durable,
            boot_id,
        )? {
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
            let solo_lock = if options.adopt && adoptable_bytes(&owed) <= ADOPTED_BYTES_MAX {
                SoloLock::try_solo(dir, &|| Ok(others_in(dir, &ours)?.live))?
            } else {
                None
            };
            match solo_lock {
                Some(solo_lock) => {
                    let (puts, rest): (Vec<_>, Vec<_>) =
                        owed.into_iter().partition(|e| e.kind == EntryKind::Put);
                    let removed = replay_young(root, rest)?;
                    adopt = Some((solo_lock, puts, removed));
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
        let generation_now = read_u64(&generation_exclusive, 0)?.unwrap_or(1).max(1);
        let shared = Arc::new(Shared {
            root_dir,
            generation_exclusive: Mutex::new(generation_exclusive),
            gate: Arc::new(Mutex::new(())),
            durable,
            journaled: AtomicU64::new(0),
            durable_seen: AtomicU64::new(durable_now),
            pending: Mutex::new(pending),
            placer: Mutex::new(None),
            young: AtomicBool::new(false),
            generation_seen: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let generation_shared = open_counter_file(&dir.join(GENERATION_FILE))?;
        let mut journal = Journal {
            shared,
            path,
            file,
            generation_shared,
            shared_lock_held: false,
            regions: [Region {
                offset: 0,
                zeroed: JOURNAL_ZEROED_START,
                generation: 0,
            }; 2],
            buffer: Vec::new(),
            appended: Vec::new(),
            checkpointer: None,
            checkpoint_interval: options.checkpoint_interval,
            pads,
            adoption: None,
        };
        if let Some((solo_lock, puts, removed)) = adopt {
            let objects = journal.write_adopted(generation_now, &puts)?;
            tracing::info!(
                adopted = objects.len(),
                removed,
                "folder bucket: adopted the young objects of a gone solo process (they go in place at the first checkpoint)"
            );
            journal.adoption = Some(Adoption { solo_lock, objects });
        }
        Ok(journal)
    }

    /// The young objects adopted at open, and the solo lock taken for them
    /// (once; `None` when there were none).
    pub(crate) fn take_adoption(&mut self) -> Option<Adoption> {
        self.adoption.take()
    }

    /// Copies adopted young puts into this journal, in the current generation
    /// (`generation`), each with the order and index its batch gave it: copies
    /// of the same writes, they sort as those do against every other entry
    /// of their keys. Not flushed: until this process's first checkpoint
    /// puts them in place, the gone process's journal (flushed before it
    /// answered) stays, and a recovery reads both.
    fn write_adopted(&mut self, generation: u64, puts: &[Decoded]) -> io::Result<Vec<Adopted>> {
        self.buffer.clear();
        self.appended.clear();
        for put in puts {
            self.encode_entry(
                generation,
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
        let (index, end) = self.write_buffer(generation)?;
        self.wrote(index, end, generation);
        Ok(puts
            .iter()
            .zip(&self.appended)
            .map(|(put, at)| Adopted {
                key: put.key.clone(),
                at: *at,
                generation,
                size: put.body.len() as u64,
                etag: content_etag(&put.body),
            })
            .collect())
    }

    /// Makes room for `bytes` more journal bytes in whichever region the
    /// batch's generation picks: a region that is full of entries not yet
    /// durable is checkpointed first. Call before taking any lock.
    pub(crate) fn reserve(&mut self, bytes: usize) -> io::Result<()> {
        let bytes = bytes as u64;
        let durable = self.shared.durable_seen.load(Ordering::SeqCst);
        let tight = self.regions.iter().any(|r| {
            // The batch either appends or (newer generation, all durable)
            // starts over.
            r.offset + bytes > REGION_BYTES && r.generation > durable
        });
        let half_full = |r: &Region| r.generation > durable && r.offset + bytes > REGION_BYTES / 2;
        let generation = self.shared.generation_seen.load(Ordering::SeqCst);
        let soon = if self.shared.young.load(Ordering::SeqCst) && generation > 0 {
            // Lagging checkpoints leave the region of the generation before
            // half full and not yet durable until the next one: only the region
            // of the current generation says when that is due.
            half_full(&self.regions[region_index(generation)])
        } else {
            self.regions.iter().any(half_full)
        };
        if tight {
            self.shared.checkpoint(true)?;
        } else if soon {
            // Half full of entries not yet durable: checkpoint soon (a
            // region that is all durable starts over at its next generation).
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Starts a batch: takes the shared generation lock and returns the
    /// generation its entries carry. [`Journal::end_batch`] releases it once
    /// the batch's objects are in place.
    pub(crate) fn begin_batch(&mut self) -> io::Result<u64> {
        flock(&self.generation_shared, libc::LOCK_SH)?;
        match read_u64(&self.generation_shared, 0) {
            Ok(generation) => {
                self.shared_lock_held = true;
                let generation = generation.unwrap_or(1).max(1);
                self.shared
                    .generation_seen
                    .fetch_max(generation, Ordering::SeqCst);
                Ok(generation)
            }
            Err(e) => {
                let _ = flock(&self.generation_shared, libc::LOCK_UN);
                Err(e)
            }
        }
    }

    /// The gate a batch alone on the folder holds instead of the shared
    /// generation lock ([`Journal::begin_solo_batch`]).
    pub(crate) fn gate(&self) -> Arc<Mutex<()>> {
        Arc::clone(&self.shared.gate)
    }

    /// [`Journal::begin_batch`] for a batch alone on the folder: no other
    /// process is there (ADR 0034), and none can come before the batch ends
    /// (a newcomer waits at the knock until the batch in progress is done).
    /// Only this process's checkpoints bump the generation then, so the batch
    /// holds [`Journal::gate`] (`_gate`, locked by the caller for the
    /// batch) instead of the `flock` (ADR 0035): two system calls fewer.
    pub(crate) fn begin_solo_batch(&mut self, _gate: &MutexGuard<'_, ()>) -> io::Result<u64> {
        let generation = read_u64(&self.generation_shared, 0)?.unwrap_or(1).max(1);
        self.shared
            .generation_seen
            .fetch_max(generation, Ordering::SeqCst);
        Ok(generation)
    }

    pub(crate) fn end_batch(&mut self) -> io::Result<()> {
        if !std::mem::take(&mut self.shared_lock_held) {
            return Ok(());
        }
        flock(&self.generation_shared, libc::LOCK_UN)
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
        generation: u64,
        order: u64,
        entries: &[Entry<'_>],
        before_flush: impl FnOnce(),
    ) -> io::Result<()> {
        self.append_with(generation, order, entries, true, before_flush)
    }

    /// [`Journal::append`], flushed only when `flush`: entries that need
    /// not be durable (the deletes of young objects that need not survive a
    /// power cut) reach the disk with the next flush, and a recovery on the
    /// same boot reads them from the page cache.
    pub(crate) fn append_with(
        &mut self,
        generation: u64,
        order: u64,
        entries: &[Entry<'_>],
        flush: bool,
        before_flush: impl FnOnce(),
    ) -> io::Result<()> {
        if entries.is_empty() {
            before_flush();
            return Ok(());
        }
        let written = self.write_entries(generation, order, entries);
        before_flush();
        let (index, end) = written?;
        if flush {
            self.file.sync_data()?;
        }
        self.wrote(index, end, generation);
        Ok(())
    }

    /// Notes entries of `generation` written to region `index` up to `end`.
    fn wrote(&mut self, index: usize, end: u64, generation: u64) {
        let region = &mut self.regions[index];
        region.offset = end;
        region.generation = region.generation.max(generation);
        self.shared
            .journaled
            .fetch_max(generation, Ordering::SeqCst);
    }

    /// Encodes one entry into the batch's buffer and notes where it sits
    /// in the buffer.
    fn encode_entry(&mut self, generation: u64, order: u64, entry: &Entry<'_>) {
        let start = self.buffer.len();
        encode(&mut self.buffer, generation, order, entry);
        // Offsets within the batch for now; `write_buffer` places them.
        self.appended.push(EntryAt {
            offset: start as u64,
            len: u32::try_from(self.buffer.len() - start).expect("entries are bounded"),
        });
    }

    /// Writes the entries (not yet flushed) to the region of `generation`:
    /// returns the region and where its entries now end.
    fn write_entries(
        &mut self,
        generation: u64,
        order: u64,
        entries: &[Entry<'_>],
    ) -> io::Result<(usize, u64)> {
        self.buffer.clear();
        self.appended.clear();
        for entry in entries {
            self.encode_entry(generation, order, entry);
        }
        self.write_buffer(generation)
    }

    /// Writes the encoded batch (not yet flushed) to the region of
    /// `generation`: returns the region and where its entries now end.
    fn write_buffer(&mut self, generation: u64) -> io::Result<(usize, u64)> {
        let index = region_index(generation);
        let durable = self.shared.durable_seen.load(Ordering::SeqCst);
        let region = &mut self.regions[index];
        if region.reusable(generation, durable) {
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
    /// room (ADR 0034) must not raise the durable generation past young entries
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

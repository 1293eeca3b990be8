//! Checkpoints (ADR 0025, 0034): a checkpoint moves the generation on once
//! every batch of the old one is in place, puts the young objects of the
//! generations it passed in place, syncs the file system, and raises the
//! durable generation; while the journal holds young objects, a periodic
//! one lags a generation behind. The checkpointer thread runs one every
//! interval; [`Checkpoints`] runs them from other threads.
//!
//! It never appends an entry and never recovers a journal: the dead
//! journals it removes are those recovery left to this process.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::files::{remove_dead_journal, remove_orphan_pads, remove_young_marker};
use super::format::raise_durable;
use crate::folder::locks::flock;
use crate::folder::sys::{read_u64, syncfs};

/// What the committer and the checkpointer thread share.
pub(super) struct Shared {
    pub(super) root_dir: File,
    /// A descriptor of `.wal/epoch` for the exclusive lock of checkpoints
    /// (the committer's shared locks use another one: `flock` locks belong to
    /// open file descriptions).
    pub(super) generation_exclusive: Mutex<File>,
    /// Held by a batch of this process while it is alone on the folder,
    /// instead of the shared `flock` on `.wal/epoch` (ADR 0035), and by a
    /// checkpoint around its bump: with no other process on the folder, the
    /// only bump such a batch must not straddle is this process's own.
    pub(super) gate: Arc<Mutex<()>>,
    pub(super) durable: File,
    /// The highest generation this process journaled (0: none).
    pub(super) journaled: AtomicU64,
    /// The highest durable generation this process knows of.
    pub(super) durable_seen: AtomicU64,
    /// Journals of gone processes (same boot) whose entries the next
    /// checkpoint makes durable in place; locked by this process, removed
    /// after that checkpoint.
    pub(super) pending: Mutex<Vec<(PathBuf, File)>>,
    /// Puts young objects (ADR 0034) of generations up to the one given in
    /// place; each checkpoint calls it before its `syncfs`.
    pub(super) placer: Mutex<Option<Placer>>,
    /// Whether the journal is marked as holding young entries (the process is
    /// alone on the folder): then a periodic checkpoint lags by one generation
    /// (see [`Shared::checkpoint`]).
    pub(super) young: AtomicBool,
    /// The newest generation this process has seen (its batches', its bumps').
    pub(super) generation_seen: AtomicU64,
    pub(super) stop: Mutex<bool>,
    pub(super) wake: Condvar,
}

/// See [`Journal::set_placer`].
///
/// [`Journal::set_placer`]: super::Journal::set_placer
pub(crate) type Placer = Arc<dyn Fn(u64) -> io::Result<()> + Send + Sync>;

impl Shared {
    /// A checkpoint. `full`: every journaled entry so far is durable in place
    /// when it returns (see the journal's module docs). Otherwise, while the
    /// journal holds young objects, it lags one generation behind (ADR 0034,
    /// amended): it puts in place and makes durable the generation before the
    /// current one, then bumps the generation. A young object then becomes a
    /// file only if it outlives a whole generation, not merely the checkpoint
    /// that ends its own: most of a busy actor's records and snapshots die
    /// within a second.
    pub(super) fn checkpoint(&self, full: bool) -> io::Result<()> {
        if !full && self.young.load(Ordering::SeqCst) && self.pending.lock().is_empty() {
            return self.checkpoint_lagging();
        }
        // Every batch of the generation bumped past is done (they hold the
        // shared lock or the gate): its young objects go in place before the
        // sync that makes them durable.
        let generation = self.bump()?;
        self.make_durable(generation)
    }

    /// The lagging checkpoint of a process alone on the folder: the generation
    /// before the current one goes in place and is made durable, then the
    /// generation is bumped. In that order, the region the new generation
    /// writes to (the one of the generation made durable here) can start over
    /// at its first batch, as after a full checkpoint.
    fn checkpoint_lagging(&self) -> io::Result<()> {
        let current = read_u64(&self.generation_exclusive.lock(), 0)?
            .unwrap_or(1)
            .max(1);
        // The bump to `current` waited for every batch of the generation
        // before, so all its objects are in the young index or in place.
        self.make_durable(current - 1)?;
        self.bump().map(drop)
    }

    /// Moves the generation on by one, once every batch of the current one is
    /// done (a batch holds the gate or the shared lock); returns the generation
    /// moved past.
    fn bump(&self) -> io::Result<u64> {
        let gate = self.gate.lock();
        let generation_file = self.generation_exclusive.lock();
        flock(&generation_file, libc::LOCK_EX)?;
        let bumped = (|| {
            let generation = read_u64(&generation_file, 0)?.unwrap_or(1).max(1);
            generation_file.write_all_at(&(generation + 1).to_le_bytes(), 0)?;
            Ok::<_, io::Error>(generation)
        })();
        let unlocked = flock(&generation_file, libc::LOCK_UN);
        let generation = bumped?;
        unlocked?;
        drop(generation_file);
        drop(gate);
        self.generation_seen
            .fetch_max(generation + 1, Ordering::SeqCst);
        Ok(generation)
    }

    /// Puts the young objects of generations up to `generation` in place, syncs
    /// the file system and raises the durable generation to `generation`; then
    /// removes the dead journals taken over at open (only a full checkpoint has
    /// any).
    fn make_durable(&self, generation: u64) -> io::Result<()> {
        let placer = self.placer.lock().clone();
        if let Some(place) = placer {
            place(generation)?;
        }
        syncfs(&self.root_dir)?;
        raise_durable(&self.durable, generation)?;
        self.durable_seen.fetch_max(generation, Ordering::SeqCst);
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

    pub(super) fn dirty(&self) -> bool {
        self.journaled.load(Ordering::SeqCst) > self.durable_seen.load(Ordering::SeqCst)
            || !self.pending.lock().is_empty()
    }
}

/// Runs checkpoints of a journal from another thread (see
/// [`Journal::checkpoints`]).
///
/// [`Journal::checkpoints`]: super::Journal::checkpoints
#[derive(Clone)]
pub(crate) struct Checkpoints {
    pub(super) shared: Arc<Shared>,
    pub(super) journal: PathBuf,
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

pub(super) fn checkpoint_loop(shared: &Shared, interval: Duration) {
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

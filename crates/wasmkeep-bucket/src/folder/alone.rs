//! This process's place on the folder, wired to its journal (ADR 0034,
//! 0040): at open it takes `.wal/solo` (or keeps the lock taken with a gone
//! solo process's young objects), indexes the young objects, and while
//! alone watches for knocks; a knock makes it leave solo mode for good.
//!
//! It decides whether batches may leave objects young; it never writes an
//! object or a journal entry itself (the committer and the checkpoints do).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::journal::{Checkpoints, Journal};
use super::layout::JOURNAL_DIR;
use super::solo::{Mode, SoloLock, Watcher};
use super::young::Young;

/// How long an opener waits for a process alone on the folder to put its
/// young objects in place and make room (ADR 0034).
pub const SOLO_WAIT_MAX: Duration = Duration::from_secs(60);
/// Tries of the checkpoint that leaves solo mode before it gives up (the
/// knocking process then times out; the objects go in place at the next
/// checkpoint that succeeds).
const LEAVE_SOLO_ATTEMPTS_MAX: usize = 50;

/// This process's place on the folder (ADR 0034): alone, young objects stay
/// in its journal until a checkpoint; another process's knock ends that.
pub(super) struct Solo {
    pub(super) young: Arc<Young>,
    /// Whether batches may leave objects young. The committer holds it for
    /// each batch; leaving solo mode turns it false for good.
    pub(super) alone: Arc<parking_lot::Mutex<bool>>,
    /// `alone` for readers that must not wait for a batch.
    pub(super) alone_hint: Arc<AtomicBool>,
    /// The lock on `.wal/solo`, held until the committer stops.
    _solo_lock: Arc<parking_lot::Mutex<SoloLock>>,
    /// Watches for knocks while alone; dropped (its thread joined) before
    /// the journal's last checkpoint.
    pub(super) watcher: Option<Watcher>,
}

impl Solo {
    pub(super) fn start(
        root: &Arc<PathBuf>,
        journal: &mut Journal,
        wait_max: Duration,
        never: bool,
        deaf: bool,
    ) -> io::Result<Solo> {
        let wal = root.join(JOURNAL_DIR);
        // Young objects of a gone solo process adopted at open come with
        // the lock, taken then (ADR 0040).
        let (solo_lock, adopted) = match journal.take_adoption() {
            Some(adoption) => (adoption.solo_lock, adoption.objects),
            None => (
                SoloLock::take(&wal, wait_max, &|| Ok(never || journal.others_present()?))?,
                Vec::new(),
            ),
        };
        let young = Arc::new(Young::new(Arc::clone(root), journal.reader()?));
        // In the index before any checkpoint or knock could look, and before
        // the first read.
        young.adopt(adopted);
        {
            let young = Arc::clone(&young);
            journal.set_placer(Arc::new(move |generation| {
                young.place_through(generation).map(drop)
            }));
        }
        let alone = solo_lock.mode() == Mode::Solo;
        if alone {
            journal.mark_young()?;
            tracing::info!(
                folder = %root.display(),
                "folder bucket: alone on this folder; new objects stay in the journal until a checkpoint (ADR 0034)"
            );
        }
        let alone_hint = Arc::new(AtomicBool::new(alone));
        let alone = Arc::new(parking_lot::Mutex::new(alone));
        let solo_lock = Arc::new(parking_lot::Mutex::new(solo_lock));
        let watcher = if *alone.lock() && !deaf {
            let checkpoints = journal.checkpoints();
            let (alone, hint, solo_lock) = (
                Arc::clone(&alone),
                Arc::clone(&alone_hint),
                Arc::clone(&solo_lock),
            );
            Some(Watcher::start(&wal, move || {
                hint.store(false, Ordering::Relaxed);
                leave_solo(&alone, &solo_lock, &checkpoints);
            })?)
        } else {
            None
        };
        Ok(Solo {
            young,
            alone,
            alone_hint,
            _solo_lock: solo_lock,
            watcher,
        })
    }
}

/// Another process knocked: no more young objects; a checkpoint puts those
/// there are in place; then the lock on `.wal/solo` becomes a shared one.
fn leave_solo(
    alone: &parking_lot::Mutex<bool>,
    solo_lock: &parking_lot::Mutex<SoloLock>,
    checkpoints: &Checkpoints,
) {
    // Waits for the batch in progress: every later one makes files.
    *alone.lock() = false;
    for _ in 0..LEAVE_SOLO_ATTEMPTS_MAX {
        match checkpoints.run().and_then(|()| checkpoints.unmark_young()) {
            Ok(()) => {
                match solo_lock.lock().share() {
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

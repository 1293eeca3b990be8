//! What the committer holds between batches, and how a batch begins: the
//! writes sent to it, the stripes' lock files and the orders they count
//! (alone on the folder, a block of orders reserved ahead instead, ADR
//! 0035), the journal generation a batch carries, and the close after the
//! last batch.
//!
//! It never plans, writes or renames an object (`plan`, `files` and
//! `batch` do).

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::folder::alone::Solo;
use crate::folder::journal::Journal;
use crate::folder::layout::{LOCKS_DIR, TEMP_DIR};
use crate::folder::locks::{LOCK_STRIPES, flock};
use crate::folder::names::Names;
use crate::folder::pools::{Adopted, InodePool, TEMP_LOCK_SUFFIX};
use crate::folder::sync::{SyncMode, SyncPool};
use crate::folder::sys::{open_counter_file, read_u64};
use crate::{Etag, ObjectMeta, Result};

pub(crate) enum WriteOp {
    Put(Bytes),
    PutIfAbsent(Bytes),
    PutIfMatch(Bytes, Etag),
    Delete,
    /// A delete that need not survive a crash: the folder is not synced.
    DeleteNotDurable,
    DeleteIfMatch(Etag),
}

pub(crate) struct WriteRequest {
    pub(crate) key: String,
    pub(crate) op: WriteOp,
    /// The caller is in no hurry ([`Hints::put_if_absent_unhurried`],
    /// [`Hints::delete_all_not_durable`]).
    ///
    /// [`Hints::put_if_absent_unhurried`]: crate::Hints::put_if_absent_unhurried
    /// [`Hints::delete_all_not_durable`]: crate::Hints::delete_all_not_durable
    pub(crate) unhurried: bool,
    pub(crate) reply: oneshot::Sender<Result<Option<ObjectMeta>>>,
}

/// Where the committer sends its answer to one write.
pub(crate) type Answer = oneshot::Receiver<Result<Option<ObjectMeta>>>;

/// The committer thread's state.
pub(crate) struct Committer {
    pub(crate) root: Arc<PathBuf>,
    pub(crate) root_dir: File,
    pub(crate) locks: Vec<Option<File>>,
    pub(crate) sync_mode: SyncMode,
    pub(crate) temp_prefix: String,
    /// `.tmp/<temp_prefix>.lock`, locked while the committer runs.
    pub(crate) temp_lock: File,
    /// The lock files of gone processes whose temporary files joined the
    /// pool at open: held, so those files stay this process's own.
    pub(crate) adopted_locks: Vec<File>,
    /// The files of gone processes, from the thread that looks at them at
    /// open; taken in at the first batch after they arrive.
    pub(crate) adoption: Option<std::sync::mpsc::Receiver<Adopted>>,
    /// Journal mode: this process's place on the folder (ADR 0034).
    pub(crate) solo: Option<Solo>,
    /// Orders reserved for batches alone on the folder, not used yet
    /// ([`Committer::reserve_solo_orders`]).
    pub(crate) solo_orders: std::ops::RangeInclusive<u64>,
    /// Alone on the folder: the names its folders may hold (ADR 0036).
    pub(crate) names: Names,
    pub(crate) temp_counter: u64,
    pub(crate) sync_pool: SyncPool,
    pub(crate) journal: Option<Journal>,
    pub(crate) pool: InodePool,
}

impl Committer {
    /// After the last batch: the journal's last checkpoint, and the
    /// temporary files left for the next process.
    pub(super) fn close(&mut self) {
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

    pub(super) fn lock_file(&mut self, stripe: usize) -> io::Result<&File> {
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
    pub(super) fn take_adopted(&mut self) {
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

    /// Alone on the folder at start: reserves the first block of orders now,
    /// while the process is still starting, so that its first write (a
    /// node's first lease write, which its first answer waits for) does not
    /// wait for it. On failure the first batch alone tries again.
    pub(super) fn reserve_at_start(&mut self) {
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
    /// such batches, and the generation under the journal's in-process gate.
    pub(super) fn begin_solo_batch(
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
        let generation = journal.begin_solo_batch(gate)?;
        Ok(JournalPosition { generation, order })
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

    /// Takes the shared generation lock and the batch's order (one more than
    /// the highest counter of its stripes, which all move to it). The
    /// generation lock is released again on error.
    pub(super) fn begin_journal_batch(&mut self, stripes: &[usize]) -> io::Result<JournalPosition> {
        let journal = self.journal.as_mut().expect("journal mode");
        let generation = journal.begin_batch()?;
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
            Ok(order) => Ok(JournalPosition { generation, order }),
            Err(e) => {
                let journal = self.journal.as_mut().expect("journal mode");
                let _ = journal.end_batch();
                Err(e)
            }
        }
    }

    pub(super) fn unlock(&mut self, stripes: &[usize]) {
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
}

/// Batch orders reserved at a time for batches alone on the folder: at
/// 10,000 batches a second, one reservation (a lock, a read and a write of
/// each stripe's counter) every ~2 minutes.
const SOLO_ORDERS: u64 = 1 << 20;

/// No orders reserved (an empty range).
pub(crate) fn empty_orders() -> std::ops::RangeInclusive<u64> {
    let mut orders = 1..=1;
    orders.next();
    orders
}

/// Where a journal batch stands: its generation and its order.
#[derive(Debug, Clone, Copy)]
pub(super) struct JournalPosition {
    pub(super) generation: u64,
    pub(super) order: u64,
}

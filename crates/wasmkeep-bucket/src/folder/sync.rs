//! How the committer makes files durable in place ([`SyncMode`]), and the
//! threads that sync many paths at once for it.
//!
//! It syncs the paths it is given; it never chooses them, and never sees
//! the journal.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::sys::sync_path;

/// How the committer makes a batch durable. Every process sharing a folder
/// must use the same mode (`wasmkeep` always uses the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Append the batch to this process's write-ahead journal with one
    /// `fdatasync`, then rename the objects into place unsynced; a
    /// checkpoint (`syncfs`, every [`CHECKPOINT_INTERVAL`](crate::CHECKPOINT_INTERVAL)) makes them
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

/// Most threads used to sync one batch's files in [`SyncMode::PerFile`].
pub const SYNC_THREADS_MAX: usize = 32;

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
pub(super) struct SyncPool {
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
    pub(super) fn new(threads_max: usize) -> Self {
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
    pub(super) fn sync_all(&self, paths: &[&Path], data_only: bool) -> io::Result<()> {
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
    use std::fs;
    use std::time::{Duration, Instant};

    use super::*;

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
}

//! The committer's thread and its loop: it takes the queued writes batch by
//! batch (polling for the next one while they come in quick succession,
//! ADR 0032, and holding a batch of unhurried writes back for a write in a
//! hurry, ADR 0041), commits each, and closes the journal once every sender
//! is gone. Dropping the bucket waits for the thread, up to
//! [`CLOSE_WAIT_MAX`].
//!
//! What a batch does is in the files below it: `batch` (one batch, step by
//! step), `plan` (each write's plan), `files` (temporary files, renames,
//! syncs) and `state` (what the committer holds between batches). This
//! file never touches the disk itself.

mod batch;
mod files;
mod plan;
mod state;

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

pub(crate) use state::{Answer, Committer, WriteOp, WriteRequest, empty_orders};

use super::polling::Polling;

/// Most writes the committer takes into one batch.
pub const COMMIT_BATCH_WRITES_MAX: usize = 256;

/// Longest a dropped bucket waits for its committer's last checkpoint.
pub const CLOSE_WAIT_MAX: Duration = Duration::from_secs(10);

/// How long the committer polls for its next write before it sleeps, while
/// writes come that soon (ADR 0032).
pub const ARRIVAL_POLL_MAX: Duration = Duration::from_micros(150);

/// How long a batch of unhurried writes waits for a write in a hurry to
/// share its flush with, while writes come in quick succession (ADR 0041).
pub const UNHURRIED_WAIT_MAX: Duration = Duration::from_micros(300);

/// The committer thread, waited for when the bucket is dropped (at most
/// [`CLOSE_WAIT_MAX`]).
pub(super) struct CommitterThread {
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
    pub(super) fn spawn(
        wait_max: Duration,
        run: impl FnOnce() + Send + 'static,
    ) -> io::Result<Self> {
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
pub(super) fn run_committer(
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use bytes::Bytes;
    use tokio::sync::oneshot;

    use super::*;

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
}

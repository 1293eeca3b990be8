//! Whether a writer polls for its answer instead of sleeping (ADR 0032):
//! what the writers and the committer's thread share to decide it.
//!
//! It counts writes in flight and waits for answers; it never queues or
//! commits a write.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a lone writer polls for its answer before it sleeps, while the
/// committer polls too (ADR 0032): about two flushes of a fast disk.
pub const ANSWER_POLL_MAX: Duration = Duration::from_micros(300);

/// What the writers and the committer share to decide whether a writer
/// polls for its answer instead of sleeping (ADR 0032). A writer polls only
/// when its write is the only one in flight and the committer polls for its
/// writes (they come in quick succession): one writer waiting on its
/// flush, with nothing else for the runtime to do. With more writes in
/// flight, or writes far apart, polling would take time from other work
/// (measured: 15 % of S1 c=16, 8 % of S3).
#[derive(Debug, Default)]
pub(super) struct Polling {
    /// Writes sent to the committer and not yet answered.
    pub(super) in_flight: AtomicUsize,
    /// The committer polls for its next write (`Arrivals::polls` in
    /// `committer/mod.rs`).
    pub(super) quick: AtomicBool,
    /// A writer is polling for its answer (one at a time).
    writer_polls: AtomicBool,
    /// Writes committed on their writer's thread (ADR 0045).
    pub(super) led: AtomicU64,
}

/// Counts a write as in flight until dropped.
pub(super) struct InFlight<'a>(&'a AtomicUsize);

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
    pub(super) fn write_sent(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(&self.in_flight)
    }

    /// The committer's answer to a write: polled for up to
    /// [`ANSWER_POLL_MAX`] (yielding to the runtime's other tasks and its
    /// I/O between polls) when the write is alone and writes come quickly,
    /// then awaited.
    pub(super) async fn answer<T>(
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

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
}

//! What each accepted client connection carries (ADR 0050): one of the
//! node's connection slots, given back when the connection (or the
//! WebSocket it became) ends, and a bound on its writes: a client that
//! stops reading its responses or WebSocket messages is closed instead of
//! holding its connection for ever.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::ops::metrics::Metrics;

/// The node's open client connections, counted against a limit (the count
/// is the metrics' gauge `wasmkeep_connections_open`).
#[derive(Debug)]
pub(crate) struct Slots {
    metrics: Arc<Metrics>,
    max: usize,
}

/// One taken slot; dropping it gives it back.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Metrics>);

impl Slots {
    pub(crate) fn new(metrics: Arc<Metrics>, max: usize) -> Self {
        Self { metrics, max }
    }

    /// A slot, unless `max` connections are open.
    pub(crate) fn take(&self) -> Option<Slot> {
        let max = i64::try_from(self.max).unwrap_or(i64::MAX);
        self.metrics
            .connections_open
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(&self.metrics)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0
            .connections_open
            .inner()
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted client stream: `inner` holding `slot` for as long as it
/// lives, with every write that cannot proceed for `limit` failed with
/// `TimedOut`. The timer starts at the first write that has to wait and is
/// dropped at the next one that proceeds, so a connection that keeps
/// writing pays nothing but a branch.
pub(crate) struct ClientStream<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    _slot: Option<Slot>,
}

impl<S> ClientStream<S> {
    pub(crate) fn new(inner: S, limit: Duration, slot: Option<Slot>) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
            _slot: slot,
        }
    }

    /// After a write that returned `Pending`: `Pending` until `limit` has
    /// passed since the first such write, then the error.
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            ))),
        }
    }

    /// What a write poll returned, with the stall timer kept or dropped.
    fn settle<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.poll_stall(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ClientStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ClientStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.settle(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.settle(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.settle(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.settle(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn slots_run_out_at_the_limit_and_come_back_when_dropped() {
        let metrics = Arc::new(Metrics::default());
        let slots = Slots::new(Arc::clone(&metrics), 2);
        let first = slots.take().expect("one of two");
        let second = slots.take().expect("two of two");
        assert!(slots.take().is_none(), "a third over the limit");
        assert_eq!(metrics.connections_open.get(), 2);
        drop(first);
        let third = slots.take().expect("the first came back");
        drop((second, third));
        assert_eq!(metrics.connections_open.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_cannot_proceed_fails_after_the_limit_and_progress_resets_it() {
        // A pipe with room for 4 bytes and nobody reading the other end.
        let (near, mut far) = tokio::io::duplex(4);
        let mut stalling = ClientStream::new(near, Duration::from_secs(5), None);
        stalling.write_all(b"abcd").await.expect("room for 4 bytes");
        // Reading 2 bytes after 4 s is progress: the next write waits again
        // from then on.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let mut two = [0u8; 2];
            tokio::io::AsyncReadExt::read_exact(&mut far, &mut two)
                .await
                .expect("read");
            far
        });
        let started = tokio::time::Instant::now();
        stalling.write_all(b"ef").await.expect("written once read");
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        let _far = reader.await.expect("reader");
        let error = stalling.write_all(b"g").await.expect_err("nobody reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(9));
    }
}

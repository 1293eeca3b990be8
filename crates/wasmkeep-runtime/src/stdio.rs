//! The guest's stdout and stderr: each complete line becomes a `tracing` event
//! with target `guest` and the actor's id (stdout at INFO, stderr at WARN).
//! The last few stderr lines of an event are kept so a trap's message can
//! carry the guest's panic message.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// A longer line is cut and logged in pieces of this size.
const LINE_BYTES_MAX: usize = 4096;
/// How many stderr lines of the current event are kept for a trap's message.
const TAIL_LINES_MAX: usize = 4;
/// The write permit handed to the guest (bytes per `write`).
const WRITE_PERMIT_BYTES: usize = 64 * 1024;

/// The last lines the guest wrote to stderr during the current event.
#[derive(Clone, Default)]
pub(crate) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    pub(crate) fn clear(&self) {
        self.0.lock().clear();
    }

    /// The kept lines, joined, or `None` when the guest wrote nothing.
    pub(crate) fn text(&self) -> Option<String> {
        let lines = self.0.lock();
        (!lines.is_empty()).then(|| lines.iter().cloned().collect::<Vec<_>>().join(" | "))
    }

    fn push(&self, line: String) {
        let mut lines = self.0.lock();
        if lines.len() == TAIL_LINES_MAX {
            lines.pop_front();
        }
        lines.push_back(line);
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// One of the guest's output streams; every clone writes to the same lines.
#[derive(Clone)]
pub(crate) struct GuestOutput(Arc<Mutex<Lines>>);

struct Lines {
    actor: Arc<str>,
    stream: Stream,
    partial: Vec<u8>,
    tail: StderrTail,
}

impl GuestOutput {
    pub(crate) fn new(actor: Arc<str>, stream: Stream, tail: StderrTail) -> Self {
        Self(Arc::new(Mutex::new(Lines {
            actor,
            stream,
            partial: Vec::new(),
            tail,
        })))
    }

    fn write_bytes(&self, bytes: &[u8]) {
        let mut lines = self.0.lock();
        for &byte in bytes {
            if byte == b'\n' {
                lines.emit();
            } else {
                lines.partial.push(byte);
                if lines.partial.len() >= LINE_BYTES_MAX {
                    lines.emit();
                }
            }
        }
    }
}

impl Lines {
    fn emit(&mut self) {
        let line = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        match self.stream {
            Stream::Stdout => {
                tracing::info!(target: "guest", actor = %self.actor, stream = "stdout", "{line}")
            }
            Stream::Stderr => {
                tracing::warn!(target: "guest", actor = %self.actor, stream = "stderr", "{line}");
                self.tail.push(line);
            }
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT_BYTES)
    }
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

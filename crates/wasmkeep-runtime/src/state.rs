//! The data of one instance's `Store`: the node's host, WASI's context and
//! resource table, the limits, and the deadline of the event in progress.

use std::time::{Duration, Instant};

use wasmkeep_types::ActorId;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::host::ActorHost;
use crate::outbound::OutboundHooks;
use crate::stdio::StderrTail;

pub(crate) struct State {
    pub(crate) host: Box<dyn ActorHost>,
    pub(crate) id: ActorId,
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) http: WasiHttpCtx,
    /// Sends the guest's outbound HTTP requests (`wasi:http`).
    pub(crate) outbound: OutboundHooks,
    pub(crate) limits: Limits,
    /// When the event in progress must have finished; checked at each epoch tick.
    pub(crate) event_deadline: Instant,
    /// The last lines the guest wrote to stderr in this event (a panic message).
    pub(crate) stderr_tail: StderrTail,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

/// Longest part of an event's remaining time kept back from a call to
/// another actor or an outbound request, for the guest to handle its
/// failure and answer.
const ANSWER_MARGIN_MAX: Duration = Duration::from_secs(1);

/// How long a call or an outbound request made now may wait: what the
/// event has left, less a tenth of it (at most a second) kept for the
/// guest to answer.
pub(crate) fn wait_before_answer(event_deadline: Instant) -> Duration {
    let left = event_deadline.saturating_duration_since(Instant::now());
    left.saturating_sub((left / 10).min(ANSWER_MARGIN_MAX))
}

/// Per-store limits. Growing beyond them traps with [`MemoryLimitExceeded`]
/// (rather than letting `memory.grow` return -1) so the event fails with an
/// error that says why, not with the guest's own out-of-memory abort.
pub(crate) struct Limits {
    pub(crate) memory_bytes_max: usize,
    pub(crate) table_elements_max: usize,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes_max {
            return Err(wasmtime::Error::new(MemoryLimitExceeded(format!(
                "a linear memory of {current} bytes tried to grow to {desired} bytes; \
                 the limit is {} bytes",
                self.memory_bytes_max
            ))));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements_max {
            return Err(wasmtime::Error::new(MemoryLimitExceeded(format!(
                "a table of {current} elements tried to grow to {desired} elements; \
                 the limit is {} elements",
                self.table_elements_max
            ))));
        }
        Ok(true)
    }
}

/// Raised from the limiter; found again by downcasting the trap's error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct MemoryLimitExceeded(pub(crate) String);

/// Raised from the epoch callback when the event's deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the event ran past its time limit")]
pub(crate) struct TimeLimitExceeded;

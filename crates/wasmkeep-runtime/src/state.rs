//! The data of one instance's `Store`: the node's host, WASI's context and
//! resource table, the limits, and the deadline of the event in progress.

use std::time::Instant;

use wasmkeep_types::ActorId;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::host::ActorHost;
use crate::stdio::StderrTail;

pub(crate) struct State {
    pub(crate) host: Box<dyn ActorHost>,
    pub(crate) id: ActorId,
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
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

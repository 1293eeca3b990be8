//! The wasmtime embedding: components, instances, limits and the host side of
//! the `wasmkeep:actor` world.
//!
//! This is the only crate that names wasmtime. Its API speaks plain data
//! ([`Request`], [`Response`], [`SqlValue`]...) and one trait, [`ActorHost`],
//! which the node implements once per actor; the runtime knows nothing of
//! buckets, leases or HTTP.
//!
//! - [`Runtime`]: one wasmtime `Engine` per process (pooling allocator, epoch
//!   ticker, precompiled-component cache, the `Linker` with every host import).
//! - [`ClassComponent`]: one validated, compiled version of a class.
//! - [`ActorInstance`]: one live instance; its events run one at a time.
//!
//! Choices an integrator should know:
//!
//! - Time limit: `event_time_max` is wall-clock time per event (and per
//!   instantiation), host calls included. A ticker thread advances the epoch
//!   every 2 ms; at each tick a running guest yields to tokio and is stopped
//!   with [`EventError::TimeLimit`] once the deadline has passed. An event
//!   stuck in an `actors.call` that never returns is dropped 1 s later with
//!   the same error.
//! - Memory limit: `memory_bytes_max` applies to each linear memory (a guest
//!   normally has one); growing beyond it traps with
//!   [`EventError::MemoryLimit`]. A component whose *initial* memory exceeds it
//!   is refused at load.
//! - Pool: `instances_max` live instances (two memory and table slots each);
//!   a full pool makes instantiation fail with [`Error::Instantiate`].
//! - WASI p2 is linked whole, but with no preopened directory, environment,
//!   arguments or sockets: clocks, random and stdio are what works. Outbound
//!   HTTP is `wasi:http/outgoing-handler` (0.2), each request checked against
//!   the class's allow-list that the node gives through [`OutboundScope`]
//!   (ADR 0066). Guest
//!   stdout/stderr lines become `tracing` events (target `guest`, field
//!   `actor`), INFO and WARN; a trap's message ends with the guest's last
//!   stderr lines (a Rust panic message).
//! - Stacks: a guest runs on a fiber stack from the pool that its instance
//!   keeps; the `sql` imports call [`ActorHost`] on a stack of the worker
//!   thread instead ([`on_host_stack`]), so SQLite's deep frames do not stay
//!   resident in every loaded instance.
//! - Cache: `<cache_dir>/<sha256>-wasmtime<version>-<engine hash>.cwasm`,
//!   written (temp file + rename) only after the component passed validation.
//!
//! Architecture invariants: a guest's failure (trap, time limit, memory limit)
//! is an [`EventError`] for that one event and poisons only that instance; the
//! next event gets a fresh instance with the same host. Guest-visible errors
//! (`result` values of the WIT) never become traps, and host failures never
//! become guest-visible values unless the WIT says so.

mod bindings;
mod component;
mod error;
mod host;
mod host_stack;
mod imports;
mod instance;
mod outbound;
mod runtime;
mod state;
mod stdio;

pub use component::ClassComponent;
pub use error::{Error, EventError};
pub use host::{ActorHost, LogLevel, Message, Request, Response, SqlRows, SqlValue};
pub use host_stack::on_host_stack;
pub use instance::ActorInstance;
pub use outbound::{DenyAll, OutboundConfig, OutboundOutcome, OutboundScope};
pub use runtime::{Runtime, RuntimeConfig};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The node moves these between tasks and threads.
const _: () = {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    #[allow(dead_code, reason = "compile-time check only")]
    fn check() {
        send_sync::<Runtime>();
        send_sync::<ClassComponent>();
        send::<ActorInstance>();
    }
};

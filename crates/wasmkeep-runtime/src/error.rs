//! The crate's errors: [`Error`] for loading components and creating
//! instances, [`EventError`] for one event that a guest did not finish.

use std::path::PathBuf;

/// Loading a component or creating an instance failed. Each message names
/// what is wrong and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    #[error("could not create the wasmtime engine: {0}")]
    Engine(String),
    #[error("not a WebAssembly component: the bytes do not start with the `\\0asm` magic")]
    NotWasm,
    #[error(
        "not a WebAssembly component: this is a core WebAssembly module; build the actor for \
         wasm32-wasip2 (or wrap the module with `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("the component is not valid WebAssembly or could not be compiled: {0}")]
    Compile(String),
    #[error("the component does not implement world `wasmkeep:actor/actor@0.1.0`: {0}")]
    WrongWorld(String),
    #[error("the component imports something the host does not provide: {0}")]
    Imports(String),
    /// (The I/O error is in the message, not also the `source()`.)
    #[error("component cache {path}: {error}")]
    Cache {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("could not instantiate the component: {0}")]
    Instantiate(String),
}

/// An event the guest did not finish. The instance that failed is dropped;
/// the next event runs on a fresh instance of the same component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The guest trapped (a panic, `unreachable`, an out-of-bounds access...).
    #[error("the guest trapped: {0}")]
    Trap(String),
    /// The event ran longer than `RuntimeConfig::event_time_max`.
    #[error("the guest ran longer than the event time limit and was stopped")]
    TimeLimit,
    /// The guest tried to grow a memory or table beyond its limit.
    #[error("the guest exceeded its memory limit and was stopped: {0}")]
    MemoryLimit(String),
    /// A fresh instance could not be created for this event.
    #[error("the guest could not be instantiated: {0}")]
    Instantiate(String),
}

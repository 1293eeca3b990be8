//! Ids, names, bucket keys and record formats shared by every wasmkeep crate.
//!
//! This crate does no I/O. It owns the rules for what a valid name is, and it
//! is the only place where bucket keys are built (`keys`), so the layout of
//! DESIGN.md is written down exactly once.

pub mod heartbeat;
pub mod id;
pub mod keys;
pub mod outbound;
pub mod sql;

pub use id::{ActorId, AppName, ClassName, NodeId, TenantName};
pub use keys::Keys;

/// A name or id that does not follow the rules; the message says which rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("invalid {what}: {reason}")]
    InvalidRecord {
        what: &'static str,
        reason: &'static str,
    },
    #[error("key {key:?} does not parse: {reason}")]
    InvalidKey { key: String, reason: &'static str },
}

//! Cluster logic: node leases and heartbeats (ADR 0020), peers, ownership
//! records and holds, owner hints, signed node calls, and the fenced object
//! ([`Fenced`]) that every conditional write of them goes through.
//!
//! This is the only crate that decides who owns an actor. Time and
//! randomness reach it only through [`Clock`] and [`Random`], the bucket
//! through [`wasmkeep_bucket::Bucket`], so the simulation (`sim/`) runs this
//! code unchanged under a virtual clock, a seeded generator and a faulty
//! in-memory bucket.

pub mod clock;
pub mod fenced;
pub mod hints;
pub mod inspect;
pub mod lease;
pub mod ownership;
pub mod peers;
pub mod placement;
pub mod planted;
pub mod signing;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use clock::{Clock, OsRandom, Random, SeededRandom, SystemClock, TestClock};
pub use fenced::{Decision, Fenced, Haste, Outcome, Start, Updated, Versioned};
pub use lease::{LeaseObserver, NodeLease};
pub use ownership::{AcquireOutcome, LeaseReturn, Ownership, OwnershipRecord};
pub use peers::{Peer, Peers};
pub use signing::{SignedCall, Signer, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bucket(#[from] wasmkeep_bucket::Error),
    #[error(transparent)]
    Name(#[from] wasmkeep_types::Error),
    /// This node's lease is not valid: it must not acquire or serve actors.
    #[error("this node's lease is not valid")]
    LeaseInvalid,
    /// Another process writes this node's heartbeat: two nodes share a node id.
    #[error("another process writes the heartbeat of node {node}: node ids must be unique")]
    DuplicateNode { node: String },
    /// A starting process found its node id held by another process.
    #[error(
        "node id {node} is in use: {reason}; stop that process or give this one another --node-id"
    )]
    NodeIdInUse { node: String, reason: String },
    #[error("cluster key: {0}")]
    ClusterKey(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

//! This node among its peers: the heartbeat (the node lease), signed node
//! calls (forwarding, actor calls, alarm hand-offs, the take of a move),
//! the drain, moves and deletes of single actors, ownership records left
//! behind by a failed release, claiming the node id, and the transport of
//! node calls behind its trait. Decisions of ownership are the
//! `wasmkeep_cluster` crate's; this module carries them out.

pub(crate) mod control;
pub(crate) mod deletes;
pub mod drain;
pub mod forward;
mod handle;
pub mod heartbeat;
pub mod holder;
pub(crate) mod imports;
pub mod lease;
pub(crate) mod leftovers;
pub mod moves;
pub mod peer;
pub(crate) mod sql;

pub use handle::Peering;
pub(crate) use handle::PeeringPlatform;

//! The wasmkeep node: the HTTP front, `ensure_owner`, one mailbox per
//! resident actor, alarms, WebSockets, hibernation, and the `wasmkeep` binary's
//! commands (`dev`, `serve`, `deploy`).
//!
//! Code map, one folder per part of the node:
//! - [`node`]: the [`Node`], the handles of its parts; the resident actors
//!   (stubs), `ensure_owner`, eviction, start and graceful shutdown.
//! - [`front`]: the HTTP server, routes, connections, tenants, WebSockets
//!   and their relay to the holder.
//! - [`actor`]: mailboxes, the host side of the guest world, alarms,
//!   classes, the guest engine, the app's secrets. Never imports `peering`.
//! - [`peering`]: the heartbeat, signed node calls and forwarding, the
//!   drain, moves, deletes, leftovers, the node id claim, the peer transport.
//! - [`ops`]: the command line, admin, metrics, counters, descriptors.
//! - [`direct`]: operations on one actor for a test harness (run its alarm
//!   now, hibernate it, an operator's statement, a read of its database,
//!   a deploy loaded at once), through its mailbox; in the harness's
//!   process, or over `dev --test-routes` (`front::test_routes`).
//!
//! Invariants: an actor's events never overlap (only its mailbox task touches
//! its instance and store); a response or socket write leaves the node only
//! after the event's writes are durable; an actor is activated only after
//! its previous hand-over on this node released its ownership record.

pub mod actor;
pub mod config;
pub mod direct;
pub mod error;
pub mod front;
mod lifecycle;
pub mod node;
pub mod ops;
pub mod parts;
pub mod peering;
pub mod routing;
pub mod wait_cell;

pub use config::{Console, Limits, NodeConfig};
pub use direct::AlarmRun;
pub use error::{Error, Result};
pub use node::{Node, Owner, Platform};

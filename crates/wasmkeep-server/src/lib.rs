//! The wasmkeep node: the HTTP front, `ensure_owner`, one mailbox per
//! resident actor, alarms, WebSockets, hibernation, and the `wasmkeep` binary's
//! commands (`dev`, `serve`, `deploy`).
//!
//! Code map:
//! - [`http`]: hyper 1 server; routes ([`route`]), body limit, marker headers,
//!   JSON errors ([`error`]). WebSocket upgrades go to [`sockets`].
//! - [`node`]: the [`Node`]: resident actors (stubs), `ensure_owner`, LRU
//!   eviction, the class registry, the alarm sweep, graceful shutdown.
//! - `mailbox`: one task per resident actor: activation (ownership record
//!   through `wasmkeep_cluster::Ownership`,
//!   store, instance), events one at a time, responses released behind each
//!   event's output gate by a second task (group commit), hand-over.
//! - [`host`]: the runtime's `ActorHost` (SQL, alarm, sockets, calls, log).
//! - [`alarms`]: the node's one alarm timer.
//! - [`cluster`]: the heartbeat (node lease), self-fencing, signed node calls
//!   (forwarding, actor calls, alarm hand-offs); [`relay`]: WebSockets relayed
//!   to the node that holds the actor. Ownership records, leases, peers and
//!   hints are `wasmkeep_cluster`'s.
//! - [`drain`]: draining the node (ADR 0014): drain key, line 9, hand-over of every actor.
//! - [`moves`]: moving one actor (ADR 0017): move keys, the move job, the take call and job.
//! - [`classes`]: deploy and the class poll. [`metrics`], [`counting`]: Prometheus.
//! - [`guest`]: the guest runtime behind traits (wasmtime in production);
//!   [`peer`]: outgoing node calls behind a trait (HTTP in production).
//! - [`cli`]: the command line; [`descriptors`]: the open-file limit and the
//!   descriptor table, prepared at start.
//!
//! Invariants: an actor's events never overlap (only its mailbox task touches
//! its instance and store); a response or socket write leaves the node only
//! after the event's writes are durable; an actor is activated only after
//! its previous hand-over on this node released its ownership record.

pub mod admin;
pub mod alarms;
pub mod classes;
pub mod cli;
pub mod cluster;
pub mod config;
mod conn;
pub mod counting;
mod deletes;
pub mod descriptors;
pub mod drain;
pub mod error;
pub mod guest;
pub mod heap;
pub mod holder;
pub mod host;
pub mod http;
mod leftovers;
mod mailbox;
pub mod metrics;
pub mod moves;
pub mod node;
pub mod peer;
pub mod relay;
pub mod route;
pub mod secrets;
pub mod signal;
pub mod sockets;
pub mod tenants;

pub use config::{Limits, NodeConfig};
pub use error::{Error, Result};
pub use node::{Node, Owner, Platform};

//! The actors this node runs: one mailbox task per resident actor (its
//! activation, events one at a time, the output gate, hand-over), the host
//! side of the guest world, the alarm timer, the class registry, the guest
//! engine behind its trait and the app's secrets as guests see them.
//!
//! Never imports `peering`: moves and deletes reach a mailbox through the
//! job variants defined here (`mailbox::Job`), and routing decisions come
//! from the node.

pub mod alarms;
pub mod classes;
pub(crate) mod delivery;
pub(crate) mod erase;
pub mod guest;
pub mod host;
pub(crate) mod mailbox;
pub(crate) mod operator;
pub(crate) mod orders;
pub mod residents;
pub mod secrets;
pub mod socket_table;
pub(crate) mod upkeep;

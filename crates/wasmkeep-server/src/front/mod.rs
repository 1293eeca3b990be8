//! The front: what faces clients. The HTTP server and its connections, the
//! routes, tenant tokens, WebSocket upgrades and the relay of sockets to the
//! node that holds the actor. It asks the node where an actor lives and
//! hands events to mailboxes; it never writes to the bucket itself.

pub(crate) mod conn;
pub mod http;
pub mod relay;
pub mod route;
pub mod sockets;
pub mod tenants;

//! The front: what faces clients. The HTTP server and its connections, the
//! routes, tenant tokens, WebSocket upgrades and the relay of sockets to the
//! node that holds the actor. It asks the node where an actor lives and
//! hands events to mailboxes; it never writes to the bucket itself.

pub(crate) mod body;
pub(crate) mod conn;
pub mod http;
pub mod relay;
pub mod route;
pub mod sockets;
pub mod tenants;
pub mod test_routes;

use std::sync::atomic::{AtomicU64, Ordering};

/// What the front keeps between requests, a handle of the node.
pub struct Front {
    /// Tenant bearer tokens on client requests.
    pub tenants: tenants::TenantGate,
    /// The value of `x-wasmkeep-node` naming this node, built once (every
    /// response carries it); `None` if the id is no valid header value.
    pub node_header: Option<hyper::header::HeaderValue>,
    socket_ids: AtomicU64,
}

impl Front {
    pub(crate) fn new(config: &crate::NodeConfig) -> Self {
        Self {
            tenants: tenants::TenantGate::new(config.tenant_tokens),
            node_header: hyper::header::HeaderValue::from_str(config.node_id.as_str()).ok(),
            socket_ids: AtomicU64::new(1),
        }
    }

    /// A new WebSocket's id, unique on this node.
    pub(crate) fn next_socket_id(&self) -> u64 {
        self.socket_ids.fetch_add(1, Ordering::Relaxed)
    }
}

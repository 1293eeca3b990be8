//! HTTP between nodes: TLS configuration for the listener and for peer
//! calls (rustls), and [`PeerClient`], which sends signed node calls
//! (forwarded requests, alarm hand-offs, takes) to a peer's advertised URL.
//!
//! The cluster logic never names this crate: it sees peer calls through its
//! own traits, so the simulation can replace the network.

pub mod client;
pub mod outbound;
pub mod stream;
pub mod tls;

pub use client::{PeerCall, PeerClient};
pub use outbound::{OutboundClient, OutboundFailure};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("invalid peer URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// No connection to the peer (refused, unreachable, or none within
    /// [`client::PEER_CONNECT_TIME_MAX`]): the call was not sent.
    #[error("peer call to {url} could not connect: {reason}")]
    Connect { url: String, reason: String },
    /// The call failed once sent, or while sending: it may have arrived.
    #[error("peer call to {url} failed: {reason}")]
    Call { url: String, reason: String },
    #[error("peer call to {url} timed out after {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u128 },
    /// An actor's outbound request failed (ADR 0066).
    #[error("outbound request to {url}: {kind}")]
    Outbound { url: String, kind: OutboundFailure },
}

impl Error {
    /// Whether the call may have reached the peer (and run there): false
    /// only when it was never sent.
    pub fn may_have_arrived(&self) -> bool {
        matches!(self, Error::Call { .. } | Error::Timeout { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

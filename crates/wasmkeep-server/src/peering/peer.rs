//! Outgoing node calls as the node sees them: [`PeerTransport`] sends one
//! signed call to a peer's advertised URL and returns its status, headers
//! and body. Production sends it over HTTP(S) with
//! `wasmkeep_transport::PeerClient` ([`HttpTransport`]); the simulation
//! delivers it to the target node's [`crate::front::http::answer_call`] in process.
//! The incoming side is [`crate::front::http::answer_call`].

use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use wasmkeep_cluster::Signer;
use wasmkeep_transport::{PeerCall, PeerClient};

/// A peer's answer to a node call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl PeerReply {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a node call got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailed {
    pub reason: String,
    /// The call may have reached the peer, and run there: its answer, not
    /// its request, was lost, or its time ran out. `false` only for a call
    /// that was never sent (no connection).
    pub may_have_arrived: bool,
}

impl CallFailed {
    /// A call that never left this node.
    pub fn not_sent(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            may_have_arrived: false,
        }
    }

    /// A call that may have reached the peer, whose answer did not come.
    pub fn unanswered(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            may_have_arrived: true,
        }
    }
}

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Sends signed node calls.
#[async_trait::async_trait]
pub trait PeerTransport: Send + Sync + 'static {
    /// Signs `call` and sends it to the peer at `url`; reads at most
    /// `body_bytes_max` bytes of the answer. `Err` says why no answer came,
    /// and whether the call may have arrived (the peer is then suspect for
    /// a while).
    async fn send(
        &self,
        url: &str,
        call: PeerCall,
        body_bytes_max: usize,
    ) -> std::result::Result<PeerReply, CallFailed>;
}

/// Node calls over HTTP(S), signed with the cluster key.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: PeerClient,
}

impl HttpTransport {
    pub fn new(signer: Arc<Signer>, tls: Arc<rustls::ClientConfig>) -> Self {
        Self {
            client: PeerClient::new(signer, tls),
        }
    }
}

#[async_trait::async_trait]
impl PeerTransport for HttpTransport {
    async fn send(
        &self,
        url: &str,
        mut call: PeerCall,
        body_bytes_max: usize,
    ) -> std::result::Result<PeerReply, CallFailed> {
        // Every node call carries the span it is made in (traces on).
        crate::ops::telemetry::inject_current(&mut call.headers);
        let response = self.client.send(url, call).await.map_err(|e| CallFailed {
            reason: e.to_string(),
            may_have_arrived: e.may_have_arrived(),
        })?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                value
                    .to_str()
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let body = Limited::new(response.into_body(), body_bytes_max)
            .collect()
            .await
            .map_err(|e| CallFailed::unanswered(format!("reading the response failed: {e}")))?
            .to_bytes();
        // Takes the buffer over when it is the only reference (no copy of a
        // forwarded answer of up to `forward_response_bytes_max`).
        let body = Vec::from(body);
        Ok(PeerReply {
            status,
            headers,
            body,
        })
    }
}

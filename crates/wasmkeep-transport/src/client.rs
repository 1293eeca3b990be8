//! Signed calls to peers over HTTP or HTTPS, chosen by the peer's advertised
//! URL. Connections are pooled per peer; every call has a time limit.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;
use wasmkeep_cluster::Signer;

use crate::{Error, Result};

/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a TCP connect to a peer may take. Without it a peer behind a
/// silent partition (its packets dropped, nothing refused) held each call
/// for its whole time limit (a forward's 60 s), reported as "may have
/// arrived" although nothing left this node. A connect within a cluster
/// takes milliseconds; this covers a lost SYN and its first resend (Linux
/// resends after 1 s, then 2 s later). ADR 0074.
pub const PEER_CONNECT_TIME_MAX: Duration = Duration::from_secs(3);
/// Most idle connections kept per peer.
const POOL_IDLE_PER_PEER_MAX: usize = 64;

/// One node call.
#[derive(Debug, Clone)]
pub struct PeerCall {
    pub method: Method,
    /// The path, starting with `/`, without the query.
    pub path: String,
    /// The query string without `?` (may be empty).
    pub query: String,
    /// Ordinary headers passed along (no `x-wasmkeep-*`: those are dropped).
    pub headers: Vec<(String, String)>,
    /// Marker headers, covered by the signature.
    pub markers: Vec<(String, String)>,
    pub body: Bytes,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct PeerClient {
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    signer: Arc<Signer>,
}

impl PeerClient {
    pub fn new(signer: Arc<Signer>, tls: Arc<ClientConfig>) -> Self {
        let mut tcp = HttpConnector::new();
        // https URLs too: the TLS layer wraps this connector.
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(PEER_CONNECT_TIME_MAX));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_IDLE_PER_PEER_MAX)
            .build(connector);
        Self { http, signer }
    }

    /// Sends `call` to the peer whose advertised URL is `base_url`
    /// (`http://host:port` or `https://host:port`). The response body is
    /// streamed back to the caller.
    pub async fn send(&self, base_url: &str, call: PeerCall) -> Result<Response<Incoming>> {
        let base = base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::InvalidUrl {
                url: base_url.to_owned(),
                reason: "must start with http:// or https://".into(),
            });
        }
        let uri = if call.query.is_empty() {
            format!("{base}{}", call.path)
        } else {
            format!("{base}{}?{}", call.path, call.query)
        };
        let signed = self.signer.sign(
            call.method.as_str(),
            &call.path,
            &call.query,
            &call.markers,
            &call.body,
        );
        let mut request = Request::builder().method(call.method.clone()).uri(&uri);
        for (name, value) in &call.headers {
            if wasmkeep_cluster::signing::is_marker(name)
                || name.eq_ignore_ascii_case("host")
                || name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
                || name.eq_ignore_ascii_case("connection")
            {
                continue;
            }
            request = request.header(name.as_str(), value.as_str());
        }
        for (name, value) in &signed {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(call.body))
            .map_err(|e| Error::InvalidUrl {
                url: uri.clone(),
                reason: e.to_string(),
            })?;
        match tokio::time::timeout(call.timeout, self.http.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) if e.is_connect() => Err(Error::Connect {
                url: uri,
                reason: with_sources(&e),
            }),
            Ok(Err(e)) => Err(Error::Call {
                url: uri,
                reason: with_sources(&e),
            }),
            Err(_) => Err(Error::Timeout {
                url: uri,
                timeout_ms: call.timeout.as_millis(),
            }),
        }
    }
}

/// An error with its sources: hyper's own text ("client error (Connect)")
/// leaves out why.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

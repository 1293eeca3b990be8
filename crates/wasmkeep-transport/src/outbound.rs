//! An actor's outbound HTTP requests (ADR 0066): checked against its
//! class's allow-list, resolved, every address checked again (no SSRF
//! through DNS), then sent over one fresh connection to a checked address,
//! TLS verified against the webpki roots and the node's extra CA file.
//!
//! Timeouts are the caller's: the runtime bounds each request by the time
//! its event has left.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::uri::Scheme;
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use wasmkeep_types::outbound::AllowList;

use crate::tls::{load_certs, provider};
use crate::{Error, Result};

/// Why an outbound request failed; the runtime maps each to the guest's
/// wasi:http error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundFailure {
    /// The URL's host and port are not on the allow-list.
    Denied,
    /// The host resolves only to addresses that are neither public nor
    /// listed (they are named).
    AddressProhibited(String),
    /// The URL has no host, or a scheme other than http and https.
    InvalidUri(String),
    /// The host name did not resolve.
    Dns(String),
    /// No connection could be made: the request was not sent.
    Connect(String),
    /// The TLS handshake failed (certificate or protocol): not sent.
    Tls(String),
    /// The request was sent (at least in part) and then failed.
    Http(String),
}

impl fmt::Display for OutboundFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Denied => f.write_str("the class's allow-list does not list this host and port"),
            Self::AddressProhibited(addresses) => write!(
                f,
                "the host resolves to {addresses}: private, loopback or link-local addresses the allow-list does not list"
            ),
            Self::InvalidUri(why) => write!(f, "invalid URL: {why}"),
            Self::Dns(why) => write!(f, "the host does not resolve: {why}"),
            Self::Connect(why) => write!(f, "cannot connect: {why}"),
            Self::Tls(why) => write!(f, "TLS handshake failed: {why}"),
            Self::Http(why) => write!(f, "failed once sent: {why}"),
        }
    }
}

/// Sends actors' outbound requests. One per node; cheap to share.
pub struct OutboundClient {
    tls: Arc<ClientConfig>,
}

/// What [`OutboundClient::send`] gives back: the response's head and body,
/// and the connection's own task, which must be polled (spawned) until the
/// body has been read.
pub type Sent = (
    http::Response<Incoming>,
    Pin<Box<dyn Future<Output = std::result::Result<(), hyper::Error>> + Send>>,
);

impl OutboundClient {
    /// TLS verified against the webpki roots (Mozilla's), and the
    /// certificates of `extra_ca` (a PEM file) when given.
    pub fn new(extra_ca: Option<&Path>) -> Result<Self> {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(path) = extra_ca {
            for cert in load_certs(path)? {
                roots.add(cert).map_err(|e| {
                    Error::Tls(format!("bad CA certificate in {}: {e}", path.display()))
                })?;
            }
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: Arc::new(config),
        })
    }

    /// Checks `request`'s URL against `allow`, resolves its host, connects
    /// to the first address that is public or listed, and sends it (HTTP/1.1,
    /// one connection per request). The URL must be absolute; the request
    /// line carries only its path and query.
    pub async fn send<B>(&self, mut request: http::Request<B>, allow: &AllowList) -> Result<Sent>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let url = request.uri().to_string();
        let fail = |kind| Error::Outbound {
            url: url.clone(),
            kind,
        };
        let uri = request.uri();
        let tls = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => false,
            _ => {
                return Err(fail(OutboundFailure::InvalidUri(
                    "the scheme must be http or https".into(),
                )));
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| fail(OutboundFailure::InvalidUri("no host".into())))?
            .to_owned();
        let scheme_port = if tls { 443 } else { 80 };
        let port = uri.port_u16().unwrap_or(scheme_port);
        if !allow.allows_url_host(&host, port, scheme_port) {
            return Err(fail(OutboundFailure::Denied));
        }
        let addresses = resolve_checked(&host, port, allow).await.map_err(&fail)?;
        let stream = connect_first(&addresses).await.map_err(&fail)?;
        let _ = stream.set_nodelay(true);
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        *request.uri_mut() = path
            .parse()
            .map_err(|_| fail(OutboundFailure::InvalidUri("bad path".into())))?;
        if tls {
            let name = server_name(&host).map_err(&fail)?;
            let stream = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
                .connect(name, stream)
                .await
                .map_err(|e| fail(OutboundFailure::Tls(e.to_string())))?;
            exchange(TokioIo::new(stream), request).await
        } else {
            exchange(TokioIo::new(stream), request).await
        }
        .map_err(fail)
    }
}

/// The addresses of `host` that the node may connect to, in the resolver's
/// order; an error when there is none. A host that is an address is that
/// address.
async fn resolve_checked(
    host: &str,
    port: u16,
    allow: &AllowList,
) -> std::result::Result<Vec<SocketAddr>, OutboundFailure> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| OutboundFailure::Dns(e.to_string()))?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(OutboundFailure::Dns("no address".into()));
    }
    let allowed: Vec<SocketAddr> = addresses
        .iter()
        .filter(|a| allow.allows_address(a.ip()))
        .copied()
        .collect();
    if allowed.is_empty() {
        let names: Vec<String> = addresses.iter().map(|a| a.ip().to_string()).collect();
        return Err(OutboundFailure::AddressProhibited(names.join(", ")));
    }
    Ok(allowed)
}

/// A connection to the first of `addresses` that accepts one.
async fn connect_first(
    addresses: &[SocketAddr],
) -> std::result::Result<TcpStream, OutboundFailure> {
    let mut failures = Vec::new();
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failures.push(format!("{address}: {e}")),
        }
    }
    Err(OutboundFailure::Connect(failures.join("; ")))
}

fn server_name(host: &str) -> std::result::Result<ServerName<'static>, OutboundFailure> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => Ok(ServerName::from(ip)),
        Err(_) => ServerName::try_from(bare.to_owned())
            .map_err(|e| OutboundFailure::InvalidUri(format!("host {bare:?}: {e}"))),
    }
}

/// One request over a fresh HTTP/1.1 connection: the handshake, then the
/// request, driving the connection until the response's head is in.
async fn exchange<I, B>(
    io: I,
    request: http::Request<B>,
) -> std::result::Result<Sent, OutboundFailure>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| OutboundFailure::Connect(e.to_string()))?;
    let mut connection: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(connection);
    let send = sender.send_request(request);
    tokio::pin!(send);
    let response = tokio::select! {
        biased;
        response = &mut send => response.map_err(|e| OutboundFailure::Http(e.to_string()))?,
        ended = &mut connection => {
            ended.map_err(|e| OutboundFailure::Http(e.to_string()))?;
            // The server closed the connection after its answer
            // (`connection: close`): the answer, if one came, is delivered.
            let response = send
                .await
                .map_err(|e| OutboundFailure::Http(e.to_string()))?;
            let done: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async { Ok(()) });
            return Ok((response, done));
        }
    };
    Ok((response, connection))
}

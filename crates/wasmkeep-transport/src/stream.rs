//! A byte stream to a peer's advertised URL, over TCP and, for `https`,
//! TLS with the node's client configuration: what the WebSocket relay
//! speaks its upgrade over. Carries bytes; never reads or writes HTTP.

use std::sync::Arc;

use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{Error, Result};

/// Any stream to a peer, plain or TLS.
pub trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}

/// An open stream to a peer and how it was reached.
pub struct PeerStream {
    pub io: Box<dyn PeerIo>,
    /// `host:port` as the URL gave it (or with the scheme's default port).
    pub authority: String,
    /// Whether the stream is TLS (`https` URL).
    pub secure: bool,
}

/// Connects to `url` (`http://` or `https://`); TLS verifies the peer
/// against `tls`. Errors name the step that failed: the URL, connecting,
/// the host name or the TLS handshake.
pub async fn connect(url: &str, tls: &Arc<ClientConfig>) -> Result<PeerStream> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let failed = |what: &str, e: &dyn std::fmt::Display| Error::Call {
        url: url.to_owned(),
        reason: format!("{what}: {e}"),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
    let secure = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(invalid("neither http nor https".into())),
    };
    let host = uri
        .host()
        .ok_or_else(|| invalid("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_else(|| format!("{host}:{port}"));
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| failed("connecting", &e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn PeerIo> = if secure {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| failed("peer host name", &e))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
        Box::new(
            connector
                .connect(name, tcp)
                .await
                .map_err(|e| failed("TLS handshake", &e))?,
        )
    } else {
        Box::new(tcp)
    };
    Ok(PeerStream {
        io,
        authority,
        secure,
    })
}

//! The tests' HTTP and WebSocket clients: plain or https (trusting the
//! cluster's test CA), one request at a time with a time limit, and a retry
//! helper for `503 Retry-After`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;
use tokio_tungstenite::tungstenite::Message;

/// Longest one request (connect, send, whole response) may take.
pub const REQUEST_TIME_MAX: Duration = Duration::from_secs(20);
/// Pause before retrying a `503` (the tests' own backoff, not a wait for an event).
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Largest response body read.
const BODY_BYTES_MAX: usize = 4 << 20;
/// Idle pooled connections kept per node.
const POOL_IDLE_PER_NODE_MAX: usize = 32;

/// One response, read whole.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The node that ran the event (`x-wasmkeep-node`).
    pub fn node(&self) -> Option<&str> {
        self.header("x-wasmkeep-node")
    }

    /// The body as a number (the counter's answers).
    pub fn count(&self) -> anyhow::Result<u64> {
        self.text()
            .trim()
            .parse()
            .with_context(|| format!("not a count: status {} body {:?}", self.status, self.text()))
    }
}

/// An HTTP/1.1 client for http:// and https:// node URLs.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    tls: Arc<ClientConfig>,
}

impl Http {
    /// `ca`: the PEM file of the roots https nodes are checked against.
    pub fn new(ca: Option<&Path>) -> anyhow::Result<Self> {
        let tls = wasmkeep_transport::tls::client_config(ca).context("client TLS configuration")?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE_PER_NODE_MAX)
            .build(connector);
        Ok(Self { client, tls })
    }

    /// One request; an error is a transport failure or the time limit.
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Resp> {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(body.into()))
            .with_context(|| format!("building {method} {url}"))?;
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, BODY_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| anyhow!("reading the body: {e}"))?
                .to_bytes();
            anyhow::Ok(Resp {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(REQUEST_TIME_MAX, exchange)
            .await
            .map_err(|_| anyhow!("{method} {url}: no response within {REQUEST_TIME_MAX:?}"))?
            .with_context(|| format!("{method} {url}"))
    }

    pub async fn get(&self, url: &str) -> anyhow::Result<Resp> {
        self.send("GET", url, &[], Bytes::new()).await
    }

    pub async fn post(&self, url: &str) -> anyhow::Result<Resp> {
        self.send("POST", url, &[], Bytes::new()).await
    }

    /// Sends until the answer is not `503` or `deadline` passes; a `503`
    /// must carry `Retry-After` (DESIGN.md, HTTP). Transport errors are
    /// returned at once: the caller decides whether the outcome is unknown.
    pub async fn send_retrying_503(
        &self,
        method: &str,
        url: &str,
        deadline: Instant,
    ) -> anyhow::Result<Resp> {
        loop {
            let response = self.send(method, url, &[], Bytes::new()).await?;
            if response.status != 503 {
                return Ok(response);
            }
            if response.header("retry-after").is_none() {
                bail!(
                    "{method} {url}: 503 without Retry-After: {}",
                    response.text()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{method} {url}: still 503 at the deadline: {}",
                    response.text()
                );
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Opens a WebSocket at `url` (`http(s)://host:port/path`).
    pub async fn websocket(&self, url: &str) -> anyhow::Result<Socket> {
        let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
        let host = uri.host().context("URL without host")?.to_owned();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        // The handshake runs over a stream opened here, so the scheme below
        // only names the Host header's form.
        let ws_url = format!("ws://{host}:{port}{path}");
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .with_context(|| format!("connecting to {host}:{port}"))?;
        let connect = async {
            let stream: Box<dyn Stream> = if https {
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .with_context(|| format!("bad server name {host}"))?;
                let tls = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
                    .connect(name, tcp)
                    .await
                    .context("TLS handshake")?;
                Box::new(tls)
            } else {
                Box::new(tcp)
            };
            let (socket, response) = tokio_tungstenite::client_async(ws_url.as_str(), stream)
                .await
                .with_context(|| format!("WebSocket handshake with {url}"))?;
            anyhow::Ok(Socket {
                inner: socket,
                node: response
                    .headers()
                    .get("x-wasmkeep-node")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
            })
        };
        tokio::time::timeout(REQUEST_TIME_MAX, connect)
            .await
            .map_err(|_| anyhow!("WebSocket {url}: no handshake within {REQUEST_TIME_MAX:?}"))?
    }
}

/// The byte streams a WebSocket can run over (plain TCP or TLS).
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// An open client WebSocket.
pub struct Socket {
    inner: tokio_tungstenite::WebSocketStream<Box<dyn Stream>>,
    /// `x-wasmkeep-node` of the upgrade response, if the node sent one.
    pub node: Option<String>,
}

impl Socket {
    pub async fn send_text(&mut self, text: &str) -> anyhow::Result<()> {
        self.inner
            .send(Message::text(text))
            .await
            .context("sending a WebSocket message")
    }

    /// The next text message (pings and pongs skipped), within the request
    /// time limit.
    pub async fn recv_text(&mut self) -> anyhow::Result<String> {
        let next = async {
            loop {
                match self.inner.next().await {
                    Some(Ok(Message::Text(text))) => return Ok(text.to_string()),
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    Some(Ok(Message::Binary(b))) => bail!("binary message {b:?}, wanted text"),
                    Some(Ok(Message::Close(frame))) => bail!("closed by the server: {frame:?}"),
                    Some(Err(e)) => bail!("WebSocket error: {e}"),
                    None => bail!("WebSocket ended"),
                }
            }
        };
        tokio::time::timeout(REQUEST_TIME_MAX, next)
            .await
            .map_err(|_| anyhow!("no WebSocket message within {REQUEST_TIME_MAX:?}"))?
    }

    /// Reads until the server closes the socket; returns the close code
    /// (`None` for a close without a frame, or the stream ending).
    pub async fn recv_close_code(&mut self) -> anyhow::Result<Option<u16>> {
        let next = async {
            loop {
                match self.inner.next().await {
                    Some(Ok(Message::Close(frame))) => return Ok(frame.map(|f| u16::from(f.code))),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => bail!("WebSocket error before the close: {e}"),
                    None => return Ok(None),
                }
            }
        };
        tokio::time::timeout(REQUEST_TIME_MAX, next)
            .await
            .map_err(|_| anyhow!("no close within {REQUEST_TIME_MAX:?}"))?
    }

    /// After [`Self::recv_close_code`]: sends the close reply the
    /// WebSocket library queued and reads until the server ends the
    /// connection.
    pub async fn finish_close(mut self) -> anyhow::Result<()> {
        let rest = async {
            let _ = self.inner.flush().await;
            while let Some(Ok(_)) = self.inner.next().await {}
        };
        tokio::time::timeout(REQUEST_TIME_MAX, rest)
            .await
            .map_err(|_| anyhow!("the server did not end the connection after the close"))
    }

    pub async fn close(mut self) {
        let _ = self.inner.close(None).await;
    }
}

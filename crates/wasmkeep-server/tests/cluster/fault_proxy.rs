//! An HTTP proxy between the nodes and the S3 server that refuses chosen
//! requests, so a test can make one kind of bucket write fail (say, every
//! write of an ownership record) while heartbeats and log records go through.
//!
//! Requests pass unchanged, `Host` header included, so S3 signatures made
//! for the proxy's address still verify at the server. A refused request
//! gets `403 AccessDenied`, which object_store does not retry: each refusal
//! is one failed bucket call at the node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Requests a proxy refuses: a method and a substring of the path.
#[derive(Debug, Clone)]
struct Rule {
    methods: Vec<hyper::Method>,
    path_contains: String,
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    rule: Arc<Mutex<Option<Rule>>>,
    refused: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and passes requests to `upstream`
    /// (`http://host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        Self::start_on(listener, upstream)
    }

    /// Passes the requests `listener` accepts to `upstream`.
    pub fn start_on(listener: TcpListener, upstream: &str) -> anyhow::Result<FaultProxy> {
        let upstream: hyper::Uri = upstream.parse().context("the upstream URL")?;
        let authority = upstream
            .authority()
            .context("the upstream URL has no host")?
            .clone();
        let addr = listener.local_addr()?;
        let rule: Arc<Mutex<Option<Rule>>> = Arc::default();
        let refused = Arc::new(AtomicU64::new(0));
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build_http();
        let task = tokio::spawn({
            let rule = Arc::clone(&rule);
            let refused = Arc::clone(&refused);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (rule, refused, client, authority) = (
                        Arc::clone(&rule),
                        Arc::clone(&refused),
                        client.clone(),
                        authority.clone(),
                    );
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            pass(
                                req,
                                rule.lock().clone(),
                                Arc::clone(&refused),
                                client.clone(),
                                authority.clone(),
                            )
                        });
                        // A connection the node drops mid-request ends here.
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Ok(FaultProxy {
            addr,
            rule,
            refused,
            task,
        })
    }

    /// The endpoint the nodes use instead of the server's.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, refuses `methods` on paths containing `path_contains`.
    pub fn refuse(&self, methods: &[hyper::Method], path_contains: &str) {
        *self.rule.lock() = Some(Rule {
            methods: methods.to_vec(),
            path_contains: path_contains.to_owned(),
        });
    }

    /// Passes every request again.
    pub fn heal(&self) {
        *self.rule.lock() = None;
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pass(
    req: hyper::Request<Incoming>,
    rule: Option<Rule>,
    refused: Arc<AtomicU64>,
    client: Client<HttpConnector, Incoming>,
    authority: hyper::http::uri::Authority,
) -> Result<hyper::Response<ProxyBody>, hyper::Error> {
    if let Some(rule) = rule
        && rule.methods.contains(req.method())
        && req.uri().path().contains(&rule.path_contains)
    {
        refused.fetch_add(1, Ordering::Relaxed);
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
            <Error><Code>AccessDenied</Code><Message>refused by the test's fault proxy</Message></Error>";
        let response = hyper::Response::builder()
            .status(403)
            .header("content-type", "application/xml")
            .body(full(body))
            .expect("a static response is valid");
        return Ok(response);
    }
    let (mut parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = hyper::Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path_and_query)
        .build()
        .expect("parts of valid URIs make a valid URI");
    match client
        .request(hyper::Request::from_parts(parts, body))
        .await
    {
        Ok(response) => Ok(response.map(|b| b.boxed())),
        Err(e) => Ok(hyper::Response::builder()
            .status(502)
            .body(full(&format!("the proxy could not reach the server: {e}")))
            .expect("a plain response is valid")),
    }
}

fn full(text: &str) -> ProxyBody {
    Full::new(Bytes::from(text.to_owned()))
        .map_err(|never| match never {})
        .boxed()
}

//! An upstream for actors' outbound HTTP (ADR 0066): a small HTTP server
//! and an HTTPS one with a certificate of a test CA, both on loopback, run
//! in the test's process. Routes: `GET /hello`, `GET /big` (1 MiB), `GET /big-chunked` (1 MiB, no length),
//! `GET /slow` (answers once the test calls [`Upstream::release`], or after
//! a minute), `POST /echo`. Counts the requests it receives.

#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

pub const HELLO: &str = "hello from upstream";
pub const BIG_BYTES: usize = 1 << 20;

struct Shared {
    hits: AtomicU64,
    released: tokio::sync::watch::Sender<bool>,
    /// Requests to /slow waiting now.
    slow_waiting: AtomicU64,
}

pub struct Upstream {
    pub port: u16,
    pub tls_port: u16,
    /// The test CA's certificate (PEM), for `--outbound-ca`.
    pub ca_file: PathBuf,
    shared: Arc<Shared>,
    /// Shut down in the background on drop: an async test may drop it.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Upstream {
    /// Starts both servers; the CA's certificate and the server's key are
    /// written under `dir`.
    pub fn start(dir: &Path) -> Upstream {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "wasmkeep test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let ca_file = dir.join("upstream-ca.pem");
        let cert_file = dir.join("upstream-cert.pem");
        let key_file = dir.join("upstream-key.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        std::fs::write(&cert_file, leaf.pem()).unwrap();
        std::fs::write(&key_file, leaf_key.serialize_pem()).unwrap();
        let tls = wasmkeep_transport::tls::server_config(&cert_file, &key_file).unwrap();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (released, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            hits: AtomicU64::new(0),
            released,
            slow_waiting: AtomicU64::new(0),
        });
        // Bound here, served on the runtime: `start` may run inside an async
        // test, where blocking on another runtime is not allowed.
        let listener = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            listener
        };
        let (plain, secure) = (listener(), listener());
        let port = plain.local_addr().unwrap().port();
        let tls_port = secure.local_addr().unwrap().port();
        let s = Arc::clone(&shared);
        runtime.spawn(async move {
            let plain = tokio::net::TcpListener::from_std(plain).unwrap();
            while let Ok((stream, _)) = plain.accept().await {
                tokio::spawn(serve(TokioIo::new(stream), Arc::clone(&s)));
            }
        });
        let s = Arc::clone(&shared);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        runtime.spawn(async move {
            let secure = tokio::net::TcpListener::from_std(secure).unwrap();
            while let Ok((stream, _)) = secure.accept().await {
                let acceptor = acceptor.clone();
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve(TokioIo::new(stream), s).await;
                    }
                });
            }
        });
        Upstream {
            port,
            tls_port,
            ca_file,
            shared,
            runtime: Some(runtime),
        }
    }

    /// Requests received so far (any route, both servers).
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// Requests to `/slow` waiting for [`Upstream::release`] now.
    pub fn slow_waiting(&self) -> u64 {
        self.shared.slow_waiting.load(Ordering::SeqCst)
    }

    /// Lets every request to `/slow`, waiting or to come, answer.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }
}

async fn serve<I>(io: I, shared: Arc<Shared>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |request| answer(request, Arc::clone(&shared)));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

async fn answer(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    shared.hits.fetch_add(1, Ordering::SeqCst);
    let reply = |status: u16, body: Bytes| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain")
            .body(Full::new(body).boxed())
            .unwrap()
    };
    Ok(match (request.method().as_str(), request.uri().path()) {
        ("GET", "/hello") => reply(200, Bytes::from_static(HELLO.as_bytes())),
        ("GET", "/big") => reply(200, Bytes::from(vec![b'x'; BIG_BYTES])),
        ("GET", "/big-chunked") => {
            // No content-length: the size shows only while the body is read.
            let chunks = (0..BIG_BYTES / 4096).map(|_| {
                Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(vec![b'y'; 4096])))
            });
            let body = http_body_util::StreamBody::new(futures::stream::iter(chunks));
            return Ok(Response::builder().status(200).body(body.boxed()).unwrap());
        }
        ("GET", "/slow") => {
            shared.slow_waiting.fetch_add(1, Ordering::SeqCst);
            let mut released = shared.released.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(60), released.wait_for(|r| *r)).await;
            shared.slow_waiting.fetch_sub(1, Ordering::SeqCst);
            reply(200, Bytes::from_static(b"slow answer"))
        }
        ("POST", "/echo") => {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            reply(200, body)
        }
        _ => reply(404, Bytes::from_static(b"no such route")),
    })
}

/// `url` percent-encoded for a query parameter (`/fetch?url=...`).
pub fn encode(url: &str) -> String {
    percent_encoding::utf8_percent_encode(url, percent_encoding::NON_ALPHANUMERIC).to_string()
}

//! A signed node call over plain HTTP and over TLS reaches a real listener,
//! which verifies it with the cluster key.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use wasmkeep_cluster::{SeededRandom, Signer, SystemClock, Verdict};
use wasmkeep_transport::{PeerCall, PeerClient, tls};

const KEY: &[u8] = b"a cluster key of at least thirty-two bytes";

fn signer(node: &str, seed: u64) -> Arc<Signer> {
    Arc::new(
        Signer::new(
            KEY.to_vec(),
            node.into(),
            Arc::new(SystemClock),
            Arc::new(SeededRandom::new(seed)),
        )
        .unwrap(),
    )
}

/// Answers with the verdict on the request it received.
async fn verifying_service(
    verifier: Arc<Signer>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer = match verifier.verify(&method, &path, &query, &headers, &body) {
        Verdict::Verified { from, markers } => {
            let take = markers
                .iter()
                .any(|(n, v)| n == "x-wasmkeep-take" && v == "1");
            format!(
                "verified from={from} take={take} body={}",
                String::from_utf8_lossy(&body)
            )
        }
        Verdict::Unsigned => "unsigned".into(),
        Verdict::Refused(why) => format!("refused: {why}"),
        Verdict::Skewed { from, skew_ms } => format!("skewed: {from} by {skew_ms} ms"),
    };
    Ok(Response::new(Full::new(Bytes::from(answer))))
}

async fn serve(tls_config: Option<Arc<rustls::ServerConfig>>) -> (String, Arc<Signer>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let verifier = signer("receiver", 99);
    let v = verifier.clone();
    let scheme = if tls_config.is_some() {
        "https"
    } else {
        "http"
    };
    tokio::spawn(async move {
        let acceptor = tls_config.map(tokio_rustls::TlsAcceptor::from);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let v = v.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let service = service_fn(move |r| verifying_service(v.clone(), r));
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    (format!("{scheme}://{addr}"), verifier)
}

fn take_call(body: &'static str) -> PeerCall {
    PeerCall {
        method: Method::POST,
        path: "/acme/counter/alice".into(),
        query: String::new(),
        headers: vec![("content-type".into(), "text/plain".into())],
        markers: vec![("x-wasmkeep-take".into(), "1".into())],
        body: Bytes::from_static(body.as_bytes()),
        timeout: Duration::from_secs(10),
    }
}

async fn text(response: Response<Incoming>) -> String {
    String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_signed_call_over_plain_http_is_verified_with_its_marker() {
    let (url, _) = serve(None).await;
    let client = PeerClient::new(signer("sender", 1), tls::client_config(None).unwrap());
    let answer = text(
        client
            .send(&url, take_call("wasmkeep-take 1\nacme\n"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        answer,
        "verified from=sender take=true body=wasmkeep-take 1\nacme\n"
    );
}

#[tokio::test]
async fn a_signed_call_over_tls_is_verified_against_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();

    let (url, _) = serve(Some(tls::server_config(&cert_path, &key_path).unwrap())).await;
    assert!(url.starts_with("https://"));
    let client = PeerClient::new(
        signer("sender", 1),
        tls::client_config(Some(&cert_path)).unwrap(),
    );
    let answer = text(
        client
            .send(&url, take_call("wasmkeep-take 1\nacme\n"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        answer,
        "verified from=sender take=true body=wasmkeep-take 1\nacme\n"
    );

    // A client that does not trust the certificate cannot call at all.
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let other_path = dir.path().join("other.pem");
    std::fs::write(&other_path, other.cert.pem()).unwrap();
    let untrusting = PeerClient::new(
        signer("sender", 2),
        tls::client_config(Some(&other_path)).unwrap(),
    );
    assert!(untrusting.send(&url, take_call("x")).await.is_err());
}

#[tokio::test]
async fn a_call_signed_with_another_key_is_refused() {
    let (url, _) = serve(None).await;
    let stranger = Arc::new(
        Signer::new(
            b"some other cluster key, also 32 bytes+".to_vec(),
            "stranger".into(),
            Arc::new(SystemClock),
            Arc::new(SeededRandom::new(5)),
        )
        .unwrap(),
    );
    let client = PeerClient::new(stranger, tls::client_config(None).unwrap());
    let answer = text(client.send(&url, take_call("x")).await.unwrap()).await;
    assert_eq!(answer, "refused: signature does not verify");
}

/// A peer whose connects are dropped without an answer (a listener whose
/// queue is full drops SYNs, as a silent partition does) fails the call as
/// never sent, after the connect limit, not at the call's own limit as one
/// that may have arrived (ADR 0074).
#[tokio::test]
async fn a_connect_that_gets_no_answer_fails_the_call_as_not_sent() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    // Never accepted; room for one connection in the queue.
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the queue: the first connect that does not complete shows it full.
    let mut queued = Vec::new();
    loop {
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_millis(500), connect).await {
            Ok(stream) => queued.push(stream.unwrap()),
            Err(_) => break,
        }
        assert!(queued.len() < 8, "the listener's queue never filled");
    }
    let client = PeerClient::new(signer("sender", 1), tls::client_config(None).unwrap());
    let mut call = take_call("x");
    call.timeout = Duration::from_secs(20);
    let err = client
        .send(&format!("http://{addr}"), call)
        .await
        .unwrap_err();
    assert!(
        matches!(err, wasmkeep_transport::Error::Connect { .. }) && !err.may_have_arrived(),
        "{err}"
    );
}

#[test]
fn bad_tls_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let err = tls::server_config(&empty, &empty).unwrap_err().to_string();
    assert!(err.contains("no certificate"), "{err}");
    let err = tls::client_config(Some(&dir.path().join("missing.pem")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.pem"), "{err}");
}

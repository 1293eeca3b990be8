//! The HTTP front: accepts connections (hyper 1, HTTP/1.1 with upgrades,
//! plain or TLS), routes each request, reads its body within the limit,
//! verifies signed node calls (their markers are honoured only then), strips
//! marker headers, checks client requests' tenant tokens (when the node
//! requires them; ADR 0022) and turns every error into `{"error", "code"}`
//! JSON.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument as _;
use wasmkeep_runtime::{Request, Response};
use wasmkeep_types::ActorId;

use crate::actor::host::{check_response, strip_markers};
use crate::front::body::read_body;
use crate::front::conn::{ClientStream, Slots};
use crate::front::route::{Route, route};
use crate::node::Node;
use crate::ops::telemetry;
use crate::peering::forward::{self, HEADER_NODE, Markers, NodeAnswer};
use crate::peering::moves;
use crate::{Error, Result, front::sockets};

type HttpResponse = hyper::Response<Full<Bytes>>;

/// Longest a TLS handshake may take.
const TLS_HANDSHAKE_TIME_MAX: Duration = Duration::from_secs(10);
/// Longest a connection over `--max-connections` is held while it is
/// answered 503.
const REFUSAL_TIME_MAX: Duration = Duration::from_secs(1);
/// At most one warning per this period while connections are refused.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Serves HTTP on `listener` until `shutdown` turns true, then stops
/// accepting and waits (at most `grace`) for in-flight requests.
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    serve_tls(node, listener, None, shutdown, grace).await;
}

/// [`serve`], over TLS when `tls` is given.
pub async fn serve_tls(
    node: Arc<Node>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut connections = JoinSet::new();
    let slots = Slots::new(
        Arc::clone(&node.metrics),
        node.config.limits.connections_max,
    );
    let mut refusals_logged_at: Option<tokio::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => {
                if *shutdown.borrow() { break } else { continue }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            node.metrics.connections_refused.inc();
            if refusals_logged_at.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_PERIOD) {
                refusals_logged_at = Some(tokio::time::Instant::now());
                tracing::warn!(
                    max = node.config.limits.connections_max,
                    "refusing connections: --max-connections are open"
                );
            }
            if acceptor.is_none() {
                tokio::spawn(refuse(stream));
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let stream = ClientStream::new(stream, node.config.limits.send_idle_time_max, Some(slot));
        let node = Arc::clone(&node);
        let conn_shutdown = shutdown.clone();
        let acceptor = acceptor.clone();
        connections.spawn(async move {
            match acceptor {
                None => serve_connection(node, stream, peer, conn_shutdown).await,
                Some(acceptor) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIME_MAX, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => serve_connection(node, tls, peer, conn_shutdown).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// Answers a plain-HTTP connection over `--max-connections` 503 and closes
/// it, reading (and dropping) what the client sent meanwhile so that the
/// close sends no reset that could overtake the answer. Bounded in time.
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let error = Error::unavailable("this node has as many connections open as it accepts");
    let body = error.json_body();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        error.retry_after_s().unwrap_or(1),
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME_MAX, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

async fn serve_connection<S>(
    node: Arc<Node>,
    stream: S,
    peer: std::net::SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_time_max = node.config.limits.header_time_max;
    let metrics = Arc::clone(&node.metrics);
    let service = service_fn(move |req| {
        let node = Arc::clone(&node);
        async move { Ok::<_, Infallible>(handle(node, req).await) }
    });
    // The head's time limit also ends an idle keep-alive connection: hyper
    // starts it when it waits for the next request (ADR 0050).
    let conn = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(header_time_max)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                if timed_out(&e) {
                    metrics.connections_timed_out.inc();
                }
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Whether a connection ended for slowness: its request head did not come
/// in time, or a write waited too long for the client to read.
fn timed_out(e: &hyper::Error) -> bool {
    if e.is_timeout() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// On a 504 whose event may or may not have taken effect: `unknown`
/// (ADR 0062). Every other error answer applied nothing.
pub const HEADER_OUTCOME: &str = "x-wasmkeep-outcome";

/// Answers one request; never fails (errors become JSON responses).
pub async fn handle(node: Arc<Node>, req: hyper::Request<Incoming>) -> HttpResponse {
    let mut response = match dispatch(&node, req).await {
        Ok(response) => response,
        Err(e) => error_response(&e),
    };
    if !response.headers().contains_key(HEADER_NODE) {
        add_this_node_header(&mut response, &node);
    }
    node.metrics.request(response.status());
    response
}

pub fn error_response(error: &Error) -> HttpResponse {
    let mut builder = hyper::Response::builder()
        .status(error.status())
        .header("content-type", "application/json");
    if let Some(seconds) = error.retry_after_s() {
        builder = builder.header("retry-after", seconds.to_string());
    }
    if matches!(error, Error::Unauthorized(_)) {
        builder = builder.header(hyper::header::WWW_AUTHENTICATE, "Bearer");
    }
    if matches!(error, Error::Released { .. }) {
        // Only node code sets it: guests cannot set `x-wasmkeep-*` headers.
        builder = builder.header(forward::HEADER_RELEASED, "1");
    }
    if matches!(error, Error::OutcomeUnknown(_)) {
        builder = builder.header(HEADER_OUTCOME, "unknown");
    }
    if let Error::MethodNotAllowed { allow, .. } = error {
        builder = builder.header(hyper::header::ALLOW, *allow);
    }
    if let Error::Moved { holder, .. } = error {
        // Node code only, as above: the sender sends the event there, once.
        builder = builder.header(forward::HEADER_HOLDER, holder.as_str());
    }
    builder
        .body(Full::new(Bytes::from(error.json_body())))
        .expect("a status from Error::status and static headers are valid")
}

async fn dispatch(node: &Arc<Node>, req: hyper::Request<Incoming>) -> Result<HttpResponse> {
    let route = route(req.uri().path(), req.uri().query())?;
    // Test routes (`dev --test-routes`) judge their own methods.
    if !matches!(route, Route::Actor { .. } | Route::Test { .. })
        && !matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD)
    {
        return Err(Error::MethodNotAllowed {
            method: req.method().to_string(),
            allow: "GET, HEAD",
        });
    }
    let (actor, path) = match route {
        Route::Health => {
            if !node.is_serving() {
                return Err(Error::unavailable(
                    "the node is not serving (starting, stopping, or its lease is not valid)",
                ));
            }
            if let Some(why) = node.parts.unhealthy() {
                return Err(Error::unavailable(why));
            }
            return Ok(text(200, "text/plain", "ok\n"));
        }
        Route::Metrics => {
            return Ok(text(
                200,
                crate::ops::metrics::CONTENT_TYPE,
                &node.metrics.render(),
            ));
        }
        Route::Console { path } => {
            let answer =
                crate::ops::console::answer(node, &path, req.uri().query(), req.headers()).await;
            let mut response = answer.unwrap_or_else(|e| error_response(&e));
            crate::ops::console::secure(&mut response);
            return Ok(response);
        }
        Route::Actor { actor, path } => (actor, path),
        Route::Test { path } => {
            return crate::front::test_routes::answer(node, req, &path).await;
        }
    };
    let method = req.method().as_str().to_owned();
    let raw_path = req.uri().path().to_owned();
    let mut headers = Vec::with_capacity(req.headers().len());
    for (name, value) in req.headers() {
        let value = value
            .to_str()
            .map_err(|_| Error::BadRequest(format!("header {name} is not visible ASCII")))?;
        headers.push((name.as_str().to_owned(), value.to_owned()));
    }
    // The request's span (traces on): everything below runs in it.
    let span = telemetry::request_span(node.node_id.as_str(), &method, &raw_path, &actor, &headers);
    let result = actor_request(node, req, actor, path, method, raw_path, headers)
        .instrument(span.clone())
        .await;
    telemetry::record_status(
        &span,
        match &result {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status(),
        },
    );
    result
}

/// An actor's request, its headers read: tenant token, body, then
/// [`dispatch_actor`] (or a WebSocket upgrade).
async fn actor_request(
    node: &Arc<Node>,
    req: hyper::Request<Incoming>,
    actor: ActorId,
    path: String,
    method: String,
    raw_path: String,
    headers: Vec<(String, String)>,
) -> Result<HttpResponse> {
    let raw_query = req.uri().query().unwrap_or("").to_owned();
    // A request without a signature is a client's: its tenant token is
    // checked before anything else (even whether the class exists). A
    // signed one is judged once its body is read; if its signature is
    // refused, it is a client's too and is checked then.
    let signed = req
        .headers()
        .contains_key(wasmkeep_cluster::signing::HEADER_SIGNATURE);
    if !signed {
        check_tenant_token(node, &actor, &headers).await?;
    }
    // Refuse unknown classes before reading a body.
    node.classes.get(&actor.class)?;
    if sockets::is_upgrade(&req) {
        let markers = forward::judge(node, &method, &raw_path, &raw_query, &headers, b"")?;
        if signed && markers.from.is_none() {
            check_tenant_token(node, &actor, &headers).await?;
        }
        let mut req = req;
        if node.front.tenants.required() != Some(false) {
            req.headers_mut().remove(hyper::header::AUTHORIZATION);
        }
        // Boxed, as are the other rare steps of a request (a forward, a
        // node call): inline, every request's future would be sized for
        // the largest of them (ADR 0046).
        return Box::pin(sockets::upgrade(node, &actor, &path, req, markers.hop())).await;
    }
    let limit = node.config.limits.body_bytes_max;
    if let Some(length) = req.headers().get(hyper::header::CONTENT_LENGTH)
        && let Some(length) = length.to_str().ok().and_then(|v| v.parse::<u64>().ok())
        && length > limit as u64
    {
        return Err(Error::BodyTooLarge { limit_bytes: limit });
    }
    let body = read_body(
        req.into_body(),
        limit,
        node.config.limits.body_idle_time_max,
    )
    .await?;
    dispatch_actor(
        node,
        Call {
            actor,
            path,
            method,
            raw_path,
            raw_query,
            headers,
            body,
            signed,
        },
    )
    .await
}

/// An actor request whose body was read, as it arrived.
struct Call {
    actor: ActorId,
    /// The part after `/<tenant>/<class>/<name>`, query included.
    path: String,
    method: String,
    raw_path: String,
    raw_query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// It carries a signature header (verified or not).
    signed: bool,
}

/// The transport-independent part of an actor request: judges and strips
/// the markers, answers node calls (alarm hand-off, take), runs the request
/// through `ensure_owner`.
async fn dispatch_actor(node: &Arc<Node>, call: Call) -> Result<HttpResponse> {
    let Call {
        actor,
        path,
        method,
        raw_path,
        raw_query,
        mut headers,
        body,
        signed,
    } = call;
    let markers: Markers = forward::judge(node, &method, &raw_path, &raw_query, &headers, &body)?;
    if signed && markers.from.is_none() {
        // A refused signature makes it an ordinary client request.
        check_tenant_token(node, &actor, &headers).await?;
    }
    strip_markers(&mut headers);
    if node.front.tenants.required() != Some(false) {
        strip_authorization(&mut headers);
    }
    // Node calls (alarm hand-off, take) are answered by the node itself.
    if let Some(answer) = node_call(node, &actor, &markers, &body).await? {
        let mut response = text(answer.status, "text/plain", &answer.body);
        for (name, value) in answer.headers {
            if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, value);
            }
        }
        add_this_node_header(&mut response, node);
        return Ok(response);
    }
    // A verified call from another node's actor carries its call chain, so
    // depth and cycle checks span nodes; it must end with this actor.
    let chain = match markers.call_chain.clone() {
        Some(chain) if chain.last() == Some(&actor) => chain,
        Some(_) => {
            return Err(Error::BadRequest(
                "the call chain does not end with the called actor".into(),
            ));
        }
        None => vec![actor.clone()],
    };
    if let Some(other) = chain.iter().find(|a| a.tenant != actor.tenant) {
        return Err(Error::Call(format!(
            "actor {other} cannot call {actor}: calls never cross tenants"
        )));
    }
    // A call from another node whose chain names an actor that this one
    // already waits on (A calls B here while B, over there, calls A) would
    // wait for itself until the forward timed out.
    let waited = match chain.split_last() {
        Some((_, callers)) => {
            node.waits_on_any(&actor, callers, forward::WAITS_FOR_NODES_MAX)
                .await
        }
        None => None,
    };
    if let Some(waited) = waited {
        return Err(Error::Call(format!(
            "call cycle: {actor} is already waiting on {waited}"
        )));
    }
    let request = Request {
        method,
        path,
        headers,
        body,
    };
    let routed = node
        .route_request(&actor, request, chain, markers.hop())
        .await?;
    let mut response = to_http(routed.response)?;
    match &routed.ran_on {
        None => add_this_node_header(&mut response, node),
        Some(other) => add_node_header(&mut response, other),
    }
    Ok(response)
}

/// Answers one node call delivered without HTTP (the simulation's
/// transport): the same checks and dispatch as an HTTP request to an actor's
/// path, errors turned into their responses. Never fails.
pub async fn answer_call(
    node: &Arc<Node>,
    method: &str,
    raw_path: &str,
    raw_query: &str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
) -> crate::peering::peer::PeerReply {
    let result = async {
        let query = (!raw_query.is_empty()).then_some(raw_query);
        let Route::Actor { actor, path } = route(raw_path, query)? else {
            return Err(Error::BadRequest(format!(
                "{raw_path} is not an actor's path"
            )));
        };
        let signed = headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(wasmkeep_cluster::signing::HEADER_SIGNATURE));
        if !signed {
            check_tenant_token(node, &actor, &headers).await?;
        }
        node.classes.get(&actor.class)?;
        let limit = node.config.limits.body_bytes_max;
        if body.len() > limit {
            return Err(Error::BodyTooLarge { limit_bytes: limit });
        }
        dispatch_actor(
            node,
            Call {
                actor,
                path,
                method: method.to_owned(),
                raw_path: raw_path.to_owned(),
                raw_query: raw_query.to_owned(),
                headers,
                body,
                signed,
            },
        )
        .await
    }
    .await;
    let mut response = match result {
        Ok(response) => response,
        Err(e) => error_response(&e),
    };
    if !response.headers().contains_key(HEADER_NODE) {
        add_this_node_header(&mut response, node);
    }
    node.metrics.request(response.status());
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    crate::peering::peer::PeerReply {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .filter_map(|(n, v)| {
                v.to_str()
                    .ok()
                    .map(|v| (n.as_str().to_owned(), v.to_owned()))
            })
            .collect(),
        body,
    }
}

/// Checks a client request's bearer token against its tenant's tokens
/// (when the node requires them); a refusal is 401 and reaches no actor.
async fn check_tenant_token(
    node: &Node,
    actor: &ActorId,
    headers: &[(String, String)],
) -> Result<()> {
    if node.front.tenants.required() == Some(false) {
        return Ok(());
    }
    let mut values = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value.as_str());
    let authorization = values.next();
    if values.next().is_some() {
        return Err(Error::Unauthorized(
            "more than one Authorization header".into(),
        ));
    }
    let result = node
        .front
        .tenants
        .check(&*node.bucket, &node.keys, &actor.tenant, authorization)
        .await;
    if let Err(Error::Unauthorized(reason)) = &result {
        tracing::debug!(tenant = %actor.tenant, reason, "refused a request without a valid tenant token");
    }
    result
}

/// Removes the `Authorization` header, so that a tenant token never reaches
/// guest code.
fn strip_authorization(headers: &mut Vec<(String, String)>) {
    headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
}

/// Names this node in `x-wasmkeep-node` (its value built once).
fn add_this_node_header(response: &mut HttpResponse, node: &Node) {
    if let Some(value) = &node.front.node_header {
        response.headers_mut().insert(HEADER_NODE, value.clone());
    }
}

fn add_node_header(response: &mut HttpResponse, node: &str) {
    if let Ok(value) = hyper::header::HeaderValue::from_str(node) {
        response.headers_mut().insert(HEADER_NODE, value);
    }
}

fn text(status: u16, content_type: &str, body: &str) -> HttpResponse {
    hyper::Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("static status and header are valid")
}

/// Headers a guest may not set: hop-by-hop ones and node markers.
fn guest_may_set(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !(lower.starts_with("x-wasmkeep-")
        || matches!(
            lower.as_str(),
            "connection" | "transfer-encoding" | "content-length" | "upgrade" | "keep-alive"
        ))
}

fn to_http(response: Response) -> Result<HttpResponse> {
    check_response(&response).map_err(Error::EventRefused)?;
    let status = hyper::StatusCode::from_u16(response.status)
        .map_err(|e| Error::EventRefused(format!("the actor's status is invalid: {e}")))?;
    let mut builder = hyper::Response::builder().status(status);
    for (name, value) in response.headers {
        if guest_may_set(&name) {
            builder = builder.header(name, value);
        }
    }
    builder
        .body(Full::new(Bytes::from(response.body)))
        .map_err(|e| Error::EventRefused(format!("the actor's response is invalid: {e}")))
}

/// Answers a verified node call that is not an actor event: an alarm
/// hand-off or a take. `None` for anything else.
async fn node_call(
    node: &Arc<Node>,
    actor: &ActorId,
    markers: &Markers,
    body: &[u8],
) -> Result<Option<NodeAnswer>> {
    if markers.take {
        return Ok(Some(Box::pin(moves::receive_take(node, actor, body)).await));
    }
    if let Some(nodes_left) = markers.waits_for {
        let callers = forward::decode_chain(&String::from_utf8_lossy(body)).map_err(|e| {
            Error::BadRequest(format!("a waits-for question's body is no call chain: {e}"))
        })?;
        let waited = Box::pin(node.waits_on_any(actor, &callers, nodes_left)).await;
        return Ok(Some(forward::waits_for_answer(waited.as_ref())));
    }
    if let Some(scheduled_ms) = markers.alarm_ms {
        Box::pin(forward::receive_alarm(
            node,
            actor,
            scheduled_ms,
            markers.alarm_retry,
        ))
        .await?;
        return Ok(Some(NodeAnswer::new(200, "alarm armed")));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_responses_lose_markers_and_hop_by_hop_headers() {
        let response = Response {
            status: 201,
            headers: vec![
                ("x-wasmkeep-node".into(), "evil".into()),
                ("content-type".into(), "text/plain".into()),
                ("Connection".into(), "close".into()),
            ],
            body: b"hi".to_vec(),
        };
        let http = to_http(response).expect("valid");
        assert_eq!(http.status(), 201);
        assert!(http.headers().get("x-wasmkeep-node").is_none());
        assert!(http.headers().get("connection").is_none());
        assert_eq!(http.headers()["content-type"], "text/plain");
    }

    #[test]
    fn an_answer_that_cannot_be_sent_is_refused() {
        let bad = Response {
            status: 42,
            headers: vec![],
            body: vec![],
        };
        assert!(matches!(to_http(bad), Err(Error::EventRefused(_))));
        let informational = Response {
            status: 101,
            headers: vec![],
            body: vec![],
        };
        assert!(matches!(
            to_http(informational),
            Err(Error::EventRefused(_))
        ));
        for (status, headers) in [
            (999, vec![]),
            (200, vec![("bad name".to_owned(), "v".to_owned())]),
            (
                200,
                vec![("x-ok".to_owned(), "a\r\nset-cookie: x".to_owned())],
            ),
        ] {
            let response = Response {
                status,
                headers,
                body: vec![],
            };
            assert!(check_response(&response).is_err(), "{response:?}");
        }
    }

    #[test]
    fn client_markers_are_stripped() {
        let mut headers = vec![
            ("X-Wasmkeep-Forwarded".to_owned(), "1".to_owned()),
            ("accept".to_owned(), "*/*".to_owned()),
        ];
        strip_markers(&mut headers);
        assert_eq!(headers, vec![("accept".to_owned(), "*/*".to_owned())]);
    }

    #[test]
    fn error_responses_are_json_with_retry_after() {
        let response = error_response(&Error::unavailable("busy"));
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(response.headers()["content-type"], "application/json");
        assert!(
            !response
                .headers()
                .contains_key(crate::peering::forward::HEADER_RELEASED)
        );
    }

    #[test]
    fn an_unknown_outcome_answers_504_saying_so_and_asks_for_no_retry() {
        let response = error_response(&Error::OutcomeUnknown("record 7 did not settle".into()));
        assert_eq!(response.status(), 504);
        assert_eq!(response.headers()[HEADER_OUTCOME], "unknown");
        assert!(!response.headers().contains_key("retry-after"));
        let failed = error_response(&Error::unavailable("busy"));
        assert!(!failed.headers().contains_key(HEADER_OUTCOME));
    }

    #[test]
    fn a_released_actor_answers_503_with_the_released_marker() {
        let response = error_response(&Error::Released {
            actor: "t/counter/a".into(),
            peer: "n1".into(),
        });
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(
            response.headers()[crate::peering::forward::HEADER_RELEASED],
            "1"
        );
    }

    #[test]
    fn a_moved_actor_answers_503_naming_the_holder() {
        let response = error_response(&Error::Moved {
            actor: "t/counter/a".into(),
            holder: wasmkeep_types::NodeId::new("n3").expect("valid"),
        });
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(
            response.headers()[crate::peering::forward::HEADER_HOLDER],
            "n3"
        );
        assert!(
            !response
                .headers()
                .contains_key(crate::peering::forward::HEADER_RELEASED)
        );
    }

    #[test]
    fn unauthorized_answers_401_asking_for_a_bearer_token() {
        let response = error_response(&Error::Unauthorized("no token".into()));
        assert_eq!(response.status(), 401);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        assert!(!response.headers().contains_key("retry-after"));
    }

    #[test]
    fn the_authorization_header_never_reaches_a_guest() {
        let mut headers = vec![
            ("Authorization".to_owned(), "Bearer wk_x".to_owned()),
            ("accept".to_owned(), "*/*".to_owned()),
        ];
        strip_authorization(&mut headers);
        assert_eq!(headers, vec![("accept".to_owned(), "*/*".to_owned())]);
    }

    #[test]
    fn guests_cannot_set_the_released_marker() {
        assert!(!guest_may_set(crate::peering::forward::HEADER_RELEASED));
    }
}

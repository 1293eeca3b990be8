//! Outbound HTTP for guests (ADR 0066): the standard
//! `wasi:http/outgoing-handler`, whose requests go through
//! [`OutboundHooks::send_request`]: checked against the class's allow-list,
//! bounded by the event's remaining time, by a number in flight per actor
//! and per node, and by a response body cap. A refusal is a wasi:http error
//! code handed to the guest, never a trap.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmkeep_transport::{OutboundClient, OutboundFailure};
use wasmkeep_types::outbound::AllowList;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// What the node tells the runtime about one actor's outbound requests.
pub trait OutboundScope: Send + Sync + 'static {
    /// The class's allow-list now: a redeploy may change it, and the next
    /// request sees the change.
    fn allow_list(&self) -> Arc<AllowList>;
    /// Counts one request once its answer's head is in, or once it failed.
    fn record(&self, outcome: &OutboundOutcome);
}

/// How one outbound request ended, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundOutcome {
    /// The upstream answered with this status, after `latency` (to the
    /// response's head).
    Answered { status: u16, latency: Duration },
    /// Refused by the allow-list (host, or address after resolution).
    Denied,
    /// Anything else: no connection, TLS, a timeout, too many in flight.
    Failed,
}

/// The scope of an actor whose node says nothing: nothing is allowed.
pub struct DenyAll;

impl OutboundScope for DenyAll {
    fn allow_list(&self) -> Arc<AllowList> {
        Arc::new(AllowList::default())
    }

    fn record(&self, _: &OutboundOutcome) {}
}

/// The node's limits on outbound requests.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    /// Largest response body a guest may read, in bytes.
    pub body_bytes_max: u64,
    /// Requests one actor may have in flight (to the end of their bodies);
    /// one more fails at once.
    pub in_flight_per_actor: usize,
    /// Requests the node may have in flight; one more fails at once.
    pub in_flight_per_node: usize,
    /// A PEM file of CA certificates trusted besides the webpki roots.
    pub extra_ca: Option<std::path::PathBuf>,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            body_bytes_max: 16 << 20,
            in_flight_per_actor: 16,
            in_flight_per_node: 1024,
            extra_ca: None,
        }
    }
}

/// The node's half: one client and one count of requests in flight.
pub(crate) struct OutboundNode {
    pub(crate) client: OutboundClient,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) config: OutboundConfig,
}

/// The hooks of one store (one actor's instance).
pub(crate) struct OutboundHooks {
    pub(crate) node: Arc<OutboundNode>,
    pub(crate) scope: Arc<dyn OutboundScope>,
    /// This actor's requests in flight.
    pub(crate) slots: Arc<Semaphore>,
    /// The end of the event in progress (set when the event starts).
    pub(crate) deadline: Instant,
    /// The actor, for the log.
    pub(crate) actor: Arc<str>,
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        let node = Arc::clone(&self.node);
        let scope = Arc::clone(&self.scope);
        let actor_slots = Arc::clone(&self.slots);
        // The guest keeps time to handle a timeout and answer, as for calls.
        let deadline =
            tokio::time::Instant::now() + crate::state::wait_before_answer(self.deadline);
        let actor = Arc::clone(&self.actor);
        Box::new(async move {
            let url = request.uri().to_string();
            let Ok(actor_permit) = actor_slots.try_acquire_owned() else {
                tracing::warn!(%actor, %url, limit = node.config.in_flight_per_actor, "outbound request refused: the actor has its most requests in flight");
                scope.record(&OutboundOutcome::Failed);
                return Err(HttpError::ConnectionLimitReached);
            };
            let Ok(node_permit) = Arc::clone(&node.slots).try_acquire_owned() else {
                tracing::warn!(%actor, %url, limit = node.config.in_flight_per_node, "outbound request refused: the node has its most requests in flight");
                scope.record(&OutboundOutcome::Failed);
                return Err(HttpError::ConnectionLimitReached);
            };
            let allow = scope.allow_list();
            let started = Instant::now();
            let sent = tokio::time::timeout_at(deadline, node.client.send(request, &allow)).await;
            let (response, connection) = match sent {
                Ok(Ok(sent)) => sent,
                Ok(Err(error)) => {
                    let (outcome, code) = failure_code(&error);
                    tracing::info!(%actor, %error, "outbound request failed");
                    scope.record(&outcome);
                    return Err(code);
                }
                Err(_elapsed) => {
                    tracing::info!(%actor, %url, "outbound request timed out: the event's time ran out");
                    scope.record(&OutboundOutcome::Failed);
                    return Err(HttpError::ConnectionTimeout);
                }
            };
            scope.record(&OutboundOutcome::Answered {
                status: response.status().as_u16(),
                latency: started.elapsed(),
            });
            let body_bytes_max = node.config.body_bytes_max;
            // A body declared too large fails the request itself, so the
            // guest sees the error code; one that turns out too large while
            // it is read fails the read (wasi:http 0.2 gives a read error
            // no code: the guest sees the message).
            let declared = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|length| length > body_bytes_max) {
                tracing::info!(%actor, %url, ?declared, limit = body_bytes_max, "outbound response refused: its body is larger than the node allows");
                return Err(HttpError::HttpResponseBodySize(Some(body_bytes_max)));
            }
            let response = response.map(|incoming| {
                WasiBody::new(CappedBody {
                    inner: incoming,
                    left: body_bytes_max,
                    limit: body_bytes_max,
                    deadline: Box::pin(tokio::time::sleep_until(deadline)),
                    _permits: (actor_permit, node_permit),
                })
            });
            let connection: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async move { connection.await.map_err(HttpError::from) });
            Ok((response, connection))
        })
    }
}

/// The outcome and the guest's error code of a failed send.
fn failure_code(error: &wasmkeep_transport::Error) -> (OutboundOutcome, HttpError) {
    let wasmkeep_transport::Error::Outbound { kind, .. } = error else {
        return (
            OutboundOutcome::Failed,
            HttpError::InternalError(Some(error.to_string())),
        );
    };
    match kind {
        OutboundFailure::Denied => (OutboundOutcome::Denied, HttpError::HttpRequestDenied),
        OutboundFailure::AddressProhibited(_) => {
            (OutboundOutcome::Denied, HttpError::DestinationIpProhibited)
        }
        OutboundFailure::InvalidUri(_) => {
            (OutboundOutcome::Failed, HttpError::HttpRequestUriInvalid)
        }
        OutboundFailure::Dns(why) => (
            OutboundOutcome::Failed,
            HttpError::DnsError {
                rcode: Some(why.clone()),
                info_code: None,
            },
        ),
        OutboundFailure::Connect(_) => (OutboundOutcome::Failed, HttpError::ConnectionRefused),
        OutboundFailure::Tls(why) if why.contains("certificate") => {
            (OutboundOutcome::Failed, HttpError::TlsCertificateError)
        }
        OutboundFailure::Tls(_) => (OutboundOutcome::Failed, HttpError::TlsProtocolError),
        OutboundFailure::Http(why) => (
            OutboundOutcome::Failed,
            HttpError::InternalError(Some(why.clone())),
        ),
    }
}

/// A response body the guest reads: at most `limit` bytes, until the
/// event's deadline. Holds the request's places in flight until it ends.
struct CappedBody {
    inner: Incoming,
    left: u64,
    limit: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                if len > self.left {
                    let limit = self.limit;
                    self.left = 0;
                    return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(limit)))));
                }
                self.left -= len;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(HttpError::from(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::HttpResponseTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

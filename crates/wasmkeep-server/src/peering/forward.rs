//! Signed node calls: the marker headers, forwarded requests and actor
//! calls (one hop, with a loop guard), hand-backs naming the holder, and
//! alarm hand-offs (ADR 0005). Never writes the node lease.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use tokio::time::Instant;
use tracing::Instrument as _;
use wasmkeep_cluster::signing::Verdict;
use wasmkeep_runtime::{Request, Response};
use wasmkeep_transport::PeerCall;
use wasmkeep_types::{ActorId, NodeId};

use crate::node::{Node, Owner};
use crate::{Error, Result};

/// Marker: this request was forwarded by a node (one hop; never forwarded again).
pub const MARKER_FORWARDED: &str = "x-wasmkeep-forwarded";
/// Marker: the actors waiting on this call, comma-separated, each percent-encoded.
pub const MARKER_CALL_CHAIN: &str = "x-wasmkeep-call-chain";
/// Marker: an alarm handed off by another node (its scheduled ms).
pub const MARKER_ALARM: &str = "x-wasmkeep-alarm";
/// Marker beside [`MARKER_ALARM`]: the delivery's retry count and due time
/// (wall ms), `"COUNT DUE"`. A node without it delivers the alarm at once
/// as its first attempt.
pub const MARKER_ALARM_RETRY: &str = "x-wasmkeep-alarm-retry";
/// Marker: take the actor (ADR 0017); the signed body names the tenant.
pub const MARKER_TAKE: &str = "x-wasmkeep-take";
/// Marker: does the actor wait, through the actors it calls, on any actor
/// of the signed body (a call chain)? Its value is how many more nodes the
/// question may travel to. Answered by the node, never by a guest.
pub const MARKER_WAITS_FOR: &str = "x-wasmkeep-waits-for";
/// Most nodes a waits-for question travels through.
pub const WAITS_FOR_NODES_MAX: u32 = 8;
/// How long a node waits for a peer's answer to a waits-for question (the
/// call it asks for waits in a mailbox meanwhile, so nothing is delayed
/// but the detection; no answer means no cycle found).
const WAITS_FOR_TIME_MAX: Duration = Duration::from_secs(2);
/// Response header on a 503 from a draining node that no longer holds the
/// actor of a forwarded request: nothing ran there, so the sender may claim
/// the actor and run the request itself, once (ADR 0014). Guests cannot set it.
pub const HEADER_RELEASED: &str = "x-wasmkeep-released";
/// Response header naming the node that ran the event.
pub const HEADER_NODE: &str = "x-wasmkeep-node";
/// Response header naming the node that holds the actor: on a take's 409
/// (ADR 0017), and on a 503 from a peer that got a forwarded request or
/// relayed socket for an actor held by yet another node (nothing ran there;
/// the sender may send it to that node itself, once: ADR 0005, amended).
/// Guests cannot set it.
pub const HEADER_HOLDER: &str = "x-wasmkeep-holder";

/// What a peer's answer to a forwarded request asks of the sender, which
/// may still hold a copy of the request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HandBack {
    /// An answer like any other: it goes to the client.
    None,
    /// A 503 marked released: the draining peer handed the actor over;
    /// look it up again (ADR 0014).
    Released,
    /// A 503 naming the holder: the peer sees the actor held by that node.
    Moved(NodeId),
}

/// Reads the hand-back markers of a forwarded request's answer and removes
/// them (they never reach a client).
pub(crate) fn hand_back(response: &mut Response) -> HandBack {
    // One pass: markers are taken out whatever the status, read on a 503.
    let (mut released, mut holder) = (false, None);
    let read = response.status == 503;
    response.headers.retain_mut(|(name, value)| {
        if name.eq_ignore_ascii_case(HEADER_RELEASED) {
            released |= read;
            false
        } else if name.eq_ignore_ascii_case(HEADER_HOLDER) {
            if read {
                holder = NodeId::new(std::mem::take(value)).ok();
            }
            false
        } else {
            true
        }
    });
    match (released, holder) {
        (true, _) => HandBack::Released,
        (false, Some(holder)) => HandBack::Moved(holder),
        (false, None) => HandBack::None,
    }
}

/// Longest a hand-off or forward waits when the node has no better limit.
const ALARM_HAND_OFF_TIME_MAX: Duration = Duration::from_secs(10);
/// Refused signed calls are logged at most this often.
const REFUSED_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Longest call chain accepted from a peer (the guest limit applies too).
const CALL_CHAIN_ACTORS_MAX: usize = 64;

/// Characters of an actor name escaped in a path or a call chain.
const NAME_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// How a request reached this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// From a client (or a local actor): may be forwarded once.
    Client,
    /// A verified call from another node: never forwarded again.
    Forwarded { from: String },
}

/// A response and the node whose event produced it.
#[derive(Debug)]
pub struct Routed {
    pub response: Response,
    /// The node that ran the event: `None` for this one.
    pub ran_on: Option<String>,
}

/// What the verified markers of a request say.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Markers {
    /// The sender, when the call verified.
    pub from: Option<String>,
    pub forwarded: bool,
    pub call_chain: Option<Vec<ActorId>>,
    pub alarm_ms: Option<i64>,
    /// A handed-off alarm's retry count and due time.
    pub alarm_retry: Option<(u32, i64)>,
    /// A take call (ADR 0017).
    pub take: bool,
    /// A waits-for question, with the nodes it may still travel to.
    pub waits_for: Option<u32>,
}

impl Markers {
    pub fn hop(&self) -> Hop {
        match (&self.from, self.forwarded) {
            (Some(from), true) => Hop::Forwarded { from: from.clone() },
            _ => Hop::Client,
        }
    }
}

/// Judges a request's marker headers: a verified signed call's markers are
/// honoured; a refused one (bad, replayed, or no cluster key here) is an
/// ordinary request; a peer's call signed with a clock too far off is an
/// error (503), never served. Markers are never passed on to the guest.
pub fn judge(
    node: &Node,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Markers> {
    let signed = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(wasmkeep_cluster::signing::HEADER_SIGNATURE));
    if !signed {
        return Ok(Markers::default());
    }
    let verdict = match &node.peering.signer {
        Some(signer) => signer.verify(method, path, query, headers, body),
        None => Verdict::Refused("this node has no cluster key"),
    };
    Ok(match verdict {
        Verdict::Verified { from, markers } => {
            let find = |name: &str| {
                markers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            let call_chain = find(MARKER_CALL_CHAIN).and_then(|v| match decode_chain(v) {
                Ok(chain) => Some(chain),
                Err(e) => {
                    tracing::warn!(%from, error = %e, "ignoring a call chain that does not parse");
                    None
                }
            });
            Markers {
                forwarded: find(MARKER_FORWARDED) == Some("1"),
                alarm_ms: find(MARKER_ALARM).and_then(|v| v.parse().ok()),
                alarm_retry: find(MARKER_ALARM_RETRY).and_then(|v| match parse_retry(v) {
                    Some(retry) => Some(retry),
                    None => {
                        tracing::warn!(%from, value = v, "ignoring an alarm retry marker that does not parse");
                        None
                    }
                }),
                take: find(MARKER_TAKE) == Some("1"),
                waits_for: find(MARKER_WAITS_FOR).and_then(|v| v.parse().ok()),
                call_chain,
                from: Some(from),
            }
        }
        Verdict::Skewed { from, skew_ms } => {
            node.metrics.signed_skewed.inc();
            log_skewed(&from, skew_ms);
            return Err(skew_error(&from, skew_ms));
        }
        Verdict::Unsigned => Markers::default(),
        Verdict::Refused(reason) => {
            node.metrics.signed_refused.inc();
            log_refused(reason);
            Markers::default()
        }
    })
}

/// Reads [`MARKER_ALARM_RETRY`]'s `"COUNT DUE"`.
fn parse_retry(value: &str) -> Option<(u32, i64)> {
    let (count, due) = value.split_once(' ')?;
    Some((count.parse().ok()?, due.parse().ok()?))
}

/// True at most once per [`REFUSED_LOG_PERIOD`] for the log line `last`
/// keeps the time of.
fn log_due(last: &Mutex<Option<Instant>>) -> bool {
    let now = Instant::now();
    let mut last = last.lock();
    let due = last.is_none_or(|at| now.duration_since(at) >= REFUSED_LOG_PERIOD);
    if due {
        *last = Some(now);
    }
    due
}

fn log_skewed(from: &str, skew_ms: i64) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    if log_due(&LAST) {
        tracing::error!(
            from,
            skew_s = skew_ms as f64 / 1000.0,
            window_s = wasmkeep_cluster::signing::SIGNATURE_WINDOW.as_secs(),
            "refused a signed call: the clocks of this node and its sender disagree by more than the signature window; the call is answered 503 (fix the clocks: NTP). Logged at most every 10 s"
        );
    }
}

/// The answer to a peer's call refused for its clock: 503, never served as
/// a client's request (which would answer the client 401 where tenant
/// tokens are required, or act without the call's markers).
fn skew_error(from: &str, skew_ms: i64) -> Error {
    Error::Unavailable {
        reason: format!(
            "a call from node {from} was refused: its clock is {:.1} s off this node's, more than the {} s a signed call may be",
            skew_ms as f64 / 1000.0,
            wasmkeep_cluster::signing::SIGNATURE_WINDOW.as_secs()
        ),
        retry_after_s: SKEW_RETRY_AFTER_S,
    }
}

/// Retry-After of a call refused for its sender's clock.
const SKEW_RETRY_AFTER_S: u32 = 1;

fn log_refused(reason: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    if log_due(&LAST) {
        tracing::warn!(
            reason,
            "refused a signed call; it is served as an ordinary request without its markers (logged at most every 10 s)"
        );
    }
}

/// The path of an actor's request on any node: `/<tenant>/<class>/<name>` + `rest`.
pub fn actor_path(actor: &ActorId) -> String {
    format!(
        "/{}/{}/{}",
        actor.tenant,
        actor.class,
        utf8_percent_encode(actor.name(), NAME_ESCAPES)
    )
}

pub fn encode_chain(chain: &[ActorId]) -> String {
    chain
        .iter()
        .map(|a| utf8_percent_encode(&a.to_string(), NAME_ESCAPES).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

pub fn decode_chain(text: &str) -> std::result::Result<Vec<ActorId>, String> {
    let chain: Vec<ActorId> = text
        .split(',')
        .map(|part| {
            let id = percent_decode_str(part)
                .decode_utf8()
                .map_err(|_| format!("{part:?} is not UTF-8"))?;
            ActorId::parse(&id).map_err(|e| e.to_string())
        })
        .collect::<std::result::Result<_, _>>()?;
    if chain.is_empty() || chain.len() > CALL_CHAIN_ACTORS_MAX {
        return Err(format!("{} actors in a call chain", chain.len()));
    }
    Ok(chain)
}

fn split_query(path: &str) -> (&str, &str) {
    path.split_once('?').unwrap_or((path, ""))
}

/// The transport for node calls, or 503 with a clear log when this node has
/// no cluster key.
pub(crate) fn transport<'a>(
    node: &'a Node,
    actor: &ActorId,
    peer: &NodeId,
) -> Result<&'a Arc<dyn crate::peering::peer::PeerTransport>> {
    node.peering.transport.as_ref().ok_or_else(|| {
        tracing::warn!(%actor, %peer, "the actor is held by another node, but this node has no --cluster-key-file and cannot forward");
        Error::unavailable(format!(
            "actor {actor} is held by node {peer}; this node cannot forward (no cluster key)"
        ))
    })
}

/// Sends a request (or an actor call, when `chain` has more than the target)
/// to the peer that holds the actor: one hop, signed. A request that itself
/// arrived forwarded is not forwarded again (loop guard).
pub async fn forward_request(
    node: &Arc<Node>,
    actor: &ActorId,
    peer: &NodeId,
    url: &str,
    request: Request,
    chain: Vec<ActorId>,
    hop: Hop,
) -> Result<Routed> {
    if let Hop::Forwarded { from } = &hop {
        node.metrics.forward_loops.inc();
        tracing::info!(%actor, %peer, %from, "a forwarded request found the actor elsewhere again; 503 naming the holder instead of a second hop");
        return Err(Error::Moved {
            actor: actor.to_string(),
            holder: peer.clone(),
        });
    }
    let client = transport(node, actor, peer)?;
    let (rest, query) = split_query(&request.path);
    let mut markers = vec![(MARKER_FORWARDED.to_owned(), "1".to_owned())];
    if chain.len() > 1 {
        markers.push((MARKER_CALL_CHAIN.to_owned(), encode_chain(&chain)));
    }
    let method = http::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| Error::BadRequest(format!("method {:?} is not valid", request.method)))?;
    let call = PeerCall {
        method,
        path: format!("{}{rest}", actor_path(actor)),
        query: query.to_owned(),
        headers: request.headers,
        markers,
        body: Bytes::from(request.body),
        timeout: node.config.limits.forward_time_max,
    };
    let started = Instant::now();
    let limit = node.config.limits.forward_response_bytes_max;
    // The peer's request span is a child of this one (the transport sends
    // the current span as `traceparent`).
    let span = if crate::ops::telemetry::current_sampled() {
        tracing::info_span!(target: "wasmkeep::trace", "forward", otel.kind = "client", wasmkeep.peer = %peer)
    } else {
        tracing::Span::none()
    };
    let reply = match client.send(url, call, limit).instrument(span).await {
        Ok(reply) => reply,
        Err(e) => {
            let failed = peer_failed(node, actor, peer, &e.reason);
            if !e.may_have_arrived {
                return Err(failed);
            }
            // It may have run there, and its record may be durable.
            node.metrics.outcomes_unknown.inc();
            return Err(Error::OutcomeUnknown(format!(
                "node {peer}, which holds actor {actor}, may have run the request and did not answer: {}",
                e.reason
            )));
        }
    };
    let status = reply.status;
    let mut ran_on = peer.to_string();
    let mut headers = Vec::with_capacity(reply.headers.len());
    for (name, value) in reply.headers {
        if name.eq_ignore_ascii_case(HEADER_NODE) {
            ran_on = value;
        } else {
            headers.push((name, value));
        }
    }
    let body = reply.body;
    node.metrics.forwarded_requests.inc();
    crate::ops::metrics::observe(&node.metrics.forward_latency, started.elapsed());
    Ok(Routed {
        response: Response {
            status,
            headers,
            body,
        },
        ran_on: Some(ran_on),
    })
}

/// A failed call to a peer: suspect it, forget the hint, answer 503.
pub(crate) fn peer_failed(node: &Node, actor: &ActorId, peer: &NodeId, reason: &str) -> Error {
    node.metrics.forward_failures.inc();
    tracing::warn!(%actor, %peer, reason, "call to a peer failed; it is suspect for a while");
    node.peering.peers.mark_suspect(peer);
    node.forget_hints(actor);
    Error::unavailable(format!(
        "node {peer}, which holds actor {actor}, did not answer"
    ))
}

/// Hands an alarm to the node that holds the actor: a signed POST to the
/// actor's path with the alarm markers (its time, retry count and due
/// time). On success the alarm is no longer this node's concern.
pub async fn hand_off_alarm(
    node: &Arc<Node>,
    peer: &NodeId,
    fire: &crate::actor::alarms::Fire,
    due_ms: i64,
) -> Result<()> {
    let actor = &fire.actor;
    let url = match node.ensure_owner(actor).await? {
        Owner::Elsewhere { url, .. } => url,
        // Came back here meanwhile: deliver locally.
        Owner::Local(_) => return Box::pin(node.alarm_here(fire.clone(), due_ms)).await,
    };
    let client = transport(node, actor, peer)?;
    let call = PeerCall {
        method: http::Method::POST,
        path: format!("{}/", actor_path(actor)),
        query: String::new(),
        headers: Vec::new(),
        markers: vec![
            (MARKER_ALARM.to_owned(), fire.scheduled_ms.to_string()),
            (
                MARKER_ALARM_RETRY.to_owned(),
                format!("{} {due_ms}", fire.retry_count),
            ),
        ],
        body: Bytes::new(),
        timeout: ALARM_HAND_OFF_TIME_MAX.max(node.config.limits.event_time_max),
    };
    /// An alarm hand-off answers a line of text.
    const HAND_OFF_ANSWER_BYTES_MAX: usize = 4096;
    match client.send(&url, call, HAND_OFF_ANSWER_BYTES_MAX).await {
        Ok(reply) if (200..300).contains(&reply.status) => {
            node.metrics.alarm_hand_offs.inc();
            tracing::debug!(%actor, %peer, scheduled_ms = fire.scheduled_ms, retry_count = fire.retry_count, "alarm handed off");
            Ok(())
        }
        Ok(reply) => Err(Error::unavailable(format!(
            "node {peer} answered {} to an alarm hand-off for {actor}",
            reply.status
        ))),
        Err(e) => Err(peer_failed(node, actor, peer, &e.reason)),
    }
}

/// What a node call (a hand-off or a take) answers; never a guest's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAnswer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl NodeAnswer {
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        let mut body = body.into();
        body.push('\n');
        Self {
            status,
            headers: Vec::new(),
            body,
        }
    }
}

/// Asks `peer`, which holds `actor` as far as this node knows, whether
/// `actor` waits, through the actors it calls, on any of `callers`, the
/// question travelling to at most `nodes_left` more nodes. `None` when it
/// does not, or when no answer came (the caller then waits as before).
pub(crate) async fn ask_waits_for(
    node: &Node,
    peer: &NodeId,
    actor: &ActorId,
    callers: &[ActorId],
    nodes_left: u32,
) -> Option<ActorId> {
    let client = node.peering.transport.as_ref()?;
    let url = node.peering.peers.get(peer)?.heartbeat.advertise;
    let call = PeerCall {
        method: http::Method::POST,
        path: format!("{}/", actor_path(actor)),
        query: String::new(),
        headers: Vec::new(),
        markers: vec![(MARKER_WAITS_FOR.to_owned(), nodes_left.to_string())],
        body: Bytes::from(encode_chain(callers)),
        timeout: WAITS_FOR_TIME_MAX,
    };
    /// The answer is one actor name, or `free`.
    const WAITS_FOR_ANSWER_BYTES_MAX: usize = 4096;
    match client.send(&url, call, WAITS_FOR_ANSWER_BYTES_MAX).await {
        Ok(reply) if reply.status == 200 => {
            let text = String::from_utf8_lossy(&reply.body);
            let waited = text.trim().strip_prefix("waits ")?;
            decode_chain(waited).ok()?.pop()
        }
        Ok(reply) => {
            tracing::debug!(%actor, %peer, status = reply.status, "a waits-for question was not answered");
            None
        }
        Err(e) => {
            tracing::debug!(%actor, %peer, error = %e, "a waits-for question failed");
            None
        }
    }
}

/// The answer to a waits-for question: `waits <actor>` or `free`.
pub(crate) fn waits_for_answer(waited: Option<&ActorId>) -> NodeAnswer {
    match waited {
        Some(actor) => NodeAnswer::new(
            200,
            format!("waits {}", encode_chain(std::slice::from_ref(actor))),
        ),
        None => NodeAnswer::new(200, "free"),
    }
}

/// The receiving side of a hand-off: activate the actor here (if no other
/// node holds it) and arm the alarm unless a delivery of it as far along
/// (or of another committed alarm) is registered. `retry`: the delivery's
/// retry count and due time, when the sender said.
pub async fn receive_alarm(
    node: &Arc<Node>,
    actor: &ActorId,
    scheduled_ms: i64,
    retry: Option<(u32, i64)>,
) -> Result<()> {
    // The sender found this node named as the holder: the record decides,
    // not a hint of ours.
    node.forget_hints(actor);
    let (retry_count, due_ms) = retry.unwrap_or((0, scheduled_ms));
    let fire = crate::actor::alarms::Fire {
        actor: actor.clone(),
        scheduled_ms,
        retry_count,
    };
    match node.arm_then_activate(fire, due_ms).await {
        Err(Error::HeldElsewhere { node: peer }) => Err(Error::unavailable(format!(
            "actor {actor} is held by node {peer}; the alarm goes there"
        ))),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_chains_round_trip_any_name() {
        let chain = vec![
            ActorId::parse("demo/ks/a").expect("valid"),
            ActorId::parse("demo/ks/b, c/é%").expect("valid"),
        ];
        let text = encode_chain(&chain);
        assert!(!text.contains(' '));
        assert_eq!(decode_chain(&text).expect("decodes"), chain);
        assert!(decode_chain("demo/ks").is_err());
        assert!(decode_chain("%FF").is_err());
    }

    #[test]
    fn alarm_retry_markers_parse_count_then_due_time() {
        assert_eq!(parse_retry("2 1764900000000"), Some((2, 1_764_900_000_000)));
        assert_eq!(parse_retry("0 -5"), Some((0, -5)));
        for bad in ["", "2", "2 ", " 5", "-1 5", "2 5 6", "x 5", "2 5.0"] {
            assert_eq!(parse_retry(bad), None, "{bad:?}");
        }
    }

    fn answer(status: u16, headers: &[(&str, &str)]) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: Vec::new(),
        }
    }

    #[test]
    fn hand_backs_are_read_from_503s_only_and_never_reach_the_client() {
        let mut moved = answer(503, &[("X-Wasmkeep-Holder", "n3"), ("retry-after", "1")]);
        assert_eq!(
            hand_back(&mut moved),
            HandBack::Moved(NodeId::new("n3").expect("valid"))
        );
        assert_eq!(moved.headers, vec![("retry-after".into(), "1".into())]);

        let mut released = answer(503, &[(HEADER_RELEASED, "1"), (HEADER_HOLDER, "n3")]);
        assert_eq!(hand_back(&mut released), HandBack::Released);
        assert!(released.headers.is_empty());

        // An actor's own 503, a holder on another status, a malformed node id.
        for (status, headers) in [
            (503, vec![("content-type", "text/plain")]),
            (200, vec![(HEADER_HOLDER, "n3")]),
            (409, vec![(HEADER_RELEASED, "1")]),
            (503, vec![(HEADER_HOLDER, "not a node id")]),
        ] {
            let mut response = answer(status, &headers);
            assert_eq!(
                hand_back(&mut response),
                HandBack::None,
                "{status} {headers:?}"
            );
            assert!(
                response
                    .headers
                    .iter()
                    .all(|(n, _)| !n.starts_with("x-wasmkeep-")),
                "markers removed: {:?}",
                response.headers
            );
        }
    }

    #[test]
    fn actor_paths_escape_the_name() {
        let actor = ActorId::parse("demo/counter/a b/c").expect("valid");
        assert_eq!(actor_path(&actor), "/demo/counter/a%20b%2Fc");
        let routed = crate::front::route::route(&actor_path(&actor), None).expect("routes");
        assert_eq!(
            routed,
            crate::front::route::Route::Actor {
                actor,
                path: "/".into()
            }
        );
    }
}

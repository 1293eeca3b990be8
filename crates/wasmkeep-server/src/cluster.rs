//! The node's place in the cluster: the heartbeat (its node lease, ADR 0020)
//! and self-fencing when it lapses, the marker headers of signed node calls,
//! and the calls themselves: forwarded requests and actor calls (one hop,
//! with a loop guard) and alarm hand-offs (ADR 0005).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use tokio::time::Instant;
use wasmkeep_cluster::signing::Verdict;
use wasmkeep_runtime::{Request, Response};
use wasmkeep_transport::PeerCall;
use wasmkeep_types::heartbeat::{CAPABILITY_TAKE, ClassesServed, Heartbeat};
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
/// honoured; a refused one (bad, stale, replayed, or no cluster key here) is
/// an ordinary request. Markers are never passed on to the guest.
pub fn judge(
    node: &Node,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Markers {
    let signed = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(wasmkeep_cluster::signing::HEADER_SIGNATURE));
    if !signed {
        return Markers::default();
    }
    let verdict = match &node.signer {
        Some(signer) => signer.verify(method, path, query, headers, body),
        None => Verdict::Refused("this node has no cluster key"),
    };
    match verdict {
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
                call_chain,
                from: Some(from),
            }
        }
        Verdict::Unsigned => Markers::default(),
        Verdict::Refused(reason) => {
            node.metrics.signed_refused.fetch_add(1, Ordering::Relaxed);
            log_refused(reason);
            Markers::default()
        }
    }
}

/// Reads [`MARKER_ALARM_RETRY`]'s `"COUNT DUE"`.
fn parse_retry(value: &str) -> Option<(u32, i64)> {
    let (count, due) = value.split_once(' ')?;
    Some((count.parse().ok()?, due.parse().ok()?))
}

fn log_refused(reason: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let now = Instant::now();
    let mut last = LAST.lock();
    if last.is_none_or(|at| now.duration_since(at) >= REFUSED_LOG_PERIOD) {
        *last = Some(now);
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
) -> Result<&'a Arc<dyn crate::peer::PeerTransport>> {
    node.transport.as_ref().ok_or_else(|| {
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
        node.metrics.forward_loops.fetch_add(1, Ordering::Relaxed);
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
    let reply = match client.send(url, call, limit).await {
        Ok(reply) => reply,
        Err(e) => return Err(peer_failed(node, actor, peer, &e)),
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
    node.metrics
        .forwarded_requests
        .fetch_add(1, Ordering::Relaxed);
    node.metrics.forward_latency.observe(started.elapsed());
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
    node.metrics
        .forward_failures
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(%actor, %peer, reason, "call to a peer failed; it is suspect for a while");
    node.peers.mark_suspect(peer);
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
    fire: &crate::alarms::Fire,
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
            node.metrics.alarm_hand_offs.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%actor, %peer, scheduled_ms = fire.scheduled_ms, retry_count = fire.retry_count, "alarm handed off");
            Ok(())
        }
        Ok(reply) => Err(Error::unavailable(format!(
            "node {peer} answered {} to an alarm hand-off for {actor}",
            reply.status
        ))),
        Err(e) => Err(peer_failed(node, actor, peer, &e)),
    }
}

/// Answers a verified node call that is not an actor event: an alarm
/// hand-off or a take. `None` for anything else.
pub async fn node_call(
    node: &Arc<Node>,
    actor: &ActorId,
    markers: &Markers,
    body: &[u8],
) -> Result<Option<crate::moves::NodeAnswer>> {
    if markers.take {
        return Ok(Some(
            Box::pin(crate::moves::receive_take(node, actor, body)).await,
        ));
    }
    if let Some(scheduled_ms) = markers.alarm_ms {
        Box::pin(receive_alarm(
            node,
            actor,
            scheduled_ms,
            markers.alarm_retry,
        ))
        .await?;
        return Ok(Some(crate::moves::NodeAnswer::new(200, "alarm armed")));
    }
    Ok(None)
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
    match node.ensure_owner(actor).await? {
        Owner::Local(_) => {
            // Activation armed the committed alarm; the mailbox runs a
            // delivery only if it matches the committed one.
            let (retry_count, due_ms) = retry.unwrap_or((0, scheduled_ms));
            node.timer.adopt_retry(
                crate::alarms::Fire {
                    actor: actor.clone(),
                    scheduled_ms,
                    retry_count,
                },
                due_ms,
            );
            Ok(())
        }
        Owner::Elsewhere { peer, .. } => Err(Error::unavailable(format!(
            "actor {actor} is held by node {peer}; the alarm goes there"
        ))),
    }
}

/// This node's heartbeat now.
fn heartbeat(node: &Node) -> Heartbeat {
    Heartbeat {
        node: node.node_id.clone(),
        advertise: node.advertise.clone(),
        app: node.config.app.clone(),
        // Filled in by the lease.
        incarnation: String::new(),
        state: node.node_state(),
        classes: match &node.config.classes {
            None => ClassesServed::All,
            Some(list) => ClassesServed::Only(list.iter().cloned().collect()),
        },
        resident_actors: node.resident_count() as u64,
        drain: node.drain.state(),
        secrets: node.secrets.readable(),
        // A node without the cluster key cannot verify a take call.
        capabilities: if node.signer.is_some() {
            [CAPABILITY_TAKE.to_owned()].into()
        } else {
            Default::default()
        },
        generation: 0,
        sockets_closing: count(&node.metrics.sockets_closing),
        releases_failed: count(&node.metrics.leftover_holds),
        holder: node.config.holder.clone().unwrap_or_default(),
    }
}

fn count(gauge: &std::sync::atomic::AtomicI64) -> u64 {
    u64::try_from(gauge.load(Ordering::Relaxed)).unwrap_or(0)
}

/// Renews the node lease once (writes the heartbeat).
/// The process's first heartbeat: claims the node id, waiting up to a lease
/// TTL (and the observers' margin) when another process may still hold it,
/// and refusing it when that process is alive (ADR 0054).
pub async fn claim(node: &Node) -> Result<()> {
    let _writing = node.heartbeat_lock.lock().await;
    let key = node.keys.node(&node.node_id);
    let ttl = node.config.lease_ttl;
    let unchanged_for = ttl + wasmkeep_cluster::lease::LeaseObserver::default_margin(ttl);
    let claimed = node
        .lease
        .claim(
            &*node.bucket,
            &key,
            heartbeat(node),
            node.config.holder.as_deref(),
            unchanged_for,
            node.config.heartbeat_period,
        )
        .await;
    counted(node, claimed)
}

/// Counts a heartbeat write in the lease metrics.
fn counted(node: &Node, written: std::result::Result<(), wasmkeep_cluster::Error>) -> Result<()> {
    match written {
        Ok(()) => {
            node.metrics.lease_renewals.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            node.metrics.lease_failures.fetch_add(1, Ordering::Relaxed);
            Err(e.into())
        }
    }
}

pub async fn renew(node: &Node) -> Result<()> {
    let _writing = node.heartbeat_lock.lock().await;
    if *node.resigned_tx.borrow() {
        return Ok(());
    }
    let key = node.keys.node(&node.node_id);
    let renewal = node.lease.renew(&*node.bucket, &key, heartbeat(node));
    // A renewal whose answer comes after the lease ran out must not revive
    // it: peers may have called the lease expired meanwhile and taken its
    // actors, and the node itself may not have looked (found by the
    // simulation, seed 93 of mixed_drains_moves_crashes_partitions: a pause
    // held the write past the lapse, the late success kept the incarnation,
    // and the node took an actor a peer then took over). Past the end the
    // renewal is abandoned; the next heartbeat finds the lease lapsed, drops
    // every actor and rejoins. An incarnation never valid yet ends one TTL
    // after its first write was tried (see `unproven_for_too_long`).
    let renewed = match node.lease.valid_until().or_else(|| unproven_until(node)) {
        Some(until) => tokio::select! {
            biased;
            () = tokio::time::sleep_until(until) => Err(wasmkeep_cluster::Error::LeaseInvalid),
            renewed = renewal => renewed,
        },
        None => renewal.await,
    };
    if renewed.is_ok() {
        *node.unproven.lock() = None;
    }
    counted(node, renewed)
}

/// For an incarnation whose lease was never valid: one TTL after its first
/// heartbeat write was tried (that try is noted now if it is this one).
fn unproven_until(node: &Node) -> Option<Instant> {
    let incarnation = node.lease.incarnation();
    let mut unproven = node.unproven.lock();
    let since = match &*unproven {
        Some((of, since)) if *of == incarnation => *since,
        _ => {
            let now = node.clock.now();
            *unproven = Some((incarnation, now));
            now
        }
    };
    Some(since + node.config.lease_ttl)
}

/// Whether the current incarnation's lease was never valid and its first
/// heartbeat write was tried a TTL ago or more. That write may have landed
/// with its answer lost, and peers that saw it unchanged for a TTL call the
/// incarnation expired; were a later renewal to make it valid, they would
/// take its actors. The node then starts over with a new incarnation (found
/// by the simulation, seed 4560 of mixed_drains_moves_crashes_partitions).
fn unproven_for_too_long(node: &Node) -> bool {
    if node.lease.valid_until().is_some() {
        return false;
    }
    let incarnation = node.lease.incarnation();
    node.unproven.lock().as_ref().is_some_and(|(of, since)| {
        *of == incarnation && node.clock.now() >= *since + node.config.lease_ttl
    })
}

/// Ends the lease at a clean shutdown (after the actors were released),
/// waiting for the heartbeat's delete until `deadline` at most.
pub async fn resign(node: &Node, deadline: tokio::time::Instant) {
    let _writing = node.heartbeat_lock.lock().await;
    let _ = node.resigned_tx.send(true);
    let key = node.keys.node(&node.node_id);
    match tokio::time::timeout_at(deadline, node.lease.resign(&*node.bucket, &key)).await {
        Ok(Ok(true)) => tracing::info!("lease resigned: heartbeat deleted"),
        Ok(Ok(false)) => tracing::info!("the lease had lapsed; its heartbeat expires by itself"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "deleting the heartbeat failed; it expires after the TTL")
        }
        Err(_) => tracing::warn!("deleting the heartbeat took too long; it expires after the TTL"),
    }
}

/// The heartbeat: every period, renew the lease, then refresh the peers.
/// A lease that lapsed (the bucket unreachable for longer than the TTL)
/// makes the node drop every actor without releasing, rejoin with a new
/// incarnation and renew again. Runs until the lease is resigned.
pub async fn heartbeat_loop(node: Arc<Node>) {
    let mut resigned = node.resigned_tx.subscribe();
    let period = node.config.heartbeat_period;
    loop {
        tokio::select! {
            // Checked in order: a run replays the same way (ADR 0006).
            biased;
            _ = tokio::time::sleep(period) => {}
            _ = resigned.changed() => {}
        }
        if *resigned.borrow() {
            return;
        }
        if unproven_for_too_long(&node) {
            // No actor was acquired under it: nothing to drop.
            node.lease.rejoin();
            tracing::warn!(incarnation = %node.lease.incarnation(), "the lease never became valid within a TTL: rejoined with a new incarnation");
        }
        if node.lease.is_lapsed() {
            tracing::error!(
                resident = node.resident_count(),
                "this node's lease lapsed (the bucket was unreachable longer than the lease TTL): dropping every actor and rejoining"
            );
            node.drop_every_actor().await;
            node.lease.rejoin();
            tracing::info!(incarnation = %node.lease.incarnation(), "rejoined with a new incarnation");
        }
        // A bucket that hangs must not hold the loop past a lapse: the next
        // tick then drops the actors. A write cut off here may land later;
        // the lease adopts its own late writes (and rejoins write afresh).
        let bucket_time_max = node.config.lease_ttl;
        // The drain state first, so this renewal already reports it. A slow
        // bucket must not delay the renewal by more than one period.
        let drain_check_time_max = node.config.heartbeat_period.min(bucket_time_max);
        if tokio::time::timeout(drain_check_time_max, crate::drain::check(&node))
            .await
            .is_err()
        {
            tracing::warn!("reading the drain key timed out");
        }
        if tokio::time::timeout(
            drain_check_time_max,
            node.secrets.refresh(&*node.bucket, &node.keys),
        )
        .await
        .is_err()
        {
            tracing::warn!("refreshing the app's secrets timed out");
        }
        match tokio::time::timeout(bucket_time_max, renew(&node)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease renewal failed"),
            Err(_) => {
                node.metrics.lease_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(timeout = ?bucket_time_max, "lease renewal timed out");
            }
        }
        match tokio::time::timeout(bucket_time_max, node.peers.refresh())
            .await
            .unwrap_or_else(|_| {
                Err(wasmkeep_cluster::Error::Bucket(
                    wasmkeep_bucket::Error::Unavailable {
                        key: node.keys.nodes_prefix(),
                        reason: "the peer refresh timed out".into(),
                    },
                ))
            }) {
            Ok(()) => {
                let live = node
                    .peers
                    .all()
                    .iter()
                    .filter(|p| p.live && p.heartbeat.node != node.node_id)
                    .count();
                node.metrics
                    .peers_live
                    .store(i64::try_from(live).unwrap_or(i64::MAX), Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "peer refresh failed"),
        }
        if tokio::time::timeout(bucket_time_max, crate::leftovers::release(&node))
            .await
            .is_err()
        {
            tracing::warn!("giving back leftover ownership records timed out");
        }
        // Move keys, with the peers just refreshed (targets' line 11).
        control_passes(&node, bucket_time_max).await;
    }
}

/// The passes over the move and the delete keys, on one listing of
/// `control/` (one LIST per heartbeat, not one per pass; the drain keys in
/// it are read by the drain check, each node its own).
async fn control_passes(node: &Arc<Node>, time_max: Duration) {
    let moves = crate::moves::wanted(node);
    let deletes = crate::deletes::wanted(node);
    if !moves && !deletes {
        return;
    }
    let listed =
        match tokio::time::timeout(time_max, node.bucket.list(&node.keys.control_prefix())).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "listing the control keys failed");
                return;
            }
            Err(_) => {
                tracing::warn!("listing the control keys timed out");
                return;
            }
        };
    let (moves_prefix, deletes_prefix) = (node.keys.moves_prefix(), node.keys.deletes_prefix());
    let (move_keys, delete_keys): (Vec<_>, Vec<_>) = listed
        .into_iter()
        .filter(|meta| meta.key.starts_with(&moves_prefix) || meta.key.starts_with(&deletes_prefix))
        .partition(|meta| meta.key.starts_with(&moves_prefix));
    if moves
        && tokio::time::timeout(time_max, crate::moves::check(node, move_keys))
            .await
            .is_err()
    {
        tracing::warn!("the pass over the move keys timed out");
    }
    if deletes
        && tokio::time::timeout(time_max, crate::deletes::check(node, delete_keys))
            .await
            .is_err()
    {
        tracing::warn!("the pass over the delete keys timed out");
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
        let routed = crate::route::route(&actor_path(&actor), None).expect("routes");
        assert_eq!(
            routed,
            crate::route::Route::Actor {
                actor,
                path: "/".into()
            }
        );
    }
}

//! WebSockets: an upgrade on an actor path opens a socket to the actor. Each
//! message and the close become events of the actor; the guest writes back
//! through the host (released after the event's output gate).

use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, handshake::derive_accept_key};
use wasmkeep_runtime::Message;
use wasmkeep_types::ActorId;

use crate::actor::orders::Job;
use crate::actor::socket_table::{CLOSE_HANDSHAKE_TIME_MAX, Outgoing, SocketEntry};
use crate::front::relay::{self, Relayed};
use crate::node::{Node, Owner, Stub};
use crate::peering::forward::Hop;
use crate::{Error, Result};

/// Bytes each read from a socket may fill. tungstenite's default, 128 KiB,
/// is zero-filled before every read: a `memset` of 128 KiB per message
/// (5 % of the node's CPU in a WebSocket echo at one connection), and
/// 128 KiB of resident memory for every open socket. A larger message
/// takes several reads (its whole length is reserved at its header).
const SOCKET_READ_BUFFER_BYTES: usize = 8 * 1024;

/// Whether the request asks for a WebSocket upgrade.
pub fn is_upgrade(req: &hyper::Request<Incoming>) -> bool {
    let has = |name: &str, token: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    has("connection", "upgrade") && has("upgrade", "websocket")
}

/// Accepts the upgrade: registers the socket with the actor and answers 101.
/// On a node that does not hold the actor, the socket is relayed to the
/// node that does (`path` is the actor-relative path with its query).
pub async fn upgrade(
    node: &Arc<Node>,
    actor: &ActorId,
    path: &str,
    mut req: hyper::Request<Incoming>,
    hop: Hop,
) -> Result<hyper::Response<Full<Bytes>>> {
    if req.method() != hyper::Method::GET {
        return Err(Error::BadRequest(
            "a WebSocket upgrade must be a GET".into(),
        ));
    }
    if req
        .headers()
        .get("sec-websocket-version")
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        return Err(Error::BadRequest("sec-websocket-version must be 13".into()));
    }
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| k.as_bytes().to_vec())
    else {
        return Err(Error::BadRequest("sec-websocket-key is missing".into()));
    };
    if matches!(hop, Hop::Forwarded { .. }) {
        // Relayed here by a node that found this one holding the actor.
        node.forget_hints(actor);
    }
    let limits = &node.config.limits;
    // A peer may hand the upgrade back naming another holder: one more try.
    let mut hand_back_retry = true;
    let (stub, id, rx) = loop {
        // While the actor moves, reconnecting clients go to the target, even
        // before the hand-over: they must not land back here (ADR 0017).
        let moving_to = match node.peering.moves.target(actor) {
            Some(target) if hop == Hop::Client && target != node.node_id => node
                .peering
                .peers
                .get(&target)
                .map(|peer| Owner::Elsewhere {
                    peer: target,
                    url: peer.heartbeat.advertise,
                }),
            _ => None,
        };
        let owner = match moving_to {
            Some(owner) => owner,
            None => node.ensure_owner(actor).await?,
        };
        let stub = match owner {
            Owner::Local(stub) => stub,
            Owner::Elsewhere { peer, url } => {
                match relay::relay(node, actor, &peer, &url, path, req, &hop, &key).await? {
                    Relayed::Upgraded(response) => return Ok(response),
                    Relayed::Moved { req: back, holder } if hand_back_retry => {
                        hand_back_retry = false;
                        node.learn_holder(actor, &holder);
                        req = back;
                        continue;
                    }
                    Relayed::Moved { holder, .. } => {
                        return Err(Error::unavailable(format!(
                            "actor {actor} is moving between nodes (node {holder} holds it now); retry"
                        )));
                    }
                }
            }
        };
        if stub.open_sockets() >= limits.sockets_per_actor_max {
            return Err(Error::unavailable(format!(
                "actor {actor} has {} open sockets, the limit",
                limits.sockets_per_actor_max
            )));
        }
        let id = node.front.next_socket_id();
        let (tx, rx) = mpsc::channel(limits.socket_outbox_messages_max);
        stub.sockets.lock().sockets.insert(
            id,
            SocketEntry {
                tx,
                tag: None,
                closing: false,
            },
        );
        // The actor may have begun hibernating before the socket was added:
        // then look again (the next stub activates it anew).
        if node.residents.is_live(&stub) {
            break (stub, id, rx);
        }
        stub.sockets.lock().sockets.remove(&id);
        tokio::task::yield_now().await;
    };
    stub.metrics.sockets_open.inc();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let node = Arc::clone(node);
    // Only the message size is limited: a frame over it is read whole, so the
    // client can read the 1009 close that follows.
    let config = WebSocketConfig::default()
        .max_message_size(Some(limits.socket_message_bytes_max))
        .read_buffer_size(SOCKET_READ_BUFFER_BYTES);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                run_socket(&node, &stub, id, ws, rx).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "websocket upgrade failed");
                if stub.sockets.lock().remove_closed(id) {
                    stub.metrics.sockets_open.dec();
                }
            }
        }
    });
    let response = hyper::Response::builder()
        .status(101)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", derive_accept_key(&key))
        .body(Full::new(Bytes::new()))
        .map_err(|e| Error::BadRequest(e.to_string()))?;
    Ok(response)
}

async fn run_socket<S>(
    node: &Arc<Node>,
    stub: &Arc<Stub>,
    id: u64,
    mut ws: WebSocketStream<S>,
    mut rx: mpsc::Receiver<Outgoing>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (code, reason) = loop {
        tokio::select! {
            incoming = ws.next() => match incoming {
                Some(Ok(tungstenite::Message::Text(text))) => {
                    stub.metrics.socket_messages.inc();
                    if !forward(stub, Job::SocketMessage { id, message: Message::Text(text.to_string()) }).await {
                        break (1011, "actor unavailable".to_owned());
                    }
                }
                Some(Ok(tungstenite::Message::Binary(bytes))) => {
                    stub.metrics.socket_messages.inc();
                    if !forward(stub, Job::SocketMessage { id, message: Message::Binary(bytes.to_vec()) }).await {
                        break (1011, "actor unavailable".to_owned());
                    }
                }
                Some(Ok(tungstenite::Message::Close(frame))) => {
                    let (code, reason) = frame.map(|f| (u16::from(f.code), f.reason.to_string())).unwrap_or((1005, String::new()));
                    break (code, reason);
                }
                Some(Ok(_)) => {} // ping/pong: tungstenite answers pings itself
                Some(Err(tungstenite::Error::Capacity(e))) => {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::Size, reason: "message too large".into() })).await;
                    break (1009, e.to_string());
                }
                // RFC 6455 7.4.1: a text message that is not UTF-8 is
                // failed with 1007, a protocol violation with 1002.
                Some(Err(tungstenite::Error::Utf8(e))) => {
                    let reason = "a text message was not UTF-8";
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::Invalid, reason: reason.into() })).await;
                    break (1007, format!("{reason}: {e}"));
                }
                Some(Err(tungstenite::Error::Protocol(e))) => {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::Protocol, reason: "protocol error".into() })).await;
                    break (1002, e.to_string());
                }
                Some(Err(e)) => break (1006, e.to_string()),
                None => break (1006, "connection closed".to_owned()),
            },
            out = rx.recv() => match out {
                Some(Outgoing::Message(Message::Text(text))) => {
                    if let Err(e) = ws.send(tungstenite::Message::text(text)).await {
                        break (1006, e.to_string());
                    }
                }
                Some(Outgoing::Message(Message::Binary(bytes))) => {
                    if let Err(e) = ws.send(tungstenite::Message::binary(bytes)).await {
                        break (1006, e.to_string());
                    }
                }
                Some(Outgoing::Close(code, reason)) => {
                    let frame = CloseFrame { code: CloseCode::from(code), reason: reason.clone().into() };
                    if ws.close(Some(frame)).await.is_ok() {
                        await_close_reply(node, &mut ws).await;
                    }
                    break (code, reason);
                }
                None => break (1011, "socket dropped".to_owned()),
            },
        }
    };
    // Whoever removes the entry reports the close: here, unless the mailbox
    // already closed every socket (hand-over), which reports them itself.
    let removed = stub.sockets.lock().remove_closed(id);
    if removed {
        stub.metrics.sockets_open.dec();
        let _ = forward(stub, Job::SocketClose { id, code, reason }).await;
    }
    // Drain writes queued before the close (e.g. the 1012 of a shutdown).
    while let Ok(out) = rx.try_recv() {
        if let Outgoing::Close(code, reason) = out {
            let _ = ws
                .close(Some(CloseFrame {
                    code: CloseCode::from(code),
                    reason: reason.into(),
                }))
                .await;
        }
    }
    let _ = ws.flush().await;
}

/// After this node sent a close frame: waits for the client's close frame
/// (or the connection's end), at most [`CLOSE_HANDSHAKE_TIME_MAX`], so the
/// client learns the code before the connection drops. A hand-over keeps the
/// actor (and its ownership record) meanwhile.
async fn await_close_reply<S>(node: &Node, ws: &mut WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    node.metrics.sockets_closing.inc();
    let reply = async {
        while let Some(Ok(message)) = ws.next().await {
            if matches!(message, tungstenite::Message::Close(_)) {
                break;
            }
        }
    };
    if tokio::time::timeout(CLOSE_HANDSHAKE_TIME_MAX, reply)
        .await
        .is_err()
    {
        tracing::debug!("a client did not answer the close frame in time");
    }
    node.metrics.sockets_closing.dec();
}

/// Sends a socket event to the actor, waiting for room (back-pressure on
/// the client). False when the actor's mailbox is gone.
async fn forward(stub: &Stub, job: Job) -> bool {
    stub.tx.send(Box::new(job)).await.is_ok()
}

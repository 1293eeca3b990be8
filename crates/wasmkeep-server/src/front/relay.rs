//! WebSocket relay: an upgrade on a node that does not hold the actor opens a
//! WebSocket to the holder (a signed call with the forwarded marker, over TLS
//! for `https` peers) and pipes messages both ways until either side closes.
//! The client is answered `101` only once the holder accepted, so a holder
//! that refuses or is unreachable gives the client a plain `503`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use wasmkeep_types::{ActorId, NodeId};

use crate::node::Node;
use crate::peering::forward::{
    HEADER_HOLDER, HEADER_NODE, Hop, MARKER_FORWARDED, actor_path, peer_failed,
};
use crate::{Error, Result};

/// Longest the connection and handshake to the holder may take.
const RELAY_CONNECT_TIME_MAX: Duration = Duration::from_secs(10);

use wasmkeep_transport::stream::PeerIo;

/// How a relay ended, when it did not fail.
pub enum Relayed {
    /// The answer to send the client (101: messages are piped both ways).
    Upgraded(hyper::Response<Full<Bytes>>),
    /// The peer handed the upgrade back naming the holder it sees (503 with
    /// `x-wasmkeep-holder`): nothing was opened, and the request comes back
    /// for one more try there.
    Moved {
        req: hyper::Request<Incoming>,
        holder: NodeId,
    },
}

/// Relays the upgrade `req` for `actor` to `peer` at `url`; `key` is the
/// client's `sec-websocket-key`.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
pub async fn relay(
    node: &Arc<Node>,
    actor: &ActorId,
    peer: &NodeId,
    url: &str,
    path: &str,
    mut req: hyper::Request<Incoming>,
    hop: &Hop,
    key: &[u8],
) -> Result<Relayed> {
    if let Hop::Forwarded { from } = hop {
        node.metrics.forward_loops.inc();
        tracing::info!(%actor, %peer, %from, "a relayed socket found the actor elsewhere again; 503 naming the holder instead of a second hop");
        return Err(Error::Moved {
            actor: actor.to_string(),
            holder: peer.clone(),
        });
    }
    let Some(signer) = &node.peering.signer else {
        tracing::warn!(%actor, %peer, "the actor is held by another node, but this node has no --cluster-key-file and cannot relay");
        return Err(Error::unavailable(format!(
            "actor {actor} is held by node {peer}; this node cannot relay (no cluster key)"
        )));
    };
    let (rest, query) = path.split_once('?').unwrap_or((path, ""));
    let full_path = format!("{}{rest}", actor_path(actor));
    let markers = vec![(MARKER_FORWARDED.to_owned(), "1".to_owned())];
    let signed = signer.sign("GET", &full_path, query, &markers, b"");
    let protocol = req.headers().get("sec-websocket-protocol").cloned();
    let config = WebSocketConfig::default()
        .max_message_size(Some(node.config.limits.socket_message_bytes_max));
    let connected = tokio::time::timeout(
        RELAY_CONNECT_TIME_MAX,
        connect(
            node,
            url,
            &full_path,
            query,
            &signed,
            protocol.as_ref(),
            config,
        ),
    )
    .await;
    let (upstream, accepted_protocol) = match connected {
        Ok(Ok(done)) => done,
        Ok(Err(RelayError::Refused {
            status: 503,
            holder: Some(holder),
        })) => return Ok(Relayed::Moved { req, holder }),
        Ok(Err(RelayError::Refused { status, .. })) => {
            // The holder answered but did not upgrade (e.g. 503 while it
            // moves): not the peer's fault, so it is not made suspect.
            return Err(Error::unavailable(format!(
                "node {peer} refused the relayed socket for {actor} with {status}"
            )));
        }
        Ok(Err(RelayError::Failed(reason))) => {
            return Err(peer_failed(node, actor, peer, &reason));
        }
        Err(_) => {
            return Err(peer_failed(
                node,
                actor,
                peer,
                "the relayed socket's handshake timed out",
            ));
        }
    };
    node.metrics.relayed_sockets.inc();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let actor_for_log = actor.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let client = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                pipe(client, upstream).await;
                tracing::debug!(actor = %actor_for_log, "relayed socket closed");
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
        }
    });
    let mut response = hyper::Response::builder()
        .status(101)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", derive_accept_key(key))
        // The holder runs the socket's events.
        .header(HEADER_NODE, peer.as_str());
    if let Some(protocol) = accepted_protocol {
        response = response.header("sec-websocket-protocol", protocol);
    }
    response
        .body(Full::new(Bytes::new()))
        .map(Relayed::Upgraded)
        .map_err(|e| Error::BadRequest(e.to_string()))
}

enum RelayError {
    /// The holder answered without upgrading; a 503 may name the node that
    /// holds the actor as it sees it.
    Refused { status: u16, holder: Option<NodeId> },
    /// No answer: connection, TLS or protocol failure.
    Failed(String),
}

/// Opens the WebSocket to the holder.
async fn connect(
    node: &Node,
    url: &str,
    path: &str,
    query: &str,
    signed: &[(String, String)],
    protocol: Option<&hyper::header::HeaderValue>,
    config: WebSocketConfig,
) -> std::result::Result<
    (
        WebSocketStream<Box<dyn PeerIo>>,
        Option<hyper::header::HeaderValue>,
    ),
    RelayError,
> {
    let failed = |what: &str, e: &dyn std::fmt::Display| RelayError::Failed(format!("{what}: {e}"));
    let wasmkeep_transport::stream::PeerStream {
        io: stream,
        authority,
        secure: tls,
    } = wasmkeep_transport::stream::connect(url, &node.peering.tls_client)
        .await
        .map_err(|e| RelayError::Failed(e.to_string()))?;
    let scheme = if tls { "wss" } else { "ws" };
    let target = if query.is_empty() {
        format!("{scheme}://{authority}{path}")
    } else {
        format!("{scheme}://{authority}{path}?{query}")
    };
    let mut request = http::Request::builder()
        .method("GET")
        .uri(&target)
        .header("host", &authority)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", generate_key());
    for (name, value) in signed {
        request = request.header(name.as_str(), value.as_str());
    }
    if let Some(protocol) = protocol {
        request = request.header("sec-websocket-protocol", protocol.clone());
    }
    let request = request
        .body(())
        .map_err(|e| failed("building the relay request", &e))?;
    match tokio_tungstenite::client_async_with_config(request, stream, Some(config)).await {
        Ok((ws, response)) => {
            let accepted = response.headers().get("sec-websocket-protocol").cloned();
            Ok((ws, accepted))
        }
        Err(tungstenite::Error::Http(response)) => {
            let holder = response
                .headers()
                .get(HEADER_HOLDER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| NodeId::new(v).ok());
            Err(RelayError::Refused {
                status: response.status().as_u16(),
                holder,
            })
        }
        Err(e) => Err(failed("WebSocket handshake", &e)),
    }
}

/// Pipes messages both ways until either side closes; the close frame is
/// passed on to the other side.
async fn pipe<A, B>(mut client: WebSocketStream<A>, mut upstream: WebSocketStream<B>)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        tokio::select! {
            from_client = client.next() => match from_client {
                Some(Ok(Message::Close(frame))) => {
                    let _ = upstream.close(frame).await;
                    break;
                }
                Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => {
                    if upstream.send(message).await.is_err() {
                        let _ = client.close(None).await;
                        break;
                    }
                }
                // Pings are answered by each side's own WebSocket.
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let _ = upstream.close(None).await;
                    break;
                }
            },
            from_upstream = upstream.next() => match from_upstream {
                Some(Ok(Message::Close(frame))) => {
                    let _ = client.close(frame).await;
                    break;
                }
                Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => {
                    if client.send(message).await.is_err() {
                        let _ = upstream.close(None).await;
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let _ = client.close(None).await;
                    break;
                }
            },
        }
    }
    let _ = client.flush().await;
    let _ = upstream.flush().await;
}

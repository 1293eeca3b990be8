//! [`SimTransport`]: the network between simulated nodes. A node call is
//! signed with the cluster's real signer (the nodes share a key) and
//! delivered in process to the target node's
//! `wasmkeep_server::front::http::answer_call`, the same checks and dispatch an
//! HTTP request meets, after a seeded delay; the request or the answer may be
//! lost (seeded), and a partition between two nodes, or a crashed
//! process at either end, refuses the call. WebSocket relays are not
//! simulated (they are HTTP upgrades only).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wasmkeep_cluster::Signer;
use wasmkeep_server::peering::peer::{CallFailed, PeerReply, PeerTransport};
use wasmkeep_transport::PeerCall;

use crate::World;

/// The port of node `index`'s advertised URL is `BASE_PORT + index`.
pub const BASE_PORT: usize = 7000;

/// The advertised URL of node `index`.
pub fn advertise_url(index: usize) -> String {
    format!("http://127.0.0.1:{}", BASE_PORT + index)
}

fn index_of_url(url: &str) -> Option<usize> {
    let port: usize = url.trim_end_matches('/').rsplit(':').next()?.parse().ok()?;
    port.checked_sub(BASE_PORT)
}

/// One node process's outgoing calls.
pub struct SimTransport {
    world: Arc<World>,
    from: usize,
    signer: Arc<Signer>,
    /// This process's liveness: a crashed process sends nothing.
    alive: Arc<AtomicBool>,
}

impl SimTransport {
    pub fn new(
        world: Arc<World>,
        from: usize,
        signer: Arc<Signer>,
        alive: Arc<AtomicBool>,
    ) -> Self {
        Self {
            world,
            from,
            signer,
            alive,
        }
    }
}

#[async_trait::async_trait]
impl PeerTransport for SimTransport {
    async fn send(
        &self,
        url: &str,
        call: PeerCall,
        body_bytes_max: usize,
    ) -> Result<PeerReply, CallFailed> {
        let to = index_of_url(url)
            .ok_or_else(|| CallFailed::not_sent(format!("no simulated node at {url}")))?;
        let what = format!(
            "call n{} -> n{to} {} {}{}",
            self.from,
            call.method,
            call.path,
            call.markers
                .iter()
                .map(|(n, v)| format!(" {n}={v}"))
                .collect::<String>()
        );
        let (lost_request, lost_reply, delay, back) = self.world.network_draw();
        let deliver = async {
            tokio::time::sleep(delay).await;
            if !self.alive.load(Ordering::SeqCst) {
                return Err(CallFailed::not_sent("the sending process crashed"));
            }
            if self.world.is_cut(self.from, to) {
                return Err(CallFailed::not_sent("connection timed out (partition)"));
            }
            if lost_request {
                return Err(CallFailed::not_sent("connection reset (request lost)"));
            }
            let Some(target) = self.world.node(to) else {
                return Err(CallFailed::not_sent("connection refused (node down)"));
            };
            let mut headers: Vec<(String, String)> = call
                .headers
                .iter()
                .filter(|(n, _)| !wasmkeep_cluster::signing::is_marker(n))
                .cloned()
                .collect();
            headers.extend(self.signer.sign(
                call.method.as_str(),
                &call.path,
                &call.query,
                &call.markers,
                &call.body,
            ));
            let reply = wasmkeep_server::front::http::answer_call(
                &target.node,
                call.method.as_str(),
                &call.path,
                &call.query,
                headers,
                call.body.to_vec(),
            )
            .await;
            let take = call
                .markers
                .iter()
                .any(|(n, v)| n == wasmkeep_server::peering::forward::MARKER_TAKE && v == "1");
            if take && reply.status == 200 {
                // The move is done as far as the old owner will know.
                self.world.take_answered(to, &call.path);
            }
            if take
                && reply.status == 409
                && reply.header(wasmkeep_server::peering::moves::HEADER_HOLDER)
                    == Some(format!("n{}", self.from).as_str())
                && self.alive.load(Ordering::SeqCst)
            {
                // The sender released the actor for this take, yet holds it.
                // Only while the sending process lives: a take can outlive
                // it (the target's bucket stalled), and the node's next
                // incarnation claims a free actor as any node may (seed 5308
                // of move_under_concurrent_events_with_an_alarm_due: a take
                // sent before a crash was answered 9 s later, naming the
                // restarted node).
                self.world
                    .take_found_sender_holding(self.from, to, &call.path);
            }
            tokio::time::sleep(back).await;
            if lost_reply || self.world.is_cut(self.from, to) || !self.alive.load(Ordering::SeqCst)
            {
                return Err(CallFailed::unanswered("connection reset (reply lost)"));
            }
            if reply.body.len() > body_bytes_max {
                return Err(CallFailed::unanswered(
                    "the answer is larger than the limit",
                ));
            }
            Ok(reply)
        };
        let result = match tokio::time::timeout(call.timeout, deliver).await {
            Ok(result) => result,
            Err(_) => Err(CallFailed::unanswered("timed out")),
        };
        let outcome = match &result {
            Ok(reply) => format!(
                "{} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body).trim()
            ),
            Err(e) => e.reason.clone(),
        };
        self.world
            .truth
            .lock()
            .log(&format!("n{}", self.from), format!("{what}: {outcome}"));
        result
    }
}

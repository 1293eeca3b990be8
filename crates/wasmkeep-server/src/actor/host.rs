//! The node's [`ActorHost`]: what a guest reaches from inside an event —
//! its database (through the actor's store), its alarm, its sockets, calls
//! to other actors (never across tenants), the app's secrets, and logging.
//! One per resident actor, owned by its instance and reached by the mailbox
//! through `as_any`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmkeep_runtime::{
    ActorHost, LogLevel, Message, OutboundOutcome, OutboundScope, Request, Response, SqlRows,
    SqlValue,
};
use wasmkeep_store::ActorStore;
use wasmkeep_types::outbound::AllowList;
use wasmkeep_types::{ActorId, ClassName};

use crate::actor::socket_table::{Outgoing, SharedSockets};
use crate::node::Node;
use crate::ops::metrics::ClassMetrics;

pub struct NodeHost {
    node: Arc<Node>,
    actor: ActorId,
    pub(crate) store: ActorStore,
    sockets: SharedSockets,
    /// The actors whose events wait on this one, this actor last.
    pub(crate) chain: Vec<ActorId>,
    /// Socket writes of the current event, held until its output gate opens.
    pub(crate) outbox: Vec<(u64, Outgoing)>,
    /// Time the guest's SQL calls took in the current event (the mailbox
    /// observes it at the event's end and sets it back to zero).
    pub(crate) sql_time: Duration,
    /// The handles of the actor's (tenant, class) metrics.
    metrics: Arc<ClassMetrics>,
}

impl NodeHost {
    pub fn new(
        node: Arc<Node>,
        actor: ActorId,
        store: ActorStore,
        sockets: SharedSockets,
        metrics: Arc<ClassMetrics>,
    ) -> Self {
        Self {
            node,
            actor,
            store,
            sockets,
            chain: Vec::new(),
            outbox: Vec::new(),
            sql_time: Duration::ZERO,
            metrics,
        }
    }

    fn check_socket(&self, id: u64) -> Result<(), String> {
        let closing = match self.sockets.lock().sockets.get(&id) {
            None => return Err(format!("no open socket {id}")),
            Some(entry) => entry.closing,
        };
        if closing || self.closes_in_this_event(id) {
            return Err(format!("socket {id} is closing: the actor closed it"));
        }
        Ok(())
    }

    fn closes_in_this_event(&self, id: u64) -> bool {
        self.outbox
            .iter()
            .any(|(to, out)| *to == id && matches!(out, Outgoing::Close(..)))
    }
}

/// An actor's outbound HTTP as its node sees it (ADR 0066): its class's
/// allow-list as the class's `current` record says now, and the actor's
/// (tenant, class) metrics.
struct ClassOutbound {
    node: Arc<Node>,
    class: ClassName,
    metrics: Arc<ClassMetrics>,
}

impl OutboundScope for ClassOutbound {
    fn allow_list(&self) -> Arc<AllowList> {
        self.node.classes.allow_outbound(&self.class)
    }

    fn record(&self, outcome: &OutboundOutcome) {
        self.metrics.outbound(outcome);
    }
}

/// Most of one guest log message that reaches the node's log.
const LOG_MESSAGE_BYTES_MAX: usize = 16 << 10;

/// A guest's log message as the node logs it: one event per line, each
/// with the actor's id (a raw line break would start an untagged line,
/// and a carriage return could hide one), and at most
/// [`LOG_MESSAGE_BYTES_MAX`] bytes of it; also how many bytes were cut.
fn log_lines(message: &str) -> (impl Iterator<Item = &str>, usize) {
    let kept = &message[..message.floor_char_boundary(LOG_MESSAGE_BYTES_MAX)];
    let lines = kept.split(['\n', '\r']).filter(|line| !line.is_empty());
    (lines, message.len() - kept.len())
}

/// Removes marker headers (`x-wasmkeep-*`) that only nodes may set.
pub fn strip_markers(headers: &mut Vec<(String, String)>) {
    headers.retain(|(name, _)| !name.to_ascii_lowercase().starts_with("x-wasmkeep-"));
}

#[async_trait::async_trait]
impl ActorHost for NodeHost {
    fn sql_execute(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<u64, String> {
        let started = Instant::now();
        let executed = self.store.execute(statement, &params);
        self.sql_time += started.elapsed();
        executed.map_err(|e| e.to_string())
    }

    fn sql_query(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<SqlRows, String> {
        let started = Instant::now();
        let rows = self.store.query(statement, &params);
        self.sql_time += started.elapsed();
        rows.map_err(|e| e.to_string())
    }

    fn alarm_get(&mut self) -> Option<i64> {
        self.store.alarm()
    }

    fn alarm_set(&mut self, at_ms: i64) {
        if let Err(e) = self.store.set_alarm(Some(at_ms)) {
            // The event's transaction is unusable; its commit will fail and say why.
            tracing::warn!(actor = %self.actor, error = %e, "alarm set failed");
        }
    }

    fn alarm_clear(&mut self) {
        if let Err(e) = self.store.set_alarm(None) {
            tracing::warn!(actor = %self.actor, error = %e, "alarm clear failed");
        }
    }

    fn socket_send(&mut self, id: u64, message: Message) -> Result<(), String> {
        self.check_socket(id)?;
        let bytes = match &message {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
        };
        let limit = self.node.config.limits.socket_message_bytes_max;
        if bytes > limit {
            return Err(format!(
                "message of {bytes} bytes is larger than the limit ({limit} bytes)"
            ));
        }
        if self.outbox.len() >= self.node.config.limits.socket_outbox_messages_max {
            return Err("too many socket messages in one event".to_owned());
        }
        self.outbox.push((id, Outgoing::Message(message)));
        Ok(())
    }

    fn socket_close(&mut self, id: u64, code: u16, reason: String) -> Result<(), String> {
        self.check_socket(id)?;
        if !(code == 1000 || (3000..=4999).contains(&code)) {
            return Err(format!(
                "close code {code} is not allowed: use 1000 or 3000-4999"
            ));
        }
        if reason.len() > 123 {
            return Err("close reason longer than 123 bytes".to_owned());
        }
        self.outbox.push((id, Outgoing::Close(code, reason)));
        Ok(())
    }

    fn socket_list(&mut self) -> Vec<u64> {
        let sockets = self.sockets.lock();
        sockets
            .sockets
            .iter()
            .filter(|(id, entry)| !entry.closing && !self.closes_in_this_event(**id))
            .map(|(id, _)| *id)
            .collect()
    }

    fn socket_set_tag(&mut self, id: u64, tag: String) -> Result<(), String> {
        let limit = self.node.config.limits.socket_tag_bytes_max;
        if tag.len() > limit {
            return Err(format!("tag longer than {limit} bytes"));
        }
        match self.sockets.lock().sockets.get_mut(&id) {
            Some(entry) => {
                entry.tag = Some(tag);
                Ok(())
            }
            None => Err(format!("no open socket {id}")),
        }
    }

    fn socket_get_tag(&mut self, id: u64) -> Option<String> {
        self.sockets
            .lock()
            .sockets
            .get(&id)
            .and_then(|e| e.tag.clone())
    }

    async fn call(
        &mut self,
        class: String,
        name: String,
        mut request: Request,
    ) -> Result<Response, String> {
        // A call names a class and a name only: its target is always in the
        // caller's tenant, so tenants never reach each other's actors.
        if class.contains('/') {
            return Err(format!(
                "{class:?} is not a class name: an actor calls only actors of its own tenant ({})",
                self.actor.tenant
            ));
        }
        let class = ClassName::new(class).map_err(|e| e.to_string())?;
        let target =
            ActorId::new(self.actor.tenant.clone(), class, name).map_err(|e| e.to_string())?;
        if target.tenant != self.actor.tenant {
            return Err(format!(
                "{target} is in another tenant: calls never cross tenants"
            ));
        }
        if self.chain.contains(&target) {
            let path: Vec<String> = self.chain.iter().map(ToString::to_string).collect();
            return Err(format!("call cycle: {} -> {target}", path.join(" -> ")));
        }
        let depth_max = self.node.config.limits.call_depth_max;
        if self.chain.len() >= depth_max {
            return Err(format!(
                "call depth limit ({depth_max}) reached calling {target}"
            ));
        }
        if !request.path.starts_with('/') {
            request.path.insert(0, '/');
        }
        strip_markers(&mut request.headers);
        let mut chain = self.chain.clone();
        chain.push(target.clone());
        self.node
            .call(&self.actor, &target, request, chain)
            .await
            .map_err(|e| format!("call to {target} failed: {e}"))
    }

    fn secret(&mut self, name: &str) -> Option<String> {
        // The runtime lowers this copy into the guest's memory and drops it
        // (wasmtime owns it meanwhile); the node's own copies are zeroed.
        self.node
            .secrets
            .get(name)
            .map(|value| String::clone(&value))
    }

    fn log(&mut self, level: LogLevel, message: &str) {
        let actor = &self.actor;
        let (lines, cut) = log_lines(message);
        let note = (cut > 0).then(|| format!("({cut} more bytes of this message were cut)"));
        for line in lines.chain(note.as_deref()) {
            match level {
                LogLevel::Trace => tracing::trace!(%actor, guest = true, "{line}"),
                LogLevel::Debug => tracing::debug!(%actor, guest = true, "{line}"),
                LogLevel::Info => tracing::info!(%actor, guest = true, "{line}"),
                LogLevel::Warn => tracing::warn!(%actor, guest = true, "{line}"),
                LogLevel::Error => tracing::error!(%actor, guest = true, "{line}"),
            }
        }
    }

    fn outbound(&self) -> Arc<dyn OutboundScope> {
        Arc::new(ClassOutbound {
            node: Arc::clone(&self.node),
            class: self.actor.class.clone(),
            metrics: Arc::clone(&self.metrics),
        })
    }

    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Why an actor's answer cannot be sent, if it cannot: a status outside
/// 200-599, or a header name or value HTTP does not allow. The mailbox
/// checks it before it commits the event, so such an event keeps nothing.
pub(crate) fn check_response(response: &Response) -> std::result::Result<(), String> {
    if !(200..=599).contains(&response.status) {
        return Err(format!(
            "the actor answered with status {}, not one from 200 to 599",
            response.status
        ));
    }
    for (name, value) in &response.headers {
        if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!(
                "the actor answered with an invalid header name {name:?}"
            ));
        }
        if hyper::header::HeaderValue::from_str(value).is_err() {
            return Err(format!(
                "the actor answered with an invalid value for header {name:?} \
                 (visible ASCII, spaces and tabs only)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_log_message_is_logged_line_by_line_and_cut() {
        let (lines, cut) = log_lines("one\ntwo\r\nFAKE ERROR\rthree\n");
        assert_eq!(
            lines.collect::<Vec<_>>(),
            ["one", "two", "FAKE ERROR", "three"]
        );
        assert_eq!(cut, 0);
        let long = "é".repeat(LOG_MESSAGE_BYTES_MAX);
        let (lines, cut) = log_lines(&long);
        let kept: usize = lines.map(str::len).sum();
        assert!(kept <= LOG_MESSAGE_BYTES_MAX && kept > LOG_MESSAGE_BYTES_MAX - 2);
        assert_eq!(kept + cut, long.len());
    }
}

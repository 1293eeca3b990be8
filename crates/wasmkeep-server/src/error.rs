//! The server's one error type, and how each error looks to an HTTP client
//! (status, a stable `code`, and a JSON body).

/// What went wrong while serving a request, an event or a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tenant, class or actor name in the path does not follow the rules.
    #[error(transparent)]
    InvalidName(#[from] wasmkeep_types::Error),
    /// The path is not an actor path nor a `/_wasmkeep/` endpoint.
    #[error("no route for {0}")]
    NoRoute(String),
    /// What an operator view asked for does not exist (an actor with
    /// nothing in the bucket, a table it does not have).
    #[error("not found: {0}")]
    NotFound(String),
    /// No component is deployed for this class (or this node does not serve it).
    #[error("unknown class {0:?}")]
    UnknownClass(String),
    /// A node endpoint (`/_wasmkeep/...`) asked with a method it does not answer.
    #[error("method {method} not allowed here (allowed: {allow})")]
    MethodNotAllowed { method: String, allow: &'static str },
    /// The request body is larger than the node accepts.
    #[error("request body larger than {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    /// The client stopped sending its request body before its end.
    #[error("the request body stalled: nothing arrived for {waited:?}")]
    BodyStalled { waited: std::time::Duration },
    /// A client request lacks its tenant's bearer token, or carries a wrong one.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The request is malformed in another way (headers, upgrade, body).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The actor's state does not allow what was asked (a test route's
    /// alarm when none is set, a hibernation while a socket is open).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The guest trapped, ran out of time or memory during this event.
    #[error("the actor failed on this event: {0}")]
    Guest(String),
    /// The guest's event ended, but what it made cannot be kept: an
    /// answer that cannot be sent, or more writes than one log record
    /// holds. Its writes were discarded.
    #[error("the actor's event was refused and its writes discarded: {0}")]
    EventRefused(String),
    /// The request cannot be served now; the client should retry after the delay.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String, retry_after_s: u32 },
    /// The event may or may not have taken effect: its log record's write
    /// did not settle, or the node that ran it stopped answering after the
    /// request reached it. Unlike every 503, which says nothing was
    /// applied, a client must read before it retries a change that is not
    /// idempotent (ADR 0062).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// A draining node no longer holds the actor and cannot forward a
    /// forwarded request again: nothing ran here, and the sender may claim
    /// the actor and run the request itself (ADR 0014).
    #[error("actor {actor} was released by this draining node; node {peer} takes it")]
    Released { actor: String, peer: String },
    /// A forwarded request or relayed socket found the actor held by yet
    /// another node: nothing ran here and it is not sent on (one hop); the
    /// sender may send it to `holder` itself, once (ADR 0005, amended).
    #[error("actor {actor} is held by node {holder}, not by this node; retry")]
    Moved {
        actor: String,
        holder: wasmkeep_types::NodeId,
    },
    /// The actor is held by another node (learned while activating it here).
    #[error("actor is held by node {node}")]
    HeldElsewhere { node: wasmkeep_types::NodeId },
    /// Leases, ownership records or peers failed.
    #[error("cluster: {0}")]
    Cluster(wasmkeep_cluster::Error),
    /// An actor-to-actor call was refused (cycle, depth, other tenant).
    #[error("call refused: {0}")]
    Call(String),
    /// A component was refused at deploy time.
    #[error("component refused: {0}")]
    Component(String),
    #[error("bucket: {0}")]
    Bucket(wasmkeep_bucket::Error),
    /// The actor's database failed (fenced, corrupt, bucket down).
    #[error("store: {0}")]
    Store(String),
    /// The wasm runtime failed outside of one event.
    #[error("runtime: {0}")]
    Runtime(String),
    /// Configuration or command-line input is wrong.
    #[error("configuration: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(std::io::Error),
}

// The wrapped errors of `Cluster`, `Bucket` and `Io` are in their messages,
// so they are not also their `source()`: a chain printed whole (`{:#}`, as
// the CLI prints its errors) would repeat each message twice.
impl From<wasmkeep_cluster::Error> for Error {
    fn from(e: wasmkeep_cluster::Error) -> Self {
        Error::Cluster(e)
    }
}

impl From<wasmkeep_bucket::Error> for Error {
    fn from(e: wasmkeep_bucket::Error) -> Self {
        Error::Bucket(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Seconds a client is asked to wait before retrying a `503`.
pub const RETRY_AFTER_DEFAULT_S: u32 = 1;

impl Error {
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Error::Unavailable {
            reason: reason.into(),
            retry_after_s: RETRY_AFTER_DEFAULT_S,
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> u16 {
        match self {
            Error::InvalidName(_) | Error::BadRequest(_) | Error::Component(_) => 400,
            Error::Unauthorized(_) => 401,
            Error::Conflict(_) => 409,
            Error::NoRoute(_) | Error::NotFound(_) | Error::UnknownClass(_) => 404,
            Error::MethodNotAllowed { .. } => 405,
            Error::BodyTooLarge { .. } => 413,
            Error::BodyStalled { .. } => 408,
            Error::Call(_) => 508,
            Error::OutcomeUnknown(_) => 504,
            Error::Guest(_) | Error::EventRefused(_) => 500,
            Error::Unavailable { .. }
            | Error::Bucket(_)
            | Error::Store(_)
            | Error::HeldElsewhere { .. }
            | Error::Released { .. }
            | Error::Moved { .. }
            | Error::Cluster(_) => 503,
            Error::Runtime(_) | Error::Config(_) | Error::Io(_) => 500,
        }
    }

    /// A stable machine-readable word for the error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidName(_) => "invalid_name",
            Error::NoRoute(_) => "no_route",
            Error::NotFound(_) => "not_found",
            Error::UnknownClass(_) => "unknown_class",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::BodyTooLarge { .. } => "body_too_large",
            Error::BodyStalled { .. } => "request_timeout",
            Error::BadRequest(_) => "bad_request",
            Error::Conflict(_) => "conflict",
            Error::Unauthorized(_) => "unauthorized",
            Error::Guest(_) => "guest_failed",
            Error::EventRefused(_) => "event_refused",
            Error::Unavailable { .. }
            | Error::Bucket(_)
            | Error::Store(_)
            | Error::HeldElsewhere { .. }
            | Error::Cluster(_) => "unavailable",
            Error::Released { .. } => "released",
            Error::OutcomeUnknown(_) => "outcome_unknown",
            Error::Moved { .. } => "moved",
            Error::Call(_) => "call_refused",
            Error::Component(_) => "component_refused",
            Error::Runtime(_) => "runtime",
            Error::Config(_) => "config",
            Error::Io(_) => "io",
        }
    }

    /// Seconds for the `Retry-After` header, when the status is `503`.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self {
            Error::Unavailable { retry_after_s, .. } => Some(*retry_after_s),
            Error::Bucket(_)
            | Error::Store(_)
            | Error::HeldElsewhere { .. }
            | Error::Released { .. }
            | Error::Moved { .. }
            | Error::Cluster(_) => Some(RETRY_AFTER_DEFAULT_S),
            _ => None,
        }
    }

    /// `{"error": "...", "code": "..."}`.
    pub fn json_body(&self) -> String {
        serde_json::json!({ "error": self.to_string(), "code": self.code() }).to_string()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_is_503_with_retry_after() {
        let e = Error::unavailable("mailbox full");
        assert_eq!(e.status(), 503);
        assert_eq!(e.retry_after_s(), Some(1));
        let body: serde_json::Value = serde_json::from_str(&e.json_body()).expect("json");
        assert_eq!(body["code"], "unavailable");
        assert!(
            body["error"]
                .as_str()
                .expect("string")
                .contains("mailbox full")
        );
    }

    #[test]
    fn statuses_fit_the_error() {
        assert_eq!(Error::UnknownClass("x".into()).status(), 404);
        assert_eq!(Error::BodyTooLarge { limit_bytes: 1 }.status(), 413);
        let stalled = Error::BodyStalled {
            waited: std::time::Duration::from_secs(1),
        };
        assert_eq!((stalled.status(), stalled.code()), (408, "request_timeout"));
        assert_eq!(Error::Unauthorized("x".into()).status(), 401);
        assert_eq!(Error::Unauthorized("x".into()).code(), "unauthorized");
        assert_eq!(Error::Guest("trap".into()).status(), 500);
        assert_eq!(Error::Guest("trap".into()).retry_after_s(), None);
        let unknown = Error::OutcomeUnknown("the record did not settle".into());
        assert_eq!((unknown.status(), unknown.code()), (504, "outcome_unknown"));
        assert_eq!(unknown.retry_after_s(), None);
    }
}

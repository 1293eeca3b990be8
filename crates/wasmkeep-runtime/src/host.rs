//! What the runtime asks of the node ([`ActorHost`]) and the plain data that
//! crosses the guest boundary. No wasmtime type appears here.

/// An HTTP request or an actor-to-actor call as the guest sees it: `path` is
/// the part after `/<tenant>/<class>/<name>`, query string included.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// One WebSocket message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(String),
    Binary(Vec<u8>),
}

pub use wasmkeep_types::sql::{SqlRows, SqlValue};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Implemented by the node, one per actor. The runtime knows nothing of
/// buckets, leases or HTTP. Each method serves one import of the world;
/// `Err(String)` is handed to the guest as the WIT `result`'s error (a value,
/// never a trap), so its text must be fit for the guest to read.
#[async_trait::async_trait]
pub trait ActorHost: Send + 'static {
    fn sql_execute(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<u64, String>;
    fn sql_query(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<SqlRows, String>;
    fn alarm_get(&mut self) -> Option<i64>;
    fn alarm_set(&mut self, at_ms: i64);
    fn alarm_clear(&mut self);
    fn socket_send(&mut self, id: u64, message: Message) -> Result<(), String>;
    fn socket_close(&mut self, id: u64, code: u16, reason: String) -> Result<(), String>;
    fn socket_list(&mut self) -> Vec<u64>;
    fn socket_set_tag(&mut self, id: u64, tag: String) -> Result<(), String>;
    fn socket_get_tag(&mut self, id: u64) -> Option<String>;
    async fn call(
        &mut self,
        class: String,
        name: String,
        request: Request,
    ) -> Result<Response, String>;
    fn secret(&mut self, name: &str) -> Option<String>;
    fn log(&mut self, level: LogLevel, message: &str);
    /// The actor's outbound HTTP: its class's allow-list and where its
    /// requests are counted. Asked once per instance's store.
    fn outbound(&self) -> std::sync::Arc<dyn crate::OutboundScope> {
        std::sync::Arc::new(crate::DenyAll)
    }
    /// Lets the node downcast to its own type: `fn as_any(&mut self) -> &mut dyn Any { self }`.
    fn as_any(&mut self) -> &mut dyn std::any::Any;
}

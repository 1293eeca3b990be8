//! The SDK's one error type: what a host import refused, or what a row did not hold.

use crate::outbound::OutboundError;

/// Every failure an SDK call can report. Host errors carry the host's message unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// SQLite refused the statement; the text is SQLite's (or the host's) message.
    #[error("sql: {0}")]
    Sql(String),
    /// `sql::query_row` found no row.
    #[error("sql: the query returned no rows")]
    NoRows,
    /// A row had a different number of columns than the Rust type asked for.
    #[error("sql: row has {found} columns, expected {expected}")]
    ColumnCount { expected: usize, found: usize },
    /// A column's value did not convert to the Rust type asked for.
    #[error("sql: column {column}: expected {expected}, found {found}")]
    ColumnType {
        column: usize,
        expected: &'static str,
        found: &'static str,
    },
    /// The host refused a socket operation (e.g. the socket is already closed).
    #[error("socket {socket}: {message}")]
    Socket { socket: u64, message: String },
    /// A call to another actor failed before it produced a response.
    #[error("call to {class}/{name}: {message}")]
    Call {
        class: String,
        name: String,
        message: String,
    },
    /// The request was malformed (a query parameter, a path parameter, the body).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// An outbound HTTP request ([`crate::outbound`]) failed; the text is the
    /// [`OutboundError`]'s own.
    #[error(transparent)]
    Outbound(#[from] OutboundError),
}

impl Error {
    /// True when SQLite said a table does not exist: lets an actor create its
    /// schema lazily, only when the hot-path statement finds it missing.
    pub fn is_missing_table(&self) -> bool {
        matches!(self, Error::Sql(message) if message.contains("no such table"))
    }

    /// The HTTP status that fits this error when it ends a request. An
    /// outbound request the upstream did not answer is a `502` (`504` when
    /// the time ran out); one the actor built wrong (its URL, a header) is
    /// the actor's own error, a `500`.
    pub fn status(&self) -> u16 {
        match self {
            Error::BadRequest(_) => 400,
            Error::NoRows => 404,
            Error::Call { .. } => 502,
            Error::Outbound(OutboundError::Timeout) => 504,
            Error::Outbound(OutboundError::InvalidUrl(_) | OutboundError::InvalidRequest(_)) => 500,
            Error::Outbound(_) => 502,
            _ => 500,
        }
    }
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

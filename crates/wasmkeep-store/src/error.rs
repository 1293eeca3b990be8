//! The store's one error type: each variant says what the caller does next.

use wasmkeep_types::ActorId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another writer extended the actor's log: this store must stop serving
    /// the actor (drop it; the ownership protocol decides who holds it).
    #[error("actor {actor} is fenced: another writer extended its log at record {seq}")]
    Fenced { actor: ActorId, seq: u64 },
    /// A stored object does not verify; the actor cannot be restored until an
    /// operator looks. Never loaded silently.
    #[error("corrupt actor data at {key}: {reason}")]
    Corrupt { key: String, reason: String },
    /// Writing a record failed (the bucket kept failing, or the outcome could
    /// not be settled): the store is unusable; drop the actor and restore it.
    #[error(
        "actor {actor}: log record {seq} was not written ({reason}); the store must be reopened"
    )]
    Broken {
        actor: ActorId,
        seq: u64,
        reason: String,
    },
    /// Writing a record failed and whether it was written is unknown: an
    /// attempt whose reply was lost may still land. The store is unusable
    /// as for `Broken`; the events the record carries have an unknown
    /// outcome (the next holder's fence settles it: ADR 0062).
    #[error(
        "actor {actor}: whether log record {seq} was written is unknown ({reason}); the store must be reopened"
    )]
    Unsettled {
        actor: ActorId,
        seq: u64,
        reason: String,
    },
    /// One event wrote more than one log record may hold.
    #[error(
        "the event changed {bytes} bytes of the database, more than record_bytes_max ({limit}); its writes were discarded"
    )]
    EventTooLarge { bytes: usize, limit: usize },
    /// The event's transaction was rolled back by SQLite (e.g. the database
    /// is full): the event's writes are gone and it must fail.
    #[error("the event's transaction was rolled back: {0}")]
    EventAborted(String),
    /// SQLite refused to commit or to set up the database.
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    #[error(transparent)]
    Bucket(#[from] wasmkeep_bucket::Error),
    /// A database file offered for import (`wasmkeep actor import`) is not
    /// one an actor can take; the reason says why and what to do.
    #[error("{0}")]
    BadImage(String),
    /// A point-in-time restore asked for an instant the log no longer
    /// holds (before the retention window, ADR 0076).
    #[error("actor {actor}: {at_ms} ms is before the oldest instant its log holds ({})", oldest_text(*.oldest_ms))]
    NotRestorable {
        actor: ActorId,
        at_ms: i64,
        /// The oldest instant that can be restored, when one is known.
        oldest_ms: Option<i64>,
    },
    /// The flusher is gone (the runtime shut down).
    #[error("the store's flusher stopped")]
    Closed,
}

fn oldest_text(oldest_ms: Option<i64>) -> String {
    match oldest_ms {
        Some(ms) => format!("{ms} ms"),
        None => "none".into(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

// The SQLite error is in the message, so it is not also the `source()`: a
// chain printed whole (`{:#}`) would repeat it.
impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Sqlite(e)
    }
}

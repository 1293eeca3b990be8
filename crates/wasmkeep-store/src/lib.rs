//! An actor's SQLite database, kept in the bucket (ADR 0002).
//!
//! The database lives in memory in the node (an in-memory VFS, no file per
//! actor). Each event is one SQLite transaction; after its COMMIT the pages it
//! wrote are its change set. Change sets become log records
//! (`Keys::actor_log(actor, seq)`) written with put-if-absent: a record that
//! cannot be created because the key exists means another writer extended the
//! log, and this store is fenced. One record is in flight per actor; events
//! that commit meanwhile join the next record (group commit). An event's
//! output gate resolves when the record holding its writes is durable.
//! Snapshots (`Keys::actor_snapshot`) bound restore time and bucket size.
//!
//! [`erase`] empties an actor's database for good, fencing its former
//! writers (`wasmkeep actor delete`); [`replace`] puts a checked [`Image`]
//! in its place the same way (`wasmkeep actor import`).
//!
//! Modules: `vfs` (the in-memory file and its written-page tracking),
//! `record` (the bytes of records and snapshots), `restore` (reading them
//! back), `sql` (guest SQL values and the authorizer), `conn` (a
//! connection with the store's own prepared statements), `alloc` (SQLite's
//! memory from Rust's allocator), `heavy` (which guest statements run off
//! the async workers), `store` (the [`ActorStore`] and its flusher).

mod alloc;
mod conn;
mod erase;
mod error;
mod heavy;
mod image;
mod page;
mod record;
mod restore;
mod sql;
mod store;
mod vfs;

use std::sync::Arc;
use std::time::Duration;

use wasmkeep_cluster::clock::{Clock, SystemClock};

pub use erase::{erase, replace};
pub use error::{Error, Result};
pub use heavy::{INLINE_SLICE, heavy_max, statements_off_worker_total};
pub use image::{Image, Imported, imported};
pub use record::FORMAT_VERSION;
pub use restore::Entry as HistoryEntry;
pub use sql::{SqlError, SqlParam, SqlRows, SqlValue};
pub use store::{ActorStore, OPERATOR_RESULTS_KEPT, OutputGate};
pub use vfs::{PAGE_BYTES, pages_held, set_pages_max};

/// Limits and thresholds of one actor's store. Every limit has a name.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Write a snapshot once this many log records follow the last one.
    pub snapshot_log_records: u64,
    /// ... or once the records since the last snapshot hold this many bytes.
    pub snapshot_log_bytes: u64,
    /// ... or, where the bucket says short-lived objects are cheap
    /// ([`wasmkeep_bucket::hinted::short_lived_objects_are_cheap`]), once at
    /// least [`EARLY_SNAPSHOT_RECORDS_MIN`] records since the last snapshot
    /// hold this many times the database's size (0: never). A small
    /// database then snapshots every few records and its records are
    /// deleted before they ever become files (ADR 0034).
    pub snapshot_log_database_multiple: u64,
    /// Largest log record (one event's change set must fit in one record;
    /// group commit starts a new record rather than exceed it).
    pub record_bytes_max: usize,
    /// Largest database (SQLite `max_page_count`); a write past it fails
    /// with SQLite's "database or disk is full". A node sets it per class
    /// (ADR 0064).
    pub database_bytes_max: u64,
    /// Largest query result handed to a guest.
    pub query_bytes_max: usize,
    /// Longest a single guest statement may run before it is interrupted.
    pub statement_time_max: Duration,
    /// Most memory a single guest statement may take in SQLite (sorts,
    /// temporary b-trees, values), beyond what it found; past it the
    /// statement fails with a clear error.
    pub statement_memory_max: usize,
    /// Attempts to write one record (or alarm index) before the store breaks.
    pub write_attempts_max: u32,
    /// Wait before the first retry of a failed write; doubles each attempt.
    pub write_retry_backoff: Duration,
    /// No retry of a write starts later than this after its first attempt.
    /// With the bucket's own bound on one request (S3: 10 s for a small
    /// one), a bucket that stops answering breaks the store, and answers
    /// its waiting events 503, within about this plus two requests' time
    /// instead of after every attempt's full wait (ADR 0049).
    pub write_time_max: Duration,
    /// How long the log keeps what rebuilds any instant (ADR 0076): a
    /// compaction deletes only records and snapshots that no instant within
    /// this long before now needs. Zero: everything a snapshot covers goes.
    pub retention: Duration,
    /// The wall clock records are timed by (the node's, so the simulation
    /// drives it).
    pub clock: Arc<dyn Clock>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            snapshot_log_records: 256,
            snapshot_log_bytes: 64 << 20,
            snapshot_log_database_multiple: 4,
            record_bytes_max: 32 << 20,
            database_bytes_max: 1 << 30,
            query_bytes_max: 32 << 20,
            statement_time_max: Duration::from_secs(10),
            statement_memory_max: 64 << 20,
            write_attempts_max: 6,
            write_retry_backoff: Duration::from_millis(20),
            write_time_max: Duration::from_secs(10),
            retention: Duration::ZERO,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Fewest records between two snapshots taken because the log outweighs
/// the database ([`StoreConfig::snapshot_log_database_multiple`]): each
/// snapshot also lists the actor's records and deletes them.
pub const EARLY_SNAPSHOT_RECORDS_MIN: u64 = 8;

/// Who writes a log record: written into every record, so a writer can tell
/// its own record from another's after a lost reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterId {
    pub node: String,
    pub incarnation: String,
}

/// What a stored log record or snapshot says about its origin: for tools and
/// tests that check an actor's history (one writer at a time, no gap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOrigin {
    /// A snapshot (`seq` is then the last record it holds), else a log record.
    pub snapshot: bool,
    pub seq: u64,
    /// The actor id the record names (`tenant/class/name`).
    pub actor: String,
    pub writer: WriterId,
    /// A database of no pages: only [`erase`] writes one (its fence and
    /// snapshot).
    pub empty: bool,
}

/// Decodes a stored log record or snapshot (checksum included) and returns
/// its origin; the error says what is wrong with the bytes.
pub fn record_origin(bytes: &[u8]) -> std::result::Result<RecordOrigin, String> {
    let decoded = record::decode(bytes)?;
    Ok(RecordOrigin {
        snapshot: decoded.kind == record::Kind::Snapshot,
        seq: decoded.seq,
        actor: decoded.actor,
        writer: WriterId {
            node: decoded.node,
            incarnation: decoded.incarnation,
        },
        empty: decoded.db_pages == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_origin_names_the_writer_and_refuses_damaged_bytes() {
        let page = page::PageData::zeroed();
        let bytes = record::encode(
            &record::Header {
                kind: record::Kind::Snapshot,
                seq: 9,
                db_pages: 1,
                alarm_ms: None,
                time_ms: 5,
                actor: "t/c/n",
                node: "n1",
                incarnation: "abc",
            },
            [(0u32, &page)].into_iter(),
        );
        let origin = record_origin(&bytes).expect("a good snapshot decodes");
        assert_eq!(
            origin,
            RecordOrigin {
                snapshot: true,
                seq: 9,
                actor: "t/c/n".into(),
                writer: WriterId {
                    node: "n1".into(),
                    incarnation: "abc".into(),
                },
                empty: false,
            }
        );
        assert!(record_origin(&bytes[..bytes.len() - 1]).is_err());
    }
}

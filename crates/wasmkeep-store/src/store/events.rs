//! Events on an open store: each one SQLite transaction; guest statements
//! under the authorizer and the deadline; the alarm; the commit that puts
//! the event's pages into the newest queued log record (group commit) and
//! returns its output gate; parking the connection between events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use rusqlite::{CachedStatement, Connection, params_from_iter};

use crate::alloc::StatementBudget;
use crate::conn::Conn;
use crate::heavy;
use crate::record;
use crate::sql::{self, SqlError, SqlRows, SqlValue};
use crate::vfs::{Changes, PAGE_BYTES, zero_page};
use crate::{Error, Result};

use super::connection::open_connection;
use super::{ActorStore, Failure, FailureKind, OutputGate, Pending};

/// Databases of at most this many pages give their page cache back after
/// every event: the pages stay in the VFS (the store's own copy), and the
/// next event reads the few it needs with a memcpy each. A resident counter
/// then costs one copy of its pages, not two (~13 KiB less per actor).
/// Larger databases keep their cache (re-reading would cost more than it saves).
const CACHE_RELEASE_PAGES_MAX: u32 = 64;

impl ActorStore {
    /// Whether the store can still take events: not fenced, not broken.
    /// An event's transaction begins at its first statement (or alarm
    /// change), so an event that touches no data costs SQLite nothing.
    pub fn check_usable(&self) -> Result<()> {
        if let Some(reason) = &self.local_failure {
            return Err(Error::Broken {
                actor: self.shared.actor.clone(),
                seq: self.shared.state.lock().next_seq,
                reason: reason.clone(),
            });
        }
        let st = self.shared.state.lock();
        match &st.failure {
            Some(f) => Err(self.shared.error_for(f, st.next_seq)),
            None => Ok(()),
        }
    }

    /// Starts an event: one SQLite transaction until commit or rollback.
    pub fn begin_event(&mut self) -> Result<()> {
        self.check_usable()?;
        if self.in_event {
            return Ok(());
        }
        self.connection()?.begin()?;
        self.in_event = true;
        self.event_aborted = None;
        Ok(())
    }

    /// Runs one guest statement (`sql`, prepared by `run`) under the
    /// authorizer, its time and memory caps, inline or off the async
    /// workers as [`crate::heavy`] decides.
    fn guest_call<T>(
        &mut self,
        sql: &str,
        mut run: impl FnMut(&Connection, &mut CachedStatement<'_>, usize) -> rusqlite::Result<T>,
    ) -> Result<T, SqlError> {
        if !self.in_event {
            self.begin_event()
                .map_err(|e| SqlError::new(e.to_string()))?;
        }
        self.note_lost_transaction();
        if let Some(reason) = &self.event_aborted {
            return Err(SqlError::new(format!(
                "the event's transaction was rolled back earlier: {reason}"
            )));
        }
        let Some(conn) = self.conn.as_ref() else {
            return Err(SqlError::new("internal: an event without a connection"));
        };
        let config = &self.shared.config;
        let started = Instant::now();
        let deadline = started + config.statement_time_max;
        self.guard.set_guest(true);
        // Prepared (and authorized) first: its kind decides where it runs.
        let (result, over_budget) = match conn.prepare_cached(sql) {
            Err(e) => (Err(e), false),
            Ok(stmt) if self.reader && !stmt.readonly() => (
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
                    Some(
                        "read-only: this reads the actor's state from the bucket; a statement \
                         that writes must run on the actor's holder"
                            .into(),
                    ),
                )),
                false,
            ),
            Ok(mut stmt) => {
                let readonly = stmt.readonly();
                let mut attempt = |until: Instant| {
                    *self.deadline.lock() = Some(until);
                    let budget = StatementBudget::start(config.statement_memory_max);
                    let result = run(conn, &mut stmt, config.query_bytes_max);
                    let over_budget = budget.exceeded();
                    *self.deadline.lock() = None;
                    (result, over_budget)
                };
                let tenant = self.shared.actor.tenant.as_str();
                if readonly {
                    let slice = (started + heavy::INLINE_SLICE).min(deadline);
                    let (result, over_budget) = attempt(slice);
                    if slice < deadline && is_interrupt(&result) {
                        // A read leaves the transaction as it was: run
                        // again, off the workers, for the rest of its time.
                        heavy::off_worker(tenant, || attempt(deadline))
                    } else {
                        (result, over_budget)
                    }
                } else {
                    self.guard.set_guest(false);
                    let bounded = heavy::is_bounded(conn, sql);
                    self.guard.set_guest(true);
                    if bounded {
                        attempt(deadline)
                    } else {
                        heavy::off_worker(tenant, || attempt(deadline))
                    }
                }
            }
        };
        self.guard.set_guest(false);
        let refused_for_node = crate::vfs::take_refused_for_node();
        let result = result.map_err(|e| {
            let mut e = sql::guest_error(e, &self.guard);
            let full = e.message == "database or disk is full";
            if full && refused_for_node {
                e.message = format!(
                    "database or disk is full: this node's memory for actor databases is full ({} MiB held by all actors); the write was refused, try again later",
                    (crate::vfs::pages_held() * PAGE_BYTES as u64) >> 20
                );
            } else if full {
                e.message = format!(
                    "database or disk is full: the database reached its class's maximum ({} bytes)",
                    self.shared.config.database_bytes_max
                );
            } else if e.message == "interrupted" {
                e.message = format!(
                    "interrupted: the statement ran longer than statement_time_max ({:?})",
                    self.shared.config.statement_time_max
                );
            } else if over_budget {
                e.message = format!(
                    "out of memory: the statement needed more than statement_memory_max ({} MiB) ({})",
                    self.shared.config.statement_memory_max >> 20,
                    e.message
                );
            }
            e
        });
        if self.is_autocommit() {
            // SQLite rolled the whole transaction back (e.g. database full):
            // the event's earlier writes are gone; it must fail as a whole.
            let reason = match &result {
                Err(e) => e.message.clone(),
                Ok(_) => "the transaction ended inside a statement".into(),
            };
            self.event_aborted = Some(reason.clone());
            return Err(SqlError::new(format!(
                "the event's transaction was rolled back: {reason}"
            )));
        }
        result
    }

    /// Runs one statement that returns no rows (one that does is refused
    /// before it runs); the number of rows it inserted, updated or deleted,
    /// 0 for other kinds.
    pub fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, SqlError> {
        check_statement_text(sql)?;
        self.guest_call(sql, |conn, stmt, _| {
            // Refused before it runs: SQLite makes a `RETURNING` statement's
            // writes at its first step, and refusing it after that step
            // reported an error for a write that was made.
            if stmt.column_count() > 0 {
                return Err(rusqlite::Error::ExecuteReturnedResults);
            }
            let before = conn.total_changes();
            stmt.execute(params_from_iter(params.iter().map(sql::Param)))?;
            // SQLite's count of the last INSERT, UPDATE or DELETE stays as
            // it was across other statements (DDL, SAVEPOINT, ...): those
            // changed no row.
            Ok(if conn.total_changes() == before {
                0
            } else {
                conn.changes()
            })
        })
    }

    /// Runs one statement and returns its rows (at most `query_bytes_max`).
    pub fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<SqlRows, SqlError> {
        check_statement_text(sql)?;
        let mut too_big = false;
        let out = self.guest_call(sql, |_, stmt, bytes_max| {
            let columns: Vec<String> = stmt.column_names().into_iter().map(str::to_owned).collect();
            let n = columns.len();
            let mut rows = stmt.query(params_from_iter(params.iter().map(sql::Param)))?;
            let mut out = SqlRows {
                columns,
                rows: Vec::new(),
            };
            let mut bytes = 0usize;
            while let Some(row) = rows.next()? {
                let mut values = Vec::with_capacity(n);
                for i in 0..n {
                    let v = sql::value_from_ref(row.get_ref(i)?);
                    bytes += sql::cost_bytes(&v);
                    values.push(v);
                }
                if bytes > bytes_max {
                    too_big = true;
                    break;
                }
                out.rows.push(values);
            }
            Ok(out)
        })?;
        if too_big {
            return Err(SqlError::new(format!(
                "the result is larger than query_bytes_max ({} bytes): select fewer rows (LIMIT) or columns",
                self.shared.config.query_bytes_max
            )));
        }
        Ok(out)
    }

    /// The alarm as this event sees it (its own changes included).
    pub fn alarm(&self) -> Option<i64> {
        self.event_alarm
    }

    /// Sets or clears the alarm, inside the event's transaction: it commits
    /// (and is durable) together with the event's other writes.
    pub fn set_alarm(&mut self, at_ms: Option<i64>) -> Result<()> {
        if at_ms == self.event_alarm {
            return Ok(());
        }
        self.begin_event()?;
        self.note_lost_transaction();
        if let Some(reason) = &self.event_aborted {
            return Err(Error::EventAborted(reason.clone()));
        }
        let result = self.write_alarm(at_ms);
        self.note_lost_transaction();
        result?;
        self.event_alarm = at_ms;
        Ok(())
    }

    /// A statement error can make SQLite roll back the whole transaction
    /// (a full database, an interrupt). The event then must fail whole, and
    /// no later statement may run outside a transaction.
    fn note_lost_transaction(&mut self) {
        if self.in_event && self.event_aborted.is_none() && self.is_autocommit() {
            self.event_aborted = Some("SQLite rolled the transaction back after an error".into());
        }
    }

    fn write_alarm(&mut self, at_ms: Option<i64>) -> Result<()> {
        // Store statements: authorizer off (guard not in guest mode), not cached.
        let conn = self.connection()?;
        match at_ms {
            Some(at) => {
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS _wasmkeep_alarm (id INTEGER PRIMARY KEY CHECK (id = 1), at_ms INTEGER NOT NULL)",
                    [],
                )?;
                conn.execute(
                    "INSERT OR REPLACE INTO _wasmkeep_alarm (id, at_ms) VALUES (1, ?1)",
                    [at],
                )?;
            }
            None => {
                conn.execute("DELETE FROM _wasmkeep_alarm WHERE id = 1", [])?;
            }
        }
        Ok(())
    }

    /// Ends the event: commits its transaction and returns its output gate.
    pub fn commit_event(&mut self) -> Result<OutputGate> {
        if let Err(e) = self.check_usable() {
            self.rollback_event();
            return Err(e);
        }
        self.note_lost_transaction();
        if let Some(reason) = self.event_aborted.take() {
            self.rollback_event();
            return Err(Error::EventAborted(reason));
        }
        if self.in_event {
            let committed = match self.conn.as_ref() {
                Some(conn) => conn.commit().map_err(Error::from),
                None => Err(Error::Closed),
            };
            if let Err(e) = committed {
                self.rollback_event();
                return Err(e);
            }
            self.in_event = false;
        }
        let changes = self.file.lock().changes();
        self.release_cache_if_small();
        if changes.is_empty() {
            self.file.lock().accept_changes();
            self.committed_alarm = self.event_alarm;
            return Ok(self.gate_for_reader());
        }
        let text = self.shared.header_text_bytes();
        let bytes = record::encoded_len(changes.pages.len(), text);
        let limit = self.shared.config.record_bytes_max;
        if bytes > limit {
            if let Err(e) = self.undo_committed_event() {
                // The file and SQLite may now disagree: nothing more may be
                // written (records already queued are still written).
                self.local_failure = Some(format!("undoing an oversized event failed: {e}"));
                return Err(e);
            }
            return Err(Error::EventTooLarge { bytes, limit });
        }
        self.file.lock().accept_changes();
        self.committed_alarm = self.event_alarm;
        let (target, wake) = self.enqueue(changes, text);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(OutputGate::waiting(&self.shared, target))
    }

    /// Frees SQLite's page cache of a small database (outside a transaction).
    fn release_cache_if_small(&self) {
        if let Some(conn) = &self.conn
            && conn.is_autocommit()
            && self.file.lock().db_pages() <= CACHE_RELEASE_PAGES_MAX
        {
            // SAFETY: the handle belongs to this open connection, used by this
            // thread only (the store is not shared); the call frees unused
            // cache pages and never invalidates anything the store holds.
            unsafe {
                rusqlite::ffi::sqlite3_db_release_memory(conn.handle());
            }
        }
    }

    /// Whether no transaction is open (a parked store has none).
    fn is_autocommit(&self) -> bool {
        self.conn.as_ref().is_none_or(|conn| conn.is_autocommit())
    }

    /// The connection, opened again if the store was parked.
    pub(super) fn connection(&mut self) -> Result<&Conn> {
        if self.conn.is_none() {
            self.conn = Some(open_connection(
                &self.db_name,
                &self.shared.config,
                &self.guard,
                &self.deadline,
            )?);
        }
        Ok(self.conn.as_ref().expect("opened just above"))
    }

    /// Closes SQLite's connection of an idle store (between events): about
    /// 25 KiB per actor. The database stays in memory (the VFS pages), and
    /// the next event opens a connection again (~tens of µs). Does nothing
    /// inside an event.
    pub fn park(&mut self) {
        if !self.in_event && self.is_autocommit() {
            self.conn = None;
        }
    }

    /// The database file as SQLite lays it out: what the `sqlite3` shell
    /// opens (`wasmkeep actor export`). Outside an event.
    pub fn database_image(&self) -> Vec<u8> {
        let file = self.file.lock();
        let mut bytes = Vec::with_capacity(file.size_bytes() as usize);
        for page in file.image() {
            bytes.extend_from_slice(&page.to_page());
        }
        bytes.truncate(file.size_bytes() as usize);
        bytes
    }

    /// Whether the store is parked (no SQLite connection open).
    pub fn is_parked(&self) -> bool {
        self.conn.is_none()
    }

    /// A gate for an event that wrote nothing: it may have read data that is
    /// committed in memory but not yet durable, so it waits for the newest
    /// record; with nothing pending it is ready at once.
    fn gate_for_reader(&self) -> OutputGate {
        let last = self.shared.state.lock().next_seq - 1;
        if self.shared.progress.borrow().durable_seq >= last {
            OutputGate::ready()
        } else {
            OutputGate::waiting(&self.shared, last)
        }
    }

    /// Fences the log before the store serves (ADR 0062): queues a record
    /// that changes nothing at the next sequence number, so that every
    /// event's output gate (readers' included) waits for it. Call right
    /// after [`ActorStore::open`] when an earlier holder may still have a
    /// record in flight (its process paused, or its last write's outcome
    /// unknown). Either that record landed before the fence, and the fence
    /// fails (the store is fenced: reopened, it restores the record), or
    /// the fence holds its number and the record can never land. So no
    /// answer leaves this store while a record it did not read could still
    /// appear below it. Events committed before the fence is written join
    /// its record (group commit).
    pub fn fence_log(&mut self) {
        let db_pages = self.file.lock().db_pages();
        {
            let mut st = self.shared.state.lock();
            let seq = st.next_seq;
            st.next_seq += 1;
            st.queue.push_back(Pending {
                seq,
                pages: BTreeMap::new(),
                db_pages,
                alarm_ms: self.committed_alarm,
                image: None,
                events: 0,
            });
        }
        self.records_since_snapshot += 1;
        self.shared.wake.notify_one();
    }

    /// Puts an event's changes into the newest queued record, or a new one:
    /// returns the record's sequence number and whether the flusher needs
    /// waking (not while it lingers for more events than the record holds).
    fn enqueue(&mut self, changes: Changes, text: usize) -> (u64, bool) {
        let limit = self.shared.config.record_bytes_max;
        let mut st = self.shared.state.lock();
        let fits = st.queue.back().is_some_and(|back| {
            let added = changes
                .pages
                .iter()
                .filter(|(i, _)| !back.pages.contains_key(i))
                .count();
            record::encoded_len(back.pages.len() + added, text) <= limit
        });
        if !fits {
            let seq = st.next_seq;
            st.next_seq += 1;
            self.records_since_snapshot += 1;
            let config = &self.shared.config;
            let early = || {
                config.snapshot_log_database_multiple > 0
                    // Kept records are not short-lived: the snapshot
                    // would delete nothing.
                    && config.retention.is_zero()
                    && self.records_since_snapshot >= crate::EARLY_SNAPSHOT_RECORDS_MIN
                    && wasmkeep_bucket::hinted::short_lived_objects_are_cheap(&*self.shared.bucket)
                    && self.bytes_since_snapshot
                        >= config
                            .snapshot_log_database_multiple
                            .saturating_mul(self.file.lock().size_bytes())
            };
            let image = (self.records_since_snapshot >= config.snapshot_log_records
                || self.bytes_since_snapshot >= config.snapshot_log_bytes
                || early())
            .then(|| {
                self.records_since_snapshot = 0;
                self.bytes_since_snapshot = 0;
                self.file.lock().image()
            });
            st.queue.push_back(Pending {
                seq,
                pages: BTreeMap::new(),
                db_pages: changes.db_pages,
                alarm_ms: None,
                image,
                events: 0,
            });
        }
        self.bytes_since_snapshot += (changes.pages.len() * (PAGE_BYTES + 4)) as u64;
        let back = st.queue.back_mut().expect("pushed above");
        back.events += 1;
        back.db_pages = changes.db_pages;
        back.alarm_ms = self.committed_alarm;
        back.pages.retain(|i, _| *i < changes.db_pages);
        if let Some(image) = &mut back.image {
            image.resize_with(changes.db_pages as usize, zero_page);
            for (i, page) in &changes.pages {
                image[*i as usize] = Arc::clone(page);
            }
        }
        for (i, page) in changes.pages {
            back.pages.insert(i, page);
        }
        let (seq, events) = (back.seq, back.events);
        let wake = match st.lingering_for {
            Some(expected) => st.queue.len() > 1 || events >= expected,
            None => true,
        };
        (seq, wake)
    }

    /// Takes back an event that SQLite committed but the store refuses:
    /// the file goes back to the last collection and the connection is
    /// reopened so SQLite's cache forgets the event too.
    fn undo_committed_event(&mut self) -> Result<()> {
        self.file.lock().undo_since_collection();
        let conn = open_connection(
            &self.db_name,
            &self.shared.config,
            &self.guard,
            &self.deadline,
        )?;
        self.conn = Some(conn);
        self.event_alarm = self.committed_alarm;
        Ok(())
    }

    /// The event failed (a trap): its writes are discarded.
    pub fn rollback_event(&mut self) {
        if let Some(conn) = &self.conn
            && !conn.is_autocommit()
            && let Err(e) = conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(actor = %self.shared.actor, error = %e, "rollback failed");
        }
        self.in_event = false;
        self.event_aborted = None;
        self.event_alarm = self.committed_alarm;
    }

    /// Waits until everything committed so far is durable, and any snapshot
    /// under way is written (used before hibernation and hand-over).
    pub async fn flush(&mut self) -> Result<()> {
        let last = self.shared.state.lock().next_seq - 1;
        OutputGate::waiting(&self.shared, last).await?;
        let mut rx = self.shared.progress.subscribe();
        while rx.borrow_and_update().snapshots_pending > 0 {
            if rx.changed().await.is_err() {
                return Err(Error::Closed);
            }
        }
        Ok(())
    }

    /// True once another writer extended the log: stop serving this actor.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self.shared.state.lock().failure,
            Some(Failure {
                kind: FailureKind::Fenced,
                ..
            })
        )
    }

    /// True once a record failed for any reason (fenced or broken).
    pub fn is_failed(&self) -> bool {
        self.shared.state.lock().failure.is_some()
    }

    pub fn database_bytes(&self) -> u64 {
        self.file.lock().size_bytes()
    }

    /// The last record number known durable (for tests and metrics).
    pub fn durable_seq(&self) -> u64 {
        self.shared.progress.borrow().durable_seq
    }
}

/// Refuses what is not one statement before SQLite sees it.
/// Whether a statement ended because its deadline interrupted it.
fn is_interrupt<T>(result: &rusqlite::Result<T>) -> bool {
    matches!(result, Err(rusqlite::Error::SqliteFailure(e, _))
        if e.code == rusqlite::ErrorCode::OperationInterrupted)
}

fn check_statement_text(sql: &str) -> Result<(), SqlError> {
    if sql.trim().trim_end_matches(';').trim().is_empty() {
        return Err(SqlError::new("empty SQL: send one statement"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_text_must_hold_a_statement() {
        assert!(check_statement_text(" ; ").is_err());
        assert!(check_statement_text("").is_err());
        assert!(check_statement_text("SELECT 1;").is_ok());
    }
}

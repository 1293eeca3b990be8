//! [`ActorStore`]: one actor's database, its events, and the flusher that
//! turns committed events into log records (group commit).
//!
//! Two halves share [`Shared`]:
//! - the store, used by the actor's mailbox task, runs each event as one
//!   SQLite transaction and, at COMMIT, moves the pages the event changed
//!   into the queue of records to write (merging into the newest queued
//!   record while it is not yet being written and stays under
//!   `record_bytes_max`);
//! - the flusher, a tokio task per store, writes the queued records one at a
//!   time, in order, with put-if-absent, and publishes how far the log is
//!   durable. Output gates watch that number.
//!
//! A failed record write (fenced, or the bucket failing past the retries)
//! fails that record's gates and every later one, and the store refuses
//! further events: the node drops the actor and restores it.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::CStr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params_from_iter};
use tokio::sync::{Notify, watch};
use wasmkeep_bucket::{Bucket, Error as BucketError};
pub(crate) use wasmkeep_cluster::fenced::Haste;
use wasmkeep_cluster::fenced::{Fenced, Outcome};
use wasmkeep_types::{ActorId, Keys};

use crate::conn::Conn;
use crate::record::{self, Header, Kind};
use crate::restore;
use crate::sql::{self, Guard, QueryRows, SqlError, SqlValue};
use crate::vfs::{Changes, MemFile, PAGE_BYTES, SharedFile, SharedPage, VFS_NAME, zero_page};
use crate::{Error, Result, StoreConfig, WriterId};

/// Statements kept prepared per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;
/// SQLite's page cache per connection, KiB. The file itself is in memory, so
/// a large cache would only hold a second copy of hot pages.
const PAGE_CACHE_KIB: u32 = 1024;
/// Databases of at most this many pages give their page cache back after
/// every event: the pages stay in the VFS (the store's own copy), and the
/// next event reads the few it needs with a memcpy each. A resident counter
/// then costs one copy of its pages, not two (~13 KiB less per actor).
/// Larger databases keep their cache (re-reading would cost more than it saves).
const CACHE_RELEASE_PAGES_MAX: u32 = 64;
/// Longest the next record waits for the writers whose events the last
/// record released (see `write_records`).
const LINGER_TIME_MAX: Duration = Duration::from_micros(500);
/// SQLite VM steps between two checks of the statement deadline.
const PROGRESS_STEPS: i32 = 10_000;

static DB_NAMES: AtomicU64 = AtomicU64::new(0);

/// A record waiting to be written.
struct Pending {
    seq: u64,
    pages: BTreeMap<u32, SharedPage>,
    db_pages: u32,
    alarm_ms: Option<i64>,
    /// The whole database as of this record, when it is to be snapshotted.
    image: Option<Vec<SharedPage>>,
    /// Events whose changes this record carries.
    events: u32,
}

#[derive(Debug, Clone)]
pub(crate) enum FailureKind {
    Fenced,
    Broken(String),
}

#[derive(Debug, Clone)]
struct Failure {
    seq: u64,
    kind: FailureKind,
}

#[derive(Debug, Clone, Default)]
struct Progress {
    /// Every record up to this one is durable.
    durable_seq: u64,
    failure: Option<Failure>,
    /// Snapshots handed to the snapshot writer and not finished.
    snapshots_pending: u64,
}

struct FlushState {
    queue: VecDeque<Pending>,
    /// Sequence number the next new record gets.
    next_seq: u64,
    closed: bool,
    failure: Option<Failure>,
    /// The flusher lingers until the one queued record holds this many
    /// events (or its deadline passes): a commit that leaves the record
    /// short of it does not wake the flusher, which would only look and
    /// wait again (once per event of the group).
    lingering_for: Option<u32>,
}

struct Shared {
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    actor: ActorId,
    /// `actor` as record headers spell it, made once.
    actor_text: String,
    /// The actor's log prefix in the bucket, made once.
    log_prefix: String,
    writer: WriterId,
    config: StoreConfig,
    state: Mutex<FlushState>,
    wake: Notify,
    progress: watch::Sender<Progress>,
}

impl Shared {
    fn error_for(&self, f: &Failure) -> Error {
        match &f.kind {
            FailureKind::Fenced => Error::Fenced {
                actor: self.actor.clone(),
                seq: f.seq,
            },
            FailureKind::Broken(reason) => Error::Broken {
                actor: self.actor.clone(),
                seq: f.seq,
                reason: reason.clone(),
            },
        }
    }

    fn header_text_bytes(&self) -> usize {
        self.actor_text.len() + self.writer.node.len() + self.writer.incarnation.len()
    }
}

/// Resolves when every write up to and including its event is durable
/// (`Ok`), or when the record holding them failed (`Err`).
pub struct OutputGate {
    /// `None`: open from the start.
    inner: Option<BoxFuture<'static, Result<()>>>,
}

impl OutputGate {
    fn ready() -> Self {
        Self { inner: None }
    }

    /// Whether the gate was open when the event committed: the event wrote
    /// nothing, and everything it could have read was durable already.
    pub fn is_open(&self) -> bool {
        self.inner.is_none()
    }

    fn waiting(shared: &Arc<Shared>, target: u64) -> Self {
        let mut rx = shared.progress.subscribe();
        let shared = Arc::clone(shared);
        Self {
            inner: Some(Box::pin(async move {
                loop {
                    {
                        let p = rx.borrow_and_update();
                        if p.durable_seq >= target {
                            return Ok(());
                        }
                        if let Some(f) = &p.failure
                            && f.seq <= target
                        {
                            return Err(shared.error_for(f));
                        }
                    }
                    if rx.changed().await.is_err() {
                        return Err(Error::Closed);
                    }
                }
            })),
        }
    }
}

impl Future for OutputGate {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.inner {
            None => Poll::Ready(Ok(())),
            Some(inner) => inner.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for OutputGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputGate")
    }
}

/// One actor's database; used from one task (the mailbox).
pub struct ActorStore {
    /// `None` while parked: the pages stay in `file`, SQLite's connection
    /// (about 25 KiB) is opened again by the next event.
    conn: Option<Conn>,
    file: SharedFile,
    db_name: String,
    guard: Arc<Guard>,
    deadline: Arc<Mutex<Option<Instant>>>,
    shared: Arc<Shared>,
    in_event: bool,
    event_aborted: Option<String>,
    committed_alarm: Option<i64>,
    event_alarm: Option<i64>,
    records_since_snapshot: u64,
    bytes_since_snapshot: u64,
    /// Set when this side (not the flusher) made the store unusable.
    local_failure: Option<String>,
    /// The snapshot writer, which ends last: after the flusher, with the
    /// compaction it was doing finished (see [`ActorStore::close`]).
    background: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ActorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorStore")
            .field("actor", &self.shared.actor)
            .field("db_name", &self.db_name)
            .finish_non_exhaustive()
    }
}

/// The connection settings the bundled SQLite is built with as its defaults
/// (`LIBSQLITE3_FLAGS` in `.cargo/config.toml`), so that opening a connection
/// need not parse a PRAGMA for each: with ten thousand new actors a second,
/// those parses were ~5 % of the node's CPU. Each must match what
/// `open_connection` would otherwise set.
const BUILT_IN_DEFAULTS: [&CStr; 5] = [
    c"DEFAULT_PAGE_SIZE=4096",
    c"DEFAULT_LOCKING_MODE=1",
    c"DEFAULT_SYNCHRONOUS=0",
    c"TEMP_STORE=3",
    c"DEFAULT_CACHE_SIZE=-1024",
];

/// Whether SQLite was built with every one of [`BUILT_IN_DEFAULTS`] (else
/// each connection sets them); asked once.
fn defaults_built_in() -> bool {
    static BUILT_IN: OnceLock<bool> = OnceLock::new();
    *BUILT_IN.get_or_init(|| {
        BUILT_IN_DEFAULTS.iter().all(|option| {
            // SAFETY: `option` is a NUL-terminated string that outlives the call.
            unsafe { rusqlite::ffi::sqlite3_compileoption_used(option.as_ptr()) == 1 }
        })
    })
}

fn open_connection(
    name: &str,
    config: &StoreConfig,
    guard: &Arc<Guard>,
    deadline: &Arc<Mutex<Option<Instant>>>,
) -> Result<Conn> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let vfs = VFS_NAME.to_str().expect("the VFS name is ASCII");
    let conn = Connection::open_with_flags_and_vfs(name, flags, vfs)?;
    // page_size only takes effect on an empty database; a restored one keeps
    // the size in its header, which the record format pins to 4096.
    if !defaults_built_in() {
        conn.execute_batch(&format!(
            "PRAGMA page_size = {PAGE_BYTES};
             PRAGMA locking_mode = EXCLUSIVE;
             PRAGMA synchronous = OFF;
             PRAGMA temp_store = MEMORY;
             PRAGMA cache_size = -{PAGE_CACHE_KIB};"
        ))?;
    }
    let max_pages = (config.database_bytes_max / PAGE_BYTES as u64).max(1);
    let mode: String = conn.query_row("PRAGMA journal_mode = MEMORY", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("memory") {
        return Err(Error::Sqlite(rusqlite::Error::InvalidParameterName(
            format!("journal_mode is {mode}, not memory"),
        )));
    }
    conn.execute_batch(&format!("PRAGMA max_page_count = {max_pages};"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    sql::install_authorizer(&conn, Arc::clone(guard));
    let deadline = Arc::clone(deadline);
    conn.progress_handler(
        PROGRESS_STEPS,
        Some(move || deadline.lock().is_some_and(|d| Instant::now() > d)),
    );
    Ok(Conn::new(conn)?)
}

fn read_alarm_table(conn: &Connection) -> Result<Option<i64>> {
    let exists: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_wasmkeep_alarm'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if exists.is_none() {
        return Ok(None);
    }
    let at: Option<Option<i64>> = conn
        .query_row("SELECT at_ms FROM _wasmkeep_alarm WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(at.flatten())
}

impl ActorStore {
    /// Restores from the bucket (newest snapshot + log after it); creates an
    /// empty database if the actor has no data. Must run inside a tokio
    /// runtime (the flusher is a task).
    pub async fn open(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        actor: ActorId,
        writer: WriterId,
        config: StoreConfig,
    ) -> Result<Self> {
        let restored = restore::load(&*bucket, &keys, &actor).await?;
        let empty = restored.pages.is_empty();
        let file: SharedFile = Arc::new(Mutex::new(MemFile::with_pages(restored.pages)));
        let db_name = format!("wasmkeep-db-{}", DB_NAMES.fetch_add(1, Ordering::Relaxed));
        MemFile::register(&db_name, Arc::clone(&file));
        let guard = Arc::new(Guard::default());
        let deadline = Arc::new(Mutex::new(None));
        let conn = match open_connection(&db_name, &config, &guard, &deadline) {
            Ok(c) => c,
            Err(e) => {
                MemFile::unregister(&db_name);
                return Err(e);
            }
        };
        // An empty database has no tables: a new actor skips the lookup.
        let alarm = if empty {
            Ok(None)
        } else {
            read_alarm_table(&conn)
        };
        let alarm = match alarm {
            Ok(a) => a,
            Err(e) => {
                MemFile::unregister(&db_name);
                return Err(e);
            }
        };
        // The alarm is kept twice (table and record header); they must agree.
        if alarm != restored.alarm_ms {
            MemFile::unregister(&db_name);
            return Err(Error::Corrupt {
                key: keys.actor_log(&actor, restored.last_seq),
                reason: format!(
                    "the alarm in the database ({alarm:?}) differs from the record header ({:?})",
                    restored.alarm_ms
                ),
            });
        }
        // Setting pragmas must not have produced a change (that would be a
        // record written for an actor nobody wrote to).
        let stray = file.lock().take_changes();
        debug_assert!(
            stray.is_empty(),
            "opening wrote pages: {:?}",
            stray.pages.len()
        );

        // The index may lag a record that failed after the index was
        // rewritten; put it back to the committed value.
        if let Some(at) = alarm {
            put_retrying(
                &*bucket,
                &keys.alarm(&actor),
                Bytes::from(at.to_string()),
                &config,
            )
            .await?;
        }

        let (progress, _) = watch::channel(Progress {
            durable_seq: restored.last_seq,
            ..Progress::default()
        });
        let shared = Arc::new(Shared {
            bucket,
            actor_text: actor.to_string(),
            log_prefix: keys.actor_log_prefix(&actor),
            keys,
            actor,
            writer,
            state: Mutex::new(FlushState {
                queue: VecDeque::new(),
                next_seq: restored.last_seq + 1,
                closed: false,
                failure: None,
                lingering_for: None,
            }),
            config,
            wake: Notify::new(),
            progress,
        });
        let slot = Arc::new(SnapshotSlot::default());
        let background = tokio::spawn(snapshot_writer(Arc::clone(&shared), Arc::clone(&slot)));
        tokio::spawn(flusher(Arc::clone(&shared), alarm, slot));
        Ok(Self {
            conn: Some(conn),
            file,
            db_name,
            guard,
            deadline,
            shared,
            in_event: false,
            event_aborted: None,
            committed_alarm: alarm,
            event_alarm: alarm,
            records_since_snapshot: restored.records_since_snapshot,
            bytes_since_snapshot: restored.bytes_since_snapshot,
            local_failure: None,
            background: Some(background),
        })
    }

    /// Closes the store, as dropping it does, and waits until its work in
    /// the background is done: the queued records written, the last
    /// snapshot written and what it covers deleted.
    pub async fn close(mut self) {
        let background = self.background.take();
        drop(self);
        if let Some(background) = background {
            // A panic there was logged by the runtime; nothing to add.
            let _ = background.await;
        }
    }

    /// [`close`](Self::close) for a store its owner cannot give up (it
    /// lives in a guest's host): afterwards no event runs on it, and
    /// nothing of it writes to the bucket again, so its objects can be
    /// deleted (`wasmkeep actor delete`, ADR 0055).
    pub async fn close_in_place(&mut self) {
        self.local_failure = Some("the store was closed".to_owned());
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(background) = self.background.take() {
            let _ = background.await;
        }
    }

    /// True when the actor has any data in the bucket.
    pub async fn exists(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<bool> {
        let page = bucket.list_page(&keys.actor_prefix(actor), None).await?;
        Ok(!page.objects.is_empty())
    }

    /// The committed alarm, read from the newest record's header (nothing is
    /// kept open and no component is needed).
    pub async fn read_alarm(
        bucket: Arc<dyn Bucket>,
        keys: &Keys,
        actor: &ActorId,
    ) -> Result<Option<i64>> {
        restore::alarm(&*bucket, keys, actor).await
    }

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
        match &self.shared.state.lock().failure {
            Some(f) => Err(self.shared.error_for(f)),
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

    fn guest_call<T>(
        &mut self,
        run: impl FnOnce(&Connection, usize) -> rusqlite::Result<T>,
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
        *self.deadline.lock() = Some(Instant::now() + self.shared.config.statement_time_max);
        self.guard.set_guest(true);
        let Some(conn) = self.conn.as_ref() else {
            self.guard.set_guest(false);
            *self.deadline.lock() = None;
            return Err(SqlError::new("internal: an event without a connection"));
        };
        let result = run(conn, self.shared.config.query_bytes_max);
        self.guard.set_guest(false);
        *self.deadline.lock() = None;
        let result = result.map_err(|e| {
            let mut e = sql::guest_error(e, &self.guard);
            if e.message == "interrupted" {
                e.message = format!(
                    "interrupted: the statement ran longer than statement_time_max ({:?})",
                    self.shared.config.statement_time_max
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
        self.guest_call(|conn, _| {
            let mut stmt = conn.prepare_cached(sql)?;
            // Refused before it runs: SQLite makes a `RETURNING` statement's
            // writes at its first step, and refusing it after that step
            // reported an error for a write that was made.
            if stmt.column_count() > 0 {
                return Err(rusqlite::Error::ExecuteReturnedResults);
            }
            let before = conn.total_changes();
            stmt.execute(params_from_iter(params.iter()))?;
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
    pub fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, SqlError> {
        check_statement_text(sql)?;
        let mut too_big = false;
        let out = self.guest_call(|conn, bytes_max| {
            let mut stmt = conn.prepare_cached(sql)?;
            let columns: Vec<String> = stmt.column_names().into_iter().map(str::to_owned).collect();
            let n = columns.len();
            let mut rows = stmt.query(params_from_iter(params.iter()))?;
            let mut out = QueryRows {
                columns,
                rows: Vec::new(),
            };
            let mut bytes = 0usize;
            while let Some(row) = rows.next()? {
                let mut values = Vec::with_capacity(n);
                for i in 0..n {
                    let v = SqlValue::from_ref(row.get_ref(i)?);
                    bytes += v.cost_bytes();
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
    fn connection(&mut self) -> Result<&Conn> {
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
                    && self.records_since_snapshot >= crate::EARLY_SNAPSHOT_RECORDS_MIN
                    && self.shared.bucket.short_lived_objects_are_cheap()
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

impl Drop for ActorStore {
    fn drop(&mut self) {
        // The flusher finishes the queued records (their gates may still be
        // awaited) and then exits.
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
        MemFile::unregister(&self.db_name);
    }
}

/// Refuses what is not one statement before SQLite sees it.
fn check_statement_text(sql: &str) -> Result<(), SqlError> {
    if sql.trim().trim_end_matches(';').trim().is_empty() {
        return Err(SqlError::new("empty SQL: send one statement"));
    }
    Ok(())
}

// ---- the flusher --------------------------------------------------------

async fn flusher(shared: Arc<Shared>, durable_alarm: Option<i64>, snapshots: Arc<SnapshotSlot>) {
    write_records(&shared, durable_alarm, &snapshots).await;
    snapshots.finish();
}

/// What the flusher does next.
enum Next {
    /// The record, and how it is put.
    Write(Pending, Haste),
    /// Nothing queued: wait for a commit.
    Idle,
    /// Linger: more events are expected for the queued record (see
    /// [`LINGER_TIME_MAX`]); wait for a commit or the deadline.
    Linger(tokio::time::Instant),
}

/// Writes queued records until the store is closed and drained, or a record fails.
///
/// Group commit lingers: when a record of `k` events becomes durable while
/// `q` events wait for the next one, the `k` writers whose responses it
/// releases usually send their next events within microseconds. Starting
/// the next record at once would carry only the `q` and leave the `k` for
/// the record after, splitting the writers into two alternating groups
/// (half the events per record). So the next record waits until it holds
/// `k + q` events, or [`LINGER_TIME_MAX`] passed. A lone writer (`k = 1`,
/// `q = 0`) never waits: its next event is the whole group.
async fn write_records(
    shared: &Arc<Shared>,
    mut durable_alarm: Option<i64>,
    snapshots: &SnapshotSlot,
) {
    // (events expected in the next record, until when to wait for them)
    // Tokio's clock, so that the simulation's virtual time drives it.
    let mut linger: Option<(u32, tokio::time::Instant)> = None;
    loop {
        let next = {
            let mut st = shared.state.lock();
            if st.failure.is_some() {
                return;
            }
            // The linger still on: the one queued record is short of the
            // events expected and the deadline has not passed.
            let lingering = match (st.queue.front(), linger) {
                (Some(front), Some((expected, until)))
                    if !st.closed
                        && st.queue.len() == 1
                        && front.events < expected
                        && tokio::time::Instant::now() < until =>
                {
                    Some((expected, until))
                }
                _ => None,
            };
            st.lingering_for = lingering.map(|(expected, _)| expected);
            match lingering {
                Some((_, until)) => Next::Linger(until),
                None => match st.queue.pop_front() {
                    // One event, nothing behind it: its writer waits for
                    // this record alone (ADR 0045).
                    Some(p) if p.events == 1 && st.queue.is_empty() => Next::Write(p, Haste::Alone),
                    Some(p) => Next::Write(p, Haste::Hurried),
                    None if st.closed => return,
                    None => Next::Idle,
                },
            }
        };
        let (rec, haste) = match next {
            Next::Write(rec, haste) => (rec, haste),
            Next::Idle => {
                shared.wake.notified().await;
                continue;
            }
            Next::Linger(until) => {
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(until) => {}
                }
                continue;
            }
        };
        // Boxed (and the snapshot writer's steps): these tasks live as long
        // as the store, mostly idle, and an inline bucket write sized each
        // of their futures at ~900 bytes (ADR 0038).
        match Box::pin(write_record(shared, &rec, haste, &mut durable_alarm)).await {
            Ok(()) => {
                let queued: u32 = shared.state.lock().queue.iter().map(|p| p.events).sum();
                let lingers = rec.events + queued >= 2;
                linger = lingers.then(|| {
                    (
                        rec.events + queued,
                        tokio::time::Instant::now() + LINGER_TIME_MAX,
                    )
                });
                if let Some(image) = rec.image {
                    let snap = Snapshot {
                        seq: rec.seq,
                        alarm_ms: rec.alarm_ms,
                        image,
                        // A lone writer's next record comes at once: the
                        // snapshot goes with it. One that lingers may come
                        // only after the snapshot could have been flushed
                        // on its own (ADR 0041).
                        haste: if lingers {
                            Haste::Hurried
                        } else {
                            Haste::Unhurried
                        },
                    };
                    snapshots.offer(shared, snap);
                }
                shared.progress.send_modify(|p| p.durable_seq = rec.seq);
            }
            Err(kind) => {
                let failure = Failure { seq: rec.seq, kind };
                tracing::warn!(actor = %shared.actor, seq = rec.seq, failure = ?failure.kind, "log record failed; store unusable");
                {
                    let mut st = shared.state.lock();
                    st.failure = Some(failure.clone());
                    st.queue.clear();
                }
                shared.progress.send_modify(|p| p.failure = Some(failure));
                return;
            }
        }
    }
}

async fn write_record(
    shared: &Shared,
    rec: &Pending,
    haste: Haste,
    durable_alarm: &mut Option<i64>,
) -> Result<(), FailureKind> {
    let header = Header {
        kind: Kind::Log,
        seq: rec.seq,
        db_pages: rec.db_pages,
        alarm_ms: rec.alarm_ms,
        actor: &shared.actor_text,
        node: &shared.writer.node,
        incarnation: &shared.writer.incarnation,
    };
    let body = record::encode(&header, rec.pages.iter().map(|(i, p)| (*i, &**p)));
    let alarm_key = || shared.keys.alarm(&shared.actor);
    // Alarm index before a record that sets the alarm: the sweep may then see
    // an alarm that is not committed (it checks), never miss one that is.
    if let Some(at) = rec.alarm_ms
        && rec.alarm_ms != *durable_alarm
    {
        put_retrying(
            &*shared.bucket,
            &alarm_key(),
            Bytes::from(at.to_string()),
            &shared.config,
        )
        .await
        .map_err(|e| FailureKind::Broken(format!("alarm index not written: {e}")))?;
    }
    let key = Keys::log_under(&shared.log_prefix, rec.seq);
    put_settled(&*shared.bucket, &key, body, &shared.config, haste).await?;
    let before = std::mem::replace(durable_alarm, rec.alarm_ms);
    // ... and deleted only after the record that clears it.
    if rec.alarm_ms.is_none()
        && before.is_some()
        && let Err(e) = delete_retrying(&*shared.bucket, &alarm_key(), &shared.config).await
    {
        tracing::warn!(actor = %shared.actor, error = %e, "alarm index not deleted; the sweep will find no alarm");
    }
    Ok(())
}

/// put-if-absent of a record whose body is unique to this writer, settled:
/// `Ok` once our bytes are in the bucket under `key`; `Fenced` when other
/// bytes are; `Broken` when the bucket would not tell within the retries.
/// `haste` picks the bucket request: whether a response waits for this
/// write ([`Haste::Unhurried`] when none does), and whether its writer
/// waits for nothing else ([`Haste::Alone`]).
pub(crate) async fn put_settled(
    bucket: &dyn Bucket,
    key: &str,
    body: Bytes,
    config: &StoreConfig,
    haste: Haste,
) -> Result<(), FailureKind> {
    let record = Fenced::new(bucket, key);
    let mut backoff = config.write_retry_backoff;
    let mut last_error: String;
    let started = tokio::time::Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match record.create_with(body.clone(), haste).await {
            Ok(Outcome::Done(_)) => return Ok(()),
            Ok(Outcome::Conflict) => {
                // Ours (an earlier attempt that applied) or another writer's?
                match record.read().await {
                    Ok(Some(current)) if current.value == body => return Ok(()),
                    Ok(Some(_)) => return Err(FailureKind::Fenced),
                    // It existed a moment ago: another writer compacted it away.
                    Ok(None) => return Err(FailureKind::Fenced),
                    Err(e) => last_error = e.to_string(),
                }
            }
            // Tried again: the next attempt's conflict, if it applied, is
            // read back.
            Ok(Outcome::Unknown(e)) => last_error = e.to_string(),
            Err(e @ BucketError::Unavailable { .. }) => last_error = e.to_string(),
            // A put-if-absent answered "not found" breaks the bucket's
            // contract: the store breaks, naming it.
            Ok(Outcome::Gone) => {
                return Err(FailureKind::Broken(
                    BucketError::NotFound {
                        key: key.to_owned(),
                    }
                    .to_string(),
                ));
            }
            Err(e) => return Err(FailureKind::Broken(e.to_string())),
        }
        if !retry_allowed(attempts, started, config) {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
    }
    // Out of attempts (or time): one last read decides if an attempt applied.
    match record.read().await {
        Ok(Some(current)) if current.value == body => Ok(()),
        Ok(Some(_)) => Err(FailureKind::Fenced),
        Ok(None) => Err(FailureKind::Broken(format!(
            "{attempts} {} failed (last: {last_error}); read-back: {}",
            if attempts == 1 { "attempt" } else { "attempts" },
            BucketError::NotFound {
                key: key.to_owned()
            }
        ))),
        Err(e) => Err(FailureKind::Broken(format!(
            "{attempts} {} failed (last: {last_error}); read-back: {e}",
            if attempts == 1 { "attempt" } else { "attempts" }
        ))),
    }
}

/// Whether a write that failed `attempts` times since `started` may be
/// tried again ([`StoreConfig::write_attempts_max`],
/// [`StoreConfig::write_time_max`]).
fn retry_allowed(attempts: u32, started: tokio::time::Instant, config: &StoreConfig) -> bool {
    attempts < config.write_attempts_max && started.elapsed() < config.write_time_max
}

async fn put_retrying(
    bucket: &dyn Bucket,
    key: &str,
    body: Bytes,
    config: &StoreConfig,
) -> Result<(), BucketError> {
    retrying(key, config, || bucket.put(key, body.clone()))
        .await
        .map(|_| ())
}

async fn delete_retrying(
    bucket: &dyn Bucket,
    key: &str,
    config: &StoreConfig,
) -> Result<(), BucketError> {
    retrying(key, config, || bucket.delete(key)).await
}

/// Runs a write that may be repeated (an unconditional put, a delete) until
/// it succeeds, fails for good, or [`retry_allowed`] says no more:
/// `Unavailable` and `OutcomeUnknown` are tried again after a doubling
/// backoff.
async fn retrying<T, F>(
    key: &str,
    config: &StoreConfig,
    mut write: impl FnMut() -> F,
) -> Result<T, BucketError>
where
    F: std::future::Future<Output = Result<T, BucketError>>,
{
    let mut backoff = config.write_retry_backoff;
    let mut attempt = 1;
    let started = tokio::time::Instant::now();
    loop {
        match write().await {
            Ok(done) => return Ok(done),
            Err(e @ (BucketError::Unavailable { .. } | BucketError::OutcomeUnknown { .. }))
                if retry_allowed(attempt, started, config) =>
            {
                tracing::debug!(key, error = %e, "retrying a write");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
        attempt += 1;
    }
}

// ---- snapshots ----------------------------------------------------------------

struct Snapshot {
    seq: u64,
    alarm_ms: Option<i64>,
    image: Vec<SharedPage>,
    /// How it is put ([`Haste::Unhurried`] when no one waits for it).
    haste: Haste,
}

/// The next snapshot to write: one slot, the newest image wins. A snapshot
/// waiting while an older one is written is replaced by a newer one (which
/// covers more), so the writer never falls behind by more than one.
#[derive(Default)]
struct SnapshotSlot {
    next: Mutex<Option<Snapshot>>,
    /// Set when the flusher has exited: no more snapshots will come.
    done: std::sync::atomic::AtomicBool,
    wake: Notify,
}

impl SnapshotSlot {
    fn offer(&self, shared: &Shared, snap: Snapshot) {
        let replaced = self.next.lock().replace(snap);
        match replaced {
            Some(old) => {
                tracing::debug!(actor = %shared.actor, seq = old.seq, "snapshot superseded before it was written")
            }
            None => shared.progress.send_modify(|p| p.snapshots_pending += 1),
        }
        self.wake.notify_one();
    }

    fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

/// Writes snapshots one at a time, then deletes what they cover. A failure
/// here loses nothing (the log is still whole): it is logged and the next
/// threshold tries again.
async fn snapshot_writer(shared: Arc<Shared>, slot: Arc<SnapshotSlot>) {
    let mut known: Option<Known> = None;
    loop {
        let next = slot.next.lock().take();
        let Some(snap) = next else {
            if slot.done.load(Ordering::SeqCst) {
                return;
            }
            slot.wake.notified().await;
            continue;
        };
        let written = Box::pin(write_snapshot(&shared, &snap)).await;
        // A flush (hand-over, hibernation) waits for the snapshot, not for
        // the cleanup of what it covers.
        shared.progress.send_modify(|p| p.snapshots_pending -= 1);
        // Even one that failed may be in the bucket (the reply was lost).
        if let Some(known) = &mut known {
            known.snapshots.push(snap.seq);
        }
        match written {
            Ok(()) => {
                if let Err(e) = Box::pin(compact(&shared, &slot, &mut known, snap.seq)).await {
                    tracing::warn!(actor = %shared.actor, seq = snap.seq, error = %e, "compaction after a snapshot failed; the next one retries");
                }
            }
            Err(e) => {
                tracing::warn!(actor = %shared.actor, seq = snap.seq, error = %e, "snapshot not written");
            }
        }
    }
}

/// What a compaction knows to delete without listing: everything this
/// store wrote after the last compaction that succeeded.
struct Known {
    /// Every log record up to this one is deleted; each after it was
    /// written by this store.
    records_deleted_through: u64,
    /// Snapshots that may be in the bucket, oldest first.
    snapshots: Vec<u64>,
    /// Compactions since the last one that listed.
    unlisted: u32,
}

/// A compaction lists the actor's keys once in this many (and always the
/// first after the store opened): records a listing finds that the store
/// does not know of are leftovers of an earlier writer, such as a
/// compaction cut short by a crash, or a snapshot that a writer whose lease
/// ran out wrote after the restore listed. Between listings a compaction
/// deletes what this store wrote, which costs no listing (two per
/// snapshot, with a snapshot every eight records of a small database).
const COMPACTIONS_PER_LISTING: u32 = 64;

async fn write_snapshot(shared: &Shared, snap: &Snapshot) -> Result<()> {
    let header = Header {
        kind: Kind::Snapshot,
        seq: snap.seq,
        db_pages: u32::try_from(snap.image.len()).expect("bounded by max_page_count"),
        alarm_ms: snap.alarm_ms,
        actor: &shared.actor_text,
        node: &shared.writer.node,
        incarnation: &shared.writer.incarnation,
    };
    let body = record::encode(
        &header,
        snap.image.iter().enumerate().map(|(i, p)| (i as u32, &**p)),
    );
    let key = shared.keys.actor_snapshot(&shared.actor, snap.seq);
    match put_settled(&*shared.bucket, &key, body, &shared.config, snap.haste).await {
        Ok(()) => {}
        Err(kind) => {
            return Err(Error::Broken {
                actor: shared.actor.clone(),
                seq: snap.seq,
                reason: format!("snapshot: {kind:?}"),
            });
        }
    }
    Ok(())
}

/// Deletes the records and snapshots a durable snapshot at `seq` covers:
/// those `known` names, or those a listing finds (see
/// [`COMPACTIONS_PER_LISTING`]); `known` then says what is left.
/// Older snapshots go at once; log records as many as this actor writes
/// meanwhile (sixteen at a time), the rest at once when a newer snapshot waits, the store
/// closes, or the actor writes nothing for [`COMPACTION_IDLE`]. Paced, a
/// node's deletes follow its writes: many actors that reach their snapshot
/// together (a uniform load) would otherwise delete a quarter of a million
/// files within seconds, more than the folder bucket keeps for reuse, and
/// every file created in the next minutes on ext4 without a journal scans
/// past the inodes freed (ADR 0027). A restore racing it lists again.
async fn compact(
    shared: &Shared,
    slot: &SnapshotSlot,
    known: &mut Option<Known>,
    seq: u64,
) -> Result<()> {
    let bucket = &*shared.bucket;
    let listing = known
        .as_ref()
        .is_none_or(|k| k.unlisted + 1 >= COMPACTIONS_PER_LISTING);
    let (records, snapshots): (Vec<u64>, Vec<String>) = match known.as_ref() {
        Some(k) if !listing => (
            (k.records_deleted_through + 1..=seq).collect(),
            k.snapshots
                .iter()
                .filter(|s| **s < seq)
                .map(|s| shared.keys.actor_snapshot(&shared.actor, *s))
                .collect(),
        ),
        _ => {
            let mut records: Vec<u64> = bucket
                .list_keys(&shared.keys.actor_log_prefix(&shared.actor))
                .await?
                .into_iter()
                .filter_map(|listed| Keys::parse_seq(&listed.key).ok())
                .filter(|s| *s <= seq)
                .collect();
            records.sort_unstable();
            let snapshots = bucket
                .list_keys(&shared.keys.actor_snapshot_prefix(&shared.actor))
                .await?
                .into_iter()
                .filter(|listed| Keys::parse_seq(&listed.key).is_ok_and(|s| s < seq))
                .map(|listed| listed.key)
                .collect();
            (records, snapshots)
        }
    };
    delete_all(bucket, snapshots).await?;
    let record_key = |s: &u64| Keys::log_under(&shared.log_prefix, *s);
    let mut progress = shared.progress.subscribe();
    let start = progress.borrow_and_update().durable_seq;
    // Sixteen at a time (one batch for the folder bucket's committer), the
    // n-th sixteen once n x 16 records were written since.
    for (n, chunk) in records.chunks(COMPACTION_DELETES_PER_STEP).enumerate() {
        let done = n * COMPACTION_DELETES_PER_STEP;
        if !paced(&mut progress, slot, start + done as u64).await {
            delete_all(bucket, records[done..].iter().map(record_key).collect()).await?;
            break;
        }
        delete_all(bucket, chunk.iter().map(record_key).collect()).await?;
    }
    // Everything up to `seq` is gone; what this store writes from now on
    // is all there is.
    let unlisted = match known.as_ref() {
        Some(k) if !listing => k.unlisted + 1,
        _ => 0,
    };
    let mut snapshots_left = known.take().map(|k| k.snapshots).unwrap_or_default();
    snapshots_left.retain(|s| *s >= seq);
    if !snapshots_left.contains(&seq) {
        snapshots_left.insert(0, seq);
    }
    *known = Some(Known {
        records_deleted_through: seq,
        snapshots: snapshots_left,
        unlisted,
    });
    Ok(())
}

/// Waits until the actor's records up to `due` are durable: `true`; `false`
/// when compaction should rather finish at once (see [`compact`]).
async fn paced(progress: &mut watch::Receiver<Progress>, slot: &SnapshotSlot, due: u64) -> bool {
    // One timer per call, looked at when it fires (not re-armed at every
    // record): idle means no record became durable since it was armed.
    let idle = tokio::time::sleep(COMPACTION_IDLE);
    tokio::pin!(idle);
    let mut armed_at = progress.borrow().durable_seq;
    loop {
        if slot.next.lock().is_some() || slot.done.load(Ordering::SeqCst) {
            return false;
        }
        let durable = {
            let now = progress.borrow_and_update();
            if now.failure.is_some() {
                return false;
            }
            now.durable_seq
        };
        if durable >= due {
            return true;
        }
        // A newer snapshot or the store's close also wake the slot; the
        // snapshot writer looks at both again before it waits.
        tokio::select! {
            changed = progress.changed() => if changed.is_err() { return false },
            () = slot.wake.notified() => {}
            () = &mut idle => {
                let durable = progress.borrow().durable_seq;
                if durable == armed_at {
                    return false;
                }
                armed_at = durable;
                idle.as_mut().reset(tokio::time::Instant::now() + COMPACTION_IDLE);
            }
        }
    }
}

/// Deletes `keys` as one bucket request where the bucket can
/// ([`Bucket::delete_all_not_durable`]).
pub(crate) async fn delete_all(bucket: &dyn Bucket, keys: Vec<String>) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    Ok(bucket.delete_all_not_durable(&keys).await?)
}

/// How many records a paced compaction deletes per step.
const COMPACTION_DELETES_PER_STEP: usize = 16;
/// A paced compaction (see [`compact`]) of an actor that wrote nothing for
/// this long deletes the rest at once.
const COMPACTION_IDLE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn the_store_moves_between_tasks_and_gates_outlive_it() {
        assert_send_static::<ActorStore>();
        assert_send_static::<OutputGate>();
    }

    #[test]
    fn connections_get_the_settings_whether_built_in_or_set() {
        // This workspace builds SQLite with them (.cargo/config.toml).
        assert!(defaults_built_in(), "LIBSQLITE3_FLAGS lost a setting");
        assert!(BUILT_IN_DEFAULTS.contains(&c"DEFAULT_PAGE_SIZE=4096") && PAGE_BYTES == 4096);
        assert!(BUILT_IN_DEFAULTS.contains(&c"DEFAULT_CACHE_SIZE=-1024") && PAGE_CACHE_KIB == 1024);
        crate::vfs::register_vfs();
        let name = "wasmkeep-db-settings-test";
        MemFile::register(name, Arc::new(Mutex::new(MemFile::with_pages(Vec::new()))));
        let config = StoreConfig::default();
        let conn = open_connection(
            name,
            &config,
            &Arc::new(Guard::default()),
            &Arc::new(Mutex::new(None)),
        )
        .expect("open");
        let pragma = |name: &str| -> String {
            conn.query_row(&format!("PRAGMA {name}"), [], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map(|v| format!("{v:?}"))
            .expect("pragma")
        };
        assert_eq!(pragma("page_size"), "Integer(4096)");
        assert_eq!(pragma("locking_mode"), "Text(\"exclusive\")");
        assert_eq!(pragma("journal_mode"), "Text(\"memory\")");
        assert_eq!(pragma("synchronous"), "Integer(0)");
        assert_eq!(pragma("cache_size"), "Integer(-1024)");
        let max_pages = config.database_bytes_max / PAGE_BYTES as u64;
        assert_eq!(pragma("max_page_count"), format!("Integer({max_pages})"));
        drop(conn);
        MemFile::unregister(name);
    }

    /// A store config whose writes give up after `attempts`.
    fn attempts(attempts: u32) -> StoreConfig {
        StoreConfig {
            write_attempts_max: attempts,
            ..StoreConfig::default()
        }
    }

    // Pins the bucket requests of a settled put, call for call: the
    // simulation's digests see every one of them.
    #[tokio::test(start_paused = true)]
    async fn a_settled_put_reads_back_only_after_a_conflict_or_its_last_attempt() {
        use wasmkeep_bucket::Fault;
        use wasmkeep_cluster::testing::{Meddling, Recorder};
        let bucket = Recorder::new();
        let ours = Bytes::from_static(b"ours");
        let put = |key: &'static str, haste: Haste, config: StoreConfig| {
            let (bucket, ours) = (&bucket, ours.clone());
            async move { put_settled(bucket, key, ours, &config, haste).await }
        };
        let six = StoreConfig::default;
        // Each haste its own request.
        assert!(put("a/1", Haste::Hurried, six()).await.is_ok());
        assert!(put("a/2", Haste::Unhurried, six()).await.is_ok());
        assert!(put("a/3", Haste::Alone, six()).await.is_ok());
        // A lost reply: tried again, the conflict read back, ours.
        bucket.inner.faults().push(Fault::ReplyLost);
        assert!(put("a/4", Haste::Alone, six()).await.is_ok());
        // Another writer's bytes: fenced.
        bucket
            .inner
            .put("a/5", Bytes::from_static(b"theirs"))
            .await
            .unwrap();
        assert!(matches!(
            put("a/5", Haste::Hurried, six()).await,
            Err(FailureKind::Fenced)
        ));
        // The read-back fails: tried again.
        bucket.inner.put("a/6", ours.clone()).await.unwrap();
        let mut reads = 0;
        bucket.meddle(Some(Box::new(move |op, _| {
            reads += u32::from(op == "get");
            (op == "get" && reads == 1).then_some(Meddling::Unavailable)
        })));
        assert!(put("a/6", Haste::Hurried, six()).await.is_ok());
        // Gone by the read-back (compacted by another writer): fenced.
        bucket.inner.faults().push(Fault::ReplyLost);
        bucket.meddle(Some(Box::new(|op, key| {
            (op == "get" && key == "a/7").then(|| Meddling::Delete("a/7".to_owned()))
        })));
        assert!(matches!(
            put("a/7", Haste::Hurried, six()).await,
            Err(FailureKind::Fenced)
        ));
        bucket.meddle(None);
        // Out of attempts: one last read decides.
        for _ in 0..2 {
            bucket.inner.faults().push(Fault::Unavailable);
        }
        let broken = put("a/8", Haste::Hurried, attempts(2)).await;
        assert!(
            matches!(&broken, Err(FailureKind::Broken(reason)) if reason ==
                "2 attempts failed (last: bucket unavailable (a/8): injected: one-shot unavailable); read-back: not found: a/8"),
            "{broken:?}"
        );
        bucket.inner.faults().push(Fault::Unavailable);
        bucket.inner.faults().push(Fault::ReplyLost);
        assert!(put("a/9", Haste::Hurried, attempts(2)).await.is_ok());
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent a/1 #7e3ebd7e -> ok",
                "put_if_absent_unhurried a/2 #7e3ebd7e -> ok",
                "put_if_absent_alone a/3 #7e3ebd7e -> ok",
                "put_if_absent_alone a/4 #7e3ebd7e -> unknown",
                "put_if_absent_alone a/4 #7e3ebd7e -> conflict",
                "get a/4 -> ok",
                "put_if_absent a/5 #7e3ebd7e -> conflict",
                "get a/5 -> ok",
                "put_if_absent a/6 #7e3ebd7e -> conflict",
                "get a/6 -> unavailable",
                "put_if_absent a/6 #7e3ebd7e -> conflict",
                "get a/6 -> ok",
                "put_if_absent a/7 #7e3ebd7e -> unknown",
                "put_if_absent a/7 #7e3ebd7e -> conflict",
                "get a/7 -> not found",
                "put_if_absent a/8 #7e3ebd7e -> unavailable",
                "put_if_absent a/8 #7e3ebd7e -> unavailable",
                "get a/8 -> not found",
                "put_if_absent a/9 #7e3ebd7e -> unavailable",
                "put_if_absent a/9 #7e3ebd7e -> unknown",
                "get a/9 -> ok",
            ]
        );
    }

    #[test]
    fn statement_text_must_hold_a_statement() {
        assert!(check_statement_text(" ; ").is_err());
        assert!(check_statement_text("").is_err());
        assert!(check_statement_text("SELECT 1;").is_ok());
    }
}

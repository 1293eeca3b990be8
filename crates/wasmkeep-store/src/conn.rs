//! An actor's SQLite connection with the store's own two statements, BEGIN
//! and COMMIT, prepared once per connection (preparing them for every event
//! cost ~2 % of a small event's CPU).
//!
//! They are kept out of rusqlite's statement cache on purpose: the guest's
//! statements use that cache, and a cached statement is not authorized
//! again, so a guest sending the same text would run ours unchecked.

use std::ffi::{CStr, c_int};
use std::ops::Deref;
use std::ptr::NonNull;

use rusqlite::{Connection, ffi};

/// A connection and the store's statements on it. Field order matters: the
/// statements are finalized (dropped) before the connection closes.
pub(crate) struct Conn {
    begin: RawStatement,
    commit: RawStatement,
    sql: Connection,
}

impl Conn {
    pub(crate) fn new(sql: Connection) -> rusqlite::Result<Conn> {
        Ok(Conn {
            begin: RawStatement::prepare(&sql, c"BEGIN")?,
            commit: RawStatement::prepare(&sql, c"COMMIT")?,
            sql,
        })
    }

    pub(crate) fn begin(&self) -> rusqlite::Result<()> {
        self.begin.run(&self.sql)
    }

    pub(crate) fn commit(&self) -> rusqlite::Result<()> {
        self.commit.run(&self.sql)
    }
}

impl Deref for Conn {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.sql
    }
}

/// A prepared statement owned outside rusqlite; only [`Conn`] makes one, on
/// its own connection, and drops it before that connection.
struct RawStatement(NonNull<ffi::sqlite3_stmt>);

// SAFETY: the statement only moves together with its connection (inside a
// Conn), which rusqlite lets move between threads; SQLite (multi-thread
// mode) allows that as long as no two threads use them at once, and Conn is
// not Sync.
unsafe impl Send for RawStatement {}

impl RawStatement {
    fn prepare(conn: &Connection, sql: &CStr) -> rusqlite::Result<RawStatement> {
        let mut stmt = std::ptr::null_mut();
        // SAFETY: an open connection's handle, a NUL-terminated statement,
        // and an out pointer SQLite sets (to null on failure).
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(
                conn.handle(),
                sql.as_ptr(),
                -1,
                &raw mut stmt,
                std::ptr::null_mut(),
            )
        };
        match NonNull::new(stmt) {
            Some(stmt) if rc == ffi::SQLITE_OK => Ok(RawStatement(stmt)),
            Some(stmt) => {
                // SAFETY: a statement SQLite gave us, finalized once.
                unsafe { ffi::sqlite3_finalize(stmt.as_ptr()) };
                Err(last_error(conn, rc))
            }
            None => Err(last_error(conn, rc)),
        }
    }

    /// Runs the statement to completion (it returns no rows).
    fn run(&self, conn: &Connection) -> rusqlite::Result<()> {
        // SAFETY: the statement was prepared on `conn` (Conn keeps the two
        // together) and is not running elsewhere: a connection is used by
        // one thread at a time.
        unsafe {
            let rc = ffi::sqlite3_step(self.0.as_ptr());
            let result = if rc == ffi::SQLITE_DONE {
                Ok(())
            } else {
                Err(last_error(conn, rc))
            };
            ffi::sqlite3_reset(self.0.as_ptr());
            result
        }
    }
}

impl Drop for RawStatement {
    fn drop(&mut self) {
        // SAFETY: ours, finalized exactly once, before its connection closes
        // (see Conn's field order).
        unsafe {
            ffi::sqlite3_finalize(self.0.as_ptr());
        }
    }
}

/// The connection's last error, with SQLite's message.
fn last_error(conn: &Connection, rc: c_int) -> rusqlite::Error {
    // SAFETY: sqlite3_errmsg returns a NUL-terminated string owned by the
    // connection, valid until its next call; it is copied at once.
    let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(conn.handle())) }
        .to_string_lossy()
        .into_owned();
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), Some(message))
}

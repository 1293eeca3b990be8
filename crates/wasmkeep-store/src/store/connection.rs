//! SQLite's connection to an actor's in-memory database: the settings it
//! opens with (built into the bundled SQLite where they can be, ADR 0028),
//! the authorizer and the statement deadline, and the read of the alarm
//! table at open.

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::conn::Conn;
use crate::sql::{self, Guard};
use crate::vfs::{PAGE_BYTES, VFS_NAME};
use crate::{Error, Result, StoreConfig};

/// Statements kept prepared per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;
/// SQLite's page cache per connection, KiB. The file itself is in memory, so
/// a large cache would only hold a second copy of hot pages.
const PAGE_CACHE_KIB: u32 = 1024;

/// SQLite VM steps between two checks of the statement deadline.
const PROGRESS_STEPS: i32 = 10_000;

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

pub(super) fn open_connection(
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

/// Whether the database has the table `name` (the store's own tables are
/// made at their first write).
pub(crate) fn has_table(conn: &Connection, name: &str) -> Result<bool> {
    let found: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()?;
    Ok(found.is_some())
}

pub(crate) fn read_alarm_table(conn: &Connection) -> Result<Option<i64>> {
    if !has_table(conn, "_wasmkeep_alarm")? {
        return Ok(None);
    }
    let at: Option<Option<i64>> = conn
        .query_row("SELECT at_ms FROM _wasmkeep_alarm WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(at.flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::MemFile;

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
}

//! A whole database to put in place of an actor's (`wasmkeep actor import`,
//! ADR 0069; `actor delete` puts the empty one): a SQLite file checked
//! before anything is written, and what an actor's data in the bucket says
//! about an import.
//!
//! A file is accepted only if SQLite's own checks pass on it: the header
//! (`SQLite format 3`, 4096-byte pages, rollback journal, its page count
//! equal to the file's length), then `PRAGMA integrity_check`, then the
//! store's alarm table if there is one. The import's request id is written
//! into the image's `_wasmkeep_operator` table, as an operator's statement
//! records its result (ADR 0065): a node that carries the import out again
//! (it stopped after the write and before it reported) finds the id in the
//! actor's data and does not replace what the actor wrote since.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension as _};
use wasmkeep_bucket::Bucket;
use wasmkeep_types::{ActorId, Keys};

use crate::page::PageData;
use crate::store::{has_table, read_alarm_table};
use crate::vfs::{MemFile, PAGE_BYTES, Page, SharedFile, SharedPage, VFS_NAME};
use crate::{Error, Result};

/// What every SQLite database file starts with.
const MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// The header's size; the first page holds it.
const HEADER_BYTES: usize = 100;

/// Names of the in-memory files opened here (apart from the stores').
static FILE_NAMES: AtomicU64 = AtomicU64::new(0);

/// A database image checked whole: its pages and the alarm its
/// `_wasmkeep_alarm` table holds.
#[derive(Debug, Clone, Default)]
pub struct Image {
    pages: Vec<SharedPage>,
    alarm_ms: Option<i64>,
}

impl Image {
    /// The database of no pages and no alarm (what a delete leaves).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Checks `file` (the bytes of a SQLite database file) and reads it as
    /// an image no larger than `bytes_max`. With `request`, the import's id
    /// is recorded in the image (see the module). Every refusal is
    /// [`Error::BadImage`] with the reason.
    pub fn from_file(file: &[u8], bytes_max: u64, request: Option<&str>) -> Result<Self> {
        check_header(file)?;
        if file.len() as u64 > bytes_max {
            return Err(bad(format!(
                "the database is {} bytes, more than the {bytes_max} an actor's may hold",
                file.len()
            )));
        }
        let pages = file
            .chunks_exact(PAGE_BYTES)
            .map(|chunk| {
                let page: &Page = chunk.try_into().expect("chunks of one page");
                Arc::new(PageData::new(page))
            })
            .collect();
        with_connection(pages, |conn| {
            let verdict: Vec<String> = conn
                .prepare("PRAGMA integrity_check(20)")?
                .query_map([], |row| row.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            if verdict != ["ok"] {
                return Err(bad(format!(
                    "SQLite's integrity check failed: {}",
                    verdict.join("; ")
                )));
            }
            let alarm_ms = read_alarm_table(conn)
                .map_err(|e| bad(format!("its _wasmkeep_alarm table is not the store's: {e}")))?;
            if let Some(request) = request {
                conn.execute_batch(
                    "CREATE TABLE IF NOT EXISTS _wasmkeep_operator (seq INTEGER PRIMARY KEY, \
                     request TEXT NOT NULL UNIQUE, result TEXT NOT NULL)",
                )
                .and_then(|()| {
                    conn.execute(
                        "INSERT OR REPLACE INTO _wasmkeep_operator (request, result) \
                         VALUES (?1, 'imported')",
                        [request],
                    )
                })
                .map_err(|e| {
                    bad(format!(
                        "its _wasmkeep_operator table is not the store's: {e}"
                    ))
                })?;
            }
            Ok(alarm_ms)
        })
        .map(|(pages, alarm_ms)| Self { pages, alarm_ms })
    }

    /// Pages in the database.
    pub fn db_pages(&self) -> u32 {
        u32::try_from(self.pages.len()).expect("bounded by the database maximum")
    }

    pub fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES as u64
    }

    /// The alarm the database holds (the store's `_wasmkeep_alarm` table).
    pub fn alarm_ms(&self) -> Option<i64> {
        self.alarm_ms
    }

    pub(crate) fn pages(&self) -> &[SharedPage] {
        &self.pages
    }
}

/// What an actor's data in the bucket says about import `request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// The actor has no data (never written, or deleted).
    Empty,
    /// Its data came from this import (or grew from it since).
    ThisOne,
    /// It has data of its own.
    Other,
}

/// Restores the actor and tells [`Imported`]. The caller holds the actor's
/// ownership record and every record of its store has landed, so the
/// bucket holds its committed state.
pub async fn imported(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
    request: &str,
) -> Result<Imported> {
    let restored = crate::restore::load(bucket, keys, actor).await?;
    if restored.pages.is_empty() {
        return Ok(Imported::Empty);
    }
    let (_, this_one) = with_connection(restored.pages, |conn| {
        if !has_table(conn, "_wasmkeep_operator")? {
            return Ok(false);
        }
        Ok(conn
            .query_row(
                "SELECT 1 FROM _wasmkeep_operator WHERE request = ?1 AND result = 'imported'",
                [request],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    })?;
    Ok(if this_one {
        Imported::ThisOne
    } else {
        Imported::Other
    })
}

fn bad(reason: String) -> Error {
    Error::BadImage(reason)
}

/// The header checks (see the module), before SQLite reads a byte.
fn check_header(file: &[u8]) -> Result<()> {
    if file.len() < HEADER_BYTES || !file.starts_with(MAGIC) {
        return Err(bad(
            "not a SQLite database (no \"SQLite format 3\" header)".into()
        ));
    }
    let page_size = u16::from_be_bytes([file[16], file[17]]);
    if usize::from(page_size) != PAGE_BYTES {
        // 1 stands for 65536.
        let size = if page_size == 1 {
            65536
        } else {
            u32::from(page_size)
        };
        return Err(bad(format!(
            "its pages are {size} bytes; an actor's are {PAGE_BYTES} \
             (sqlite3 FILE 'PRAGMA page_size={PAGE_BYTES}; VACUUM' converts it)"
        )));
    }
    let (write_version, read_version) = (file[18], file[19]);
    if write_version == 2 || read_version == 2 {
        return Err(bad("it is in WAL mode; checkpoint it first \
             (sqlite3 FILE 'PRAGMA journal_mode=DELETE')"
            .into()));
    }
    if write_version != 1 || read_version != 1 {
        return Err(bad(format!(
            "its file format versions ({write_version}, {read_version}) are not SQLite 3's"
        )));
    }
    if !file.len().is_multiple_of(PAGE_BYTES) {
        return Err(bad(format!(
            "its length ({} bytes) is not a whole number of pages: truncated, or with bytes appended",
            file.len()
        )));
    }
    // The page count in the header is valid when the change counter equals
    // the version-valid-for number (SQLite 3.7.0 and later write both).
    let word = |at: usize| u32::from_be_bytes([file[at], file[at + 1], file[at + 2], file[at + 3]]);
    let pages = file.len() / PAGE_BYTES;
    if word(24) == word(92) && word(28) as usize != pages {
        return Err(bad(format!(
            "its header says {} pages where the file holds {pages}: truncated, or with bytes appended",
            word(28)
        )));
    }
    Ok(())
}

/// Opens `pages` as a database in memory on a plain connection (no
/// authorizer: the store's own tables are read and written here), runs
/// `f`, and gives back the pages as `f` left them.
fn with_connection<T>(
    pages: Vec<SharedPage>,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<(Vec<SharedPage>, T)> {
    let file: SharedFile = Arc::new(Mutex::new(MemFile::with_pages(pages)));
    let name = format!(
        "wasmkeep-image-{}",
        FILE_NAMES.fetch_add(1, Ordering::Relaxed)
    );
    MemFile::register(&name, Arc::clone(&file));
    let result = (|| {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let vfs = VFS_NAME.to_str().expect("the VFS name is ASCII");
        let conn = Connection::open_with_flags_and_vfs(&name, flags, vfs)?;
        let _: String = conn.query_row("PRAGMA journal_mode = MEMORY", [], |r| r.get(0))?;
        let value = f(&conn)?;
        conn.close().map_err(|(_, e)| Error::Sqlite(e))?;
        Ok(value)
    })();
    MemFile::unregister(&name);
    let value = result.map_err(|e| match e {
        Error::Sqlite(e) => bad(format!("SQLite cannot read it: {e}")),
        other => other,
    })?;
    let pages = file.lock().image();
    Ok((pages, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database file made by SQLite itself (the bundled one, on disk).
    fn sqlite_file(setup: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db.sqlite");
        let conn = Connection::open(&path).expect("opens");
        conn.execute_batch(setup).expect("sets up");
        drop(conn);
        std::fs::read(&path).expect("reads")
    }

    #[test]
    fn a_database_file_becomes_an_image_with_its_alarm_and_the_request() {
        let file = sqlite_file(
            "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);
             CREATE TABLE _wasmkeep_alarm (id INTEGER PRIMARY KEY CHECK (id = 1), at_ms INTEGER);
             INSERT INTO _wasmkeep_alarm VALUES (1, 1234);",
        );
        let image = Image::from_file(&file, 1 << 30, Some("00ff")).expect("accepted");
        assert_eq!(image.alarm_ms(), Some(1234));
        assert!(image.db_pages() >= 3, "{}", image.db_pages());
        let (_, (rows, request)) = with_connection(image.pages().to_vec(), |conn| {
            let rows: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
            let request: String = conn.query_row(
                "SELECT request FROM _wasmkeep_operator WHERE result = 'imported'",
                [],
                |r| r.get(0),
            )?;
            Ok((rows, request))
        })
        .expect("reads");
        assert_eq!((rows, request.as_str()), (2, "00ff"));
        let plain = Image::from_file(&file, 1 << 30, None).expect("accepted");
        assert_eq!(plain.alarm_ms(), Some(1234));
    }

    #[test]
    fn what_is_not_a_sound_database_of_ours_is_refused_with_its_reason() {
        let good = sqlite_file("CREATE TABLE t(x); INSERT INTO t VALUES (1);");
        let refused = |file: &[u8], max: u64| match Image::from_file(file, max, None) {
            Err(Error::BadImage(reason)) => reason,
            other => panic!("accepted or failed otherwise: {other:?}"),
        };
        assert!(refused(b"hello", 1 << 30).contains("not a SQLite database"));
        assert!(refused(&good[..good.len() - 1], 1 << 30).contains("whole number of pages"));
        assert!(refused(&good[..PAGE_BYTES], 1 << 30).contains("truncated"));
        let mut wal = good.clone();
        wal[18] = 2;
        wal[19] = 2;
        assert!(refused(&wal, 1 << 30).contains("WAL"));
        let big_pages = sqlite_file("PRAGMA page_size = 8192; CREATE TABLE t(x);");
        assert!(refused(&big_pages, 1 << 30).contains("8192"));
        assert!(refused(&good, 4096).contains("more than the 4096"));
        // A b-tree page overwritten with noise: the integrity check finds it.
        let mut corrupt = good.clone();
        let last = corrupt.len() - PAGE_BYTES;
        corrupt[last..last + 64].fill(0x5a);
        let reason = refused(&corrupt, 1 << 30);
        assert!(
            reason.contains("integrity") || reason.contains("cannot read"),
            "{reason}"
        );
        let bad_alarm = sqlite_file("CREATE TABLE _wasmkeep_alarm (x TEXT);");
        assert!(refused(&bad_alarm, 1 << 30).contains("_wasmkeep_alarm"));
    }
}

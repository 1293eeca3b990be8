//! The checks of a SQLite file given to `wasmkeep actor import`
//! ([`Image::from_file`], ADR 0069), given arbitrary input (issue 53,
//! item 6): any bytes, and a real database file with bytes changed, pages
//! cut off or pages added, are accepted or refused with
//! [`Error::BadImage`], never a panic or another error; the real file is
//! accepted. Property tests (proptest): `PROPTEST_CASES=N` sets the cases
//! per property (10,000 by default here, a few seconds in all; a long run
//! of every such test is `scripts/fuzz`); a failure is kept in
//! `tests/image.proptest-regressions`, committed, and run first from then
//! on.

use std::sync::OnceLock;

use proptest::prelude::*;
use wasmkeep_store::{Error, Image};

const PAGE_BYTES: usize = 4096;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        // Next to this file: `tests/image.proptest-regressions`, kept in
        // the repository and run first.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

/// A database file as SQLite writes it (on disk, rollback journal, 4096-byte
/// pages): tables, an index, a row long enough for overflow pages, and the
/// store's alarm table, so a damaged copy reaches every check.
fn database() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db.sqlite");
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch(
            "PRAGMA page_size = 4096;
             CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER);
             CREATE INDEX items_name ON items(name);
             WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 200)
               INSERT INTO items (name, n) SELECT 'item ' || i, i * 7 FROM k;
             CREATE TABLE blobs (b BLOB);
             INSERT INTO blobs VALUES (zeroblob(9000));
             CREATE TABLE _wasmkeep_alarm (id INTEGER PRIMARY KEY CHECK (id = 1), at_ms INTEGER);
             INSERT INTO _wasmkeep_alarm VALUES (1, 1234);",
        )
        .expect("sets up");
        drop(conn);
        std::fs::read(&path).expect("reads")
    })
}

/// Accepted, or refused with a reason: anything else fails the property.
fn accepted_or_refused(
    file: &[u8],
    bytes_max: u64,
    request: Option<&str>,
) -> Result<bool, TestCaseError> {
    match Image::from_file(file, bytes_max, request) {
        Ok(_) => Ok(true),
        Err(Error::BadImage(reason)) => {
            prop_assert!(!reason.is_empty());
            Ok(false)
        }
        Err(other) => Err(TestCaseError::fail(format!(
            "neither accepted nor refused: {other:?}"
        ))),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_real_database_file_is_accepted_with_its_alarm(request in proptest::option::of("\\PC{0,64}")) {
        let file = database();
        let image = Image::from_file(file, 1 << 30, request.as_deref()).expect("accepted");
        prop_assert_eq!(image.alarm_ms(), Some(1234));
        // The request's row may add a page, never take one away.
        prop_assert!(u64::from(image.db_pages()) >= (file.len() / PAGE_BYTES) as u64);
        prop_assert_eq!(image.bytes(), u64::from(image.db_pages()) * PAGE_BYTES as u64);
        // One byte under its size is too large.
        prop_assert!(!accepted_or_refused(file, file.len() as u64 - 1, None)?);
    }

    #[test]
    fn any_bytes_are_accepted_or_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..9000),
        header in any::<bool>(),
    ) {
        let mut file = bytes;
        if header {
            // Past the first check: the magic, 4096-byte pages, version 1,
            // whole pages.
            file.resize(file.len().div_ceil(PAGE_BYTES).max(1) * PAGE_BYTES, 0);
            file[..16].copy_from_slice(b"SQLite format 3\0");
            file[16..20].copy_from_slice(&[0x10, 0x00, 1, 1]);
        }
        accepted_or_refused(&file, 1 << 30, Some("00ff"))?;
    }

    #[test]
    fn a_damaged_database_file_is_accepted_or_refused(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        keep_pages in any::<prop::sample::Index>(),
        cut in any::<bool>(),
        added in proptest::collection::vec(any::<u8>(), 0..2 * PAGE_BYTES),
        header_too in any::<bool>(),
        request in proptest::option::of("[0-9a-f]{1,32}"),
    ) {
        let real = database();
        let mut file = real.to_vec();
        for (at, xor) in &flips {
            // Past the header (its checks refuse early) unless asked for.
            let from = if header_too { 0 } else { 100 };
            let i = from + at.index(file.len() - from);
            file[i] = real[i] ^ (xor | 1);
        }
        if cut {
            // Whole pages, so the checks of SQLite itself see it.
            file.truncate(PAGE_BYTES * (1 + keep_pages.index(real.len() / PAGE_BYTES)));
        }
        file.extend_from_slice(&added);
        accepted_or_refused(&file, 1 << 30, request.as_deref())?;
        // The same with the header's page count made to agree.
        if file.len().is_multiple_of(PAGE_BYTES) {
            let pages = u32::try_from(file.len() / PAGE_BYTES).expect("small");
            file[28..32].copy_from_slice(&pages.to_be_bytes());
            accepted_or_refused(&file, 1 << 30, request.as_deref())?;
        }
    }
}

//! SQLite allocates from mimalloc, without a size header per block, once a
//! store is open (its own process: the configuration only takes before
//! SQLite initializes).

mod common;

use std::ffi::c_void;

use common::*;

unsafe extern "C" {
    fn mi_is_in_heap_region(p: *const c_void) -> bool;
    fn mi_usable_size(p: *const c_void) -> usize;
}

#[tokio::test]
async fn sqlite_allocates_page_sized_blocks_from_mimalloc_and_grows_blocks_intact() {
    let bucket = Probe::new();
    let a = actor("alloc");
    let mut s = open(&bucket, &a, "n1").await;

    // SAFETY: a block from sqlite3_malloc, sized and freed by SQLite.
    unsafe {
        let p = rusqlite::ffi::sqlite3_malloc(4096);
        assert!(!p.is_null());
        assert!(mi_is_in_heap_region(p), "SQLite's block is not mimalloc's");
        // A size header would have put the block in the 5 KiB size class.
        assert_eq!(mi_usable_size(p), 4096);
        assert_eq!(rusqlite::ffi::sqlite3_msize(p), 4096);
        rusqlite::ffi::sqlite3_free(p);
    }

    // Growing blocks (realloc) keeps their contents: a string built up to
    // 2 MB in one statement, and rows read back.
    event(
        &mut s,
        &[
            "CREATE TABLE t (v TEXT)",
            "INSERT INTO t VALUES (printf('%.*c', 2000000, 'x'))",
        ],
    )
    .await
    .unwrap();
    s.begin_event().unwrap();
    let rows = s
        .query("SELECT length(v), substr(v, 1999990) FROM t", &[])
        .unwrap();
    s.rollback_event();
    assert_eq!(
        rows.rows,
        vec![vec![
            wasmkeep_store::SqlValue::Integer(2_000_000),
            wasmkeep_store::SqlValue::Text("x".repeat(11)),
        ]]
    );
}

//! SQLite allocates through Rust's global allocator once a store is open
//! (its own process: the configuration only takes before SQLite initializes).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;

/// Rust's allocator for this test: counts blocks of one odd size.
struct Counting;

/// Asked of SQLite below; with the store's 16-byte header Rust sees this + 16.
const PROBE_BYTES: usize = 12_344;
static PROBE_BLOCKS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() == PROBE_BYTES + 16 {
            PROBE_BLOCKS.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's block and layout, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::test]
async fn sqlite_allocates_through_rusts_allocator_and_grows_blocks_intact() {
    let bucket = Probe::new();
    let a = actor("alloc");
    let mut s = open(&bucket, &a, "n1").await;

    let before = PROBE_BLOCKS.load(Ordering::SeqCst);
    // SAFETY: a block from sqlite3_malloc, sized and freed by SQLite.
    let size = unsafe {
        let p = rusqlite::ffi::sqlite3_malloc(PROBE_BYTES as i32);
        assert!(!p.is_null());
        let size = rusqlite::ffi::sqlite3_msize(p);
        rusqlite::ffi::sqlite3_free(p);
        size
    };
    assert_eq!(
        PROBE_BLOCKS.load(Ordering::SeqCst),
        before + 1,
        "SQLite's block did not come from Rust's allocator"
    );
    assert_eq!(size, PROBE_BYTES as u64);

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

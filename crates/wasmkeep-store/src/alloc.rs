//! SQLite's memory comes from mimalloc (docs/adr/0026-allocator.md: the
//! `wasmkeep` binary's global allocator too), rather than from libc's
//! `malloc`, whose arena locks the actors' threads queued on.
//!
//! SQLite calls mimalloc's C API directly: mimalloc knows each block's size,
//! so a block carries no header. Through Rust's allocator each block needed
//! its size in a 16-byte header (Rust wants the layout back when freeing),
//! and SQLite's page-sized blocks (the 4 KiB temporary pages, two per open
//! connection) then landed in mimalloc's next size class up, 5 KiB (ADR 0038).

use std::ffi::{c_int, c_void};

use rusqlite::ffi;

// Part of mimalloc's C API, linked through `libmimalloc-sys`, whose
// declarations of these sit behind a feature with a dependency of its own.
unsafe extern "C" {
    fn mi_usable_size(p: *const c_void) -> usize;
    fn mi_good_size(size: usize) -> usize;
}

fn size(n: c_int) -> Option<usize> {
    usize::try_from(n).ok().filter(|n| *n > 0)
}

/// # Safety
/// Called by SQLite only.
unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    match size(n) {
        // SAFETY: a plain allocation; mimalloc aligns blocks to 16 bytes
        // (SQLite needs 8).
        Some(n) => unsafe { libmimalloc_sys::mi_malloc(n) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// Called by SQLite only, with a block of ours or null.
unsafe extern "C" fn x_free(p: *mut c_void) {
    // SAFETY: null or a live block from mi_malloc / mi_realloc.
    unsafe { libmimalloc_sys::mi_free(p) }
}

/// # Safety
/// Called by SQLite only, with a block of ours and a positive size.
unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    match size(n) {
        // SAFETY: null or a live block of ours; on failure it stays as it was.
        Some(n) => unsafe { libmimalloc_sys::mi_realloc(p, n) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// Called by SQLite only, with a block of ours or null.
unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    // SAFETY: null (0) or a live block of mimalloc's. The usable size may
    // exceed the size asked for, which SQLite allows (and uses).
    let size = unsafe { mi_usable_size(p) };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

extern "C" fn x_roundup(n: c_int) -> c_int {
    let Some(size) = size(n) else { return n };
    // SAFETY: a pure function of its argument.
    let good = unsafe { mi_good_size(size) };
    c_int::try_from(good).unwrap_or(n)
}

extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

extern "C" fn x_shutdown(_: *mut c_void) {}

/// The methods table; SQLite copies it at configuration.
struct Methods(ffi::sqlite3_mem_methods);

// SAFETY: the table is never written; its one pointer (pAppData) is null.
unsafe impl Sync for Methods {}

static METHODS: Methods = Methods(ffi::sqlite3_mem_methods {
    xMalloc: Some(x_malloc),
    xFree: Some(x_free),
    xRealloc: Some(x_realloc),
    xSize: Some(x_size),
    xRoundup: Some(x_roundup),
    xInit: Some(x_init),
    xShutdown: Some(x_shutdown),
    pAppData: std::ptr::null_mut(),
});

/// Points SQLite at mimalloc. Must run before SQLite initializes; refused
/// (and harmless) after, when SQLite keeps libc's `malloc`.
///
/// # Safety
/// No other thread may be calling into SQLite.
pub(crate) unsafe fn install() {
    // SAFETY: SQLite copies the struct; ours is static anyway.
    unsafe {
        let _ = ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const METHODS.0);
    }
}

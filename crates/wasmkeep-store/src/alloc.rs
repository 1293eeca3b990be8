//! SQLite's memory comes from mimalloc (docs/adr/0026-allocator.md: the
//! `wasmkeep` binary's global allocator too), rather than from libc's
//! `malloc`, whose arena locks the actors' threads queued on.
//!
//! SQLite calls mimalloc's C API directly: mimalloc knows each block's size,
//! so a block carries no header. Through Rust's allocator each block needed
//! its size in a 16-byte header (Rust wants the layout back when freeing),
//! and SQLite's page-sized blocks (the 4 KiB temporary pages, two per open
//! connection) then landed in mimalloc's next size class up, 5 KiB (ADR 0038).

use std::cell::Cell;
use std::ffi::{c_int, c_void};

use rusqlite::ffi;

/// The memory one guest statement may take beyond what it found: its
/// thread's net growth of SQLite's blocks while it runs, capped. A guest
/// statement runs on one thread from start to end (SQLite starts no helper
/// threads here: `PRAGMA threads` is 0), so a thread's count is the
/// statement's.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// Bytes taken minus bytes given back since the statement started.
    used: isize,
    max: isize,
    /// An allocation was refused for the cap.
    exceeded: bool,
}

thread_local! {
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// Caps the memory the guest statement about to run on this thread may
/// take (see [`Budget`]); the cap ends when the guard is dropped. An
/// allocation past it fails, and SQLite answers the statement
/// `SQLITE_NOMEM`.
pub(crate) struct StatementBudget(());

impl StatementBudget {
    pub(crate) fn start(max_bytes: usize) -> Self {
        let max = isize::try_from(max_bytes).unwrap_or(isize::MAX);
        BUDGET.with(|b| {
            b.set(Some(Budget {
                used: 0,
                max,
                exceeded: false,
            }))
        });
        Self(())
    }

    /// Whether an allocation was refused for the cap.
    pub(crate) fn exceeded(&self) -> bool {
        BUDGET.with(|b| b.get().is_some_and(|budget| budget.exceeded))
    }
}

impl Drop for StatementBudget {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(None));
    }
}

/// Whether a statement's cap is running on this thread (one thread-local
/// read: outside guest statements the allocation methods do nothing more).
fn budgeted() -> bool {
    BUDGET.with(|b| b.get().is_some())
}

/// Whether `grow` more bytes fit the running statement's cap; a refusal is
/// noted.
fn fits(grow: isize) -> bool {
    BUDGET.with(|b| match b.get() {
        Some(mut budget) if budget.used.saturating_add(grow) > budget.max => {
            budget.exceeded = true;
            b.set(Some(budget));
            false
        }
        _ => true,
    })
}

/// Counts `delta` bytes taken (negative: given back) against the running
/// statement's cap.
fn count(delta: isize) {
    BUDGET.with(|b| {
        if let Some(mut budget) = b.get() {
            budget.used = budget.used.saturating_add(delta);
            b.set(Some(budget));
        }
    });
}

/// The size mimalloc gives a request of `n` bytes, as a signed count.
fn good_size(n: usize) -> isize {
    // SAFETY: a pure function of its argument.
    isize::try_from(unsafe { mi_good_size(n) }).unwrap_or(isize::MAX)
}

/// A live block's usable size, as a signed count.
fn usable(p: *const c_void) -> isize {
    // SAFETY: null (0) or a live block of mimalloc's.
    isize::try_from(unsafe { mi_usable_size(p) }).unwrap_or(isize::MAX)
}

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
    let Some(n) = size(n) else {
        return std::ptr::null_mut();
    };
    if !budgeted() {
        // SAFETY: a plain allocation; mimalloc aligns blocks to 16 bytes
        // (SQLite needs 8).
        return unsafe { libmimalloc_sys::mi_malloc(n) };
    }
    if !fits(good_size(n)) {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    let p = unsafe { libmimalloc_sys::mi_malloc(n) };
    if !p.is_null() {
        count(usable(p));
    }
    p
}

/// # Safety
/// Called by SQLite only, with a block of ours or null.
unsafe extern "C" fn x_free(p: *mut c_void) {
    if budgeted() {
        count(-usable(p));
    }
    // SAFETY: null or a live block from mi_malloc / mi_realloc.
    unsafe { libmimalloc_sys::mi_free(p) }
}

/// # Safety
/// Called by SQLite only, with a block of ours and a positive size.
unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    let Some(n) = size(n) else {
        return std::ptr::null_mut();
    };
    if !budgeted() {
        // SAFETY: null or a live block of ours; on failure it stays as it was.
        return unsafe { libmimalloc_sys::mi_realloc(p, n) };
    }
    let before = usable(p);
    if !fits((good_size(n) - before).max(0)) {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    let q = unsafe { libmimalloc_sys::mi_realloc(p, n) };
    if !q.is_null() {
        count(usable(q) - before);
    }
    q
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

//! SQLite's memory comes from Rust's global allocator, the one the binary
//! chose (mimalloc for `wasmkeep`, docs/adr/0026-allocator.md), rather than
//! from libc's `malloc`, whose arena locks the actors' threads queued on.
//!
//! Each block carries its size in a header, which `xSize` and `xFree` read
//! (Rust's allocator wants the layout back when freeing).

use std::alloc::{Layout, alloc, dealloc, realloc};
use std::ffi::{c_int, c_void};

use rusqlite::ffi;

/// Size header before each block; 16 keeps the block 16-byte aligned
/// (SQLite needs 8).
const HEADER: usize = 16;
const ALIGN: usize = 16;

fn layout(n: usize) -> Option<Layout> {
    Layout::from_size_align(n.checked_add(HEADER)?, ALIGN).ok()
}

/// # Safety
/// Called by SQLite only.
unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let Some(layout) = usize::try_from(n).ok().filter(|n| *n > 0).and_then(layout) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the layout has a nonzero size; the header is written inside
    // the block, which is aligned for a usize.
    unsafe {
        let base = alloc(layout);
        if base.is_null() {
            return base.cast();
        }
        base.cast::<usize>().write(layout.size() - HEADER);
        base.add(HEADER).cast()
    }
}

/// # Safety
/// `p` is null or came from `x_malloc`/`x_realloc` and is not freed yet.
unsafe fn base_and_size(p: *mut c_void) -> (*mut u8, usize) {
    // SAFETY: per the contract, the header sits HEADER bytes before `p`.
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        (base, base.cast::<usize>().read())
    }
}

/// # Safety
/// Called by SQLite only, with a block of ours or null.
unsafe extern "C" fn x_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: a live block of ours; its layout is rebuilt from its header
    // exactly as it was allocated.
    unsafe {
        let (base, size) = base_and_size(p);
        let layout = layout(size).expect("the block was allocated with this layout");
        dealloc(base, layout);
    }
}

/// # Safety
/// Called by SQLite only, with a block of ours (never null: SQLite calls
/// `xMalloc` for that) and a positive size.
unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    let Some(new) = usize::try_from(n).ok().filter(|n| *n > 0).and_then(layout) else {
        return std::ptr::null_mut();
    };
    if p.is_null() {
        // SAFETY: forwarded from SQLite.
        return unsafe { x_malloc(n) };
    }
    // SAFETY: a live block of ours with its original layout; on success the
    // old block is gone and the header is rewritten in the new one.
    unsafe {
        let (base, size) = base_and_size(p);
        let old = layout(size).expect("the block was allocated with this layout");
        let moved = realloc(base, old, new.size());
        if moved.is_null() {
            return moved.cast();
        }
        moved.cast::<usize>().write(new.size() - HEADER);
        moved.add(HEADER).cast()
    }
}

/// # Safety
/// Called by SQLite only, with a block of ours or null.
unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: a live block of ours; sizes fit a c_int (they came from one).
    let size = unsafe { base_and_size(p).1 };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

extern "C" fn x_roundup(n: c_int) -> c_int {
    n.checked_add(7).map_or(n, |m| m & !7)
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

/// Points SQLite at Rust's allocator. Must run before SQLite initializes;
/// refused (and harmless) after, when SQLite keeps libc's `malloc`.
///
/// # Safety
/// No other thread may be calling into SQLite.
pub(crate) unsafe fn install() {
    // SAFETY: SQLite copies the struct; ours is static anyway.
    unsafe {
        let _ = ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const METHODS.0);
    }
}

//! The in-memory SQLite VFS: every actor's database file is a vector of
//! pages in this process, and the VFS remembers which pages were written.
//!
//! Why a VFS of our own (ADR 0002): a node holds thousands of actors, and a
//! file per actor costs file descriptors (workerd dies at 3 per live actor)
//! and an fsync per commit that the bucket makes redundant. The bucket is the
//! durable copy; this file is only the working copy. Knowing exactly which
//! pages a transaction wrote gives the log record (page number + bytes) with
//! no diffing and no SQL replay.
//!
//! The VFS is registered once per process under [`VFS_NAME`] (never as the
//! default). A database is reached by name: [`MemFile::register`] puts the
//! shared file into a process-wide table, `xOpen` takes a reference from it.
//! Journals and temp files (which `journal_mode=MEMORY` and
//! `temp_store=MEMORY` should never ask for) get an anonymous untracked file.
//!
//! Pages are kept without their longest run of zeros ([`PageData`]), and
//! shared (`Arc`) so that a change set or a snapshot image is a list of
//! reference-count bumps, not copies: a write makes a new page.
//!
//! Safety: the callbacks below are the only `unsafe` code of the crate. Each
//! dereferences pointers SQLite hands us under SQLite's documented contract
//! (valid for the call, `sqlite3_file` allocated with our `szOsFile`).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Once};

use parking_lot::Mutex;
use rusqlite::ffi;

use crate::page::PageData;

/// Bytes per page, for SQLite (`PRAGMA page_size`) and for our storage.
pub const PAGE_BYTES: usize = 4096;

/// One page of the database file.
pub type Page = [u8; PAGE_BYTES];

/// A page shared by the working copy, change sets and snapshot images.
pub type SharedPage = Arc<PageData>;

/// A page of zeros (one, shared).
pub fn zero_page() -> SharedPage {
    static ZEROS: LazyLock<SharedPage> = LazyLock::new(|| Arc::new(PageData::zeroed()));
    Arc::clone(&ZEROS)
}

/// The name the VFS is registered under.
pub const VFS_NAME: &CStr = c"wasmkeep-mem";

/// Longest path SQLite may hand us (names are short generated ids).
const PATHNAME_BYTES_MAX: c_int = 512;

/// Pages in the database files of this process (each file's length; a
/// page shared with a queued record or a snapshot counts once, here).
static PAGES_HELD: AtomicU64 = AtomicU64::new(0);
/// The most [`PAGES_HELD`] may grow to by a write ([`set_pages_max`]).
static PAGES_MAX: AtomicU64 = AtomicU64::new(u64::MAX);

thread_local! {
    /// Set when a write on this thread was refused for [`PAGES_MAX`]: the
    /// statement's "database or disk is full" is the node's, not the
    /// database's own maximum.
    static REFUSED_FOR_NODE: Cell<bool> = const { Cell::new(false) };
}

/// Caps the pages all database files of this process may hold together
/// (the node's memory for actor databases, ADR 0064). A write that would
/// grow a file past it fails with SQLite's "database or disk is full";
/// restores and rollbacks are never refused.
pub fn set_pages_max(pages: u64) {
    PAGES_MAX.store(pages, Ordering::Relaxed);
}

/// Pages the database files of this process hold.
pub fn pages_held() -> u64 {
    PAGES_HELD.load(Ordering::Relaxed)
}

/// Whether a write on this thread was refused for the node's cap since the
/// last call (which clears it).
pub fn take_refused_for_node() -> bool {
    REFUSED_FOR_NODE.with(|r| r.replace(false))
}

/// One database file, shared between the store and SQLite's open handle.
#[derive(Debug, Default)]
pub struct MemFile {
    /// Pages of this file counted in [`PAGES_HELD`].
    held: usize,
    pages: Vec<SharedPage>,
    size_bytes: u64,
    /// Only the main database file records what was written.
    tracked: bool,
    /// Pages written since the last [`MemFile::take_changes`], with the
    /// version each had before its first write (None: it did not exist).
    /// The old version lets a collection drop pages rewritten with the same
    /// bytes (a rolled-back transaction restores pages it had spilled).
    before: BTreeMap<u32, Option<SharedPage>>,
    /// Size in bytes at the last collection.
    size_at_collection: u64,
}

/// What one collection found: the pages whose bytes changed, and the size.
#[derive(Debug, Default)]
pub struct Changes {
    pub pages: Vec<(u32, SharedPage)>,
    pub db_pages: u32,
    /// True when the size changed even if no page did (a truncate).
    pub size_changed: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty() && !self.size_changed
    }
}

pub type SharedFile = Arc<Mutex<MemFile>>;

impl MemFile {
    /// A tracked main database file with the given pages (a restored image).
    pub fn with_pages(pages: Vec<SharedPage>) -> Self {
        let size_bytes = (pages.len() * PAGE_BYTES) as u64;
        let mut file = Self {
            held: 0,
            pages,
            size_bytes,
            tracked: true,
            before: BTreeMap::new(),
            size_at_collection: size_bytes,
        };
        file.settle_held();
        file
    }

    /// Brings [`PAGES_HELD`] in line with this file's length.
    fn settle_held(&mut self) {
        let now = self.pages.len();
        if now == self.held {
            return;
        }
        if now > self.held {
            PAGES_HELD.fetch_add((now - self.held) as u64, Ordering::Relaxed);
        } else {
            PAGES_HELD.fetch_sub((self.held - now) as u64, Ordering::Relaxed);
        }
        self.held = now;
    }

    pub fn db_pages(&self) -> u32 {
        u32::try_from(self.size_bytes.div_ceil(PAGE_BYTES as u64))
            .expect("size limited by max_page_count")
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The whole file as shared pages (for a snapshot).
    pub fn image(&self) -> Vec<SharedPage> {
        let n = self.db_pages() as usize;
        self.pages.iter().take(n).cloned().collect()
    }

    /// Pages changed since the last collection, in page order, and forgets them.
    pub fn take_changes(&mut self) -> Changes {
        let changes = self.changes();
        self.accept_changes();
        changes
    }

    /// Pages changed since the last collection, in page order (the file still
    /// remembers them: [`MemFile::accept_changes`] or
    /// [`MemFile::undo_since_collection`] follows).
    pub fn changes(&self) -> Changes {
        let db_pages = self.db_pages();
        let mut pages = Vec::with_capacity(self.before.len());
        for (&idx, old) in &self.before {
            if idx >= db_pages {
                continue; // truncated away; the page count in the record says so
            }
            let now = &self.pages[idx as usize];
            let same = old
                .as_ref()
                .is_some_and(|old| Arc::ptr_eq(old, now) || old == now);
            if !same {
                pages.push((idx, Arc::clone(now)));
            }
        }
        Changes {
            pages,
            db_pages,
            size_changed: self.size_bytes != self.size_at_collection,
        }
    }

    /// Ends a collection: the current state is the new base.
    pub fn accept_changes(&mut self) {
        self.before.clear();
        self.size_at_collection = self.size_bytes;
    }

    /// Puts the file back as it was at the last collection (the pages written
    /// since then get their old versions). SQLite's cache then disagrees with
    /// the file: the caller must reopen its connection.
    pub fn undo_since_collection(&mut self) {
        // Size first: a truncate since the collection dropped pages that the
        // loop below puts back.
        self.set_size(self.size_at_collection);
        for (idx, old) in std::mem::take(&mut self.before) {
            if let Some(old) = old
                && let Some(slot) = self.pages.get_mut(idx as usize)
            {
                *slot = old;
            }
        }
    }

    fn set_size(&mut self, size_bytes: u64) {
        let n = size_bytes.div_ceil(PAGE_BYTES as u64) as usize;
        self.pages.truncate(n);
        while self.pages.len() < n {
            self.pages.push(zero_page());
        }
        self.size_bytes = size_bytes;
        self.settle_held();
    }

    fn note_write(&mut self, idx: usize) {
        if !self.tracked {
            return;
        }
        let key = u32::try_from(idx).expect("page index bounded by max_page_count");
        let old = self.pages.get(idx).cloned();
        self.before.entry(key).or_insert(old);
    }

    /// Writes `data` at `offset`; `false` (nothing written) when the file
    /// would grow past the node's cap ([`set_pages_max`]).
    fn write(&mut self, data: &[u8], offset: u64) -> bool {
        let end = offset + data.len() as u64;
        let growth = (end.div_ceil(PAGE_BYTES as u64) as usize).saturating_sub(self.pages.len());
        if growth > 0
            && PAGES_HELD.load(Ordering::Relaxed) + growth as u64
                > PAGES_MAX.load(Ordering::Relaxed)
        {
            REFUSED_FOR_NODE.with(|r| r.set(true));
            return false;
        }
        let mut pos = offset;
        let mut src = data;
        while !src.is_empty() {
            let idx = (pos / PAGE_BYTES as u64) as usize;
            let start = (pos % PAGE_BYTES as u64) as usize;
            let n = (PAGE_BYTES - start).min(src.len());
            self.note_write(idx);
            while self.pages.len() <= idx {
                self.pages.push(zero_page());
            }
            let page = if n == PAGE_BYTES {
                PageData::new(src[..n].try_into().expect("a whole page"))
            } else {
                let mut page = self.pages[idx].to_page();
                page[start..start + n].copy_from_slice(&src[..n]);
                PageData::new(&page)
            };
            self.pages[idx] = Arc::new(page);
            src = &src[n..];
            pos += n as u64;
        }
        if end > self.size_bytes {
            self.size_bytes = end;
        }
        self.settle_held();
        true
    }

    /// Reads into `out`; false (and zero-filled) when the file is shorter.
    fn read(&self, out: &mut [u8], offset: u64) -> bool {
        let mut pos = offset;
        let mut done = 0;
        while done < out.len() {
            if pos >= self.size_bytes {
                out[done..].fill(0);
                return false;
            }
            let idx = (pos / PAGE_BYTES as u64) as usize;
            let start = (pos % PAGE_BYTES as u64) as usize;
            let avail = (self.size_bytes - pos).min((PAGE_BYTES - start) as u64) as usize;
            let n = avail.min(out.len() - done);
            self.pages[idx].read(start, &mut out[done..done + n]);
            done += n;
            pos += n as u64;
        }
        true
    }

    fn truncate(&mut self, size_bytes: u64) {
        if size_bytes >= self.size_bytes {
            return;
        }
        let keep = size_bytes.div_ceil(PAGE_BYTES as u64) as usize;
        for idx in keep..self.pages.len() {
            self.note_write(idx);
        }
        self.set_size(size_bytes);
    }

    // ---- the name table ---------------------------------------------------

    /// Makes `file` reachable by SQLite under `name` until [`MemFile::unregister`].
    pub fn register(name: &str, file: SharedFile) {
        register_vfs();
        REGISTRY.lock().insert(name.to_owned(), file);
    }

    pub fn unregister(name: &str) {
        REGISTRY.lock().remove(name);
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        PAGES_HELD.fetch_sub(self.held as u64, Ordering::Relaxed);
    }
}

/// Database files SQLite may open, by name (see [`MemFile::register`]).
static REGISTRY: LazyLock<Mutex<HashMap<String, SharedFile>>> = LazyLock::new(Mutex::default);

// ---- SQLite glue ------------------------------------------------------------

/// Our `sqlite3_file`: SQLite allocates `szOsFile` bytes and we put this there.
#[repr(C)]
struct FileHandle {
    base: ffi::sqlite3_file,
    /// From `Arc::into_raw`; given back in `xClose`.
    file: *const Mutex<MemFile>,
}

static REGISTER: Once = Once::new();

/// Sets SQLite up once per process: memory statistics off, memory from
/// Rust's allocator (`alloc.rs`; both only take before SQLite initializes),
/// then the VFS registered.
pub fn register_vfs() {
    REGISTER.call_once(|| {
        // SAFETY: sqlite3_vfs_find(NULL) returns the default VFS, which lives
        // for the whole process; the registered struct is leaked on purpose
        // (SQLite keeps a pointer to it for the whole process).
        unsafe {
            // No memory statistics: with them every SQLite allocation and
            // free takes one process-wide mutex, which the actors' threads
            // then contend for. Refused (SQLITE_MISUSE) if SQLite is already
            // initialized, which only costs that speed.
            let _ = ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int);
            // No lookaside: SQLite would reserve 48 KiB per connection for
            // its small allocations, which mimalloc serves about as fast;
            // with 1,000 busy actors (connections open) the node used 4-8
            // MiB less at the same throughput (ADR 0024, 2026-12-01).
            let _ = ffi::sqlite3_config(ffi::SQLITE_CONFIG_LOOKASIDE, 0 as c_int, 0 as c_int);
            crate::alloc::install();
            let default = ffi::sqlite3_vfs_find(std::ptr::null());
            assert!(!default.is_null(), "SQLite has no default VFS");
            let vfs = Box::new(ffi::sqlite3_vfs {
                iVersion: 2,
                szOsFile: std::mem::size_of::<FileHandle>() as c_int,
                mxPathname: PATHNAME_BYTES_MAX,
                pNext: std::ptr::null_mut(),
                zName: VFS_NAME.as_ptr(),
                pAppData: default.cast(),
                xOpen: Some(x_open),
                xDelete: Some(x_delete),
                xAccess: Some(x_access),
                xFullPathname: Some(x_full_pathname),
                xDlOpen: (*default).xDlOpen,
                xDlError: (*default).xDlError,
                xDlSym: (*default).xDlSym,
                xDlClose: (*default).xDlClose,
                xRandomness: Some(x_randomness),
                xSleep: Some(x_sleep),
                xCurrentTime: Some(x_current_time),
                xGetLastError: Some(x_get_last_error),
                xCurrentTimeInt64: Some(x_current_time_int64),
                xSetSystemCall: None,
                xGetSystemCall: None,
                xNextSystemCall: None,
            });
            let rc = ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0);
            assert_eq!(rc, ffi::SQLITE_OK, "registering the in-memory VFS failed");
        }
    });
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_lock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The default VFS we delegate randomness and time to.
unsafe fn default_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: pAppData was set to the default VFS at registration.
    unsafe { (*vfs).pAppData.cast() }
}

unsafe fn file_of(f: *mut ffi::sqlite3_file) -> &'static Mutex<MemFile> {
    // SAFETY: `f` was initialized by x_open as a FileHandle whose `file`
    // pointer stays valid (an Arc reference is held) until x_close.
    unsafe { &*(*f.cast::<FileHandle>()).file }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let shared: SharedFile = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        if name.is_null() {
            return ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: SQLite passes a NUL-terminated name for a main database.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        match REGISTRY.lock().get(name.as_ref()) {
            Some(file) => Arc::clone(file),
            None => return ffi::SQLITE_CANTOPEN,
        }
    } else {
        // A journal or temp file: private and untracked.
        Arc::new(Mutex::new(MemFile::default()))
    };
    let handle = FileHandle {
        base: ffi::sqlite3_file {
            pMethods: &IO_METHODS,
        },
        file: Arc::into_raw(shared),
    };
    // SAFETY: SQLite gives us szOsFile writable bytes at `f`.
    unsafe {
        std::ptr::write(f.cast::<FileHandle>(), handle);
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the handle was written by x_open; its Arc is released once.
    unsafe {
        let handle = f.cast::<FileHandle>();
        drop(Arc::from_raw((*handle).file));
        (*handle).base.pMethods = std::ptr::null();
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let (Ok(amount), Ok(offset)) = (usize::try_from(amount), u64::try_from(offset)) else {
        return ffi::SQLITE_IOERR_READ;
    };
    // SAFETY: SQLite gives a buffer of `amount` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), amount) };
    let full = unsafe { file_of(f) }.lock().read(out, offset);
    if full {
        ffi::SQLITE_OK
    } else {
        ffi::SQLITE_IOERR_SHORT_READ
    }
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let (Ok(amount), Ok(offset)) = (usize::try_from(amount), u64::try_from(offset)) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite gives `amount` readable bytes.
    let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), amount) };
    if unsafe { file_of(f) }.lock().write(data, offset) {
        ffi::SQLITE_OK
    } else {
        ffi::SQLITE_FULL
    }
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let Ok(size) = u64::try_from(size) else {
        return ffi::SQLITE_IOERR_TRUNCATE;
    };
    unsafe { file_of(f) }.lock().truncate(size);
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_sync(_f: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    // Durability is the bucket's job (the log record), not this file's.
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_size(
    f: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    let bytes = unsafe { file_of(f) }.lock().size_bytes;
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *size = bytes as ffi::sqlite3_int64 };
    ffi::SQLITE_OK
}

/// One connection per file (locking_mode=EXCLUSIVE): locks always succeed.
unsafe extern "C" fn x_lock(_f: *mut ffi::sqlite3_file, _level: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_check_reserved_lock(_f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_control(
    _f: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_f: *mut ffi::sqlite3_file) -> c_int {
    PAGE_BYTES as c_int
}

unsafe extern "C" fn x_device_characteristics(_f: *mut ffi::sqlite3_file) -> c_int {
    0
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    _name: *const c_char,
    _sync_dir: c_int,
) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    _name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    // No journal ever exists outside memory, so there is never a hot journal.
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: `name` is NUL-terminated; `out` has room for n_out bytes.
    unsafe {
        let bytes = CStr::from_ptr(name).to_bytes_with_nul();
        if bytes.len() > n_out as usize {
            return ffi::SQLITE_CANTOPEN;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len());
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    // SAFETY: delegating to the default VFS with SQLite's own arguments.
    unsafe {
        let d = default_vfs(vfs);
        match (*d).xRandomness {
            Some(f) => f(d, n, out),
            None => 0,
        }
    }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // SAFETY: as above.
    unsafe {
        let d = default_vfs(vfs);
        match (*d).xSleep {
            Some(f) => f(d, micros),
            None => 0,
        }
    }
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: as above.
    unsafe {
        let d = default_vfs(vfs);
        match (*d).xCurrentTime {
            Some(f) => f(d, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}

unsafe extern "C" fn x_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as above.
    unsafe {
        let d = default_vfs(vfs);
        match (*d).xGetLastError {
            Some(f) => f(d, n, out),
            None => 0,
        }
    }
}

unsafe extern "C" fn x_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as above.
    unsafe {
        let d = default_vfs(vfs);
        match (*d).xCurrentTimeInt64 {
            Some(f) => f(d, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_tracked_and_unchanged_rewrites_dropped() {
        let mut f = MemFile::with_pages(Vec::new());
        f.write(&[1; PAGE_BYTES], 0);
        f.write(&[2; PAGE_BYTES], PAGE_BYTES as u64);
        let c = f.take_changes();
        assert_eq!(c.pages.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(c.db_pages, 2);
        // Rewriting page 0 with the same bytes is not a change.
        f.write(&[1; PAGE_BYTES], 0);
        f.write(&[3; 10], PAGE_BYTES as u64 + 5);
        let c = f.take_changes();
        assert_eq!(c.pages.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(c.pages[0].1.to_page()[5], 3);
    }

    #[test]
    fn short_reads_zero_fill() {
        let mut f = MemFile::with_pages(Vec::new());
        f.write(&[7; 10], 0);
        let mut out = [9u8; 20];
        assert!(!f.read(&mut out, 0));
        assert_eq!(&out[..10], &[7; 10]);
        assert_eq!(&out[10..], &[0; 10]);
    }

    #[test]
    fn undo_restores_the_collected_state() {
        let mut f = MemFile::with_pages(Vec::new());
        f.write(&[1; PAGE_BYTES], 0);
        f.take_changes();
        f.write(&[2; PAGE_BYTES], 0);
        f.write(&[2; PAGE_BYTES], PAGE_BYTES as u64);
        f.undo_since_collection();
        assert_eq!(f.db_pages(), 1);
        assert_eq!(f.pages[0].to_page()[0], 1);
        assert!(f.take_changes().is_empty());
    }
}

//! The folder backend's system calls: `statx` asking only for what it
//! needs, `renameat2` exchanges, `syncfs`, `fdatasync` or `fsync` of a
//! path, `preadv2` that never waits for the device, the counter files read
//! under a lock, and the names in a folder.
//!
//! Each is a thin wrapper with its safety argument. None knows of keys,
//! objects, journals or the committer, and this file uses no other part of
//! the folder backend.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// `path` for a system call.
fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// What the committer asks of a path: whether it is a folder, and its size.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) dir: bool,
    pub(super) len: u64,
}

/// `statx` asking for the type and size only. Asking for a timestamp (as
/// `fs::metadata` does) marks the inode's times as seen, and the kernel
/// (multigrain timestamps, Linux 6.13+) then gives the inode's next change a
/// fine-grained time, which also raises the coarse time every later change
/// on the machine gets. Renaming a file just `stat`ed did that once per
/// commit, so the journal's mtime changed at every append and each
/// `fdatasync` wrote its inode as well: one more device write per commit
/// (ADR 0029).
pub(super) fn shape_of(path: &Path) -> io::Result<Shape> {
    let path = c_path(path)?;
    let out = statx_only(
        libc::AT_FDCWD,
        &path,
        0,
        libc::STATX_TYPE | libc::STATX_SIZE,
    )?;
    Ok(Shape {
        dir: u32::from(out.stx_mode) & libc::S_IFMT == libc::S_IFDIR,
        len: out.stx_size,
    })
}

/// `statx` of `path` relative to `dirfd` (with `flags`, such as
/// `AT_EMPTY_PATH`), asking for the fields in `mask` only: never for a
/// timestamp unless the caller means to (see `shape_of`).
pub(crate) fn statx_only(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> io::Result<libc::statx> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `out` is valid for writes; both
    // outlive the call.
    let rc = unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            flags | libc::AT_STATX_SYNC_AS_STAT,
            mask,
            &mut out,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(out)
}

/// Swaps two paths atomically (`renameat2` with `RENAME_EXCHANGE`).
pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: two valid NUL-terminated paths that live across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens (creating it if needed) a small file that is read under a lock on
/// every batch: a stripe's lock file with its counter, the journal's generation
/// (`.wal/epoch`). Without `O_NOATIME`, each read after the counter's last
/// write would update the file's access time (`relatime`) and dirty its inode
/// for the next flush or checkpoint to write. Where the flag is refused (a file
/// of another user), the file opens without it.
pub(crate) fn open_counter_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags: libc::c_int| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
}

pub(crate) fn read_u64(file: &File, at: u64) -> io::Result<Option<u64>> {
    let mut buf = [0u8; 8];
    match file.read_exact_at(&mut buf, at) {
        Ok(()) => Ok(Some(u64::from_le_bytes(buf))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn syncfs(file: &File) -> io::Result<()> {
    // SAFETY: syncfs on a file descriptor we own; no memory is passed.
    let rc = unsafe { libc::syncfs(file.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fdatasync` (`data_only`) or `fsync` of the file at `path`.
pub(super) fn sync_path(path: &Path, data_only: bool) -> io::Result<()> {
    let file = File::open(path)?;
    if data_only {
        file.sync_data()
    } else {
        file.sync_all()
    }
}

/// Reads the `len` bytes of `file` if all of them are in the page cache;
/// `Ok(None)` if reading would wait for the device (or the file system
/// cannot tell). A file is not rewritten while a read of it may still be
/// used (see inode reuse in the folder module's docs), so its length is the one
/// `fstat` gave.
pub(super) fn read_cached(file: &File, len: u64) -> io::Result<Option<Vec<u8>>> {
    let len = usize::try_from(len).expect("at most INLINE_READ_BYTES_MAX");
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let rest = &mut buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let offset = libc::off_t::try_from(done).expect("small");
        // SAFETY: `iov` describes `rest`, which is valid for writes of its
        // length and outlives the call.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL) => return Ok(None),
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        done += usize::try_from(n).expect("non-negative");
    }
    buf.truncate(done);
    Ok(Some(buf))
}

/// The names in a folder.
pub(crate) fn names_in(dir: &Path) -> io::Result<std::collections::HashSet<String>> {
    let mut names = std::collections::HashSet::new();
    for entry in fs::read_dir(dir)? {
        names.insert(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    /// Reading a counter file leaves its access time alone: under the
    /// default `relatime`, a read after a write would otherwise update it
    /// (the access time is set older than the write, as after every batch).
    #[test]
    fn reading_a_counter_file_does_not_touch_its_access_time() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("00");
        let file = open_counter_file(&path).expect("created");
        file.write_all_at(&7u64.to_le_bytes(), 0).expect("written");
        let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        file.set_times(fs::FileTimes::new().set_accessed(long_ago))
            .expect("access time set");
        drop(file);

        let file = open_counter_file(&path).expect("opened again");
        let mut counter = [0u8; 8];
        file.read_exact_at(&mut counter, 0).expect("read");
        assert_eq!(u64::from_le_bytes(counter), 7);
        let accessed = fs::metadata(&path)
            .and_then(|m| m.accessed())
            .expect("access time");
        assert_eq!(accessed, long_ago, "the read updated the access time");
    }
}

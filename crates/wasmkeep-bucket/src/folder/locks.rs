//! Locks between processes: `flock`, the lock stripes a key maps to (the
//! files `.locks/NN`, whose first 8 bytes count the stripe's journal
//! orders), and lock files created already locked.
//!
//! It takes and releases locks; it never decides what a lock protects (the
//! committer, the journal and `solo` do).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Number of lock files; a key's stripe is `fnv1a(key) % LOCK_STRIPES`.
/// Fixed forever: every process sharing a folder must agree on it.
pub const LOCK_STRIPES: usize = 256;

/// A lock file while it is being locked (see `lock_file_in_place`); one
/// left by a crash goes by age like any unclaimed temporary file.
const LOCKING_SUFFIX: &str = ".locking";

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

pub(super) fn stripe_of(key: &str) -> usize {
    (fnv1a(key.as_bytes()) % LOCK_STRIPES as u64) as usize
}

pub(crate) fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Creates `dir/name` already locked (exclusive `flock`): the file is made
/// and locked as `name` plus [`LOCKING_SUFFIX`], which nobody takes for a
/// lock file, then renamed.
pub(super) fn lock_file_in_place(dir: &Path, name: &str) -> io::Result<File> {
    let locking = dir.join(format!("{name}{LOCKING_SUFFIX}"));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&locking)?;
    let placed = flock(&file, libc::LOCK_EX | libc::LOCK_NB)
        .and_then(|()| fs::rename(&locking, dir.join(name)));
    if let Err(e) = placed {
        let _ = fs::remove_file(&locking);
        return Err(e);
    }
    Ok(file)
}

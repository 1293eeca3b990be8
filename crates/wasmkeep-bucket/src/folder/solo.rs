//! Who else is on this folder (ADR 0034; `alone.rs` wires it to the journal).
//!
//! A process alone on a folder may keep young objects in its journal
//! instead of making them files. `.wal/solo` says whether it is alone:
//! - the first process to open the folder takes an exclusive `flock` on it
//!   and is *solo*;
//! - a process that finds it held exclusively *knocks* (changes the times of
//!   `.wal/knock`) until it gets a shared lock; the solo process watches the
//!   knock with inotify, writes its young objects in place, and converts its
//!   lock to a shared one ([`SoloLock::share`]);
//! - a process that finds it held shared takes it shared at once;
//! - a process that gets the exclusive lock is solo only if nobody else is
//!   on the folder (`others_present`: the journal module tells, by the
//!   journals whose `flock` a live process holds; each process locks its
//!   journal before it takes `.wal/solo`). Else it shares at once. This
//!   closes the gap in which a holder converting its lock to a shared one
//!   holds none, and a newcomer's exclusive try would succeed.
//!
//! The knocking repeats while the opener waits, so a knock made before the
//! holder started watching is not lost: the next one is seen.
//!
//! It locks, knocks and watches; it never reads or writes an object or the
//! journal.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::locks::flock;

/// The lock file under the journal folder.
pub(crate) const SOLO_FILE: &str = "solo";
/// The file a waiting opener touches.
pub(crate) const KNOCK_FILE: &str = "knock";
/// How often a waiting opener knocks again (and tries the lock).
pub(crate) const KNOCK_INTERVAL: Duration = Duration::from_millis(5);

/// This process's place on the folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Alone: young objects may stay in the journal.
    Solo,
    /// Others may be here: every object is a file before it is answered.
    Shared,
}

/// The lock on `.wal/solo`, held for the life of the folder bucket.
#[derive(Debug)]
pub(crate) struct SoloLock {
    file: File,
    mode: Mode,
    knock: PathBuf,
}

impl SoloLock {
    /// Takes `.wal/solo` in `wal_dir`: exclusively when nobody holds it,
    /// shared when others share it, and after knocking when a solo process
    /// holds it, for at most `wait_max`.
    pub(crate) fn take(
        wal_dir: &Path,
        wait_max: Duration,
        others_present: &dyn Fn() -> io::Result<bool>,
    ) -> io::Result<SoloLock> {
        let file = open_rw(&wal_dir.join(SOLO_FILE))?;
        let knock = wal_dir.join(KNOCK_FILE);
        let started = Instant::now();
        loop {
            if try_flock(&file, libc::LOCK_EX)? {
                let mut solo_lock = SoloLock {
                    file,
                    mode: Mode::Solo,
                    knock,
                };
                if others_present()? {
                    solo_lock.share()?;
                }
                return Ok(solo_lock);
            }
            if try_flock(&file, libc::LOCK_SH)? {
                return Ok(SoloLock {
                    file,
                    mode: Mode::Shared,
                    knock,
                });
            }
            if started.elapsed() >= wait_max {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} is held by a process alone on this folder, which did not make \
                         room within {wait_max:?}",
                        wal_dir.join(SOLO_FILE).display()
                    ),
                ));
            }
            touch(&knock)?;
            std::thread::sleep(KNOCK_INTERVAL);
        }
    }

    /// Takes `.wal/solo` exclusively if nobody holds it and nobody else is
    /// on the folder, without waiting: `None` otherwise (nothing held). A
    /// recovery that finds young objects of a gone solo process tries this
    /// under the exclusive generation lock, to adopt them instead of writing
    /// them as files (ADR 0040); `take` could wait for a knock there, and
    /// the knocked process's checkpoint needs that lock.
    pub(crate) fn try_solo(
        wal_dir: &Path,
        others_present: &dyn Fn() -> io::Result<bool>,
    ) -> io::Result<Option<SoloLock>> {
        let file = open_rw(&wal_dir.join(SOLO_FILE))?;
        if !try_flock(&file, libc::LOCK_EX)? || others_present()? {
            // Dropped: a lock taken goes with the descriptor.
            return Ok(None);
        }
        Ok(Some(SoloLock {
            file,
            mode: Mode::Solo,
            knock: wal_dir.join(KNOCK_FILE),
        }))
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Leaves solo mode for good: from now on others may share the folder.
    /// The caller has written its young objects in place first.
    pub(crate) fn share(&mut self) -> io::Result<()> {
        if self.mode == Mode::Shared {
            return Ok(());
        }
        // Not atomic: the exclusive lock goes, then a shared one is asked
        // for. A newcomer that takes the exclusive lock in between finds this
        // process present (its journal stays locked) and shares at once, so
        // this waits at most for that newcomer's own conversion, knocking as
        // `take` does.
        flock(&self.file, libc::LOCK_UN)?;
        loop {
            if try_flock(&self.file, libc::LOCK_SH)? {
                self.mode = Mode::Shared;
                return Ok(());
            }
            touch(&self.knock)?;
            std::thread::sleep(KNOCK_INTERVAL);
        }
    }
}

/// Watches `.wal/knock` on a thread of its own: `on_knock` runs once, at the
/// first knock after [`Watcher::start`].
#[derive(Debug)]
pub(crate) struct Watcher {
    /// Written to stop the thread (its read end is polled with the inotify fd).
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    pub(crate) fn start(
        wal_dir: &Path,
        on_knock: impl FnOnce() + Send + 'static,
    ) -> io::Result<Watcher> {
        let knock = wal_dir.join(KNOCK_FILE);
        // The file must exist to be watched; a knocker creates it too.
        drop(open_rw(&knock)?);
        // SAFETY: plain system calls; every descriptor returned is owned
        // below and closed when dropped.
        let inotify = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if inotify < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor, owned from here on.
        let inotify = unsafe { OwnedFd::from_raw_fd(inotify) };
        let path = std::ffi::CString::new(knock.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the folder path"))?;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let watch = unsafe {
            libc::inotify_add_watch(
                inotify.as_raw_fd(),
                path.as_ptr(),
                libc::IN_ATTRIB | libc::IN_MODIFY,
            )
        };
        if watch < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (stop_read, stop_write) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let thread = std::thread::Builder::new()
            .name("wasmkeep-knock".to_owned())
            .spawn(move || {
                if wait_for_knock(&inotify, &stop_read) {
                    on_knock();
                }
            })?;
        Ok(Watcher {
            stop: Some(stop_write),
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Closing the write end wakes the thread's poll (end of file).
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Blocks until the knock file changes (true) or `stop` is closed (false).
fn wait_for_knock(inotify: &OwnedFd, stop: &OwnedFd) -> bool {
    let mut buffer = [0u8; 4096];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structures.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // SAFETY: reads into a buffer of the length given.
            let n = unsafe {
                libc::read(
                    inotify.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            if n > 0 {
                return true;
            }
        }
    }
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Tries a lock without waiting: `Ok(false)` when someone else's is in the way.
fn try_flock(file: &File, operation: libc::c_int) -> io::Result<bool> {
    match flock(file, operation | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Changes the knock file's times (an inotify `IN_ATTRIB` for the watcher).
fn touch(path: &Path) -> io::Result<()> {
    let file = open_rw(path)?;
    file.set_modified(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const NOBODY: &dyn Fn() -> io::Result<bool> = &|| Ok(false);
    const SOMEBODY: &dyn Fn() -> io::Result<bool> = &|| Ok(true);

    /// A newcomer on another thread (a separate open file description, so
    /// its locks meet the holder's as another process's would).
    fn newcomer(dir: &Path) -> std::thread::JoinHandle<io::Result<Mode>> {
        let path = dir.to_path_buf();
        std::thread::spawn(move || {
            SoloLock::take(&path, Duration::from_secs(30), SOMEBODY).map(|h| h.mode())
        })
    }

    #[test]
    fn the_first_holder_is_solo_and_a_newcomer_waits_until_it_shares() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let mut first = SoloLock::take(dir.path(), Duration::from_secs(5), NOBODY).expect("first");
        assert_eq!(first.mode(), Mode::Solo);
        let (knocked_tx, knocked_rx) = mpsc::channel();
        let _watcher = Watcher::start(dir.path(), move || {
            let _ = knocked_tx.send(());
        })
        .expect("the watcher");
        let newcomer = newcomer(dir.path());
        knocked_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the newcomer knocks");
        first.share().expect("the first holder shares");
        assert_eq!(first.mode(), Mode::Shared);
        let mode = newcomer.join().expect("the newcomer's thread");
        assert_eq!(mode.expect("the newcomer's take"), Mode::Shared);
    }

    #[test]
    fn a_knock_before_the_watcher_starts_is_not_lost() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let mut first = SoloLock::take(dir.path(), Duration::from_secs(5), NOBODY).expect("first");
        let newcomer = newcomer(dir.path());
        // The newcomer knocks before anyone watches: wait until it has.
        let knock = dir.path().join(KNOCK_FILE);
        while !knock.exists() {
            std::thread::yield_now();
        }
        let (knocked_tx, knocked_rx) = mpsc::channel();
        let _watcher = Watcher::start(dir.path(), move || {
            let _ = knocked_tx.send(());
        })
        .expect("the watcher");
        knocked_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a later knock is seen");
        first.share().expect("the first holder shares");
        let mode = newcomer.join().expect("the newcomer's thread");
        assert_eq!(mode.expect("the newcomer's take"), Mode::Shared);
    }

    #[test]
    fn an_exclusive_lock_with_others_present_is_not_solo() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let solo_lock = SoloLock::take(dir.path(), Duration::from_secs(5), SOMEBODY).expect("take");
        assert_eq!(solo_lock.mode(), Mode::Shared);
        // And a later process shares at once, without knocking.
        let other = SoloLock::take(dir.path(), Duration::from_millis(1), SOMEBODY).expect("take");
        assert_eq!(other.mode(), Mode::Shared);
        assert!(!dir.path().join(KNOCK_FILE).exists());
    }

    #[test]
    fn a_holder_that_never_shares_makes_the_newcomer_fail_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let _first = SoloLock::take(dir.path(), Duration::from_secs(5), NOBODY).expect("first");
        let err = SoloLock::take(dir.path(), Duration::from_millis(50), SOMEBODY)
            .expect_err("it must time out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("alone on this folder"), "{err}");
    }

    #[test]
    fn a_folder_whose_holder_left_is_taken_solo_again() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let first = SoloLock::take(dir.path(), Duration::from_secs(5), NOBODY).expect("first");
        drop(first);
        let second = SoloLock::take(dir.path(), Duration::from_secs(5), NOBODY).expect("second");
        assert_eq!(second.mode(), Mode::Solo);
    }

    #[test]
    fn a_watcher_dropped_without_a_knock_stops_its_thread() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let (knocked_tx, knocked_rx) = mpsc::channel::<()>();
        let watcher = Watcher::start(dir.path(), move || {
            let _ = knocked_tx.send(());
        })
        .expect("the watcher");
        drop(watcher); // joins the thread: the test would hang if it did not end
        assert_eq!(
            knocked_rx.try_recv(),
            Err(mpsc::TryRecvError::Disconnected),
            "no knock, and the callback is gone with the thread"
        );
    }
}

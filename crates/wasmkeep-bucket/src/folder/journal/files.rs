//! The journal files in `.wal`: this process's own (created zero-filled
//! and padded, or a gone process's taken over), the gone ones and the live
//! ones of other processes, the markers of journals that hold young
//! entries (ADR 0034), and the pads that keep a journal's inode alone in
//! its inode-table block (ADR 0029).
//!
//! It names, creates, finds and removes files; it never reads or writes an
//! entry (`format`, `recovery` and the journal itself do).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::format::{JOURNAL_ZEROED_START, Region};
use crate::folder::locks::flock;
use crate::folder::sys::{names_in, statx_only};

pub(super) const JOURNAL_PREFIX: &str = "j.";
/// `.wal/y.<journal name>`: that journal holds young entries (ADR 0034), so
/// a recovery on the same boot must read and apply them. Made when the
/// process goes solo, removed with the journal or when it leaves solo mode.
const YOUNG_PREFIX: &str = "y.";
pub(super) const PAD_PREFIX: &str = "p.";
/// Inodes whose places are taken around the journal's: an aligned run this
/// long covers the inode-table block holding the journal's inode for every
/// inode size from 128 bytes (32 per 4 KiB block) up.
pub(super) const PAD_GROUP: u64 = 32;
/// Most pad files made in search of a whole aligned run; without one the
/// journal goes unpadded (a file system that does not hand out inode
/// numbers in order, or a busy one).
const PAD_FILES_MAX: usize = 512;
/// Longest time spent making pad files: beside many recent deletions, each
/// new inode on ext4 without a journal scans past them (ADR 0027), and one
/// pad took 330 µs instead of 15.
const PAD_TIME_MAX: Duration = Duration::from_millis(5);

/// This process's journal: a gone process's padded journal taken over (its
/// entries are all durable now, so a replay skips them, and its pads still
/// surround it), else a new one. Removes the other gone journals and the
/// pads whose journal is gone. The caller holds the exclusive generation lock.
pub(super) fn take_journal(
    dir: &Path,
    dead: Vec<(PathBuf, File)>,
) -> io::Result<(PathBuf, File, Option<PathBuf>)> {
    let names = names_in(dir)?;
    let mut taken = None;
    for (path, lock) in dead {
        let pads = path
            .file_name()
            .map(|name| format!("{PAD_PREFIX}{}", name.to_string_lossy()))
            .filter(|pads| names.contains(pads));
        if taken.is_none()
            && let Some(pads) = pads
        {
            // The lock moves to a descriptor that can write; nobody else
            // looks for gone journals while we hold the generation lock.
            let reopened = OpenOptions::new().read(true).write(true).open(&path);
            drop(lock);
            if let Ok(file) = reopened
                && flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_ok()
            {
                remove_young_marker(&path)?;
                taken = Some((path, file, Some(dir.join(pads))));
                continue;
            }
        }
        remove_dead_journal(&path)?;
    }
    remove_orphan_pads(dir)?;
    match taken {
        Some(journal) => Ok(journal),
        None => create_journal_file(dir),
    }
}

/// Creates this process's journal: zero-filled, locked, and durable as a
/// folder entry before any batch relies on it; padded where the file system
/// allows (returns the pads' folder). The caller holds the exclusive generation
/// lock.
pub(super) fn create_journal_file(dir: &Path) -> io::Result<(PathBuf, File, Option<PathBuf>)> {
    let name = format!(
        "{JOURNAL_PREFIX}{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    let path = dir.join(&name);
    let started = std::time::Instant::now();
    let pads = match pad_journal(dir, &name, &path) {
        Ok(pads) => {
            tracing::debug!(
                padded = pads.is_some(),
                micros = started.elapsed().as_micros(),
                "folder bucket: journal created"
            );
            pads
        }
        Err(e) => {
            tracing::debug!(error = %e, "folder bucket: the journal goes unpadded");
            None
        }
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(pads.is_none())
        .open(&path)?;
    flock(&file, libc::LOCK_EX)?;
    let zeros = vec![0u8; usize::try_from(JOURNAL_ZEROED_START).expect("small")];
    for index in 0..2 {
        file.write_all_at(&zeros, Region::base(index))?;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok((path, file, pads))
}

/// Makes empty pad files in a new folder `p.<name>` until they hold every
/// inode of an aligned run of [`PAD_GROUP`], then renames one in the middle
/// of the run to `path` (the journal, so its inode-table block holds nothing
/// that changes but the journal). Returns the pads' folder, or `None` (and
/// no pads left) when no run came together within [`PAD_FILES_MAX`] files
/// and [`PAD_TIME_MAX`].
///
/// ext4 hands out the lowest free inode of the folder's group, so in a
/// group with holes (files deleted there) the pads would first fill them,
/// one by one. `dir` is therefore flagged `TOPDIR`, so that ext4 places the
/// pads' folder like a top-level one, in a group with more free inodes than
/// average (Orlov), where they come in order. Pads that filled holes all
/// the same stay with the others: removing them would free inodes that
/// every file created in the next minute scans past on ext4 without a
/// journal (ADR 0027).
fn pad_journal(dir: &Path, name: &str, path: &Path) -> io::Result<Option<PathBuf>> {
    mark_top_folder(dir);
    let folder = dir.join(format!("{PAD_PREFIX}{name}"));
    fs::create_dir(&folder)?;
    let mut made: std::collections::BTreeMap<u64, PathBuf> = std::collections::BTreeMap::new();
    let mut run = None;
    let mut failed = None;
    let started = std::time::Instant::now();
    for n in 0..PAD_FILES_MAX {
        if started.elapsed() > PAD_TIME_MAX {
            break;
        }
        let pad = folder.join(n.to_string());
        let file = match OpenOptions::new().write(true).create_new(true).open(&pad) {
            Ok(file) => file,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        let ino = match inode_number(&file) {
            Ok(ino) => ino,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        made.insert(ino, pad);
        let start = ino.saturating_sub(1) / PAD_GROUP * PAD_GROUP + 1;
        if made.range(start..start + PAD_GROUP).count() == PAD_GROUP as usize {
            run = Some(start);
            break;
        }
    }
    let placed = match run {
        Some(start) => {
            let pad = made
                .remove(&(start + PAD_GROUP / 2))
                .expect("the run is whole");
            fs::rename(&pad, path).map(|()| true)
        }
        None => failed.map_or(Ok(false), Err),
    };
    if !matches!(placed, Ok(true)) {
        let _ = fs::remove_dir_all(&folder);
    }
    Ok(placed?.then_some(folder))
}

/// Sets ext4's `TOPDIR` flag on a folder (`chattr +T`): folders made in it
/// are spread over the file system like top-level ones. Where the flag is
/// refused (another file system, another owner) nothing changes.
fn mark_top_folder(dir: &Path) {
    use std::os::fd::AsRawFd;
    const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;
    let Ok(folder) = File::open(dir) else {
        return;
    };
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int to the pointer, which is valid
    // for writes for the duration of the call.
    if unsafe { libc::ioctl(folder.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0
        || flags & FS_TOPDIR_FL != 0
    {
        return;
    }
    flags |= FS_TOPDIR_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, valid for the
    // duration of the call.
    let _ = unsafe { libc::ioctl(folder.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
}

/// The inode number of an open file (asking for the number only, see
/// `statx_only`).
pub(super) fn inode_number(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    statx_only(file.as_raw_fd(), c"", libc::AT_EMPTY_PATH, libc::STATX_INO).map(|out| out.stx_ino)
}

/// Removes the pads whose journal is gone: a journal removed at a clean
/// close or by `take_journal`, or one that died while its pads were made.
/// The caller holds the exclusive generation lock, under which journals are
/// made, taken over and removed.
pub(super) fn remove_orphan_pads(dir: &Path) -> io::Result<()> {
    let names = names_in(dir)?;
    for name in &names {
        let Some(journal) = name.strip_prefix(PAD_PREFIX) else {
            continue;
        };
        if !names.contains(journal) {
            let path = dir.join(name);
            // A folder of pads, or a pad file of an earlier build.
            let removed = match fs::remove_dir_all(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => fs::remove_file(&path),
                other => other,
            };
            match removed {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The journals in `dir` that are none of `ours` (this process's own and
/// the gone ones it holds): whether any is a live process's (its lock is
/// held) and whether any is a gone one's.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Others {
    pub(super) live: bool,
    pub(super) gone: bool,
}

pub(super) fn others_in(dir: &Path, ours: &[&Path]) -> io::Result<Others> {
    let mut others = Others::default();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(JOURNAL_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        if ours.contains(&path.as_path()) {
            continue;
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // A gone process's: this process's next open would take it.
            Ok(()) => others.gone = true,
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => others.live = true,
            Err(e) => return Err(e),
        }
    }
    Ok(others)
}

/// The journals of processes that are gone (their lock is free), locked.
pub(super) fn dead_journals(dir: &Path) -> io::Result<Vec<(PathBuf, File)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(JOURNAL_PREFIX) {
            continue;
        }
        let path = entry.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => out.push((path, file)),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Removes a dead journal. Its process may have stopped cleanly and removed
/// it after `dead_journals` opened it (the lock was free once it was gone).
pub(super) fn remove_dead_journal(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    remove_young_marker(path)
}

/// The marker saying `journal` holds young entries.
pub(super) fn young_marker(journal: &Path) -> Option<PathBuf> {
    let name = journal.file_name()?.to_string_lossy();
    Some(journal.with_file_name(format!("{YOUNG_PREFIX}{name}")))
}

pub(super) fn remove_young_marker(journal: &Path) -> io::Result<()> {
    let Some(marker) = young_marker(journal) else {
        return Ok(());
    };
    match fs::remove_file(marker) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

//! Recovery at open, under the exclusive generation lock (see the
//! journal's module docs): after a reboot, each key's last entry past the
//! durable generation is applied again; on the same boot, the journals of
//! gone processes wait for this process's first checkpoint, and the young
//! objects of a gone solo process are handed over to be adopted or put in
//! place.
//!
//! It reads gone processes' journals and writes objects; it never appends
//! to a journal and never runs a checkpoint.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::files::{dead_journals, young_marker};
use super::format::{
    Decoded, ENTRY_MAGIC, EntryKind, REGION_BYTES, Region, Stop, decode_prefix, raise_durable,
    read_durable,
};
use crate::folder::layout::TEMP_DIR;
use crate::folder::sys::{names_in, read_u64, syncfs};

const BOOT_FILE: &str = "boot";

/// This machine's boot id: a restart of the machine changes it, a restart of
/// a process does not.
pub(super) fn current_boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// Bytes read at a time from a journal region by recovery.
const RECOVERY_READ_BYTES: usize = 1 << 20;

/// The entries of both regions of a journal, read from the locked file (not
/// its path: its owner, stopping, may have removed it after we opened it).
/// Each region is read a chunk at a time and decoded as it comes, up to the
/// first bytes that are not an entry: what follows is zeros (a region is
/// allocated as it fills) or entries of an earlier pass through the region
/// (it starts over once they are durable). Reading whole regions took
/// 7-20 ms of a restart after a crash under load (ADR 0040).
pub(super) fn decoded_regions(journal: &File) -> io::Result<Vec<Decoded>> {
    let mut entries = Vec::new();
    let mut chunk = vec![0u8; RECOVERY_READ_BYTES];
    for index in 0..2 {
        let base = Region::base(index);
        // Read but not yet decoded: at most the start of one entry.
        let mut bytes = Vec::new();
        let mut read_so_far = 0u64;
        while read_so_far < REGION_BYTES {
            let want = RECOVERY_READ_BYTES.min((REGION_BYTES - read_so_far) as usize);
            let read = read_at_most(journal, &mut chunk[..want], base + read_so_far)?;
            read_so_far += read as u64;
            bytes.extend_from_slice(&chunk[..read]);
            let (decoded, end, stop) = decode_prefix(&bytes);
            entries.extend(decoded);
            bytes.drain(..end);
            if stop == Stop::NotAnEntry || read < want {
                break;
            }
        }
    }
    Ok(entries)
}

/// Reads into `buf` from `at` until it is full or the file ends; returns
/// how much was read.
fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Of each key's last entry (see [`keep_last`]), those that are young: in
/// solo mode nobody else wrote those keys meanwhile. A later entry that is
/// not young (written after its process left solo mode, or by a process
/// that never was alone) was in place as a file when it was answered.
fn young_only(last: HashMap<String, Decoded>) -> Vec<Decoded> {
    last.into_values().filter(|entry| entry.young).collect()
}

/// Keeps in `last`, for each key, its last entry (by order, then position in
/// the batch) of a generation past `durable`; returns the highest such
/// generation seen (0: none).
fn keep_last(
    last: &mut HashMap<String, Decoded>,
    entries: impl IntoIterator<Item = Decoded>,
    durable: u64,
) -> u64 {
    let mut highest = 0;
    for entry in entries {
        if entry.generation <= durable {
            continue;
        }
        highest = highest.max(entry.generation);
        let newer = last
            .get(&entry.key)
            .is_none_or(|have| (entry.order, entry.index) > (have.order, have.index));
        if newer {
            last.insert(entry.key.clone(), entry);
        }
    }
    highest
}

/// The journals of gone processes after recovery, still locked.
pub(super) enum Recovered {
    /// Every entry of theirs is durable in place: the caller takes one over
    /// or removes them.
    Durable(Vec<(PathBuf, File)>),
    /// Same boot, and they hold entries: their objects stand in the page
    /// cache but some may not be durable yet; the caller's first checkpoint
    /// makes them so, and the journals stay until then. `young`: each key's
    /// last entry where that is young (written alone on the folder, ADR
    /// 0034), which the caller adopts or applies before it serves.
    NotYetDurable {
        dead: Vec<(PathBuf, File)>,
        young: Vec<Decoded>,
    },
}

/// Recovery at open; the caller holds the exclusive generation lock.
pub(super) fn recover(
    root: &Path,
    dir: &Path,
    root_dir: &File,
    generation_file: &File,
    durable_file: &File,
    boot_id: &str,
) -> io::Result<Recovered> {
    let boot_path = dir.join(BOOT_FILE);
    let last_boot = match fs::read_to_string(&boot_path) {
        Ok(s) => Some(s.trim().to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let dead = dead_journals(dir)?;
    let generation = read_u64(generation_file, 0)?.unwrap_or(1).max(1);
    let durable = read_durable(durable_file)?;
    if last_boot.as_deref() == Some(boot_id) {
        // Same boot: the page cache holds what the dead processes renamed.
        // Journals without a single entry need no checkpoint. Any entry
        // counts, durable or not: telling them apart means reading the whole
        // journal (up to 64 MiB, ~30 ms after a crash under load), and a
        // checkpoint owed for nothing costs only a `syncfs` later.
        let mut entries = false;
        for (_, journal) in &dead {
            entries |= has_entries(journal)?;
        }
        if !entries {
            return Ok(Recovered::Durable(dead));
        }
        // A journal written alone on the folder (ADR 0034) holds objects
        // that never became files: the caller adopts them or puts them in
        // place, before this process serves. Only when some journal is
        // marked are journals read, and then all of them, each key's last
        // entry taken across all (by batch order): writers killed in turn
        // leave one journal each until a checkpoint, and the newest write of
        // a key may be in any of them, young or already in place.
        let marked = dead
            .iter()
            .any(|(path, _)| young_marker(path).is_some_and(|m| m.exists()));
        let young = if marked {
            let mut last = HashMap::new();
            for (_, journal) in &dead {
                keep_last(&mut last, decoded_regions(journal)?, durable);
            }
            young_only(last)
        } else {
            Vec::new()
        };
        // This process's entries come after theirs; its first checkpoint
        // (which bumps again) makes theirs durable.
        generation_file.write_all_at(&(generation + 1).to_le_bytes(), 0)?;
        return Ok(Recovered::NotYetDurable { dead, young });
    }
    // Another boot (or the first open): replay what may have been lost.
    let mut last = HashMap::new();
    let mut highest = generation.max(durable);
    for (_, journal) in &dead {
        highest = highest.max(keep_last(&mut last, decoded_regions(journal)?, durable));
    }
    let replayed = last.len();
    for entry in last.into_values() {
        replay(root, &entry)?;
    }
    syncfs(root_dir)?;
    generation_file.write_all_at(&(highest + 1).to_le_bytes(), 0)?;
    generation_file.sync_data()?;
    raise_durable(durable_file, highest)?;
    let temp = dir.join(format!("{BOOT_FILE}.tmp"));
    fs::write(&temp, boot_id)?;
    File::open(&temp)?.sync_all()?;
    fs::rename(&temp, &boot_path)?;
    File::open(dir)?.sync_all()?;
    if replayed > 0 {
        tracing::info!(
            objects = replayed,
            journals = dead.len(),
            "folder bucket: replayed the journals of the last boot"
        );
    }
    Ok(Recovered::Durable(dead))
}

/// Whether either region of a journal begins with an entry's magic (a
/// journal nobody wrote to is zeros, or shorter).
fn has_entries(journal: &File) -> io::Result<bool> {
    // From the locked file, not its path (see `recover`).
    for index in 0..2 {
        let mut magic = [0u8; 4];
        match journal.read_exact_at(&mut magic, Region::base(index)) {
            Ok(()) if u32::from_le_bytes(magic) == ENTRY_MAGIC => return Ok(true),
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Deletes in one folder from which [`replay_young`] lists the folder
/// instead of trying each `unlink`.
const LISTED_DELETES_MIN: usize = 16;

/// Applies the young entries of a gone solo process (each key's last one)
/// and returns how many changed the folder. Deletes go first, so that a
/// folder an object left is free for a put below it.
///
/// Most deletes name records compacted before they ever became files. The
/// folders they name are listed once each, and only names found there are
/// removed: a failed `unlink` costs a negative lookup, tens of µs in a
/// folder that many files passed through, and a crash under load leaves
/// thousands of such deletes (the first answer after a restart waits for
/// this).
pub(super) fn replay_young(root: &Path, mut entries: Vec<Decoded>) -> io::Result<usize> {
    entries.sort_by_key(|entry| entry.kind != EntryKind::Delete);
    // A folder with only a few deletes is not listed: it may be a large one
    // (a listing costs per entry), and a few failed unlinks cost little.
    let mut deletes: HashMap<PathBuf, usize> = HashMap::new();
    for entry in entries.iter().filter(|e| e.kind == EntryKind::Delete) {
        if let Some(dir) = root.join(&entry.key).parent() {
            *deletes.entry(dir.to_path_buf()).or_default() += 1;
        }
    }
    let mut listed: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut applied = 0;
    for entry in &entries {
        if entry.kind == EntryKind::Delete {
            let target = root.join(&entry.key);
            if let (Some(dir), Some(name)) = (target.parent(), target.file_name())
                && deletes.get(dir).is_some_and(|n| *n >= LISTED_DELETES_MIN)
            {
                if !listed.contains_key(dir) {
                    // No such folder: none of its names is there.
                    let names = match names_in(dir) {
                        Err(e)
                            if e.kind() == io::ErrorKind::NotFound
                                || e.raw_os_error() == Some(libc::ENOTDIR) =>
                        {
                            HashSet::new()
                        }
                        names => names?,
                    };
                    listed.insert(dir.to_path_buf(), names);
                }
                let present = listed
                    .get(dir)
                    .is_some_and(|names| names.contains(name.to_string_lossy().as_ref()));
                if !present {
                    continue;
                }
            }
        }
        replay(root, entry)?;
        applied += 1;
    }
    Ok(applied)
}

/// Applies one entry again (not synced: recovery syncs the file system once).
fn replay(root: &Path, entry: &Decoded) -> io::Result<()> {
    let target = root.join(&entry.key);
    match entry.kind {
        EntryKind::Durable => Ok(()),
        EntryKind::Delete => match fs::remove_file(&target) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        EntryKind::Put => {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            let temp = root
                .join(TEMP_DIR)
                .join(format!("replay.{:016x}", rand::random::<u64>()));
            fs::write(&temp, &entry.body)?;
            fs::rename(&temp, &target)
        }
    }
}

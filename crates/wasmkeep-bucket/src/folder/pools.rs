//! Files kept for reuse (ADR 0027, 0031): a file replaced or deleted by the
//! committer waits under `.tmp/` and is rewritten as a later temporary
//! file; at open, a process takes over the temporary files of processes
//! that are gone.
//!
//! It keeps and hands out files; it never writes an object's bytes nor
//! renames a file into place (the committer does).

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::locks::flock;

/// A temporary file older than this at open belongs to a crashed writer.
pub const TEMP_FILE_STALE_AGE: Duration = Duration::from_secs(3600);
/// The lock file of one process's temporary files: `.tmp/<prefix>.lock`.
pub(super) const TEMP_LOCK_SUFFIX: &str = ".lock";

/// Inode reuse (see the folder module's docs): a file replaced or deleted by the
/// committer is kept under `.tmp/` and rewritten as a later temporary file,
/// at the earliest this long after it left its key.
pub const INODE_REUSE_GRACE: Duration = Duration::from_secs(2);

/// Most files one committer keeps for reuse; beyond, they are unlinked. A
/// file is reused only after [`INODE_REUSE_GRACE`], so sustained writes need
/// about `rate x grace` files in the pool: 65,536 covers 32,000 writes/s.
pub const INODE_POOL_FILES_MAX: usize = 65_536;
/// Larger files are unlinked rather than kept (their blocks would be held).
pub const INODE_POOL_FILE_BYTES_MAX: u64 = 64 << 10;
/// Most disk the pool holds, sizes rounded up to [`POOL_BLOCK_BYTES`].
pub const INODE_POOL_BYTES_MAX: u64 = 256 << 20;
/// The block size the pool counts in (ext4's default).
const POOL_BLOCK_BYTES: u64 = 4096;

/// The temporary files a new process takes over at open.
pub(super) struct Adopted {
    /// The prefixes of processes that are gone and left files.
    pub(super) prefixes: Vec<String>,
    /// Their files kept for reuse (their inodes), each `.tmp/<prefix>.<n>`
    /// as (index in `prefixes`, `n`): no path per file, which with tens of
    /// thousands of pooled files cost a restart ~20 ms.
    pub(super) files: Vec<(u32, u64)>,
    /// The lock files of those processes, held from now on, so their files
    /// stay this process's own.
    pub(super) locks: Vec<File>,
}

/// Takes over the temporary files of processes that are gone (named after a
/// lock file, `<prefix>.lock`, that nobody holds): they join this process's
/// pool, up to [`INODE_POOL_FILES_MAX`] (a stopped process leaves its pool
/// for the next one: unlinking thousands of files cost a restart 0.2-0.4 s),
/// the rest are removed. A live process's files are never touched, however old (a pooled
/// file keeps the time its object was written). Files of builds that kept no
/// lock go by age ([`TEMP_FILE_STALE_AGE`]).
pub(super) fn adopt_temp_files(temp_dir: &Path) -> Adopted {
    let mut adopted = Adopted {
        prefixes: Vec::new(),
        files: Vec::new(),
        locks: Vec::new(),
    };
    let Ok(entries) = fs::read_dir(temp_dir) else {
        return adopted;
    };
    // Names, and whether each is a plain file (from the directory entry: no
    // `stat` per file, which with thousands of pooled files cost a restart
    // ~15 ms).
    let listed: Vec<(String, bool)> = entries
        .flatten()
        .filter_map(|e| {
            let is_file = e.file_type().is_ok_and(|t| t.is_file());
            e.file_name().into_string().ok().map(|n| (n, is_file))
        })
        .collect();
    // Gone prefixes: (index in `adopted.prefixes`, its lock, files kept).
    let mut dead: HashMap<&str, (u32, File, usize)> = HashMap::new();
    let mut held: Vec<&str> = Vec::new();
    for (name, _) in &listed {
        let Some(prefix) = name.strip_suffix(TEMP_LOCK_SUFFIX) else {
            continue;
        };
        let Ok(lock) = OpenOptions::new().write(true).open(temp_dir.join(name)) else {
            continue;
        };
        if flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let index = u32::try_from(adopted.prefixes.len()).unwrap_or(u32::MAX);
            adopted.prefixes.push(prefix.to_owned());
            dead.insert(prefix, (index, lock, 0));
        } else {
            held.push(prefix);
        }
    }
    for (name, is_file) in &listed {
        if name.ends_with(TEMP_LOCK_SUFFIX) {
            continue;
        }
        // `<pid>.<random>.<n>`: the prefix is everything before the last dot.
        let (prefix, n) = match name.rsplit_once('.') {
            Some((prefix, n)) => (prefix, n.parse::<u64>().ok()),
            None => (name.as_str(), None),
        };
        let remove = match dead.get_mut(prefix) {
            Some((index, _, kept)) => {
                // Sizes are not checked: pooled files are small, and the
                // others (writes in flight when a process crashed) are few;
                // a reuse cuts any file to its new length.
                match n {
                    Some(n) if *is_file && adopted.files.len() < INODE_POOL_FILES_MAX => {
                        adopted.files.push((*index, n));
                        *kept += 1;
                        false
                    }
                    _ => true,
                }
            }
            None if held.contains(&prefix) => false,
            None => fs::metadata(temp_dir.join(name))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > TEMP_FILE_STALE_AGE),
        };
        if remove {
            // Best effort: another process may remove it at the same time.
            let _ = fs::remove_file(temp_dir.join(name));
        }
    }
    for (prefix, (_, lock, kept)) in dead {
        if kept == 0 {
            let _ = fs::remove_file(temp_dir.join(format!("{prefix}{TEMP_LOCK_SUFFIX}")));
        } else {
            adopted.locks.push(lock);
        }
    }
    adopted
}

/// Files (under `.tmp/`) whose inodes the committer reuses for new
/// temporary files, oldest first.
pub(super) struct InodePool {
    pub(super) files: VecDeque<Spare>,
    /// The disk `files` hold, each size rounded up to whole blocks.
    bytes: u64,
    /// `.tmp/` and this process's prefix there: its own files are kept by
    /// number (`<prefix>.<n>`), not by path, so that a full pool costs
    /// ~3 MiB of memory rather than ~9.
    temp_dir: PathBuf,
    prefix: String,
    /// The prefixes of gone processes whose files were adopted at open.
    adopted_prefixes: Vec<String>,
    /// [`INODE_REUSE_GRACE`] (tests shorten it).
    grace: Duration,
    /// `renameat2(RENAME_EXCHANGE)` failed as unsupported on this file
    /// system: replaced files are unlinked by a plain rename instead.
    pub(super) no_exchange: bool,
}

/// A kept file: which, when it left its key, and its size (`None`: not
/// known, for files adopted from a gone process).
pub(super) struct Spare {
    name: SpareName,
    since: Instant,
    len: Option<u64>,
}

enum SpareName {
    /// `.tmp/<prefix>.<n>`, this process's own.
    Own(u64),
    /// `.tmp/<adopted prefix>.<n>`, adopted from a gone process.
    Adopted(u32, u64),
    /// Named otherwise.
    Other(Box<Path>),
}

/// The disk a file of `len` bytes holds, in whole blocks. A file adopted
/// without its size counts one block: it was pooled under the same limits.
fn held_bytes(len: Option<u64>) -> u64 {
    len.map_or(POOL_BLOCK_BYTES, |len| {
        len.div_ceil(POOL_BLOCK_BYTES) * POOL_BLOCK_BYTES
    })
}

impl InodePool {
    pub(super) fn new(temp_dir: PathBuf, prefix: String, grace: Duration) -> Self {
        InodePool {
            files: VecDeque::new(),
            bytes: 0,
            temp_dir,
            prefix,
            adopted_prefixes: Vec::new(),
            grace,
            no_exchange: false,
        }
    }

    /// Takes in the files of gone processes (see [`adopt_temp_files`]).
    pub(super) fn adopt(&mut self, prefixes: Vec<String>, files: &[(u32, u64)]) {
        self.adopted_prefixes = prefixes;
        let since = Instant::now();
        self.bytes += held_bytes(None) * files.len() as u64;
        for (prefix, n) in files {
            self.files.push_back(Spare {
                name: SpareName::Adopted(*prefix, *n),
                since,
                len: None,
            });
        }
    }

    /// Whether a file of `len` bytes leaving its key is kept.
    pub(super) fn wants(&self, len: u64) -> bool {
        self.files.len() < INODE_POOL_FILES_MAX
            && len <= INODE_POOL_FILE_BYTES_MAX
            && self.bytes + held_bytes(Some(len)) <= INODE_POOL_BYTES_MAX
    }

    pub(super) fn keep(&mut self, path: PathBuf, len: Option<u64>) {
        let parsed = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.rsplit_once('.'))
            .and_then(|(prefix, n)| Some((prefix, n.parse::<u64>().ok()?)))
            .filter(|_| path.parent() == Some(self.temp_dir.as_path()));
        let name = match parsed {
            Some((prefix, n)) if prefix == self.prefix => SpareName::Own(n),
            Some((prefix, n)) => match self.adopted_prefixes.iter().position(|p| p == prefix) {
                Some(i) => SpareName::Adopted(u32::try_from(i).unwrap_or(u32::MAX), n),
                None => SpareName::Other(path.into_boxed_path()),
            },
            None => SpareName::Other(path.into_boxed_path()),
        };
        self.bytes += held_bytes(len);
        self.files.push_back(Spare {
            name,
            since: Instant::now(),
            len,
        });
    }

    /// The path of this process's `n`th temporary file.
    fn own_path(&self, n: u64) -> PathBuf {
        self.temp_dir.join(format!("{}.{n}", self.prefix))
    }

    /// The oldest kept file that left its key at least the grace ago,
    /// opened for writing (not emptied: the writer overwrites it from the
    /// start, then cuts it to length). A file another process removed
    /// meanwhile (stale temporary files are removed at open) is skipped.
    pub(super) fn take(&mut self) -> Option<(PathBuf, File, Option<u64>)> {
        while let Some(spare) = self.files.front() {
            if spare.since.elapsed() < self.grace {
                return None;
            }
            let spare = self.files.pop_front().expect("front exists");
            self.bytes -= held_bytes(spare.len);
            let path = match spare.name {
                SpareName::Own(n) => self.own_path(n),
                SpareName::Adopted(i, n) => match self.adopted_prefixes.get(i as usize) {
                    Some(prefix) => self.temp_dir.join(format!("{prefix}.{n}")),
                    None => continue,
                },
                SpareName::Other(path) => path.into_path_buf(),
            };
            if let Ok(file) = OpenOptions::new().write(true).open(&path) {
                return Some((path, file, spare.len));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool keeps files up to its byte limit (sizes in whole blocks) and
    /// file limit, remembers its own files by number, and gives each back
    /// at the path it was kept under.
    #[test]
    fn the_inode_pool_counts_whole_blocks_and_returns_files_where_they_are() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let temp_dir = dir.path().to_path_buf();
        let mut pool = InodePool::new(temp_dir.clone(), "7.abc".to_owned(), Duration::ZERO);
        assert_eq!(held_bytes(Some(0)), 0);
        assert_eq!(held_bytes(Some(1)), POOL_BLOCK_BYTES);
        assert_eq!(held_bytes(Some(POOL_BLOCK_BYTES + 1)), 2 * POOL_BLOCK_BYTES);
        assert_eq!(held_bytes(None), POOL_BLOCK_BYTES);

        let own = temp_dir.join("7.abc.12");
        let other = temp_dir.join("9.def.3");
        let adopted = temp_dir.join("5.gone.4");
        for path in [&own, &other, &adopted] {
            fs::write(path, b"x").expect("written");
        }
        pool.adopt(vec!["5.gone".to_owned()], &[(0, 4)]);
        pool.keep(own.clone(), Some(5000));
        pool.keep(other.clone(), None);
        assert!(matches!(pool.files[0].name, SpareName::Adopted(0, 4)));
        assert!(matches!(pool.files[1].name, SpareName::Own(12)));
        assert!(matches!(pool.files[2].name, SpareName::Other(_)));
        assert_eq!(pool.bytes, 4 * POOL_BLOCK_BYTES);
        // A file adopted, reused and replaced comes back under its name.
        pool.keep(adopted.clone(), Some(10));
        assert!(matches!(pool.files[3].name, SpareName::Adopted(0, 4)));
        let (path, _, len) = pool.take().expect("the adopted file");
        assert_eq!((path, len), (adopted, None));
        pool.files.pop_back();
        pool.bytes = 3 * POOL_BLOCK_BYTES;

        pool.bytes = INODE_POOL_BYTES_MAX - POOL_BLOCK_BYTES;
        assert!(pool.wants(POOL_BLOCK_BYTES));
        assert!(!pool.wants(POOL_BLOCK_BYTES + 1), "over the byte limit");
        assert!(
            !pool.wants(INODE_POOL_FILE_BYTES_MAX + 1),
            "over the file size limit"
        );
        pool.bytes = 3 * POOL_BLOCK_BYTES;

        let (path, _, len) = pool.take().expect("the first kept file");
        assert_eq!((path, len), (own, Some(5000)));
        let (path, _, len) = pool.take().expect("the second kept file");
        assert_eq!((path, len), (other, None));
        assert_eq!(pool.bytes, 0);
        assert!(pool.take().is_none());
    }
}

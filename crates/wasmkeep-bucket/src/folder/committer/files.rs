//! The committer's files: temporary files written (reusing pooled inodes),
//! renamed into place or removed (kept for reuse when the pool wants them),
//! missing folders made, and files and folders synced in place.
//!
//! It acts on the paths a batch gives it; it never checks a condition nor
//! touches the journal.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::state::Committer;
use crate::folder::layout::{TEMP_DIR, io_unavailable, is_missing, prefix_collision};
use crate::folder::sync::{PER_FILE_SYNCS_MAX, SyncMode};
use crate::folder::sys::{exchange, shape_of, syncfs};
use crate::{Etag, ObjectMeta, Result};

impl Committer {
    /// Makes `temp` the object at `target`. When it replaces an object
    /// (`replaces`: its size), the two are exchanged so the old inode stays
    /// at `temp` for reuse instead of being freed.
    pub(super) fn place(
        &mut self,
        temp: &Path,
        target: &Path,
        replaces: Option<u64>,
    ) -> io::Result<()> {
        if let Some(len) = replaces
            && !self.pool.no_exchange
            && self.pool.wants(len)
        {
            match exchange(temp, target) {
                Ok(()) => {
                    self.pool.keep(temp.to_path_buf(), Some(len));
                    return Ok(());
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                    self.pool.no_exchange = true;
                }
                // Not there after all: a plain rename creates it.
                Err(e) if is_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        fs::rename(temp, target)
    }

    /// Removes the object at `target` (`len`: its size): moved into the
    /// pool when it is kept for reuse, unlinked otherwise.
    pub(super) fn remove(&mut self, target: &Path, len: u64) -> io::Result<()> {
        if self.pool.wants(len) {
            let slot = self.next_temp_path();
            fs::rename(target, &slot)?;
            self.pool.keep(slot, Some(len));
            return Ok(());
        }
        fs::remove_file(target)
    }

    fn next_temp_path(&mut self) -> PathBuf {
        self.temp_counter += 1;
        self.root
            .join(TEMP_DIR)
            .join(format!("{}.{}", self.temp_prefix, self.temp_counter))
    }

    pub(super) fn write_temp(
        &mut self,
        key: &str,
        bytes: &[u8],
        etag: Etag,
    ) -> Result<(PathBuf, ObjectMeta)> {
        let (temp, mut file, old_len) = match self.pool.take() {
            Some(reused) => reused,
            None => {
                let temp = self.next_temp_path();
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&temp)
                    .map_err(|e| io_unavailable(key, "create temp file", &e))?;
                (temp, file, Some(0))
            }
        };
        // A reused file is overwritten from its start and cut to the new
        // length afterwards: its blocks are reused too, and ext4 starts
        // writing back at once any file truncated to zero and rewritten
        // (`auto_da_alloc`), which would add a device write per object.
        // No `fstat`: its size is known, and asking for its times would
        // make every later timestamp fine-grained (see `shape_of`).
        let len = bytes.len() as u64;
        let written = file.write_all(bytes).and_then(|()| match old_len {
            Some(old) if old <= len => Ok(()),
            _ => file.set_len(len),
        });
        match written {
            // The time the write returned, as the S3 backend gives: a later
            // read reports the file's mtime, which is no later than this.
            Ok(()) => Ok((
                temp,
                ObjectMeta {
                    key: key.to_owned(),
                    etag,
                    last_modified: SystemTime::now(),
                    size: len,
                },
            )),
            Err(e) => {
                let _ = fs::remove_file(&temp);
                Err(io_unavailable(key, "write temp file", &e))
            }
        }
    }

    /// Creates the missing parent folders of `target`, remembering every
    /// folder whose entries changed so it gets synced.
    pub(super) fn create_parents(
        &self,
        target: &Path,
        touched: &mut BTreeSet<PathBuf>,
    ) -> Result<()> {
        let key = target
            .strip_prefix(self.root.as_path())
            .unwrap_or(target)
            .to_string_lossy()
            .into_owned();
        let Some(parent) = target.parent() else {
            return Ok(());
        };
        let mut missing = Vec::new();
        let mut dir = parent;
        while dir != self.root.as_path() {
            match shape_of(dir) {
                Ok(shape) if shape.dir => break,
                Ok(_) => return Err(prefix_collision(&key)),
                Err(e) if is_missing(&e) => missing.push(dir),
                Err(e) => return Err(io_unavailable(&key, "stat folder", &e)),
            }
            match dir.parent() {
                Some(p) => dir = p,
                None => break,
            }
        }
        for dir in missing.into_iter().rev() {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::AlreadyExists
                        && shape_of(dir).is_ok_and(|shape| shape.dir) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::AlreadyExists
                        || e.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    return Err(prefix_collision(&key));
                }
                Err(e) => return Err(io_unavailable(&key, "create folder", &e)),
            }
            if let Some(p) = dir.parent() {
                touched.insert(p.to_path_buf());
            }
        }
        Ok(())
    }

    pub(super) fn sync_files(&self, temps: &[&Path]) -> io::Result<()> {
        match self.sync_mode {
            SyncMode::Syncfs | SyncMode::Journal if temps.len() > PER_FILE_SYNCS_MAX => {
                syncfs(&self.root_dir)
            }
            SyncMode::Syncfs | SyncMode::Journal | SyncMode::PerFile => {
                self.sync_pool.sync_all(temps, true)
            }
        }
    }

    pub(super) fn sync_dirs(&self, dirs: &BTreeSet<PathBuf>) -> io::Result<()> {
        match self.sync_mode {
            SyncMode::Syncfs | SyncMode::Journal if dirs.len() > PER_FILE_SYNCS_MAX => {
                syncfs(&self.root_dir)
            }
            SyncMode::Syncfs | SyncMode::Journal | SyncMode::PerFile => {
                let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
                self.sync_pool.sync_all(&dirs, false)
            }
        }
    }
}

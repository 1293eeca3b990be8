//! Reads: an object whole, and pages of a listing with the young objects
//! merged in, on the caller's thread when nothing would wait for the
//! device (ADR 0028), else on a blocking thread.
//!
//! It never writes, never locks and never asks the committer anything: a
//! rename replaces a file whole, so a read sees the old or the new object.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::layout::{JOURNAL_DIR, LOCKS_DIR, TEMP_DIR, content_etag, io_unavailable, is_missing};
use super::sys::{read_cached, shape_of};
use super::young::{self, Young};
use crate::{Error, Etag, LIST_PAGE_OBJECTS_MAX, ListPage, Object, ObjectMeta, Result};

/// A read that took longer than this (open to last byte) is done again: the
/// file it opened may have been reused meanwhile. Half the grace.
pub const READ_TIME_MAX: Duration = Duration::from_secs(1);
/// Reads of one object tried before the read is called unavailable.
const READ_ATTEMPTS_MAX: usize = 3;

/// Where a read runs, and so how long it may block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    /// A blocking thread: any read.
    Blocking,
    /// The caller's own (async) thread, which must not wait for the device:
    /// at most [`INLINE_LIST_OBJECTS_MAX`] objects of at most
    /// [`INLINE_READ_BYTES_MAX`] bytes each, whose pages are all in memory
    /// (`preadv2` with `RWF_NOWAIT`). Anything else is [`ReadFailure::WouldBlock`]
    /// and is read again on a blocking thread.
    Inline,
}

/// Largest object read on the caller's thread.
const INLINE_READ_BYTES_MAX: u64 = 64 << 10;
/// Most objects one listing reads on the caller's thread (to hash them for
/// their etags); a longer listing runs on a blocking thread.
const INLINE_LIST_OBJECTS_MAX: usize = 8;

/// Why a read gave no answer.
#[derive(Debug)]
pub(super) enum ReadFailure {
    Failed(Error),
    /// An inline read would have to wait (see [`Reader::Inline`]).
    WouldBlock,
}

impl From<Error> for ReadFailure {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

impl ReadFailure {
    /// The error of a [`Reader::Blocking`] read, which never would block.
    pub(super) fn into_error(self, key: &str) -> Error {
        match self {
            Self::Failed(e) => e,
            Self::WouldBlock => Error::Unavailable {
                key: key.to_owned(),
                reason: "internal: a blocking read would block".to_owned(),
            },
        }
    }
}

/// Reads an object whole; `Ok(None)` when it does not exist. A read that
/// took longer than [`READ_TIME_MAX`] is done again: the committer may have
/// reused the file it opened (see the folder module's docs).
pub(super) fn read_object(
    root: &Path,
    key: &str,
    reader: Reader,
) -> Result<Option<Object>, ReadFailure> {
    read_object_within(root, key, READ_TIME_MAX, reader)
}

fn read_object_within(
    root: &Path,
    key: &str,
    time_max: Duration,
    reader: Reader,
) -> Result<Option<Object>, ReadFailure> {
    let path = root.join(key);
    for _ in 0..READ_ATTEMPTS_MAX {
        let started = Instant::now();
        let read = read_object_once(&path, key, reader)?;
        if started.elapsed() <= time_max {
            return Ok(read);
        }
    }
    Err(ReadFailure::Failed(Error::Unavailable {
        key: key.to_owned(),
        reason: format!(
            "each of {READ_ATTEMPTS_MAX} reads took longer than {time_max:?} (the machine is overloaded)"
        ),
    }))
}

fn read_object_once(path: &Path, key: &str, reader: Reader) -> Result<Option<Object>, ReadFailure> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if is_missing(&e) => return Ok(None),
        Err(e) => return Err(io_unavailable(key, "open", &e).into()),
    };
    let metadata = file
        .metadata()
        .map_err(|e| io_unavailable(key, "stat", &e))?;
    if metadata.is_dir() {
        return Ok(None);
    }
    let buf = match reader {
        Reader::Blocking => {
            let mut buf = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
            file.read_to_end(&mut buf)
                .map_err(|e| io_unavailable(key, "read", &e))?;
            buf
        }
        Reader::Inline if metadata.len() > INLINE_READ_BYTES_MAX => {
            return Err(ReadFailure::WouldBlock);
        }
        Reader::Inline => read_cached(&file, metadata.len())
            .map_err(|e| io_unavailable(key, "read", &e))?
            .ok_or(ReadFailure::WouldBlock)?,
    };
    let meta = ObjectMeta {
        key: key.to_owned(),
        etag: content_etag(&buf),
        last_modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        size: buf.len() as u64,
    };
    Ok(Some(Object {
        bytes: Bytes::from(buf),
        meta,
    }))
}

/// What a listing learns of each object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// Everything: each object is read for its etag.
    Full,
    /// Its key and size only (the etag is left empty and the time is the
    /// Unix epoch): for [`Hints::list_keys`], which passes on neither.
    ///
    /// [`Hints::list_keys`]: crate::Hints::list_keys
    Size,
}

/// A page of the listing: the folder's, with the young objects merged in
/// (they replace the older files of their keys).
pub(super) fn list_merged(
    young: Option<&Young>,
    root: &Path,
    prefix: &str,
    start_after: Option<&str>,
    reader: Reader,
    detail: Detail,
) -> Result<ListPage, ReadFailure> {
    let disk = || list_page_with(root, prefix, start_after, reader, detail);
    let Some(young) = young else {
        return disk();
    };
    // One more than a page: a page holds no young key past the first
    // page's worth of them.
    let (mut listed, page) = young.list(
        |index| young::listed(index, prefix, start_after, LIST_PAGE_OBJECTS_MAX + 1),
        disk,
    );
    let page = page?;
    if listed.is_empty() {
        return Ok(page);
    }
    let cut = listed.len() > LIST_PAGE_OBJECTS_MAX;
    listed.truncate(LIST_PAGE_OBJECTS_MAX);
    // With more to come, young keys past this page's last are later pages'.
    let bound = page.next.clone();
    let mut merged: std::collections::BTreeMap<String, ObjectMeta> = page
        .objects
        .into_iter()
        .map(|meta| (meta.key.clone(), meta))
        .collect();
    for meta in listed {
        if bound
            .as_deref()
            .is_some_and(|last| meta.key.as_str() > last)
        {
            break;
        }
        merged.insert(meta.key.clone(), meta);
    }
    let mut objects: Vec<ObjectMeta> = merged.into_values().collect();
    let mut next = bound;
    if objects.len() > LIST_PAGE_OBJECTS_MAX || cut {
        objects.truncate(LIST_PAGE_OBJECTS_MAX);
        next = objects.last().map(|meta| meta.key.clone());
    }
    Ok(ListPage { objects, next })
}

/// Walks the folder in key order (a folder `d` sorts as `d/`), collecting
/// keys under `prefix` after `start_after`, up to one page.
fn list_page_with(
    root: &Path,
    prefix: &str,
    start_after: Option<&str>,
    reader: Reader,
    detail: Detail,
) -> Result<ListPage, ReadFailure> {
    // The deepest folder fully named by the prefix.
    let (dir_key, _) = prefix
        .rsplit_once('/')
        .map_or(("", prefix), |(d, rest)| (d, rest));
    let dir_key_slash = if dir_key.is_empty() {
        String::new()
    } else {
        format!("{dir_key}/")
    };
    let mut out = Vec::new();
    let mut more = false;
    let mut walk = Walk {
        root,
        prefix,
        start_after,
        out: &mut out,
        more: &mut more,
        reader,
        detail,
    };
    walk.dir(&dir_key_slash)?;
    let next = if more {
        out.last().map(|m| m.key.clone())
    } else {
        None
    };
    Ok(ListPage { objects: out, next })
}

struct Walk<'a> {
    root: &'a Path,
    prefix: &'a str,
    start_after: Option<&'a str>,
    out: &'a mut Vec<ObjectMeta>,
    more: &'a mut bool,
    reader: Reader,
    detail: Detail,
}

impl Walk<'_> {
    /// Visits the folder whose keys start with `dir_key` ("" or ending in '/').
    /// Returns false once the page is full.
    fn dir(&mut self, dir_key: &str) -> Result<bool, ReadFailure> {
        let path = self.root.join(dir_key);
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if is_missing(&e) => return Ok(true),
            Err(e) => return Err(io_unavailable(dir_key, "list", &e).into()),
        };
        let mut children: Vec<(String, bool)> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io_unavailable(dir_key, "list", &e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if dir_key.is_empty() && (name == LOCKS_DIR || name == TEMP_DIR || name == JOURNAL_DIR)
            {
                continue;
            }
            let is_dir = entry
                .file_type()
                .map_err(|e| io_unavailable(dir_key, "list", &e))?
                .is_dir();
            let sort_key = if is_dir {
                format!("{dir_key}{name}/")
            } else {
                format!("{dir_key}{name}")
            };
            children.push((sort_key, is_dir));
            // A long listing goes to a blocking thread before this one
            // spent anything on it.
            if self.reader == Reader::Inline && children.len() > INLINE_LIST_OBJECTS_MAX {
                return Err(ReadFailure::WouldBlock);
            }
        }
        children.sort();
        for (key, is_dir) in children {
            // Subtrees and files that cannot match the prefix.
            if !(key.starts_with(self.prefix) || (is_dir && self.prefix.starts_with(&key))) {
                continue;
            }
            if let Some(after) = self.start_after {
                // Everything under `key` sorts before `after` unless `after` is inside it.
                if key.as_str() <= after && !(is_dir && after.starts_with(&key)) {
                    continue;
                }
            }
            if is_dir {
                if !self.dir(&key)? {
                    return Ok(false);
                }
                continue;
            }
            if self.reader == Reader::Inline && self.out.len() == INLINE_LIST_OBJECTS_MAX {
                return Err(ReadFailure::WouldBlock);
            }
            let meta = match self.detail {
                Detail::Full => read_object(self.root, &key, self.reader)?.map(|o| o.meta),
                Detail::Size => match shape_of(&self.root.join(&key)) {
                    Ok(shape) if shape.dir => None,
                    Ok(shape) => Some(ObjectMeta {
                        key,
                        etag: Etag(String::new()),
                        last_modified: SystemTime::UNIX_EPOCH,
                        size: shape.len,
                    }),
                    Err(e) if is_missing(&e) => None,
                    Err(e) => return Err(io_unavailable(&key, "stat", &e).into()),
                },
            };
            let Some(meta) = meta else {
                continue;
            };
            if self.out.len() == LIST_PAGE_OBJECTS_MAX {
                *self.more = true;
                return Ok(false);
            }
            self.out.push(meta);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// A read slower than the limit is done again, and one that stays slow
    /// is an error naming the key, never possibly torn bytes; within the
    /// limit the object reads as written.
    #[test]
    fn reads_slower_than_the_limit_are_retried_then_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        fs::write(dir.path().join("k"), b"body").expect("written");
        match read_object_within(dir.path(), "k", Duration::ZERO, Reader::Blocking) {
            Err(ReadFailure::Failed(Error::Unavailable { key, reason })) => {
                assert_eq!(key, "k");
                assert!(reason.contains("took longer"), "{reason}");
            }
            other => panic!("a read over the limit gave {other:?}"),
        }
        let read = read_object_within(dir.path(), "k", READ_TIME_MAX, Reader::Blocking)
            .expect("readable")
            .expect("present");
        assert_eq!(read.bytes, Bytes::from_static(b"body"));
    }

    /// Drops `path`'s pages from the page cache (written back first).
    fn evict(path: &Path) {
        let file = File::open(path).expect("open");
        file.sync_all().expect("written back");
        // SAFETY: a plain advice call on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "fadvise");
    }

    /// An inline read answers only from memory: a cached object reads
    /// whole, and one that would wait for the device, is too large, or is
    /// one object too many for a listing is left to a blocking thread,
    /// which reads it whole.
    #[test]
    fn inline_reads_take_only_what_is_in_memory_and_leave_the_rest_to_a_blocking_read() {
        // Under the target folder: on the disk (a tmpfs keeps every page).
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp");
        fs::create_dir_all(&base).expect("the target folder");
        let dir = tempfile::tempdir_in(base).expect("a temporary folder");
        let body = vec![7u8; 10_000];
        fs::write(dir.path().join("cached"), &body).expect("written");
        let read = read_object(dir.path(), "cached", Reader::Inline)
            .expect("in memory")
            .expect("present");
        assert_eq!(read.bytes, body);
        assert_eq!(read.meta.etag, content_etag(&body));

        fs::write(dir.path().join("evicted"), &body).expect("written");
        evict(&dir.path().join("evicted"));
        assert!(matches!(
            read_object(dir.path(), "evicted", Reader::Inline),
            Err(ReadFailure::WouldBlock)
        ));
        let big = vec![1u8; usize::try_from(INLINE_READ_BYTES_MAX).expect("small") + 1];
        fs::write(dir.path().join("big"), &big).expect("written");
        assert!(matches!(
            read_object(dir.path(), "big", Reader::Inline),
            Err(ReadFailure::WouldBlock)
        ));
        for key in ["evicted", "big"] {
            let read = read_object(dir.path(), key, Reader::Blocking)
                .expect("readable")
                .expect("present");
            assert_eq!(
                read.meta.size,
                fs::metadata(dir.path().join(key)).expect("stat").len()
            );
        }
        assert!(matches!(
            read_object(dir.path(), "missing", Reader::Inline),
            Ok(None)
        ));

        fs::create_dir(dir.path().join("few")).expect("folder");
        fs::create_dir(dir.path().join("many")).expect("folder");
        for i in 0..INLINE_LIST_OBJECTS_MAX {
            fs::write(dir.path().join(format!("few/{i}")), b"x").expect("written");
        }
        for i in 0..=INLINE_LIST_OBJECTS_MAX {
            fs::write(dir.path().join(format!("many/{i}")), b"x").expect("written");
        }
        let few =
            list_page_with(dir.path(), "few/", None, Reader::Inline, Detail::Full).expect("inline");
        assert_eq!(few.objects.len(), INLINE_LIST_OBJECTS_MAX);
        assert!(matches!(
            list_page_with(dir.path(), "many/", None, Reader::Inline, Detail::Full),
            Err(ReadFailure::WouldBlock)
        ));
        let many = list_page_with(dir.path(), "many/", None, Reader::Blocking, Detail::Full)
            .expect("listed");
        assert_eq!(many.objects.len(), INLINE_LIST_OBJECTS_MAX + 1);
    }
}

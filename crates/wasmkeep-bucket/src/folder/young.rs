//! Young objects (ADR 0034): written by a process alone on its folder, they
//! live in its journal until a checkpoint puts them in place as files.
//!
//! The index maps each young key to its journal entry (read back with
//! `pread`), etag, size and time. Only the committer adds entries; the
//! committer (a later write or delete of the key) and the checkpoint
//! ([`Young::place_through`]) remove them. Both hold the index's write lock
//! while they change the key's file, so a checkpoint never puts an old body
//! over a newer write or brings a deleted object back.
//!
//! A reader looks at the index before the disk. The one read that could see
//! a file half written is a disk read of a key that became young and was put
//! in place meanwhile (a read racing that key's write): every placement
//! moves [`Young::placing`] twice (odd while a file is being written), and a
//! disk read that saw it move is done again, after a few tries with the read
//! lock held (which keeps placements out).
//!
//! It never decides whether an object stays young (the committer does) nor
//! when it goes in place (the checkpoints do).

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::RwLock;

use super::journal::{Adopted, EntryAt, JournalReader};
use crate::{Etag, Object, ObjectMeta};

/// Disk reads tried without the read lock before one is done with it.
const OPTIMISTIC_READS_MAX: usize = 3;

/// One young object.
#[derive(Debug, Clone)]
pub(crate) struct YoungObject {
    pub at: EntryAt,
    /// The generation of its batch: the checkpoint that moves past it places
    /// it.
    pub generation: u64,
    pub etag: Etag,
    pub size: u64,
    pub modified: SystemTime,
    /// A file of the key may be in place under it, older: a delete of the
    /// key removes that file too. `false` when the key had no file (nor a
    /// young object over one) when this object was written, so that
    /// deleting it asks the disk nothing.
    pub file_below: bool,
}

/// The young objects by key. The committer asks about one key several
/// times per write (is it young, is any folder of it a young object), so
/// keys are hashed for those; listings and the check for young objects
/// below a key walk the keys in order (ADR 0046).
#[derive(Debug, Default)]
pub(crate) struct Index {
    objects: HashMap<Arc<str>, YoungObject, crate::KeyHasher>,
    /// The same keys, in order.
    order: BTreeSet<Arc<str>>,
}

impl Index {
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&YoungObject> {
        self.objects.get(key)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.objects.contains_key(key)
    }

    /// Makes `object` the young object of `key`, replacing any.
    pub(crate) fn insert(&mut self, key: &str, object: YoungObject) {
        if let Some(slot) = self.objects.get_mut(key) {
            *slot = object;
            return;
        }
        let key: Arc<str> = Arc::from(key);
        self.order.insert(Arc::clone(&key));
        self.objects.insert(key, object);
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<YoungObject> {
        let object = self.objects.remove(key)?;
        self.order.remove(key);
        Some(object)
    }

    /// The objects in key order, from `from` on.
    pub(crate) fn range_from<'a>(
        &'a self,
        from: Bound<&str>,
    ) -> impl Iterator<Item = (&'a str, &'a YoungObject)> + 'a {
        self.order
            .range::<str, _>((from, Bound::Unbounded))
            .map(|key| {
                let object = self
                    .objects
                    .get(&**key)
                    .expect("the order holds exactly the map's keys");
                (&**key, object)
            })
    }
}

/// The index of young objects, shared by the committer, the checkpoint and
/// readers.
pub(crate) struct Young {
    root: Arc<PathBuf>,
    reader: JournalReader,
    objects: RwLock<Index>,
    /// Moves to odd when a placement starts writing a file, back to even
    /// when it is done.
    placing: AtomicU64,
}

impl std::fmt::Debug for Young {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Young")
            .field("objects", &self.objects.read().len())
            .finish_non_exhaustive()
    }
}

impl Young {
    pub(crate) fn new(root: Arc<PathBuf>, reader: JournalReader) -> Self {
        Young {
            root,
            reader,
            objects: RwLock::new(Index::default()),
            placing: AtomicU64::new(0),
        }
    }

    /// Takes in young objects of a gone solo process, copied into this
    /// process's journal at open (ADR 0040). Whether a file of the key is
    /// below is not known: a delete looks.
    pub(crate) fn adopt(&self, adopted: Vec<Adopted>) {
        if adopted.is_empty() {
            return;
        }
        let modified = SystemTime::now();
        let mut objects = self.objects.write();
        for object in adopted {
            objects.insert(
                &object.key,
                YoungObject {
                    at: object.at,
                    generation: object.generation,
                    etag: object.etag,
                    size: object.size,
                    modified,
                    file_below: true,
                },
            );
        }
    }

    /// The index, for the committer (its write lock: applying a batch).
    pub(crate) fn objects(&self) -> &RwLock<Index> {
        &self.objects
    }

    /// The meta of a young key.
    pub(crate) fn meta(object: &YoungObject, key: &str) -> ObjectMeta {
        ObjectMeta {
            key: key.to_owned(),
            etag: object.etag.clone(),
            last_modified: object.modified,
            size: object.size,
        }
    }

    /// Reads `key`: its young body if the index has it, else `disk()`
    /// (consistent with placements, see the module docs).
    pub(crate) fn read<T>(
        &self,
        key: &str,
        young: impl Fn(Object) -> T,
        disk: impl Fn() -> T,
    ) -> io::Result<T> {
        for _ in 0..OPTIMISTIC_READS_MAX {
            let before = self.placing.load(Ordering::SeqCst);
            if before.is_multiple_of(2) {
                {
                    let objects = self.objects.read();
                    if let Some(object) = objects.get(key) {
                        return Ok(young(self.body(key, object)?));
                    }
                }
                let read = disk();
                if self.placing.load(Ordering::SeqCst) == before {
                    return Ok(read);
                }
            }
            std::thread::yield_now();
        }
        let objects = self.objects.read();
        if let Some(object) = objects.get(key) {
            return Ok(young(self.body(key, object)?));
        }
        Ok(disk())
    }

    /// Lists: `disk()` merged with the young objects its listing may hold
    /// (`young_in(index)` picks them), consistent with placements.
    pub(crate) fn list<T>(
        &self,
        young_in: impl Fn(&Index) -> Vec<ObjectMeta>,
        disk: impl Fn() -> T,
    ) -> (Vec<ObjectMeta>, T) {
        for _ in 0..OPTIMISTIC_READS_MAX {
            let before = self.placing.load(Ordering::SeqCst);
            if before.is_multiple_of(2) {
                let young = young_in(&self.objects.read());
                let read = disk();
                if self.placing.load(Ordering::SeqCst) == before {
                    return (young, read);
                }
            }
            std::thread::yield_now();
        }
        let objects = self.objects.read();
        (young_in(&objects), disk())
    }

    fn body(&self, key: &str, object: &YoungObject) -> io::Result<Object> {
        let bytes = self.reader.body(object.at)?;
        Ok(Object {
            bytes: Bytes::from(bytes),
            meta: Self::meta(object, key),
        })
    }

    /// Puts every young object of a generation up to `generation` in place as a
    /// file (not synced: the checkpoint's `syncfs` follows) and drops it from
    /// the index. Returns how many were placed.
    pub(crate) fn place_through(&self, generation: u64) -> io::Result<usize> {
        let due: Vec<(String, EntryAt)> = self
            .objects
            .read()
            .range_from(Bound::Unbounded)
            .filter(|(_, o)| o.generation <= generation)
            .map(|(k, o)| (k.to_owned(), o.at))
            .collect();
        let mut placed = 0;
        for (key, at) in due {
            let mut objects = self.objects.write();
            let object = match objects.get(&key) {
                Some(object) if object.at == at => object,
                // Written again or deleted since: not this placement's.
                _ => continue,
            };
            let body = self.reader.body(at)?;
            self.placing.fetch_add(1, Ordering::SeqCst);
            let written = write_in_place(&self.root, &key, &body, object.modified);
            if written.is_ok() {
                objects.remove(&key);
                placed += 1;
            }
            self.placing.fetch_add(1, Ordering::SeqCst);
            written.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("put the young object {key} in place: {e}"),
                )
            })?;
        }
        Ok(placed)
    }
}

/// Whether the index holds a key that is a folder of `key` (`a/b` for
/// `a/b/c`) or that `key` would be a folder of (`a/b/c` for `a/b`): the
/// folder bucket cannot hold both.
pub(crate) fn collides(index: &Index, key: &str) -> bool {
    let ancestor = key
        .match_indices('/')
        .any(|(at, _)| index.contains_key(&key[..at]));
    if ancestor {
        return true;
    }
    // The first key at or after `key/` is below `key` if any is.
    with_folder_form(key, |below| {
        index
            .order
            .range::<str, _>((Bound::Included(below), Bound::Unbounded))
            .next()
            .is_some_and(|k| k.starts_with(below))
    })
}

/// Runs `f` with `key/`, built on the stack for a key of ordinary length:
/// the committer asks [`collides`] for every young put, and a `format!`
/// there was ~2 % of its thread's time (ADR 0046).
fn with_folder_form<R>(key: &str, f: impl FnOnce(&str) -> R) -> R {
    let mut buf = [0u8; 256];
    match buf.get_mut(..=key.len()) {
        Some(form) => {
            let (slash, name) = form.split_last_mut().expect("holds at least the slash");
            name.copy_from_slice(key.as_bytes());
            *slash = b'/';
            f(std::str::from_utf8(form).expect("a str followed by an ASCII byte"))
        }
        None => f(&format!("{key}/")),
    }
}

/// The young objects a listing of `prefix` after `start_after` may show, in
/// key order, at most `most`.
pub(crate) fn listed(
    index: &Index,
    prefix: &str,
    start_after: Option<&str>,
    most: usize,
) -> Vec<ObjectMeta> {
    let from = match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    };
    index
        .range_from(from)
        .take_while(|(k, _)| k.starts_with(prefix))
        .take(most)
        .map(|(k, o)| Young::meta(o, k))
        .collect()
}

/// Writes `body` as the file of `key`: a new file when there is none, else
/// the old one overwritten (no rename: nobody else looks at the folder, and
/// this process's readers see the index until the file is whole).
fn write_in_place(root: &Path, key: &str, body: &[u8], modified: SystemTime) -> io::Result<()> {
    let target = root.join(key);
    let open = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&target)
    };
    let file = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            open()?
        }
        opened => opened?,
    };
    file.write_all_at(body, 0)?;
    file.set_len(body.len() as u64)?;
    // The time of the write, as a read of the young object reported it.
    file.set_modified(modified)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn object(n: u64) -> YoungObject {
        YoungObject {
            at: EntryAt { offset: n, len: 1 },
            generation: n,
            etag: Etag(format!("e{n}")),
            size: n,
            modified: SystemTime::UNIX_EPOCH,
            file_below: false,
        }
    }

    /// The index's map and its ordered keys stay one set through inserts,
    /// replacements and removes: everything it answers is what a plain
    /// ordered map holding the same objects answers.
    #[test]
    fn index_answers_as_an_ordered_map_does() {
        let mut index = Index::default();
        let mut model: BTreeMap<String, u64> = BTreeMap::new();
        let keys = [
            "a/b/log/3",
            "a/b/log/1",
            "a/c",
            "a/b/snap/2",
            "b",
            "a/b/log/2",
        ];
        for (n, key) in keys.iter().enumerate() {
            index.insert(key, object(n as u64));
            model.insert((*key).to_owned(), n as u64);
        }
        // A replacement keeps one key; removes of present and absent keys.
        index.insert("a/c", object(40));
        model.insert("a/c".to_owned(), 40);
        assert_eq!(index.remove("a/b/log/1").map(|o| o.generation), Some(1));
        model.remove("a/b/log/1");
        assert!(index.remove("a/b/log/1").is_none());
        assert!(index.remove("a/b").is_none());

        assert_eq!(index.len(), model.len());
        let listed: Vec<(String, u64)> = index
            .range_from(Bound::Unbounded)
            .map(|(k, o)| (k.to_owned(), o.generation))
            .collect();
        let expected: Vec<(String, u64)> = model.iter().map(|(k, n)| (k.clone(), *n)).collect();
        assert_eq!(listed, expected);
        let from: Vec<&str> = index
            .range_from(Bound::Excluded("a/b/log/3"))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(from, ["a/b/snap/2", "a/c", "b"]);
        for key in ["a/b/log/1", "a/b/log/2", "a/c", "a", "zz"] {
            assert_eq!(index.contains_key(key), model.contains_key(key), "{key}");
            assert_eq!(
                index.get(key).map(|o| o.generation),
                model.get(key).copied(),
                "{key}"
            );
        }
        // Folder collisions, both ways.
        assert!(collides(&index, "a/c/d"), "below a young object");
        assert!(collides(&index, "a/b/log"), "a folder of young objects");
        assert!(collides(&index, "a/b"), "a folder of young objects, higher");
        assert!(!collides(&index, "a/b/log/4"), "a sibling");
        assert!(!collides(&index, "a/cc"), "a longer name is no folder");
        // Names of 253-256 bytes straddle the stack form's 255 (then the
        // key is formatted), some of them ending in a two-byte character.
        for len in [253_usize, 254, 255, 256, 300] {
            let pad = if len % 2 == 1 { "x" } else { "" };
            let folder = format!("l/{}{pad}", "é".repeat((len - 2) / 2));
            assert_eq!(folder.len(), len);
            let mut long = Index::default();
            long.insert(&format!("{folder}/log/1"), object(1));
            assert!(
                collides(&long, &folder),
                "{len}: a folder of a young object"
            );
            assert!(
                !collides(&long, &format!("{folder}x")),
                "{len}: a longer name is no folder"
            );
            let (last, _) = folder.char_indices().last().expect("not empty");
            assert!(
                !collides(&long, &folder[..last]),
                "{len}: a shorter name is no folder"
            );
        }
        assert_eq!(
            listed_keys(&index, "a/b/", None),
            ["a/b/log/2", "a/b/log/3", "a/b/snap/2"]
        );
        assert_eq!(
            listed_keys(&index, "a/b/", Some("a/b/log/2")),
            ["a/b/log/3", "a/b/snap/2"]
        );
    }

    fn listed_keys(index: &Index, prefix: &str, after: Option<&str>) -> Vec<String> {
        listed(index, prefix, after, 10)
            .into_iter()
            .map(|meta| meta.key)
            .collect()
    }
}

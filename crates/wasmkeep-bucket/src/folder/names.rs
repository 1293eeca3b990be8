//! The names that may be in the bucket's folders, as the folder committer
//! knows them while its process is alone on the folder (ADR 0036).
//!
//! A put-if-absent asks the file system whether its key exists (`statx`),
//! and so does a delete of a key that is no young object. Most such keys
//! are new: the next log record of an actor, a snapshot. On ext4 the
//! answer is a negative lookup in the folder's entries, and a negative
//! dentry made for it: a fifth of the committer's time in S3.
//!
//! Alone on the folder, nothing but this process adds entries to it
//! (another process knocks first, and the committer stops using this
//! before that process writes). So the committer lists a folder once, the
//! first time a key in it is asked about, and from then on notes every
//! name that may appear there, before it can appear:
//!
//! - a young object's name (and each folder on its path) when the object
//!   enters the index: the checkpoint that puts it in place as a file
//!   (on another thread) only places objects of the index;
//! - a renamed file's name before the rename (its folders are made then).
//!
//! The set may hold more than the folder does (a write that failed after
//! its name was noted), never less. A name not in a listed folder's set is
//! absent, and its `statx` is skipped; a name in it is looked at as before.
//! A name leaves the set when a delete removed both its file and its young
//! object.
//!
//! It only lists folders and remembers names; it never reads or writes an
//! object.

use std::collections::{HashMap, HashSet};
use std::io;
use std::ops::Bound;
use std::path::Path;

use super::sys::names_in;
use super::young::Young;

/// Folders with more entries than this are not listed (their keys are
/// looked at one by one, as without this).
const FOLDER_NAMES_MAX: usize = 4096;
/// Names kept in all folders at most; past it everything is forgotten and
/// folders are listed again as keys in them are asked about.
const NAMES_MAX: usize = 1 << 18;

/// See the module docs. `None` for a folder that is not listed (too large,
/// or not readable as a folder).
#[derive(Debug, Default)]
pub(crate) struct Names {
    folders: HashMap<String, Option<Set>, crate::KeyHasher>,
    /// Names in all sets.
    count: usize,
}

type Set = HashSet<String, crate::KeyHasher>;

/// The folder part and the last name of `key` (`""` for the bucket's root).
fn split(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(at) => (&key[..at], &key[at + 1..]),
        None => ("", key),
    }
}

impl Names {
    /// Whether `key` is known to be absent (no file, no folder, no young
    /// object): its folder is listed and holds no such name. Lists the
    /// folder the first time.
    pub(crate) fn known_absent(&mut self, root: &Path, young: &Young, key: &str) -> bool {
        let (folder, name) = split(key);
        if !self.folders.contains_key(folder) {
            let listed = list(root, young, folder);
            if let Some(names) = &listed {
                self.count += names.len();
            }
            if self.count > NAMES_MAX {
                self.forget();
                return false;
            }
            self.folders.insert(folder.to_owned(), listed);
        }
        matches!(self.folders.get(folder), Some(Some(names)) if !names.contains(name))
    }

    /// Notes that `key`, and each folder on its path, may exist from now on.
    pub(crate) fn note_present(&mut self, key: &str) {
        if self.folders.is_empty() {
            return;
        }
        let ends = key.match_indices('/').map(|(at, _)| at).chain([key.len()]);
        let mut start = 0;
        for end in ends {
            let folder = if start == 0 { "" } else { &key[..start - 1] };
            if let Some(Some(names)) = self.folders.get_mut(folder)
                && names.insert(key[start..end].to_owned())
            {
                self.count += 1;
            }
            start = end + 1;
        }
    }

    /// Notes that `key` is gone: neither its file nor its young object is
    /// there any more.
    pub(crate) fn note_gone(&mut self, key: &str) {
        let (folder, name) = split(key);
        if let Some(Some(names)) = self.folders.get_mut(folder)
            && names.remove(name)
        {
            self.count -= 1;
        }
    }

    /// Forgets everything (the process is no longer alone on the folder).
    pub(crate) fn forget(&mut self) {
        if !self.folders.is_empty() {
            *self = Names::default();
        }
    }
}

/// The names `folder` holds: its young objects' (the first name below the
/// folder) and its entries on the disk, listed in that order under the
/// index's read lock, so that no placement moves an object from the one to
/// the other unseen. `None` when the folder is too large or cannot be read
/// as one (then nothing is known of it).
fn list(root: &Path, young: &Young, folder: &str) -> Option<Set> {
    let objects = young.objects().read();
    let mut names = Set::default();
    let below = if folder.is_empty() {
        String::new()
    } else {
        format!("{folder}/")
    };
    for (key, _) in objects.range_from(Bound::Included(below.as_str())) {
        let Some(rest) = key.strip_prefix(below.as_str()) else {
            break;
        };
        if names.len() >= FOLDER_NAMES_MAX {
            return None;
        }
        names.insert(rest.split('/').next().unwrap_or(rest).to_owned());
    }
    match names_in(&root.join(folder)) {
        Ok(entries) => names.extend(entries),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => return None,
    }
    drop(objects);
    (names.len() <= FOLDER_NAMES_MAX).then_some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_the_folder_and_the_last_name() {
        assert_eq!(split("a/b/c"), ("a/b", "c"));
        assert_eq!(split("c"), ("", "c"));
    }
}

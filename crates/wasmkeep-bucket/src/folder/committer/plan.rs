//! What each write of a batch turns into (a [`Plan`]): its condition
//! checked against the object as it stands (this batch's earlier writes
//! included: the young index, the names known alone on the folder, or one
//! `statx`), and whether its body goes to the journal, stays young, or is
//! written to a temporary file now.
//!
//! At most it writes temporary files, invisible until renamed; it never
//! renames, removes or journals anything (`batch` does, with the plans).

use std::collections::HashMap;
use std::path::PathBuf;

use super::state::{Committer, WriteOp, WriteRequest};
use crate::folder::journal::{JOURNAL_BATCH_BYTES_MAX, JOURNAL_BODY_MAX, entry_bytes};
use crate::folder::layout::{content_etag, io_unavailable, is_missing, prefix_collision};
use crate::folder::reads::{Reader, read_object};
use crate::folder::sys::shape_of;
use crate::folder::young::{self, YoungObject};
use crate::{Error, Etag, ObjectMeta, Result};

/// The state of the keys a batch wrote so far (etag and size; `None`:
/// deleted), which its later requests see.
pub(super) type Overlay = HashMap<String, Option<(Etag, u64)>, crate::KeyHasher>;

/// What one request of a batch turned into.
pub(super) enum Plan {
    Answered(Result<Option<ObjectMeta>>),
    /// `journaled`: the body goes into the journal (the file is not synced).
    /// `replaces`: the size of the object it replaces, if one exists.
    Write {
        temp: PathBuf,
        meta: ObjectMeta,
        journaled: bool,
        replaces: Option<u64>,
    },
    /// A journaled write whose file is made while the journal flushes.
    Pending {
        etag: Etag,
        replaces: Option<u64>,
    },
    /// A journaled write that stays young (solo mode, ADR 0034): no file
    /// until a checkpoint.
    Young {
        etag: Etag,
        size: u64,
        /// An older file of the key may be in place (see
        /// [`YoungObject::file_below`]).
        file_below: bool,
        /// `file_below` is the young object's that this one replaces: if a
        /// checkpoint puts that one in place before this one is indexed,
        /// a file is there after all.
        over_young: bool,
    },
    /// `existed`: the size of the object removed, if one exists.
    Remove {
        existed: Option<u64>,
        durable: bool,
    },
}

/// What [`Committer::exists`] found of a key.
struct Existing {
    /// The object's size, if there is one.
    len: Option<u64>,
    /// A file of the key may be in place (under a young object too).
    file: bool,
    /// The object is young.
    young: bool,
}

impl Committer {
    /// The key's etag and size now (this batch's earlier writes included);
    /// `None` when it is absent. Reads and hashes the object: only
    /// conditions on an etag need this.
    fn current(&self, overlay: &Overlay, key: &str) -> Result<Option<(Etag, u64)>> {
        if let Some(state) = overlay.get(key) {
            return Ok(state.clone());
        }
        if let Some(state) = self.young(key, |o| (o.etag.clone(), o.size)) {
            return Ok(Some(state));
        }
        if shape_of(&self.root.join(key)).is_ok_and(|shape| shape.dir) {
            return Err(prefix_collision(key));
        }
        Ok(read_object(&self.root, key, Reader::Blocking)
            .map_err(|f| f.into_error(key))?
            .map(|o| (o.meta.etag, o.meta.size)))
    }

    /// Whether the key exists now (this batch's earlier writes included),
    /// for the writes whose condition is only existence: from the young
    /// index, the names known alone on the folder (ADR 0036), or one `stat`.
    fn exists(&mut self, overlay: &Overlay, key: &str, put: bool, solo: bool) -> Result<Existing> {
        if let Some(state) = overlay.get(key) {
            // Written earlier in this batch: whether over a file is not kept.
            return Ok(Existing {
                len: state.as_ref().map(|(_, len)| *len),
                file: true,
                young: false,
            });
        }
        if let Some((size, file_below)) = self.young(key, |o| (o.size, o.file_below)) {
            return Ok(Existing {
                len: Some(size),
                file: file_below,
                young: true,
            });
        }
        let absent = Existing {
            len: None,
            file: false,
            young: false,
        };
        if solo
            && let Some(state) = &self.solo
            && self.names.known_absent(&self.root, &state.young, key)
        {
            return Ok(absent);
        }
        match shape_of(&self.root.join(key)) {
            Ok(shape) if shape.dir => Err(prefix_collision(key)),
            Ok(shape) => Ok(Existing {
                len: Some(shape.len),
                file: true,
                young: false,
            }),
            // A folder of the key is an object: the key cannot be written.
            Err(e) if put && e.raw_os_error() == Some(libc::ENOTDIR) => Err(prefix_collision(key)),
            Err(e) if is_missing(&e) => Ok(absent),
            Err(e) => Err(io_unavailable(key, "stat", &e)),
        }
    }

    /// `what` of the young object of `key`, if it is one.
    fn young<T>(&self, key: &str, what: impl FnOnce(&YoungObject) -> T) -> Option<T> {
        let solo = self.solo.as_ref()?;
        solo.young.objects().read().get(key).map(what)
    }

    /// Whether a put of `key` would make it a folder of a young object or
    /// an object in a young object's folder (this batch's young puts
    /// included, `young`): the folder could not hold both in place.
    fn collides_with_young(&self, overlay: &Overlay, key: &str, young: bool) -> bool {
        if let Some(solo) = &self.solo
            && young::collides(&solo.young.objects().read(), key)
        {
            return true;
        }
        if !young {
            // Renames find this batch's collisions on the disk.
            return false;
        }
        let ancestor = key
            .match_indices('/')
            .any(|(at, _)| matches!(overlay.get(&key[..at]), Some(Some(_))));
        ancestor
            || overlay.iter().any(|(k, state)| {
                state.is_some()
                    && k.len() > key.len()
                    && k.starts_with(key)
                    && k.as_bytes()[key.len()] == b'/'
            })
    }

    pub(super) fn plan(
        &mut self,
        overlay: &mut Overlay,
        request: &WriteRequest,
        journaled: bool,
        solo: bool,
    ) -> Result<Plan> {
        let key = request.key.as_str();
        let put = matches!(
            request.op,
            WriteOp::Put(_) | WriteOp::PutIfAbsent(_) | WriteOp::PutIfMatch(_, _)
        );
        let young = journaled && solo;
        if put && self.collides_with_young(overlay, key, young) {
            return Err(prefix_collision(key));
        }
        // Whether a file of the key may be in place, and whether that came
        // from a young object (see `Plan::Young`).
        let (mut file_below, mut over_young) = (true, false);
        let current = match &request.op {
            WriteOp::PutIfMatch(_, _) | WriteOp::DeleteIfMatch(_) => self.current(overlay, key)?,
            // Existence is all these ask (one stat, where reading and hashing
            // the object cost a fifth of the committer's time): an empty etag
            // stands for "present", and these arms never compare it.
            WriteOp::Put(_)
            | WriteOp::PutIfAbsent(_)
            | WriteOp::Delete
            | WriteOp::DeleteNotDurable => {
                let existing = self.exists(overlay, key, put, solo)?;
                (file_below, over_young) = (existing.file, existing.young);
                existing.len.map(|len| (Etag(String::new()), len))
            }
        };
        let existing_len = current.as_ref().map(|(_, len)| *len);
        let current = current.map(|(etag, _)| etag);
        let conflict = || {
            Err(Error::Conflict {
                key: key.to_owned(),
            })
        };
        let not_found = || {
            Err(Error::NotFound {
                key: key.to_owned(),
            })
        };
        let bytes = match (&request.op, &current) {
            (WriteOp::Put(b), _) | (WriteOp::PutIfAbsent(b), None) => b,
            (WriteOp::PutIfAbsent(_), Some(_)) => return conflict(),
            (WriteOp::PutIfMatch(_, _) | WriteOp::DeleteIfMatch(_), None) => return not_found(),
            (WriteOp::PutIfMatch(b, want), Some(have)) => {
                if want != have {
                    return conflict();
                }
                b
            }
            (WriteOp::DeleteIfMatch(want), Some(have)) if want != have => return conflict(),
            (WriteOp::Delete | WriteOp::DeleteIfMatch(_) | WriteOp::DeleteNotDurable, _) => {
                overlay.insert(key.to_owned(), None);
                return Ok(Plan::Remove {
                    existed: existing_len,
                    durable: !matches!(request.op, WriteOp::DeleteNotDurable),
                });
            }
        };
        let etag = content_etag(bytes);
        overlay.insert(key.to_owned(), Some((etag.clone(), bytes.len() as u64)));
        if young {
            return Ok(Plan::Young {
                etag,
                size: bytes.len() as u64,
                file_below,
                over_young,
            });
        }
        if journaled {
            return Ok(Plan::Pending {
                etag,
                replaces: existing_len,
            });
        }
        let (temp, meta) = self.write_temp(key, bytes, etag)?;
        Ok(Plan::Write {
            temp,
            meta,
            journaled,
            replaces: existing_len,
        })
    }

    /// Writes the files of the batch's journaled writes (their entries are
    /// in the journal). A failure here answers "outcome unknown": the entry
    /// may be durable, and a replay after a reboot would apply it.
    pub(super) fn make_pending_files(&mut self, plans: &mut [Plan], batch: &[WriteRequest]) {
        for (plan, request) in plans.iter_mut().zip(batch) {
            let Plan::Pending { etag, replaces } = plan else {
                continue;
            };
            let replaces = *replaces;
            let bytes = match &request.op {
                WriteOp::Put(b) | WriteOp::PutIfAbsent(b) | WriteOp::PutIfMatch(b, _) => b,
                WriteOp::Delete | WriteOp::DeleteNotDurable | WriteOp::DeleteIfMatch(_) => {
                    unreachable!("only writes with a body are pending")
                }
            };
            let etag = std::mem::replace(etag, Etag(String::new()));
            *plan = match self.write_temp(&request.key, bytes, etag) {
                Ok((temp, meta)) => Plan::Write {
                    temp,
                    meta,
                    journaled: true,
                    replaces,
                },
                Err(e) => Plan::Answered(Err(Error::OutcomeUnknown {
                    key: request.key.clone(),
                    reason: format!("journaled, but its file was not written: {e}"),
                })),
            };
        }
    }
}

/// The journal bytes each request of a batch may use (0: not journaled; its
/// file is synced in place instead). Bodies over [`JOURNAL_BODY_MAX`] and
/// everything past [`JOURNAL_BATCH_BYTES_MAX`] in a batch are not journaled;
/// deletes need a small entry, markers are counted for the rest.
pub(super) fn journal_budget(batch: &[WriteRequest]) -> Vec<usize> {
    let mut used = 0usize;
    batch
        .iter()
        .map(|request| {
            let body = match &request.op {
                WriteOp::Put(b) | WriteOp::PutIfAbsent(b) | WriteOp::PutIfMatch(b, _) => {
                    Some(b.len())
                }
                // A non-durable delete is journaled alone on the folder.
                WriteOp::Delete | WriteOp::DeleteIfMatch(_) | WriteOp::DeleteNotDurable => Some(0),
            };
            let marker = entry_bytes(&request.key, 0);
            let bytes = match body {
                Some(len) if len <= JOURNAL_BODY_MAX => entry_bytes(&request.key, len),
                _ => 0,
            };
            if bytes > 0 && used + bytes <= JOURNAL_BATCH_BYTES_MAX {
                used += bytes;
                bytes
            } else {
                // Room for a marker.
                used += marker;
                0
            }
        })
        .collect()
}

//! One batch from its locks to its answers ([`Committer::commit`]): its
//! stripes locked and its place in the journal taken, then, step by step,
//! its plans made, what the journal does not hold synced, the rest
//! journaled, everything put in place in request order, the renames synced,
//! and the writes synced in place marked in the journal.
//!
//! It keeps nothing between batches and never waits for a write to arrive
//! (the thread's loop does).

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLockWriteGuard;

use super::plan::{Overlay, Plan, journal_budget};
use super::state::{Committer, JournalPosition, WriteOp, WriteRequest};
use crate::folder::journal::{Entry, EntryAt, EntryKind, Journal};
use crate::folder::layout::{io_unavailable, is_missing, rename_error};
use crate::folder::locks::{flock, stripe_of};
use crate::folder::young::{Index, YoungObject};
use crate::{Error, ObjectMeta, Result};

impl Committer {
    pub(crate) fn commit(&mut self, batch: Vec<WriteRequest>) {
        self.take_adopted();
        // Held for the whole batch: leaving solo mode waits for it.
        let alone = self.solo.as_ref().map(|solo| Arc::clone(&solo.alone));
        let alone = alone.as_ref().map(|alone| alone.lock());
        let solo = alone.as_deref().copied().unwrap_or(false);
        if !solo {
            // Another process may write the folder from now on.
            self.names.forget();
        }
        let budget = journal_budget(&batch);
        if let Some(journal) = &mut self.journal
            && let Err(e) = journal.reserve(budget.iter().sum())
        {
            for request in batch {
                let _ = request.reply.send(Err(io_unavailable(
                    &request.key,
                    "make room in the journal",
                    &e,
                )));
            }
            return;
        }
        // Alone on the folder nobody else writes: no stripe is locked, and
        // the batch's order comes from a block reserved beforehand (ADR 0035).
        let stripes: BTreeSet<usize> = if solo {
            BTreeSet::new()
        } else {
            batch.iter().map(|r| stripe_of(&r.key)).collect()
        };
        let mut locked = Vec::with_capacity(stripes.len());
        for stripe in &stripes {
            let result = self
                .lock_file(*stripe)
                .and_then(|f| flock(f, libc::LOCK_EX));
            if let Err(e) = result {
                self.unlock(&locked);
                for request in batch {
                    let _ = request
                        .reply
                        .send(Err(io_unavailable(&request.key, "lock", &e)));
                }
                return;
            }
            locked.push(*stripe);
        }
        // Held for the batch when alone: see `Journal::begin_solo_batch`.
        let gate_lock = self.journal.as_ref().filter(|_| solo).map(Journal::gate);
        let gate = gate_lock.as_ref().map(|gate| gate.lock());
        let answers = if self.journal.is_some() {
            let begun = match &gate {
                Some(gate) => self.begin_solo_batch(gate),
                None => self.begin_journal_batch(&locked),
            };
            match begun {
                Ok(position) => {
                    let answers = self.commit_locked(&batch, &budget, Some(position), solo);
                    if let Some(journal) = &mut self.journal
                        && let Err(e) = journal.end_batch()
                    {
                        tracing::error!(error = %e, "folder bucket: releasing the generation lock failed");
                    }
                    answers
                }
                Err(e) => batch
                    .iter()
                    .map(|r| Err(io_unavailable(&r.key, "start a journal batch", &e)))
                    .collect(),
            }
        } else {
            self.commit_locked(&batch, &budget, None, false)
        };
        drop(gate);
        self.unlock(&locked);
        for (request, answer) in batch.into_iter().zip(answers) {
            // The caller may have gone away; the write stands anyway.
            let _ = request.reply.send(answer);
        }
    }

    /// A batch whose stripes are locked (or that is alone on the folder),
    /// step by step: one answer per request, in request order.
    fn commit_locked(
        &mut self,
        batch: &[WriteRequest],
        budget: &[usize],
        journal: Option<JournalPosition>,
        solo: bool,
    ) -> Vec<Result<Option<ObjectMeta>>> {
        let mut plans = self.plan_batch(batch, budget, journal, solo);

        // 1. Make the new files that the journal does not hold durable
        //    before any of them becomes visible.
        self.sync_new_files(&mut plans, batch);

        // 1b. Journal mode: the journaled writes and deletes, durable in the
        //     journal before any of them becomes visible (`young_at`: where
        //     each young write's entry sits in it).
        let young_at = match journal {
            Some(position) => self.append_to_journal(&mut plans, batch, position, solo),
            None => Vec::new(),
        };

        // 2. Rename into place / remove, in request order. The young index
        //    changes with the files (see `young.rs`); its lock is needed
        //    only while it may hold something.
        let solo_state = self.solo.as_ref().map(|s| Arc::clone(&s.young));
        let mut index_guard = solo_state.as_ref().and_then(|young| {
            let objects = young.objects().write();
            (solo || !objects.is_empty()).then_some(objects)
        });
        let mut done = self.apply(plans, batch, &young_at, journal, &mut index_guard);

        // 3. Make the renames durable (those the journal does not hold).
        self.sync_renames(batch, &mut done);

        drop(index_guard);

        // 4. Journal mode: mark the writes synced in place, so an older
        //    journaled entry for their key is never replayed over them.
        if let Some(position) = journal
            && !done.markers.is_empty()
        {
            self.mark_synced_in_place(batch, &mut done, position, solo);
        }
        done.answers
    }

    /// Each request's plan, in request order (see [`Committer::plan`]); a
    /// request refused is answered in its plan.
    fn plan_batch(
        &mut self,
        batch: &[WriteRequest],
        budget: &[usize],
        journal: Option<JournalPosition>,
        solo: bool,
    ) -> Vec<Plan> {
        let mut overlay = Overlay::default();
        batch
            .iter()
            .zip(budget)
            .map(|(r, bytes)| {
                let journaled = journal.is_some() && *bytes > 0;
                self.plan(&mut overlay, r, journaled, solo)
                    .unwrap_or_else(|e| Plan::Answered(Err(e)))
            })
            .collect()
    }

    /// Step 1: syncs the new files that the journal does not hold; if that
    /// fails, nothing of the batch is applied.
    fn sync_new_files(&self, plans: &mut [Plan], batch: &[WriteRequest]) {
        let temps: Vec<&Path> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Write {
                    temp,
                    journaled: false,
                    ..
                } => Some(temp.as_path()),
                _ => None,
            })
            .collect();
        if !temps.is_empty()
            && let Err(e) = self.sync_files(&temps)
        {
            fail_unapplied(plans, batch, "sync new files", &e);
        }
    }

    /// Step 1b: appends the batch's journaled writes and deletes (flushed
    /// unless none must be durable), making the pending files meanwhile; if
    /// that fails, nothing of the batch is applied. Returns where each young
    /// write's entry sits in the journal (empty unless alone on the folder).
    fn append_to_journal(
        &mut self,
        plans: &mut [Plan],
        batch: &[WriteRequest],
        position: JournalPosition,
        solo: bool,
    ) -> Vec<Option<EntryAt>> {
        let mut young_at: Vec<Option<EntryAt>> = Vec::new();
        // Which plan each entry is of, and whether any must be durable.
        let mut entry_plans = Vec::new();
        let mut durable_entries = false;
        let entries: Vec<Entry<'_>> = plans
            .iter()
            .zip(batch)
            .enumerate()
            .filter_map(|(at, (plan, request))| {
                let index = u32::try_from(at).expect("batches are small");
                let entry = match (plan, &request.op) {
                    (
                        Plan::Pending { .. } | Plan::Young { .. },
                        WriteOp::Put(body)
                        | WriteOp::PutIfAbsent(body)
                        | WriteOp::PutIfMatch(body, _),
                    ) => Entry {
                        index,
                        kind: EntryKind::Put,
                        key: &request.key,
                        body,
                        young: solo,
                    },
                    // Alone, a delete that need not be durable is
                    // journaled too (not flushed for its own sake):
                    // else a crash would bring back every young object
                    // deleted since the last checkpoint, and the next
                    // open would write each of them as a file.
                    (
                        Plan::Remove {
                            existed: Some(_),
                            durable,
                        },
                        _,
                    ) if *durable || solo => Entry {
                        index,
                        kind: EntryKind::Delete,
                        key: &request.key,
                        body: &[],
                        young: solo,
                    },
                    _ => return None,
                };
                durable_entries |= !matches!(plan, Plan::Remove { durable: false, .. });
                entry_plans.push(at);
                Some(entry)
            })
            .collect();
        // The new files are made before the journal's flush: invisible
        // until renamed, which waits for the flush.
        let mut journal = self.journal.take().expect("journal mode");
        let appended = journal.append_with(
            position.generation,
            position.order,
            &entries,
            durable_entries,
            || {
                self.make_pending_files(plans, batch);
            },
        );
        if appended.is_ok() && solo {
            young_at = vec![None; plans.len()];
            for (plan, at) in entry_plans.iter().zip(journal.appended()) {
                young_at[*plan] = Some(*at);
            }
        }
        self.journal = Some(journal);
        drop(entries);
        if let Err(e) = appended {
            fail_unapplied(plans, batch, "append to the journal", &e);
        }
        young_at
    }

    /// Step 2: renames into place and removes, in request order, and indexes
    /// the young writes (`index_guard`: the young index, write-locked while
    /// it may hold something). Folders to sync: those of writes and deletes
    /// the journal does not hold.
    fn apply(
        &mut self,
        plans: Vec<Plan>,
        batch: &[WriteRequest],
        young_at: &[Option<EntryAt>],
        journal: Option<JournalPosition>,
        index_guard: &mut Option<RwLockWriteGuard<'_, Index>>,
    ) -> Applied {
        let mut touched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
        let mut unsynced_dirs: BTreeSet<PathBuf> = BTreeSet::new();
        let mut answers = Vec::with_capacity(plans.len());
        let mut applied = Vec::with_capacity(plans.len());
        let mut markers = Vec::new();
        let now = SystemTime::now();
        for (index, (plan, request)) in plans.into_iter().zip(batch).enumerate() {
            let key = request.key.as_str();
            let target = self.root.join(key);
            // A write or delete of a young key replaces its young object
            // once (and only if) it applied: a failed one leaves it.
            let was_young = index_guard
                .as_ref()
                .is_some_and(|objects| objects.contains_key(key));
            let answer = match plan {
                Plan::Answered(answer) => {
                    applied.push(false);
                    answer
                }
                Plan::Pending { .. } => {
                    applied.push(false);
                    Err(Error::OutcomeUnknown {
                        key: key.to_owned(),
                        reason: "internal: a journaled write without its file".to_owned(),
                    })
                }
                Plan::Young {
                    etag,
                    size,
                    file_below,
                    over_young,
                } => {
                    applied.push(false);
                    match (
                        young_at.get(index).copied().flatten(),
                        index_guard.as_mut(),
                        journal,
                    ) {
                        (Some(at), Some(objects), Some(position)) => {
                            // Before a checkpoint can put it in place.
                            self.names.note_present(key);
                            objects.insert(
                                key,
                                YoungObject {
                                    at,
                                    generation: position.generation,
                                    etag: etag.clone(),
                                    size,
                                    modified: now,
                                    file_below: file_below || (over_young && !was_young),
                                },
                            );
                            Ok(Some(ObjectMeta {
                                key: key.to_owned(),
                                etag,
                                last_modified: now,
                                size,
                            }))
                        }
                        _ => Err(Error::OutcomeUnknown {
                            key: key.to_owned(),
                            reason: "internal: a young write without its journal entry".to_owned(),
                        }),
                    }
                }
                Plan::Write {
                    temp,
                    meta,
                    journaled,
                    replaces,
                } => {
                    let dirs = if journaled {
                        &mut unsynced_dirs
                    } else {
                        &mut touched_dirs
                    };
                    // Most keys' folders exist: their parents are made (and
                    // looked at) only when the rename finds none.
                    self.names.note_present(key);
                    let moved = match self.place(&temp, &target, replaces) {
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {
                            self.create_parents(&target, dirs).and_then(|()| {
                                self.place(&temp, &target, replaces)
                                    .map_err(|e| rename_error(key, &e))
                            })
                        }
                        placed => placed.map_err(|e| rename_error(key, &e)),
                    };
                    if moved.is_err() {
                        let _ = fs::remove_file(&temp);
                    }
                    applied.push(moved.is_ok() && !journaled);
                    if !journaled && let Some(parent) = target.parent() {
                        touched_dirs.insert(parent.to_path_buf());
                    }
                    if moved.is_ok() && !journaled && journal.is_some() {
                        markers.push(index);
                    }
                    if moved.is_ok()
                        && was_young
                        && let Some(objects) = index_guard.as_mut()
                    {
                        objects.remove(key);
                    }
                    moved.map(|()| Some(meta))
                }
                Plan::Remove { existed, durable } => {
                    let removed = if was_young {
                        // Its file, if any, is older than the young object.
                        let file_below = index_guard
                            .as_ref()
                            .and_then(|objects| objects.get(key))
                            .is_none_or(|object| object.file_below);
                        let unlinked = match file_below.then(|| fs::remove_file(&target)) {
                            Some(Err(e)) if !is_missing(&e) => {
                                Err(io_unavailable(key, "remove", &e))
                            }
                            _ => Ok(None),
                        };
                        if unlinked.is_ok()
                            && let Some(objects) = index_guard.as_mut()
                        {
                            objects.remove(key);
                        }
                        unlinked
                    } else if let Some(len) = existed {
                        match self.remove(&target, len) {
                            Ok(()) => Ok(None),
                            Err(e) if is_missing(&e) => Ok(None),
                            Err(e) => Err(io_unavailable(key, "remove", &e)),
                        }
                    } else {
                        Ok(None)
                    };
                    if removed.is_ok() {
                        self.names.note_gone(key);
                    }
                    let synced_here = existed.is_some() && durable && journal.is_none();
                    applied.push(synced_here && removed.is_ok());
                    if synced_here && let Some(parent) = target.parent() {
                        touched_dirs.insert(parent.to_path_buf());
                    }
                    removed
                }
            };
            answers.push(answer);
        }
        Applied {
            answers,
            applied,
            touched_dirs,
            markers,
        }
    }

    /// Step 3: syncs the folders of the renames the journal does not hold;
    /// if that fails, those writes' outcome is unknown and none is marked.
    fn sync_renames(&self, batch: &[WriteRequest], done: &mut Applied) {
        if !done.touched_dirs.is_empty()
            && let Err(e) = self.sync_dirs(&done.touched_dirs)
        {
            for ((answer, request), applied) in
                done.answers.iter_mut().zip(batch).zip(&done.applied)
            {
                if *applied {
                    *answer = Err(Error::OutcomeUnknown {
                        key: request.key.clone(),
                        reason: format!("sync after rename failed: {e}"),
                    });
                }
            }
            done.markers.clear();
        }
    }

    /// Step 4: marks the writes synced in place in the journal (see
    /// [`EntryKind::Durable`]).
    fn mark_synced_in_place(
        &mut self,
        batch: &[WriteRequest],
        done: &mut Applied,
        position: JournalPosition,
        solo: bool,
    ) {
        let entries: Vec<Entry<'_>> = done
            .markers
            .iter()
            .map(|index| Entry {
                index: u32::try_from(*index).expect("batches are small"),
                kind: EntryKind::Durable,
                key: &batch[*index].key,
                body: &[],
                young: solo,
            })
            .collect();
        let appended = self.journal.as_mut().expect("journal mode").append(
            position.generation,
            position.order,
            &entries,
            || {},
        );
        if let Err(e) = appended {
            for index in &done.markers {
                done.answers[*index] = Err(Error::OutcomeUnknown {
                    key: batch[*index].key.clone(),
                    reason: format!("journal marker failed: {e}"),
                });
            }
        }
    }
}

/// What step 2 of a batch leaves for steps 3 and 4.
struct Applied {
    /// One answer per request.
    answers: Vec<Result<Option<ObjectMeta>>>,
    /// Per request: applied, and durable only once `touched_dirs` are
    /// synced (a failed sync makes its outcome unknown).
    applied: Vec<bool>,
    /// The folders of the writes and deletes the journal does not hold.
    touched_dirs: BTreeSet<PathBuf>,
    /// The requests synced in place, whose keys get a marker in the journal.
    markers: Vec<usize>,
}

/// Answers every plan not yet answered with `what` failed, removing its
/// temporary file: nothing of it was applied.
fn fail_unapplied(plans: &mut [Plan], batch: &[WriteRequest], what: &str, e: &io::Error) {
    for (plan, request) in plans.iter_mut().zip(batch) {
        if let Plan::Write { temp, .. } = plan {
            let _ = fs::remove_file(&temp);
        }
        if !matches!(plan, Plan::Answered(_)) {
            *plan = Plan::Answered(Err(io_unavailable(&request.key, what, e)));
        }
    }
}

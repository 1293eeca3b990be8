//! One object in the bucket, written only on a condition: the node
//! heartbeat, an ownership record, a log record of the store.
//!
//! [`Fenced`] is a key on a [`Bucket`]. It reads the object with its etag
//! ([`Versioned`]) and writes it on a condition: created if absent, replaced
//! or deleted if its etag is still the one read. A conditional write ends in
//! one of four ways ([`Outcome`]): done, a lost race ([`Outcome::Conflict`]:
//! the object exists, or changed), gone ([`Outcome::Gone`]: it was deleted),
//! or unknown ([`Outcome::Unknown`]: the reply was lost and the write may
//! have applied). Any other answer (the bucket is unavailable, the key is
//! invalid, the request unsupported) is the bucket's error, returned as it
//! is by the single requests; an update returns the crate's [`Error`],
//! which also carries the errors of the caller's own functions.
//!
//! An unknown outcome is never a success nor a failure here: the caller
//! knows what its bytes look like and whether a re-read is worth a request
//! (the store compares a record's bytes, an acquire its record's nonce),
//! so it decides. Likewise nothing here retries on its own except
//! [`Fenced::update`] and [`Fenced::update_with`], which re-read and try
//! again after a lost race, a named number of times: every bucket request a
//! caller makes is one it asked for, in the order it asked, so a caller
//! moved onto this type makes the same requests as before (the simulation's
//! digests see each of them).
//!
//! Modelled on SlateDB's transactional object (`slatedb-txn-obj`): read,
//! decide, write on the version read, re-read after a lost race.

use std::future::Future;

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Etag, hinted};

#[cfg(doc)]
use crate::Error;
use crate::Result;

/// Attempts of [`Fenced::update`] while other writers keep changing the
/// object between its read and its write.
pub const UPDATE_ATTEMPTS_MAX: u32 = 4;

/// A value and the etag of the object it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub etag: Etag,
}

/// How a write ended, when the bucket answered it.
#[must_use = "a conflict or an unknown outcome must be acted on"]
#[derive(Debug)]
pub enum Outcome<T> {
    /// The write applied (for a put, the new etag).
    Done(T),
    /// The condition failed: the object exists (create) or its etag is no
    /// longer the one given (replace, delete).
    Conflict,
    /// The bucket found no object under the key: the object to replace or
    /// delete is gone. (A bucket that keeps its contract never answers a
    /// create or an overwrite so; the callers that always treated any
    /// write's `NotFound` alike still can.)
    Gone,
    /// The write may or may not have applied (its reply was lost): re-read
    /// before deciding anything. Holds the bucket's
    /// [`wasmkeep_bucket::Error::OutcomeUnknown`], so that a caller that
    /// passes it on keeps its text.
    Unknown(wasmkeep_bucket::Error),
}

impl<T> Outcome<T> {
    /// The same outcome with `f` applied to a done write's value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Done(value) => Outcome::Done(f(value)),
            Outcome::Conflict => Outcome::Conflict,
            Outcome::Gone => Outcome::Gone,
            Outcome::Unknown(error) => Outcome::Unknown(error),
        }
    }

    /// Sorts a bucket answer: the outcomes a conditional write may meet
    /// become variants, every other error stays an error.
    fn of(answer: wasmkeep_bucket::Result<T>) -> wasmkeep_bucket::Result<Self> {
        match answer {
            Ok(value) => Ok(Outcome::Done(value)),
            Err(wasmkeep_bucket::Error::Conflict { .. }) => Ok(Outcome::Conflict),
            Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(Outcome::Gone),
            Err(error @ wasmkeep_bucket::Error::OutcomeUnknown { .. }) => {
                Ok(Outcome::Unknown(error))
            }
            Err(error) => Err(error),
        }
    }
}

/// Which of the bucket's put-if-absent requests a create makes. All three
/// give the same guarantees once they return; they differ in what the
/// backend may do meanwhile (ADR 0041, ADR 0045).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Haste {
    /// [`Bucket::put_if_absent`].
    Hurried,
    /// [`hinted::put_if_absent_unhurried`]: no one waits for this write
    /// alone, so it may share the flush of the next one.
    Unhurried,
    /// [`hinted::put_if_absent_alone`]: its writer waits for this write
    /// alone, with nothing queued behind it.
    Alone,
}

/// What the function of an update decided for the object it was shown.
#[derive(Debug)]
pub enum Decision<T> {
    /// Write these bytes: created if the object was absent, else replaced
    /// on the etag read.
    Write(Bytes),
    /// Delete the object read, on its etag (nothing to do if it was absent).
    Delete,
    /// Leave the object as it is; the update ends with this value.
    Leave(T),
}

/// How an update ended.
#[must_use = "an update may end in an unknown outcome or give up"]
#[derive(Debug)]
pub enum Updated<T> {
    /// The decided bytes are stored under this etag.
    Written(Etag),
    /// The object is absent: deleted, or absent already when read.
    Deleted,
    /// The function left the object as it was.
    Left(T),
    /// The last write's reply was lost: it may have applied. Re-read
    /// before deciding anything.
    Unknown {
        /// Attempts made, the last one included.
        attempts: u32,
        /// The bytes that write put (`None`: it was a delete), to tell a
        /// re-read object of one's own from another writer's.
        bytes: Option<Bytes>,
        /// The bucket's [`wasmkeep_bucket::Error::OutcomeUnknown`].
        error: wasmkeep_bucket::Error,
    },
    /// Each of `attempts` attempts lost its race to another writer.
    Contended { attempts: u32 },
}

/// How the first attempt of an update starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Read the object, then decide.
    Read,
    /// Decide as if the object were absent, without reading it, and create
    /// it: for objects that are usually absent, where a read costs a round
    /// trip of its own. If it exists, the create is a lost race and the
    /// next attempt reads.
    Blind,
}

/// One object in the bucket, written only on a condition (see the module).
#[derive(Debug, Clone, Copy)]
pub struct Fenced<'a> {
    bucket: &'a dyn Bucket,
    key: &'a str,
}

impl<'a> Fenced<'a> {
    pub fn new(bucket: &'a dyn Bucket, key: &'a str) -> Self {
        Self { bucket, key }
    }

    pub fn key(self) -> &'a str {
        self.key
    }

    /// The object and its etag (one get), or `None` if it is absent.
    pub async fn read(self) -> wasmkeep_bucket::Result<Option<Versioned<Bytes>>> {
        match self.bucket.get(self.key).await {
            Ok(object) => Ok(Some(Versioned {
                value: object.bytes,
                etag: object.meta.etag,
            })),
            Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The object's etag without its body (one head), or `None` if it is
    /// absent.
    pub async fn etag(self) -> wasmkeep_bucket::Result<Option<Etag>> {
        match self.bucket.head(self.key).await {
            Ok(meta) => Ok(Some(meta.etag)),
            Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Creates the object if it is absent (put-if-absent): `Conflict` if it
    /// exists.
    pub async fn create(self, bytes: Bytes) -> wasmkeep_bucket::Result<Outcome<Etag>> {
        self.create_with(bytes, Haste::Hurried).await
    }

    /// [`Fenced::create`] with the bucket request `haste` names.
    pub async fn create_with(
        self,
        bytes: Bytes,
        haste: Haste,
    ) -> wasmkeep_bucket::Result<Outcome<Etag>> {
        let put = match haste {
            Haste::Hurried => self.bucket.put_if_absent(self.key, bytes).await,
            Haste::Unhurried => hinted::put_if_absent_unhurried(self.bucket, self.key, bytes).await,
            Haste::Alone => hinted::put_if_absent_alone(self.bucket, self.key, bytes).await,
        };
        Outcome::of(put.map(|meta| meta.etag))
    }

    /// Replaces the object if its etag is still `etag` (put-if-match):
    /// `Conflict` if it changed, `Gone` if it was deleted.
    pub async fn replace(
        self,
        etag: &Etag,
        bytes: Bytes,
    ) -> wasmkeep_bucket::Result<Outcome<Etag>> {
        let put = self.bucket.put_if_match(self.key, bytes, etag).await;
        Outcome::of(put.map(|meta| meta.etag))
    }

    /// Writes the object whatever is there (a plain put): for a writer that
    /// knows no etag to write on, such as a node's first heartbeat: `Done`
    /// or `Unknown` from a bucket that keeps its contract.
    pub async fn overwrite(self, bytes: Bytes) -> wasmkeep_bucket::Result<Outcome<Etag>> {
        let put = self.bucket.put(self.key, bytes).await;
        Outcome::of(put.map(|meta| meta.etag))
    }

    /// Deletes the object if its etag is still `etag`: `Conflict` if it
    /// changed, `Gone` if it is absent. A backend without conditional
    /// deletes answers [`wasmkeep_bucket::Error::Unsupported`].
    pub async fn delete_if_match(self, etag: &Etag) -> wasmkeep_bucket::Result<Outcome<()>> {
        Outcome::of(self.bucket.delete_if_match(self.key, etag).await)
    }

    /// Reads the object, asks `decide` what to do with it, and does that on
    /// the etag read; after a lost race (the object changed or went away
    /// meanwhile) reads again and asks again, up to
    /// [`UPDATE_ATTEMPTS_MAX`] attempts. An unknown outcome ends the update
    /// ([`Updated::Unknown`]): the caller decides whether to re-read.
    pub async fn update<T>(
        self,
        mut decide: impl FnMut(Option<&Versioned<Bytes>>) -> Decision<T>,
    ) -> Result<Updated<T>> {
        self.update_with(
            UPDATE_ATTEMPTS_MAX,
            Start::Read,
            || Ok(()),
            |(), current| std::future::ready(Ok(decide(current.as_ref()))),
        )
        .await
    }

    /// [`Fenced::update`] for callers with more to do per attempt: at most
    /// `attempts_max` attempts, the first one as `start` says; each attempt
    /// first calls `prepare` (before its read: e.g. to check a lease and
    /// draw a nonce, in the order the caller always did), then reads
    /// (unless the first attempt is blind), then awaits `decide` with what
    /// `prepare` gave and what was read, which may ask the bucket itself
    /// (e.g. for the heartbeat of the node an ownership record names).
    /// An error of either ends the update.
    pub async fn update_with<S, T, P, D, F>(
        self,
        attempts_max: u32,
        start: Start,
        mut prepare: P,
        mut decide: D,
    ) -> Result<Updated<T>>
    where
        P: FnMut() -> Result<S>,
        D: FnMut(S, Option<Versioned<Bytes>>) -> F,
        F: Future<Output = Result<Decision<T>>>,
    {
        for attempt in 1..=attempts_max {
            let prepared = prepare()?;
            let current = if attempt == 1 && start == Start::Blind {
                None
            } else {
                self.read().await?
            };
            let seen = current.as_ref().map(|c| c.etag.clone());
            let (written, bytes) = match decide(prepared, current).await? {
                Decision::Leave(value) => return Ok(Updated::Left(value)),
                Decision::Write(bytes) => {
                    let written = match &seen {
                        None => self.create(bytes.clone()).await?,
                        Some(etag) => self.replace(etag, bytes.clone()).await?,
                    };
                    (written.map(Some), Some(bytes))
                }
                Decision::Delete => match &seen {
                    None => return Ok(Updated::Deleted),
                    Some(etag) => (self.delete_if_match(etag).await?.map(|()| None), None),
                },
            };
            match written {
                Outcome::Done(Some(etag)) => return Ok(Updated::Written(etag)),
                Outcome::Done(None) => return Ok(Updated::Deleted),
                // Lost the race: the next attempt reads what won it.
                Outcome::Conflict | Outcome::Gone => {}
                Outcome::Unknown(error) => {
                    return Ok(Updated::Unknown {
                        attempts: attempt,
                        bytes,
                        error,
                    });
                }
            }
        }
        Ok(Updated::Contended {
            attempts: attempts_max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use crate::testing::{Meddling, Recorder};
    use wasmkeep_bucket::Fault;

    const KEY: &str = "apps/default/k";

    fn b(text: &'static str) -> Bytes {
        Bytes::from_static(text.as_bytes())
    }

    /// The object's bytes, as text, or `None`.
    async fn stored(bucket: &Recorder) -> Option<String> {
        let value = Fenced::new(&bucket.inner, KEY).read().await.unwrap()?.value;
        Some(String::from_utf8(value.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn create_writes_an_absent_object_and_conflicts_on_a_present_one() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        assert_eq!(object.read().await.unwrap(), None);
        let Outcome::Done(etag) = object.create(b("one")).await.unwrap() else {
            panic!("an absent object is created");
        };
        assert_eq!(
            object.read().await.unwrap(),
            Some(Versioned {
                value: b("one"),
                etag: etag.clone()
            })
        );
        assert_eq!(object.etag().await.unwrap(), Some(etag));
        assert!(matches!(
            object.create(b("two")).await.unwrap(),
            Outcome::Conflict
        ));
        assert_eq!(stored(&bucket).await.as_deref(), Some("one"));
        assert_eq!(
            bucket.take(),
            [
                "get k -> not found",
                "put_if_absent k #ba2719ef -> ok",
                "get k -> ok",
                "head k -> ok",
                "put_if_absent k #be248829 -> conflict",
            ]
        );
    }

    #[tokio::test]
    async fn create_with_makes_the_request_its_haste_names() {
        let bucket = Recorder::new();
        for (key, haste) in [
            ("h", Haste::Hurried),
            ("u", Haste::Unhurried),
            ("a", Haste::Alone),
        ] {
            let created = Fenced::new(&bucket, key).create_with(b("x"), haste);
            assert!(matches!(created.await.unwrap(), Outcome::Done(_)));
        }
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent h #fd0c5087 -> ok",
                "put_if_absent_unhurried u #fd0c5087 -> ok",
                "put_if_absent_alone a #fd0c5087 -> ok",
            ]
        );
    }

    #[tokio::test]
    async fn replace_writes_only_on_the_etag_read_and_finds_a_deleted_object_gone() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        let Outcome::Done(first) = object.create(b("one")).await.unwrap() else {
            panic!("created");
        };
        let Outcome::Done(second) = object.replace(&first, b("two")).await.unwrap() else {
            panic!("replaced on the etag read");
        };
        assert!(matches!(
            object.replace(&first, b("three")).await.unwrap(),
            Outcome::Conflict
        ));
        assert_eq!(stored(&bucket).await.as_deref(), Some("two"));
        bucket.inner.delete(KEY).await.unwrap();
        assert!(matches!(
            object.replace(&second, b("four")).await.unwrap(),
            Outcome::Gone
        ));
        assert_eq!(stored(&bucket).await, None);
    }

    #[tokio::test]
    async fn delete_if_match_deletes_only_the_version_read() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        let Outcome::Done(first) = object.create(b("one")).await.unwrap() else {
            panic!("created");
        };
        let Outcome::Done(second) = object.overwrite(b("two")).await.unwrap() else {
            panic!("overwritten");
        };
        assert!(matches!(
            object.delete_if_match(&first).await.unwrap(),
            Outcome::Conflict
        ));
        assert_eq!(stored(&bucket).await.as_deref(), Some("two"));
        assert!(matches!(
            object.delete_if_match(&second).await.unwrap(),
            Outcome::Done(())
        ));
        assert_eq!(stored(&bucket).await, None);
        assert!(matches!(
            object.delete_if_match(&second).await.unwrap(),
            Outcome::Gone
        ));
        // A backend without conditional deletes says so, as an error.
        let s3_like = Recorder::over(wasmkeep_bucket::MemoryBucket::new(), false);
        assert!(matches!(
            Fenced::new(&s3_like, KEY).delete_if_match(&second).await,
            Err(wasmkeep_bucket::Error::Unsupported(_))
        ));
    }

    #[tokio::test]
    async fn a_lost_reply_is_an_unknown_outcome_and_the_write_may_have_applied() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        let lost = || bucket.inner.faults().push(Fault::ReplyLost);
        lost();
        let created = object.create(b("one")).await.unwrap();
        assert!(
            matches!(&created, Outcome::Unknown(wasmkeep_bucket::Error::OutcomeUnknown { key, .. }) if key == KEY),
            "{created:?}"
        );
        assert_eq!(stored(&bucket).await.as_deref(), Some("one"));
        let etag = object.etag().await.unwrap().expect("created");
        lost();
        assert!(matches!(
            object.replace(&etag, b("two")).await.unwrap(),
            Outcome::Unknown(_)
        ));
        lost();
        assert!(matches!(
            object.overwrite(b("three")).await.unwrap(),
            Outcome::Unknown(_)
        ));
        let etag = object.etag().await.unwrap().expect("overwritten");
        lost();
        assert!(matches!(
            object.delete_if_match(&etag).await.unwrap(),
            Outcome::Unknown(_)
        ));
        assert_eq!(stored(&bucket).await, None);
    }

    #[tokio::test]
    async fn an_unavailable_bucket_is_an_error_not_an_outcome() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        bucket.inner.faults().push(Fault::Unavailable);
        assert!(matches!(
            object.read().await,
            Err(wasmkeep_bucket::Error::Unavailable { .. })
        ));
        bucket.inner.faults().push(Fault::Unavailable);
        assert!(matches!(
            object.create(b("one")).await,
            Err(wasmkeep_bucket::Error::Unavailable { .. })
        ));
        bucket.inner.faults().push(Fault::Unavailable);
        let updated = object.update(|_| Decision::<()>::Write(b("one"))).await;
        assert!(
            matches!(
                updated,
                Err(Error::Bucket(wasmkeep_bucket::Error::Unavailable { .. }))
            ),
            "{updated:?}"
        );
        assert_eq!(stored(&bucket).await, None);
    }

    /// Appends `suffix` to the object's text, or writes it alone.
    fn append(current: Option<&Versioned<Bytes>>, suffix: &str) -> Decision<()> {
        let mut text = current.map_or_else(String::new, |c| {
            String::from_utf8(c.value.to_vec()).unwrap()
        });
        text.push_str(suffix);
        Decision::Write(Bytes::from(text))
    }

    #[tokio::test]
    async fn update_retries_a_lost_race_with_a_fresh_read() {
        let bucket = Recorder::new();
        bucket.inner.put(KEY, b("a")).await.unwrap();
        // Another writer changes the object between the update's first
        // read and its write.
        let mut writes = 0;
        bucket.meddle(Some(Box::new(move |op, _| {
            writes += u32::from(op.starts_with("put"));
            (op.starts_with("put") && writes == 1).then(|| Meddling::Put(KEY.into(), b("ab")))
        })));
        let mut seen = Vec::new();
        let updated = Fenced::new(&bucket, KEY)
            .update(|current| {
                seen.push(current.map(|c| c.value.clone()));
                append(current, "c")
            })
            .await
            .unwrap();
        assert!(matches!(updated, Updated::Written(_)), "{updated:?}");
        assert_eq!(seen, [Some(b("a")), Some(b("ab"))]);
        assert_eq!(stored(&bucket).await.as_deref(), Some("abc"));
        assert_eq!(
            bucket.take(),
            [
                "get k -> ok",
                "put_if_match k if m1 #4e25075d -> conflict",
                "get k -> ok",
                "put_if_match k if m2 #1a47e90b -> ok",
            ]
        );
    }

    #[tokio::test]
    async fn update_gives_up_after_its_attempts() {
        let bucket = Recorder::new();
        // Another writer changes the object before each write, for a few
        // more attempts than an update makes.
        let mut writes = 0;
        bucket.meddle(Some(Box::new(move |op, _| {
            if !op.starts_with("put") {
                return None;
            }
            writes += 1;
            (writes <= UPDATE_ATTEMPTS_MAX + 2)
                .then(|| Meddling::Put(KEY.into(), Bytes::from(format!("theirs {writes}"))))
        })));
        let mut decisions = 0;
        let updated = Fenced::new(&bucket, KEY)
            .update(|current| {
                decisions += 1;
                append(current, " ours")
            })
            .await
            .unwrap();
        assert!(
            matches!(updated, Updated::Contended { attempts } if attempts == UPDATE_ATTEMPTS_MAX),
            "{updated:?}"
        );
        assert_eq!(decisions, UPDATE_ATTEMPTS_MAX);
        let log = bucket.take();
        assert_eq!(log.len(), 2 * UPDATE_ATTEMPTS_MAX as usize, "{log:?}");
        assert!(
            log.iter()
                .skip(1)
                .step_by(2)
                .all(|l| l.ends_with("-> conflict"))
        );
    }

    #[tokio::test]
    async fn an_update_whose_reply_was_lost_ends_unknown_without_retrying() {
        let bucket = Recorder::new();
        bucket.inner.faults().push(Fault::ReplyLost);
        let mut decisions = 0;
        let updated = Fenced::new(&bucket, KEY)
            .update(|current| {
                decisions += 1;
                append(current, "ours")
            })
            .await
            .unwrap();
        let Updated::Unknown {
            attempts,
            bytes,
            error,
        } = updated
        else {
            panic!("not unknown: {updated:?}");
        };
        assert_eq!((attempts, bytes, decisions), (1, Some(b("ours")), 1));
        assert!(matches!(
            error,
            wasmkeep_bucket::Error::OutcomeUnknown { .. }
        ));
        // It applied: only a re-read, the caller's, can tell.
        assert_eq!(stored(&bucket).await.as_deref(), Some("ours"));
        assert_eq!(
            bucket.take(),
            ["get k -> not found", "put_if_absent k #7e3ebd7e -> unknown"]
        );
    }

    #[tokio::test]
    async fn an_update_deletes_what_it_read_or_leaves_it() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        bucket.inner.put(KEY, b("one")).await.unwrap();
        let left = object.update(|current| Decision::Leave(current.map(|c| c.value.clone())));
        assert!(matches!(left.await.unwrap(), Updated::Left(Some(v)) if v == b("one")));
        let deleted = object.update(|_| Decision::<()>::Delete).await.unwrap();
        assert!(matches!(deleted, Updated::Deleted), "{deleted:?}");
        assert_eq!(stored(&bucket).await, None);
        // Absent already: nothing to delete, no write.
        let deleted = object.update(|_| Decision::<()>::Delete).await.unwrap();
        assert!(matches!(deleted, Updated::Deleted), "{deleted:?}");
        assert_eq!(
            bucket.take(),
            [
                "get k -> ok",
                "get k -> ok",
                "delete_if_match k if m1 -> ok",
                "get k -> not found",
            ]
        );
    }

    #[tokio::test]
    async fn a_blind_update_creates_unread_and_reads_only_after_a_conflict() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        let blind = |suffix: &'static str| {
            let bucket = &bucket;
            object.update_with(
                UPDATE_ATTEMPTS_MAX,
                Start::Blind,
                move || {
                    bucket.mark("prepare");
                    Ok(())
                },
                move |(), current| std::future::ready(Ok(append(current.as_ref(), suffix))),
            )
        };
        assert!(matches!(blind("a").await.unwrap(), Updated::Written(_)));
        assert!(matches!(blind("b").await.unwrap(), Updated::Written(_)));
        assert_eq!(stored(&bucket).await.as_deref(), Some("ab"));
        // Each attempt prepares before its read.
        assert_eq!(
            bucket.take(),
            [
                "prepare",
                "put_if_absent k #e40c292c -> ok",
                "prepare",
                "put_if_absent k #e70c2de5 -> conflict",
                "prepare",
                "get k -> ok",
                "put_if_match k if m1 #4d2505ca -> ok",
            ]
        );
    }

    #[tokio::test]
    async fn an_error_of_prepare_or_decide_ends_the_update_before_its_next_request() {
        let bucket = Recorder::new();
        let object = Fenced::new(&bucket, KEY);
        let refused = object
            .update_with(
                UPDATE_ATTEMPTS_MAX,
                Start::Read,
                || Err::<(), _>(Error::LeaseInvalid),
                |(), _| std::future::ready(Ok(Decision::<()>::Delete)),
            )
            .await;
        assert!(matches!(refused, Err(Error::LeaseInvalid)), "{refused:?}");
        let refused = object
            .update_with(
                UPDATE_ATTEMPTS_MAX,
                Start::Read,
                || Ok(()),
                |(), _| std::future::ready(Err::<Decision<()>, _>(Error::LeaseInvalid)),
            )
            .await;
        assert!(matches!(refused, Err(Error::LeaseInvalid)), "{refused:?}");
        assert_eq!(bucket.take(), ["get k -> not found"]);
    }
}

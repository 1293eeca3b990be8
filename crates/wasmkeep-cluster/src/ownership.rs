//! Ownership records: per actor, the node (and incarnation) that holds it.
//!
//! A record is acquired with put-if-absent, or put-if-match over a record
//! that is released or whose hold is no longer valid, and released at
//! hibernation or hand-over. A hold is valid when the record names a node
//! whose lease is valid under that incarnation (the seed's LeaseView, see
//! [`crate::lease`]). Together with the store's log fencing (a record is
//! written with put-if-absent on its sequence number) two nodes can never both
//! commit for one actor.
//!
//! Record body (unique per write thanks to the nonce; S3 servers give equal
//! bodies equal etags):
//!
//! ```text
//! wasmkeep-owner 1
//! <node id>
//! <incarnation>
//! held | released
//! <nonce>
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Etag};
use wasmkeep_types::{ActorId, Keys, NodeId};

use crate::fenced::{Decision, Fenced, Outcome, Start, Updated, Versioned};
use crate::lease::{HoldStatus, LeaseObserver, NodeLease};
use crate::{Clock, Error, Random, Result};

const MAGIC: &str = "wasmkeep-owner 1";
/// Attempts of one acquire when other writers keep changing the record.
const ACQUIRE_ATTEMPTS_MAX: u32 = 4;
/// First pause between release attempts; doubles up to the cap.
const RELEASE_BACKOFF_FIRST: Duration = Duration::from_millis(50);
const RELEASE_BACKOFF_MAX: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipRecord {
    pub node: NodeId,
    pub incarnation: String,
    pub held: bool,
    pub nonce: String,
}

impl OwnershipRecord {
    pub fn to_text(&self) -> String {
        format!(
            "{MAGIC}\n{}\n{}\n{}\n{}\n",
            self.node,
            self.incarnation,
            if self.held { "held" } else { "released" },
            self.nonce
        )
    }

    pub fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let node = NodeId::new(lines.next()?).ok()?;
        let incarnation = lines.next()?.to_owned();
        let held = match lines.next()? {
            "held" => true,
            "released" => false,
            _ => return None,
        };
        let nonce = lines.next()?.to_owned();
        if incarnation.is_empty() || nonce.is_empty() {
            return None;
        }
        Some(Self {
            node,
            incarnation,
            held,
            nonce,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// This node holds the actor; `etag` is needed to release it.
    /// `prior_hold`: the record it replaced named a holder (another node,
    /// or this one: a hold that was never released), or it could not tell.
    /// That holder may still have a log record in flight, so the actor's
    /// log is fenced before the actor serves (ADR 0062). `false` only when
    /// no record was there, or a released one: a holder releases only once
    /// its log is settled.
    Acquired { etag: Etag, prior_hold: bool },
    /// Another node holds it with a valid lease.
    HeldBy { node: NodeId },
}

/// How a release ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReturn {
    /// The record no longer names this node.
    Released,
    /// The bucket did not answer within one lease TTL; the hold expires on
    /// its own when this node's lease does.
    Failed,
}

/// Acquires, checks and releases ownership records for one node.
#[derive(Debug, Clone)]
pub struct Ownership {
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    me: NodeId,
    lease: Arc<NodeLease>,
    observer: Arc<LeaseObserver>,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    /// Whether an acquire writes the record before reading it: most actors
    /// a node activates have no record (a release deletes it), and on S3 the
    /// read is a round trip of its own. Cleared for good once a release
    /// finds that the bucket cannot delete conditionally (it then leaves a
    /// released record, which a put-if-absent would only bump into).
    create_first: Arc<AtomicBool>,
}

impl Ownership {
    pub fn new(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        me: NodeId,
        lease: Arc<NodeLease>,
        observer: Arc<LeaseObserver>,
        clock: Arc<dyn Clock>,
        random: Arc<dyn Random>,
    ) -> Self {
        Self {
            bucket,
            keys,
            me,
            lease,
            observer,
            clock,
            random,
            create_first: Arc::new(AtomicBool::new(true)),
        }
    }

    pub fn node(&self) -> &NodeId {
        &self.me
    }

    pub fn lease(&self) -> &Arc<NodeLease> {
        &self.lease
    }

    /// The record, if any, with its etag. A record that does not parse is
    /// reported as `None` (and logged): no valid node wrote it.
    pub async fn read(&self, actor: &ActorId) -> Result<Option<(OwnershipRecord, Etag)>> {
        Ok(match self.fetch(actor).await? {
            Fetched::Record(record, etag) => Some((record, etag)),
            Fetched::Absent | Fetched::Unparseable => None,
        })
    }

    /// One read of the record, telling an absent record from one that does
    /// not parse (which an acquire replaces with put-if-match on its etag).
    async fn fetch(&self, actor: &ActorId) -> Result<Fetched> {
        let key = self.keys.owner(actor);
        let current = Fenced::new(&*self.bucket, &key).read().await?;
        Ok(Fetched::of(&key, current))
    }

    /// Whether the record's hold is valid now, reading the holder's
    /// heartbeat if needed.
    pub async fn hold_status(&self, record: &OwnershipRecord) -> Result<HoldStatus> {
        if !record.held {
            return Ok(HoldStatus::Expired);
        }
        if record.node == self.me {
            return Ok(
                if record.incarnation == self.lease.incarnation() && self.lease.is_valid() {
                    HoldStatus::Valid
                } else {
                    HoldStatus::Expired
                },
            );
        }
        self.observer
            .check_hold(
                &*self.bucket,
                &self.keys.node(&record.node),
                &record.node,
                &record.incarnation,
            )
            .await
    }

    /// The node with a valid hold on the actor, if any.
    pub async fn holder(&self, actor: &ActorId) -> Result<Option<NodeId>> {
        let Some((record, _)) = self.read(actor).await? else {
            return Ok(None);
        };
        Ok(match self.hold_status(&record).await? {
            HoldStatus::Valid => Some(record.node),
            _ => None,
        })
    }

    /// Acquires the actor for this node unless another node holds it.
    pub async fn acquire(&self, actor: &ActorId) -> Result<AcquireOutcome> {
        let key = self.keys.owner(actor);
        let record = Fenced::new(&*self.bucket, &key);
        // Before each attempt's read: the lease is checked and a fresh
        // nonce drawn.
        let mut prepare = || {
            if !self.lease.is_valid() {
                return Err(Error::LeaseInvalid);
            }
            Ok(OwnershipRecord {
                node: self.me.clone(),
                incarnation: self.lease.incarnation(),
                held: true,
                nonce: self.random.token_hex(8),
            })
        };
        // What the last decided write replaced: a hold, or nothing.
        let prior_hold = AtomicBool::new(true);
        let (this, key_text, prior) = (self, key.as_str(), &prior_hold);
        let mut decide = move |mine: OwnershipRecord, current| async move {
            let body = Bytes::from(mine.to_text());
            let fetched = Fetched::of(key_text, current);
            let held = match &fetched {
                Fetched::Absent => false,
                Fetched::Record(record, _) => record.held,
                // Nobody valid wrote it, but nobody can say who holds.
                Fetched::Unparseable => true,
            };
            prior.store(held, Ordering::Relaxed);
            Ok(match fetched {
                // A racing acquire that creates the record first makes this
                // a conflict: its hold is judged in the next round.
                Fetched::Absent | Fetched::Unparseable => Decision::Write(body),
                Fetched::Record(record, _)
                    if record.held
                        && record.node == this.me
                        && record.incarnation == mine.incarnation =>
                {
                    // Ours already (a release that failed): rewritten, so
                    // the etag changes and a leftover release racing this
                    // acquire (conditional on the old one) fails.
                    Decision::Write(body)
                }
                Fetched::Record(record, _) => match this.hold_status(&record).await? {
                    HoldStatus::Valid => Decision::Leave(record.node),
                    HoldStatus::Expired | HoldStatus::Unknown => Decision::Write(body),
                },
            })
        };
        let create_first = self.create_first.load(Ordering::Relaxed);
        // An attempt that only learned that the record exists is not counted.
        let mut attempts_left = ACQUIRE_ATTEMPTS_MAX + u32::from(create_first);
        // The first attempt may skip the read: a record that exists makes
        // the put-if-absent a conflict, and the next attempt reads.
        let mut start = if create_first {
            Start::Blind
        } else {
            Start::Read
        };
        while attempts_left > 0 {
            let updated = record
                .update_with(attempts_left, start, &mut prepare, &mut decide)
                .await?;
            match updated {
                Updated::Written(etag) => {
                    return Ok(AcquireOutcome::Acquired {
                        etag,
                        prior_hold: prior_hold.load(Ordering::Relaxed),
                    });
                }
                Updated::Left(node) => return Ok(AcquireOutcome::HeldBy { node }),
                Updated::Unknown {
                    attempts, bytes, ..
                } => {
                    // Re-read: the write may have applied. Its nonce, in the
                    // bytes it put, tells ours from another's.
                    let nonce = bytes
                        .as_deref()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .and_then(OwnershipRecord::parse)
                        .map(|mine| mine.nonce);
                    if let Some((record, etag)) = self.read(actor).await?
                        && Some(record.nonce) == nonce
                    {
                        // What the write replaced is not known.
                        return Ok(AcquireOutcome::Acquired {
                            etag,
                            prior_hold: true,
                        });
                    }
                    attempts_left -= attempts;
                    start = Start::Read;
                }
                Updated::Contended { .. } => break,
                Updated::Deleted => unreachable!("an acquire never decides to delete"),
            }
        }
        Err(Error::Bucket(wasmkeep_bucket::Error::Unavailable {
            key,
            reason: "the ownership record kept changing".into(),
        }))
    }

    /// Releases this node's hold, retrying for up to one lease TTL.
    pub async fn release(&self, actor: &ActorId, etag: &Etag) -> LeaseReturn {
        let key = self.keys.owner(actor);
        let deadline = self.clock.now() + self.lease.lease_ttl();
        let mut backoff = RELEASE_BACKOFF_FIRST;
        let mut etag = etag.clone();
        loop {
            match self.release_once(actor, &key, &etag).await {
                Ok(()) => return LeaseReturn::Released,
                Err(ReleaseRetry::WithEtag(new)) => etag = new,
                Err(ReleaseRetry::Later) => {}
            }
            if self.clock.now() + backoff >= deadline {
                tracing::warn!(%actor, "could not release the ownership record within one lease TTL");
                return LeaseReturn::Failed;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RELEASE_BACKOFF_MAX);
        }
    }

    /// The etag of this node's hold on `actor` under its current
    /// incarnation, if the record names it: a hold left behind by a release
    /// that failed, which [`Ownership::release_leftover`] gives back.
    pub async fn leftover_hold(&self, actor: &ActorId) -> Result<Option<Etag>> {
        Ok(match self.read(actor).await? {
            Some((record, etag))
                if record.held
                    && record.node == self.me
                    && record.incarnation == self.lease.incarnation() =>
            {
                Some(etag)
            }
            _ => None,
        })
    }

    /// One attempt to release a leftover hold read by
    /// [`Ownership::leftover_hold`]; conditional on its etag, so an acquire
    /// of the actor by this node since that read is never undone. `true`
    /// when the record no longer holds the actor for this node.
    pub async fn release_leftover(&self, actor: &ActorId, etag: &Etag) -> bool {
        let key = self.keys.owner(actor);
        self.release_once(actor, &key, etag).await.is_ok()
    }

    async fn release_once(
        &self,
        actor: &ActorId,
        key: &str,
        etag: &Etag,
    ) -> Result<(), ReleaseRetry> {
        let record = Fenced::new(&*self.bucket, key);
        let outcome = match record.delete_if_match(etag).await {
            Err(wasmkeep_bucket::Error::Unsupported(_)) => {
                self.create_first.store(false, Ordering::Relaxed);
                let released = OwnershipRecord {
                    node: self.me.clone(),
                    incarnation: self.lease.incarnation(),
                    held: false,
                    nonce: self.random.token_hex(8),
                };
                record
                    .replace(etag, Bytes::from(released.to_text()))
                    .await
                    .map(|written| written.map(|_| ()))
            }
            other => other,
        };
        match outcome {
            Ok(Outcome::Done(()) | Outcome::Gone) => Ok(()),
            Ok(Outcome::Conflict | Outcome::Unknown(_)) => {
                // Re-read: released already, taken by someone else, or still ours
                // under another etag (a lost reply).
                match self.read(actor).await {
                    Ok(Some((record, new_etag)))
                        if record.held
                            && record.node == self.me
                            && record.incarnation == self.lease.incarnation() =>
                    {
                        Err(ReleaseRetry::WithEtag(new_etag))
                    }
                    Ok(_) => Ok(()),
                    Err(_) => Err(ReleaseRetry::Later),
                }
            }
            Err(_) => Err(ReleaseRetry::Later),
        }
    }
}

/// What one read of an ownership record found.
enum Fetched {
    Absent,
    /// Replaced by an acquire (on the etag its read saw).
    Unparseable,
    Record(OwnershipRecord, Etag),
}

impl Fetched {
    /// Parses what a read of the record at `key` returned. A record that
    /// does not parse is logged: no valid node wrote it.
    fn of(key: &str, current: Option<Versioned<Bytes>>) -> Self {
        let Some(current) = current else {
            return Fetched::Absent;
        };
        match std::str::from_utf8(&current.value)
            .ok()
            .and_then(OwnershipRecord::parse)
        {
            Some(record) => Fetched::Record(record, current.etag),
            None => {
                tracing::warn!(key, "ownership record does not parse; treating it as free");
                Fetched::Unparseable
            }
        }
    }
}

enum ReleaseRetry {
    WithEtag(Etag),
    Later,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Meddling, Recorder};
    use crate::{SeededRandom, SystemClock};
    use std::collections::BTreeSet;
    use wasmkeep_bucket::{Fault, MemoryBucket};
    use wasmkeep_types::AppName;
    use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};

    const TTL: Duration = Duration::from_secs(10);

    struct Node {
        ownership: Ownership,
        lease: Arc<NodeLease>,
        keys: Keys,
        bucket: Arc<dyn Bucket>,
    }

    impl Node {
        /// Nodes `a` and `b` on one bucket, each with a lease.
        async fn two_beating(bucket: Arc<dyn Bucket>) -> (Self, Self) {
            let a = Node::new(bucket.clone(), "a", 1);
            let b = Node::new(bucket, "b", 2);
            a.beat().await;
            b.beat().await;
            (a, b)
        }

        fn new(bucket: Arc<dyn Bucket>, name: &str, seed: u64) -> Self {
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let random: Arc<dyn Random> = Arc::new(SeededRandom::new(seed));
            let lease = Arc::new(NodeLease::new(clock.clone(), random.clone(), TTL));
            let observer = Arc::new(LeaseObserver::new(
                clock.clone(),
                TTL,
                Duration::from_secs(1),
            ));
            let keys = Keys::new(&AppName::default_app());
            let ownership = Ownership::new(
                bucket.clone(),
                keys.clone(),
                NodeId::new(name).unwrap(),
                lease.clone(),
                observer,
                clock,
                random,
            );
            Self {
                ownership,
                lease,
                keys,
                bucket,
            }
        }

        async fn beat(&self) {
            let hb = Heartbeat {
                node: self.ownership.node().clone(),
                advertise: "http://127.0.0.1:1".into(),
                app: AppName::default_app(),
                incarnation: String::new(),
                state: NodeState::Serving,
                classes: ClassesServed::All,
                resident_actors: 0,
                drain: DrainState::None,
                secrets: false,
                capabilities: BTreeSet::new(),
                generation: 0,
                sockets_closing: 0,
                releases_failed: 0,
                holder: String::new(),
            };
            let key = self.keys.node(self.ownership.node());
            self.lease.renew(&*self.bucket, &key, hb).await.unwrap();
        }

        /// Acquires `actor`, which the test expects to be free; its etag.
        async fn acquired(&self, actor: &ActorId) -> Etag {
            match self.ownership.acquire(actor).await.unwrap() {
                AcquireOutcome::Acquired { etag, .. } => etag,
                other => panic!("{} did not acquire: {other:?}", self.ownership.node()),
            }
        }
    }

    fn actor() -> ActorId {
        ActorId::parse("t/counter/a").unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn only_one_node_acquires_a_free_actor() {
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let (a, b) = Node::two_beating(bucket.clone()).await;
        let x = actor();
        let (ra, rb) = tokio::join!(a.ownership.acquire(&x), b.ownership.acquire(&x));
        let outcomes = [ra.unwrap(), rb.unwrap()];
        let acquired = outcomes
            .iter()
            .filter(|o| matches!(o, AcquireOutcome::Acquired { .. }))
            .count();
        assert_eq!(acquired, 1, "{outcomes:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_valid_hold_is_respected_and_an_expired_one_taken_over() {
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let (a, b) = Node::two_beating(bucket.clone()).await;
        assert!(matches!(
            a.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired {
                prior_hold: false,
                ..
            }
        ));
        assert_eq!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::HeldBy {
                node: NodeId::new("a").unwrap()
            }
        );
        // a stops renewing (crash); b keeps its own lease alive.
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(3)).await;
            b.beat().await;
        }
        assert!(!a.lease.is_valid());
        // Taken over: a may still have a log record in flight.
        assert!(matches!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired {
                prior_hold: true,
                ..
            }
        ));
        assert_eq!(
            b.ownership.holder(&actor()).await.unwrap(),
            Some(NodeId::new("b").unwrap())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_actor_is_free_for_the_next_node() {
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let (a, b) = Node::two_beating(bucket.clone()).await;
        let etag = a.acquired(&actor()).await;
        assert_eq!(
            a.ownership.release(&actor(), &etag).await,
            LeaseReturn::Released
        );
        assert_eq!(a.ownership.holder(&actor()).await.unwrap(), None);
        assert!(matches!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired {
                prior_hold: false,
                ..
            }
        ));
        // A hold of its own that was never released: b may have a record
        // in flight from before.
        assert!(matches!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired {
                prior_hold: true,
                ..
            }
        ));
    }

    /// A memory bucket that counts reads of ownership records and, like
    /// the S3 backend, may not delete conditionally.
    #[derive(Debug)]
    struct Reads {
        inner: MemoryBucket,
        owner_reads: std::sync::atomic::AtomicU64,
        owner_writes: std::sync::atomic::AtomicU64,
        conditional_delete: bool,
    }

    impl Reads {
        fn new(conditional_delete: bool) -> Arc<Self> {
            Arc::new(Self {
                inner: MemoryBucket::new(),
                owner_reads: std::sync::atomic::AtomicU64::new(0),
                owner_writes: std::sync::atomic::AtomicU64::new(0),
                conditional_delete,
            })
        }

        fn owner_reads(&self) -> u64 {
            self.owner_reads.load(Ordering::SeqCst)
        }

        fn owner_writes(&self) -> u64 {
            self.owner_writes.load(Ordering::SeqCst)
        }

        fn count_write(&self, key: &str) {
            if key.contains("/owners/") {
                self.owner_writes.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    impl wasmkeep_bucket::Around for Reads {
        fn inner(&self) -> &dyn Bucket {
            &self.inner
        }

        async fn around<T: wasmkeep_bucket::Answer>(
            &self,
            request: wasmkeep_bucket::Request<'_>,
            call: impl std::future::Future<Output = wasmkeep_bucket::Result<T>> + Send,
        ) -> wasmkeep_bucket::Result<T> {
            use wasmkeep_bucket::Request;
            match request {
                Request::Get { key } if key.contains("/owners/") => {
                    self.owner_reads.fetch_add(1, Ordering::SeqCst);
                }
                Request::PutIfAbsent { key, .. }
                | Request::PutIfAbsentUnhurried { key, .. }
                | Request::PutIfAbsentAlone { key, .. }
                | Request::PutIfMatch { key, .. } => self.count_write(key),
                Request::DeleteIfMatch { .. } if !self.conditional_delete => {
                    return Err(wasmkeep_bucket::Error::Unsupported("conditional delete"));
                }
                _ => {}
            }
            call.await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_actor_is_acquired_without_reading_its_record_first() {
        let bucket = Reads::new(true);
        let (a, b) = Node::two_beating(bucket.clone()).await;
        let etag = a.acquired(&actor()).await;
        assert_eq!(
            bucket.owner_reads(),
            0,
            "a new actor's record is written unread"
        );
        // Held: b's write conflicts, then b reads the record and sees a.
        assert_eq!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::HeldBy {
                node: NodeId::new("a").unwrap()
            }
        );
        assert_eq!(bucket.owner_reads(), 1);
        // Released (deleted): written unread again.
        assert_eq!(
            a.ownership.release(&actor(), &etag).await,
            LeaseReturn::Released
        );
        assert!(matches!(
            b.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert_eq!(bucket.owner_reads(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn where_released_records_stay_an_acquire_reads_first() {
        let bucket = Reads::new(false);
        let a = Node::new(bucket.clone(), "a", 1);
        a.beat().await;
        let etag = a.acquired(&actor()).await;
        assert_eq!(
            a.ownership.release(&actor(), &etag).await,
            LeaseReturn::Released
        );
        assert!(
            bucket.inner.keys().iter().any(|k| k.contains("/owners/")),
            "the released record stays"
        );
        let (reads, writes) = (bucket.owner_reads(), bucket.owner_writes());
        // Another actor: no record, but this node has learned to read first.
        let other = ActorId::parse("t/counter/b").unwrap();
        assert!(matches!(
            a.ownership.acquire(&other).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert_eq!(bucket.owner_reads(), reads + 1);
        // The released record is taken over.
        assert!(matches!(
            a.ownership.acquire(&actor()).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert_eq!(
            (bucket.owner_reads(), bucket.owner_writes()),
            (reads + 2, writes + 2),
            "a read before each write, and no write that fails"
        );
    }

    // The tests below pin the bucket requests of ownership records, call
    // for call: the simulation's digests see every one of them, so a
    // reshaping of this code must leave these lines as they are.

    /// Nodes `a` and `b` beating on a recording bucket, the log emptied.
    async fn recorded(conditional_delete: bool) -> (Arc<Recorder>, Node, Node) {
        let bucket = Arc::new(Recorder::over(MemoryBucket::new(), conditional_delete));
        let (a, b) = Node::two_beating(bucket.clone()).await;
        bucket.take();
        (bucket, a, b)
    }

    #[tokio::test(start_paused = true)]
    async fn acquires_and_releases_make_the_same_requests_call_for_call() {
        let (bucket, a, b) = recorded(true).await;
        let x = actor();
        // Free: written unread. Held: b's write conflicts, b reads the
        // record and a's heartbeat.
        let etag = a.acquired(&x).await;
        assert!(matches!(
            b.ownership.acquire(&x).await.unwrap(),
            AcquireOutcome::HeldBy { .. }
        ));
        // Released with a conditional delete, then acquired by b.
        assert_eq!(a.ownership.release(&x, &etag).await, LeaseReturn::Released);
        let etag = b.acquired(&x).await;
        // b acquires again what it holds: rewritten on its etag.
        b.acquired(&x).await;
        // A release on a stale etag: read back, still b's, released again.
        assert_eq!(b.ownership.release(&x, &etag).await, LeaseReturn::Released);
        // A lost reply to an acquire: read back, and ours.
        bucket.inner.faults().push(Fault::ReplyLost);
        let etag = a.acquired(&x).await;
        // A lost reply to a release: read back, gone.
        bucket.inner.faults().push(Fault::ReplyLost);
        assert_eq!(a.ownership.release(&x, &etag).await, LeaseReturn::Released);
        // An expired hold is taken over: a stops beating.
        a.acquired(&x).await;
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(3)).await;
            b.beat().await;
        }
        assert!(matches!(
            b.ownership.acquire(&x).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        // The leftovers' path: read, then one conditional release.
        let left = b.ownership.leftover_hold(&x).await.unwrap();
        let left = left.expect("b holds x");
        assert!(b.ownership.release_leftover(&x, &left).await);
        assert_eq!(b.ownership.holder(&x).await.unwrap(), None);
        // An unavailable bucket: an acquire fails at once.
        bucket.inner.faults().push(Fault::Unavailable);
        assert!(matches!(
            b.ownership.acquire(&x).await,
            Err(Error::Bucket(wasmkeep_bucket::Error::Unavailable { .. }))
        ));
        let log: Vec<String> = bucket
            .take()
            .into_iter()
            .filter(|line| !line.contains(" nodes/b "))
            .collect();
        assert_eq!(
            log,
            [
                "put_if_absent owners/t/counter/61 #a09c52aa -> ok",
                "put_if_absent owners/t/counter/61 #32cc8dc6 -> conflict",
                "get owners/t/counter/61 -> ok",
                "get nodes/a -> ok",
                "delete_if_match owners/t/counter/61 if m3 -> ok",
                "put_if_absent owners/t/counter/61 #66df2c31 -> ok",
                "put_if_absent owners/t/counter/61 #da5bcf33 -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m4 #135001f7 -> ok",
                "delete_if_match owners/t/counter/61 if m4 -> conflict",
                "get owners/t/counter/61 -> ok",
                "delete_if_match owners/t/counter/61 if m5 -> ok",
                "put_if_absent owners/t/counter/61 #c074afb0 -> unknown",
                "get owners/t/counter/61 -> ok",
                "delete_if_match owners/t/counter/61 if m6 -> unknown",
                "get owners/t/counter/61 -> not found",
                "put_if_absent owners/t/counter/61 #b73d12f0 -> ok",
                "put_if_absent owners/t/counter/61 #a9d70791 -> conflict",
                "get owners/t/counter/61 -> ok",
                "get nodes/a -> ok",
                "put_if_match owners/t/counter/61 if m7 #9d953905 -> ok",
                "get owners/t/counter/61 -> ok",
                "delete_if_match owners/t/counter/61 if m13 -> ok",
                "get owners/t/counter/61 -> not found",
                "put_if_absent owners/t/counter/61 #337fb2bb -> unavailable",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_conditional_deletes_a_release_writes_a_released_record() {
        let (bucket, a, b) = recorded(false).await;
        let x = actor();
        let etag = a.acquired(&x).await;
        assert_eq!(a.ownership.release(&x, &etag).await, LeaseReturn::Released);
        // a has learned to read first; b has not yet.
        let etag = b.acquired(&x).await;
        assert_eq!(b.ownership.release(&x, &etag).await, LeaseReturn::Released);
        a.acquired(&x).await;
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent owners/t/counter/61 #a09c52aa -> ok",
                "delete_if_match owners/t/counter/61 if m3 -> unsupported",
                "put_if_match owners/t/counter/61 if m3 #98f82960 -> ok",
                "put_if_absent owners/t/counter/61 #32cc8dc6 -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m4 #6cc24671 -> ok",
                "delete_if_match owners/t/counter/61 if m5 -> unsupported",
                "put_if_match owners/t/counter/61 if m5 #e46140dd -> ok",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m6 #b73d12f0 -> ok",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_that_keeps_losing_its_race_gives_up_after_its_attempts() {
        let (bucket, a, _b) = recorded(true).await;
        let x = actor();
        let owner = a.keys.owner(&x);
        // Another writer rewrites the record before each of a's writes.
        let mut n = 0;
        bucket.meddle(Some(Box::new(move |op, key| {
            (op.starts_with("put") && key == owner).then(|| {
                n += 1;
                Meddling::Put(owner.clone(), Bytes::from(format!("garbage {n}")))
            })
        })));
        let acquired = a.ownership.acquire(&x).await;
        assert!(
            matches!(
                &acquired,
                Err(Error::Bucket(wasmkeep_bucket::Error::Unavailable { reason, .. }))
                    if reason == "the ownership record kept changing"
            ),
            "{acquired:?}"
        );
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent owners/t/counter/61 #a09c52aa -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m3 #c074afb0 -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m4 #b73d12f0 -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m5 #c8ec7da4 -> conflict",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m6 #a28154c1 -> conflict",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_reply_under_another_writers_record_counts_as_an_attempt() {
        let (bucket, a, _b) = recorded(true).await;
        let x = actor();
        let owner = a.keys.owner(&x);
        // a's first write applies but its reply is lost, and another writer
        // replaces it before a reads it back.
        bucket.inner.faults().push(Fault::ReplyLost);
        let mut reads = 0;
        bucket.meddle(Some(Box::new(move |op, key| {
            if op != "get" || key != owner {
                return None;
            }
            reads += 1;
            (reads == 1).then(|| Meddling::Put(owner.clone(), Bytes::from_static(b"not a record")))
        })));
        assert!(matches!(
            a.ownership.acquire(&x).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert_eq!(
            bucket.take(),
            [
                "put_if_absent owners/t/counter/61 #a09c52aa -> unknown",
                "get owners/t/counter/61 -> ok",
                "get owners/t/counter/61 -> ok",
                "put_if_match owners/t/counter/61 if m4 #c074afb0 -> ok",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_without_a_valid_lease_does_not_acquire() {
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let a = Node::new(bucket, "a", 1);
        assert!(matches!(
            a.ownership.acquire(&actor()).await,
            Err(Error::LeaseInvalid)
        ));
    }

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let r = OwnershipRecord {
            node: NodeId::new("n1").unwrap(),
            incarnation: "ab".into(),
            held: true,
            nonce: "cd".into(),
        };
        assert_eq!(OwnershipRecord::parse(&r.to_text()), Some(r));
        assert_eq!(
            OwnershipRecord::parse("wasmkeep-owner 1\nn1\nab\nmaybe\ncd\n"),
            None
        );
        assert_eq!(OwnershipRecord::parse("junk"), None);
    }
}

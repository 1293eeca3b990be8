//! Node leases (ADR 0020): a node holds actors only while its heartbeat keeps
//! being renewed, and every node judges leases by its own monotonic clock.
//!
//! The owner's side ([`NodeLease`]): a renewal whose write *started* at `s`
//! makes the lease valid until `s + lease_ttl`. The request's start is used,
//! not its reply, because the write may have become visible to others at
//! any moment after `s`.
//!
//! An observer's side ([`LeaseObserver`]): the first read whose *reply*
//! shows a new heartbeat version at `f` proves that version was written
//! before `f`, so its owner's lease from that write ends before `f + lease_ttl`.
//! The observer declares the lease expired only once a read that *started*
//! after `f + lease_ttl + margin` still returns the same version: by then no
//! renewal happened, so the owner stopped serving. Only durations on each
//! node's own clock are compared; the wall clocks of two nodes never are, so
//! skew between them (seconds) cannot produce two owners. The margin covers
//! drift in clock rates and scheduling delay.
//!
//! A lease that lapsed is never revived: the owner must drop every actor and
//! rejoin with a new incarnation ([`NodeLease::rejoin`]), so holds recorded
//! under the old incarnation stay invalid for everyone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;
use wasmkeep_bucket::{Bucket, Etag};
use wasmkeep_types::NodeId;
use wasmkeep_types::heartbeat::Heartbeat;

use crate::fenced::{Fenced, Outcome};
use crate::{Clock, Error, Random, Result};

/// Bytes of randomness in an incarnation.
const INCARNATION_BYTES: usize = 8;

/// The owner's side of its node lease.
#[derive(Debug)]
pub struct NodeLease {
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    lease_ttl: Duration,
    state: Mutex<LeaseState>,
}

#[derive(Debug)]
struct LeaseState {
    incarnation: String,
    valid_until: Option<Instant>,
    /// The etag of our last write; `None` before the first write or after an
    /// unknown outcome.
    last_etag: Option<Etag>,
    generation: u64,
    /// Set when the lease ran out; cleared by `rejoin`.
    lapsed: bool,
}

impl NodeLease {
    pub fn new(clock: Arc<dyn Clock>, random: Arc<dyn Random>, lease_ttl: Duration) -> Self {
        let incarnation = random.token_hex(INCARNATION_BYTES);
        Self {
            clock,
            random,
            lease_ttl,
            state: Mutex::new(LeaseState {
                incarnation,
                valid_until: None,
                last_etag: None,
                generation: 0,
                lapsed: false,
            }),
        }
    }

    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    pub fn incarnation(&self) -> String {
        self.state.lock().incarnation.clone()
    }

    /// True while the lease is valid now. Every event and every acquire
    /// checks it first.
    pub fn is_valid(&self) -> bool {
        let now = self.clock.now();
        let mut state = self.state.lock();
        match state.valid_until {
            Some(until) if now < until => true,
            Some(_) => {
                state.lapsed = true;
                false
            }
            None => false,
        }
    }

    /// The instant the lease ends unless renewed.
    pub fn valid_until(&self) -> Option<Instant> {
        self.state.lock().valid_until
    }

    /// True once the lease ran out: the node must drop every actor and
    /// [`rejoin`](Self::rejoin) before renewing.
    pub fn is_lapsed(&self) -> bool {
        self.is_valid();
        self.state.lock().lapsed
    }

    /// Starts over with a new incarnation after a lapse. Call only after
    /// every actor of the old incarnation was dropped.
    pub fn rejoin(&self) {
        let mut state = self.state.lock();
        state.incarnation = self.random.token_hex(INCARNATION_BYTES);
        state.valid_until = None;
        state.lapsed = false;
        // Like a start, the new incarnation's first write is unconditional:
        // a write of the old incarnation that timed out during the outage may
        // have landed since, and its etag is not ours to know.
        state.last_etag = None;
    }

    /// Fills in the heartbeat's generation and incarnation; returns the
    /// etag of this lease's last write.
    fn stamp(&self, heartbeat: &mut Heartbeat) -> Option<Etag> {
        let mut state = self.state.lock();
        state.generation += 1;
        heartbeat.generation = state.generation;
        heartbeat.incarnation = state.incarnation.clone();
        state.last_etag.clone()
    }

    /// Takes a heartbeat write of `incarnation` that started at `start` and
    /// landed with `etag`: the lease is valid until `start` plus the TTL.
    fn adopt(&self, incarnation: &str, etag: Etag, start: Instant) -> Result<()> {
        let mut state = self.state.lock();
        if state.incarnation != incarnation || state.lapsed {
            // Lapsed or rejoined while the write was in flight: it belongs
            // to an incarnation that no longer serves.
            return Err(Error::LeaseInvalid);
        }
        state.last_etag = Some(etag);
        let until = start + self.lease_ttl;
        if crate::planted::lease_from_reply() {
            state.valid_until = Some(self.clock.now() + self.lease_ttl);
        } else {
            state.valid_until = Some(state.valid_until.map_or(until, |u| u.max(until)));
        }
        Ok(())
    }

    /// Writes the heartbeat (its incarnation and generation are filled in
    /// here) and, on success, extends the lease to the request's start plus
    /// the TTL. A lapsed lease is not renewed: see [`rejoin`](Self::rejoin).
    pub async fn renew(
        &self,
        bucket: &dyn Bucket,
        key: &str,
        mut heartbeat: Heartbeat,
    ) -> Result<()> {
        if self.is_lapsed() {
            return Err(Error::LeaseInvalid);
        }
        let start = self.clock.now();
        let etag = self.stamp(&mut heartbeat);
        let body = Bytes::from(heartbeat.to_text());
        let object = Fenced::new(bucket, key);
        let written = match &etag {
            Some(etag) => object.replace(etag, body).await,
            None => object.overwrite(body).await,
        };
        match written? {
            Outcome::Done(etag) => self.adopt(&heartbeat.incarnation, etag, start),
            Outcome::Conflict => {
                // Either our own earlier write whose reply was lost (a timeout
                // the backend did not report as an unknown outcome) landed
                // after all, or another process rewrote our heartbeat. Our
                // incarnation in the body tells them apart.
                if let Ok(Some(current)) = object.read().await
                    && let Some(theirs) = std::str::from_utf8(&current.value)
                        .ok()
                        .and_then(|t| Heartbeat::parse(t).ok())
                    && theirs.node == heartbeat.node
                    && theirs.incarnation == heartbeat.incarnation
                {
                    let mut state = self.state.lock();
                    if state.incarnation == heartbeat.incarnation {
                        state.last_etag = Some(current.etag);
                    }
                    return Err(Error::Bucket(wasmkeep_bucket::Error::Unavailable {
                        key: key.to_owned(),
                        reason: "an earlier heartbeat write landed late; renewing again".into(),
                    }));
                }
                Err(Error::DuplicateNode {
                    node: heartbeat.node.to_string(),
                })
            }
            // Someone else deleted our heartbeat.
            Outcome::Gone => Err(Error::DuplicateNode {
                node: heartbeat.node.to_string(),
            }),
            Outcome::Unknown(err) => {
                // The write may have landed under an etag we do not know:
                // the next renewal writes unconditionally.
                self.state.lock().last_etag = None;
                Err(err.into())
            }
        }
    }

    /// A process's first heartbeat: takes the node id only from a process
    /// that is gone (ADR 0054). No heartbeat: written if still absent. A
    /// heartbeat carrying `holder` (this process's data-dir token, given
    /// only while it holds that dir's lock) was written by an earlier
    /// process of this data dir, which is dead: replaced at once. Any other
    /// heartbeat is read again every `poll` until a read that starts
    /// `unchanged_for` (the lease TTL and the observers' margin) after the
    /// first reply: one that changes meanwhile belongs to a live process,
    /// and the claim fails with [`Error::NodeIdInUse`]; one that does not is
    /// replaced, on its etag; one deleted meanwhile (its process stopped
    /// cleanly) is written anew if still absent. On success the lease is
    /// valid as after a renewal.
    pub async fn claim(
        &self,
        bucket: &dyn Bucket,
        key: &str,
        mut heartbeat: Heartbeat,
        holder: Option<&str>,
        unchanged_for: Duration,
        poll: Duration,
    ) -> Result<()> {
        if self.state.lock().last_etag.is_some() {
            // Claimed already: renew instead.
            return Err(Error::LeaseInvalid);
        }
        let node = heartbeat.node.to_string();
        let in_use = |reason: &str| Error::NodeIdInUse {
            node: node.clone(),
            reason: reason.to_owned(),
        };
        let object = Fenced::new(bucket, key);
        let found = object.read().await?;
        let first_reply = self.clock.now();
        // The etag to replace; `None`: write only if absent.
        let replace = match found {
            None => None,
            Some(found) => {
                let ours = holder.is_some_and(|h| {
                    !h.is_empty()
                        && std::str::from_utf8(&found.value)
                            .ok()
                            .and_then(|t| Heartbeat::parse(t).ok())
                            .is_some_and(|theirs| theirs.holder == h)
                });
                if ours {
                    Some(found.etag)
                } else {
                    tracing::info!(
                        node = %heartbeat.node,
                        wait = ?unchanged_for,
                        "this node id has a heartbeat from another process: waiting to see whether that process is alive"
                    );
                    loop {
                        tokio::time::sleep(poll).await;
                        let read_start = self.clock.now();
                        match object.read().await? {
                            Some(now) if now.etag == found.etag => {
                                if read_start >= first_reply + unchanged_for {
                                    break Some(found.etag);
                                }
                            }
                            Some(_) => {
                                return Err(in_use(
                                    "its heartbeat was renewed while this process waited",
                                ));
                            }
                            None => break None,
                        }
                    }
                }
            }
        };
        let start = self.clock.now();
        self.stamp(&mut heartbeat);
        holder.unwrap_or_default().clone_into(&mut heartbeat.holder);
        let body = Bytes::from(heartbeat.to_text());
        let written = match &replace {
            Some(etag) => object.replace(etag, body).await,
            None => object.create(body).await,
        };
        match written? {
            Outcome::Done(etag) => self.adopt(&heartbeat.incarnation, etag, start),
            Outcome::Conflict | Outcome::Gone => Err(in_use(
                "another process wrote its heartbeat at the same time",
            )),
            Outcome::Unknown(_) => {
                // Ours if it landed: the body names our incarnation. A
                // heartbeat gone by now is the read's own error, as ever.
                let Some(current) = object.read().await? else {
                    return Err(wasmkeep_bucket::Error::NotFound {
                        key: key.to_owned(),
                    }
                    .into());
                };
                let landed = std::str::from_utf8(&current.value)
                    .ok()
                    .and_then(|t| Heartbeat::parse(t).ok())
                    .is_some_and(|hb| hb.incarnation == heartbeat.incarnation);
                if !landed {
                    return Err(in_use(
                        "another process wrote its heartbeat at the same time",
                    ));
                }
                self.adopt(&heartbeat.incarnation, current.etag, start)
            }
        }
    }

    /// Ends the lease at a clean shutdown, after every actor was released:
    /// deletes the heartbeat so peers need not wait for the TTL. A lease
    /// that is no longer valid is only ended: peers call its heartbeat
    /// expired within about a heartbeat period anyway, and the bucket that
    /// kept it from being renewed would likely keep the delete waiting too.
    /// Returns whether the heartbeat was deleted.
    pub async fn resign(&self, bucket: &dyn Bucket, key: &str) -> Result<bool> {
        let was_valid = self.is_valid();
        {
            let mut state = self.state.lock();
            state.valid_until = None;
            state.lapsed = true;
        }
        if !was_valid {
            return Ok(false);
        }
        bucket.delete(key).await?;
        Ok(true)
    }
}

/// What an observer knows about another node's hold on an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldStatus {
    /// The node's lease with that incarnation is valid.
    Valid,
    /// The node's lease with that incarnation has certainly ended.
    Expired,
    /// Neither can be said without reading the heartbeat again.
    Unknown,
}

/// One node's heartbeat as this observer last saw it.
#[derive(Debug, Clone)]
pub struct Sighting {
    pub heartbeat: Heartbeat,
    pub etag: Etag,
    /// Reply time of the first read that showed this version.
    pub first_seen: Instant,
    /// Start time of the latest read that still showed this version.
    pub confirmed_at: Instant,
}

/// Another node's lease as judged by this node.
#[derive(Debug)]
pub struct LeaseObserver {
    clock: Arc<dyn Clock>,
    lease_ttl: Duration,
    margin: Duration,
    seen: Mutex<HashMap<NodeId, Sighting>>,
}

impl LeaseObserver {
    /// `margin` covers clock-rate drift and scheduling delay; a tenth of the
    /// TTL (at least 500 ms) is the default the node uses.
    pub fn new(clock: Arc<dyn Clock>, lease_ttl: Duration, margin: Duration) -> Self {
        Self {
            clock,
            lease_ttl,
            margin,
            seen: Mutex::new(HashMap::new()),
        }
    }

    pub fn default_margin(lease_ttl: Duration) -> Duration {
        (lease_ttl / 10).max(Duration::from_millis(500))
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Records a read of `heartbeat` that started at `read_start` and
    /// replied at `reply_at`.
    pub fn observe(
        &self,
        heartbeat: Heartbeat,
        etag: Etag,
        read_start: Instant,
        reply_at: Instant,
    ) {
        let mut seen = self.seen.lock();
        let node = heartbeat.node.clone();
        match seen.get_mut(&node) {
            Some(s) if s.etag == etag && s.heartbeat.generation == heartbeat.generation => {
                s.confirmed_at = s.confirmed_at.max(read_start);
            }
            _ => {
                seen.insert(
                    node,
                    Sighting {
                        heartbeat,
                        etag,
                        first_seen: reply_at,
                        confirmed_at: read_start,
                    },
                );
            }
        }
    }

    /// Records that a read started at `read_start` found the same version as
    /// before (a listing showed an unchanged etag).
    pub fn confirm_unchanged(&self, node: &NodeId, etag: &Etag, read_start: Instant) -> bool {
        let mut seen = self.seen.lock();
        match seen.get_mut(node) {
            Some(s) if &s.etag == etag => {
                s.confirmed_at = s.confirmed_at.max(read_start);
                true
            }
            _ => false,
        }
    }

    /// Records that a read started at `read_start` found no heartbeat.
    pub fn observe_missing(&self, node: &NodeId, read_start: Instant) {
        let mut seen = self.seen.lock();
        if seen.get(node).is_some_and(|s| s.first_seen <= read_start) {
            seen.remove(node);
        }
    }

    pub fn sighting(&self, node: &NodeId) -> Option<Sighting> {
        self.seen.lock().get(node).cloned()
    }

    pub fn sightings(&self) -> Vec<Sighting> {
        self.seen.lock().values().cloned().collect()
    }

    /// Whether `node` with `incarnation` holds a valid lease now.
    ///
    /// A node that never wrote a heartbeat, or whose heartbeat is gone, or
    /// that shows another incarnation, holds nothing under `incarnation`: a
    /// node deletes its heartbeat or changes incarnation only after dropping
    /// every actor. `Unknown` means: read the heartbeat again, then ask again.
    pub fn hold_status(&self, node: &NodeId, incarnation: &str) -> HoldStatus {
        let seen = self.seen.lock();
        let Some(s) = seen.get(node) else {
            return HoldStatus::Unknown;
        };
        if s.heartbeat.incarnation != incarnation {
            // The sighting may predate the record: a node that rejoined
            // wrote its new heartbeat before acquiring under the new
            // incarnation. Only a read started after the record was read
            // can show that the incarnation changed since (check_hold).
            return HoldStatus::Unknown;
        }
        let deadline = s.first_seen + self.lease_ttl + self.margin;
        if s.confirmed_at >= deadline {
            HoldStatus::Expired
        } else if self.clock.now() < deadline {
            HoldStatus::Valid
        } else {
            HoldStatus::Unknown
        }
    }

    /// The heartbeat of a node whose current lease is valid, if any.
    pub fn live(&self, node: &NodeId) -> Option<Heartbeat> {
        let s = self.sighting(node)?;
        match self.hold_status(node, &s.heartbeat.incarnation) {
            HoldStatus::Valid => Some(s.heartbeat),
            _ => None,
        }
    }

    /// Reads `node`'s heartbeat now and records what it shows.
    pub async fn read(&self, bucket: &dyn Bucket, key: &str, node: &NodeId) -> Result<()> {
        let start = self.clock.now();
        match Fenced::new(bucket, key).read().await? {
            Some(current) => {
                let reply = self.clock.now();
                match std::str::from_utf8(&current.value)
                    .ok()
                    .and_then(|text| Heartbeat::parse(text).ok())
                {
                    Some(hb) if &hb.node == node => self.observe(hb, current.etag, start, reply),
                    _ => {
                        tracing::warn!(key, "ignoring a heartbeat that does not parse");
                    }
                }
            }
            None => self.observe_missing(node, start),
        }
        Ok(())
    }

    /// [`hold_status`](Self::hold_status), reading the heartbeat when the
    /// answer is not known yet. A heartbeat that is missing after a fresh
    /// read means the hold has ended.
    pub async fn check_hold(
        &self,
        bucket: &dyn Bucket,
        key: &str,
        node: &NodeId,
        incarnation: &str,
    ) -> Result<HoldStatus> {
        let status = self.hold_status(node, incarnation);
        if status != HoldStatus::Unknown {
            return Ok(status);
        }
        self.read(bucket, key, node).await?;
        Ok(match self.hold_status(node, incarnation) {
            // A fresh read found no heartbeat at all.
            HoldStatus::Unknown => HoldStatus::Expired,
            status => status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SeededRandom, SystemClock};
    use std::collections::BTreeSet;
    use wasmkeep_types::AppName;
    use wasmkeep_types::heartbeat::{ClassesServed, DrainState, NodeState};

    fn heartbeat(node: &str, incarnation: &str, generation: u64) -> Heartbeat {
        Heartbeat {
            node: NodeId::new(node).unwrap(),
            advertise: "http://127.0.0.1:1".into(),
            app: AppName::default_app(),
            incarnation: incarnation.into(),
            state: NodeState::Serving,
            classes: ClassesServed::All,
            resident_actors: 0,
            drain: DrainState::None,
            secrets: false,
            capabilities: BTreeSet::new(),
            generation,
            sockets_closing: 0,
            releases_failed: 0,
            holder: String::new(),
        }
    }

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn observer_keeps_a_hold_valid_until_ttl_and_margin_pass() {
        let obs = LeaseObserver::new(Arc::new(SystemClock), TTL, MARGIN);
        let node = NodeId::new("n1").unwrap();
        let t0 = Instant::now();
        obs.observe(heartbeat("n1", "i1", 1), Etag("e1".into()), t0, t0);
        assert_eq!(obs.hold_status(&node, "i1"), HoldStatus::Valid);
        // Another incarnation than the one seen: the sighting may be older
        // than the record that names it, so only a fresh read can tell.
        assert_eq!(obs.hold_status(&node, "i0"), HoldStatus::Unknown);
        tokio::time::advance(TTL + MARGIN).await;
        // No read since: the owner may have renewed unseen.
        assert_eq!(obs.hold_status(&node, "i1"), HoldStatus::Unknown);
        // A read that started now still shows the same version: expired.
        obs.observe(
            heartbeat("n1", "i1", 1),
            Etag("e1".into()),
            Instant::now(),
            Instant::now(),
        );
        assert_eq!(obs.hold_status(&node, "i1"), HoldStatus::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_version_restarts_the_observers_clock() {
        let obs = LeaseObserver::new(Arc::new(SystemClock), TTL, MARGIN);
        let node = NodeId::new("n1").unwrap();
        let t0 = Instant::now();
        obs.observe(heartbeat("n1", "i1", 1), Etag("e1".into()), t0, t0);
        tokio::time::advance(TTL).await;
        let t1 = Instant::now();
        obs.observe(heartbeat("n1", "i1", 2), Etag("e2".into()), t1, t1);
        tokio::time::advance(MARGIN * 2).await;
        assert_eq!(obs.hold_status(&node, "i1"), HoldStatus::Valid);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_started_before_the_deadline_proves_nothing() {
        let obs = LeaseObserver::new(Arc::new(SystemClock), TTL, MARGIN);
        let node = NodeId::new("n1").unwrap();
        let t0 = Instant::now();
        obs.observe(heartbeat("n1", "i1", 1), Etag("e1".into()), t0, t0);
        let slow_read_start = t0 + TTL;
        tokio::time::advance(TTL + MARGIN * 3).await;
        obs.observe(
            heartbeat("n1", "i1", 1),
            Etag("e1".into()),
            slow_read_start,
            Instant::now(),
        );
        assert_eq!(obs.hold_status(&node, "i1"), HoldStatus::Unknown);
    }

    #[tokio::test(start_paused = true)]
    async fn owner_counts_its_lease_from_the_request_start() {
        let bucket = wasmkeep_bucket::MemoryBucket::new();
        bucket
            .faults()
            .set_latency(Duration::from_secs(3), Duration::ZERO);
        let lease = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(1)), TTL);
        assert!(!lease.is_valid());
        let start = Instant::now();
        lease
            .renew(&bucket, "apps/default/nodes/n1", heartbeat("n1", "", 0))
            .await
            .unwrap();
        assert!(Instant::now() >= start + Duration::from_secs(3));
        assert_eq!(lease.valid_until(), Some(start + TTL));
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_is_not_renewed_until_rejoined_with_a_new_incarnation() {
        let bucket = wasmkeep_bucket::MemoryBucket::new();
        let lease = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(1)), TTL);
        let key = "apps/default/nodes/n1";
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        let first = lease.incarnation();
        tokio::time::advance(TTL).await;
        assert!(!lease.is_valid());
        assert!(lease.is_lapsed());
        assert!(matches!(
            lease.renew(&bucket, key, heartbeat("n1", "", 0)).await,
            Err(Error::LeaseInvalid)
        ));
        lease.rejoin();
        assert_ne!(lease.incarnation(), first);
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_write_of_our_own_is_adopted_not_called_a_duplicate() {
        let bucket = wasmkeep_bucket::MemoryBucket::new();
        let lease = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(1)), TTL);
        let key = "apps/default/nodes/n1";
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        // A write of ours whose reply was lost lands after all.
        let landed = heartbeat("n1", &lease.incarnation(), 7).to_text();
        bucket.put(key, Bytes::from(landed)).await.unwrap();
        assert!(matches!(
            lease.renew(&bucket, key, heartbeat("n1", "", 0)).await,
            Err(Error::Bucket(_))
        ));
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejoined_lease_renews_over_a_write_that_landed_during_the_outage() {
        let bucket = wasmkeep_bucket::MemoryBucket::new();
        let lease = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(1)), TTL);
        let key = "apps/default/nodes/n1";
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        let landed = heartbeat("n1", &lease.incarnation(), 9).to_text();
        bucket.put(key, Bytes::from(landed)).await.unwrap();
        tokio::time::advance(TTL).await;
        assert!(lease.is_lapsed());
        lease.rejoin();
        lease
            .renew(&bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn two_processes_with_one_node_id_are_detected() {
        let bucket = wasmkeep_bucket::MemoryBucket::new();
        let a = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(1)), TTL);
        let b = NodeLease::new(Arc::new(SystemClock), Arc::new(SeededRandom::new(2)), TTL);
        let key = "apps/default/nodes/n1";
        a.renew(&bucket, key, heartbeat("n1", "", 0)).await.unwrap();
        b.renew(&bucket, key, heartbeat("n1", "", 0)).await.unwrap();
        assert!(matches!(
            a.renew(&bucket, key, heartbeat("n1", "", 0)).await,
            Err(Error::DuplicateNode { .. })
        ));
    }

    fn process(seed: u64) -> NodeLease {
        NodeLease::new(
            Arc::new(SystemClock),
            Arc::new(SeededRandom::new(seed)),
            TTL,
        )
    }

    async fn written(bucket: &dyn Bucket, key: &str) -> Heartbeat {
        let object = bucket.get(key).await.unwrap();
        Heartbeat::parse(std::str::from_utf8(&object.bytes).unwrap()).unwrap()
    }

    const WATCH: Duration = Duration::from_secs(12);
    const POLL: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_claim_writes_an_absent_heartbeat_and_refuses_a_live_one() {
        let bucket = Arc::new(wasmkeep_bucket::MemoryBucket::new());
        let key = "apps/default/nodes/n1";
        let a = Arc::new(process(1));
        a.claim(
            &*bucket,
            key,
            heartbeat("n1", "", 0),
            Some("aa"),
            WATCH,
            POLL,
        )
        .await
        .unwrap();
        assert!(a.is_valid());
        // A claims once; later writes are renewals.
        assert!(matches!(
            a.claim(
                &*bucket,
                key,
                heartbeat("n1", "", 0),
                Some("aa"),
                WATCH,
                POLL
            )
            .await,
            Err(Error::LeaseInvalid)
        ));
        let renewing = tokio::spawn({
            let (a, bucket) = (Arc::clone(&a), Arc::clone(&bucket));
            async move {
                loop {
                    tokio::time::sleep(POLL).await;
                    a.renew(&*bucket, key, heartbeat("n1", "", 0))
                        .await
                        .unwrap();
                }
            }
        });
        // Another data dir's process, or one without the lock: refused.
        for holder in [Some("bb"), None] {
            let b = process(2);
            let claimed = b
                .claim(&*bucket, key, heartbeat("n1", "", 0), holder, WATCH, POLL)
                .await;
            assert!(
                matches!(&claimed, Err(Error::NodeIdInUse { node, .. }) if node == "n1"),
                "{claimed:?}"
            );
            assert!(!b.is_valid());
        }
        renewing.abort();
        a.renew(&*bucket, key, heartbeat("n1", "", 0))
            .await
            .unwrap();
    }

    // The three tests below pin the bucket requests of the lease, call for
    // call: the simulation's digests see every one of them, so a reshaping
    // of this code must leave these lines as they are.

    #[tokio::test(start_paused = true)]
    async fn renewals_write_blind_then_on_their_etag_and_read_only_after_a_conflict() {
        use crate::testing::Recorder;
        use wasmkeep_bucket::Fault;
        let bucket = Recorder::new();
        let key = "apps/default/nodes/n1";
        let lease = process(1);
        let renew = || lease.renew(&bucket, key, heartbeat("n1", "", 0));
        renew().await.unwrap();
        renew().await.unwrap();
        // A lost reply: the next renewal writes unconditionally.
        bucket.inner.faults().push(Fault::ReplyLost);
        assert!(renew().await.is_err());
        renew().await.unwrap();
        // A late write of ours: read once, then renewed on its etag.
        let landed = heartbeat("n1", &lease.incarnation(), 40).to_text();
        bucket.inner.put(key, Bytes::from(landed)).await.unwrap();
        assert!(matches!(renew().await, Err(Error::Bucket(_))));
        renew().await.unwrap();
        // Another process's write, then none at all.
        let theirs = heartbeat("n1", "other", 1).to_text();
        bucket.inner.put(key, Bytes::from(theirs)).await.unwrap();
        assert!(matches!(renew().await, Err(Error::DuplicateNode { .. })));
        bucket.inner.delete(key).await.unwrap();
        assert!(matches!(renew().await, Err(Error::DuplicateNode { .. })));
        // An unavailable bucket: no read.
        bucket.inner.faults().push(Fault::Unavailable);
        assert!(matches!(renew().await, Err(Error::Bucket(_))));
        assert_eq!(
            bucket.take(),
            [
                "put nodes/n1 #4540057d -> ok",
                "put_if_match nodes/n1 if m1 #69da2ddc -> ok",
                "put_if_match nodes/n1 if m2 #72e9cec7 -> unknown",
                "put nodes/n1 #71ebd6e6 -> ok",
                "put_if_match nodes/n1 if m4 #58283911 -> conflict",
                "get nodes/n1 -> ok",
                "put_if_match nodes/n1 if m5 #5a1efdb0 -> ok",
                "put_if_match nodes/n1 if m6 #601c965b -> conflict",
                "get nodes/n1 -> ok",
                "put_if_match nodes/n1 if m6 #6578312a -> not found",
                "put_if_match nodes/n1 if m6 #5b968655 -> unavailable",
            ]
        );
    }

    /// A dead process's heartbeat is taken at once by its successor on its
    /// data dir (its token proves it, ADR 0054), else after a watch that saw
    /// it unchanged; a claim reads first and reads again only after a lost
    /// reply.
    #[tokio::test(start_paused = true)]
    async fn claims_take_a_dead_processes_heartbeat_by_its_data_dir_or_after_a_watch() {
        use crate::testing::{Meddling, Recorder};
        use wasmkeep_bucket::Fault;
        let key = "apps/default/nodes/n1";
        // Absent: written if still absent.
        let bucket = Recorder::new();
        let a = process(1);
        a.claim(
            &bucket,
            key,
            heartbeat("n1", "", 0),
            Some("aa"),
            WATCH,
            POLL,
        )
        .await
        .unwrap();
        assert_eq!(written(&bucket.inner, key).await.holder, "aa");
        // a dies. Its own data dir's successor: replaced at once (within
        // less than one poll) on the etag read.
        let b = process(2);
        let claimed = tokio::time::timeout(
            POLL / 2,
            b.claim(
                &bucket,
                key,
                heartbeat("n1", "", 0),
                Some("aa"),
                WATCH,
                POLL,
            ),
        )
        .await;
        assert!(matches!(claimed, Ok(Ok(()))), "{claimed:?}");
        assert_eq!(
            written(&bucket.inner, key).await.incarnation,
            b.incarnation()
        );
        // b dies. Another data dir's process: watched until unchanged, then
        // replaced.
        let c = process(3);
        c.claim(
            &bucket,
            key,
            heartbeat("n1", "", 0),
            Some("cc"),
            WATCH,
            POLL,
        )
        .await
        .unwrap();
        let taken = written(&bucket.inner, key).await;
        assert_eq!(
            (taken.incarnation, taken.holder),
            (c.incarnation(), "cc".to_owned())
        );
        // A lost reply: read back, and ours.
        let fresh = Recorder::new();
        fresh.inner.faults().push(Fault::ReplyLost);
        let d = process(4);
        d.claim(&fresh, key, heartbeat("n1", "", 0), None, WATCH, POLL)
            .await
            .unwrap();
        assert!(d.is_valid());
        // A lost reply and the heartbeat gone on the read back: the read's
        // error.
        let gone = Recorder::new();
        gone.inner.faults().push(Fault::ReplyLost);
        gone.meddle(Some(Box::new(move |op, k| {
            (op == "get" && k == key).then(|| Meddling::Delete(key.to_owned()))
        })));
        let e = process(5);
        let claimed = e
            .claim(&gone, key, heartbeat("n1", "", 0), None, WATCH, POLL)
            .await;
        assert!(
            matches!(
                &claimed,
                Err(Error::Bucket(wasmkeep_bucket::Error::NotFound { key: k })) if k == key
            ),
            "{claimed:?}"
        );
        assert_eq!(
            [bucket.take(), fresh.take(), gone.take()].concat(),
            [
                "get nodes/n1 -> not found",
                "put_if_absent nodes/n1 #18b6f2a7 -> ok",
                "get nodes/n1 -> ok",
                "put_if_match nodes/n1 if m1 #54bc51c9 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> ok",
                "put_if_match nodes/n1 if m2 #2122f9e2 -> ok",
                "get nodes/n1 -> not found",
                "put_if_absent nodes/n1 #75260c76 -> unknown",
                "get nodes/n1 -> ok",
                "get nodes/n1 -> not found",
                "put_if_absent nodes/n1 #3a8f203b -> unknown",
                "get nodes/n1 -> not found",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn observers_read_and_a_resignation_deletes_unconditionally() {
        use crate::testing::Recorder;
        let bucket = Recorder::new();
        let key = "apps/default/nodes/n1";
        let node = NodeId::new("n1").unwrap();
        let obs = LeaseObserver::new(Arc::new(SystemClock), TTL, MARGIN);
        obs.read(&bucket, key, &node).await.unwrap();
        let a = process(1);
        a.renew(&bucket, key, heartbeat("n1", "", 0)).await.unwrap();
        obs.read(&bucket, key, &node).await.unwrap();
        assert!(a.resign(&bucket, key).await.unwrap());
        assert!(!a.resign(&bucket, key).await.unwrap());
        assert_eq!(
            bucket.take(),
            [
                "get nodes/n1 -> not found",
                "put nodes/n1 #4540057d -> ok",
                "get nodes/n1 -> ok",
                "delete nodes/n1 -> ok",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_deleted_during_the_watch_is_written_anew() {
        let bucket = Arc::new(wasmkeep_bucket::MemoryBucket::new());
        let key = "apps/default/nodes/n1";
        let a = Arc::new(process(1));
        a.claim(&*bucket, key, heartbeat("n1", "", 0), None, WATCH, POLL)
            .await
            .unwrap();
        let resigning = tokio::spawn({
            let (a, bucket) = (Arc::clone(&a), Arc::clone(&bucket));
            async move {
                tokio::time::sleep(POLL * 3).await;
                a.resign(&*bucket, key).await.unwrap()
            }
        });
        let b = process(2);
        b.claim(&*bucket, key, heartbeat("n1", "", 0), None, WATCH, POLL)
            .await
            .unwrap();
        assert!(resigning.await.unwrap(), "a deleted its heartbeat");
        assert!(b.is_valid());
    }
}

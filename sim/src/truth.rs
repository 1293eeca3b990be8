//! The ground truth and the checkers. The simulation sees what no node can:
//! the virtual instant every write really applied in the bucket. From that it
//! knows each lease's true validity and each actor's true owner, and checks
//! the nodes against it after every step, not only at the end.
//!
//! - **one owner** (`check_commit`): a node commits an event for an actor
//!   only while the newest ownership record that applied names that node,
//!   its incarnation and `held`;
//! - **lease truth** (`check_commit`): a node commits only before its
//!   lease's true end, the last applied heartbeat write of its incarnation
//!   plus the TTL (observers may call it expired from then on, plus margin);
//! - **one writer per log record** (`log_record_applied`): a record a
//!   restore would read is created once (one at or below a durable
//!   snapshot is never read: a compaction or a delete removed it, and a
//!   paused former holder may create it again harmlessly);
//! - **no increment from nowhere** ([`Truth::check_counter`], at the end):
//!   every increment in the database committed, and the counter counts
//!   exactly those;
//! - **the acknowledged history is linearizable** ([`Truth::check_history`],
//!   at the end, for actors never deleted): no two acknowledged increments
//!   answered the same count; one acknowledged before another was sent
//!   answered a smaller count; and every acknowledged increment's event id
//!   is in the actor's database (which one was lost, not only how many);
//! - **no write answered as failed is ever visible**
//!   ([`Truth::check_failed_writes`], at the end): an increment whose
//!   client got an error other than 504 (outcome unknown, ADR 0062) is
//!   not in the actor's database;
//! - **no alarm runs before its time** ([`Truth::check_alarms`]): on the
//!   true clock, never earlier than the clock skew allows;
//! - **every committed alarm fires** ([`Truth::check_alarms`], at the end,
//!   after the faults healed): an alarm whose setting was acknowledged, and
//!   not replaced by a later setting, ran at least once;
//! - **a finished move left the actor with its target**: a target that
//!   answers a take with 200 holds the actor ([`Truth::check_taken`]), a
//!   take never finds the old owner that sent it holding the actor again
//!   (`World::take_found_sender_holding`), and when the old owner deletes a
//!   move key the actor is not held by that old owner
//!   ([`Truth::move_key_deleted`]);
//! - **a drained node holds nothing** (checked by the harness at the end);
//! - **a deletion is total and final** ([`Truth::check_counter`], at the
//!   end): an actor deleted by `wasmkeep actor delete` counts no increment
//!   that committed before the delete was asked, and every increment
//!   acknowledged to a request sent after the deletion ended; the deletion
//!   ends once the faults healed.
//!
//! Every decision and outcome also goes into the trace, whose digest shows
//! that a seed reproduces its run exactly.

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::clock::virtual_ms;

/// Most violations kept (the first ones explain the failure).
pub const VIOLATIONS_MAX: usize = 50;

/// How each checker's violations begin (see [`Truth`]).
pub const ONE_OWNER: &str = "one owner:";
pub const LEASE_TRUTH: &str = "lease truth:";
pub const ONE_WRITER: &str = "one writer per record:";
pub const WRITE_LOST: &str = "acknowledged write lost:";
pub const PHANTOM_WRITE: &str = "phantom write:";
pub const RESTORE_FAILED: &str = "final restore failed:";
pub const ALARM_LOST: &str = "committed alarm never fired:";
pub const ALARM_LATE: &str = "committed alarm fired late:";
pub const ALARM_EARLY: &str = "alarm fired before its time:";
pub const MOVE_UNDONE: &str = "move ended on the old owner:";
pub const DRAINED_HOLDS: &str = "drained node holds actors:";
pub const DELETE_UNDONE: &str = "a deleted actor's write came back:";
pub const DELETE_UNFINISHED: &str = "delete never finished:";
pub const FAILED_WRITE_VISIBLE: &str = "a write answered as failed is visible:";
pub const HISTORY: &str = "history not linearizable:";

/// One acknowledged increment as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Answered {
    event_id: u64,
    sent_ms: u128,
    acked_ms: u128,
    /// The count it answered (`None`: the body was not a number).
    count: Option<u64>,
}

/// One `wasmkeep actor delete`: when the operator asked (before its key was
/// written), its key, and when a node removed that key (the deletion ended).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Deletion {
    asked_ms: u128,
    key: String,
    done_ms: Option<u128>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    pub node: String,
    pub incarnation: String,
    pub held: bool,
    pub applied_ms: u128,
}

#[derive(Debug)]
pub struct Truth {
    start: Instant,
    lease_ttl: Duration,
    trace: Vec<String>,
    digest: Sha256,
    /// (node, incarnation) -> the last instant a heartbeat write applied.
    heartbeats: BTreeMap<(String, String), Instant>,
    /// Owner key -> the newest ownership record that applied.
    owners: BTreeMap<String, OwnerRecord>,
    /// Log record key -> the node whose write created it.
    log_writers: BTreeMap<String, String>,
    /// Actor data prefix -> the newest snapshot that applied (restores
    /// read no log record at or below it).
    snapshots: BTreeMap<String, u64>,
    /// Actor -> the virtual ms of each increment whose transaction
    /// committed (acknowledged or not).
    commit_ms: BTreeMap<String, Vec<u128>>,
    /// Actor -> the client event ids of the increments that committed.
    committed_ids: BTreeMap<String, std::collections::BTreeSet<u64>>,
    /// Actor -> the virtual ms each increment acknowledged to a client was
    /// sent.
    ack_sent_ms: BTreeMap<String, Vec<u128>>,
    /// Actor -> every acknowledged increment, as its client saw it.
    answered: BTreeMap<String, Vec<Answered>>,
    /// Actor -> the client event ids of increments answered with an error
    /// that says nothing was applied, and that status.
    failed_answers: BTreeMap<String, Vec<(u64, u16)>>,
    /// Actor -> its deletions, in order.
    deletions: BTreeMap<String, Vec<Deletion>>,
    /// Delete requests numbered so far (each key's request).
    delete_requests: u64,
    /// Actor -> every alarm time a guest set, in order, with the virtual ms
    /// it was set at.
    alarm_sets: BTreeMap<String, Vec<(i64, u128)>>,
    /// Actor -> alarm times whose setting a client saw acknowledged, and when.
    alarm_acks: BTreeMap<String, Vec<(i64, u128)>>,
    /// Actor -> alarm times that ran, and when.
    alarm_fires: BTreeMap<String, Vec<(i64, u128)>>,
    /// When set: an acknowledged alarm must run within this long of its due
    /// time (or of its acknowledgement, if later), unless replaced first.
    /// Only for runs whose faults cannot delay an alarm that long.
    pub alarm_lateness_max: Option<Duration>,
    /// The virtual ms the nodes were stopped, and how far a node's clock may
    /// be off either way (it bounds how early an alarm may run on the true
    /// clock, too): an alarm due later than `stopped - clock_behind_max` on
    /// the true clock may legitimately not have run.
    pub stopped_ms: Option<u128>,
    pub clock_behind_max: Duration,
    violations: Vec<String>,
    violations_total: u64,
}

impl Truth {
    pub fn new(start: Instant, lease_ttl: Duration) -> Self {
        Self {
            start,
            lease_ttl,
            trace: Vec::new(),
            digest: Sha256::new(),
            heartbeats: BTreeMap::new(),
            owners: BTreeMap::new(),
            log_writers: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            commit_ms: BTreeMap::new(),
            committed_ids: BTreeMap::new(),
            ack_sent_ms: BTreeMap::new(),
            failed_answers: BTreeMap::new(),
            answered: BTreeMap::new(),
            deletions: BTreeMap::new(),
            delete_requests: 0,
            alarm_sets: BTreeMap::new(),
            alarm_acks: BTreeMap::new(),
            alarm_fires: BTreeMap::new(),
            alarm_lateness_max: None,
            stopped_ms: None,
            clock_behind_max: Duration::ZERO,
            violations: Vec::new(),
            violations_total: 0,
        }
    }

    pub fn now_ms(&self) -> u128 {
        virtual_ms(self.start)
    }

    /// One trace line: virtual time, who, what.
    pub fn log(&mut self, who: &str, what: impl AsRef<str>) {
        let line = format!("{:>9} {who:<6} {}", self.now_ms(), what.as_ref());
        self.digest.update(line.as_bytes());
        self.digest.update(b"\n");
        self.trace.push(line);
    }

    pub fn violation(&mut self, what: String) {
        self.log("CHECK", format!("VIOLATION {what}"));
        self.violations_total += 1;
        if self.violations.len() < VIOLATIONS_MAX {
            self.violations
                .push(format!("at {} ms: {what}", self.now_ms()));
        }
    }

    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    pub fn violations_total(&self) -> u64 {
        self.violations_total
    }

    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest.clone().finalize())
    }

    pub fn heartbeat_applied(&mut self, node: &str, incarnation: &str) {
        self.heartbeats
            .insert((node.to_owned(), incarnation.to_owned()), Instant::now());
    }

    /// The instant the lease of `node` under `incarnation` truly ends, as far
    /// as the bucket has seen its heartbeats.
    pub fn lease_true_end(&self, node: &str, incarnation: &str) -> Option<Instant> {
        self.heartbeats
            .get(&(node.to_owned(), incarnation.to_owned()))
            .map(|applied| *applied + self.lease_ttl)
    }

    pub fn owner_applied(&mut self, owner_key: &str, record: Option<(String, String, bool)>) {
        let applied_ms = self.now_ms();
        match record {
            Some((node, incarnation, held)) => {
                self.owners.insert(
                    owner_key.to_owned(),
                    OwnerRecord {
                        node,
                        incarnation,
                        held,
                        applied_ms,
                    },
                );
            }
            None => {
                self.owners.remove(owner_key);
            }
        }
    }

    /// A snapshot `.../<actor>/snap/<seq>` applied.
    pub fn snapshot_applied(&mut self, key: &str) {
        if let Some((actor, seq)) = split_seq(key, "/snap/") {
            let newest = self.snapshots.entry(actor.to_owned()).or_default();
            *newest = (*newest).max(seq);
        }
    }

    /// A log record `.../<actor>/log/<seq>` was created by `node`.
    pub fn log_record_applied(&mut self, key: &str, node: &str) {
        let unread = split_seq(key, "/log/").is_some_and(|(actor, seq)| {
            self.snapshots
                .get(actor)
                .is_some_and(|snapshot| seq <= *snapshot)
        });
        if let Some(first) = self.log_writers.get(key)
            && first != node
            && !unread
        {
            let first = first.clone();
            self.violation(format!(
                "{ONE_WRITER} {key} was created by {first} and again by {node}"
            ));
        }
        self.log_writers.insert(key.to_owned(), node.to_owned());
    }

    /// Checks one committed event (its transaction committed, its record
    /// queued) against the ground truth at this instant.
    pub fn check_commit(
        &mut self,
        node: &str,
        incarnation: &str,
        owner_key: &str,
        actor: &str,
        event: &str,
    ) {
        let now = Instant::now();
        match self.lease_true_end(node, incarnation) {
            Some(end) if now < end => {}
            Some(end) => {
                let late_ms = now.saturating_duration_since(end).as_millis();
                self.violation(format!(
                    "{LEASE_TRUTH} {node} (incarnation {incarnation}) committed {event} on {actor} {late_ms} ms after its lease truly ended"
                ));
            }
            None => self.violation(format!(
                "{LEASE_TRUTH} {node} (incarnation {incarnation}) committed {event} on {actor} without any heartbeat of that incarnation in the bucket"
            )),
        }
        match self.owners.get(owner_key) {
            Some(r) if r.held && r.node == node && r.incarnation == incarnation => {}
            other => {
                let found = match other {
                    Some(r) => format!(
                        "{} (incarnation {}, {}, applied at {} ms)",
                        r.node,
                        r.incarnation,
                        if r.held { "held" } else { "released" },
                        r.applied_ms
                    ),
                    None => "no record".to_owned(),
                };
                self.violation(format!(
                    "{ONE_OWNER} {node} (incarnation {incarnation}) committed {event} on {actor} while the ownership record names {found}"
                ));
            }
        }
    }

    /// The newest ownership record that applied for `owner_key`.
    pub fn owner(&self, owner_key: &str) -> Option<&OwnerRecord> {
        self.owners.get(owner_key)
    }

    /// An increment of `actor` committed on its node now.
    pub fn increment_committed(&mut self, actor: &str, event_id: u64) {
        let now = self.now_ms();
        self.commit_ms
            .entry(actor.to_owned())
            .or_default()
            .push(now);
        self.committed_ids
            .entry(actor.to_owned())
            .or_default()
            .insert(event_id);
    }

    /// An increment of `actor` sent at `sent_ms` was acknowledged.
    pub fn increment_acked(&mut self, actor: &str, sent_ms: u128) {
        self.ack_sent_ms
            .entry(actor.to_owned())
            .or_default()
            .push(sent_ms);
    }

    /// Increments acknowledged to clients, over every actor.
    /// An increment's client got 200 with `count` (sent at `sent_ms`,
    /// answered now).
    pub fn increment_answered(
        &mut self,
        actor: &str,
        event_id: u64,
        sent_ms: u128,
        count: Option<u64>,
    ) {
        let acked_ms = self.now_ms();
        self.answered
            .entry(actor.to_owned())
            .or_default()
            .push(Answered {
                event_id,
                sent_ms,
                acked_ms,
                count,
            });
    }

    /// At the end, for an actor never deleted (a delete starts its count
    /// over): the acknowledged increments form a linearizable history of
    /// a counter, and each is in the database (`events`: the ids a fresh
    /// restore finds).
    pub fn check_history(&mut self, actor: &str, events: &std::collections::BTreeSet<u64>) {
        if self.deletions.contains_key(actor) {
            return;
        }
        let answered = self.answered.get(actor).cloned().unwrap_or_default();
        let mut found = Vec::new();
        for a in &answered {
            if a.count.is_none() {
                found.push(format!(
                    "{HISTORY} event {} of {actor} was acknowledged without a count",
                    a.event_id
                ));
            }
            if !events.contains(&a.event_id) {
                found.push(format!(
                    "{HISTORY} event {} of {actor} was acknowledged (count {:?}) and is not in the database",
                    a.event_id, a.count
                ));
            }
        }
        // Each count answered once.
        let mut by_count: BTreeMap<u64, u64> = BTreeMap::new();
        for a in &answered {
            if let Some(count) = a.count
                && let Some(other) = by_count.insert(count, a.event_id)
            {
                found.push(format!(
                    "{HISTORY} events {other} and {} of {actor} were both answered count {count}",
                    a.event_id
                ));
            }
        }
        // Real-time order: an increment acknowledged before another was
        // sent answered a smaller count. Sweep the sends in order, keeping
        // the largest count acknowledged strictly before each.
        let mut acked: Vec<&Answered> = answered.iter().collect();
        acked.sort_by_key(|a| a.acked_ms);
        let mut sent: Vec<&Answered> = answered.iter().collect();
        sent.sort_by_key(|a| a.sent_ms);
        let (mut next, mut largest): (usize, Option<&Answered>) = (0, None);
        for b in sent {
            while next < acked.len() && acked[next].acked_ms < b.sent_ms {
                if acked[next].count > largest.and_then(|l| l.count) {
                    largest = Some(acked[next]);
                }
                next += 1;
            }
            if let (Some(l), Some(count)) = (largest, b.count)
                && l.count.is_some_and(|c| c >= count)
            {
                found.push(format!(
                    "{HISTORY} event {} of {actor} (sent at {} ms) answered count {count}, yet event {} was acknowledged at {} ms with count {:?}",
                    b.event_id, b.sent_ms, l.event_id, l.acked_ms, l.count
                ));
            }
        }
        for what in found {
            self.violation(what);
        }
    }

    /// An increment's client got `status`, an error that says nothing was
    /// applied.
    pub fn increment_failed(&mut self, actor: &str, event_id: u64, status: u16) {
        self.failed_answers
            .entry(actor.to_owned())
            .or_default()
            .push((event_id, status));
    }

    /// At the end: no increment answered as failed is in `actor`'s
    /// database (`events`: the ids a fresh restore finds).
    pub fn check_failed_writes(&mut self, actor: &str, events: &std::collections::BTreeSet<u64>) {
        let visible: Vec<(u64, u16)> = self
            .failed_answers
            .get(actor)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter(|(id, _)| events.contains(id))
            .copied()
            .collect();
        for (id, status) in visible {
            self.violation(format!(
                "{FAILED_WRITE_VISIBLE} event {id} of {actor} was answered {status}, and its increment is in the database"
            ));
        }
    }

    pub fn acknowledged_total(&self) -> u64 {
        self.ack_sent_ms.values().map(Vec::len).sum::<usize>() as u64
    }

    /// Increments whose transaction committed, over every actor.
    pub fn committed_total(&self) -> u64 {
        self.commit_ms.values().map(Vec::len).sum::<usize>() as u64
    }

    /// A number for a delete request that no other request of the run has.
    pub fn next_delete_request(&mut self) -> u64 {
        self.delete_requests += 1;
        self.delete_requests
    }

    /// The operator is about to write the delete key `key` for `actor`.
    pub fn delete_asked(&mut self, actor: &str, key: &str) {
        let now = self.now_ms();
        self.deletions
            .entry(actor.to_owned())
            .or_default()
            .push(Deletion {
                asked_ms: now,
                key: key.to_owned(),
                done_ms: None,
            });
    }

    /// The operator's delete key for `actor` could not be written.
    pub fn delete_not_asked(&mut self, actor: &str) {
        if let Some(deletions) = self.deletions.get_mut(actor) {
            deletions.pop();
        }
    }

    /// A node removed the delete key `key` of `actor`: that deletion ended
    /// (a late removal of an earlier request's key ends no other).
    pub fn delete_key_removed(&mut self, node: &str, actor: &str, key: &str) {
        let now = self.now_ms();
        let request = key.rsplit('/').next().unwrap_or(key);
        self.log(node, format!("removed the delete key {request} of {actor}"));
        if let Some(deletion) = self
            .deletions
            .get_mut(actor)
            .and_then(|d| d.iter_mut().find(|d| d.key == key))
            && deletion.done_ms.is_none()
        {
            deletion.done_ms = Some(now);
        }
    }

    pub fn alarm_set_attempted(&mut self, actor: &str, at_ms: i64) {
        let now = self.now_ms();
        self.alarm_sets
            .entry(actor.to_owned())
            .or_default()
            .push((at_ms, now));
    }

    pub fn alarm_acked(&mut self, actor: &str, at_ms: i64) {
        let now = self.now_ms();
        self.alarm_acks
            .entry(actor.to_owned())
            .or_default()
            .push((at_ms, now));
    }

    pub fn alarm_fired(&mut self, actor: &str, at_ms: i64) {
        let now = self.now_ms();
        self.alarm_fires
            .entry(actor.to_owned())
            .or_default()
            .push((at_ms, now));
    }

    /// At the end, faults healed: the last alarm set on each actor, when its
    /// setting was acknowledged and it fell due (on every node's clock)
    /// before the nodes stopped, ran at least once. With a lateness bound,
    /// every acknowledged alarm not replaced in time ran within the bound.
    pub fn check_alarms(&mut self) {
        let end = self.now_ms();
        let mut found = Vec::new();
        for (actor, sets) in &self.alarm_sets {
            let Some((last, _)) = sets.last() else {
                continue;
            };
            let acks = self.alarm_acks.get(actor).map_or(&[][..], Vec::as_slice);
            let fires = self.alarm_fires.get(actor).map_or(&[][..], Vec::as_slice);
            // No alarm runs before its time on the clock of the node that
            // runs it, which may be ahead of the true one by the skew.
            for (at_ms, fired_ms) in fires {
                let due = u128::try_from(at_ms - crate::clock::EPOCH_MS).unwrap_or(0);
                if fired_ms + self.clock_behind_max.as_millis() < due {
                    found.push(format!(
                        "{ALARM_EARLY} {actor}'s alarm due at {due} ms ran at {fired_ms} ms, more than {} ms early",
                        self.clock_behind_max.as_millis()
                    ));
                }
            }
            let last_due = u128::try_from(last - crate::clock::EPOCH_MS).unwrap_or(0);
            let due_in_time = self
                .stopped_ms
                .is_none_or(|stopped| last_due + self.clock_behind_max.as_millis() < stopped);
            if due_in_time
                && acks.iter().any(|(a, _)| a == last)
                && !fires.iter().any(|(f, _)| f == last)
            {
                found.push(format!(
                    "{ALARM_LOST} {actor}'s alarm at wall {last} ms was acknowledged and never ran"
                ));
            }
            let Some(bound) = self.alarm_lateness_max else {
                continue;
            };
            for (at_ms, acked) in acks {
                let due = u128::try_from(at_ms - crate::clock::EPOCH_MS).unwrap_or(0);
                let deadline = due.max(*acked) + bound.as_millis();
                let set_at = sets.iter().find(|(s, _)| s == at_ms).map_or(0, |(_, t)| *t);
                let replaced = sets
                    .iter()
                    .any(|(s, t)| s != at_ms && *t >= set_at && *t <= deadline);
                if replaced || deadline >= end {
                    continue;
                }
                if !fires.iter().any(|(f, t)| f == at_ms && *t <= deadline) {
                    let when = fires
                        .iter()
                        .find(|(f, _)| f == at_ms)
                        .map_or("never".to_owned(), |(_, t)| format!("at {t} ms"));
                    found.push(format!(
                        "{ALARM_LATE} {actor}'s alarm due at {due} ms (acknowledged at {acked} ms) ran {when}, past {deadline} ms"
                    ));
                }
            }
        }
        for what in found {
            self.violation(what);
        }
    }

    /// `target` answered a take of `actor` with 200: the newest ownership
    /// record must name it, held.
    pub fn check_taken(&mut self, target: &str, owner_key: &str, actor: &str) {
        let holds = self
            .owners
            .get(owner_key)
            .is_some_and(|r| r.held && r.node == target);
        if !holds {
            let found = self
                .owners
                .get(owner_key)
                .map_or("no record".to_owned(), |r| {
                    format!("{} ({})", r.node, if r.held { "held" } else { "released" })
                });
            self.violation(format!(
                "{MOVE_UNDONE} {target} answered a take of {actor} but the ownership record names {found}"
            ));
        }
    }

    /// A node deleted a move key of `actor` to `target`: unless the move was
    /// to itself, the actor must not be held by the deleting node (the old
    /// owner claimed it back).
    pub fn move_key_deleted(&mut self, node: &str, owner_key: &str, actor: &str, target: &str) {
        self.log(node, format!("deleted the move key of {actor} to {target}"));
        if node == target {
            return;
        }
        if let Some(r) = self.owners.get(owner_key)
            && r.held
            && r.node == node
        {
            let applied_ms = r.applied_ms;
            self.violation(format!(
                "{MOVE_UNDONE} {node} deleted the move of {actor} to {target} while it holds the actor itself (record applied at {applied_ms} ms)"
            ));
        }
    }

    /// At the end, the counter and its event ids as a fresh store reads
    /// them. For an actor never deleted, increment by increment: every
    /// increment in the database committed (no phantom), and the counter
    /// counts exactly the increments in it (the acknowledged ones are
    /// checked by [`Truth::check_history`]: this replaced a check of
    /// totals, which an unacknowledged increment could mask). For a
    /// deleted actor, by totals: none that committed before its last
    /// delete was asked, and every one acknowledged to a request sent
    /// after that delete ended.
    pub fn check_counter(
        &mut self,
        actor: &str,
        found: u64,
        events: &std::collections::BTreeSet<u64>,
    ) {
        if let Some(last) = self.deletions.get(actor).and_then(|d| d.last()).cloned() {
            self.check_deleted_counter(actor, found, last);
            return;
        }
        let acked = self.ack_sent_ms.get(actor).map_or(0, Vec::len);
        let committed = self.committed_ids.get(actor).cloned().unwrap_or_default();
        self.log(
            "CHECK",
            format!(
                "{actor}: counter {found}, {} increments in the database, acknowledged {acked}, committed {}",
                events.len(),
                committed.len()
            ),
        );
        if found != events.len() as u64 {
            self.violation(format!(
                "{PHANTOM_WRITE} {actor} counts {found} but holds {} increments",
                events.len()
            ));
        }
        for id in events.difference(&committed) {
            self.violation(format!(
                "{PHANTOM_WRITE} event {id} of {actor} is in the database but never committed"
            ));
        }
    }

    fn check_deleted_counter(&mut self, actor: &str, found: u64, last: Deletion) {
        let Some(done_ms) = last.done_ms else {
            self.violation(format!(
                "{DELETE_UNFINISHED} the delete of {actor} asked at {} ms still stands after the faults healed",
                last.asked_ms
            ));
            return;
        };
        let count = |times: Option<&Vec<u128>>, keep: &dyn Fn(u128) -> bool| {
            times.map_or(0, |t| t.iter().filter(|ms| keep(**ms)).count()) as u64
        };
        let since_asked = count(self.commit_ms.get(actor), &|ms| ms >= last.asked_ms);
        let acked_after = count(self.ack_sent_ms.get(actor), &|ms| ms > done_ms);
        self.log(
            "CHECK",
            format!(
                "{actor}: counter {found}, deleted from {} to {done_ms} ms; acknowledged after {acked_after}, committed since asked {since_asked}",
                last.asked_ms
            ),
        );
        if found < acked_after {
            self.violation(format!(
                "{WRITE_LOST} {actor} counts {found} but {acked_after} increments sent after its deletion ended ({done_ms} ms) were acknowledged"
            ));
        }
        if found > since_asked {
            self.violation(format!(
                "{DELETE_UNDONE} {actor} counts {found} but only {since_asked} increments committed since its delete was asked ({} ms)",
                last.asked_ms
            ));
        }
    }
}

/// Splits `.../<actor><marker><seq>` into the actor's prefix and the seq.
fn split_seq<'k>(key: &'k str, marker: &str) -> Option<(&'k str, u64)> {
    let (actor, seq) = key.rsplit_once(marker)?;
    Some((actor, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Acknowledgements at virtual times: (event id, sent ms, acked ms, count).
    async fn history(acks: &[(u64, u128, u128, u64)]) -> Truth {
        let mut truth = Truth::new(Instant::now(), Duration::from_secs(10));
        let mut by_ack = acks.to_vec();
        by_ack.sort_by_key(|a| a.2);
        for (id, sent, acked, count) in by_ack {
            let now = truth.now_ms();
            tokio::time::advance(Duration::from_millis(u64::try_from(acked - now).unwrap())).await;
            truth.increment_answered("t/c/a", id, sent, Some(count));
        }
        truth
    }

    fn ids(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_history_checker_accepts_a_counter_and_names_what_is_wrong() {
        // Two overlapping increments (either order of counts), then one
        // sent after both were acknowledged.
        let mut good = history(&[(1, 0, 10, 2), (2, 0, 20, 1), (3, 25, 30, 3)]).await;
        good.check_history("t/c/a", &ids(&[1, 2, 3]));
        assert!(good.violations().is_empty(), "{:?}", good.violations());

        let mut twice = history(&[(1, 0, 10, 1), (2, 0, 20, 1)]).await;
        twice.check_history("t/c/a", &ids(&[1, 2]));
        assert!(
            twice.violations()[0].contains("both answered count 1"),
            "{:?}",
            twice.violations()
        );

        let mut stale = history(&[(1, 0, 10, 5), (2, 15, 20, 4)]).await;
        stale.check_history("t/c/a", &ids(&[1, 2]));
        assert!(
            stale.violations()[0].contains("yet event 1 was acknowledged"),
            "{:?}",
            stale.violations()
        );

        let mut lost = history(&[(1, 0, 10, 1), (2, 15, 20, 2)]).await;
        lost.check_history("t/c/a", &ids(&[2]));
        assert!(
            lost.violations()[0].contains(
                "event 1 of t/c/a was acknowledged (count Some(1)) and is not in the database"
            ),
            "{:?}",
            lost.violations()
        );
    }
}

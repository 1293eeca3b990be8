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
//! - **one writer per log record** (`log_record_applied`);
//! - **no acknowledged write lost** ([`Truth::check_counter`], at the end).
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
    /// Actor -> increments acknowledged to a client.
    pub acked: BTreeMap<String, u64>,
    /// Actor -> increments whose transaction committed (acknowledged or not).
    pub attempted: BTreeMap<String, u64>,
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
            acked: BTreeMap::new(),
            attempted: BTreeMap::new(),
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

    pub fn log_record_applied(&mut self, key: &str, node: &str) {
        if let Some(first) = self.log_writers.get(key)
            && first != node
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
        event: u64,
    ) {
        let now = Instant::now();
        match self.lease_true_end(node, incarnation) {
            Some(end) if now < end => {}
            Some(end) => {
                let late_ms = now.saturating_duration_since(end).as_millis();
                self.violation(format!(
                    "{LEASE_TRUTH} {node} (incarnation {incarnation}) committed event {event} on {actor} {late_ms} ms after its lease truly ended"
                ));
            }
            None => self.violation(format!(
                "{LEASE_TRUTH} {node} (incarnation {incarnation}) committed event {event} on {actor} without any heartbeat of that incarnation in the bucket"
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
                    "{ONE_OWNER} {node} (incarnation {incarnation}) committed event {event} on {actor} while the ownership record names {found}"
                ));
            }
        }
    }

    /// At the end: the counter read through a fresh store must count every
    /// acknowledged increment and no increment that never committed.
    pub fn check_counter(&mut self, actor: &str, found: u64) {
        let acked = self.acked.get(actor).copied().unwrap_or(0);
        let attempted = self.attempted.get(actor).copied().unwrap_or(0);
        self.log(
            "CHECK",
            format!("{actor}: counter {found}, acknowledged {acked}, committed {attempted}"),
        );
        if found < acked {
            self.violation(format!(
                "{WRITE_LOST} {actor} counts {found} but {acked} increments were acknowledged"
            ));
        }
        if found > attempted {
            self.violation(format!(
                "{PHANTOM_WRITE} {actor} counts {found} but only {attempted} increments ever committed"
            ));
        }
    }
}

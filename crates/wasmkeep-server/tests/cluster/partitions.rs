//! Partitions with real processes (issue 53, ADR 0074): every node in a
//! network namespace of its own (`netns.rs`), the bucket (SeaweedFS) behind
//! a proxy on the test's bridge, links cut and healed while clients
//! increment counters through every node.
//!
//! Every test counts each client request by what it may have done: 200 is
//! acknowledged; 503 (with Retry-After) applied nothing; 504
//! `outcome_unknown`, or no answer within the client's limit, is uncertain.
//! Any other answer is a failure that is not clean, and fails the test.
//! Afterwards every counter holds at least its acknowledged increments and
//! at most those plus its uncertain ones, and the records in the bucket show
//! one writer at a time (`failover::check_one_writer_at_a_time`).
//!
//! Figures (acknowledged, uncertain, the time a cut node took to stop
//! serving, the time from a heal until every node served every actor
//! again) are printed, never asserted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use parking_lot::Mutex;
use wasmkeep_transport::client::PEER_CONNECT_TIME_MAX;
use wasmkeep_types::{ActorId, AppName, Keys};

use crate::client::{RETRY_PAUSE, Resp};
use crate::failover::{check_one_writer_at_a_time, open_bucket, read_history};
use crate::netns::Way;
use crate::runner::{APP, BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

/// Counters under load; `p{a}` is first claimed by node `a % nodes`.
const ACTORS: usize = 6;
/// Longest wait for one condition (a phase of a test).
const PHASE_TIME_MAX: Duration = Duration::from_secs(45);
/// A load request without an answer this fast counts as uncertain (the
/// client gave up); far below the node's own 60 s for a forward, so the
/// load keeps moving while requests hang at a cut.
const LOAD_REQUEST_TIME_MAX: Duration = Duration::from_secs(5);
/// A probe without an answer this fast counts as "not served".
const PROBE_TIME_MAX: Duration = Duration::from_millis(1500);
/// The test's own slack in timing a cut: the `ip` call has returned when
/// the cut is noted, so this only covers scheduling of the test itself.
const CUT_SLACK: Duration = Duration::from_millis(100);
/// Acknowledged increments of every actor between two cuts.
const ACKS_BETWEEN_CUTS: u64 = 2;
/// Rounds of cut and heal under load.
const ROUNDS: usize = 6;
/// An alarm set just before a cut falls due this far into it.
const ALARM_IN_MS: u64 = 800;

fn options(name: &str, tls: bool) -> ClusterOptions {
    let mut options = ClusterOptions::new(name, BucketKind::SeaweedFs, tls);
    options.netns = true;
    options
}

pub async fn a_node_cut_off_from_the_bucket_stops_serving_and_another_takes_over(
    tls: bool,
    _bucket: BucketKind,
) {
    crate::run(options("cut-bucket", tls), bucket_cut_body).await
}

pub async fn cuts_between_nodes_fail_forwarded_requests_cleanly_and_heal(
    tls: bool,
    _bucket: BucketKind,
) {
    crate::run(options("cut-peers", tls), peer_cut_body).await
}

pub async fn repeated_cuts_under_load_lose_no_acknowledged_write_and_every_alarm_fires(
    tls: bool,
    _bucket: BucketKind,
) {
    let mut options = options("cut-rounds", tls);
    // Alarms of actors whose node lapsed are found by the others' sweep.
    options.extra_args = vec!["--alarm-sweep".into(), "1s".into()];
    crate::run(options, rounds_body).await
}

/// What one request may have done.
#[derive(Debug)]
enum Outcome {
    /// 200, from the node named.
    Acked(String),
    /// 503 with Retry-After: nothing applied.
    Refused(String),
    /// 504 `outcome_unknown`, or no answer: may have applied.
    Uncertain(String),
    /// Anything else.
    Unclean(String),
}

fn judge(outcome: anyhow::Result<Resp>) -> Outcome {
    match outcome {
        Ok(r) if r.status == 200 => Outcome::Acked(r.node().unwrap_or("?").to_owned()),
        Ok(r) if r.status == 503 && r.header("retry-after").is_some() => Outcome::Refused(r.text()),
        Ok(r) if r.status == 504 && r.text().contains("outcome_unknown") => {
            Outcome::Uncertain(r.text())
        }
        Ok(r) => Outcome::Unclean(format!("{} {}", r.status, r.text())),
        Err(e) => Outcome::Uncertain(format!("{e:#}")),
    }
}

/// Replaces the digits of actor names and node addresses in an answer, so
/// answers that differ only there count together.
fn shape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut digits = false;
    for ch in text.trim().chars() {
        if ch.is_ascii_digit() {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            digits = false;
            out.push(ch);
        }
    }
    out
}

/// What the load saw for one actor.
#[derive(Debug, Default, Clone)]
struct Tally {
    acked: u64,
    uncertain: u64,
    refused: u64,
}

/// One acknowledged increment: when it was sent, and the node that ran it.
#[derive(Debug, Clone)]
struct Served {
    actor: usize,
    sent: Instant,
    ran_on: String,
}

/// Clients incrementing [`ACTORS`] counters through every node, one
/// client per actor, each sending to the nodes in turn.
struct Load<'a> {
    c: &'a Cluster,
    stop: AtomicBool,
    tallies: Mutex<Vec<Tally>>,
    served: Mutex<Vec<Served>>,
    /// Answers that were neither 200, 503 nor uncertain, by shape.
    unclean: Mutex<BTreeMap<String, u64>>,
    /// Why requests were refused or uncertain, by shape (for the report).
    reasons: Mutex<BTreeMap<String, u64>>,
}

fn actor_path(a: usize, rest: &str) -> String {
    format!("/t/counter/p{a}{rest}")
}

impl<'a> Load<'a> {
    fn new(c: &'a Cluster) -> Self {
        Load {
            c,
            stop: AtomicBool::new(false),
            tallies: Mutex::new(vec![Tally::default(); ACTORS]),
            served: Mutex::new(Vec::new()),
            unclean: Mutex::new(BTreeMap::new()),
            reasons: Mutex::new(BTreeMap::new()),
        }
    }

    /// Claims actor `a` through node `a % nodes` (one acknowledged increment).
    async fn place(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + PHASE_TIME_MAX;
        for a in 0..ACTORS {
            let i = a % self.c.len();
            let path = actor_path(a, "/increment");
            let sent = Instant::now();
            let r = self.c.send_retrying(i, "POST", &path, deadline).await?;
            ensure!(
                r.status == 200 && r.node() == Some(self.c.node_id(i)),
                "placing p{a} on node {i}: {} from {:?}: {}",
                r.status,
                r.node(),
                r.text()
            );
            self.record(a, sent, i, Outcome::Acked(self.c.node_id(i).to_owned()));
        }
        Ok(())
    }

    fn record(&self, a: usize, sent: Instant, via: usize, outcome: Outcome) {
        let mut tallies = self.tallies.lock();
        let tally = &mut tallies[a];
        match outcome {
            Outcome::Acked(ran_on) => {
                tally.acked += 1;
                self.served.lock().push(Served {
                    actor: a,
                    sent,
                    ran_on,
                });
            }
            Outcome::Refused(why) => {
                tally.refused += 1;
                *self
                    .reasons
                    .lock()
                    .entry(format!("503 via node {via}: {}", shape(&why)))
                    .or_default() += 1;
            }
            Outcome::Uncertain(why) => {
                tally.uncertain += 1;
                *self
                    .reasons
                    .lock()
                    .entry(format!("uncertain via node {via}: {}", shape(&why)))
                    .or_default() += 1;
            }
            Outcome::Unclean(what) => {
                *self
                    .unclean
                    .lock()
                    .entry(format!("via node {via}: {}", shape(&what)))
                    .or_default() += 1;
            }
        }
    }

    /// One client: increments of actor `a` through the nodes in turn.
    async fn client(&self, a: usize) {
        let path = actor_path(a, "/increment");
        let mut k = a;
        while !self.stop.load(Ordering::SeqCst) {
            let i = k % self.c.len();
            k += 1;
            let sent = Instant::now();
            let url = self.c.url(i, &path);
            let outcome = match tokio::time::timeout(LOAD_REQUEST_TIME_MAX, self.c.http.post(&url))
                .await
            {
                Ok(outcome) => judge(outcome),
                Err(_) => Outcome::Uncertain(format!("no answer within {LOAD_REQUEST_TIME_MAX:?}")),
            };
            let acked = matches!(outcome, Outcome::Acked(_));
            self.record(a, sent, i, outcome);
            if !acked {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// Runs `drive` under the load; the clients stop when it ends.
    async fn during<T>(
        &self,
        drive: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let clients = futures::future::join_all((0..ACTORS).map(|a| self.client(a)));
        let drive = async {
            let result = drive.await;
            self.stop.store(true, Ordering::SeqCst);
            result
        };
        let (_, driven) = tokio::join!(clients, drive);
        driven
    }

    fn totals(&self) -> Tally {
        self.tallies
            .lock()
            .iter()
            .fold(Tally::default(), |sum, t| Tally {
                acked: sum.acked + t.acked,
                uncertain: sum.uncertain + t.uncertain,
                refused: sum.refused + t.refused,
            })
    }

    /// Waits until every actor has `more` acknowledged increments beyond now.
    async fn wait_for_acks(&self, more: u64) -> anyhow::Result<()> {
        let base: Vec<u64> = self.tallies.lock().iter().map(|t| t.acked).collect();
        wait_until("acknowledged increments of every actor", async || {
            Ok(self
                .tallies
                .lock()
                .iter()
                .zip(&base)
                .all(|(t, b)| t.acked >= b + more))
        })
        .await
    }

    /// The node that ran actor `a`'s latest acknowledged increment.
    fn last_runner(&self, a: usize) -> Option<String> {
        self.served
            .lock()
            .iter()
            .rev()
            .find(|s| s.actor == a)
            .map(|s| s.ran_on.clone())
    }

    /// Actors whose latest acknowledged increment ran on `node`.
    fn held_by(&self, node: &str) -> Vec<usize> {
        (0..ACTORS)
            .filter(|&a| self.last_runner(a).as_deref() == Some(node))
            .collect()
    }

    /// Acknowledged increments sent in `from..until` that ran on `node`.
    fn served_by(&self, node: &str, from: Instant, until: Instant) -> Vec<Served> {
        self.served
            .lock()
            .iter()
            .filter(|s| s.ran_on == node && s.sent >= from && s.sent < until)
            .cloned()
            .collect()
    }

    /// After the load: every counter holds its acknowledged increments and
    /// at most its uncertain ones more, and every answer was clean.
    async fn check(&self) -> anyhow::Result<Vec<u64>> {
        let unclean = self.unclean.lock().clone();
        ensure!(
            unclean.is_empty(),
            "answers that were neither 200, 503 with Retry-After nor uncertain: {unclean:#?}"
        );
        let deadline = Instant::now() + PHASE_TIME_MAX;
        let mut values = Vec::new();
        for a in 0..ACTORS {
            let r = self
                .c
                .send_retrying(a % self.c.len(), "GET", &actor_path(a, "/value"), deadline)
                .await?;
            ensure!(r.status == 200, "value of p{a}: {} {}", r.status, r.text());
            let value = r.count()?;
            let tally = self.tallies.lock()[a].clone();
            ensure!(
                value >= tally.acked,
                "p{a}: value {value} < {} acknowledged increments: an acknowledged write was lost",
                tally.acked
            );
            let most = tally.acked + tally.uncertain;
            ensure!(
                value <= most,
                "p{a}: value {value} > {most} (acknowledged + uncertain): a refused increment was applied"
            );
            values.push(value);
        }
        Ok(values)
    }

    fn report(&self, what: &str) {
        let totals = self.totals();
        eprintln!(
            "{what}: {} increments acknowledged, {} uncertain, {} refused (503); why: {:#?}",
            totals.acked,
            totals.uncertain,
            totals.refused,
            self.reasons.lock()
        );
    }
}

/// Polls `check` until it is true, failing after [`PHASE_TIME_MAX`].
async fn wait_until(
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {PHASE_TIME_MAX:?} waiting for {what}");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

/// GET `/value` of actor `a` through node `i`: the status and the node
/// that ran it, or `None` without an answer within [`PROBE_TIME_MAX`].
async fn probe(c: &Cluster, i: usize, a: usize) -> Option<(u16, Option<String>)> {
    let url = c.url(i, &actor_path(a, "/value"));
    match tokio::time::timeout(PROBE_TIME_MAX, c.http.get(&url)).await {
        Ok(Ok(r)) => Some((r.status, r.node().map(str::to_owned))),
        _ => None,
    }
}

/// Reads of a cut node's own actors through that node, a round every
/// [`POLL_PERIOD`] from the cut until the heal: a node cut off from the
/// bucket must stop serving them, reads included, within its lease.
struct Reads<'a> {
    c: &'a Cluster,
    i: usize,
    actors: Vec<usize>,
    stop: AtomicBool,
    /// Each round's send time, and whether the node itself answered one of
    /// its reads with 200.
    rounds: Mutex<Vec<(Instant, bool)>>,
}

impl<'a> Reads<'a> {
    fn new(c: &'a Cluster, i: usize, actors: Vec<usize>) -> Self {
        Reads {
            c,
            i,
            actors,
            stop: AtomicBool::new(false),
            rounds: Mutex::new(Vec::new()),
        }
    }

    /// Reads until `drive` ends; returns what it returns.
    async fn during<T>(
        &self,
        drive: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let node = self.c.node_id(self.i);
        let reader = async {
            while !self.stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let answers = futures::future::join_all(
                    self.actors.iter().map(|&a| probe(self.c, self.i, a)),
                )
                .await;
                let own = answers
                    .iter()
                    .any(|answer| matches!(answer, Some((200, Some(ran))) if ran == node));
                self.rounds.lock().push((sent, own));
                tokio::time::sleep(POLL_PERIOD).await;
            }
        };
        let drive = async {
            let result = drive.await;
            self.stop.store(true, Ordering::SeqCst);
            result
        };
        let ((), driven) = tokio::join!(reader, drive);
        driven
    }

    /// Waits for a round sent after `since` that the node answered with
    /// no 200 of its own; returns its send time after `since`.
    async fn wait_stopped(&self, since: Instant) -> anyhow::Result<Duration> {
        let mut stopped = None;
        wait_until("the cut node to stop serving its actors", async || {
            stopped = self
                .rounds
                .lock()
                .iter()
                .find(|(sent, own)| *sent >= since && !own)
                .map(|(sent, _)| sent.duration_since(since));
            Ok(stopped.is_some())
        })
        .await?;
        stopped.context("stopped without a time")
    }

    /// Send times (after `since`) of rounds sent in `from..until` that the
    /// node answered with a 200 of its own.
    fn served(&self, since: Instant, from: Instant, until: Instant) -> Vec<Duration> {
        self.rounds
            .lock()
            .iter()
            .filter(|(sent, own)| *own && *sent >= from && *sent < until)
            .map(|(sent, _)| sent.duration_since(since))
            .collect()
    }
}

/// Waits until each of `actors` is served by a node other than `i`,
/// asked through the others; returns the time since `since`.
async fn wait_served_elsewhere(
    c: &Cluster,
    i: usize,
    actors: &[usize],
    since: Instant,
) -> anyhow::Result<Duration> {
    let node = c.node_id(i).to_owned();
    let others: Vec<usize> = (0..c.len()).filter(|&j| j != i).collect();
    let mut taken = None;
    wait_until("the cut node's actors served elsewhere", async || {
        let pairs = actors
            .iter()
            .flat_map(|&a| others.iter().map(move |&j| (j, a)));
        let answers =
            futures::future::join_all(pairs.map(|(j, a)| async move { (a, probe(c, j, a).await) }))
                .await;
        let all = actors.iter().all(|&a| {
            answers.iter().any(|(b, answer)| {
                *b == a && matches!(answer, Some((200, Some(ran))) if *ran != node)
            })
        });
        if all {
            taken = Some(since.elapsed());
        }
        Ok(all)
    })
    .await?;
    taken.context("served without a time")
}

/// Waits until every node answers 200 for every actor; returns the time
/// since `since`.
async fn wait_all_serve(c: &Cluster, since: Instant) -> anyhow::Result<Duration> {
    let mut served = None;
    wait_until("every node to serve every actor", async || {
        let pairs = (0..c.len()).flat_map(|i| (0..ACTORS).map(move |a| (i, a)));
        let answers = futures::future::join_all(pairs.map(|(i, a)| probe(c, i, a))).await;
        let all = answers
            .iter()
            .all(|answer| matches!(answer, Some((200, _))));
        if all {
            served = Some(since.elapsed());
        }
        Ok(all)
    })
    .await?;
    served.context("served without a time")
}

/// How long a cut between nodes lasts: past a lease (long enough for a
/// lease wrongly tied to the peers to lapse) and past a peer connect's
/// limit (so that forwards on new connections are refused meanwhile).
fn peer_cut_hold(c: &Cluster) -> Duration {
    c.options().lease_ttl + c.options().heartbeat + PEER_CONNECT_TIME_MAX
}

/// The writers of every actor's records, checked one at a time.
async fn writers(c: &Cluster) -> anyhow::Result<Vec<Vec<String>>> {
    let bucket = open_bucket(c).await?;
    let keys = Keys::new(&AppName::new(APP).context("app name")?);
    let mut all = Vec::new();
    for a in 0..ACTORS {
        let id = ActorId::parse(&format!("t/counter/p{a}")).context("actor id")?;
        let history = read_history(&*bucket, &keys, &id).await?;
        let writers = check_one_writer_at_a_time(&history)
            .with_context(|| format!("p{a}: the records in the bucket"))?;
        all.push(writers);
    }
    Ok(all)
}

/// Node 0 is cut off from the bucket (both ways) under load: it stops
/// running its actors within its lease (no 200 of its own for a request
/// sent after cut + TTL), the others take them over, and once healed every
/// node serves every actor again.
async fn bucket_cut_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let lease_ttl = c.options().lease_ttl;
    let net = c.net()?;
    let load = Load::new(c);
    load.place().await?;
    let victim = 0;
    let victim_id = c.node_id(victim).to_owned();
    let (cut_at, heal_at, figures) = load
        .during(async {
            load.wait_for_acks(ACKS_BETWEEN_CUTS).await?;
            let actors = load.held_by(&victim_id);
            ensure!(!actors.is_empty(), "node {victim} holds no actor");
            let reads = Reads::new(c, victim, actors.clone());
            net.cut_bucket(victim, Way::Both)?;
            let cut_at = Instant::now();
            let (stopped, taken, heal_at) = reads
                .during(async {
                    let stopped = reads.wait_stopped(cut_at).await?;
                    let taken = wait_served_elsewhere(c, victim, &actors, cut_at).await?;
                    net.heal()?;
                    Ok((stopped, taken, Instant::now()))
                })
                .await?;
            let stale = reads.served(cut_at, cut_at + lease_ttl + CUT_SLACK, heal_at);
            ensure!(
                stale.is_empty(),
                "node 0 answered reads sent {stale:?} after the cut itself, past its lease \
                 ({lease_ttl:?})"
            );
            let again = wait_all_serve(c, heal_at).await?;
            load.wait_for_acks(ACKS_BETWEEN_CUTS).await?;
            Ok((cut_at, heal_at, (actors, stopped, taken, again)))
        })
        .await?;
    let (actors, stopped, taken, again) = figures;
    load.report("node 0 cut off from the bucket");
    let last_own = load
        .served_by(&victim_id, cut_at, heal_at)
        .iter()
        .map(|s| s.sent.duration_since(cut_at))
        .max();
    eprintln!(
        "node 0 held {actors:?}; the last increment it ran was sent {last_own:?} after the cut; \
         its reads stopped being its own 200s {stopped:?} after the cut (lease TTL \
         {lease_ttl:?}); another node served all of them {taken:?} after the cut; every node \
         served every actor {again:?} after the heal"
    );
    let stale = load.served_by(&victim_id, cut_at + lease_ttl + CUT_SLACK, heal_at);
    ensure!(
        stale.is_empty(),
        "node 0 ran increments sent past its lease ({lease_ttl:?} after the cut): {stale:?}"
    );
    load.check().await?;
    // The records since the newest snapshot: the new owner wrote last
    // (node 0's, if any, come before it: no interleaving).
    let writers = writers(c).await?;
    for &a in &actors {
        ensure!(
            writers[a]
                .last()
                .is_some_and(|w| !w.starts_with(&format!("{victim_id}/"))),
            "p{a}: writers {:?}: node 0 wrote last, though another took the actor over",
            writers[a]
        );
    }
    eprintln!("writers in order: {writers:?}");
    Ok(())
}

/// First, a request through node 1 for node 0's actor while node 0 is cut
/// off from its peers, before any request went from node 1 to node 0 (no
/// connection is open to reuse): the forward never leaves node 1, and is
/// answered 503. Then node 0 is cut off from its peers, both ways, then
/// only what it sends, then only what it receives, each for longer than a
/// lease, under load: forwarded requests across the cut are refused or
/// uncertain, never answered otherwise; every lease stays valid, so no
/// actor changes hands; after each heal every node serves every actor
/// again.
async fn peer_cut_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let hold = peer_cut_hold(c);
    let net = c.net()?;
    let load = Load::new(c);
    load.place().await?;

    for peer in 1..c.len() {
        net.cut_peer(0, peer, Way::Both)?;
    }
    let sent = Instant::now();
    // The client's own limit (20 s) is far above a connect's.
    let outcome = c.http.post(&c.url(1, &actor_path(0, "/increment"))).await;
    let answered = sent.elapsed();
    let outcome = judge(outcome);
    eprintln!("through node 1 to node 0 across the cut: {outcome:?} after {answered:?}");
    ensure!(
        matches!(outcome, Outcome::Refused(_)),
        "a forward to a peer that cannot be reached was answered {outcome:?}, not 503"
    );
    load.record(0, sent, 1, outcome);
    net.heal()?;
    let again = load
        .during(async {
            let mut again = Vec::new();
            for way in [Way::Both, Way::Out, Way::In] {
                load.wait_for_acks(ACKS_BETWEEN_CUTS).await?;
                for peer in 1..c.len() {
                    net.cut_peer(0, peer, way)?;
                }
                tokio::time::sleep(hold).await;
                net.heal()?;
                let heal_at = Instant::now();
                again.push((way, wait_all_serve(c, heal_at).await?));
            }
            load.wait_for_acks(ACKS_BETWEEN_CUTS).await?;
            Ok(again)
        })
        .await?;
    load.report("node 0 cut off from its peers");
    eprintln!("every node served every actor again, after the heal of each cut: {again:?}");
    load.check().await?;
    let writers = writers(c).await?;
    for (a, w) in writers.iter().enumerate() {
        ensure!(
            w.len() == 1,
            "p{a}: writers {w:?}: an actor changed hands though every lease stayed valid"
        );
    }
    Ok(())
}

/// A kind of cut, by round.
const ROUND_CUTS: [(&str, Option<Way>, Way); 6] = [
    ("bucket, both ways", Some(Way::Both), Way::Both),
    ("peers, both ways", None, Way::Both),
    ("bucket, node to bucket", Some(Way::Out), Way::Out),
    ("peers, node to peers", None, Way::Out),
    ("bucket, bucket to node", Some(Way::In), Way::In),
    ("peers, peers to node", None, Way::In),
];

/// [`ROUNDS`] rounds of cut and heal under load, each cutting another node
/// in another way; before each cut one alarm is set through every node,
/// due during the cut. Afterwards every acknowledged increment is there,
/// and every acknowledged alarm has fired.
async fn rounds_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let lease_ttl = c.options().lease_ttl;
    let hold = peer_cut_hold(c);
    let net = c.net()?;
    let load = Load::new(c);
    load.place().await?;
    let alarms: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let uncertain_alarms: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let started = Instant::now();
    load.during(async {
        for round in 0..ROUNDS {
            let (what, bucket_way, peer_way) = ROUND_CUTS[round % ROUND_CUTS.len()];
            load.wait_for_acks(ACKS_BETWEEN_CUTS).await?;
            // A node cut from the bucket holds actors to stop serving: the
            // one holding most; peers are cut from each node in turn.
            let victim = match bucket_way {
                Some(_) => (0..c.len())
                    .max_by_key(|&i| (load.held_by(c.node_id(i)).len(), (i + round) % c.len()))
                    .context("no nodes")?,
                None => round % c.len(),
            };
            let victim_id = c.node_id(victim).to_owned();
            let before = load.totals();
            for i in 0..c.len() {
                let actor = format!("t/counter/alarm-r{round}-n{i}");
                if set_alarm(c, i, &actor).await? {
                    alarms.lock().push(actor);
                } else {
                    uncertain_alarms.lock().push(actor);
                }
            }
            let actors = load.held_by(&victim_id);
            ensure!(
                bucket_way.is_none() || !actors.is_empty(),
                "round {round}: node {victim}, to be cut off from the bucket, holds no actor"
            );
            match bucket_way {
                Some(way) => net.cut_bucket(victim, way)?,
                None => {
                    for peer in (0..c.len()).filter(|&p| p != victim) {
                        net.cut_peer(victim, peer, peer_way)?;
                    }
                }
            }
            let cut_at = Instant::now();
            let (stopped, heal_at) = if bucket_way.is_some() {
                let reads = Reads::new(c, victim, actors.clone());
                let (stopped, taken, heal_at) = reads
                    .during(async {
                        let stopped = reads.wait_stopped(cut_at).await?;
                        let taken = wait_served_elsewhere(c, victim, &actors, cut_at).await?;
                        net.heal()?;
                        Ok((stopped, taken, Instant::now()))
                    })
                    .await?;
                let deadline = cut_at + lease_ttl + CUT_SLACK;
                let stale_reads = reads.served(cut_at, deadline, heal_at);
                let stale_writes = load.served_by(&victim_id, deadline, heal_at);
                ensure!(
                    stale_reads.is_empty() && stale_writes.is_empty(),
                    "round {round}: node {victim} served past its lease: reads sent \
                     {stale_reads:?} after the cut, increments {stale_writes:?}"
                );
                (Some((stopped, taken)), heal_at)
            } else {
                tokio::time::sleep(hold).await;
                net.heal()?;
                (None, Instant::now())
            };
            let again = wait_all_serve(c, heal_at).await?;
            let after = load.totals();
            eprintln!(
                "round {round} ({what}, node {victim}): {} acknowledged, {} uncertain, {} refused; \
                 after the cut, (the cut node stopped serving its actors, another served them) \
                 {stopped:?}; every node served every actor {again:?} after the heal",
                after.acked - before.acked,
                after.uncertain - before.uncertain,
                after.refused - before.refused,
            );
        }
        load.wait_for_acks(ACKS_BETWEEN_CUTS).await
    })
    .await?;
    load.report(&format!(
        "{ROUNDS} rounds of cuts in {:?}",
        started.elapsed()
    ));
    load.check().await?;
    let writers = writers(c).await?;
    eprintln!("writers in order: {writers:?}");
    let alarms = alarms.into_inner();
    let uncertain_alarms = uncertain_alarms.into_inner();
    let fired = wait_alarms_fired(c, &alarms).await?;
    eprintln!(
        "alarms: {} acknowledged, all fired ({fired:?} after the last round); {} uncertain: \
         {uncertain_alarms:?}",
        alarms.len(),
        uncertain_alarms.len(),
    );
    Ok(())
}

/// Sets `actor`'s alarm [`ALARM_IN_MS`] ahead through node `i`, retrying
/// 503s: true when acknowledged, false when uncertain.
async fn set_alarm(c: &Cluster, i: usize, actor: &str) -> anyhow::Result<bool> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let path = format!("/{actor}/alarm?in_ms={ALARM_IN_MS}");
    loop {
        let outcome = tokio::time::timeout(LOAD_REQUEST_TIME_MAX, c.http.post(&c.url(i, &path)))
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "no answer within {LOAD_REQUEST_TIME_MAX:?}"
                ))
            });
        match judge(outcome) {
            Outcome::Acked(_) => return Ok(true),
            Outcome::Uncertain(_) => return Ok(false),
            Outcome::Unclean(what) => bail!("setting the alarm of {actor}: {what}"),
            Outcome::Refused(why) => {
                ensure!(
                    Instant::now() < deadline,
                    "setting the alarm of {actor}: still 503 at the deadline: {why}"
                );
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Waits until every actor of `alarms` says its alarm fired (`/alarms`
/// at least 1, through any node).
async fn wait_alarms_fired(c: &Cluster, alarms: &[String]) -> anyhow::Result<Duration> {
    let since = Instant::now();
    let mut k = 0;
    for actor in alarms {
        let path = format!("/{actor}/alarms");
        let mut fired = false;
        wait_until(&format!("the alarm of {actor} to fire"), async || {
            k += 1;
            let r = c.http.get(&c.url(k % c.len(), &path)).await;
            if let Ok(r) = r
                && r.status == 200
            {
                fired = r.count()? >= 1;
            }
            Ok(fired)
        })
        .await?;
    }
    Ok(since.elapsed())
}

//! kill -9 of the node that owns busy actors: after its lease runs out the
//! survivors serve the actors, and no acknowledged increment is lost.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use parking_lot::Mutex;

use crate::client::{RETRY_PAUSE, Resp};
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

/// Actors tried for the first placement; those on the most common owner are
/// the busy ones.
const CANDIDATES: usize = 12;
const CLIENTS_PER_ACTOR: usize = 2;
/// Acknowledged increments per busy actor before the kill, and after failover.
const ACKS_BEFORE_KILL: u64 = 5;
const ACKS_AFTER_FAILOVER: u64 = 5;
const PHASE_TIME_MAX: Duration = Duration::from_secs(60);

pub async fn killed_owner_is_replaced_with_every_acknowledged_write(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("failover", bucket, tls), body).await
}

#[derive(Debug, Default, Clone)]
struct Tally {
    acked: u64,
    /// Sent before the kill and not acknowledged: may or may not have counted.
    in_flight_at_kill: u64,
    /// Failed (not 503) after the kill: may have counted.
    failed_after_kill: u64,
    acked_after_failover: u64,
    /// First 200 from a node other than the victim after the kill.
    failover_at: Option<Instant>,
    /// Nodes that acknowledged after the kill.
    nodes_after_kill: BTreeMap<String, u64>,
}

struct Load<'a> {
    c: &'a Cluster,
    victim: String,
    survivors: Vec<usize>,
    killed: AtomicBool,
    stop: AtomicBool,
    tallies: Mutex<BTreeMap<String, Tally>>,
}

impl Load<'_> {
    /// One client: sequential increments of `actor` through the survivors.
    async fn client(&self, actor: &str, offset: usize) {
        let path = format!("/t/counter/{actor}/increment");
        let mut k = offset;
        while !self.stop.load(Ordering::SeqCst) {
            let i = self.survivors[k % self.survivors.len()];
            k += 1;
            let before_kill = !self.killed.load(Ordering::SeqCst);
            let outcome = self.c.http.post(&self.c.url(i, &path)).await;
            if !self.record(actor, before_kill, outcome) {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// Counts one answer; true when it was acknowledged.
    fn record(&self, actor: &str, before_kill: bool, outcome: anyhow::Result<Resp>) -> bool {
        let mut tallies = self.tallies.lock();
        let tally = tallies.entry(actor.to_owned()).or_default();
        match outcome {
            Ok(r) if r.status == 200 => {
                tally.acked += 1;
                if !before_kill {
                    let node = r.node().unwrap_or("?").to_owned();
                    if node != self.victim {
                        tally.failover_at.get_or_insert_with(Instant::now);
                        tally.acked_after_failover += 1;
                    }
                    *tally.nodes_after_kill.entry(node).or_default() += 1;
                }
                return true;
            }
            // Not served: nothing written (DESIGN.md, HTTP).
            Ok(r) if r.status == 503 && !before_kill => {}
            _ if before_kill => tally.in_flight_at_kill += 1,
            _ => tally.failed_after_kill += 1,
        }
        false
    }

    async fn wait_for(&self, what: &str, check: impl Fn(&Tally) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + PHASE_TIME_MAX;
        loop {
            {
                let tallies = self.tallies.lock();
                if !tallies.is_empty() && tallies.values().all(&check) {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    bail!("timed out after {PHASE_TIME_MAX:?} waiting for {what}: {tallies:#?}");
                }
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    // Place the candidates, all through the last node, and find their owners.
    let mut by_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let entry = c.len() - 1;
    for a in 0..CANDIDATES {
        let actor = format!("f{a}");
        let r = c
            .send_retrying(
                entry,
                "POST",
                &format!("/t/counter/{actor}/increment"),
                deadline,
            )
            .await?;
        ensure!(
            r.status == 200,
            "first increment of {actor}: {} {}",
            r.status,
            r.text()
        );
        let owner = r.node().context("no x-wasmkeep-node")?.to_owned();
        by_owner.entry(owner).or_default().push(actor);
    }
    let (victim, busy) = by_owner
        .into_iter()
        .max_by_key(|(_, actors)| actors.len())
        .context("no owners")?;
    let victim_index = c.index_of(&victim).context("unknown owner")?;
    let survivors: Vec<usize> = (0..c.len()).filter(|&i| i != victim_index).collect();
    eprintln!("victim {victim} owns {busy:?}");

    let load = Load {
        c,
        victim: victim.clone(),
        survivors,
        killed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        tallies: Mutex::new(
            busy.iter()
                // The placing increment above.
                .map(|a| {
                    (
                        a.clone(),
                        Tally {
                            acked: 1,
                            ..Tally::default()
                        },
                    )
                })
                .collect(),
        ),
    };
    let clients = futures::future::join_all(busy.iter().flat_map(|actor| {
        let load = &load;
        (0..CLIENTS_PER_ACTOR).map(move |k| load.client(actor, k))
    }));
    let driver = async {
        let result = async {
            load.wait_for("increments before the kill", |t| t.acked > ACKS_BEFORE_KILL)
                .await?;
            load.killed.store(true, Ordering::SeqCst);
            let killed_at = Instant::now();
            c.kill9(victim_index);
            load.wait_for("increments served by another node", |t| {
                t.acked_after_failover >= ACKS_AFTER_FAILOVER
            })
            .await?;
            anyhow::Ok(killed_at)
        }
        .await;
        load.stop.store(true, Ordering::SeqCst);
        result
    };
    let (killed_at, _) = tokio::join!(driver, clients);
    let killed_at = killed_at?;

    let tallies = load.tallies.lock().clone();
    for (actor, tally) in &tallies {
        let failover = tally
            .failover_at
            .map(|t| t.duration_since(killed_at))
            .context("no failover time")?;
        let after: Vec<&String> = tally
            .nodes_after_kill
            .keys()
            .filter(|n| **n != victim)
            .collect();
        ensure!(
            after.len() == 1,
            "{actor} was served by {after:?} after the kill: more than one new owner"
        );
        let r = c
            .send_retrying(
                load.survivors[0],
                "GET",
                &format!("/t/counter/{actor}/value"),
                Instant::now() + PHASE_TIME_MAX,
            )
            .await?;
        ensure!(
            r.status == 200,
            "GET value of {actor}: {} {}",
            r.status,
            r.text()
        );
        let value = r.count()?;
        eprintln!(
            "{actor}: failover (kill -9 to first 200 elsewhere) {failover:?}; value {value}, \
             acked {}, in flight at the kill {}, failed after {}",
            tally.acked, tally.in_flight_at_kill, tally.failed_after_kill
        );
        ensure!(
            value >= tally.acked,
            "{actor}: value {value} < {} acknowledged increments: an acknowledged write was lost",
            tally.acked
        );
        let most = tally.acked + tally.in_flight_at_kill + tally.failed_after_kill;
        ensure!(
            value <= most,
            "{actor}: value {value} > {most} (acked + unanswered at the kill + failed after)"
        );
    }
    Ok(())
}

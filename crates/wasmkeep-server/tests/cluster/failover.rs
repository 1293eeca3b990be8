//! kill -9 of the node that owns busy actors: after its lease runs out the
//! survivors serve the actors, and no acknowledged increment is lost. The
//! store's own records then prove one writer at a time: every busy actor's
//! log, read back from the bucket, has no gap after its newest snapshot and
//! never goes back to a writer it left.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use parking_lot::Mutex;

use wasmkeep_bucket::Bucket;
use wasmkeep_types::{ActorId, AppName, Keys};

use crate::client::{RETRY_PAUSE, Resp};
use crate::runner::{APP, BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

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
    let mut new_owners: BTreeMap<String, String> = BTreeMap::new();
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
        new_owners.insert(actor.clone(), after[0].clone());
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

    // The store's records: one writer at a time, for every busy actor.
    let bucket = open_bucket(c).await?;
    let keys = Keys::new(&AppName::new(APP).context("app name")?);
    for actor in &busy {
        let id = ActorId::parse(&format!("t/counter/{actor}")).context("actor id")?;
        let history = read_history(&*bucket, &keys, &id).await?;
        let writers = check_one_writer_at_a_time(&history)
            .with_context(|| format!("{actor}: the store's records"))?;
        eprintln!(
            "{actor}: {} records/snapshots read, writers in order {writers:?}",
            history.len()
        );
        ensure!(
            writers
                .first()
                .is_some_and(|w| w.starts_with(&format!("{victim}/"))),
            "{actor}: the first writer {writers:?} is not the victim {victim}"
        );
        // No snapshot hides the victim's records: a busy actor writes far
        // fewer records here than the store's snapshot threshold (256).
        // The node that acknowledged after the kill wrote last, and the
        // records show exactly the two owners: the victim, then it.
        let new_owner = new_owners.get(actor).context("no new owner")?;
        ensure!(
            writers.len() == 2 && writers[1].starts_with(&format!("{new_owner}/")),
            "{actor}: writers {writers:?}, expected {victim} then {new_owner}"
        );
    }
    // Refused writes are allowed (a stale record fenced is the point); the
    // number is reported, not asserted.
    for &i in &load.survivors {
        let fenced = c.metric(i, "wasmkeep_store_fenced_total").await?;
        eprintln!("{}: wasmkeep_store_fenced_total {fenced:?}", c.node_id(i));
    }
    Ok(())
}

/// One stored object of an actor's history, in sequence order.
#[derive(Debug)]
pub(crate) struct Entry {
    snapshot: bool,
    seq: u64,
    /// `node/incarnation`
    writer: String,
}

/// A client of the cluster's bucket, as its nodes see it.
pub(crate) async fn open_bucket(c: &Cluster) -> anyhow::Result<std::sync::Arc<dyn Bucket>> {
    let url = c.bucket_url();
    match c.options().bucket {
        BucketKind::Folder => wasmkeep_bucket::open(url)
            .await
            .context("opening the folder"),
        BucketKind::SeaweedFs | BucketKind::PrivateSeaweedFs => {
            let rest = url.strip_prefix("s3://").context("an s3 URL")?;
            let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let env = match c.options().bucket {
                BucketKind::SeaweedFs => wasmkeep_testkit::SeaweedFs::shared()
                    .context("the shared SeaweedFS")?
                    .env(),
                _ => bail!("a private SeaweedFS's address is the runner's alone"),
            };
            let bucket = wasmkeep_bucket::S3Bucket::from_env_with(name, prefix, &env)
                .context("an S3 client")?;
            Ok(std::sync::Arc::new(bucket))
        }
    }
}

/// The actor's newest snapshot (if any) and every log record after it,
/// decoded from the bucket. Compaction may delete records between the list
/// and the reads: then it lists again.
pub(crate) async fn read_history(
    bucket: &dyn Bucket,
    keys: &Keys,
    actor: &ActorId,
) -> anyhow::Result<Vec<Entry>> {
    /// Lists tried when compaction keeps deleting what was listed.
    const LIST_ATTEMPTS_MAX: usize = 5;
    'attempt: for _ in 0..LIST_ATTEMPTS_MAX {
        let mut entries = Vec::new();
        let snapshots = bucket.list(&keys.actor_snapshot_prefix(actor)).await?;
        let newest = snapshots
            .iter()
            .filter_map(|m| Keys::parse_seq(&m.key).ok().map(|seq| (seq, &m.key)))
            .max();
        let after = match newest {
            Some((seq, key)) => {
                match decode(bucket, key).await? {
                    Some(entry) => entries.push(entry),
                    None => continue 'attempt,
                }
                seq
            }
            None => 0,
        };
        let mut logs: Vec<(u64, String)> = bucket
            .list(&keys.actor_log_prefix(actor))
            .await?
            .into_iter()
            .filter_map(|m| Keys::parse_seq(&m.key).ok().map(|seq| (seq, m.key)))
            .filter(|(seq, _)| *seq > after)
            .collect();
        logs.sort();
        for (_, key) in &logs {
            match decode(bucket, key).await? {
                Some(entry) => entries.push(entry),
                None => continue 'attempt,
            }
        }
        for entry in &entries {
            ensure!(
                entry.seq >= after,
                "{actor}: a record at {} sorts before the snapshot at {after}",
                entry.seq
            );
        }
        return Ok(entries);
    }
    bail!("{actor}: compaction kept deleting the records listed")
}

/// One object decoded, `None` when it was deleted meanwhile.
async fn decode(bucket: &dyn Bucket, key: &str) -> anyhow::Result<Option<Entry>> {
    let object = match bucket.get(key).await {
        Ok(object) => object,
        Err(wasmkeep_bucket::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {key}")),
    };
    let origin = wasmkeep_store::record_origin(&object.bytes)
        .map_err(|e| anyhow::anyhow!("{key} does not decode: {e}"))?;
    let seq = Keys::parse_seq(key).with_context(|| format!("the seq of {key}"))?;
    ensure!(origin.seq == seq, "{key} says it is record {}", origin.seq);
    Ok(Some(Entry {
        snapshot: origin.snapshot,
        seq,
        writer: format!("{}/{}", origin.writer.node, origin.writer.incarnation),
    }))
}

/// Checks a history read by [`read_history`]: log records contiguous after
/// the snapshot (or from the first record), and writers in runs: once a
/// record of a writer appears, no later record is by one it followed.
/// Returns the writers in order.
pub(crate) fn check_one_writer_at_a_time(history: &[Entry]) -> anyhow::Result<Vec<String>> {
    let mut expected: Option<u64> = None;
    let mut writers: Vec<String> = Vec::new();
    for entry in history {
        if entry.snapshot {
            ensure!(
                expected.is_none(),
                "a snapshot after log records: {history:?}"
            );
        } else {
            let want = expected.unwrap_or(entry.seq);
            ensure!(
                entry.seq == want,
                "log record {} follows {}: a gap",
                entry.seq,
                want.saturating_sub(1)
            );
            ensure!(
                expected.is_some() || entry.seq <= 1,
                "the log starts at {} with no snapshot before it",
                entry.seq
            );
        }
        expected = Some(entry.seq + 1);
        match writers.iter().position(|w| *w == entry.writer) {
            Some(at) if at + 1 == writers.len() => {}
            Some(_) => bail!(
                "record {} by {} after {:?}: writers interleave",
                entry.seq,
                entry.writer,
                writers.last()
            ),
            None => writers.push(entry.writer.clone()),
        }
    }
    ensure!(!history.is_empty(), "no records at all");
    Ok(writers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(snapshot: bool, seq: u64, writer: &str) -> Entry {
        Entry {
            snapshot,
            seq,
            writer: writer.to_owned(),
        }
    }

    #[test]
    fn interleaved_writers_and_gaps_are_caught() {
        let good = [
            entry(true, 4, "a/1"),
            entry(false, 5, "a/1"),
            entry(false, 6, "b/2"),
        ];
        assert_eq!(check_one_writer_at_a_time(&good).unwrap(), ["a/1", "b/2"]);
        let back = [
            entry(false, 1, "a/1"),
            entry(false, 2, "b/2"),
            entry(false, 3, "a/1"),
        ];
        assert!(check_one_writer_at_a_time(&back).is_err());
        let gap = [entry(true, 4, "a/1"), entry(false, 6, "a/1")];
        assert!(check_one_writer_at_a_time(&gap).is_err());
        let headless = [entry(false, 3, "a/1")];
        assert!(check_one_writer_at_a_time(&headless).is_err());
        // A rejoined node is a new writer.
        let rejoined = [
            entry(false, 1, "a/1"),
            entry(false, 2, "a/2"),
            entry(false, 3, "a/1"),
        ];
        assert!(check_one_writer_at_a_time(&rejoined).is_err());
    }
}

//! Going back in time in a cluster (ADR 0076): `actor restore` puts an
//! actor's database of an earlier instant back while clients keep writing
//! through every node (they wait or are answered 503 with Retry-After,
//! nothing else fails), and later increments count from the restored
//! value; an actor nobody holds is restored by a node that acquires it;
//! `actor fork` makes a new actor of an instant; `actor history` lists the
//! instants; a backup to another bucket is incremental and an actor deleted
//! at the source comes back from it; an instant outside a class's window is
//! refused by name.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure};

use crate::deletes::{held, increment};
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

/// What the clients count, by the phase of the restore.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    /// Answered 503 with Retry-After (and sent again).
    refused: AtomicU64,
    /// Acknowledged, sent after the restore returned.
    sent_after: AtomicU64,
    /// Acknowledged, answered after the restore began.
    done_since_start: AtomicU64,
}

const BEFORE: u8 = 0;
const DURING: u8 = 1;
const AFTER: u8 = 2;

/// Longest any phase of these tests may take.
const PHASE_TIME_MAX: Duration = Duration::from_secs(60);

pub async fn an_actor_goes_back_in_time_while_clients_write(tls: bool, bucket: BucketKind) {
    let mut options = ClusterOptions::new("restore", bucket, tls);
    options.nodes = 2;
    // Idle actors hibernate (and release their record) after a second.
    options.extra_args = vec!["--idle-timeout".into(), "1s".into()];
    crate::run(options, restore_body).await
}

async fn value(c: &Cluster, i: usize, actor: &str, deadline: Instant) -> anyhow::Result<u64> {
    c.send_retrying(i, "GET", &format!("/{actor}/value"), deadline)
        .await?
        .count()
}

fn wall_ms() -> anyhow::Result<i64> {
    Ok(i64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// An instant after every write acknowledged so far and before any write
/// sent after it returns, as `--at` takes it (RFC 3339, UTC, to the
/// millisecond), and in ms: it returns once the wall clock has passed it,
/// so no record sealed later can carry its millisecond.
async fn instant() -> anyhow::Result<(String, i64)> {
    let ms = wall_ms()?;
    let text = chrono::DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| anyhow::anyhow!("{ms} ms is out of range"))?
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    while wall_ms()? <= ms {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok((text, ms))
}

async fn restore_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let actor = "t/counter/past";

    // 10 increments through both nodes, then the instant, then 5 more.
    for i in 0..10 {
        increment(c, i % 2, actor, deadline).await?;
    }
    let (at, _) = instant().await?;
    for i in 0..5 {
        ensure!(increment(c, i % 2, actor, deadline).await? == 11 + i as u64);
    }

    // The history lists every record, with times, and says from when.
    let history: serde_json::Value =
        serde_json::from_str(&c.cli(&["actor", "history", actor, "--json"]).await?)?;
    let entries = history["entries"].as_array().cloned().unwrap_or_default();
    ensure!(
        entries.iter().filter(|e| e["kind"] == "record").count() >= 15,
        "{history}"
    );
    ensure!(
        history["restorable_from_ms"].is_null(),
        "the whole log is kept: {history}"
    );

    // A fork of the instant: a new actor, the original untouched.
    c.cli(&["actor", "fork", actor, "t/counter/copy", "--at", &at])
        .await?;
    let copy = value(c, 1, "t/counter/copy", deadline).await?;
    ensure!(
        copy == 10,
        "the fork of the instant after 10 answers {copy}"
    );
    let original = value(c, 0, actor, deadline).await?;
    ensure!(
        original == 15,
        "the original after a fork answers {original}"
    );
    // A fork onto an actor with data is refused, and changes nothing.
    let refused = c
        .cli(&["actor", "fork", actor, "t/counter/copy", "--at", &at])
        .await;
    ensure!(refused.is_err(), "a fork onto data was accepted");
    ensure!(value(c, 1, "t/counter/copy", deadline).await? == 10);

    // The restore while clients increment through both nodes: every answer
    // is 200, or 503 with Retry-After (then sent again).
    let phase = Arc::new(AtomicU8::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut clients = Vec::new();
    for node in 0..2 {
        let (phase, stop, tally) = (Arc::clone(&phase), Arc::clone(&stop), Arc::clone(&tally));
        let url = c.url(node, &format!("/{actor}/increment"));
        let http = c.http.clone();
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let sent_in = phase.load(Ordering::SeqCst);
                tally.sent.fetch_add(1, Ordering::SeqCst);
                let r = http.post(&url).await?;
                match r.status {
                    200 => {
                        if sent_in == AFTER {
                            tally.sent_after.fetch_add(1, Ordering::SeqCst);
                        }
                        if phase.load(Ordering::SeqCst) != BEFORE {
                            tally.done_since_start.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    503 if r.header("retry-after").is_some() => {
                        tally.refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => bail!(
                        "node {node}: an increment was answered {other}: {}",
                        r.text()
                    ),
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    // Clients run before, during and after the restore.
    while tally.sent.load(Ordering::SeqCst) < 20 {
        ensure!(Instant::now() < deadline, "the clients send nothing");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let started = Instant::now();
    phase.store(DURING, Ordering::SeqCst);
    c.cli(&["actor", "restore", actor, "--at", &at]).await?;
    let restore_time = started.elapsed();
    phase.store(AFTER, Ordering::SeqCst);
    while tally.sent_after.load(Ordering::SeqCst) < 20 {
        ensure!(Instant::now() < deadline, "no increments after the restore");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await??;
    }
    let now = value(c, 0, actor, deadline).await?;
    let (after, since_start) = (
        tally.sent_after.load(Ordering::SeqCst),
        tally.done_since_start.load(Ordering::SeqCst),
    );
    // From 10: every increment sent after the restore returned counts,
    // some that ended while it ran may (those that reached the actor after
    // its fence), none that ended before it began.
    ensure!(
        now >= 10 + after && now <= 10 + since_start,
        "restored to 10, then {after} increments acknowledged that were sent after the restore \
         and {since_start} that ended after it began: the value is {now}"
    );
    eprintln!(
        "restore under load: {} increments sent, {} answered 503, {since_start} acknowledged \
         after the restore began, {after} sent after it returned; value {now}; the command took {restore_time:?}",
        tally.sent.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
    );
    // A restore is undone by another: the state just before it is kept.
    let history: serde_json::Value =
        serde_json::from_str(&c.cli(&["actor", "history", actor, "--json"]).await?)?;
    ensure!(history["restorable_from_ms"].is_null(), "{history}");

    // An actor nobody holds (it hibernated): a node acquires it to restore.
    let idle = "t/counter/idle-past";
    for i in 0..3 {
        increment(c, i % 2, idle, deadline).await?;
    }
    let (idle_at, _) = instant().await?;
    increment(c, 0, idle, deadline).await?;
    while held(c, idle).await? {
        ensure!(Instant::now() < deadline, "{idle} never hibernated");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    c.cli(&["actor", "restore", idle, "--at", &idle_at]).await?;
    ensure!(
        increment(c, 1, idle, deadline).await? == 4,
        "counts on from the restored 3"
    );

    // A backup to another bucket (another prefix of the S3 server), twice:
    // the second copies what is new; then the actor is deleted at the
    // source and comes back from the backup.
    let kept = "t/counter/kept";
    for i in 0..5 {
        increment(c, i % 2, kept, deadline).await?;
    }
    let backup_url = format!("{}-backup", c.bucket_url());
    let backup = async || -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &c.cli(&["backup", "--to", &backup_url, "--json"]).await?,
        )?)
    };
    let first = backup().await?;
    let (kept_at, _) = instant().await?;
    for i in 0..3 {
        increment(c, i % 2, kept, deadline).await?;
    }
    let second = backup().await?;
    let copied = |b: &serde_json::Value| b["objects"].as_u64().unwrap_or(0);
    ensure!(
        copied(&second) >= 3
            && copied(&second) < copied(&first)
            && second["skipped"].as_u64() > Some(0),
        "the second backup copies the new records only: first {first}, second {second}"
    );
    c.cli(&["actor", "delete", kept, "--wait"]).await?;
    ensure!(value(c, 0, kept, deadline).await? == 0, "deleted");
    c.cli(&[
        "actor",
        "restore",
        kept,
        "--at",
        &kept_at,
        "--from",
        &backup_url,
    ])
    .await?;
    let back = value(c, 1, kept, deadline).await?;
    ensure!(back == 5, "restored from the backup to {back}, not 5");
    eprintln!("backups: first {first}, second {second}");

    // A class whose window is a second: its old instants are gone, and a
    // restore to one is refused by name and changes nothing.
    let guest = crate::runner::guest("counter")?.display().to_string();
    let cache = crate::runner::data_dir().display().to_string();
    c.cli(&[
        "deploy",
        "brief",
        &guest,
        "--retention",
        "1s",
        "--data-dir",
        &cache,
    ])
    .await?;
    let brief = "t/brief/b";
    // Node 0 loads the new class at its next look at the bucket.
    while c
        .send_retrying(0, "POST", &format!("/{brief}/increment"), deadline)
        .await?
        .status
        == 404
    {
        ensure!(Instant::now() < deadline, "node 0 never loaded the class");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let (brief_at, brief_ms) = instant().await?;
    // Increments until a snapshot the window old was compacted, which
    // takes the instant with it (read-only probes meanwhile).
    loop {
        ensure!(
            Instant::now() < deadline,
            "the instant was never compacted away"
        );
        for _ in 0..100 {
            increment(c, 0, brief, deadline).await?;
        }
        if wall_ms()? - brief_ms < 1_000 {
            continue;
        }
        let probe = c
            .cli(&["actor", "sql", brief, "SELECT 1", "--at", &brief_at])
            .await;
        match probe {
            Ok(_) => {}
            Err(e) if format!("{e:#}").contains("before the oldest instant") => break,
            Err(e) => return Err(e.context("reading an instant of the brief class")),
        }
    }
    let before = value(c, 0, brief, deadline).await?;
    let refused = c.cli(&["actor", "restore", brief, "--at", &brief_at]).await;
    match refused {
        Ok(out) => bail!("an instant outside the window was restored: {out}"),
        Err(e) => ensure!(
            format!("{e:#}").contains("before the oldest instant"),
            "not refused by name: {e:#}"
        ),
    }
    ensure!(
        value(c, 0, brief, deadline).await? == before,
        "the refusal changed the actor"
    );
    Ok(())
}

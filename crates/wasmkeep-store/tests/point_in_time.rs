//! Point-in-time restore (ADR 0076): records carry the time they were
//! sealed, compaction keeps what rebuilds any instant of the retention
//! window, and a reader rebuilds the database of any such instant.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use wasmkeep_cluster::clock::Clock;
use wasmkeep_store::{ActorStore, Error, StoreConfig};
use wasmkeep_types::Keys;

/// A wall clock the test sets (monotonic time is the system's).
#[derive(Debug)]
struct Wall(AtomicI64);

impl Wall {
    fn at(ms: i64) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(ms)))
    }
    fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for Wall {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

const START_MS: i64 = 1_800_000_000_000;

fn timed(clock: &Arc<Wall>, retention: Duration, snapshot_every: u64) -> StoreConfig {
    StoreConfig {
        snapshot_log_records: snapshot_every,
        retention,
        clock: Arc::clone(clock) as Arc<dyn Clock>,
        ..config()
    }
}

async fn count_at(bucket: &Arc<Probe>, name: &str, at_ms: i64) -> Result<i64, Error> {
    let mut reader =
        ActorStore::open_reader_at(bucket.clone(), keys(), actor(name), config(), at_ms).await?;
    Ok(int(&mut reader, "SELECT n FROM c"))
}

fn seqs(bucket: &Probe, prefix: &str) -> Vec<u64> {
    bucket
        .keys_under(prefix)
        .iter()
        .map(|k| Keys::parse_seq(k).expect("a numbered key"))
        .collect()
}

/// One increment a second of the test's clock, each its own record; every
/// instant in between reads the count acknowledged by then, including
/// instants between a snapshot and the records after it.
#[tokio::test]
async fn every_instant_of_the_window_reads_the_count_acknowledged_by_then() {
    let bucket = Probe::new();
    let clock = Wall::at(START_MS);
    let cfg = timed(&clock, Duration::from_secs(3600), 4);
    let mut s = open_with(&bucket, &actor("a"), "n1", cfg).await;
    event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (0)"])
        .await
        .expect("created");
    for i in 1..=20 {
        clock.set(START_MS + i * 1000);
        event(&mut s, &["UPDATE c SET n = n + 1"])
            .await
            .expect("acknowledged");
    }
    s.close().await;
    assert!(
        !seqs(&bucket, &keys().actor_snapshot_prefix(&actor("a"))).is_empty(),
        "snapshots were written"
    );
    for i in 0..=20 {
        // Each increment's record was sealed at START + i s; half a second
        // later it is in, and the next one is not.
        let at = START_MS + i * 1000 + 500;
        assert_eq!(
            count_at(&bucket, "a", at).await.expect("restorable"),
            i,
            "at +{i}.5 s"
        );
    }
    // The instant a record was sealed includes it.
    assert_eq!(
        count_at(&bucket, "a", START_MS + 7000)
            .await
            .expect("restorable"),
        7
    );
    // Before the first record: the database was empty (no table).
    let before =
        ActorStore::open_reader_at(bucket.clone(), keys(), actor("a"), config(), START_MS - 1)
            .await
            .expect("an empty database");
    assert!(before.database_image().is_empty());
    // History: every record and snapshot, each with the time it was sealed.
    let history = ActorStore::history(&*bucket, &keys(), &actor("a"))
        .await
        .expect("history");
    let records: Vec<_> = history.iter().filter(|e| !e.snapshot).collect();
    assert_eq!(records.len(), 21, "{history:?}");
    assert_eq!(
        records.iter().map(|e| e.time_ms).collect::<Vec<_>>(),
        (0..=20).map(|i| START_MS + i * 1000).collect::<Vec<_>>()
    );
    assert!(history.iter().all(|e| e.node == "n1" && e.bytes > 0));
}

/// Past the window, compaction deletes what no instant of the window
/// needs; an instant before it is refused by name, every instant inside
/// it still reads right.
#[tokio::test]
async fn compaction_keeps_the_window_and_deletes_what_is_older() {
    let bucket = Probe::new();
    let clock = Wall::at(START_MS);
    let window = Duration::from_secs(10);
    let cfg = timed(&clock, window, 4);
    let a = actor("w");
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (0)"])
        .await
        .expect("created");
    for i in 1..=40 {
        clock.set(START_MS + i * 1000);
        event(&mut s, &["UPDATE c SET n = n + 1"])
            .await
            .expect("acknowledged");
    }
    s.close().await;
    let now = START_MS + 40_000;
    let logs = seqs(&bucket, &keys().actor_log_prefix(&a));
    assert!(!logs.contains(&1), "the oldest records went: {logs:?}");
    // Every instant of the window (and a little before: the base snapshot
    // may be older) reads right.
    for i in 30..=40 {
        let at = START_MS + i * 1000 + 500;
        assert_eq!(
            count_at(&bucket, "w", at).await.expect("in the window"),
            i,
            "at +{i}.5 s"
        );
    }
    match count_at(&bucket, "w", START_MS + 1500).await {
        Err(Error::NotRestorable {
            at_ms,
            oldest_ms: Some(oldest),
            ..
        }) => {
            assert_eq!(at_ms, START_MS + 1500);
            assert!(
                oldest <= now - 10_000,
                "the window is kept: oldest {oldest}"
            );
        }
        other => panic!("an instant before the window: {other:?}"),
    }
    // The present is what it was.
    let mut s = open_with(&bucket, &a, "n1", config()).await;
    assert_eq!(int(&mut s, "SELECT n FROM c"), 40);
}

/// Without a window (0) compaction deletes everything a snapshot covers,
/// as before records had times.
#[tokio::test]
async fn no_window_keeps_only_the_present() {
    let bucket = Probe::new();
    let clock = Wall::at(START_MS);
    let a = actor("z");
    let mut s = open_with(&bucket, &a, "n1", timed(&clock, Duration::ZERO, 4)).await;
    event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (0)"])
        .await
        .expect("created");
    for i in 1..=9 {
        clock.set(START_MS + i * 1000);
        event(&mut s, &["UPDATE c SET n = n + 1"])
            .await
            .expect("acknowledged");
    }
    s.close().await;
    let snapshots = seqs(&bucket, &keys().actor_snapshot_prefix(&a));
    let logs = seqs(&bucket, &keys().actor_log_prefix(&a));
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(
        logs.iter().all(|s| *s > snapshots[0]),
        "{logs:?} after {snapshots:?}"
    );
    assert!(matches!(
        count_at(&bucket, "z", START_MS + 1500).await,
        Err(Error::NotRestorable { .. })
    ));
    assert_eq!(
        count_at(&bucket, "z", START_MS + 9500).await.expect("now"),
        9
    );
}

/// A replace (`actor import`, `actor restore`) within a window keeps the
/// database it replaced restorable; a delete keeps nothing.
#[tokio::test]
async fn a_replaced_database_stays_restorable_and_a_deleted_one_does_not() {
    let bucket = Probe::new();
    let clock = Wall::at(START_MS);
    let cfg = timed(&clock, Duration::from_secs(3600), 4);
    let a = actor("r");
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (5)"])
        .await
        .expect("created");
    let image = s.database_image();
    for i in 1..=6 {
        clock.set(START_MS + i * 1000);
        event(&mut s, &["UPDATE c SET n = n + 1"])
            .await
            .expect("acknowledged");
    }
    s.close().await;
    // Put the first state back (what `actor restore` does), at +10 s.
    clock.set(START_MS + 10_000);
    let image = wasmkeep_store::Image::from_file(&image, u64::MAX, None).expect("a good image");
    wasmkeep_store::replace(&*bucket, &keys(), &a, &writer("n2"), &cfg, &image)
        .await
        .expect("replaced");
    assert_eq!(
        count_at(&bucket, "r", START_MS + 10_500)
            .await
            .expect("now"),
        5
    );
    assert_eq!(
        count_at(&bucket, "r", START_MS + 6_500)
            .await
            .expect("before"),
        11
    );
    assert_eq!(
        count_at(&bucket, "r", START_MS + 3_500)
            .await
            .expect("before"),
        8
    );
    // A delete is for good.
    clock.set(START_MS + 20_000);
    wasmkeep_store::erase(&*bucket, &keys(), &a, &writer("n2"), &cfg)
        .await
        .expect("erased");
    assert!(matches!(
        count_at(&bucket, "r", START_MS + 6_500).await,
        Err(Error::NotRestorable { .. })
    ));
}

/// An actor whose window keeps thousands of records activates from two
/// listings, its snapshots and its log after the newest (not the whole
/// window), and reads the newest snapshot and the records after it (the
/// probe counts a listing of all pages as one request).
#[tokio::test]
async fn an_activation_reads_the_newest_snapshot_and_the_log_after_it() {
    let bucket = Probe::new();
    let clock = Wall::at(START_MS);
    let cfg = timed(&clock, Duration::from_secs(3600), 256);
    let a = actor("long");
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (0)"])
        .await
        .expect("created");
    for i in 1..=2_500 {
        clock.set(START_MS + i);
        event(&mut s, &["UPDATE c SET n = n + 1"])
            .await
            .expect("acknowledged");
    }
    s.close().await;
    let records = seqs(&bucket, &keys().actor_log_prefix(&a)).len();
    assert_eq!(records, 2_501, "the window keeps every record");
    let (lists, gets) = (bucket.lists(), bucket.gets());
    let mut s = open_with(&bucket, &a, "n2", cfg).await;
    assert_eq!(int(&mut s, "SELECT n FROM c"), 2_500);
    assert_eq!(
        bucket.lists() - lists,
        2,
        "the snapshots, then the log after the newest"
    );
    // The newest snapshot (at 2,304) and the 197 records after it.
    assert_eq!(bucket.gets() - gets, 1 + 197);
    s.close().await;
}

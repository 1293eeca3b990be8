//! Durability of an actor's database in the bucket: restore, group commit,
//! fencing, failures at each step of a commit, corruption, snapshots, alarms.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use wasmkeep_bucket::{Bucket, Fault, MemoryBucket, hinted};
use wasmkeep_store::{ActorStore, Error, SqlValue, StoreConfig};
use wasmkeep_types::Keys;

use common::*;

#[tokio::test]
async fn restore_round_trip_keeps_schema_data_and_nondeterministic_values() {
    let bucket = Probe::new();
    let a = actor("round-trip");
    let mut s = open(&bucket, &a, "n1").await;
    event(
        &mut s,
        &[
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, r INTEGER)",
            "CREATE INDEX items_name ON items(name)",
            "CREATE TABLE log (msg TEXT)",
            "CREATE TRIGGER items_log AFTER INSERT ON items BEGIN INSERT INTO log VALUES ('added ' || new.name); END",
            "CREATE VIEW names AS SELECT name FROM items ORDER BY name",
        ],
    )
    .await
    .unwrap();
    s.begin_event().unwrap();
    for i in 0..50 {
        s.execute(
            "INSERT INTO items (name, r) VALUES (?1, random())",
            &[SqlValue::Text(format!("item-{i:03}"))],
        )
        .unwrap();
    }
    s.commit_event().unwrap().await.unwrap();
    let before = s
        .query("SELECT id, name, r FROM items ORDER BY id", &[])
        .unwrap();
    drop(s);

    let mut s = open(&bucket, &a, "n2").await;
    let after = s
        .query("SELECT id, name, r FROM items ORDER BY id", &[])
        .unwrap();
    assert_eq!(
        before, after,
        "random() values are kept as written (pages, not SQL replay)"
    );
    assert_eq!(
        int(&mut s, "SELECT count(*) FROM log"),
        50,
        "the trigger ran once per insert"
    );
    assert_eq!(int(&mut s, "SELECT count(*) FROM names"), 50);
    let check = s.query("PRAGMA integrity_check", &[]).unwrap();
    assert_eq!(check.rows, vec![vec![SqlValue::Text("ok".into())]]);
    s.commit_event().unwrap().await.unwrap();
}

#[tokio::test]
async fn an_actor_that_never_wrote_has_no_data_in_the_bucket() {
    let bucket = Probe::new();
    let a = actor("reader");
    let mut s = open(&bucket, &a, "n1").await;
    assert_eq!(s.query("SELECT 1", &[]).unwrap().rows.len(), 1);
    s.commit_event().unwrap().await.unwrap();
    s.flush().await.unwrap();
    assert!(!ActorStore::exists(&*bucket, &keys(), &a).await.unwrap());
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    assert!(ActorStore::exists(&*bucket, &keys(), &a).await.unwrap());
}

#[tokio::test]
async fn opening_an_actor_costs_two_listings_and_skips_keys_of_unknown_kinds() {
    let bucket = Probe::new();
    let a = actor("two-listings");
    let s = open(&bucket, &a, "n1").await;
    // Its snapshots, then its log after the newest (ADR 0076).
    assert_eq!(
        (bucket.requests(), bucket.lists()),
        (2, 2),
        "a new actor's open is two listings and nothing else"
    );
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (7)"])
        .await
        .unwrap();
    s.close().await;
    // A kind of object a later version might keep beside the log.
    let stray = format!("{}meta/0001", keys().actor_prefix(&a));
    bucket
        .put(&stray, Bytes::from_static(b"not a record"))
        .await
        .unwrap();
    let before = bucket.requests();
    let mut s = open(&bucket, &a, "n2").await;
    assert_eq!(int(&mut s, "SELECT x FROM t"), 7);
    assert_eq!(
        bucket.requests() - before,
        3,
        "two listings and one record read"
    );
}

#[tokio::test]
async fn read_only_events_write_nothing_and_are_ready_at_once() {
    let bucket = Probe::new();
    let a = actor("ro");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"])
        .await
        .unwrap();
    let puts = bucket.puts();
    for _ in 0..20 {
        s.begin_event().unwrap();
        assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 1);
        let gate = s.commit_event().unwrap();
        assert!(
            gate.is_open(),
            "a read with nothing pending is open at once"
        );
        assert!(
            matches!(gate.now_or_never(), Some(Ok(()))),
            "a read with nothing pending waits for nothing"
        );
    }
    assert_eq!(bucket.puts(), puts, "read-only events wrote to the bucket");
    let write = event(&mut s, &["INSERT INTO t VALUES (2)"]);
    assert!(!write.is_open(), "a write's gate waits for its record");
    write.await.unwrap();
}

#[tokio::test]
async fn a_read_waits_for_the_pending_write_it_may_have_seen() {
    let bucket = Probe::new();
    let a = actor("ro-wait");
    let mut s = open(&bucket, &a, "n1").await;
    bucket.hold_log_puts();
    let write = event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"]);
    s.begin_event().unwrap();
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 1);
    let mut read = s.commit_event().unwrap();
    assert!(!read.is_open(), "the read saw a write that is not durable");
    bucket.log_puts_entered(1).await;
    assert!(
        (&mut read).now_or_never().is_none(),
        "the read saw data that is not durable yet"
    );
    bucket.release();
    read.await.unwrap();
    write.await.unwrap();
}

#[tokio::test]
async fn group_commit_puts_events_committed_during_a_write_into_one_record() {
    let bucket = Probe::new();
    let a = actor("group");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let log_prefix = keys().actor_log_prefix(&a);
    assert_eq!(bucket.keys_under(&log_prefix).len(), 1);

    bucket.hold_log_puts();
    let first = event(&mut s, &["INSERT INTO t VALUES (0)"]);
    bucket.log_puts_entered(2).await; // record 2 is in flight, held
    let mut later = Vec::new();
    for i in 1..=32 {
        later.push(event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")]));
    }
    assert_eq!(
        bucket.keys_under(&log_prefix).len(),
        1,
        "nothing lands while held"
    );
    bucket.release();
    first.await.unwrap();
    for g in later {
        g.await.unwrap();
    }
    assert_eq!(
        bucket.keys_under(&log_prefix).len(),
        3,
        "32 events committed during one write must land in ONE next record"
    );
    drop(s);
    let mut s = open(&bucket, &a, "n2").await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 33);
}

/// A lone writer's snapshot is put unhurried, so that the bucket may flush
/// it with the writer's next record (ADR 0041). One that follows a record
/// of several events is put at once: the flusher then lingers for the
/// writers it released, and the next record may be a while.
#[tokio::test]
async fn a_lone_writers_snapshots_are_unhurried_and_a_groups_are_not() {
    let bucket = Probe::new();
    let a = actor("haste");
    let config = StoreConfig {
        snapshot_log_records: 2,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", config).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    event(&mut s, &["INSERT INTO t VALUES (0)"]).await.unwrap();
    s.flush().await.unwrap();
    let snapshot = |seq| keys().actor_snapshot(&a, seq);
    assert_eq!(bucket.snapshot_puts(), [(snapshot(2), true)]);

    // Record 3 is held with three events queued behind it: record 4 holds
    // all three, and its snapshot goes at once.
    one_record_then_a_group(&bucket, &mut s, 2).await;
    s.flush().await.unwrap();
    assert_eq!(
        bucket.snapshot_puts(),
        [(snapshot(2), true), (snapshot(4), false)]
    );
}

/// An event's record (the bucket's log put after `log_puts_before`) is held
/// while three more events commit behind it; then all are released and
/// answered (the next record holds the three). Rows 1 to 4 of `t`.
async fn one_record_then_a_group(bucket: &Probe, s: &mut ActorStore, log_puts_before: u64) {
    bucket.hold_log_puts();
    let first = event(s, &["INSERT INTO t VALUES (1)"]);
    bucket.log_puts_entered(log_puts_before + 1).await;
    let later: Vec<_> = (2..=4)
        .map(|i| event(s, &[&format!("INSERT INTO t VALUES ({i})")]))
        .collect();
    bucket.release();
    first.await.expect("the first record is written");
    for gate in later {
        gate.await.expect("the group's record is written");
    }
}

/// A record of one event with nothing queued behind it is put as a lone
/// writer's (ADR 0045: the folder may commit it on the writer's thread); a
/// record of several events is not.
#[tokio::test]
async fn a_lone_events_record_is_put_alone_and_a_groups_is_not() {
    let bucket = Probe::new();
    let a = actor("alone");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let before = bucket.log_puts().len();

    // Record n holds one event, alone; three more events queue behind it
    // while it is held, and record n + 1 holds them all.
    one_record_then_a_group(&bucket, &mut s, before as u64).await;
    event(&mut s, &["INSERT INTO t VALUES (5)"]).await.unwrap();
    let log = bucket.log_puts();
    let log_key = |seq| keys().actor_log(&a, seq);
    assert!(log[..before].iter().all(|(_, alone)| *alone), "{log:?}");
    // Sequence numbers start at 1.
    let n = before as u64 + 1;
    assert_eq!(
        log[before..],
        [
            (log_key(n), true),
            (log_key(n + 1), false),
            (log_key(n + 2), true)
        ]
    );
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 5);
}

#[tokio::test(start_paused = true)]
async fn the_next_record_lingers_for_the_writers_the_last_one_released() {
    // A bucket that takes 1 ms (virtual time) per request.
    let memory = MemoryBucket::new();
    memory
        .faults()
        .set_latency(Duration::from_millis(1), Duration::ZERO);
    let bucket = Probe::over(memory);
    let a = actor("linger");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let log_prefix = keys().actor_log_prefix(&a);
    let records_before = bucket.keys_under(&log_prefix).len();

    // Eight closed-loop writers: writer 0's event goes out alone, the other
    // seven are committed while it is in flight.
    let first = event(&mut s, &["INSERT INTO t VALUES (0)"]);
    // The flusher takes writer 0's record before the others commit.
    bucket.log_puts_entered(records_before as u64 + 1).await;
    let mut waiting: Vec<_> = (1..8)
        .map(|i| event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")]))
        .collect();
    first.await.unwrap();
    // Writer 0 got its answer and sends its next event at once: it joins the
    // seven in the next record instead of starting a record of its own after.
    waiting.push(event(&mut s, &["INSERT INTO t VALUES (8)"]));
    let complete = tokio::time::Instant::now();
    for gate in waiting {
        gate.await.unwrap();
    }
    // The event that completed the group woke the flusher: the record went
    // out at once (one bucket request, 1 ms), not at the linger's deadline
    // (0.5 ms later). Virtual time: this is the flusher's logic, not speed.
    assert_eq!(complete.elapsed(), Duration::from_millis(1));
    assert_eq!(
        bucket.keys_under(&log_prefix).len() - records_before,
        2,
        "eight writers in two records (1, then 7 + the one that came back)"
    );
    event(&mut s, &["INSERT INTO t VALUES (9)"]).await.unwrap();
    event(&mut s, &["INSERT INTO t VALUES (10)"]).await.unwrap();
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 11);
}

#[tokio::test]
async fn the_second_writer_is_fenced_and_none_of_its_writes_survive() {
    let bucket = Probe::new();
    let a = actor("fence");
    let mut first = open(&bucket, &a, "n1").await;
    event(&mut first, &["CREATE TABLE t (who TEXT)"])
        .await
        .unwrap();
    let mut second = open(&bucket, &a, "n2").await;

    event(&mut first, &["INSERT INTO t VALUES ('first')"])
        .await
        .unwrap();
    let lost = event(&mut second, &["INSERT INTO t VALUES ('second')"]).await;
    assert!(matches!(lost, Err(Error::Fenced { .. })), "got {lost:?}");
    assert!(second.is_fenced());
    let later = second.begin_event();
    assert!(
        matches!(later, Err(Error::Fenced { .. })),
        "a fenced store refuses events: {later:?}"
    );
    assert!(!first.is_fenced());
    event(&mut first, &["INSERT INTO t VALUES ('first again')"])
        .await
        .unwrap();

    let mut third = open(&bucket, &a, "n3").await;
    let rows = third
        .query("SELECT who FROM t ORDER BY rowid", &[])
        .unwrap();
    assert_eq!(
        rows.rows,
        vec![
            vec![SqlValue::Text("first".into())],
            vec![SqlValue::Text("first again".into())]
        ]
    );
}

/// A former holder's record in flight while a new holder opens the actor
/// (ADR 0062): the new holder fences the log before it answers, so the
/// record either lands first, and the fence makes the new holder restore
/// it, or never lands. No answer of the new holder misses a record that
/// is in the log, and a record refused is never read by anyone.
#[tokio::test]
async fn a_fenced_open_either_reads_a_late_record_or_keeps_it_out() {
    for late_lands_first in [false, true] {
        let bucket = Probe::new();
        let a = actor(if late_lands_first {
            "late-in"
        } else {
            "late-out"
        });
        let mut former = open(&bucket, &a, "n1").await;
        event(&mut former, &["CREATE TABLE t (who TEXT)"])
            .await
            .unwrap();
        // The former holder's next record reaches the bucket and hangs
        // there (a paused process, a slow request).
        bucket.hold_log_puts();
        let late = event(&mut former, &["INSERT INTO t VALUES ('late')"]);
        let late = tokio::spawn(late);
        bucket.log_puts_entered(2).await;

        let other = bucket.client(1);
        let mut next = open(&other, &a, "n2").await;
        if late_lands_first {
            // It lands after the restore, before the fence is written.
            bucket.release();
            late.await.unwrap().expect("the late record lands");
            next.fence_log();
            // The read that missed the record is not answered: the fence
            // fails, and the store must be reopened.
            assert_eq!(int(&mut next, "SELECT count(*) FROM t"), 0);
            let gate = next.commit_event().expect("commit");
            assert!(matches!(gate.await, Err(Error::Fenced { .. })));
            let mut again = open(&other, &a, "n2").await;
            again.fence_log();
            assert_eq!(int(&mut again, "SELECT count(*) FROM t"), 1);
            again.commit_event().expect("commit").await.unwrap();
            event(&mut again, &["INSERT INTO t VALUES ('next')"])
                .await
                .unwrap();
        } else {
            next.fence_log();
            // Even a read waits for the fence.
            assert_eq!(int(&mut next, "SELECT count(*) FROM t"), 0);
            let gate = next.commit_event().expect("commit");
            assert!(!gate.is_open());
            gate.await.expect("the fence lands first");
            bucket.release();
            let refused = late.await.unwrap();
            assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
            event(&mut next, &["INSERT INTO t VALUES ('next')"])
                .await
                .unwrap();
        }
        let mut reader = open(&bucket, &a, "n3").await;
        let rows = reader
            .query("SELECT who FROM t ORDER BY rowid", &[])
            .unwrap();
        let expected: Vec<Vec<SqlValue>> = if late_lands_first {
            vec![
                vec![SqlValue::Text("late".into())],
                vec![SqlValue::Text("next".into())],
            ]
        } else {
            vec![vec![SqlValue::Text("next".into())]]
        };
        assert_eq!(
            rows.rows, expected,
            "late record landed first: {late_lands_first}"
        );
    }
}

/// `wasmkeep actor delete`: the erased log keeps its sequence numbers
/// taken, so a former holder still running is fenced at its next record
/// (a freed number would have let it land and be restored into the
/// actor's next life), and the actor restores empty with its log going on
/// after the fence.
#[tokio::test]
async fn an_erased_actor_fences_its_former_writer_and_restores_empty() {
    let bucket = Probe::new();
    let a = actor("erased");
    let small = StoreConfig {
        snapshot_log_records: 3,
        ..config()
    };
    let mut former = open_with(&bucket, &a, "n1", small).await;
    event(&mut former, &["CREATE TABLE t (x)"]).await.unwrap();
    for i in 0..5 {
        event(&mut former, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
    }
    former.flush().await.unwrap();
    let prefix = keys().actor_prefix(&a);
    let fence = wasmkeep_store::erase(&*bucket, &keys(), &a, &writer("n2"), &config())
        .await
        .unwrap();
    assert_eq!(fence, 7, "six records, then the fence");
    assert_eq!(
        bucket.keys_under(&prefix),
        [keys().actor_log(&a, 7), keys().actor_snapshot(&a, 7)],
        "only the fence and its empty snapshot stay"
    );

    let late = event(&mut former, &["INSERT INTO t VALUES (99)"]).await;
    assert!(
        matches!(late, Err(Error::Fenced { seq: 7, .. })),
        "got {late:?}"
    );

    let mut next = open(&bucket, &a, "n3").await;
    assert_eq!(int(&mut next, "SELECT count(*) FROM sqlite_master"), 0);
    event(
        &mut next,
        &["CREATE TABLE u (y)", "INSERT INTO u VALUES (1)"],
    )
    .await
    .unwrap();
    drop(next);
    assert!(
        bucket
            .keys_under(&prefix)
            .contains(&keys().actor_log(&a, 8))
    );
    let mut again = open(&bucket, &a, "n4").await;
    assert_eq!(int(&mut again, "SELECT sum(y) FROM u"), 1);
    assert_eq!(
        int(
            &mut again,
            "SELECT count(*) FROM sqlite_master WHERE name = 't'"
        ),
        0
    );
}

/// `wasmkeep actor import` (ADR 0069): another actor's exported database
/// takes the place of this one's as a delete empties it: the former writer
/// is fenced, the actor restores as the image with its alarm, the log
/// record alone restores it too (should the snapshot be lost), and
/// [`wasmkeep_store::imported`] tells the import's own data from other data.
#[tokio::test]
async fn an_imported_image_replaces_the_data_and_fences_the_former_writer() {
    use wasmkeep_store::{Image, Imported, imported};
    let bucket = Probe::new();
    let (source, target) = (actor("source"), actor("target"));
    let mut s = open(&bucket, &source, "n1").await;
    s.begin_event().unwrap();
    s.execute("CREATE TABLE t (x)", &[]).unwrap();
    s.execute("INSERT INTO t VALUES (41), (1)", &[]).unwrap();
    s.set_alarm(Some(1_700_000_000_123)).unwrap();
    s.commit_event().unwrap().await.unwrap();
    let file = s.database_image();
    drop(s);

    assert_eq!(
        imported(&*bucket, &keys(), &target, "00ff").await.unwrap(),
        Imported::Empty
    );
    let mut former = open(&bucket, &target, "n1").await;
    event(&mut former, &["CREATE TABLE mine (y)"])
        .await
        .unwrap();
    former.flush().await.unwrap();
    assert_eq!(
        imported(&*bucket, &keys(), &target, "00ff").await.unwrap(),
        Imported::Other
    );

    let image = Image::from_file(&file, 1 << 30, Some("00ff")).unwrap();
    let fence =
        wasmkeep_store::replace(&*bucket, &keys(), &target, &writer("n2"), &config(), &image)
            .await
            .unwrap();
    assert_eq!(fence, 2, "one record, then the fence");
    let late = event(&mut former, &["INSERT INTO mine VALUES (1)"]).await;
    assert!(
        matches!(late, Err(Error::Fenced { seq: 2, .. })),
        "got {late:?}"
    );
    assert_eq!(
        imported(&*bucket, &keys(), &target, "00ff").await.unwrap(),
        Imported::ThisOne
    );
    assert_eq!(
        imported(&*bucket, &keys(), &target, "00fe").await.unwrap(),
        Imported::Other,
        "another import's id"
    );

    let restored = |a: &wasmkeep_types::ActorId, node: &'static str| {
        let bucket = bucket.clone();
        let a = a.clone();
        async move {
            let mut store = open(&bucket, &a, node).await;
            let sum = int(&mut store, "SELECT sum(x) FROM t");
            let mine = int(
                &mut store,
                "SELECT count(*) FROM sqlite_master WHERE name = 'mine'",
            );
            (sum, mine, store.alarm())
        }
    };
    assert_eq!(
        restored(&target, "n3").await,
        (42, 0, Some(1_700_000_000_123))
    );
    // Should the snapshot not be written, the fence record alone restores
    // the image (here an actor with no log before it).
    let fresh = actor("fresh");
    let fence =
        wasmkeep_store::replace(&*bucket, &keys(), &fresh, &writer("n2"), &config(), &image)
            .await
            .unwrap();
    bucket
        .delete(&keys().actor_snapshot(&fresh, fence))
        .await
        .unwrap();
    assert_eq!(
        restored(&fresh, "n4").await,
        (42, 0, Some(1_700_000_000_123))
    );
}

#[tokio::test]
async fn a_lost_reply_is_settled_by_reading_the_record_back() {
    let bucket = Probe::new();
    let a = actor("reply-lost");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    bucket.inner.faults().push(Fault::ReplyLost);
    event(&mut s, &["INSERT INTO t VALUES (1)"]).await.unwrap();
    bucket.inner.faults().push(Fault::Unavailable);
    bucket.inner.faults().push(Fault::Unavailable);
    event(&mut s, &["INSERT INTO t VALUES (2)"]).await.unwrap();
    assert!(!s.is_failed());
    drop(s);
    let mut s = open(&bucket, &a, "n2").await;
    assert_eq!(int(&mut s, "SELECT sum(x) FROM t"), 3);
}

#[tokio::test]
async fn a_bucket_that_stays_down_breaks_the_store_and_loses_only_unacknowledged_events() {
    let bucket = Probe::new();
    let a = actor("down");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"])
        .await
        .unwrap();
    bucket.inner.faults().set_partitioned(true);
    let failed = event(&mut s, &["INSERT INTO t VALUES (2)"]).await;
    assert!(
        matches!(failed, Err(Error::Broken { .. })),
        "got {failed:?}"
    );
    assert!(s.is_failed() && !s.is_fenced());
    assert!(s.begin_event().is_err(), "a broken store refuses events");
    bucket.inner.faults().set_partitioned(false);
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    assert_eq!(int(&mut s, "SELECT sum(x) FROM t"), 1);
    // The store works again after a reopen, at the next sequence number.
    event(&mut s, &["INSERT INTO t VALUES (5)"]).await.unwrap();
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    assert_eq!(int(&mut s, "SELECT sum(x) FROM t"), 6);
}

#[tokio::test]
async fn an_applied_record_whose_outcome_cannot_be_settled_is_whole_after_restore() {
    let bucket = Probe::new();
    let a = actor("unsettled");
    let mut s = open(&bucket, &a, "n1").await;
    event(
        &mut s,
        &[
            "CREATE TABLE t (x)",
            "CREATE TABLE total (n)",
            "INSERT INTO total VALUES (0)",
        ],
    )
    .await
    .unwrap();
    // The put applies but its reply is lost, and every read-back fails.
    bucket.inner.faults().push(Fault::ReplyLost);
    for _ in 0..10 {
        bucket.inner.faults().push(Fault::Unavailable);
    }
    let gate = event(
        &mut s,
        &["INSERT INTO t VALUES (7)", "UPDATE total SET n = n + 7"],
    );
    assert!(
        gate.await.is_err(),
        "an unsettled record is not acknowledged"
    );
    bucket.inner.faults().clear();
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    // Unacknowledged but whole: both statements of the event, or neither.
    assert_eq!(
        int(&mut s, "SELECT coalesce(sum(x), 0) FROM t"),
        int(&mut s, "SELECT n FROM total")
    );
}

/// Random faults at every step (index write, record write, read-back,
/// restore) over many events; whenever the store breaks the node would drop
/// it and restore. Every acknowledged event must be there and every event
/// whole (its two writes agree).
#[tokio::test]
async fn under_random_faults_acknowledged_events_survive_and_none_is_half_applied() {
    let bucket = Probe::new();
    let a = actor("chaos");
    let cfg = StoreConfig {
        snapshot_log_records: 16,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(
        &mut s,
        &[
            "CREATE TABLE t (id INTEGER PRIMARY KEY)",
            "CREATE TABLE total (n)",
            "INSERT INTO total VALUES (0)",
        ],
    )
    .await
    .unwrap();
    let faults = bucket.inner.faults();
    faults.set_seed(7);
    faults.set_unavailable_probability(0.25);
    faults.set_reply_lost_probability(0.25);
    let mut acked = Vec::new();
    let mut reopened = 0;
    for id in 1..=150i64 {
        let mut gates = Vec::new();
        for k in 0..3 {
            let id = id * 10 + k;
            s.begin_event().ok();
            let ok = s
                .execute("INSERT INTO t VALUES (?1)", &[SqlValue::Integer(id)])
                .is_ok()
                && s.execute("UPDATE total SET n = n + 1", &[]).is_ok();
            if !ok {
                s.rollback_event();
                continue;
            }
            if s.alarm().is_none() {
                s.set_alarm(Some(id)).ok();
            } else {
                s.set_alarm(None).ok();
            }
            match s.commit_event() {
                Ok(g) => gates.push((id, g)),
                Err(_) => break,
            }
        }
        for (id, g) in gates {
            if g.await.is_ok() {
                acked.push(id);
            }
        }
        if s.is_failed() {
            drop(s);
            reopened += 1;
            s = loop {
                match ActorStore::open(bucket.clone(), keys(), a.clone(), writer("n1"), cfg.clone())
                    .await
                {
                    Ok(s) => break s,
                    Err(Error::Bucket(_)) => continue,
                    Err(e) => panic!("restore failed: {e}"),
                }
            };
        }
    }
    faults.clear();
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    let rows = int(&mut s, "SELECT count(*) FROM t");
    assert_eq!(
        rows,
        int(&mut s, "SELECT n FROM total"),
        "an event was half applied"
    );
    for id in &acked {
        assert_eq!(
            int(&mut s, &format!("SELECT count(*) FROM t WHERE id = {id}")),
            1,
            "acknowledged event {id} lost"
        );
    }
    assert!(
        reopened > 0,
        "the faults never broke the store: the test shows nothing"
    );
    assert!(!acked.is_empty());
    // The committed alarm agrees with the database.
    let alarm = ActorStore::read_alarm(bucket.clone(), &keys(), &a)
        .await
        .unwrap();
    assert_eq!(alarm, s.alarm());
}

#[tokio::test]
async fn a_flipped_byte_in_a_record_fails_the_restore_naming_the_key() {
    let bucket = Probe::new();
    let a = actor("flip");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    event(&mut s, &["INSERT INTO t VALUES (1)"]).await.unwrap();
    drop(s);
    let key = keys().actor_log(&a, 2);
    let mut bytes = bucket.get(&key).await.unwrap().bytes.to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    bucket.put(&key, Bytes::from(bytes)).await.unwrap();
    let err = ActorStore::open(bucket.clone(), keys(), a.clone(), writer("n1"), config())
        .await
        .unwrap_err();
    match err {
        Error::Corrupt { key: k, reason } => {
            assert_eq!(k, key);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        ActorStore::read_alarm(bucket.clone(), &keys(), &a)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_truncated_snapshot_or_a_missing_record_fails_the_restore() {
    let bucket = Probe::new();
    let a = actor("trunc");
    let cfg = StoreConfig {
        snapshot_log_records: 4,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    for i in 0..6 {
        event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
    }
    s.flush().await.unwrap();
    drop(s);
    let snaps = bucket.keys_under(&keys().actor_snapshot_prefix(&a));
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let logs = bucket.keys_under(&keys().actor_log_prefix(&a));
    assert!(!logs.is_empty());

    // A missing record in the middle of the log.
    let victim = logs[0].clone();
    let saved = bucket.get(&victim).await.unwrap().bytes;
    if logs.len() > 1 {
        bucket.delete(&victim).await.unwrap();
        let err = ActorStore::open(bucket.clone(), keys(), a.clone(), writer("n1"), cfg.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Corrupt { key, .. } if *key == victim),
            "{err:?}"
        );
        bucket.put(&victim, saved).await.unwrap();
    }

    // A truncated snapshot.
    let snap = snaps[0].clone();
    let bytes = bucket.get(&snap).await.unwrap().bytes;
    bucket
        .put(&snap, bytes.slice(..bytes.len() / 2))
        .await
        .unwrap();
    let err = ActorStore::open(bucket.clone(), keys(), a.clone(), writer("n1"), cfg.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { key, .. } if *key == snap),
        "{err:?}"
    );
    bucket.put(&snap, bytes).await.unwrap();
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 6);
}

#[tokio::test]
async fn snapshots_keep_the_log_short_and_the_restore_bounded() {
    let bucket = Probe::new();
    let a = actor("compact");
    let cfg = StoreConfig {
        snapshot_log_records: 8,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE t (x, pad)"]).await.unwrap();
    for i in 0..200 {
        event(
            &mut s,
            &[&format!("INSERT INTO t VALUES ({i}, zeroblob(500))")],
        )
        .await
        .unwrap();
    }
    s.flush().await.unwrap();
    s.close().await;
    let logs = bucket.keys_under(&keys().actor_log_prefix(&a));
    let snaps = bucket.keys_under(&keys().actor_snapshot_prefix(&a));
    assert!(logs.len() <= 8, "{} log records left: {logs:?}", logs.len());
    assert_eq!(snaps.len(), 1, "older snapshots are deleted");

    let gets = bucket.gets();
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    let read = bucket.gets() - gets;
    assert!(read <= 1 + 8, "restore read {read} objects");
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 200);
    assert_eq!(int(&mut s, "SELECT sum(x) FROM t"), (0..200).sum::<i64>());
}

/// After a snapshot, the records it covers are deleted as fast as records
/// are written since, sixteen at a time (a node's deletes follow its writes
/// instead of arriving in bursts), and the rest when the store closes.
#[tokio::test]
async fn compaction_deletes_covered_records_as_records_are_written_and_the_rest_at_close() {
    let bucket = Probe::new();
    let a = actor("paced");
    let cfg = StoreConfig {
        snapshot_log_records: 100,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    for i in 0..120 {
        event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
    }
    let seqs = |prefix: &str| -> Vec<u64> {
        bucket
            .keys_under(prefix)
            .iter()
            .map(|k| Keys::parse_seq(k).unwrap())
            .collect()
    };
    let snaps = seqs(&keys().actor_snapshot_prefix(&a));
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let snapshot = snaps[0];
    let logs = seqs(&keys().actor_log_prefix(&a));
    let written_since = logs.iter().filter(|s| **s > snapshot).count() as u64;
    let covered_left = logs.iter().filter(|s| **s <= snapshot).count() as u64;
    let deleted = snapshot - covered_left;
    assert!(written_since >= 10, "snapshot at {snapshot}, logs {logs:?}");
    assert!(
        deleted >= 1 && deleted <= written_since + 16,
        "{deleted} of {snapshot} covered records deleted while {written_since} were written"
    );

    s.close().await;
    let logs = seqs(&keys().actor_log_prefix(&a));
    assert!(
        logs.iter().all(|s| *s > snapshot),
        "covered records left after close: {logs:?}"
    );
    assert_eq!(logs.len() as u64, written_since);
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 120);
}

/// Compaction hands the bucket each step's records as one request (the
/// folder bucket takes them in one batch, S3 in one `DeleteObjects`), not
/// a request per record.
#[tokio::test]
async fn compaction_deletes_each_steps_records_in_one_request() {
    let bucket = Probe::new();
    let a = actor("bulk");
    let cfg = StoreConfig {
        snapshot_log_records: 64,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    for i in 0..200 {
        event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
    }
    s.close().await;
    let deletes = bucket.counts.deletes.load(Ordering::SeqCst);
    let calls = bucket.counts.delete_calls.load(Ordering::SeqCst);
    assert!(deletes >= 128, "{deletes} keys deleted");
    assert!(
        calls >= 1 && calls * 8 <= deletes,
        "{deletes} keys deleted in {calls} requests"
    );
}

/// Compaction lists the actor's keys only at its first run after the store
/// opened and then once in 64 runs; in between it deletes what the store
/// wrote, which it knows. A key the store never wrote (a leftover of an
/// earlier writer) stays until the next listing finds it.
#[tokio::test]
async fn compaction_lists_once_in_64_runs_and_then_deletes_leftovers() {
    let bucket = Probe::new();
    let a = actor("known");
    // A snapshot, and so a compaction, after every record.
    let cfg = StoreConfig {
        snapshot_log_records: 1,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    s.flush().await.unwrap();
    // The second snapshot is written after the first compaction is done.
    event(&mut s, &["INSERT INTO t VALUES (1)"]).await.unwrap();
    s.flush().await.unwrap();
    let leftover = keys().actor_log(&a, 1);
    assert!(
        bucket.keys_under(&leftover).is_empty(),
        "record 1 was compacted"
    );
    bucket
        .put(&leftover, Bytes::from_static(b"left by an earlier writer"))
        .await
        .unwrap();
    let lists = bucket.lists();
    for i in 2..40 {
        event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
        s.flush().await.unwrap();
    }
    assert_eq!(
        bucket.lists(),
        lists,
        "compactions between listings list nothing"
    );
    assert_eq!(bucket.keys_under(&leftover), vec![leftover.clone()]);
    let logs = bucket.keys_under(&keys().actor_log_prefix(&a));
    assert!(logs.len() <= 3, "records left: {logs:?}");
    let snaps = bucket.keys_under(&keys().actor_snapshot_prefix(&a));
    assert!(snaps.len() <= 2, "snapshots left: {snaps:?}");

    for i in 40..80 {
        event(&mut s, &[&format!("INSERT INTO t VALUES ({i})")])
            .await
            .unwrap();
        s.flush().await.unwrap();
    }
    s.close().await;
    assert_eq!(
        bucket.lists(),
        lists + 2,
        "one listing (records, snapshots) in 64 runs"
    );
    let logs = bucket.keys_under(&keys().actor_log_prefix(&a));
    assert!(logs.is_empty(), "records left: {logs:?}");
    let snaps = bucket.keys_under(&keys().actor_snapshot_prefix(&a));
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 79);
}

#[tokio::test]
async fn a_large_database_survives_snapshot_and_restore() {
    let bucket = Probe::new();
    let a = actor("large");
    let cfg = StoreConfig {
        snapshot_log_records: 3,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(&mut s, &["CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB)"])
        .await
        .unwrap();
    for i in 0..10 {
        s.begin_event().unwrap();
        for j in 0..20 {
            s.execute("INSERT INTO t (b) VALUES (randomblob(2000))", &[])
                .unwrap();
            let _ = j;
        }
        if i % 3 == 0 {
            s.execute("DELETE FROM t WHERE id % 7 = 0", &[]).unwrap();
        }
        s.commit_event().unwrap().await.unwrap();
    }
    let want = s
        .query("SELECT id, hex(b) FROM t ORDER BY id", &[])
        .unwrap();
    s.commit_event().unwrap().await.unwrap();
    s.flush().await.unwrap();
    let bytes = s.database_bytes();
    assert!(bytes > 300_000, "{bytes}");
    drop(s);
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    assert_eq!(s.database_bytes(), bytes);
    assert_eq!(
        s.query("SELECT id, hex(b) FROM t ORDER BY id", &[])
            .unwrap(),
        want
    );
    let check = s.query("PRAGMA integrity_check", &[]).unwrap();
    assert_eq!(check.rows, vec![vec![SqlValue::Text("ok".into())]]);
}

#[tokio::test]
async fn the_alarm_commits_with_its_event_and_read_alarm_sees_it() {
    let bucket = Probe::new();
    let a = actor("alarm");
    let index = keys().alarm(&a);
    let mut s = open(&bucket, &a, "n1").await;
    assert_eq!(s.alarm(), None);

    // A rolled-back event's alarm is discarded.
    s.begin_event().unwrap();
    s.set_alarm(Some(99)).unwrap();
    assert_eq!(s.alarm(), Some(99));
    s.rollback_event();
    assert_eq!(s.alarm(), None);
    s.commit_event().unwrap().await.unwrap();
    assert_eq!(
        ActorStore::read_alarm(bucket.clone(), &keys(), &a)
            .await
            .unwrap(),
        None
    );

    s.begin_event().unwrap();
    s.execute("CREATE TABLE t (x)", &[]).unwrap();
    s.set_alarm(Some(1_700_000_000_123)).unwrap();
    s.commit_event().unwrap().await.unwrap();
    assert_eq!(
        ActorStore::read_alarm(bucket.clone(), &keys(), &a)
            .await
            .unwrap(),
        Some(1_700_000_000_123)
    );
    let body = bucket.get(&index).await.unwrap().bytes;
    assert_eq!(&body[..], b"1700000000123");

    // Guests cannot see or touch the alarm table.
    let err = s.query("SELECT * FROM _wasmkeep_alarm", &[]).unwrap_err();
    assert!(err.message.contains("reserved"), "{err}");
    s.rollback_event();

    drop(s);
    let mut s = open(&bucket, &a, "n2").await;
    assert_eq!(s.alarm(), Some(1_700_000_000_123));
    s.begin_event().unwrap();
    s.set_alarm(None).unwrap();
    s.commit_event().unwrap().await.unwrap();
    assert_eq!(
        ActorStore::read_alarm(bucket.clone(), &keys(), &a)
            .await
            .unwrap(),
        None
    );
    assert!(
        bucket.get(&index).await.is_err(),
        "the index is deleted after the clearing record"
    );
}

#[tokio::test]
async fn an_event_larger_than_a_record_is_refused_and_changes_nothing() {
    let bucket = Probe::new();
    let a = actor("big");
    let cfg = StoreConfig {
        record_bytes_max: 64 * 1024,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg.clone()).await;
    event(
        &mut s,
        &["CREATE TABLE t (b BLOB)", "INSERT INTO t VALUES (x'01')"],
    )
    .await
    .unwrap();
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (zeroblob(200000))", &[])
        .unwrap();
    s.set_alarm(Some(5)).unwrap();
    let err = s.commit_event().unwrap_err();
    assert!(matches!(err, Error::EventTooLarge { .. }), "{err:?}");
    assert_eq!(s.alarm(), None, "the refused event's alarm is discarded");
    assert_eq!(
        int(&mut s, "SELECT count(*) FROM t"),
        1,
        "the refused event's rows are gone"
    );
    s.commit_event().unwrap().await.unwrap();
    event(&mut s, &["INSERT INTO t VALUES (x'02')"])
        .await
        .unwrap();
    drop(s);
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 2);
}

#[tokio::test]
async fn a_full_database_is_a_sql_error_and_the_event_fails_whole() {
    let bucket = Probe::new();
    let a = actor("full");
    let cfg = StoreConfig {
        database_bytes_max: 32 * 4096,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    event(&mut s, &["CREATE TABLE t (b BLOB)"]).await.unwrap();
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (x'01')", &[]).unwrap();
    let err = s
        .execute("INSERT INTO t VALUES (zeroblob(1000000))", &[])
        .unwrap_err();
    assert!(
        err.message.contains(
            "database or disk is full: the database reached its class's maximum (131072 bytes)"
        ),
        "{err}"
    );
    match s.commit_event() {
        // SQLite kept the transaction (statement rolled back): the first row commits.
        Ok(g) => {
            g.await.unwrap();
            assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 1);
        }
        Err(e) => {
            assert!(matches!(e, Error::EventAborted(_)), "{e:?}");
            assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 0);
        }
    }
    s.commit_event().unwrap().await.unwrap();
    assert!(!s.is_failed());
}

#[tokio::test]
async fn many_actors_share_one_process_without_files() {
    let bucket = Probe::new();
    let mut stores = Vec::new();
    for i in 0..200 {
        let a = actor(&format!("many-{i}"));
        let mut s = open(&bucket, &a, "n1").await;
        event(
            &mut s,
            &["CREATE TABLE t (x)", &format!("INSERT INTO t VALUES ({i})")],
        )
        .await
        .unwrap();
        stores.push((a, s));
    }
    for (i, (_, s)) in stores.iter_mut().enumerate() {
        assert_eq!(int(s, "SELECT x FROM t"), i as i64);
        s.commit_event().unwrap().await.unwrap();
    }
    drop(stores);
    let bucket: Arc<dyn Bucket> = bucket;
    let s = ActorStore::open(bucket, keys(), actor("many-7"), writer("n1"), config()).await;
    let mut s = s.unwrap();
    assert_eq!(int(&mut s, "SELECT x FROM t"), 7);
}

#[tokio::test]
async fn a_failed_alarm_index_write_fails_the_event_before_its_record() {
    let bucket = Probe::new();
    let a = actor("index-fails");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let logs_before = bucket.keys_under(&keys().actor_log_prefix(&a)).len();
    // Every attempt of the index write fails (config(): 3 attempts).
    for _ in 0..3 {
        bucket.inner.faults().push(Fault::Unavailable);
    }
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
    s.set_alarm(Some(42)).unwrap();
    let failed = s.commit_event().unwrap().await;
    assert!(matches!(failed, Err(Error::Broken { .. })), "{failed:?}");
    assert_eq!(
        bucket.keys_under(&keys().actor_log_prefix(&a)).len(),
        logs_before,
        "no record is written without its alarm index"
    );
    drop(s);
    let mut s = open(&bucket, &a, "n1").await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 0);
    assert_eq!(s.alarm(), None);
    assert_eq!(
        ActorStore::read_alarm(bucket.clone(), &keys(), &a)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_store_dropped_with_queued_records_still_writes_them() {
    let bucket = Probe::new();
    let a = actor("dropped");
    let mut s = open(&bucket, &a, "n1").await;
    bucket.hold_log_puts();
    let gates: Vec<_> = (0..5)
        .map(|i| {
            event(
                &mut s,
                &[if i == 0 {
                    "CREATE TABLE t (x)"
                } else {
                    "INSERT INTO t VALUES (1)"
                }],
            )
        })
        .collect();
    drop(s);
    bucket.release();
    for g in gates {
        g.await.unwrap();
    }
    let mut s = open(&bucket, &a, "n2").await;
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 4);
}

/// Alone on its folder, the folder bucket says short-lived objects are
/// cheap (ADR 0034): a small database snapshots once its log outweighs it
/// a few times, so its records are deleted while young. Shared, it waits
/// for `snapshot_log_records` as on any other bucket. Either way the state
/// restores whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_database_snapshots_early_where_short_lived_objects_are_cheap() {
    const EVENTS: i64 = 40;
    for never_solo in [false, true] {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let bucket: Arc<dyn wasmkeep_bucket::Bucket> = Arc::new(
            wasmkeep_bucket::FolderBucket::open_with(
                dir.path(),
                wasmkeep_bucket::FolderOptions {
                    never_solo,
                    ..Default::default()
                },
            )
            .expect("open the folder"),
        );
        assert_eq!(hinted::short_lived_objects_are_cheap(&*bucket), !never_solo);
        let a = actor("small");
        let open = || {
            ActorStore::open(
                Arc::clone(&bucket),
                keys(),
                a.clone(),
                writer("n1"),
                config(),
            )
        };
        let mut s = open().await.expect("open the store");
        event(&mut s, &["CREATE TABLE c (n)", "INSERT INTO c VALUES (0)"])
            .await
            .unwrap();
        for _ in 0..EVENTS {
            // One record each: every event waits for its own.
            event(&mut s, &["UPDATE c SET n = n + 1"]).await.unwrap();
        }
        s.flush().await.unwrap();
        // Closed before the count: a flush waits for the snapshot, not for
        // the compaction after it, which a close awaits (counted right
        // after the flush, a loaded machine found 41 records left).
        s.close().await;
        let snapshots = hinted::list_keys(&*bucket, &keys().actor_snapshot_prefix(&a))
            .await
            .unwrap();
        let logs = hinted::list_keys(&*bucket, &keys().actor_log_prefix(&a))
            .await
            .unwrap();
        if never_solo {
            assert!(snapshots.is_empty(), "{snapshots:?}");
            assert_eq!(logs.len() as i64, EVENTS + 1);
        } else {
            let newest = snapshots
                .iter()
                .filter_map(|l| Keys::parse_seq(&l.key).ok())
                .max()
                .expect("a snapshot");
            assert!(
                newest >= (EVENTS as u64) - 16,
                "the newest snapshot is at {newest}"
            );
            assert!(logs.len() <= 24, "{} records left", logs.len());
        }
        let mut s = open().await.expect("reopen the store");
        assert_eq!(int(&mut s, "SELECT n FROM c"), EVENTS);
        s.close().await;
    }
}

/// A bucket that keeps failing slowly breaks the store once
/// `write_time_max` has passed since the record's first attempt, however
/// many attempts `write_attempts_max` would still allow: the events waiting
/// on the record get their error then instead of after every attempt.
#[tokio::test(start_paused = true)]
async fn a_bucket_that_keeps_failing_breaks_the_store_after_write_time_max() {
    // Each request takes 100 ms (virtual time) and then fails.
    let memory = MemoryBucket::new();
    let bucket = Probe::over(memory);
    let a = actor("slow-outage");
    let cfg = StoreConfig {
        write_attempts_max: 1_000,
        write_retry_backoff: Duration::from_millis(10),
        write_time_max: Duration::from_secs(1),
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let puts_before = bucket.puts();
    bucket
        .inner
        .faults()
        .set_latency(Duration::from_millis(100), Duration::ZERO);
    bucket.inner.faults().set_partitioned(true);

    let started = tokio::time::Instant::now();
    let failed = event(&mut s, &["INSERT INTO t VALUES (1)"]).await;
    let waited = started.elapsed();
    assert!(matches!(failed, Err(Error::Broken { .. })), "{failed:?}");
    // Attempts start at 0, 110, 230, 370, 550, 810 and 1,230 ms (100 ms
    // each plus the doubling backoff); the seventh fails at 1,330 ms, past
    // the second, so no eighth: one read-back, and the store breaks.
    let attempts = bucket.puts() - puts_before;
    assert_eq!(attempts, 7, "put attempts");
    assert!(
        waited < Duration::from_millis(1_500),
        "the store broke only after {waited:?} of virtual time"
    );
}

/// A reader (`wasmkeep actor sql`, `actor export`; ADR 0065) restores the
/// acknowledged state, refuses a statement that writes, writes nothing to
/// the bucket (not even the alarm index), and leaves the holder serving;
/// its database image is a file SQLite opens.
#[tokio::test]
async fn a_reader_sees_the_acknowledged_state_refuses_writes_and_writes_nothing() {
    let bucket = Probe::new();
    let a = actor("read");
    let mut holder = open(&bucket, &a, "n1").await;
    event(
        &mut holder,
        &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"],
    )
    .await
    .unwrap();
    holder.begin_event().unwrap();
    holder.set_alarm(Some(5_000)).unwrap();
    holder.commit_event().unwrap().await.unwrap();
    let puts = bucket.puts();
    let mut reader = ActorStore::open_reader(bucket.clone(), keys(), a.clone(), config())
        .await
        .unwrap();
    assert_eq!(int(&mut reader, "SELECT count(*) FROM t"), 1);
    assert_eq!(reader.alarm(), Some(5_000));
    let refused = reader.execute("INSERT INTO t VALUES (2)", &[]).unwrap_err();
    assert!(refused.message.contains("read-only"), "{refused}");
    reader.commit_event().unwrap().await.unwrap();
    let image = reader.database_image();
    drop(reader);
    assert_eq!(bucket.puts(), puts, "the reader wrote to the bucket");
    event(&mut holder, &["INSERT INTO t VALUES (3)"])
        .await
        .unwrap();
    assert_eq!(int(&mut holder, "SELECT count(*) FROM t"), 2);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("read.sqlite");
    std::fs::write(&path, &image).unwrap();
    let exported = rusqlite::Connection::open(&path).unwrap();
    let x: i64 = exported
        .query_row("SELECT x FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(x, 1);
}

/// An operator's write (`actor sql --write`) keeps its result in the
/// actor's database with the write: a later holder finds it (so the request
/// is not carried out twice), a rolled-back event leaves no result, guests
/// cannot reach the table, and only the newest results are kept.
#[tokio::test]
async fn an_operator_request_commits_its_result_with_its_writes() {
    let bucket = Probe::new();
    let a = actor("operator");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"])
        .await
        .unwrap();
    assert_eq!(s.operator_result("r1").unwrap(), None);
    assert_eq!(s.execute("UPDATE t SET x = x + 10", &[]).unwrap(), 1);
    s.record_operator_result("r1", "{\"changes\":1}").unwrap();
    s.commit_event().unwrap().await.unwrap();

    s.execute("UPDATE t SET x = x + 100", &[]).unwrap();
    s.record_operator_result("r2", "{\"changes\":1}").unwrap();
    s.rollback_event();
    assert_eq!(s.operator_result("r2").unwrap(), None, "rolled back");
    s.rollback_event();
    let refused = s
        .query("SELECT * FROM _wasmkeep_operator", &[])
        .unwrap_err();
    assert!(refused.message.contains("_wasmkeep"), "{refused}");
    s.rollback_event();
    s.close().await;

    let mut later = open(&bucket, &a, "n2").await;
    assert_eq!(
        later.operator_result("r1").unwrap().as_deref(),
        Some("{\"changes\":1}")
    );
    later.rollback_event();
    assert_eq!(int(&mut later, "SELECT x FROM t"), 11);
    for i in 0..=wasmkeep_store::OPERATOR_RESULTS_KEPT {
        later
            .record_operator_result(&format!("k{i}"), "{}")
            .unwrap();
        later.commit_event().unwrap().await.unwrap();
    }
    assert_eq!(
        later.operator_result("r1").unwrap(),
        None,
        "the oldest went"
    );
    assert!(later.operator_result("k1").unwrap().is_some());
    later.rollback_event();
}

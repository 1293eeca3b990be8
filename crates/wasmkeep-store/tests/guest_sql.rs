//! Guest SQL: errors are values with SQLite's message, and the authorizer
//! keeps a guest inside its own tables.

mod common;

use wasmkeep_store::SqlValue;

use common::*;

#[tokio::test]
async fn the_authorizer_refuses_what_could_escape_the_actor_or_its_durability() {
    let bucket = Probe::new();
    let a = actor("auth");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    s.begin_event().unwrap();
    s.set_alarm(Some(10)).unwrap();
    s.commit_event().unwrap().await.unwrap();
    // A view over the store's table may be defined, but reading through it
    // is judged like a direct read (the authorizer sees the view's reads).
    // Triggers likewise: their body is judged when they fire.
    event(
        &mut s,
        &[
            "CREATE VIEW sneaky AS SELECT * FROM _wasmkeep_alarm",
            "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM _wasmkeep_alarm; END",
        ],
    )
    .await
    .unwrap();
    let puts = bucket.puts();

    let refused = [
        ("SELECT * FROM _wasmkeep_alarm", "reserved"),
        ("INSERT INTO _wasmkeep_alarm VALUES (1, 2)", "reserved"),
        ("DELETE FROM _WASMKEEP_ALARM", "reserved"),
        ("DROP TABLE _wasmkeep_alarm", "reserved"),
        ("CREATE TABLE _wasmkeep_mine (x)", "reserved"),
        ("SELECT * FROM sneaky", "reserved"),
        ("INSERT INTO t VALUES (5)", "reserved"),
        ("ATTACH DATABASE '/tmp/x.db' AS other", "ATTACH"),
        ("DETACH DATABASE main", "DETACH"),
        ("PRAGMA journal_mode = DELETE", "PRAGMA"),
        ("PRAGMA synchronous = FULL", "PRAGMA"),
        ("PRAGMA writable_schema = ON", "PRAGMA"),
        ("PRAGMA locking_mode = NORMAL", "PRAGMA"),
        ("PRAGMA max_page_count = 999999999", "PRAGMA"),
        ("VACUUM", "VACUUM"),
        ("VACUUM INTO '/tmp/copy.db'", "VACUUM"),
        ("BEGIN", "BEGIN"),
        ("COMMIT", "COMMIT"),
        ("ROLLBACK", "ROLLBACK"),
        ("CREATE TEMP TABLE scratch (x)", "temporary"),
        ("SELECT load_extension('x')", "load_extension"),
        // Refused whether or not SQLite was built with the module (the
        // bundled build leaves FTS and R-tree out: ADR 0028).
        (
            "CREATE VIRTUAL TABLE docs USING fts5(body)",
            "virtual tables",
        ),
        (
            "CREATE VIRTUAL TABLE boxes USING rtree(id, x0, x1)",
            "virtual tables",
        ),
        ("PRAGMA foreign_keys = OFF", "read, not set"),
        ("PRAGMA cache_size = 5", "allowed: user_version"),
    ];
    for (sql, word) in refused {
        s.begin_event().unwrap();
        let err = s.execute(sql, &[]).expect_err(sql);
        assert!(
            err.message.to_lowercase().contains(&word.to_lowercase()),
            "{sql}: error {err:?} does not mention {word}"
        );
        s.rollback_event();
    }
    // Nothing refused changed anything.
    assert_eq!(s.alarm(), Some(10));
    assert_eq!(bucket.puts(), puts);

    // Harmless PRAGMAs and savepoints are allowed.
    s.begin_event().unwrap();
    s.execute("DROP TRIGGER tr", &[]).unwrap();
    let info = s.query("PRAGMA table_info(t)", &[]).unwrap();
    assert_eq!(info.rows.len(), 1);
    s.query("SELECT * FROM pragma_table_info('t')", &[])
        .unwrap();
    s.execute("PRAGMA user_version = 3", &[]).unwrap();
    // Foreign keys are enforced; their check may wait for the commit.
    assert_eq!(
        s.query("PRAGMA foreign_keys", &[]).unwrap().rows,
        [vec![SqlValue::Integer(1)]]
    );
    s.execute("PRAGMA defer_foreign_keys = ON", &[]).unwrap();
    s.query("PRAGMA compile_options", &[]).unwrap();
    s.query("PRAGMA optimize", &[]).unwrap();
    s.execute("SAVEPOINT sp", &[]).unwrap();
    s.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
    s.execute("ROLLBACK TO sp", &[]).unwrap();
    s.execute("RELEASE sp", &[]).unwrap();
    s.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
    s.commit_event().unwrap().await.unwrap();
    assert_eq!(int(&mut s, "SELECT sum(x) FROM t"), 2);
    assert_eq!(int(&mut s, "PRAGMA user_version"), 3);
    // JSON functions are part of SQLite's core, whatever the build leaves out.
    assert_eq!(int(&mut s, r#"SELECT json_extract('{"a": 7}', '$.a')"#), 7);
    s.commit_event().unwrap().await.unwrap();
}

#[tokio::test]
async fn sql_errors_are_values_with_sqlites_message() {
    let bucket = Probe::new();
    let a = actor("errors");
    let mut s = open(&bucket, &a, "n1").await;
    event(
        &mut s,
        &[
            "CREATE TABLE t (x INTEGER NOT NULL UNIQUE)",
            "INSERT INTO t VALUES (1)",
        ],
    )
    .await
    .unwrap();
    s.begin_event().unwrap();
    let cases = [
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM missing", "no such table"),
        ("INSERT INTO t VALUES (1)", "UNIQUE constraint failed"),
        ("INSERT INTO t VALUES (NULL)", "NOT NULL constraint failed"),
        (
            "INSERT INTO t VALUES (2); DROP TABLE t",
            "more than one statement",
        ),
        ("", "empty"),
        ("  ;  ", "empty"),
    ];
    for (sql, want) in cases {
        let err = s.execute(sql, &[]).expect_err(sql);
        assert!(err.to_string().contains(want), "{sql}: {err}");
    }
    // The event goes on after statement errors; the failed statements did nothing.
    s.execute("INSERT INTO t VALUES (?1)", &[SqlValue::Integer(3)])
        .unwrap();
    s.commit_event().unwrap().await.unwrap();
    assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 2);
    let err = s
        .query("SELECT ?1 + ?2", &[SqlValue::Integer(1)])
        .unwrap_err();
    assert!(err.message.contains("parameters"), "{err}");
    let err = s.execute("SELECT 1", &[]).unwrap_err();
    assert!(err.message.contains("query"), "{err}");
    s.commit_event().unwrap().await.unwrap();
}

#[tokio::test]
async fn values_of_every_type_round_trip() {
    let bucket = Probe::new();
    let a = actor("types");
    let mut s = open(&bucket, &a, "n1").await;
    let values = vec![
        SqlValue::Null,
        SqlValue::Integer(i64::MIN),
        SqlValue::Real(1.5),
        SqlValue::Text("héllo".into()),
        SqlValue::Blob(vec![0, 1, 255]),
    ];
    s.begin_event().unwrap();
    s.execute("CREATE TABLE v (a, b, c, d, e)", &[]).unwrap();
    s.execute("INSERT INTO v VALUES (?1, ?2, ?3, ?4, ?5)", &values)
        .unwrap();
    s.commit_event().unwrap().await.unwrap();
    drop(s);
    let mut s = open(&bucket, &a, "n2").await;
    let rows = s.query("SELECT a, b, c, d, e FROM v", &[]).unwrap();
    assert_eq!(rows.columns, vec!["a", "b", "c", "d", "e"]);
    assert_eq!(rows.rows, vec![values]);
}

#[tokio::test]
async fn a_runaway_statement_is_interrupted() {
    let bucket = Probe::new();
    let a = actor("loop");
    let cfg = wasmkeep_store::StoreConfig {
        statement_time_max: std::time::Duration::from_millis(50),
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    s.begin_event().unwrap();
    let err = s
        .query("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT count(*) FROM c", &[])
        .unwrap_err();
    assert!(err.message.contains("statement_time_max"), "{err}");
    s.rollback_event();

    // An interrupted write rolls back the whole transaction: the event fails
    // whole, and nothing after it runs outside a transaction.
    event(&mut s, &["CREATE TABLE t (n)"]).await.unwrap();
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (-1)", &[]).unwrap();
    let err = s
        .execute(
            "INSERT INTO t WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT n FROM c",
            &[],
        )
        .unwrap_err();
    assert!(
        err.message.contains("statement_time_max") || err.message.contains("rolled back"),
        "{err}"
    );
    let later = s.execute("INSERT INTO t VALUES (-2)", &[]);
    if s.query("SELECT 1", &[]).is_err() {
        // SQLite dropped the transaction: everything of the event is refused.
        assert!(later.is_err());
        let e = s.commit_event().unwrap_err();
        assert!(matches!(e, wasmkeep_store::Error::EventAborted(_)), "{e:?}");
        assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 0);
    } else {
        // SQLite kept the transaction: the event commits what succeeded.
        s.commit_event().unwrap().await.unwrap();
        assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 2);
    }
    s.commit_event().unwrap().await.unwrap();
    drop(s);
    let mut s = open(&bucket, &a, "n2").await;
    let n = int(&mut s, "SELECT count(*) FROM t");
    assert!(n == 0 || n == 2, "the event was half applied: {n} rows");
}

/// A statement whose sort needs more memory than `statement_memory_max`
/// fails with an error that says so, its event keeps nothing of it, and
/// the actor works afterwards (the next event, and the same event's
/// statements before it).
#[tokio::test]
async fn a_statement_past_its_memory_cap_fails_clearly_and_the_actor_works_on() {
    let bucket = Probe::new();
    let a = actor("memory-hog");
    let cfg = wasmkeep_store::StoreConfig {
        statement_memory_max: 4 << 20,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    event(&mut s, &["CREATE TABLE t (n)"]).await.unwrap();
    // About 25 MB of rows to sort, in one statement.
    let hog = "SELECT count(*) FROM (SELECT n, randomblob(100) AS b FROM \
               (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c LIMIT 250000) \
               SELECT n FROM c) ORDER BY b)";
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
    let err = s.query(hog, &[]).unwrap_err();
    assert!(err.message.contains("statement_memory_max"), "{err}");
    if s.query("SELECT 1", &[]).is_ok() {
        // SQLite kept the transaction: what ran before the hog commits.
        s.commit_event().unwrap().await.unwrap();
        assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 1);
    } else {
        let e = s.commit_event().unwrap_err();
        assert!(matches!(e, wasmkeep_store::Error::EventAborted(_)), "{e:?}");
        assert_eq!(int(&mut s, "SELECT count(*) FROM t"), 0);
    }
    // The actor works on, and a sort within the cap runs.
    event(&mut s, &["INSERT INTO t VALUES (2)"]).await.unwrap();
    let small = "SELECT count(*) FROM (SELECT n, randomblob(100) AS b FROM \
                 (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c LIMIT 1000) \
                 SELECT n FROM c) ORDER BY b)";
    s.begin_event().unwrap();
    assert_eq!(int(&mut s, small), 1000);
    s.rollback_event();
}

#[tokio::test]
async fn a_result_larger_than_the_limit_is_an_error() {
    let bucket = Probe::new();
    let a = actor("huge-result");
    let cfg = wasmkeep_store::StoreConfig {
        query_bytes_max: 10_000,
        ..config()
    };
    let mut s = open_with(&bucket, &a, "n1", cfg).await;
    s.begin_event().unwrap();
    let err = s
        .query("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c LIMIT 5000) SELECT n FROM c", &[])
        .unwrap_err();
    assert!(err.message.contains("query_bytes_max"), "{err}");
    s.rollback_event();
}

#[tokio::test]
async fn a_parked_store_opens_its_connection_again_with_every_row_and_the_alarm() {
    let bucket = Probe::new();
    let a = actor("parked");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"])
        .await
        .unwrap();
    s.begin_event().unwrap();
    s.set_alarm(Some(42)).unwrap();
    s.commit_event().unwrap().await.unwrap();

    // Inside an event, parking does nothing: the transaction stays open.
    s.begin_event().unwrap();
    s.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
    s.park();
    assert!(!s.is_parked(), "parked inside an event");
    s.commit_event().unwrap().await.unwrap();

    s.park();
    assert!(s.is_parked());
    let puts = bucket.puts();
    let rows = s.query("SELECT sum(x) FROM t", &[]).unwrap();
    s.commit_event().unwrap().await.unwrap();
    assert!(!s.is_parked(), "the event opened the connection again");
    assert_eq!(rows.rows, vec![vec![SqlValue::Integer(3)]]);
    assert_eq!(s.alarm(), Some(42));
    assert_eq!(bucket.puts(), puts, "parking and reopening wrote nothing");

    // A write after parking is durable like any other.
    s.park();
    event(&mut s, &["INSERT INTO t VALUES (4)"]).await.unwrap();
    drop(s);
    let mut again = open(&bucket, &a, "n1").await;
    let rows = again.query("SELECT sum(x) FROM t", &[]).unwrap();
    assert_eq!(rows.rows, vec![vec![SqlValue::Integer(7)]]);
}

#[tokio::test]
async fn execute_counts_the_rows_a_statement_changed_and_refuses_one_that_returns_rows() {
    let bucket = Probe::new();
    let a = actor("counts");
    let mut s = open(&bucket, &a, "n1").await;
    s.begin_event().unwrap();
    let mut changed = |sql: &str| {
        s.execute(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {}", e.message))
    };
    assert_eq!(changed("CREATE TABLE t (x)"), 0);
    assert_eq!(changed("INSERT INTO t VALUES (1), (2), (3)"), 3);
    // SQLite's own count would still say 3 for each of these.
    for other in [
        "CREATE TABLE u (y)",
        "SAVEPOINT p",
        "RELEASE p",
        "DROP TABLE u",
        "DELETE FROM t WHERE x > 100",
    ] {
        assert_eq!(changed(other), 0, "{other}");
    }
    assert_eq!(changed("UPDATE t SET x = x + 10 WHERE x > 2"), 1);
    assert_eq!(changed("DELETE FROM t WHERE x = 1"), 1);
    // A statement that returns rows is refused before it runs (SQLite
    // writes at a RETURNING statement's first step).
    for returning in [
        "INSERT INTO t VALUES (4) RETURNING x",
        "UPDATE t SET x = x + 100 RETURNING x",
        "DELETE FROM t RETURNING x",
    ] {
        let err = s.execute(returning, &[]).expect_err(returning);
        assert!(err.message.contains("run it with query"), "{err}");
    }
    s.commit_event().unwrap().await.unwrap();
    let rows = s.query("SELECT x FROM t ORDER BY x", &[]).unwrap();
    assert_eq!(
        rows.rows,
        [2, 13].map(|x| vec![SqlValue::Integer(x)]).to_vec()
    );
}

#[tokio::test]
async fn a_deferred_foreign_key_violation_fails_the_commit_and_keeps_nothing() {
    let bucket = Probe::new();
    let a = actor("fk");
    let mut s = open(&bucket, &a, "n1").await;
    event(
        &mut s,
        &[
            "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
            "CREATE TABLE child (p INTEGER REFERENCES parent(id))",
            "INSERT INTO parent VALUES (1)",
        ],
    )
    .await
    .unwrap();
    s.begin_event().unwrap();
    s.execute("PRAGMA defer_foreign_keys = ON", &[]).unwrap();
    s.execute("INSERT INTO child VALUES (2)", &[]).unwrap();
    let Err(err) = s.commit_event() else {
        panic!("the commit of a foreign-key violation succeeded");
    };
    assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
    // The next event starts clean, without the refused row.
    event(&mut s, &["INSERT INTO child VALUES (1)"])
        .await
        .unwrap();
    assert_eq!(int(&mut s, "SELECT count(*) FROM child"), 1);
    s.commit_event().unwrap().await.unwrap();
}

/// On a runtime with one async worker, a heavy read (past its inline
/// slice) and a write that can loop run off that worker (ADR 0063): a task
/// that only ever yields keeps running while each statement holds its
/// thread, and each statement's answer is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn heavy_statements_run_off_the_async_worker_and_other_tasks_go_on() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let bucket = Probe::new();
    let a = actor("heavy");
    let mut s = open(&bucket, &a, "n1").await;
    event(&mut s, &["CREATE TABLE t (x)"]).await.unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = tokio::spawn({
        let (ticks, stop) = (Arc::clone(&ticks), Arc::clone(&stop));
        async move {
            while !stop.load(Ordering::Relaxed) {
                ticks.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    let off_before = wasmkeep_store::statements_off_worker_total();
    let counted = Arc::clone(&ticks);
    let (read, read_ticks, written, write_ticks) = tokio::spawn(async move {
        let cte = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000)";
        let before = counted.load(Ordering::Relaxed);
        let read = int(&mut s, &format!("{cte} SELECT count(*) FROM c"));
        let read_ticks = counted.load(Ordering::Relaxed) - before;
        let before = counted.load(Ordering::Relaxed);
        let written = s
            .execute(
                &format!("INSERT INTO t (x) {cte} SELECT count(*) FROM c"),
                &[],
            )
            .expect("the insert runs");
        let write_ticks = counted.load(Ordering::Relaxed) - before;
        s.commit_event().expect("commit").await.expect("durable");
        let stored = int(&mut s, "SELECT x FROM t");
        (read, read_ticks, (written, stored), write_ticks)
    })
    .await
    .expect("the statements' task ends");
    stop.store(true, Ordering::Relaxed);
    ticker.await.expect("the ticker ends");
    assert_eq!((read, written), (1_000_000, (1, 1_000_000)));
    assert!(read_ticks > 0, "the worker was held by the read");
    assert!(write_ticks > 0, "the worker was held by the write");
    assert_eq!(
        wasmkeep_store::statements_off_worker_total() - off_before,
        2
    );
}

//! The node's cap on the memory of all actor databases (ADR 0064). The cap
//! is process-wide, so this binary holds this one test alone.

mod common;

use common::*;

/// A write that would grow the databases past the node's cap fails with a
/// clear error and leaves nothing; another actor still writes in what is
/// left, and once there is room the same write succeeds.
#[tokio::test]
async fn a_write_past_the_nodes_database_memory_fails_clearly_and_changes_nothing() {
    let bucket = Probe::new();
    let (a, b) = (actor("big"), actor("small"));
    let mut big = open(&bucket, &a, "n1").await;
    let mut small = open(&bucket, &b, "n1").await;
    event(&mut big, &["CREATE TABLE t (x)"]).await.unwrap();
    event(&mut small, &["CREATE TABLE t (x)"]).await.unwrap();
    // Room for 64 more pages (256 KiB); the write below needs ~1,000.
    wasmkeep_store::set_pages_max(wasmkeep_store::pages_held() + 64);
    let grow = "INSERT INTO t SELECT zeroblob(4000) FROM \
                (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) SELECT x FROM c)";
    big.begin_event().unwrap();
    let refused = big.execute(grow, &[]).unwrap_err();
    assert!(
        refused
            .message
            .contains("this node's memory for actor databases is full"),
        "{refused}"
    );
    big.rollback_event();
    event(&mut small, &["INSERT INTO t VALUES (1)"])
        .await
        .unwrap();
    assert_eq!(int(&mut big, "SELECT count(*) FROM t"), 0);
    big.rollback_event();
    wasmkeep_store::set_pages_max(u64::MAX);
    event(&mut big, &[grow]).await.unwrap();
    assert_eq!(int(&mut big, "SELECT count(*) FROM t"), 1000);
}

//! Deleting one actor in a cluster (ADR 0055): every node lists the delete
//! key, but only the holder deletes a resident actor (its socket closed
//! with 1000); an actor nobody holds is deleted by a node that acquires it;
//! the actor's next event, through any node, starts an empty actor.

use std::time::Instant;

use anyhow::ensure;

use crate::drain::{PHASE_TIME_MAX, claim_through, socket_increment};
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

pub async fn the_holder_deletes_a_resident_actor_and_any_node_an_unheld_one(
    tls: bool,
    bucket: BucketKind,
) {
    let mut options = ClusterOptions::new("delete", bucket, tls);
    options.nodes = 2;
    // Idle actors hibernate (and release their record) after a second.
    options.extra_args = vec!["--idle-timeout".into(), "1s".into()];
    crate::run(options, delete_body).await
}

/// The count `actor` answers through node `i` after one more increment.
pub async fn increment(
    c: &Cluster,
    i: usize,
    actor: &str,
    deadline: Instant,
) -> anyhow::Result<u64> {
    c.send_retrying(i, "POST", &format!("/{actor}/increment"), deadline)
        .await?
        .count()
}

async fn deleted_by(c: &Cluster, i: usize) -> anyhow::Result<f64> {
    Ok(c.metric(i, "wasmkeep_actors_deleted_total")
        .await?
        .unwrap_or(0.0))
}

/// Whether some node holds `actor` (a valid hold).
pub async fn held(c: &Cluster, actor: &str) -> anyhow::Result<bool> {
    let row = c.cli(&["actor", "inspect", actor, "--json"]).await?;
    let row: serde_json::Value = serde_json::from_str(&row)?;
    Ok(row["hold_valid"].as_bool() == Some(true))
}

async fn delete_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    // Resident on node 0 (an open socket keeps it there), written through
    // node 1 too.
    let actor = "t/counter/gone";
    claim_through(c, 0, actor, deadline).await?;
    let (mut socket, count) = socket_increment(c, 0, actor).await?;
    ensure!(count == "2", "the socket's increment answered {count}");
    ensure!(increment(c, 1, actor, deadline).await? == 3);
    c.cli(&["actor", "delete", actor, "--wait"]).await?;
    let code = socket.recv_close_code().await?;
    ensure!(code == Some(1000), "the socket closed with {code:?}");
    socket.finish_close().await?;
    ensure!(
        deleted_by(c, 0).await? == 1.0 && deleted_by(c, 1).await? == 0.0,
        "the holder (node 0) deletes; node 1 leaves it be"
    );
    let listed = c.cli(&["actor", "list", "--json"]).await?;
    ensure!(!listed.contains(actor), "{actor} is still listed: {listed}");
    ensure!(increment(c, 1, actor, deadline).await? == 1, "not empty");

    // An actor nobody holds (it hibernated): a node acquires it to delete it.
    let idle = "t/counter/idle";
    claim_through(c, 1, idle, deadline).await?;
    ensure!(increment(c, 0, idle, deadline).await? == 2);
    while held(c, idle).await? {
        ensure!(Instant::now() < deadline, "{idle} never hibernated");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let before = deleted_by(c, 0).await? + deleted_by(c, 1).await?;
    c.cli(&["actor", "delete", idle, "--wait"]).await?;
    let after = deleted_by(c, 0).await? + deleted_by(c, 1).await?;
    ensure!(after == before + 1.0, "deleted {after} - {before} times");
    ensure!(increment(c, 0, idle, deadline).await? == 1, "not empty");
    Ok(())
}

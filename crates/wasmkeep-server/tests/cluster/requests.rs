//! Requests spread over every node reach one owner per actor, and every
//! acknowledged increment is counted exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;

use crate::runner::{BucketKind, Cluster, ClusterOptions};

const ACTORS: usize = 100;
const INCREMENTS_PER_ACTOR: u64 = 10;
/// Actors being incremented at once (each one's increments are sequential).
const ACTORS_IN_FLIGHT_MAX: usize = 32;
const TEST_TIME_MAX: Duration = Duration::from_secs(90);

pub async fn round_robin_requests_have_one_owner_per_actor(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("round-robin", bucket, tls), body).await
}

/// Increments actor `a` `INCREMENTS_PER_ACTOR` times, the k-th through node
/// `(a + k) % n`; returns the node that answered every time.
async fn increment_round_robin(c: &Cluster, a: usize, deadline: Instant) -> anyhow::Result<String> {
    let path = format!("/t/counter/a{a}/increment");
    let mut owner: Option<String> = None;
    for k in 0..INCREMENTS_PER_ACTOR {
        let i = (a + usize::try_from(k)?) % c.len();
        let r = c.send_retrying(i, "POST", &path, deadline).await?;
        ensure!(
            r.status == 200,
            "POST {path} via node {i}: status {} {}",
            r.status,
            r.text()
        );
        let count = r.count()?;
        // Sequential increments of one actor see 1, 2, 3...: one owner, no
        // lost or doubled write.
        ensure!(
            count == k + 1,
            "actor a{a}: increment {} via node {i} answered {count}",
            k + 1
        );
        let node = r
            .node()
            .with_context(|| format!("POST {path} via node {i}: no x-wasmkeep-node"))?
            .to_owned();
        match &owner {
            None => owner = Some(node),
            Some(o) if *o == node => {}
            Some(o) => bail!("actor a{a} answered from {o} and then from {node} (via node {i})"),
        }
    }
    owner.context("no increments")
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + TEST_TIME_MAX;
    let started = Instant::now();
    let owners: Vec<anyhow::Result<(usize, String)>> = futures::stream::iter(0..ACTORS)
        .map(|a| async move { increment_round_robin(c, a, deadline).await.map(|o| (a, o)) })
        .buffer_unordered(ACTORS_IN_FLIGHT_MAX)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for owner in owners {
        let (_, node) = owner?;
        ensure!(c.index_of(&node).is_some(), "unknown node {node}");
        *per_node.entry(node).or_default() += 1;
    }
    eprintln!(
        "{} increments of {ACTORS} actors in {elapsed:?}; owners per node: {per_node:?}",
        ACTORS as u64 * INCREMENTS_PER_ACTOR
    );

    // The final values, read through every node.
    for a in 0..ACTORS {
        let i = a % c.len();
        let r = c
            .send_retrying(i, "GET", &format!("/t/counter/a{a}/value"), deadline)
            .await?;
        ensure!(
            r.status == 200,
            "GET value of a{a}: {} {}",
            r.status,
            r.text()
        );
        ensure!(
            r.count()? == INCREMENTS_PER_ACTOR,
            "actor a{a}: value {} after {INCREMENTS_PER_ACTOR} acknowledged increments",
            r.count()?
        );
    }

    // Each actor is resident on exactly one node.
    let mut resident = 0.0;
    for i in 0..c.len() {
        resident += c
            .metric(i, "wasmkeep_resident_actors")
            .await?
            .context("wasmkeep_resident_actors missing")?;
    }
    ensure!(
        resident == ACTORS as f64,
        "{resident} resident actors over all nodes, expected {ACTORS}"
    );
    Ok(())
}

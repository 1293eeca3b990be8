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

/// Request bodies measured (ADR 0023): a large and a very large body.
const MEASURED_BODY_BYTES: [usize; 3] = [0, 1 << 20, 16 << 20];
/// Timed requests per body size and path (after one untimed warm-up each).
const MEASURED_REQUESTS: usize = 40;

/// Added latency of one forwarding hop for large request bodies, which the
/// forwarding node reads whole before it signs and sends them (ADR 0023):
/// `POST /noop` with a body to the owner directly and through the other
/// node, two nodes on a folder bucket. Prints p50 and p99 of both.
pub async fn measure_forwarded_body_latency(tls: bool, bucket: BucketKind) {
    let mut options =
        ClusterOptions::new("forward-bodies", bucket, tls).with_class("ks", "kitchen-sink");
    options.nodes = 2;
    crate::run(options, measure_body).await
}

async fn measure_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + TEST_TIME_MAX;
    let path = "/t/ks/bodies/noop";
    // Placed on node 0 by its first event there.
    let r = c.send_retrying(0, "POST", path, deadline).await?;
    ensure!(
        r.status == 204,
        "placing the actor: {} {}",
        r.status,
        r.text()
    );
    let owner = r.node().context("no x-wasmkeep-node")?.to_owned();
    ensure!(owner == c.node_id(0), "placed on {owner}, not node 0");
    let scheme = if c.options().tls { "https" } else { "http" };
    for bytes in MEASURED_BODY_BYTES {
        let body = bytes::Bytes::from(vec![b'x'; bytes]);
        let mut direct = Vec::with_capacity(MEASURED_REQUESTS);
        let mut forwarded = Vec::with_capacity(MEASURED_REQUESTS);
        // Alternating, so drift in the machine's load hits both alike.
        for k in 0..=MEASURED_REQUESTS {
            for (i, times) in [(0, &mut direct), (1, &mut forwarded)] {
                let started = Instant::now();
                let r = c
                    .http
                    .send("POST", &c.url(i, path), &[], body.clone())
                    .await?;
                let took = started.elapsed();
                ensure!(
                    r.status == 204 && r.node() == Some(owner.as_str()),
                    "{bytes} bytes via node {i}: {} from {:?}: {}",
                    r.status,
                    r.node(),
                    r.text()
                );
                if k > 0 {
                    times.push(took);
                }
            }
        }
        let (d50, d99) = percentiles(&mut direct);
        let (f50, f99) = percentiles(&mut forwarded);
        eprintln!(
            "{scheme} body {:>8} B: direct p50 {d50:?} p99 {d99:?}; forwarded p50 {f50:?} p99 {f99:?}; \
             added p50 {:?} p99 {:?} ({MEASURED_REQUESTS} requests each)",
            bytes,
            f50.saturating_sub(d50),
            f99.saturating_sub(d99),
        );
    }
    Ok(())
}

/// p50 and p99 (nearest rank) of `times`.
fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    let rank = |p: usize| times[(times.len() * p).div_ceil(100).saturating_sub(1)];
    (rank(50), rank(99))
}

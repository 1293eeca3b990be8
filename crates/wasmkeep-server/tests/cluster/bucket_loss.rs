//! A cluster whose bucket stops answering (SeaweedFS paused with SIGSTOP for
//! longer than the lease TTL) stops serving actors — no node can renew its
//! lease, so none may run events — and serves them again, with every
//! acknowledged write, once the bucket is back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};

use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

const ACTORS: usize = 3;
const PHASE_TIME_MAX: Duration = Duration::from_secs(60);
/// A probe during the outage that gets no answer this fast counts as "not served".
const PROBE_TIME_MAX: Duration = Duration::from_millis(1500);
/// Slack for the test's own timing of the pause.
const PAUSE_SLACK: Duration = Duration::from_millis(100);

pub async fn node_cut_off_from_the_bucket_stops_serving(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("bucket-loss", bucket, tls), body).await
}

/// What a probe of `(node, actor)` got: a status, or none within the limit.
type Probe = (usize, usize, Option<u16>);

/// Probes every node for every actor at once.
async fn probe(c: &Cluster) -> Vec<Probe> {
    let probes = (0..c.len()).flat_map(|i| (0..ACTORS).map(move |a| (i, a)));
    futures::future::join_all(probes.map(|(i, a)| async move {
        let url = c.url(i, &format!("/t/counter/c{a}/value"));
        let status = match tokio::time::timeout(PROBE_TIME_MAX, c.http.get(&url)).await {
            Ok(Ok(r)) => Some(r.status),
            _ => None,
        };
        (i, a, status)
    }))
    .await
}

/// The `(node, actor)` pairs answered with 200, and a tally of the other outcomes.
async fn served(c: &Cluster, others: &mut BTreeMap<String, u64>) -> Vec<(usize, usize)> {
    let mut ok = Vec::new();
    for (i, a, status) in probe(c).await {
        match status {
            Some(200) => ok.push((i, a)),
            Some(status) => *others.entry(status.to_string()).or_default() += 1,
            None => *others.entry("no answer".to_owned()).or_default() += 1,
        }
    }
    ok
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let lease_ttl = c.options().lease_ttl;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    // One actor resident on each node's side, with some increments.
    for a in 0..ACTORS {
        for _ in 0..=a {
            let r = c
                .send_retrying(
                    a % c.len(),
                    "POST",
                    &format!("/t/counter/c{a}/increment"),
                    deadline,
                )
                .await?;
            ensure!(r.status == 200, "increment c{a}: {} {}", r.status, r.text());
        }
    }

    c.pause_bucket()?;
    let paused_at = Instant::now();
    // Every node stops serving every actor...
    let stopped_deadline = paused_at + PHASE_TIME_MAX;
    let mut others = BTreeMap::new();
    let stopped_by = loop {
        let probed_at = paused_at.elapsed();
        let serving = served(c, &mut others).await;
        if serving.is_empty() {
            break probed_at;
        }
        if probed_at > lease_ttl + PAUSE_SLACK {
            bail!(
                "(node, actor) {serving:?} served {probed_at:?} after the bucket stopped \
                 answering, past the lease TTL {lease_ttl:?}"
            );
        }
        if Instant::now() >= stopped_deadline {
            bail!("nodes kept serving after the bucket stopped for {PHASE_TIME_MAX:?}");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    };
    // Probes take up to PROBE_TIME_MAX, so this is coarse.
    eprintln!(
        "no node served any actor to probes sent {stopped_by:?} after the bucket paused \
         (lease TTL {lease_ttl:?})"
    );
    // ...and stays stopped while the bucket is gone (one more lease TTL).
    let watch_until = Instant::now() + lease_ttl;
    while Instant::now() < watch_until {
        let serving = served(c, &mut others).await;
        ensure!(
            serving.is_empty(),
            "(node, actor) {serving:?} served while the bucket was paused ({:?} in)",
            paused_at.elapsed()
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }

    eprintln!("answers other than 200 while the bucket was paused: {others:?}");
    c.resume_bucket()?;
    let resumed_at = Instant::now();
    let deadline = resumed_at + PHASE_TIME_MAX;
    for i in 0..c.len() {
        for a in 0..ACTORS {
            let r = c
                .send_retrying(i, "GET", &format!("/t/counter/c{a}/value"), deadline)
                .await?;
            ensure!(
                r.status == 200,
                "c{a} via node {i} after the outage: {} {}",
                r.status,
                r.text()
            );
            ensure!(
                r.count()? == a as u64 + 1,
                "c{a} has {} after the outage, {} were acknowledged",
                r.count()?,
                a + 1
            );
        }
    }
    eprintln!(
        "served again {:?} after the bucket resumed",
        resumed_at.elapsed()
    );
    let r = c
        .send_retrying(0, "POST", "/t/counter/c0/increment", deadline)
        .await?;
    ensure!(
        r.status == 200 && r.count()? == 2,
        "increment after the outage: {} {}",
        r.status,
        r.text()
    );
    Ok(())
}

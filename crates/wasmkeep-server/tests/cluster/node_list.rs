//! `wasmkeep node list --json` reads every node's heartbeat from the bucket;
//! a node stopped with SIGTERM leaves the list (its actors stay reachable)
//! and comes back when restarted.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

const ACTORS: usize = 6;
const PHASE_TIME_MAX: Duration = Duration::from_secs(30);

pub async fn node_list_shows_every_node(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("node-list", bucket, tls), body).await
}

/// `(node, state, drain, resident_actors)` of each row.
async fn node_list(c: &Cluster) -> anyhow::Result<Vec<(String, String, String, u64)>> {
    let out = c.cli(&["node", "list", "--json"]).await?;
    let rows: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("node list is not JSON: {out}"))?;
    let rows = rows
        .as_array()
        .with_context(|| format!("not a JSON array: {out}"))?;
    rows.iter()
        .map(|row| {
            let text = |key: &str| {
                row[key]
                    .as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("row without {key}: {row}"))
            };
            let resident = row["resident_actors"]
                .as_u64()
                .with_context(|| format!("row without resident_actors: {row}"))?;
            Ok((text("node")?, text("state")?, text("drain")?, resident))
        })
        .collect()
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    for a in 0..ACTORS {
        let r = c
            .send_retrying(
                a % c.len(),
                "POST",
                &format!("/t/counter/l{a}/increment"),
                deadline,
            )
            .await?;
        ensure!(r.status == 200, "increment l{a}: {} {}", r.status, r.text());
    }
    let all: Vec<usize> = (0..c.len()).collect();
    // The heartbeats carry the resident counts from their next period on.
    wait_for_list(c, &all, |resident| resident == ACTORS as u64).await?;

    // A graceful stop hands the node's actors over and deletes its heartbeat.
    let last = c.len() - 1;
    let status = c.stop(last).await?;
    ensure!(
        status.success(),
        "node {last} exited with {status} after SIGTERM"
    );
    let rest: Vec<usize> = (0..last).collect();
    wait_for_list(c, &rest, |_| true).await?;
    for a in 0..ACTORS {
        let r = c
            .send_retrying(0, "GET", &format!("/t/counter/l{a}/value"), deadline)
            .await?;
        ensure!(
            r.status == 200 && r.count()? == 1,
            "l{a} after node {last} stopped: {} {}",
            r.status,
            r.text()
        );
    }
    c.restart(last).await?;
    wait_for_list(c, &all, |_| true).await
}

/// Polls `node list` until it names exactly `nodes`, all serving and not
/// draining, with a resident total that `resident_ok` accepts.
async fn wait_for_list(
    c: &Cluster,
    nodes: &[usize],
    resident_ok: impl Fn(u64) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let mut expected: Vec<&str> = nodes.iter().map(|&i| c.node_id(i)).collect();
    expected.sort_unstable();
    loop {
        let rows = node_list(c).await?;
        let mut named: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        named.sort_unstable();
        let resident: u64 = rows.iter().map(|r| r.3).sum();
        let settled = named == expected
            && rows
                .iter()
                .all(|(_, state, drain, _)| state == "serving" && drain == "none")
            && resident_ok(resident);
        if settled {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "node list never showed {expected:?} serving, not draining, with the expected \
                 resident count ({resident} now): {rows:?}"
            );
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}
